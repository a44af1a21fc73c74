CREATE FUNCTION dpch_quantile_histogram AS (x, lo, hi) -> sumMapIf([dpch_quantile_bucket(x, lo, hi)], [toUInt64(1)], isNotNull(x) AND NOT isNaN(ifNull(toFloat64(x), 0.)))
