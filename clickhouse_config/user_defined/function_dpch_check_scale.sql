CREATE FUNCTION dpch_check_scale AS (fn, scale) -> dpch_require(isFinite(scale) AND scale > 0, concat(fn, ': argument eps is too small: the noise scale overflows Float64'))
