CREATE FUNCTION dpch_round_to_grid AS (v, g) -> (v + 6755399441055744. * g) - 6755399441055744. * g
