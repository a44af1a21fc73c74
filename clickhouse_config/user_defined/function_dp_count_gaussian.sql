CREATE FUNCTION dp_count_gaussian AS (eps, delta) -> dpch_gaussian_int(toInt64(count()), dpch_gaussian_sigma(1., dpch_valid_epsilon(eps), dpch_valid_delta(delta)))
