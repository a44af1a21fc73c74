"""Query shapes of the ClickBench-style workload (issue 17) that the controller learned to answer:

* ``GROUP BY 1`` where position 1 (or an alias) names a constant SELECT item (ClickBench Q34,
  ``SELECT 1, URL, COUNT(*) ... GROUP BY 1, URL``): the constant splits no group and is dropped
  from the keys; the item stays a constant output;
* ``length(col)`` / ``lengthUTF8(col)`` / ``char_length(col)`` inside an aggregate (Q27,
  ``AVG(length(URL))``): bounded by the catalog's declaration ``bounds={"length(URL)": (lo, hi)}``
  or by N for a FixedString(N), clipped to them in SQL.

The sensitivity checks run the rewritten query with the noise off on D and D′ (D without one unit,
whose string is 10 000 bytes long, far above the declared 64) and compare the un-noised quantities
with the planner's declared L1 and with an independently computed number (M · 64 bytes).
"""
from __future__ import annotations

import pytest

from dpch.bind import bind
from dpch.errors import CatalogError, QueryRejected
from dpch.parse import parse
from dpch.plan import QueryOptions, make_plan
from dpch.plan.bounds import bound_expression
from dpch.rewrite import rewrite_for_sensitivity_check

DB = "t_cbshapes"
T = f"{DB}.hits"
M = 3
HEAVY = 7  # the unit whose long strings D′ removes
LONG = 10_000
DATE_BOUNDS = {"day": ("2024-01-01", "2024-12-31"), "ts": ("2024-01-01 00:00:00", "2024-02-01 00:00:00")}


@pytest.fixture(scope="module")
def cdb(db):
    db.command(f"CREATE DATABASE IF NOT EXISTS {DB}")
    db.command(f"DROP TABLE IF EXISTS {T}")
    db.command(f"CREATE TABLE {T} (user_id UInt64, s String, fs FixedString(8), ns Nullable(String), "
               "region String, x Float64, day Date, ts DateTime('UTC')) ENGINE = MergeTree ORDER BY user_id")
    # 40 units x 5 rows; strings of 1..40 bytes; unit HEAVY's strings are LONG bytes
    db.command(f"INSERT INTO {T} SELECT intDiv(number, 5) AS user_id, "
               f"if(user_id = {HEAVY}, repeat('z', {LONG}), repeat('a', 1 + number % 40)) AS s, "
               "toFixedString('abc', 8) AS fs, if(number % 3 = 0, NULL, 'xy') AS ns, "
               "['a', 'b'][1 + number % 2] AS region, toFloat64(number % 10) AS x, "
               f"if(user_id = {HEAVY}, toDate('2099-12-31'), toDate('2024-01-01') + number) AS day, "
               "toDateTime('2024-01-01 00:00:00', 'UTC') + number * 3600 AS ts FROM numbers(200)")
    db.catalog.register(T, privacy_unit="user_id", bounds={"x": (0, 10), "LENGTH(`s`)": (0, 64), **DATE_BOUNDS},
                        max_groups_contributed=1, max_rows_per_unit=M, public_keys={"region": ["a", "b"]})
    db.ledger.set_budget(db.analyst, T, epsilon=1e6, delta=0.5)
    db.command(f"DROP TABLE IF EXISTS {DB}.hits_minus")
    db.command(f"CREATE TABLE {DB}.hits_minus AS {T}")
    db.command(f"INSERT INTO {DB}.hits_minus SELECT * FROM {T} WHERE user_id != {HEAVY}")
    return db


def _plan(db, sql, delta=0.0):
    return make_plan(bind(parse(sql), db.catalog.get(T)), 1.0, delta, QueryOptions())


# -- GROUP BY a constant SELECT item ------------------------------------------------------------------

def test_group_by_position_of_a_constant_drops_the_key(cdb):
    entry = cdb.catalog.get(T)
    b = bind(parse(f"SELECT 1, region, COUNT(*) AS c FROM {T} GROUP BY 1, region ORDER BY c DESC LIMIT 1"), entry)
    assert [k.sql for k in b.keys] == ["region"]
    assert [o.kind for o in b.outputs] == ["constant", "key", "aggregate"]
    same = bind(parse(f"SELECT 1, region, COUNT(*) AS c FROM {T} GROUP BY region ORDER BY c DESC LIMIT 1"), entry)
    assert [k.sql for k in same.keys] == [k.sql for k in b.keys] and b.grouped == same.grouped


def test_only_constant_keys_is_an_ungrouped_query(cdb):
    """All keys constant = no GROUP BY: exactly one row, even where no row matches (a group that
    exists only when rows do would tell whether unit HEAVY has a row)."""
    entry = cdb.catalog.get(T)
    b = bind(parse(f"SELECT 'k' AS one, COUNT(*) AS n FROM {T} GROUP BY one"), entry)
    assert b.keys == () and not b.grouped
    for where in (f"user_id = {HEAVY}", "user_id = 100000"):
        df = cdb.query(f"SELECT 'k' AS one, COUNT(*) AS n FROM {T} WHERE {where} GROUP BY 1", epsilon=1.0)
        assert list(df.columns) == ["one", "n"] and len(df) == 1 and df["one"].iloc[0] == "k"


def test_q34_shape_answers_with_the_constant_column(cdb):
    df = cdb.query(f"SELECT 1, region, COUNT(*) AS c FROM {T} GROUP BY 1, region ORDER BY c DESC LIMIT 10",
                   epsilon=1.0)
    assert list(df.columns) == ["1", "region", "c"]
    assert sorted(df["region"]) == ["a", "b"] and set(df["1"]) == {1}


@pytest.mark.parametrize("sql, message", [
    (f"SELECT COUNT(*) FROM {T} GROUP BY 'x'", "GROUP BY a constant is not supported"),
    (f"SELECT COUNT(*) FROM {T} GROUP BY 1 + 1", "a key must depend on a column"),
    (f"SELECT region, COUNT(*) AS c FROM {T} GROUP BY 2", "grouping by an aggregate"),
    (f"SELECT 1, COUNT(*) FROM {T} GROUP BY 3", "position 3 is out of range"),
])
def test_other_constant_keys_stay_rejected(cdb, sql, message):
    with pytest.raises(QueryRejected, match=message):
        cdb.explain(sql, epsilon=1.0)


# -- length() bounds ----------------------------------------------------------------------------------

def test_catalog_length_bounds_are_normalised_and_stored(cdb):
    entry = cdb.catalog.get(T)
    assert entry.bounds["length(s)"] == (0.0, 64.0)
    cdb.catalog.refresh()
    assert cdb.catalog.get(T).bounds["length(s)"] == (0.0, 64.0)  # read back from dpch_meta
    assert "length bounds [0.0, 64.0]" in entry.describe()


@pytest.mark.parametrize("bounds, message", [
    ({"length(x)": (0, 10)}, "'x' is not a registered String column"),
    ({"length(nope)": (0, 10)}, "'nope' is not a registered String column"),
    ({"length(s)": (-1, 10)}, "a length is not negative"),
    ({"length(s)": (10, 1)}, "lower bound must not exceed"),
    ({"s": (0, 10)}, "not numeric"),
])
def test_catalog_rejects_bad_length_bounds(cdb, bounds, message):
    with pytest.raises(CatalogError, match=message):
        cdb.catalog.register(T, privacy_unit="user_id", bounds=bounds)
    assert cdb.catalog.get(T).bounds["length(s)"] == (0.0, 64.0)  # nothing changed


@pytest.mark.parametrize("expr, interval, nullable", [
    ("length(s)", (0.0, 64.0), False),
    ("lengthUTF8(s)", (0.0, 64.0), False),
    ("char_length(s)", (0.0, 64.0), False),
    ("length(fs)", (8.0, 8.0), False),     # FixedString(8): always 8 bytes
    ("length(s) * 2 + 1", (1.0, 129.0), False),
])
def test_bound_expression_of_lengths(cdb, expr, interval, nullable):
    entry = cdb.catalog.get(T)
    node = parse(f"SELECT SUM({expr}) FROM {T}").select.expressions[0].this
    iv, sql, nul = bound_expression(node, entry, f"SUM({expr})")
    assert iv == interval and nul == nullable
    assert "if(toFloat64(length" in sql  # the clipped length (clamp_sql)


@pytest.mark.parametrize("expr, message", [
    ("length(ns)", "needs bounds on the length of 'ns'"),      # no declaration
    ("length(concat(s, s))", "bounded only of a String column"),
    ("length(x)", "bounded only for a String column"),
])
def test_unbounded_lengths_are_rejected_naming_the_declaration(cdb, expr, message):
    with pytest.raises(QueryRejected, match=message) as e:
        cdb.explain(f"SELECT AVG({expr}) FROM {T}", epsilon=1.0)
    if "needs bounds" in message:
        assert "bounds={'length(ns)': (0, hi)}" in str(e.value)


def _quantities(db, plan, table):
    rw = rewrite_for_sensitivity_check(plan, table=table)
    df = db.raw_query(rw.sql)
    return {tuple(str(df[o.name].iloc[i]) for o in plan.bound.outputs if o.kind == "key"):
            [int(df[c].iloc[i]) for c in rw.internal_columns] for i in range(len(df))}


@pytest.mark.parametrize("sql", [
    f"SELECT SUM(length(s)) AS l FROM {T}",
    f"SELECT region, AVG(lengthUTF8(s)) AS l, COUNT(*) AS c FROM {T} GROUP BY region",
])
def test_long_strings_move_the_sums_by_at_most_the_declared_bound(cdb, sql):
    """D′ drops unit HEAVY (strings of 10 000 bytes): each un-noised quantity moves by at most its
    declared L1, which is M · 64 bytes on the grid for a length sum (computed here independently:
    the unit keeps M = 3 rows, each clipped to the declared 64), and the heavy unit does move it."""
    plan = _plan(cdb, sql)
    d, d_minus = _quantities(cdb, plan, None), _quantities(cdb, plan, f"{DB}.hits_minus")
    moved = False
    for q in plan.quantities:
        if q.kind == "sum" and q.value_interval == (0.0, 64.0) and q.centre == 0.0:
            assert q.l1 * q.grid == M * 64  # the paper's Remark 1 bound, in bytes
        diff = sum(abs(d.get(k, [0] * len(plan.quantities))[q.index] - d_minus.get(k, [0] * len(plan.quantities))[q.index])
                   for k in set(d) | set(d_minus))
        assert diff <= q.l1, (q.label, diff, q.l1)
        moved = moved or diff > 0
    assert moved


def test_avg_length_answers_inside_the_bounds(cdb):
    df = cdb.query(f"SELECT AVG(length(s)) AS l FROM {T}", epsilon=1.0)
    assert 0.0 <= float(df["l"].iloc[0]) <= 64.0


# -- shifted sums (ClickBench Q29) -------------------------------------------------------------------

def test_shifted_sums_share_two_quantities(cdb):
    """SUM(x), SUM(x + 1), SUM(x - 2.5), SUM(3 + (x)): one SUM(x) and one COUNT(x), the shifts are
    templates over them (post-processing); the charge is still ε."""
    sql = f"SELECT SUM(x) AS s0, SUM(x + 1) AS s1, SUM(x - 2.5) AS s2, SUM(3 + (x)) AS s3 FROM {T}"
    plan = _plan(cdb, sql)
    assert [(a.func, a.arg.sql()) for a in plan.bound.aggregates] == [("sum", "x"), ("count", "x")]
    assert [o.kind for o in plan.bound.outputs] == ["aggregate", "derived", "derived", "derived"]
    assert len(plan.quantities) == 2
    assert sum(m.epsilon for m in plan.cost.mechanisms) == pytest.approx(1.0)


@pytest.mark.parametrize("sql", [
    f"SELECT SUM(x + 1) AS s FROM {T}",                       # one shift: nothing to share
    f"SELECT SUM(x + 1) AS a, SUM(x * 2 + 1) AS b FROM {T}",  # different bases
    f"SELECT SUM(x + 1) AS a, SUM(x + 1) AS b FROM {T}",      # the same shift twice
])
def test_unshared_shifted_sums_keep_their_own_quantity(cdb, sql):
    plan = _plan(cdb, sql)
    assert all(a.func == "sum" for a in plan.bound.aggregates)
    assert all(o.kind == "aggregate" for o in plan.bound.outputs)


def test_shifted_sum_template_equals_the_direct_sum_without_noise(cdb):
    """Σ(clip(x) + c) over the kept rows = Σ clip(x) + c · (kept non-NULL rows), with the noise
    off: the decomposed plan's two quantities give exactly the direct plan's un-noised sum. Both
    equal the number computed here from the per-unit sums: each unit has 5 rows > M = 3, so its sum
    is scaled by 3/5 on the grid g = 2^(⌊log2 10⌋ + 1 − 20) (docs/CONTROLLER.md, "Per-row bounds"),
    and each unit adds 3 rows' shift 7 (S_u·3/5 on the grid is never a tie: no rounding ambiguity)."""
    entry = cdb.catalog.get(T)
    shared = make_plan(bind(parse(f"SELECT SUM(x) AS a, SUM(x + 7) AS b FROM {T}"), entry), 1.0, 0.0, QueryOptions())
    direct = make_plan(bind(parse(f"SELECT SUM(x + 7) AS b FROM {T}"), entry), 1.0, 0.0, QueryOptions())
    (qs,) = _quantities(cdb, shared, None).values()
    (qd,) = _quantities(cdb, direct, None).values()
    g = shared.quantities[0].grid
    assert g == 2.0 ** -16 and shared.quantities[0].centre == 0.0 and direct.quantities[0].centre == 0.0
    total = qs[0] * g + 7 * qs[1]
    assert direct.quantities[0].grid * qd[0] == total
    per_unit = cdb.raw_query(f"SELECT user_id, sum(x) AS s, count() AS c FROM {T} GROUP BY user_id")
    assert set(per_unit["c"]) == {5}
    expected = sum(round(float(s) / g * M / 5) * g for s in per_unit["s"]) + 7 * M * len(per_unit)
    assert total == expected


# -- MIN/MAX/quantiles of Date/DateTime columns (ClickBench Q6) --------------------------------------

def test_date_bounds_are_stored_as_epoch_numbers(cdb):
    """Days / seconds since 1970-01-01 UTC, checked against the engine's own conversion."""
    b = cdb.catalog.get(T).bounds
    ref = cdb.raw_query("SELECT toInt64(toDate('2024-01-01')) AS d0, toInt64(toDate('2024-12-31')) AS d1, "
                        "toInt64(toDateTime('2024-02-01 00:00:00', 'UTC')) AS t1")
    assert b["day"] == (float(ref["d0"].iloc[0]), float(ref["d1"].iloc[0])) == (19723.0, 20088.0)
    assert b["ts"][1] == float(ref["t1"].iloc[0])


@pytest.mark.parametrize("bounds, message", [
    ({"day": ("2024-01-01 00:00:00", "2024-12-31")}, "must be a pair \\(lo, hi\\) of dates"),
    ({"day": ("2024-13-01", "2024-12-31")}, "must be a pair \\(lo, hi\\) of dates"),
    ({"ts": ("yesterday", "2024-12-31")}, "of date-times"),
    ({"day": ("2024-12-31", "2024-01-01")}, "lower bound must not exceed"),
])
def test_bad_date_bounds_are_rejected(cdb, bounds, message):
    with pytest.raises(CatalogError, match=message):
        cdb.catalog.register(T, privacy_unit="user_id", bounds=bounds)


def test_min_max_of_dates_return_dates_inside_the_bounds(cdb):
    """The released values are of the column's type and inside the declared bounds whatever the
    noise (unit HEAVY's 2099-12-31 is clipped to the upper bound)."""
    import datetime as dt

    df = cdb.query(f"SELECT MIN(day) AS lo, MAX(day) AS hi, median(ts) AS m, quantile(0.9)(ts) AS q FROM {T}",
                   epsilon=1.0)
    for col in ("lo", "hi"):
        v = df[col].iloc[0]
        assert dt.date(2024, 1, 1) <= (v.date() if hasattr(v, "date") else v) <= dt.date(2024, 12, 31)
    for col in ("m", "q"):
        v = df[col].iloc[0]
        assert str(v)[:7] in ("2024-01", "2024-02")
    bound = bind(parse(f"SELECT MIN(day) AS lo FROM {T}"), cdb.catalog.get(T))
    assert bound.outputs[0].kind == "derived" and "toDate(toUInt16(round(" in bound.outputs[0].template.sql(dialect="clickhouse")


def test_date_bound_expression_is_the_epoch_number(cdb):
    node = parse(f"SELECT MIN(day) FROM {T}").select.expressions[0].this
    iv, sql, _ = bound_expression(node, cdb.catalog.get(T), "MIN(day)")
    assert iv == (19723.0, 20088.0) and sql.startswith("if(toFloat64(toInt64(`day`)) < ")


def test_quantiles_array_of_a_date_is_rejected(cdb):
    with pytest.raises(QueryRejected, match="quantiles of a Date/DateTime column are not supported"):
        cdb.explain(f"SELECT quantiles(0.1, 0.9)(day) FROM {T}", epsilon=1.0)


# -- EXTRACT(unit FROM t) (ClickBench Q18's key) -----------------------------------------------------

@pytest.mark.parametrize("unit, function", [("minute", "toMinute"), ("YEAR", "toYear"), ("Day", "toDayOfMonth"),
                                            ("second", "toSecond"), ("QUARTER", "toQuarter")])
def test_extract_is_the_date_part_function(cdb, unit, function):
    b = bind(parse(f"SELECT extract({unit} FROM ts) AS m, COUNT(*) AS c FROM {T} GROUP BY m"), cdb.catalog.get(T))
    assert [k.sql for k in b.keys] == [f"{function}(ts)"] and b.keys[0].name == "m"


def test_extract_key_answers_and_matches_the_engine(cdb):
    """Partition selection releases only keys that exist: every released hour is one of the
    engine's own toHour values."""
    df = cdb.query(f"SELECT EXTRACT(HOUR FROM ts) AS h, COUNT(*) AS c FROM {T} WHERE EXTRACT(DAY FROM day) = 1 "
                   "GROUP BY h", epsilon=1.0, delta=1e-6)
    assert list(df.columns) == ["h", "c"]
    hours = set(cdb.raw_query(f"SELECT DISTINCT toHour(ts) AS h FROM {T}")["h"])
    assert set(df["h"]) <= hours


@pytest.mark.parametrize("sql, message", [
    (f"SELECT EXTRACT(EPOCH FROM ts) AS e, COUNT(*) FROM {T} GROUP BY e", "extract"),
    (f"SELECT EXTRACT(MINUTE FROM day) AS e, COUNT(*) FROM {T} GROUP BY e", "ILLEGAL_TYPE_OF_ARGUMENT"),
])
def test_other_extracts_are_rejected_before_the_charge(cdb, sql, message):
    with pytest.raises(QueryRejected, match=message):
        cdb.query(sql, epsilon=1.0, delta=1e-6)


# -- the workload itself ----------------------------------------------------------------------------

def test_the_clickbench_workload_is_answered_as_classified(db):
    """bench/clickbench: every query classified DP-expressible passes the controller up to the
    charge (explain: parse, bind, plan, rewrite, type check; nothing runs, nothing is charged) on
    a small generated hits table, and every other one is rejected."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from clickbench import schema
    from clickbench.queries import QUERIES

    assert len(QUERIES) == 43
    schema.build(db, 20_000, 2_000)
    outcome = {}
    for q in QUERIES:
        try:
            db.explain(q.sql, epsilon=1.0, delta=1e-6)
            outcome[q.name] = True
        except QueryRejected:
            outcome[q.name] = False
    assert outcome == {q.name: q.expressible for q in QUERIES}
    assert sum(q.expressible for q in QUERIES) == 31
