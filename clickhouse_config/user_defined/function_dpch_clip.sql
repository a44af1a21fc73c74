CREATE FUNCTION dpch_clip AS (x, lo, hi) -> if(isNaN(toFloat64(x)), toFloat64(lo), least(greatest(toFloat64(x), toFloat64(lo)), toFloat64(hi)))
