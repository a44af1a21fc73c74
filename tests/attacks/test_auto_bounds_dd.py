"""D/D′ attacks on the unit profile (issue 29: bounds from the data, bias made visible).

The claims checked (dpch/plan/profile.py, dpch/unit_profile.py):

- each auto-bounds histogram (units per √2-grid bucket of rows per unit, of groups per unit) has
  L1 sensitivity 1 under add/remove of a unit and 2 under substitution of a unit's rows;
- the bias counts (units; units cut by the final bounds; units with a clipped value) have L1 3
  under both relations;
- rows with a NULL unit are never counted; in a join, a unit's rows count for that unit only;
- the released SQL draws the noise UDF once per released value, the profile is part of the one
  charge, rejected 'auto' queries charge nothing, a failure after the charge keeps it, and the
  answer's attrs carry no exact count.

Generative part (hypothesis): a table ``t(u, g, h, v)`` with an integer or String unit, Nullable
or not (the empty string and 0 are units too), units of 1-4, 5-40 or 100-300 rows, rows with a
NULL unit, ``g`` with declared public keys or not, values outside ``v``'s bounds and NULL. Queries
draw GROUP BY g (public or private), a WHERE, COUNT/SUM/AVG and the 'auto' / bias options. D′ adds
or removes one unit (catalog neighbour add_remove) or replaces one unit's rows (substitute); D″
changes only the rows whose unit is NULL. The profile SQL with NOISE OFF (``lambda v: v``), built
from the plan prepared on D, runs on D, D′ and D″: on D it must equal a Python mirror of the
definition (so the comparison is not vacuous), D′ must stay within the declared L1, D″ must give
exactly D's counts. The join part reuses the join grammar of tests/attacks/gen_joins.py (D′ removes
one unit and every row reached from it through the references).
"""
from __future__ import annotations

import math

import random
from collections import Counter
from dataclasses import dataclass, field, replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dpch.unit_profile as unit_profile
from dpch.controller import _plan_at, prepare
from dpch.errors import InvalidParameter, QueryRejected
from dpch.plan.profile import GRID, bucket_of
from dpch.engine import with_settings
from dpch.rewrite.profile import bias_counts_sql, histograms_sql, value_histogram_sql

from . import gen_joins as g
from .test_join_generative import build as build_join, teardown as teardown_join

NOISE_OFF = lambda v: v  # noqa: E731 - the profile SQL with its noise switched off
PUBLIC_G = ("a", "b", "c")  # g's declared public keys (when declared); data also holds 'z'
V_BOUNDS = (0.0, 100.0)
BIAS_L1 = 3
EXAMPLES, JOIN_EXAMPLES = 20, 5  # measured: the whole module in about a minute on 2 busy cores

_settings = dict(derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck),
                 print_blob=True)

# At small ε a privately chosen bound can drop a share of the rows, and the query says so with a
# BiasWarning, as it should to a user; these tests check sensitivity and charges, not that warning.
pytestmark = pytest.mark.filterwarnings("ignore::dpch.unit_profile.BiasWarning")


# ------------------------------------------------------------------------------------------------
# scenarios on one table
# ------------------------------------------------------------------------------------------------

def _rows(seed: int, n: int) -> list[tuple]:
    """n rows (g, h, v) of one unit; v sometimes outside its bounds or NULL."""
    r = random.Random(seed)
    out = []
    for _ in range(n):
        v = r.choice([None, -5.0, 150.0] + [float(r.randint(0, 100))] * 7)
        out.append((r.choice(PUBLIC_G + ("z",)), r.randint(0, 9), v))
    return out


_sizes = st.one_of(st.integers(1, 4), st.integers(1, 4), st.integers(5, 40), st.integers(100, 300))


@dataclass
class Table:
    unit_type: str  # Int64 | String | Nullable(...)
    units: dict  # unit id (int) -> rows
    null_rows: list  # rows whose unit is NULL

    def literal(self, uid: int) -> str:
        if "String" in self.unit_type:
            return "''" if uid == 0 else f"'u{uid}'"
        return str(uid)


@dataclass
class Query:
    keys: bool
    where: str  # "" | SQL
    aggs: tuple[str, ...]
    options: dict
    delta: float

    def text(self, db: str) -> str:
        sel = (["g AS k"] if self.keys else []) + [f"{a} AS a{i}" for i, a in enumerate(self.aggs)]
        sql = f"SELECT {', '.join(sel)} FROM {db}.t"
        if self.where:
            sql += f" WHERE {self.where}"
        return sql + (" GROUP BY k" if self.keys else "")


@dataclass
class Scenario:
    neighbour: str
    public_g: bool
    d: Table
    dp: Table  # D′
    dn: Table | None  # D″ (NULL-unit rows changed), for a Nullable unit
    queries: list = field(default_factory=list)


@st.composite
def queries(draw, public_g: bool) -> Query:
    keys = draw(st.booleans())
    where = draw(st.sampled_from(("", "h < 5", "v > 40", "g != 'b'", "h >= 2 AND v < 90")))
    aggs = ("COUNT(*)",) + tuple(draw(st.lists(st.sampled_from(("SUM(v)", "AVG(v)")), max_size=1)))
    auto = draw(st.sampled_from((("max_rows_per_unit",), ("max_groups_contributed",),
                                 ("max_rows_per_unit", "max_groups_contributed"), ())))
    bias = draw(st.sampled_from((0.0, 0.05, 0.2))) if auto else draw(st.sampled_from((0.05, 0.2)))
    options = {a: "auto" for a in auto} | {"bias_share": bias}
    if len(aggs) > 1 and draw(st.booleans()):  # clipping bounds from the data: the value histogram of v
        options["bounds"] = "auto"
    if auto or "bounds" in options:
        options["auto_share"] = draw(st.sampled_from((0.1, 0.3)))
    delta = 1e-6 if keys and not public_g else 0.0
    return Query(keys, where, aggs, options, delta)


@st.composite
def scenarios(draw) -> Scenario:
    unit_type = draw(st.sampled_from(("Int64", "String", "Nullable(Int64)", "Nullable(String)")))
    n = draw(st.integers(1, 8))
    units = {uid: _rows(draw(st.integers(0, 2**31)), draw(_sizes)) for uid in range(n)}
    nullable = unit_type.startswith("Nullable")
    null_rows = _rows(draw(st.integers(0, 2**31)), draw(st.integers(1, 30))) if nullable else []
    d = Table(unit_type, units, null_rows)
    neighbour = draw(st.sampled_from(("add_remove", "substitute")))
    target = draw(st.integers(0, n))  # n: a unit D does not have
    fresh = _rows(draw(st.integers(0, 2**31)), draw(_sizes))
    if neighbour == "add_remove":
        changed = {u: r for u, r in units.items() if u != target} | ({target: fresh} if target == n else {})
    else:
        target = min(target, n - 1)
        changed = units | {target: fresh if draw(st.booleans()) else _rows(draw(st.integers(0, 2**31)), 1)}
    dp = replace(d, units=changed)
    dn = replace(d, null_rows=_rows(draw(st.integers(0, 2**31)), draw(st.integers(0, 300)))) if nullable else None
    public_g = draw(st.booleans())
    qs = draw(st.lists(queries(public_g), min_size=1, max_size=4))
    return Scenario(neighbour, public_g, d, dp, dn, qs)


# ------------------------------------------------------------------------------------------------
# the Python mirror of the definition (dpch.plan.profile)
# ------------------------------------------------------------------------------------------------

def _passes(q: Query, public_g: bool, row: tuple) -> bool:
    gk, h, v = row
    ok = {"": True, "h < 5": h < 5, "v > 40": v is not None and v > 40, "g != 'b'": gk != "b",
          "h >= 2 AND v < 90": h >= 2 and v is not None and v < 90}[q.where]
    return ok and not (q.keys and public_g and gk not in PUBLIC_G)  # the key-domain filter


def per_unit(t: Table, q: Query, public_g: bool) -> list[tuple[int, int, int, int]]:
    """(c_u, g_u, most rows in a group, clipped) for each unit with a row after the filters; the
    rows with a NULL unit belong to no unit."""
    out = []
    reads_v = len(q.aggs) > 1
    for rows in t.units.values():
        kept = [r for r in rows if _passes(q, public_g, r)]
        if not kept:
            continue
        per_group = Counter(r[0] if q.keys else "" for r in kept)
        clipped = reads_v and any(r[2] is not None and not V_BOUNDS[0] <= r[2] <= V_BOUNDS[1] for r in kept)
        out.append((len(kept), len(per_group), max(per_group.values()), int(clipped)))
    return out


def mirror_histograms(units, rows: bool, groups: bool) -> dict[int, list[int]]:
    out = {}
    for hk, on in ((0, rows), (1, groups)):
        if on:
            h = [0] * len(GRID)
            for u in units:
                h[bucket_of(u[hk])] += 1
            out[hk] = h
    return out


def mirror_bias(units, k: int, m: int, c: int) -> list[int]:
    return [len(units), sum(1 for cu, gu, mx, _ in units if cu > m or gu > k or mx > c),
            sum(x for *_, x in units)]


# ------------------------------------------------------------------------------------------------
# building the tables and running the profile SQL
# ------------------------------------------------------------------------------------------------

_N = {"n": 0}


def _create(db, name: str, t: Table, sc: Scenario) -> None:
    db.command(f"DROP DATABASE IF EXISTS {name}")
    db.command(f"CREATE DATABASE {name}")
    db.command(f"CREATE TABLE {name}.t (u {t.unit_type}, g String, h Int64, v Nullable(Float64)) "
               "ENGINE = MergeTree ORDER BY tuple()")
    values = [(t.literal(uid), r) for uid, rows in t.units.items() for r in rows] + [("NULL", r) for r in t.null_rows]
    if values:
        db.command(f"INSERT INTO {name}.t VALUES " + ", ".join(
            f"({u}, '{gk}', {h}, {'NULL' if v is None else repr(v)})" for u, (gk, h, v) in values))
    db.catalog.register(f"{name}.t", privacy_unit="u", neighbour=sc.neighbour, bounds={"v": V_BOUNDS, "h": (0, 9)},
                        max_rows_per_unit=3, max_groups_contributed=2, max_rows_per_group=2,
                        public_keys={"g": list(PUBLIC_G)} if sc.public_g else None)


def _drop(db, name: str) -> None:
    if f"{name}.t" in db.catalog:
        db.catalog.drop(f"{name}.t")
    db.command(f"DROP DATABASE IF EXISTS {name}")


def run_histograms_off(db, sql: str) -> dict[int, list[int]]:
    df = db.raw_query(sql)
    out: dict[int, list[int]] = {}
    for hk, b, v in df[["__dp_hk", "__dp_b", "__dp_v"]].itertuples(index=False):
        out.setdefault(int(hk), []).append((int(b), int(v)))
    return {hk: [v for _, v in sorted(bv)] for hk, bv in out.items()}


def run_bias_off(db, sql: str) -> list[int]:
    df = db.raw_query(sql).sort_values("__dp_i")
    return [int(v) for v in df["__dp_v"]]


def _l1(a: list[int], b: list[int]) -> int:
    return sum(abs(x - y) for x, y in zip(a, b, strict=True))


def check_scenario(db, sc: Scenario, stats: Counter) -> None:
    _N["n"] += 1
    names = {"d": f"abd{_N['n']:05d}", "dp": f"abp{_N['n']:05d}", "dn": f"abn{_N['n']:05d}"}
    tables = {"d": sc.d, "dp": sc.dp, "dn": sc.dn}
    built = [k for k in names if tables[k] is not None]
    try:
        for k in built:
            _create(db, names[k], tables[k], sc)
        for q in sc.queries:
            check_query(db, sc, q, names, built, stats)
    finally:
        for k in built:
            _drop(db, names[k])


def check_query(db, sc: Scenario, q: Query, names: dict, built: list, stats: Counter) -> None:
    stats["queries"] += 1
    try:
        prepared = prepare(db, q.text(names["d"]), epsilon=1.0, delta=q.delta, profile=True, **q.options)
    except (QueryRejected, InvalidParameter):
        stats["rejected"] += 1
        return
    spec = prepared.profile
    stats["accepted"] += 1
    if spec is None:
        # asked only for a bound that changes nothing here (k of an ungrouped query, or of one whose
        # noise does not depend on k) and no bias counts: nothing is released, and the plan has
        # the whole ε
        assert q.options.get("bias_share", 0.0) == 0.0 and "max_rows_per_unit" not in q.options
        assert prepared.cost.epsilon == pytest.approx(1.0, rel=1e-12)
        stats["nothing released"] += 1
        return
    plan = prepared.plan
    runs = {}
    if spec.request is not None:
        r = spec.request
        assert r.sensitivity == (2 if sc.neighbour == "substitute" else 1)
        sql = histograms_sql(plan, NOISE_OFF, rows=r.rows, groups=r.groups)
        runs["hist"] = {k: run_histograms_off(db, sql.replace(names["d"], names[k])) for k in built}
        expect = mirror_histograms(per_unit(sc.d, q, sc.public_g), r.rows, r.groups)
        assert runs["hist"]["d"] == expect, ("histograms on D differ from the definition", q)
        for hk, h in runs["hist"]["dp"].items():
            l1 = _l1(runs["hist"]["d"][hk], h)
            stats["histogram moved"] += l1 > 0
            assert l1 <= r.sensitivity, (f"histogram {hk}: L1 {l1} > {r.sensitivity}", sc.neighbour, q)
        if "dn" in built:
            assert runs["hist"]["dn"] == runs["hist"]["d"], ("rows with a NULL unit were counted", q)
        for col in r.values:  # unit-weighted: one unit's weights sum to 1 (both sides together)
            sql = value_histogram_sql(plan, col, NOISE_OFF)
            vals = {k: db.raw_query(with_settings(sql.replace(names["d"], names[k])))["__dp_v"].tolist()
                    for k in built}
            assert sum(vals["d"]) > 0 or not sc.d.units, ("the value histogram of D is empty", q)
            l1 = _l1(vals["d"], vals["dp"])
            stats["value histogram moved"] += l1 > 1e-12
            assert l1 <= r.value_sensitivity, (f"value histogram {col}: L1 {l1} > {r.value_sensitivity}", q)
            if "dn" in built:
                assert _l1(vals["dn"], vals["d"]) < 1e-9, ("rows with a NULL unit were weighed", q)
    if spec.bias_epsilon > 0:
        # the final bounds are post-processing of the histograms: any fixed (k, M, C) stands for them
        rnd = random.Random(_N["n"])
        chosen = {"max_groups_contributed": rnd.choice((1, 2, 4)), "max_rows_per_unit": rnd.choice((1, 3, 11, 128))}
        if "bounds" in q.options:  # chosen clipping bounds stand in the same way: the mirror's, V_BOUNDS
            chosen["bounds"] = {"v": V_BOUNDS}
        final = _plan_at(prepared.bound, plan, prepared.key_types, chosen)
        sql = bias_counts_sql(final, NOISE_OFF)
        counts = {k: run_bias_off(db, sql.replace(names["d"], names[k])) for k in built}
        b = final.bounding
        expect = mirror_bias(per_unit(sc.d, q, sc.public_g), b.k if final.grouped else 1, b.max_rows,
                             b.rows_per_group)
        assert counts["d"] == expect, ("bias counts on D differ from the definition", q, chosen)
        l1 = _l1(counts["d"], counts["dp"])
        stats["bias moved"] += l1 > 0
        assert l1 <= BIAS_L1, (f"bias counts: L1 {l1} > {BIAS_L1}", sc.neighbour, q)
        if "dn" in built:
            assert counts["dn"] == counts["d"], ("rows with a NULL unit were counted", q)


def test_profile_keeps_its_declared_sensitivity(db):
    stats: Counter = Counter()

    @settings(max_examples=EXAMPLES, **_settings)
    @given(scenarios())
    def prop(sc):
        check_scenario(db, sc, stats)

    prop()
    print("\nauto bounds D/D′:", dict(stats))
    assert stats["accepted"] >= stats["queries"] // 2, stats
    assert stats["histogram moved"] > 0 and stats["bias moved"] > 0, stats  # not vacuous


# ------------------------------------------------------------------------------------------------
# joins (tests/attacks/gen_joins.py): D′ removes one unit and every row reached from it
# ------------------------------------------------------------------------------------------------

JOIN_OPTIONS = {"max_rows_per_unit": "auto", "max_groups_contributed": "auto", "bias_share": 0.05}


def check_join_query(db, q: g.Query, names, stats: Counter) -> None:
    stats["queries"] += 1
    try:
        prepared = prepare(db, q.text(names.d), epsilon=1.0, delta=q.delta, profile=True, **JOIN_OPTIONS)
    except (QueryRejected, InvalidParameter):
        stats["rejected"] += 1
        return
    stats["accepted"] += 1
    spec, plan = prepared.profile, prepared.plan
    sqls = []
    if spec.request is not None:
        sqls.append(("hist", histograms_sql(plan, NOISE_OFF, rows=spec.request.rows, groups=spec.request.groups)))
    final = _plan_at(prepared.bound, plan, prepared.key_types, {"max_groups_contributed": 2, "max_rows_per_unit": 4})
    sqls.append(("bias", bias_counts_sql(final, NOISE_OFF)))
    for kind, sql in sqls:
        run = run_histograms_off if kind == "hist" else (lambda db_, s: {0: run_bias_off(db_, s)})
        d, dp = run(db, sql), run(db, sql.replace(names.d, names.p))
        bound = spec.request.sensitivity if kind == "hist" else BIAS_L1
        for hk in d:
            l1 = _l1(d[hk], dp[hk])
            stats[f"{kind} moved"] += l1 > 0
            assert l1 <= bound, (f"{kind} {hk}: L1 {l1} > {bound}", q.sql, names.normalise(sql))


def test_join_profile_keeps_its_declared_sensitivity(db):
    stats: Counter = Counter()

    @settings(max_examples=JOIN_EXAMPLES, **_settings)
    @given(g.scenarios(1, 4))
    def prop(sc):
        names = build_join(db, sc)
        if names is None:
            return
        try:
            for q in sc.queries:
                check_join_query(db, q, names, stats)
        finally:
            teardown_join(db, names)

    prop()
    print("\nauto bounds D/D′ (joins):", dict(stats))
    # five scenarios may all remove a unit without rows in the accepted queries' relations (seen:
    # 3 accepted, nothing moved): that the joined releases do move is pinned exactly, on known
    # data, by test_join_rows_count_for_their_unit_only
    assert stats["accepted"] > 0, stats


# ------------------------------------------------------------------------------------------------
# hand-written cases
# ------------------------------------------------------------------------------------------------

H = "abh"  # the hand-written cases' database
AUTO = {"max_rows_per_unit": "auto", "max_groups_contributed": "auto"}


@pytest.fixture(scope="module")
def hdb(db):
    """abh.t: 300 units (even ids 1 row, odd ids 3 rows), v partly outside its bounds; abh.rl a
    row-level table; abh.cust / abh.ord a unit table and a child that references it (unit 1: 5
    orders, unit 2: 1, unit 3: none; 4 orders with a NULL unit)."""
    db.command(f"DROP DATABASE IF EXISTS {H}")
    db.command(f"CREATE DATABASE {H}")
    db.command(f"CREATE TABLE {H}.t (u Int64, g String, h Int64, v Float64) ENGINE = MergeTree ORDER BY tuple()")
    db.command(f"INSERT INTO {H}.t SELECT intDiv(number, 2), ['a', 'b', 'c'][number % 3 + 1], number % 10, "
               "number % 121 FROM numbers(600) WHERE number % 2 = 1 OR number % 4 = 0")
    db.command(f"CREATE TABLE {H}.rl (x Float64) ENGINE = MergeTree ORDER BY tuple()")
    db.command(f"INSERT INTO {H}.rl SELECT number FROM numbers(50)")
    db.command(f"CREATE TABLE {H}.cust (ck Int64, cv Float64) ENGINE = MergeTree ORDER BY ck")
    db.command(f"INSERT INTO {H}.cust VALUES (1, 10), (2, 20), (3, 30)")
    db.command(f"CREATE TABLE {H}.ord (ok Int64, ock Nullable(Int64), ov Float64) ENGINE = MergeTree ORDER BY ok")
    db.command(f"INSERT INTO {H}.ord VALUES (1, 1, 1), (2, 1, 2), (3, 1, 3), (4, 1, 4), (5, 1, 5), (6, 2, 6), "
               "(7, NULL, 7), (8, NULL, 8), (9, NULL, 9), (10, NULL, 10)")
    cat = db.catalog
    cat.register(f"{H}.t", privacy_unit="u", bounds={"v": (0, 100)}, max_rows_per_unit=1,
                 public_keys={"g": ["a", "b", "c"]})
    cat.register(f"{H}.rl", bounds={"x": (0, 100)})
    cat.register(f"{H}.cust", privacy_unit="ck", bounds={"cv": (0, 100)})
    cat.register(f"{H}.ord", references={"ock": f"{H}.cust.ck"}, bounds={"ov": (0, 100)})
    for t in ("t", "rl", "cust"):
        db.ledger.set_budget(db.analyst, f"{H}.{t}", epsilon=1e6, delta=0.5)
    yield db
    for t in ("ord", "cust", "rl", "t"):
        cat.drop(f"{H}.{t}")
    db.command(f"DROP DATABASE IF EXISTS {H}")


def _history(db, dataset: str) -> list:
    return db.ledger.history(db.analyst, dataset)


def _udf_name(mech) -> str:
    return mech.sql("__x").split("(")[0]


def test_noise_udf_once_per_released_value(hdb):
    """One call of the noise UDF in the outermost SELECT, which returns one row per released
    value (64 histogram buckets, 3 bias counts); on the engine, two runs differ and the empty
    buckets get different draws (one draw per row, not one per query). Two runs of 64 discrete
    Laplace draws (scale 2/0.05 = 40 or more) coincide with probability below 0.01^64."""
    prepared = prepare(hdb, f"SELECT h AS k, COUNT(*) AS n FROM {H}.t GROUP BY k", epsilon=1.0, delta=1e-6,
                       profile=True, bias_share=0.05, **AUTO)
    spec = prepared.profile
    assert spec.request.rows and spec.request.groups  # partition selection: k costs noise
    mech = spec.histogram_mechanism()
    sql = histograms_sql(prepared.plan, mech.sql, rows=True, groups=True)
    assert sql.count(_udf_name(mech) + "(") == 1
    assert sql.startswith(f"SELECT __dp_hk, __dp_b, {mech.sql('__dp_n')} AS __dp_v\nFROM (")
    runs = [hdb.raw_query(sql) for _ in range(2)]
    assert all(len(r) == 2 * len(GRID) for r in runs)
    assert list(runs[0]["__dp_v"]) != list(runs[1]["__dp_v"])
    empty = runs[0][runs[0]["__dp_b"] >= bucket_of(8)]["__dp_v"]  # no unit has 8 rows or 8 groups
    assert empty.nunique() > 1
    bmech = spec.bias_mechanism()
    bsql = bias_counts_sql(prepared.plan, bmech.sql)
    assert bsql.count(_udf_name(bmech) + "(") == 1
    assert bsql.startswith(f"SELECT __dp_p.1 AS __dp_i, {bmech.sql('__dp_p.2')} AS __dp_v\nFROM (")
    b = [list(hdb.raw_query(bsql)["__dp_v"]) for _ in range(2)]
    assert len(b[0]) == 3 and b[0] != b[1]


def test_rejected_auto_queries_charge_nothing(hdb):
    cases = [
        lambda: hdb.query(f"SELECT COUNT(*) FROM {H}.rl", epsilon=1.0, max_rows_per_unit="auto"),
        lambda: hdb.query(f"SELECT COUNT(*) FROM {H}.rl", epsilon=1.0, bias_share=0.05,
                          max_groups_contributed="auto"),
        lambda: hdb.query(f"SELECT COUNT(*) FROM {H}.t", epsilon=1.0, max_rows_per_unit="auto", auto_share=0.0),
        lambda: hdb.query(f"SELECT COUNT(*) FROM {H}.t", epsilon=1.0, max_rows_per_unit="auto", auto_share=0.3,
                          bias_share=0.3),
        lambda: hdb.robust_median(f"{H}.t", "v", epsilon=1.0, delta=1e-6, max_rows_per_unit="auto"),
        lambda: hdb.robust_median(f"{H}.t", "v", epsilon=1.0, delta=1e-6, bias_share=0.05),
    ]
    for case in cases:
        before = {t: _history(hdb, f"{H}.{t}") for t in ("t", "rl")}
        with pytest.raises(InvalidParameter):
            case()
        assert {t: _history(hdb, f"{H}.{t}") for t in ("t", "rl")} == before
    with hdb.sparse_vector(f"{H}.t", threshold=10, epsilon=1.0) as svt:
        before = _history(hdb, f"{H}.t")
        for opts in ({"max_rows_per_unit": "auto"}, {"bias_share": 0.05}):
            with pytest.raises(InvalidParameter):
                svt.above(f"SELECT COUNT(*) FROM {H}.t", **opts)
        assert _history(hdb, f"{H}.t") == before
        svt.above(f"SELECT COUNT(*) FROM {H}.t")  # the session still answers


@pytest.mark.parametrize("eps", [0.3, 1.0, 0.7])
def test_auto_query_charges_the_requested_epsilon_once(hdb, eps):
    before = len(_history(hdb, f"{H}.t"))
    df = hdb.query(f"SELECT g AS k, COUNT(*) AS n, SUM(v) AS s FROM {H}.t GROUP BY k", epsilon=eps,
                   bias_share=0.05, **AUTO)
    rows = _history(hdb, f"{H}.t")
    assert len(rows) == before + 1
    assert rows[-1].epsilon == pytest.approx(eps, rel=1e-12, abs=0) and rows[-1].delta == 0.0
    assert rows[-1].epsilon <= eps  # never above what was asked (and granted)
    assert df.attrs["epsilon_spent"] == rows[-1].epsilon


@pytest.mark.parametrize("eps, opts", [(0.005, {"max_rows_per_unit": "auto"}), (0.007, {"bias_share": 0.05})])
def test_auto_query_charge_is_exactly_the_requested_epsilon(hdb, eps, opts):
    """The parts (profile shares and the plan's releases, each calibrated at the ε it records) sum, as
    the ledger sums them, to ε or to just below it (dpch.controller._exact_total steps the plan's ε by
    ulps): never above what was asked, never more than a few ulps under."""
    hdb.query(f"SELECT COUNT(*) AS n, SUM(v) AS s FROM {H}.t", epsilon=eps, **opts)
    charged = _history(hdb, f"{H}.t")[-1].epsilon
    assert charged <= eps and eps - charged <= 4 * math.ulp(eps)


def test_failure_after_the_charge_keeps_it(hdb, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("engine lost")

    monkeypatch.setattr("dpch.controller.run_histograms", boom)
    before = hdb.ledger.remaining(hdb.analyst, f"{H}.t").spent.epsilon
    n = len(_history(hdb, f"{H}.t"))
    with pytest.raises(Exception):
        hdb.query(f"SELECT COUNT(*) FROM {H}.t", epsilon=0.5, **AUTO)
    rows = _history(hdb, f"{H}.t")
    assert len(rows) == n + 1 and rows[-1].epsilon == pytest.approx(0.5, rel=1e-12)
    assert hdb.ledger.remaining(hdb.analyst, f"{H}.t").spent.epsilon == pytest.approx(before + 0.5, rel=1e-12)
    monkeypatch.setattr("dpch.controller.run_histograms", unit_profile.run_histograms)
    monkeypatch.setattr("dpch.controller.run_bias_counts", boom)
    with pytest.raises(Exception):
        hdb.query(f"SELECT COUNT(*) FROM {H}.t", epsilon=0.5, bias_share=0.1, **AUTO)
    assert len(_history(hdb, f"{H}.t")) == n + 2


def test_attrs_carry_no_exact_count(hdb):
    """The bias shares are ratios of noisy counts: with fixed M = 1 half of the 300 units are cut
    (exact share 0.5). Three runs at ε_bias = 0.05 (count noise scale 60) give the same two noisy
    counts each time with probability below (0.005²)² < 1e-9."""
    shares = []
    for _ in range(3):
        df = hdb.query(f"SELECT COUNT(*) AS n FROM {H}.t", epsilon=1.0, bias_share=0.05)
        bias = df.attrs["bias"]
        assert bias["epsilon"] == pytest.approx(0.05)
        assert set(bias) >= {"units_cut_share", "values_clipped_share", "shares_sd"}
        shares.append((bias["units_cut_share"], bias["values_clipped_share"], bias["shares_sd"]))
        text = repr(df.attrs)
        assert "'units': 300" not in text and "'cut': 150" not in text
    assert len(set(shares)) > 1, shares


def test_join_rows_count_for_their_unit_only(hdb):
    """abh.ord through its reference and abh.ord JOIN abh.cust: unit 1 has 5 rows, unit 2 one,
    unit 3 none (not counted), the 4 orders with a NULL unit belong to no unit."""
    for sql in (f"SELECT COUNT(*) AS n FROM {H}.ord",
                f"SELECT COUNT(*) AS n FROM {H}.ord o JOIN {H}.cust c ON o.ock = c.ck",
                f"SELECT SUM(o.ov) AS s FROM {H}.cust c JOIN {H}.ord o ON c.ck = o.ock"):
        prepared = prepare(hdb, sql, epsilon=1.0, profile=True, max_rows_per_unit="auto", bias_share=0.1)
        h = run_histograms_off(hdb, histograms_sql(prepared.plan, NOISE_OFF, rows=True, groups=False))[0]
        expect = [0] * len(GRID)
        expect[bucket_of(5)] += 1
        expect[bucket_of(1)] += 1
        assert h == expect, sql
        # the catalog's M = 1 cuts unit 1 only; ov in its bounds: nothing clipped
        assert run_bias_off(hdb, bias_counts_sql(prepared.plan, NOISE_OFF)) == [2, 1, 0], sql
