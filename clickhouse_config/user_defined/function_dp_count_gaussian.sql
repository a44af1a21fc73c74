CREATE FUNCTION dp_count_gaussian AS (eps, delta) -> dpch_gaussian_int(toInt64(count()), dpch_gaussian_sigma(1., toFloat64(eps), toFloat64(delta)) + dpch_check_epsilon(eps) + dpch_check_delta(delta))
