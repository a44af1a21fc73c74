CREATE FUNCTION dpch_fixed_grid AS (m) -> exp2(floor(log2(greatest(toFloat64(m), 1e-290))) + 1 - 20)
