CREATE FUNCTION dpch_check_delta AS (delta) -> throwIf(NOT (toFloat64(delta) > 0 AND toFloat64(delta) < 1), 'dp_*_gaussian function: delta must be in the open interval (0, 1)')
