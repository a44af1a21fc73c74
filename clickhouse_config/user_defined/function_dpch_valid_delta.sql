CREATE FUNCTION dpch_valid_delta AS (delta) -> toFloat64(delta) + throwIf(NOT (toFloat64(delta) > 0 AND toFloat64(delta) < 1), 'dp_*_gaussian function: delta must be in the open interval (0, 1)')
