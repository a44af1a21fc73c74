CREATE FUNCTION dp_quantiles AS (x, qs, lo, hi, eps) -> dpch_quantiles_of('dp_quantiles', x, qs, lo, hi, eps)
