"""The plan cache (dpch.plan_cache, issue 33 item 1): a repeated query skips parse/bind/plan/rewrite
and the engine's DESCRIBEs, and gets exactly what preparing again gives; anything that changes the
rewritten SQL or the cost (the catalog entry's version or salt, ε, δ, an option, the tree) is a
different key; another analyst never gets an object prepared for someone else; the budget
precheck and the charge run on every call; joined relations are not cached."""
from __future__ import annotations

import numpy as np
import pytest

from dpch import plan_cache
from dpch.connection import Connection
from dpch.controller import prepare, run_query
from dpch.errors import BudgetExceeded
from dpch.parse import parse

DB = "t_plan_cache"
T = f"{DB}.events"
SQL = f"SELECT country, COUNT(*) AS n, SUM(amount) AS s FROM {T} GROUP BY country"


@pytest.fixture()
def cdb(db):
    db.command(f"CREATE DATABASE IF NOT EXISTS {DB}")
    db.command(f"DROP TABLE IF EXISTS {T}")
    db.command(f"CREATE TABLE {T} (user_id UInt64, country String, amount Float64) ENGINE = MergeTree ORDER BY user_id")
    db.command(f"INSERT INTO {T} SELECT number % 50, ['CA', 'US'][1 + number % 2], number % 100 FROM numbers(500)")
    if T in db.catalog:
        db.catalog.drop(T)
    db.catalog.register(T, privacy_unit="user_id", bounds={"amount": (0, 100)}, max_rows_per_unit=10,
                        public_keys={"country": ["CA", "US"]})
    for analyst in {a.analyst for a in db.ledger.budgets() if a.dataset == T}:
        db.ledger.reset(analyst, T, confirm=True)
    db.ledger.set_budget(db.analyst, T, epsilon=100.0)
    plan_cache.clear()
    return db


def _same(a, b) -> bool:
    return a.rewritten == b.rewritten and a.cost == b.cost


def test_a_repeated_query_is_a_hit_with_the_same_plan(cdb):
    first = prepare(cdb, SQL, epsilon=1.0)
    again = prepare(cdb, SQL, epsilon=1.0)
    assert "plan cache" not in first.timings_ms and set(again.timings_ms) == {"plan cache"}
    assert _same(first, again)
    assert again.timings_ms is not first.timings_ms  # a hit gets its own timings
    plan_cache.clear()
    assert _same(prepare(cdb, SQL, epsilon=1.0), first)  # what preparing afresh gives


def test_a_catalog_update_invalidates_the_plan(cdb):
    before = prepare(cdb, SQL, epsilon=1.0)
    assert set(prepare(cdb, SQL, epsilon=1.0).timings_ms) == {"plan cache"}
    cdb.catalog.update(T, bounds={"amount": (0, 1000)})
    after = prepare(cdb, SQL, epsilon=1.0)
    assert "plan cache" not in after.timings_ms
    assert after.rewritten.sql != before.rewritten.sql  # the new clipping bounds are in the SQL
    sums = [q for q in after.plan.quantities if q.kind == "sum"]
    old_sums = [q for q in before.plan.quantities if q.kind == "sum"]
    assert sums[0].l1 * sums[0].grid == pytest.approx(10 * old_sums[0].l1 * old_sums[0].grid)
    # a salt rotation changes the secret in the SQL: a new key too
    cdb.catalog.update(T, rotate_salt=True)
    rotated = prepare(cdb, SQL, epsilon=1.0)
    assert "plan cache" not in rotated.timings_ms and rotated.rewritten.sql != after.rewritten.sql


def test_every_release_parameter_is_in_the_key(cdb):
    base = prepare(cdb, SQL, epsilon=1.0)
    variants = [dict(epsilon=2.0), dict(epsilon=1.0, delta=1e-6, mechanism="gaussian"),
                dict(epsilon=1.0, confidence=0.9), dict(epsilon=1.0, max_rows_per_unit=3),
                dict(epsilon=1.0, keys={"country": ["CA"]}), dict(epsilon=1.0, weights={"n": 2.0, "s": 1.0})]
    for kw in variants:
        p = prepare(cdb, SQL, **kw)
        assert "plan cache" not in p.timings_ms, kw
        assert p.rewritten.sql != base.rewritten.sql or p.cost != base.cost or p.plan.options != base.plan.options, kw
    # ε differs from 1.0 in its last bit: a different key, never the plan of 1.0
    p = prepare(cdb, SQL, epsilon=np.nextafter(1.0, 2.0).item())
    assert "plan cache" not in p.timings_ms and p.cost != base.cost


def test_option_values_are_keyed_with_their_types():
    keys = {plan_cache.freeze(v) for v in (1, 1.0, True, "1", (1,), [1])}
    assert len(keys) == 6
    assert plan_cache.freeze({"a": [1, 2]}) == plan_cache.freeze({"a": [1, 2]})
    with pytest.raises(plan_cache.Uncacheable):
        plan_cache.freeze(np.float64(1.0))  # not represented exactly by the key: prepared uncached


def test_another_analyst_never_gets_the_cached_object(cdb):
    mine = prepare(cdb, SQL, epsilon=1.0)
    other = Connection(cdb.backend, analyst="someone_else", data_dir=cdb.data_dir, ledger_path=cdb.ledger_path)
    try:
        theirs = prepare(other, SQL, epsilon=1.0)
        assert "plan cache" not in theirs.timings_ms and theirs.plan is not mine.plan
        assert _same(theirs, mine)  # same query, same catalog: the same plan, made for them
        # the precheck runs on a hit: an analyst without budget is refused before anything else
        assert set(prepare(other, SQL, epsilon=1.0).timings_ms) == {"plan cache"}
        with pytest.raises(BudgetExceeded):
            prepare(other, SQL, epsilon=1.0, precheck=True)
    finally:
        if other._ledger is not None:
            other._ledger.close()


def test_the_tree_is_in_the_key(cdb):
    """The gateway passes its own tree (qualified names): the same text with another tree is another key."""
    short = "SELECT COUNT(*) AS n FROM events"
    a = prepare(cdb, short, epsilon=1.0, tree=parse(f"SELECT COUNT(*) AS n FROM {T}").select)
    b = prepare(cdb, short, epsilon=1.0, tree=parse(f"SELECT COUNT(*) AS n FROM {T} WHERE amount > 5").select)
    assert "plan cache" not in b.timings_ms and a.rewritten.sql != b.rewritten.sql


def test_charged_on_every_call_and_answers_stay_well_formed(cdb):
    def charges():
        return next(b.queries for b in cdb.ledger.budgets() if b.analyst == cdb.analyst and b.dataset == T)

    before = charges()
    outs = [run_query(cdb, SQL, epsilon=0.5) for _ in range(3)]
    assert charges() == before + 3  # the hits (2nd, 3rd) are charged like the first
    for out in outs:
        assert list(out.columns) == ["country", "n", "s"] and sorted(out["country"]) == ["CA", "US"]


def test_a_joined_relation_is_not_cached(cdb):
    pub = f"{DB}.countries"
    cdb.command(f"DROP TABLE IF EXISTS {pub}")
    cdb.command(f"CREATE TABLE {pub} (country String, continent String) ENGINE = MergeTree ORDER BY country")
    cdb.command(f"INSERT INTO {pub} VALUES ('CA', 'America'), ('US', 'America')")
    if pub in cdb.catalog:
        cdb.catalog.drop(pub)
    cdb.catalog.register(pub, public=True)
    sql = f"SELECT COUNT(*) AS n FROM {T} AS e JOIN {pub} AS c ON e.country = c.country"
    prepare(cdb, sql, epsilon=1.0)
    assert "plan cache" not in prepare(cdb, sql, epsilon=1.0).timings_ms
