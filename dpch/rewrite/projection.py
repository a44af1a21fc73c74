"""Whether a per-unit projection (dpch.accelerate) could serve a plan's per-unit stage: a function
of the plan and its rewriter only (explain reports it; dpch.accelerate refuses an acceleration it
could not serve). Here, in the rewrite stage, so the controller needs nothing of its clients."""
from __future__ import annotations

import shlex

from sqlglot import exp

from .rewriter import _Rewriter


def _unservable(plan, rw) -> str | None:
    """Why no per-unit projection can serve the per-unit stage of ``plan`` (rewritten by ``rw``),
    or None if one can."""
    entry = plan.entry
    if entry.row_level:
        return "row-level table: no per-unit stage"
    if plan.bound.keys and plan.bounding.k != 1:
        return f"per-unit projections need k = 1 (max_groups_contributed = {plan.bounding.k})"
    if rw.filters_keys_before_bounding():
        return "the key domain filters rows before bounding"
    where = plan.bound.where
    if where is not None and {c.name for c in where.find_all(exp.Column)} - {entry.privacy_unit}:
        return "WHERE on a column other than the privacy unit"
    return None


def projection_hint(plan) -> str:
    """For explain: whether the plan's per-unit stage could be read from a per-unit projection
    (a function of the plan only; the engine is not consulted)."""
    entry = plan.entry
    rw = _Rewriter(plan, noise=True, selection=True, table=None)
    reason = _unservable(plan, rw)
    if entry.row_level:
        return f"none ({reason})"
    if reason is not None:
        return f"read from the table ({reason})"
    if rw.quant_qs:
        # db.accelerate's structures hold COUNT(*), SUM and AVG states only (its template query)
        return ("read from the table (MIN/MAX, quantiles and COUNT(DISTINCT …) of a column other than the "
                "unit keep each unit's sampled rows, which no per-unit structure holds)")
    keys = [k.sql for k in plan.bound.keys]
    cli = " ".join([f"dpch catalog accelerate {entry.table}"] + [f"--group-by {shlex.quote(k)}" for k in keys])
    return (f"one GROUP BY {entry.privacy_unit} pass; a per-unit projection can serve it: "
            f"db.accelerate({entry.table!r}, {keys!r}) or `{cli}` (or a per-unit table: method='table', "
            "`--method table`; the answer's attrs['dpch']['per_unit_source'] names what was read)")
