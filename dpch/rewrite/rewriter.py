"""The rewriter: one plan, one ClickHouse query (the stages of the package docstring, innermost
first)."""
from __future__ import annotations

from typing import Callable

from ..plan import Plan
from ..engine import with_settings
from .base import SALT_PLACEHOLDER, UNIT_SALT_PLACEHOLDER, Rewritten
from .bounding import BoundingStages
from .release import ReleaseStages


class _Rewriter(BoundingStages, ReleaseStages):
    """One plan's query text. ``noise=False`` and ``selection=False`` exist for tests and the type
    check only (the identity instead of the noise UDFs, every group kept); ``table`` replaces the
    protected table (a neighbouring dataset, or the probe's row of default values)."""

    def __init__(self, plan: Plan, *, noise: bool, selection: bool, table: str | None,
                 units: Callable[[_Rewriter, bool], str] | None = None):
        self.plan = plan
        self.noise = noise
        self.selection = selection
        e = plan.entry
        self.table_sql = table or e.table_sql
        # the per-unit stage's SQL from a maintained per-unit table (dpch.rewrite.unit_table), or None
        self.units = units
        self.keys = list(plan.bound.keys)
        self.nk = len(self.keys)
        self.row_qs = [q for q in plan.quantities if q.row_sql is not None and q.kind not in ("quantile", "distinct")]
        # quantiles: each unit keeps at most q.rows of its rows per group (those whose bucket has
        # the smallest keyed hash: a function of the unit's own rows), collected as packed
        # (hash, bucket) numbers; COUNT(DISTINCT expr) the same way with (value hash, not-NULL bit)
        self.quant_qs = [q for q in plan.quantities if q.kind in ("quantile", "distinct")]
        self.rq_columns = self._rq_columns()
        # the weighted Gaussian's selection statistic (k > 1 path only): Σ over the group's units of
        # unit_weight(j_u, S), j_u = the unit's number of kept groups
        self.weighted = next((q for q in plan.quantities if q.kind == "weighted_units"), None)

    def build(self) -> Rewritten:
        groups = self.groups_sql(key_hash=True)
        keyed = self.with_public_keys(groups, key_hash=True)
        where = ""  # the selection threshold, applied on the level above the draw
        if self.plan.selection is not None:
            keyed, where = self._selection_first_sql(keyed)
        if self.plan.top_k is not None:
            keyed, where = self.top_k_sql(keyed, where), ""
        noised = self.noised_sql(keyed, where)
        display, names, internal = self.outer_sql(noised)
        shown = display.replace(SALT_PLACEHOLDER, "<secret salt>").replace(UNIT_SALT_PLACEHOLDER, "<secret salt>")
        return Rewritten(sql=self._salted(with_settings(display)), display_sql=shown, output_names=names,
                         internal_columns=internal,
                         released_sql=self._salted(self.outer_sql(noised, with_internal=False)[0]))

    def _salted(self, sql: str) -> str:
        return sql.replace(SALT_PLACEHOLDER, self.plan.entry.hash_key_sql()).replace(
            UNIT_SALT_PLACEHOLDER, self.plan.entry.unit_salt_sql())
