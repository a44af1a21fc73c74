CREATE FUNCTION dp_count AS (eps) -> dpch_laplace_int(toInt64(count()), dpch_laplace_scale(1., dpch_valid_epsilon(eps)))
