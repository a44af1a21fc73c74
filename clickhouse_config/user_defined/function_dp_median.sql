CREATE FUNCTION dp_median AS (x, lo, hi, eps) -> arrayElement(dpch_quantiles_of('dp_median', x, [0.5], lo, hi, eps), 1)
