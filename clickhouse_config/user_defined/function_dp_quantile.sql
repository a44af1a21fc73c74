CREATE FUNCTION dp_quantile AS (x, q, lo, hi, eps) -> dpch_check_param('dp_quantile', 'q', q) + arrayElement(dpch_quantiles_of('dp_quantile', x, [q], lo, hi, eps), 1)
