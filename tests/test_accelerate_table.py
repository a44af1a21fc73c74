"""Per-unit tables (dpch.accelerate_table, dpch.rewrite.unit_table): read when they match and are
fresh, never change an answer, fall back to the table after anything the materialized view missed.

Answers are compared with noise off: the plain path is ``rewrite_for_sensitivity_check`` (the
identity in place of the noise UDFs, no partition selection); the per-unit table's is the same
rewriter with the per-unit stage that ``serve`` chose. Both must be equal exactly (Int64
fixed-point sums)."""
from __future__ import annotations

import dataclasses
import itertools

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from dpch import accelerate_table
from dpch.controller import prepare
from dpch.errors import CatalogError
from dpch.gateway import router
from dpch.gateway.errors import GatewayError
from dpch.rewrite import _Rewriter, rewrite_for_sensitivity_check
from dpch.rewrite.unit_table import ROWS, TOTAL, UNIT, forget, fresh, freshness_sql, per_unit_sql, recorded, serve

DB = "t_acctab"
ANALYST = "tester"
REGIONS = [f"r{i}" for i in range(6)]
GROUPED = [f"SELECT region, COUNT(*) AS n FROM {DB}.sales GROUP BY region",
           f"SELECT region, SUM(amount) AS s, AVG(amount) AS a FROM {DB}.sales GROUP BY region"]
UNGROUPED = [f"SELECT COUNT(*) AS n, SUM(amount) AS s, AVG(amount) AS a FROM {DB}.sales",
             f"SELECT COUNT(*) AS n FROM {DB}.sales WHERE uid < 500"]


def _insert(db, table: str, first_unit: int, units: int, seed: int = 0, settings: str = "") -> None:
    # each unit: 1-12 rows over 1-3 regions (k = 1 and M = 4 drop rows), amounts outside the bounds
    # (clipping), one region outside the public keys
    db.command(
        f"INSERT INTO {table} {settings} SELECT {first_unit} + intDiv(number, 12) AS uid, "
        f"if(number % 37 = 0, 'zz', concat('r', toString((cityHash64(intDiv(number, 12), {seed}) + number % 3) % 6))), "
        f"toFloat64((number * 7 + {seed}) % 700) - 50 FROM numbers({units * 12}) "
        f"WHERE number % 12 < 1 + cityHash64(intDiv(number, 12), 'n', {seed}) % 12")


def _make(db, name: str, unit_type: str = "UInt64") -> str:
    table = f"{DB}.{name}"
    db.command(f"CREATE DATABASE IF NOT EXISTS {DB}")
    db.command(f"DROP TABLE IF EXISTS {table}")
    db.command(f"CREATE TABLE {table} (uid {unit_type}, region String, amount Float64) ENGINE = MergeTree "
               "ORDER BY tuple()")
    db.catalog.register(table, privacy_unit="uid", bounds={"amount": (0, 500)}, max_groups_contributed=1,
                        max_rows_per_unit=4, public_keys={"region": REGIONS}, replace=True)
    db.ledger.set_budget(ANALYST, table, epsilon=1e9, delta=0.5)
    return table


@pytest.fixture(scope="module")
def tdb(db):
    _insert(db, _make(db, "sales"), 0, 2000)
    return db


def _sorted(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values(list(df.columns)).reset_index(drop=True)


def _both(db, sql: str) -> tuple[str, pd.DataFrame, pd.DataFrame]:
    """(the source ``serve`` chose, the plain noiseless answer, the noiseless answer from it)."""
    prepared = prepare(db, sql, epsilon=1.0)
    plan = prepared.plan
    _, source = serve(db.backend, plan, prepared.rewritten)
    plain = _sorted(db.raw_query(rewrite_for_sensitivity_check(plan).sql))
    if source == "table":
        return source, plain, plain
    ut = next(u for u in recorded(db.backend, plan.entry.table) if u.name == source)
    rw = _Rewriter(plan, noise=False, selection=False, table=None, units=lambda r, kh: per_unit_sql(ut, r, kh))
    return source, plain, _sorted(db.raw_query(rw.build().sql))


def _served_equal(db, queries: list[str], names: set[str]) -> None:
    """Each query is read from one of the per-unit tables ``names`` (any that holds its per-unit
    stage: a grouped one holds the row count an ungrouped COUNT needs) with the plain answer."""
    for q in queries:
        source, plain, served = _both(db, q)
        assert source in names, q
        pd.testing.assert_frame_equal(served, plain)


def test_serves_count_sum_avg_exactly_before_and_after_inserts(tdb):
    grouped = tdb.accelerate(f"{DB}.sales", ["region"], method="table")
    ungrouped = tdb.accelerate(f"{DB}.sales", [], method="table")
    assert grouped.method == ungrouped.method == "table" and grouped.current and grouped.name != ungrouped.name
    assert grouped.name.startswith("t_acctab__sales__units2_")
    names = {grouped.name, ungrouped.name}
    _served_equal(tdb, GROUPED, {grouped.name})
    _served_equal(tdb, UNGROUPED, names)
    assert _both(tdb, UNGROUPED[0])[0] == ungrouped.name  # only it holds the ungrouped sums
    _insert(tdb, f"{DB}.sales", 1500, 1000, seed=1)  # units 1500-1999 get more rows, 2000-2499 are new
    _served_equal(tdb, GROUPED, {grouped.name})
    _served_equal(tdb, UNGROUPED, names)
    # the released answer says which source it read; every public key appears
    df = tdb.query(GROUPED[0], epsilon=1.0)
    assert df.attrs["dpch"]["per_unit_source"] == grouped.name and sorted(df["region"]) == REGIONS
    assert tdb.accelerate(f"{DB}.sales", ["region"], method="table") == grouped  # kept, not rebuilt


def _total(db, table: str, name: str) -> pd.DataFrame:
    """Per-unit table ``name``'s total rows (one per part until merged) and its unit rows' count."""
    ut = next(u for u in recorded(db.backend, table) if u.name == name)
    rows = f"a{ut.aggregates.index(ROWS)}"
    return db.raw_query(f"SELECT countMergeIf({rows}, {TOTAL} = 1) AS total, countIf({TOTAL} = 1) AS total_rows, "
                        f"countIf({TOTAL} = 0) AS unit_rows FROM {ut.target_sql}")


@pytest.mark.parametrize("unit_type, values", [
    ("Nullable(UInt64)", ["NULL", "0", "1", "7"]),  # NULL and the type's default (the total row's key) occur
    ("LowCardinality(String)", ["''", "'a'", "'b'", "'zz'"]),
])
def test_total_row_is_never_read_as_a_unit(db, unit_type, values):
    """The total row (all rows, rows without a unit included) carries the unit type's default (NULL
    for a nullable unit); units with that value, and rows without a unit, exist here. Only the flag
    tells the total row apart: every answer equals the plain path's exactly, before and after
    inserts (new rows of an existing unit, of the default unit, of a new unit, without a unit)."""
    table = _make(db, "nul" if unit_type.startswith("Nullable") else "lc", unit_type)

    def put(rows):
        db.command(f"INSERT INTO {table} SELECT arrayJoin([{', '.join(rows)}]) AS uid, "
                   "concat('r', toString(number % 6)), toFloat64(number * 37 % 600) - 50 FROM numbers(5)")

    put(values)
    grouped = db.accelerate(table, ["region"], method="table").name
    ungrouped = db.accelerate(table, [], method="table").name
    for batch in ([], [values[0], values[1]], ["'new'" if "String" in unit_type else "99"]):
        if batch:
            put(batch)
        _served_equal(db, [q.replace(f"{DB}.sales", table) for q in GROUPED], {grouped})
        _served_equal(db, [UNGROUPED[0].replace(f"{DB}.sales", table)], {ungrouped})
        rows = db.raw_query(f"SELECT count() AS n, uniqExact(uid) AS u FROM {table}").iloc[0]
        for name in (grouped, ungrouped):  # the total counts every row of T, the NULL unit's too
            t = _total(db, table, name).iloc[0]
            assert t["total"] == rows["n"] and t["unit_rows"] >= rows["u"] and t["total_rows"] >= 1
    db.drop_accelerations(table)


def test_each_part_holds_its_total_row(db):
    """Atomicity: each insert writes its unit rows and the total row counting them in one part (one
    block of one GROUP BY), so no part can hold a total without its units. An insert whose output
    is split into several parts (small insert blocks) writes the total row in the last one: a
    failure between parts leaves it out (stale). Merges stopped: the parts are the inserts' own."""
    table = _make(db, "parts")
    _insert(db, table, 0, 200)
    acc = db.accelerate(table, ["region"], method="table")
    ut = next(u for u in recorded(db.backend, table) if u.name == acc.name)
    db.command(f"SYSTEM STOP MERGES {ut.target_sql}")
    try:
        for i in range(3):
            _insert(db, table, 150 + 100 * i, 100, seed=i)
        rows = f"a{ut.aggregates.index(ROWS)}"
        parts = db.raw_query(f"SELECT _part, countIf({TOTAL} = 1) AS totals, countMergeIf({rows}, {TOTAL} = 1) AS t, "
                             f"countMergeIf({rows}, {TOTAL} = 0) AS u FROM {ut.target_sql} GROUP BY _part")
        assert len(parts) == 4 and (parts["totals"] == 1).all()
        assert (parts["t"] == parts["u"]).all()  # each part's total counts exactly its unit rows' rows
        assert _both(db, GROUPED[1].replace(f"{DB}.sales", table))[0] == acc.name
        _insert(db, table, 900, 300, seed=7, settings="SETTINGS min_insert_block_size_rows = 10, "
                "min_insert_block_size_bytes = 1, group_by_two_level_threshold = 1")
        split = db.raw_query(f"SELECT toUInt64(splitByChar('_', _part)[2]) AS block, max({TOTAL}) AS total "
                             f"FROM {ut.target_sql} WHERE _part NOT IN {tuple(parts['_part'])} GROUP BY block "
                             "ORDER BY block")
        assert len(split) > 1 and list(split["total"]) == [0] * (len(split) - 1) + [1]  # the total row last
    finally:
        db.command(f"SYSTEM START MERGES {ut.target_sql}")
    db.drop_accelerations(table)


def test_a_per_unit_table_of_the_old_structure_is_stale(db):
    """A per-unit table built before the total row (named ``…__units_<digest>``, checked by
    merging every unit's count) is never read, even holding the right rows with its view in place:
    ``accelerations`` shows it stale, ``drop_accelerations(stale_only=True)`` drops it."""
    table = _make(db, "old")
    _insert(db, table, 0, 100)
    acc = db.accelerate(table, [], method="table")
    new = next(u for u in recorded(db.backend, table) if u.name == acc.name)
    old = dataclasses.replace(new, name=new.name.replace("__units2_", "__units_"))
    view = db.raw_query(f"SELECT create_table_query AS q FROM system.tables WHERE database = 'dpch_accel' "
                        f"AND name = '{new.view_name}'")["q"].iloc[0]
    db.command(f"CREATE TABLE {old.target_sql} AS {new.target_sql}")
    db.command(f"INSERT INTO {old.target_sql} SELECT * FROM {new.target_sql}")
    db.command(view.replace(new.name, old.name))
    db.command(f"INSERT INTO dpch_meta.unit_tables (table_name, name, unit, aggregates, salt_digest, table_uuid, "
               f"engine_full, mutation, group_by, columns) SELECT table_name, '{old.name}', unit, aggregates, "
               f"salt_digest, table_uuid, engine_full, mutation, group_by, columns FROM dpch_meta.unit_tables "
               f"WHERE name = '{new.name}'")
    forget(db.backend, table)
    entry = db.catalog.get(table)
    assert db.raw_query(freshness_sql(old, entry))["fresh"].iloc[0] == 1  # its rows would pass the check
    assert not fresh(db.backend, old, entry)
    assert {(a.name, a.current) for a in db.accelerations(table)} == {(new.name, True), (old.name, False)}
    accelerate_table.drop(db, new)  # only the old one left: the table is read
    assert _both(db, UNGROUPED[0].replace(f"{DB}.sales", table))[0] == "table"
    assert db.drop_accelerations(table, stale_only=True) == [old.name]


def test_queries_it_cannot_serve_read_the_table(tdb):
    tdb.accelerate(f"{DB}.sales", ["region"], method="table")
    for q in (f"SELECT region, COUNT(*) AS n FROM {DB}.sales WHERE amount > 10 GROUP BY region",
              f"SELECT region, SUM(amount * 2) AS s FROM {DB}.sales GROUP BY region"):
        assert _both(tdb, q)[0] == "table", q
        assert tdb.query(q, epsilon=1.0).attrs["dpch"]["per_unit_source"] == "table"


def test_mutations_and_truncate_fall_back_to_the_table(db):
    table = _make(db, "mut")
    _insert(db, table, 0, 300)
    acc = db.accelerate(table, ["region"], method="table")
    q = GROUPED[1].replace(f"{DB}.sales", table)
    assert _both(db, q)[0] == acc.name
    db.command(f"ALTER TABLE {table} DELETE WHERE uid % 10 = 3 SETTINGS mutations_sync = 2")
    source, plain, served = _both(db, q)
    assert source == "table"  # the view never saw the delete
    assert [(a.name, a.current) for a in db.accelerations(table)] == [(acc.name, False)]
    rebuilt = db.accelerate(table, ["region"], method="table")  # a stale one is rebuilt
    assert rebuilt.name == acc.name and rebuilt.current
    source, plain, served = _both(db, q)
    assert source == acc.name
    pd.testing.assert_frame_equal(served, plain)
    db.command(f"ALTER TABLE {table} UPDATE amount = amount + 1 WHERE uid = 5 SETTINGS mutations_sync = 2")
    assert _both(db, q)[0] == "table"  # same row count: the mutation itself makes it stale
    db.accelerate(table, ["region"], method="table")
    db.command(f"TRUNCATE TABLE {table}")
    _insert(db, table, 0, 50)
    assert _both(db, q)[0] == "table"
    assert db.drop_accelerations(table, stale_only=True) == [acc.name]
    assert db.raw_query(f"SELECT count() AS n FROM system.tables WHERE database = 'dpch_accel' "
                        f"AND name LIKE '{acc.name}%'")["n"].iloc[0] == 0  # the view and the table


def test_salt_rotation_makes_it_stale(db):
    """An ungrouped per-unit table holds no hash, but it is keyed on the salt like the others: after
    a rotation it is not read, and building again gives a new one."""
    table = _make(db, "salt")
    _insert(db, table, 0, 100)
    old = db.accelerate(table, [], method="table")
    q = UNGROUPED[0].replace(f"{DB}.sales", table)
    assert _both(db, q)[0] == old.name
    db.catalog.update(table, rotate_salt=True)
    assert _both(db, q)[0] == "table"
    assert [(a.name, a.current) for a in db.accelerations(table)] == [(old.name, False)]
    new = db.accelerate(table, [], method="table")
    assert new.name != old.name
    source, plain, served = _both(db, q)
    assert source == new.name
    pd.testing.assert_frame_equal(served, plain)
    assert db.drop_accelerations(table, stale_only=True) == [old.name]


def test_lists_and_drops_both_kinds(db):
    table = _make(db, "both")
    _insert(db, table, 0, 100)
    proj = db.accelerate(table, ["region"])
    tab = db.accelerate(table, ["region"], method="table")
    assert {(a.name, a.method, a.current) for a in db.accelerations(table)} == \
        {(proj.name, "projection", True), (tab.name, "table", True)}
    assert sorted(db.drop_accelerations(table)) == sorted([proj.name, tab.name])
    assert db.accelerations(table) == []
    with pytest.raises(CatalogError, match="unknown acceleration method"):
        db.accelerate(table, ["region"], method="mv")


def test_refuses_engines_that_merge_rows_away_and_lightweight_updates(db):
    db.command(f"CREATE TABLE IF NOT EXISTS {DB}.repl (uid UInt64, amount Float64) ENGINE = ReplacingMergeTree "
               "ORDER BY uid")
    db.catalog.register(f"{DB}.repl", privacy_unit="uid", bounds={"amount": (0, 1)}, replace=True)
    with pytest.raises(CatalogError, match="plain MergeTree"):
        db.accelerate(f"{DB}.repl", [], method="table")
    # lightweight updates: refused at build; switched on later, the engine definition changes: stale
    db.command(f"CREATE TABLE IF NOT EXISTS {DB}.lwu (uid UInt64, amount Float64) ENGINE = MergeTree ORDER BY uid "
               "SETTINGS enable_block_number_column = 1, enable_block_offset_column = 1")
    db.catalog.register(f"{DB}.lwu", privacy_unit="uid", bounds={"amount": (0, 1)}, replace=True)
    with pytest.raises(CatalogError, match="lightweight updates"):
        db.accelerate(f"{DB}.lwu", [], method="table")
    table = _make(db, "later")
    _insert(db, table, 0, 50)
    acc = db.accelerate(table, [], method="table")
    q = UNGROUPED[0].replace(f"{DB}.sales", table)
    assert _both(db, q)[0] == acc.name
    db.command(f"ALTER TABLE {table} MODIFY SETTING enable_block_number_column = 1, enable_block_offset_column = 1")
    assert _both(db, q)[0] == "table"


class _Gateway:
    """What dpch.gateway.router needs of the gateway, over the test's in-process connection."""

    def __init__(self, conn):
        self.conn = conn

    def catalog_entries(self):
        return self.conn.catalog.list()

    def connection(self, user):
        return self.conn


def test_gateway_refuses_the_per_unit_table(tdb):
    """Attack: the per-unit table holds raw per-unit sums and its view's DDL holds the salt. The
    gateway's own rules refuse every table outside the catalog: reading it directly, in a
    subquery, a join or a CTE; nothing is charged. Its system.tables is a view of the catalog only
    (no dpch_accel table, no DDL)."""
    acc = tdb.accelerate(f"{DB}.sales", ["region"], method="table")
    t = f"dpch_accel.{acc.name}"
    before = tdb.ledger.remaining(ANALYST, f"{DB}.sales").queries
    for sql in (f"SELECT count() FROM {t}", f"SELECT uid, countMerge(a0) FROM {t} GROUP BY uid",
                f"SELECT region, count() FROM {DB}.sales WHERE uid IN (SELECT uid FROM {t}) GROUP BY region",
                f"SELECT count() FROM {DB}.sales AS s JOIN {t} AS u ON s.uid = u.uid",
                f"WITH x AS (SELECT * FROM {t}) SELECT count() FROM x",
                f"SELECT count() FROM {t}__mv"):
        with pytest.raises(GatewayError, match="not in the privacy catalog"):
            router.answer(_Gateway(tdb), ANALYST, sql, {"dpch_epsilon": "1"}, DB)
    assert tdb.ledger.remaining(ANALYST, f"{DB}.sales").queries == before
    shown = router.answer(_Gateway(tdb), ANALYST, "SELECT database, name, create_table_query FROM system.tables",
                          {}, DB).df
    assert len(shown) and "dpch_accel" not in set(shown["database"]) and acc.name not in set(shown["name"])
    assert not any(shown["create_table_query"].astype(str).str.len())


def test_gateway_answers_from_it(tdb, monkeypatch):
    """The gateway's path (run_query_formatted) reads the per-unit table too."""
    import dpch.controller as controller

    acc = tdb.accelerate(f"{DB}.sales", ["region"], method="table")
    seen = []

    def spy(*a):
        out = real(*a)
        seen.append(out[1])
        return out

    real = controller.serve_per_unit
    monkeypatch.setattr(controller, "serve_per_unit", spy)
    ans = router.answer(_Gateway(tdb), ANALYST, GROUPED[1], {"dpch_epsilon": "1"}, DB)
    assert seen == [acc.name] and ans.kind == "dp" and ans.rows == len(REGIONS)
    assert all(r.encode() in ans.body for r in REGIONS)


_counter = itertools.count()


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(rows=st.lists(st.tuples(st.integers(0, 30), st.sampled_from(REGIONS + ["zz"]), st.floats(-100, 700)),
                     min_size=0, max_size=60),
       batches=st.lists(st.lists(st.tuples(st.integers(0, 40), st.sampled_from(REGIONS), st.floats(-100, 700)),
                                 min_size=1, max_size=20), max_size=3))
def test_generative_equal_to_the_plain_path(db, rows, batches):
    """D and its updates D′ = D + batch: random rows, random insert batches (existing and new
    units); after each, the per-unit table's noiseless answers equal the plain path's."""
    table = _make(db, f"gen{next(_counter)}")

    def put(rs):
        if rs:
            db.command(f"INSERT INTO {table} VALUES " + ", ".join(f"({u}, '{r}', {x!r})" for u, r, x in rs))

    put(rows)
    grouped = db.accelerate(table, ["region"], method="table").name
    ungrouped = db.accelerate(table, [], method="table").name
    for batch in [[]] + batches:
        put(batch)
        _served_equal(db, [q.replace(f"{DB}.sales", table) for q in GROUPED], {grouped})
        _served_equal(db, [UNGROUPED[0].replace(f"{DB}.sales", table)], {ungrouped})
    db.drop_accelerations(table)
    db.command(f"DROP TABLE {table}")
