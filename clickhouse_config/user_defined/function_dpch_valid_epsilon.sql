CREATE FUNCTION dpch_valid_epsilon AS (eps) -> toFloat64(eps) + throwIf(NOT (toFloat64(eps) > 0 AND isFinite(toFloat64(eps))), 'dp_* function: epsilon must be positive and finite')
