"""The SQL of the unit profile (dpch.plan.profile): per unit of the query's relation, after its WHERE
and key-domain filters (the rows the query's bounding stage sees), the unit's rows c_u, distinct
groups g_u, most rows in one group, and whether a value lies outside its declared bounds; then the
noisy releases of dpch.plan.profile, each computed exactly once per output row by the noise UDF.
Nothing but noisy counts leaves the engine."""
from __future__ import annotations

from sqlglot import exp

from ..catalog import base_type, quote_ident
from ..plan import Plan
from ..plan.profile import GRID
from ..sql_ast import sql_of
from .base import _indent
from .bounding import BoundingStages

_NUMERIC = ("Int", "UInt", "Float", "Decimal")


class _Relation(BoundingStages):
    """The bounding stages' view of a plan's relation (its FROM and WHERE), without the rewriter's
    noise and release stages."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.table_sql = plan.entry.table_sql
        self.keys = list(plan.bound.keys)
        self.nk = len(self.keys)


def _clipped_sql(plan: Plan) -> str:
    """1 when a row has a value outside its column's declared bounds (NaN included) in a column
    some aggregate reads, else 0 (NULL is no value: not clipped)."""
    entry = plan.entry
    tests = []
    for call in plan.bound.aggregates:
        for node in (call.arg,):
            if node is None:
                continue
            for col in node.find_all(exp.Column):
                name = col.name
                typ = base_type(entry.columns.get(name, ""))
                if name not in entry.bounds or not typ.startswith(_NUMERIC):
                    continue
                lo, hi = entry.bounds[name]
                t = (f"ifNull(NOT (toFloat64({sql_of(col)}) BETWEEN {float(lo)!r} AND {float(hi)!r}), 0)")
                if t not in tests:
                    tests.append(t)
    return f"toUInt8({' OR '.join(tests)})" if tests else "toUInt8(0)"


def per_unit_sql(plan: Plan) -> str:
    """One row per unit: __dp_c (rows), __dp_g (groups), __dp_mx (most rows in a group), __dp_x
    (1 if a value of it lies outside the bounds)."""
    rel = _Relation(plan)
    unit = quote_ident(plan.entry.privacy_unit)  # type: ignore[arg-type]
    keys = [f"{sql_of(k.expr)} AS __dp_rk{j}" for j, k in enumerate(rel.keys)]
    where = rel._where(key_filters=True)
    not_null = f"({unit} IS NOT NULL)"
    where = f"{where} AND {not_null}" if where else f"\nWHERE {not_null}"
    group = ", ".join(["__dp_u"] + [f"__dp_rk{j}" for j in range(rel.nk)])
    cells = (f"SELECT {', '.join([f'{unit} AS __dp_u'] + keys)}, toInt64(count()) AS __dp_n, "
             f"max({_clipped_sql(plan)}) AS __dp_cx\nFROM {rel.table_sql}{where}\nGROUP BY {group}")
    return (f"SELECT toInt64(sum(__dp_n)) AS __dp_c, toInt64(count()) AS __dp_g, max(__dp_n) AS __dp_mx, "
            f"max(__dp_cx) AS __dp_x\nFROM (\n{_indent(cells)}\n)\nGROUP BY __dp_u")


def _bucket(col: str) -> str:
    """The 0-based GRID bucket of a count >= 1 (dpch.plan.profile.bucket_of)."""
    return f"toUInt32(arrayCount(__dp_e -> __dp_e <= {col}, [{', '.join(map(str, GRID))}]) - 1)"


def histograms_sql(plan: Plan, noise_sql, *, rows: bool, groups: bool) -> str:
    """(__dp_hk, __dp_b, __dp_v): histogram hk (0 rows per unit, 1 groups per unit), bucket b, noisy
    count of units. Every (hk, b) is released, empty ones with count 0 plus noise.
    ``noise_sql(value_sql)``: the mechanism's SQL."""
    kinds = [hk for hk, on in ((0, rows), (1, groups)) if on]
    cols = {0: "__dp_c", 1: "__dp_g"}
    emitted = ", ".join(f"({hk}, {_bucket(cols[hk])})" for hk in kinds)
    domain = ", ".join(f"({hk}, {b})" for hk in kinds for b in range(len(GRID)))
    units = (f"SELECT arrayJoin([{emitted}]) AS __dp_p, toInt64(1) AS __dp_one\nFROM (\n"
             f"{_indent(per_unit_sql(plan))}\n)")
    every = f"SELECT arrayJoin([{domain}]) AS __dp_p, toInt64(0) AS __dp_one"
    counted = (f"SELECT __dp_p.1 AS __dp_hk, __dp_p.2 AS __dp_b, toInt64(sum(__dp_one)) AS __dp_n\nFROM (\n"
               f"{_indent(units)}\n  UNION ALL\n{_indent(every)}\n)\nGROUP BY __dp_p")
    return (f"SELECT __dp_hk, __dp_b, {noise_sql('__dp_n')} AS __dp_v\nFROM (\n{_indent(counted)}\n)\n"
            "ORDER BY __dp_hk, __dp_b")


def bias_counts_sql(plan: Plan, noise_sql) -> str:
    """(__dp_i, __dp_v): the noisy counts of dpch.plan.profile.BIAS_COUNTS (units; units whose rows
    the plan's bounds cut; units with a clipped value), in that order."""
    b = plan.bounding
    k = b.k if plan.grouped else 1
    cut = f"(__dp_c > {b.max_rows} OR __dp_g > {k} OR __dp_mx > {b.rows_per_group})"
    stats = (f"SELECT toInt64(count()) AS __dp_n0, toInt64(countIf({cut})) AS __dp_n1, "
             f"toInt64(countIf(__dp_x = 1)) AS __dp_n2\nFROM (\n{_indent(per_unit_sql(plan))}\n)")
    rows = (f"SELECT arrayJoin([(0, __dp_n0), (1, __dp_n1), (2, __dp_n2)]) AS __dp_p\nFROM (\n{_indent(stats)}\n)")
    return (f"SELECT __dp_p.1 AS __dp_i, {noise_sql('__dp_p.2')} AS __dp_v\nFROM (\n{_indent(rows)}\n)\n"
            "ORDER BY __dp_i")
