"""The SQL of the unit profile (dpch.plan.profile): per unit of the query's relation, after its WHERE
and key-domain filters (the rows the query's bounding stage sees), the unit's rows c_u, distinct
groups g_u, most rows in one group, and whether a value lies outside its declared bounds; then the
noisy releases of dpch.plan.profile, each computed exactly once per output row by the noise UDF.
Nothing but noisy counts leaves the engine."""
from __future__ import annotations

from sqlglot import exp

from ..catalog import base_type, quote_ident
from ..plan import Plan
from ..plan.profile import GRID, VALUE_EDGES
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

    def where_with(self, *conds: str) -> str:
        """The rows stage's WHERE (the analyst's and the key filters) and ``conds``."""
        base = self._where(key_filters=True)
        extra = " AND ".join(f"({c})" for c in conds)
        return f"{base} AND {extra}" if base else f"\nWHERE {extra}"


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
    where = rel.where_with(f"{unit} IS NOT NULL")
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


def _value_bucket(col: str) -> str:
    """The 0-based VALUE_EDGES bucket of |x| (dpch.plan.profile.value_bucket_of)."""
    edges = ", ".join(repr(e) for e in VALUE_EDGES)
    return f"toUInt32(arrayCount(__dp_e -> __dp_e <= abs({col}), [{edges}]) - 1)"


def value_histogram_sql(plan: Plan, column_sql: str, noise_sql) -> str:
    """(__dp_s, __dp_b, __dp_v): side s (0: x >= 0, 1: x < 0), bucket b of |x| on VALUE_EDGES, and the
    noisy unit-weighted count: each unit's non-NULL finite values of ``column_sql`` (in the query's
    relation, after its WHERE) weigh 1/c_u each (c_u: how many it has), so one unit adds at most 1 in
    all (a row-level table: each row weighs 1). Every (s, b) is released. ``noise_sql``: the
    (real-valued) mechanism's SQL."""
    rel = _Relation(plan)
    x = f"toFloat64({column_sql})"
    valid = f"({column_sql} IS NOT NULL) AND isFinite({x})"
    if plan.entry.row_level:
        where = rel.where_with(valid)
        weighted = (f"SELECT toUInt8({x} < 0) AS __dp_s, {_value_bucket(x)} AS __dp_b, toFloat64(1) AS __dp_f\n"
                    f"FROM {rel.table_sql}{where}")
    else:
        unit = quote_ident(plan.entry.privacy_unit)  # type: ignore[arg-type]
        where = rel.where_with(f"{unit} IS NOT NULL", valid)
        cells = (f"SELECT {unit} AS __dp_u, toUInt8({x} < 0) AS __dp_s, {_value_bucket(x)} AS __dp_b, "
                 f"count() AS __dp_n\nFROM {rel.table_sql}{where}\nGROUP BY __dp_u, __dp_s, __dp_b")
        weighted = (f"SELECT __dp_s, __dp_b, __dp_n / sum(__dp_n) OVER (PARTITION BY __dp_u) AS __dp_f\n"
                    f"FROM (\n{_indent(cells)}\n)")
    domain = ", ".join(f"({s}, {b})" for s in (0, 1) for b in range(len(VALUE_EDGES)))
    every = f"SELECT __dp_p.1 AS __dp_s, __dp_p.2 AS __dp_b, toFloat64(0) AS __dp_f FROM (SELECT arrayJoin([{domain}]) AS __dp_p)"
    summed = (f"SELECT __dp_s, __dp_b, sum(__dp_f) AS __dp_w\nFROM (\n{_indent(weighted)}\n  UNION ALL\n"
              f"{_indent(every)}\n)\nGROUP BY __dp_s, __dp_b")
    return (f"SELECT __dp_s, __dp_b, {noise_sql('__dp_w')} AS __dp_v\nFROM (\n{_indent(summed)}\n)\n"
            "ORDER BY __dp_s, __dp_b")
