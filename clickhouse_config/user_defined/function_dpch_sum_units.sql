CREATE FUNCTION dpch_sum_units AS (x, lo, hi, centre, halfwidth) -> sum(toInt64(round((dpch_clip(x, lo, hi) - centre) / dpch_fixed_grid(halfwidth))))
