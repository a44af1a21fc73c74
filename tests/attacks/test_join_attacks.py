"""Attack cases for joins (issue 14), on D and D′ (customer 42 removed with its orders and their
lineitems; see tests/test_joins.py for the schema: customer 42 is heavy, has extreme values and is
the only customer of the nation ATLANTIS), through db.query and through the gateway's rendering
path (controller.run_query_formatted). As in test_attacks.py, a case passes iff the query is
rejected before charging on both, with the same message, or answered on both with the same
columns, row count and (public) keys, and charged on both. No message may quote unit 42's values."""
from __future__ import annotations

import json

import pytest

from dpch.controller import run_query_formatted
from dpch.errors import DPCHError, QueryRejected
from test_joins import _build

NAMES = ("aj", "ajp")  # D, D′


@pytest.fixture(scope="module")
def ajdb(db):
    for name in NAMES:
        _build(db, name, drop_unit=name == "ajp")
        db.command(f"CREATE TABLE {name}.target (k UInt64, label String) ENGINE = MergeTree ORDER BY k")
        db.command(f"INSERT INTO {name}.target VALUES (42, 'the one')")
        db.catalog.register(f"{name}.target", public=True)
    return db


def _charges(db, name):
    return len(db.ledger.history(db.analyst, f"{name}.customer"))


def _outcome(db, sql: str, name: str, delta: float):
    before = _charges(db, name)
    try:
        df = db.query(sql.replace("{d}", name), epsilon=1.0, delta=delta)
    except QueryRejected as exc:
        assert _charges(db, name) == before, "a rejected query was charged"
        return ("rejected", str(exc).replace(name + ".", "{d}."))
    except DPCHError as exc:  # accepted, charged, then failed: a defect either way
        return ("failed", type(exc).__name__)
    assert _charges(db, name) == before + 1
    public = df.attrs["dpch"]["key_mode"] == "public"
    # a top-n query releases a random choice of public keys, by peeling or by sorting noisy values
    # (their number is fixed)
    peeling = df.attrs["dpch"].get("top_k") is not None
    keys = [c for c, info in df.attrs["dpch"]["columns"].items() if info["kind"] == "key"]
    return ("answered", tuple(df.columns), len(df) if public or not keys else None,
            tuple(sorted(map(tuple, df[keys].astype(str).values.tolist()))) if public and keys and not peeling
            else None)


CASES = [
    # singling out unit 42 through a public table
    ("SELECT COUNT(*) AS n FROM {d}.customer c JOIN {d}.target t ON c.c_custkey = t.k", 0.0),
    ("SELECT t.label AS label, SUM(o_totalprice) AS s FROM {d}.orders o JOIN {d}.target t ON o.o_custkey = t.k "
     "GROUP BY label", 0.0),
    ("SELECT COUNT(*) AS n FROM {d}.lineitem WHERE l_orderkey IN (SELECT k + 99958 FROM {d}.target)", 0.0),
    ("SELECT COUNT(*) AS n FROM {d}.customer WHERE c_custkey IN (SELECT k FROM {d}.target)", 0.0),
    # the nation only unit 42 lives in: its key is public, released on both
    ("SELECT n_name, COUNT(*) AS n, SUM(l_quantity) AS q FROM {d}.lineitem l JOIN {d}.orders o "
     "ON l.l_orderkey = o.o_orderkey JOIN {d}.customer c ON o.o_custkey = c.c_custkey JOIN {d}.nation n "
     "ON c.c_nationkey = n.n_nationkey GROUP BY n_name", 0.0),
    ("SELECT n_name, COUNT(*) AS n FROM {d}.customer c LEFT JOIN {d}.nation n ON c.c_nationkey = n.n_nationkey "
     "GROUP BY n_name", 0.0),
    # private keys of the heavy unit's orders (selection is random: only success and columns compared)
    ("SELECT o_orderkey, COUNT(*) AS n FROM {d}.lineitem l JOIN {d}.orders o ON l.l_orderkey = o.o_orderkey "
     "GROUP BY o_orderkey", 1e-6),
    # extreme values of unit 42 through a CTE, casts and division (total functions)
    ("WITH x AS (SELECT l_orderkey, toUInt8(l_quantity) AS q, intDiv(l_price, l_quantity + 1) AS r "
     "FROM {d}.lineitem) SELECT SUM(q) AS s, SUM(r) AS r FROM x", 0.0),
    ("SELECT COUNT(*) AS n FROM (SELECT o_orderkey, o_totalprice * 1e300 AS big FROM {d}.orders) AS o "
     "WHERE big > 1", 0.0),
    ("SELECT COUNT(*) AS n FROM {d}.customer c LEFT JOIN {d}.orders o ON o.o_custkey = c.c_custkey "
     "WHERE o.o_totalprice > 1e11", 0.0),
    # refused shapes: identical refusal on D and D′
    ("SELECT COUNT(*) FROM {d}.orders o JOIN {d}.customer c ON o.o_totalprice = c.c_acctbal", 0.0),
    ("SELECT COUNT(*) FROM {d}.orders a JOIN {d}.orders b ON a.o_custkey = b.o_custkey", 0.0),
    ("SELECT COUNT(*) FROM {d}.lineitem l JOIN {d}.customer c ON l.l_orderkey = c.c_custkey", 0.0),
    ("SELECT COUNT(*) FROM {d}.target t LEFT JOIN {d}.customer c ON c.c_custkey = t.k", 0.0),
    ("SELECT COUNT(*) FROM {d}.customer WHERE c_custkey IN (SELECT o_custkey FROM {d}.orders "
     "WHERE o_totalprice > 1e11)", 0.0),
    ("SELECT COUNT(*) FROM (SELECT o_custkey FROM {d}.orders GROUP BY o_custkey HAVING count() > 30) AS x", 0.0),
    ("SELECT COUNT(*) FROM {d}.customer c WHERE EXISTS (SELECT 1 FROM {d}.orders o WHERE o.o_custkey = 42)", 0.0),
    ("SELECT COUNT(*) FROM {d}.orders o CROSS JOIN {d}.target t", 0.0),
    ("SELECT COUNT(*) FROM {d}.orders o JOIN {d}.target t ON o.o_custkey = t.k OR 1 = 1", 0.0),
    # comma joins, semi-joins along references and per-unit subqueries aimed at unit 42
    ("SELECT COUNT(*) AS n FROM {d}.customer, {d}.target WHERE c_custkey = k", 0.0),
    ("SELECT COUNT(*) AS n FROM {d}.orders, {d}.target, {d}.customer WHERE o_custkey = k AND c_custkey = o_custkey",
     0.0),
    ("SELECT COUNT(*) FROM {d}.orders, {d}.target WHERE o_custkey = 42", 0.0),
    ("SELECT COUNT(*) AS n FROM {d}.orders WHERE EXISTS (SELECT * FROM {d}.lineitem WHERE l_orderkey = o_orderkey "
     "AND l_quantity > 1e8)", 0.0),
    ("SELECT COUNT(*) AS n FROM {d}.customer WHERE NOT EXISTS (SELECT * FROM {d}.orders WHERE o_custkey = c_custkey "
     "AND o_totalprice < 1e11)", 0.0),
    ("SELECT COUNT(*) AS n FROM {d}.orders WHERE o_orderkey NOT IN (SELECT l_orderkey FROM {d}.lineitem "
     "WHERE l_quantity > 1e8)", 0.0),
    ("SELECT COUNT(*) AS n FROM {d}.orders WHERE o_orderkey IN (SELECT l_orderkey FROM {d}.lineitem "
     "GROUP BY l_orderkey HAVING max(l_price) > 1e8)", 0.0),
    ("SELECT COUNT(*) AS n FROM {d}.customer WHERE c_custkey IN (SELECT o_custkey FROM {d}.orders "
     "WHERE o_totalprice > 1e11)", 0.0),
    ("SELECT COUNT(*) AS n FROM {d}.customer WHERE EXISTS (SELECT * FROM {d}.target WHERE k = c_custkey)", 0.0),
    ("SELECT c_count, COUNT(*) AS n FROM (SELECT c_custkey, COUNT(o_orderkey) AS c_count FROM {d}.customer "
     "LEFT JOIN {d}.orders ON c_custkey = o_custkey GROUP BY c_custkey) t GROUP BY c_count", 1e-6),
    ("SELECT COUNT(*) AS n FROM (SELECT o_custkey, SUM(o_totalprice) AS t FROM {d}.orders GROUP BY o_custkey "
     "HAVING t > 1e12) x", 0.0),
    ("SELECT n_name, COUNT(*) AS n FROM (SELECT o_custkey, MAX(o_totalprice) AS m FROM {d}.orders "
     "GROUP BY o_custkey) x JOIN {d}.customer c ON c.c_custkey = x.o_custkey JOIN {d}.nation n "
     "ON n.n_nationkey = c.c_nationkey WHERE m > 1e11 GROUP BY n_name", 0.0),
    # run-time errors planted in the new row-level positions (made total, or refused on both)
    ("SELECT COUNT(*) AS n FROM {d}.customer c LEFT JOIN {d}.orders o ON c.c_custkey = o.o_custkey "
     "AND intDiv(1, toInt64(o.o_totalprice) - 1000000000000) = 0", 0.0),
    ("SELECT COUNT(*) AS n FROM (SELECT o_custkey, SUM(intDiv(1, toInt64(o_totalprice) - 1000000000000)) AS t "
     "FROM {d}.orders GROUP BY o_custkey) x", 0.0),
    ("SELECT COUNT(*) AS n FROM {d}.orders WHERE o_orderkey IN (SELECT l_orderkey FROM {d}.lineitem "
     "WHERE toUInt8(l_quantity) = 0)", 0.0),
    ("SELECT COUNT(*) AS n FROM {d}.orders WHERE o_orderkey IN (SELECT l_orderkey FROM {d}.lineitem "
     "GROUP BY l_orderkey HAVING sum(l_quantity) / (count() - 30) > 1)", 0.0),
    ("SELECT COUNT(*) AS n FROM {d}.orders WHERE o_orderkey IN (SELECT l_orderkey FROM {d}.lineitem "
     "WHERE throwIf(l_quantity > 1e8) = 0)", 0.0),
    ("SELECT COUNT(*) AS n FROM {d}.customer c LEFT JOIN {d}.orders o ON c.c_custkey = o.o_custkey "
     "AND sleepEachRow(o.o_totalprice > 1e11) = 0", 0.0),
    # refused: semi-joins off the unit, uncorrelated EXISTS, per-unit subquery not grouped by the unit
    ("SELECT COUNT(*) AS n FROM {d}.customer WHERE c_acctbal IN (SELECT o_totalprice FROM {d}.orders)", 0.0),
    ("SELECT COUNT(*) AS n FROM {d}.nation WHERE n_nationkey IN (SELECT c_nationkey FROM {d}.customer)", 0.0),
    ("SELECT COUNT(*) AS n FROM {d}.customer WHERE EXISTS (SELECT * FROM {d}.orders WHERE o_totalprice > 1e11)", 0.0),
    ("SELECT COUNT(*) AS n FROM (SELECT o_status, MAX(o_totalprice) AS m FROM {d}.orders GROUP BY o_status) x "
     "WHERE m > 1e11", 0.0),
    # quantiles (issue 15): unit 42's extreme values and its own nation, through the exponential mechanism
    ("SELECT median(o_totalprice) AS m, MAX(o_totalprice) AS hi, MIN(o_totalprice) AS lo FROM {d}.orders", 0.0),
    ("SELECT n_name, MAX(c_acctbal) AS hi, quantile(0.99)(c_acctbal) AS p99 FROM {d}.customer c JOIN {d}.nation n "
     "ON c.c_nationkey = n.n_nationkey GROUP BY n_name", 0.0),
    ("SELECT quantiles(0.01, 0.5, 0.99)(l_quantity) AS qs FROM {d}.lineitem l JOIN {d}.orders o "
     "ON l.l_orderkey = o.o_orderkey", 0.0),
    ("SELECT median(intDiv(l_price, l_quantity - 1e8)) AS m FROM {d}.lineitem", 0.0),
    ("SELECT o_orderkey, MAX(l_price) AS m FROM {d}.lineitem l JOIN {d}.orders o ON l.l_orderkey = o.o_orderkey "
     "GROUP BY o_orderkey", 1e-6),
    ("SELECT COUNT(*) AS n FROM {d}.orders HAVING median(o_totalprice) > 1e11", 0.0),
    ("SELECT quantile(c_acctbal)(c_acctbal) AS q FROM {d}.customer", 0.0),
    ("SELECT quantileExact(0.5)(c_acctbal) AS q FROM {d}.customer", 0.0),
    # top-n (issue 15): unit 42's own nation among the candidates, its huge quantities in the score
    ("SELECT n_name, COUNT(*) AS n FROM {d}.customer c JOIN {d}.nation n ON c.c_nationkey = n.n_nationkey "
     "GROUP BY n_name ORDER BY n DESC LIMIT 1", 0.0),
    ("SELECT n_name FROM {d}.lineitem l JOIN {d}.orders o ON l.l_orderkey = o.o_orderkey JOIN {d}.customer c "
     "ON o.o_custkey = c.c_custkey JOIN {d}.nation n ON c.c_nationkey = n.n_nationkey "
     "GROUP BY n_name ORDER BY SUM(l_quantity) DESC LIMIT 2", 0.0),
    ("SELECT o_orderkey, COUNT(*) AS n FROM {d}.lineitem l JOIN {d}.orders o ON l.l_orderkey = o.o_orderkey "
     "GROUP BY o_orderkey ORDER BY n DESC LIMIT 3", 1e-6),
]


@pytest.mark.parametrize("sql,delta", CASES, ids=[c[0][:70] for c in CASES])
def test_join_attack_same_outcome_on_neighbours(ajdb, sql, delta):
    d, dprime = (_outcome(ajdb, sql, name, delta) for name in NAMES)
    assert d[0] != "failed" and dprime[0] != "failed", (d, dprime)
    assert d == dprime, (d, dprime)
    if d[0] == "rejected":
        low = d[1].lower()
        assert not any(s in low for s in ("1e9", "1000000000", "1e12", "the one")), d[1]


def _formatted_outcome(db, sql: str, name: str, delta: float):
    """The gateway's path (the engine renders the answer): rejected before charging, or answered."""
    before = _charges(db, name)
    try:
        out = run_query_formatted(db, sql.replace("{d}", name), "JSONCompact", epsilon=1.0, delta=delta)
    except QueryRejected as exc:
        assert _charges(db, name) == before, "a rejected query was charged"
        return ("rejected", str(exc).replace(name + ".", "{d}."))
    except DPCHError as exc:
        return ("failed", type(exc).__name__)
    assert _charges(db, name) == before + 1
    doc = json.loads(out.body)
    assert doc["rows"] == out.rows
    # rows compared only without private partition selection (its released keys are random)
    return ("answered", tuple(m["name"] for m in doc["meta"]), out.rows if delta == 0 else None)


@pytest.mark.parametrize("sql,delta", CASES, ids=[c[0][:70] for c in CASES])
def test_join_attack_same_outcome_through_the_rendering_path(ajdb, sql, delta):
    d, dprime = (_formatted_outcome(ajdb, sql, name, delta) for name in NAMES)
    assert d[0] != "failed" and dprime[0] != "failed", (d, dprime)
    assert d == dprime, (d, dprime)
