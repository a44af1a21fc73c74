CREATE FUNCTION dpch_quantile_value AS (b, lo, hi) -> least(greatest(toFloat64(lo) + (toFloat64(b) + 0.5) * ((toFloat64(hi) - toFloat64(lo)) / 65536), toFloat64(lo)), toFloat64(hi))
