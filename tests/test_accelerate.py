"""Per-unit projections (dpch.accelerate): used when they match, never change an answer.

Answers are compared with noise off (``rewrite_for_sensitivity_check``: the same rewritten query
with the identity in place of the noise UDFs and no partition selection), once with projections
and once with ``optimize_use_projections=0``: they must be equal exactly (Int64 fixed-point sums)."""
from __future__ import annotations

import pandas as pd
import pytest

from dpch.controller import prepare
from dpch.errors import CatalogError
from dpch.rewrite import rewrite_for_sensitivity_check

DB = "t_accel"
ANALYST = "tester"
REGIONS = [f"r{i}" for i in range(8)]


def _insert(db, first_unit: int, units: int) -> None:
    # each unit: 1-12 rows over 1-3 regions (so k = 1 and M = 4 both drop rows), some amounts
    # outside the bounds (clipping) and one region outside the public keys
    db.command(
        f"INSERT INTO {DB}.sales SELECT {first_unit} + intDiv(number, 12) AS uid, "
        f"if(number % 37 = 0, 'zz', concat('r', toString((cityHash64(intDiv(number, 12)) + number % 3) % 8))) AS region, "
        "toFloat64(number % 700) - 50 AS amount, toUInt8(number % 100) AS age "
        f"FROM numbers({units * 12}) WHERE number % 12 < 1 + cityHash64(intDiv(number, 12), 'n') % 12")


@pytest.fixture(scope="module")
def adb(db):
    db.command(f"CREATE DATABASE IF NOT EXISTS {DB}")
    db.command(f"DROP TABLE IF EXISTS {DB}.sales")
    db.command(f"CREATE TABLE {DB}.sales (uid UInt64, region String, amount Float64, age UInt8) "
               "ENGINE = MergeTree ORDER BY tuple()")
    _insert(db, 0, 3000)
    db.catalog.register(f"{DB}.sales", privacy_unit="uid", bounds={"amount": (0, 500)},
                        max_groups_contributed=1, max_rows_per_unit=4, public_keys={"region": REGIONS})
    db.ledger.set_budget(ANALYST, f"{DB}.sales", epsilon=1e9, delta=0.5)
    return db


def _uses_projection(db, sql: str) -> bool:
    return db.raw_query("EXPLAIN " + sql)["explain"].str.contains("dpch_unit_").any()


def _noiseless(db, sql: str, *, projections: bool, delta: float = 0.0) -> pd.DataFrame:
    rw = rewrite_for_sensitivity_check(prepare(db, sql, epsilon=1.0, delta=delta).plan)
    suffix = "" if projections else " SETTINGS optimize_use_projections = 0"
    df = db.raw_query(rw.sql + suffix)
    return df.sort_values(list(df.columns)).reset_index(drop=True)


QUERIES = [
    f"SELECT region, COUNT(*) AS n, SUM(amount) AS s FROM {DB}.sales GROUP BY region",
    f"SELECT region, AVG(amount) AS a, COUNT(DISTINCT uid) AS u FROM {DB}.sales GROUP BY region",
]


def test_projection_serves_matching_queries_with_identical_answers(adb):
    before = {q: _noiseless(adb, q, projections=False) for q in QUERIES}
    acc = adb.accelerate(f"{DB}.sales", ["region"])
    assert acc.current and acc.name.startswith("dpch_unit_") and acc.columns == ("amount",)
    assert [a.name for a in adb.accelerations(f"{DB}.sales")] == [acc.name]
    for q in QUERIES:
        rw = prepare(adb, q, epsilon=1.0).rewritten.sql
        assert _uses_projection(adb, rw), q
        pd.testing.assert_frame_equal(_noiseless(adb, q, projections=True), before[q])
    # the public key outside the catalog set never appears; every public key does
    df = adb.query(QUERIES[0], epsilon=1.0)
    assert sorted(df["region"]) == REGIONS


def test_projection_follows_inserts(adb):
    adb.accelerate(f"{DB}.sales", ["region"])
    _insert(adb, 10_000, 500)  # a new part: ClickHouse builds its projection part on insert
    q = QUERIES[0]
    assert _uses_projection(adb, prepare(adb, q, epsilon=1.0).rewritten.sql)
    pd.testing.assert_frame_equal(_noiseless(adb, q, projections=True), _noiseless(adb, q, projections=False))


def test_queries_it_cannot_serve_read_the_table(adb):
    adb.accelerate(f"{DB}.sales", ["region"])
    for q in (f"SELECT region, COUNT(*) AS n FROM {DB}.sales WHERE amount > 10 GROUP BY region",
              f"SELECT region, SUM(amount * 2) AS s FROM {DB}.sales GROUP BY region"):
        assert not _uses_projection(adb, prepare(adb, q, epsilon=1.0).rewritten.sql), q
        pd.testing.assert_frame_equal(_noiseless(adb, q, projections=True), _noiseless(adb, q, projections=False))


def test_ungrouped_queries(adb):
    acc = adb.accelerate(f"{DB}.sales", [])
    q = f"SELECT COUNT(*) AS n, SUM(amount) AS s, AVG(amount) AS a FROM {DB}.sales"
    assert acc.group_by == ()
    assert _uses_projection(adb, prepare(adb, q, epsilon=1.0).rewritten.sql)
    pd.testing.assert_frame_equal(_noiseless(adb, q, projections=True), _noiseless(adb, q, projections=False))


def test_catalog_change_makes_it_stale(db):
    db.command(f"CREATE DATABASE IF NOT EXISTS {DB}")
    db.command(f"DROP TABLE IF EXISTS {DB}.stale")
    db.command(f"CREATE TABLE {DB}.stale (uid UInt64, region String, amount Float64) ENGINE = MergeTree ORDER BY uid")
    db.command(f"INSERT INTO {DB}.stale SELECT number % 50, concat('r', toString(number % 3)), number FROM numbers(500)")
    kw = dict(privacy_unit="uid", max_groups_contributed=1, max_rows_per_unit=5,
              public_keys={"region": ["r0", "r1", "r2"]})
    db.catalog.register(f"{DB}.stale", bounds={"amount": (0, 100)}, **kw)
    old = db.accelerate(f"{DB}.stale", ["region"])
    db.catalog.update(f"{DB}.stale", bounds={"amount": (0, 200)})
    listed = db.accelerations(f"{DB}.stale")
    assert [(a.name, a.current) for a in listed] == [(old.name, False)]
    q = f"SELECT region, SUM(amount) AS s FROM {DB}.stale GROUP BY region"
    assert not _uses_projection(db, prepare(db, q, epsilon=1.0).rewritten.sql)
    new = db.accelerate(f"{DB}.stale", ["region"])
    assert new.name != old.name and _uses_projection(db, prepare(db, q, epsilon=1.0).rewritten.sql)
    assert db.drop_accelerations(f"{DB}.stale", stale_only=True) == [old.name]
    assert [(a.name, a.current) for a in db.accelerations(f"{DB}.stale")] == [(new.name, True)]
    assert db.drop_accelerations(f"{DB}.stale") == [new.name]
    assert db.accelerations(f"{DB}.stale") == []


def test_rejections(db):
    db.command(f"CREATE DATABASE IF NOT EXISTS {DB}")
    db.command(f"DROP TABLE IF EXISTS {DB}.rej")
    db.command(f"CREATE TABLE {DB}.rej (uid UInt64, region String, amount Float64, note String) "
               "ENGINE = MergeTree ORDER BY uid")
    db.command(f"INSERT INTO {DB}.rej SELECT number % 20, 'a', 0.5, toString(number % 4) FROM numbers(100)")
    db.catalog.register(f"{DB}.rej", bounds={"amount": (0, 1)})
    with pytest.raises(CatalogError, match="row-level"):
        db.accelerate(f"{DB}.rej", [])
    db.catalog.register(f"{DB}.rej", privacy_unit="uid", bounds={"amount": (0, 1)}, max_groups_contributed=2,
                        public_keys={"region": ["a"]}, replace=True)
    with pytest.raises(CatalogError, match="k = 1"):
        db.accelerate(f"{DB}.rej", ["region"])
    db.catalog.register(f"{DB}.rej", privacy_unit="uid", bounds={"amount": (0, 1)}, max_groups_contributed=1,
                        replace=True)
    acc = db.accelerate(f"{DB}.rej", ["note"])  # no public keys: private partition selection
    q = f"SELECT note, COUNT(*) AS n FROM {DB}.rej GROUP BY note"
    rw = prepare(db, q, epsilon=1.0, delta=1e-6).rewritten.sql
    assert acc.current and _uses_projection(db, rw)
    pd.testing.assert_frame_equal(_noiseless(db, q, projections=True, delta=1e-6),
                                  _noiseless(db, q, projections=False, delta=1e-6))
    with pytest.raises(CatalogError, match="without bounds"):
        db.accelerate(f"{DB}.rej", [], columns=["note"])
    with pytest.raises(CatalogError, match="does not exist"):
        db.accelerate(f"{DB}.nope", [])


def test_explain_says_whether_a_projection_can_serve_the_query(adb):
    hint = adb.explain(QUERIES[0], epsilon=1.0).per_unit_stage
    assert "db.accelerate('t_accel.sales', ['region'])" in hint
    assert "`dpch catalog accelerate t_accel.sales --group-by region`" in hint
    where = adb.explain(f"SELECT region, COUNT(*) AS n FROM {DB}.sales WHERE amount > 1 GROUP BY region", epsilon=1.0)
    assert "WHERE on a column other than the privacy unit" in where.per_unit_stage
    assert "per-unit stage: read from the table" in str(where)
    keys = adb.explain(f"SELECT region, COUNT(*) AS n FROM {DB}.sales GROUP BY region", epsilon=1.0,
                       keys={"region": ["r1"]})
    assert "filters rows before bounding" in keys.per_unit_stage
    # per-unit samples: db.accelerate's structures hold COUNT/SUM/AVG states only, so no hint to build one
    for agg in ("MAX(amount)", "COUNT(DISTINCT age)", "quantile(0.5)(amount)"):
        sampled = adb.explain(f"SELECT region, {agg} AS v FROM {DB}.sales GROUP BY region", epsilon=1.0).per_unit_stage
        assert sampled.startswith("read from the table (MIN/MAX, quantiles") and "accelerate" not in sampled, sampled
