CREATE FUNCTION dpch_laplace_scale AS (sensitivity, eps) -> sensitivity / eps + 2 * exp2(floor(log2(sensitivity / eps)) + 1 - 40) / eps
