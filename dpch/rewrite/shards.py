"""The two-phase form of the rewritten query, for a ``Distributed`` table sharded by the privacy
unit (issue 32; docs/DEPLOY.md, "A cluster").

When every row of one unit is on one shard (the catalogued sharding key is a function of the unit:
``TableEntry.shards_by_unit``), stages 1-3 of the package docstring (``rows`` → ``per_unit`` →
``groups``) read only that unit's rows, so each shard runs them over its LOCAL table and emits its
groups' partial aggregate states (``sumState``, ``countState``, ``uniqExactArrayState``,
``sumMapState``, keyed by the group stage's GROUP BY key). The initiator merges them (``-Merge``,
GROUP BY the same key), which gives exactly the single-node group stage (a sum of per-shard sums,
a union of per-shard sets), and then runs the public key join, selection, noise, release and the
outer query once. Per-unit rows never leave their shard; the noise UDFs run on the initiator only.
The salt and hashes are literals in the SQL text, so every shard computes the same ones.

- ``shard_sql(plan)``: one shard's query (executable, salted) over the local table;
- ``initiator_sql(plan, partials_table_sql)``: the initiator's query over the shards' partial
  states (any table expression holding them: a ``file()`` in the equivalence test);
- ``cluster_rewrite(plan)``: what ClickHouse runs, ONE query whose partials are
  ``cluster('<cluster>', view(<shard query>))``: the initiator sends the view to one replica of
  every shard and merges the states it gets back (``rewrite`` returns it for such tables).

Otherwise (a key that is not a function of the unit alone) the single-node query over the
Distributed table is correct as it is: ClickHouse aggregates the per-unit stage across shards
(two-level distributed aggregation), which moves per-unit partial states over the network.
``placement`` names which stage runs where, for explain.
"""
from __future__ import annotations

from dataclasses import dataclass

import sqlglot
from sqlglot import exp

from ..catalog import TableEntry, quote_string
from ..engine import with_settings
from ..plan import Plan
from ..sql_ast import DIALECT, sql_of
from .base import Rewritten
from .rewriter import _Rewriter

_AGG_NODES = (exp.AggFunc, exp.AnonymousAggFunc, exp.CombinedAggFunc, exp.ParameterizedAgg)


def two_phase(plan: Plan) -> bool:
    """Whether ``plan`` runs in two phases: one plain catalogued Distributed table whose rows of a
    unit are all on one shard (a joined relation runs as one query over its tables)."""
    return type(plan.entry) is TableEntry and plan.entry.shards_by_unit


def placement(entry: TableEntry) -> str | None:
    """Which stage runs where, for explain (None for a table that is not Distributed)."""
    d = entry.distributed
    if d is None:
        return None
    if type(entry) is TableEntry and entry.shards_by_unit:
        return (f"two-phase on cluster {d.cluster}: rows, per_unit and groups on each shard over "
                f"{d.local_table} (partial states, sharding key {d.sharding_key} is a function of the unit); "
                "merge, selection, noise, release and the outer query once on the initiator")
    return (f"one query over the Distributed table on cluster {d.cluster}: the sharding key {d.sharding_key} is "
            "not a function of the unit alone, so the per-unit stage is global (ClickHouse's distributed "
            "two-level aggregation: correct, slower); noise on the initiator")


@dataclass(frozen=True)
class _Split:
    """The group stage cut in two: the shard's projection (keys and ``-State`` columns) with the
    rest of its text (FROM ... GROUP BY), and the initiator's (keys and ``-Merge`` expressions)."""

    shard_cols: tuple[str, ...]
    tail: str
    keys: tuple[str, ...]
    merge_cols: tuple[str, ...]


def _split(groups: str) -> _Split:
    # groups_sql is "SELECT <one-line projection>\nFROM ..." (its subqueries are indented)
    head, sep, tail = groups.partition("\nFROM ")
    select = sqlglot.parse_one(head, dialect=DIALECT) if head.startswith("SELECT ") and sep else None
    if not isinstance(select, exp.Select):
        raise ValueError("unexpected group stage")
    shard_cols: list[str] = []
    keys: list[str] = []
    merge_cols: list[str] = []
    for proj in select.expressions:
        name = proj.alias_or_name
        body = proj.this if isinstance(proj, exp.Alias) else proj
        aggs = [n for n in body.walk(prune=lambda n: isinstance(n, _AGG_NODES)) if isinstance(n, _AGG_NODES)]
        if not aggs:  # a GROUP BY key (the shard's groups stay apart; the initiator regroups)
            shard_cols.append(sql_of(proj))
            keys.append(name)
            continue
        merged = body.copy()
        for old, new in zip(aggs, [n for n in merged.walk(prune=lambda n: isinstance(n, _AGG_NODES))
                                   if isinstance(n, _AGG_NODES)]):
            fname, paren, args = sql_of(old.copy()).partition("(")
            if not paren or old.find(exp.Distinct) is not None:  # the group stage has no DISTINCT aggregate
                raise ValueError("the group stage has an aggregate without a -State form")
            state = f"__dp_st{len(shard_cols) - len(keys)}"
            shard_cols.append(f"{fname}State({args} AS {state}")
            merge = exp.Anonymous(this=f"{fname}Merge", expressions=[exp.column(state)])
            if new is merged:  # the projection is the aggregate itself
                merged = merge
            else:
                new.replace(merge)
        merge_cols.append(f"{sql_of(merged)} AS {name}")
    return _Split(tuple(shard_cols), sep + tail, tuple(keys), tuple(merge_cols))


def _shard_query(plan: Plan, table: str | None, noise: bool) -> tuple[_Rewriter, str]:
    """(the rewriter, the shard's unsalted query without SETTINGS)."""
    if not two_phase(plan) and table is None:
        raise ValueError("the plan's table is not a Distributed table sharded by its privacy unit")
    d = plan.entry.distributed
    rw = _Rewriter(plan, noise=noise, selection=noise, table=table or d.local_table_sql)  # type: ignore[union-attr]
    s = _split(rw.groups_sql(key_hash=True))
    return rw, f"SELECT {', '.join(s.shard_cols)}{s.tail}"


class _Initiator(_Rewriter):
    """The release stages (4-6) over the merged partial states instead of stages 1-3."""

    def __init__(self, plan: Plan, partials_table_sql: str, *, noise: bool):
        super().__init__(plan, noise=noise, selection=noise, table=None)
        self.partials = partials_table_sql

    def groups_sql(self, *, key_hash: bool = False) -> str:
        # the same cut as the shard's: the group stage the single-node rewriter would emit
        s = _split(_Rewriter(self.plan, noise=self.noise, selection=self.selection, table=None)
                   .groups_sql(key_hash=key_hash))
        group_by = f"\nGROUP BY {', '.join(s.keys)}" if s.keys else ""
        return f"SELECT {', '.join(s.keys + s.merge_cols)}\nFROM {self.partials}{group_by}"


def shard_sql(plan: Plan, *, table: str | None = None) -> str:
    """The query one shard runs (executable: salted, with the query settings): stages 1-3 over the
    local table (or ``table``), one row per group of that shard with its partial aggregate states.
    Privacy: nothing here is released; its rows are the inputs of ``initiator_sql``, which is the
    only place noise is added (the states never leave ClickHouse)."""
    rw, sql = _shard_query(plan, table, noise=True)
    return rw._salted(with_settings(sql))


def initiator_sql(plan: Plan, partials_table_sql: str, *, noise: bool = True) -> str:
    """The initiator's query (executable) over the shards' partial states read from
    ``partials_table_sql``: merge, then selection, noise, release and the outer query, as
    ``rewrite(plan)`` does after its group stage; the same privacy guarantee as ``rewrite(plan)``
    provided every unit's rows are on one shard. ``noise=False`` is for TESTS ONLY (the identity
    instead of the noise UDFs and no partition selection, as ``rewrite_for_sensitivity_check``):
    its output is not private."""
    return _Initiator(plan, partials_table_sql, noise=noise).build().sql


def cluster_rewrite(plan: Plan) -> Rewritten:
    """The query ClickHouse runs for a Distributed table sharded by the unit: the initiator's
    query whose partials are ``cluster('<cluster>', view(<shard query>))``. The same privacy
    guarantee as ``rewrite(plan)``: the shards return per-group partial states (never per-unit
    rows), the noise is drawn once per released value on the initiator."""
    rw, sql = _shard_query(plan, None, noise=True)
    d = plan.entry.distributed
    indented = "\n".join("  " + line for line in sql.splitlines())
    partials = f"cluster({quote_string(d.cluster)}, view(\n{indented}\n))"  # type: ignore[union-attr]
    return _Initiator(plan, partials, noise=True).build()
