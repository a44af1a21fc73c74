CREATE FUNCTION dpch_check_epsilon AS (eps) -> throwIf(NOT (toFloat64(eps) > 0 AND isFinite(toFloat64(eps))), 'dp_* function: epsilon must be positive and finite')
