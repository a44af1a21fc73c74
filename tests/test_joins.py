"""Joins (issue 14): public tables, units reached through references, bounding after the join,
CTEs, subqueries in FROM and IN (SELECT …) over public tables.

Two copies of a small TPC-H-shaped schema: D (database ``tj``) and its neighbour D′ (``tjp``),
which lacks customer 42 together with all its orders and their lineitems (the add_remove
neighbour of the unit customer). Customer 42 is heavy: 40 orders × 30 lineitems with extreme
values, and the only customer of the nation ATLANTIS, so the join fans its rows out far beyond
the per-unit caps."""
from __future__ import annotations

import math

import numpy as np
import pytest

from dpch.controller import prepare
from dpch.errors import CatalogError, InvalidParameter, QueryRejected
from dpch.rewrite import rewrite_for_sensitivity_check

UNIT = 42
DBS = ("tj", "tjp")


def _build(db, name: str, drop_unit: bool) -> None:
    c = db.command
    keep = f"WHERE c_custkey != {UNIT}" if drop_unit else ""
    c(f"DROP DATABASE IF EXISTS {name}")
    c(f"CREATE DATABASE {name}")
    c(f"CREATE TABLE {name}.nation (n_nationkey UInt32, n_name String) ENGINE = MergeTree ORDER BY n_nationkey")
    c(f"INSERT INTO {name}.nation VALUES (0, 'FRANCE'), (1, 'GERMANY'), (2, 'JAPAN'), (3, 'ATLANTIS'), (4, 'EMPTY')")
    c(f"CREATE TABLE {name}.customer (c_custkey UInt64, c_nationkey UInt32, c_acctbal Float64) "
      "ENGINE = MergeTree ORDER BY c_custkey")
    c(f"INSERT INTO {name}.customer SELECT * FROM (SELECT number AS c_custkey, if(number = {UNIT}, 3, number % 3) "
      f"AS c_nationkey, if(number = {UNIT}, 1e9, (number % 100) * 10.0) AS c_acctbal FROM numbers(300)) {keep}")
    c(f"CREATE TABLE {name}.orders (o_orderkey UInt64, o_custkey UInt64, o_totalprice Float64, o_status String) "
      "ENGINE = MergeTree ORDER BY o_orderkey")
    # 4 orders per ordinary customer; customer 42 has 40 (orders 100000..100039)
    c(f"INSERT INTO {name}.orders SELECT * FROM (SELECT number AS o_orderkey, number % 300 AS o_custkey, "
      f"(number % 1000) * 1.0 AS o_totalprice, if(number % 2 = 0, 'F', 'O') AS o_status FROM numbers(1200) "
      f"WHERE o_custkey != {UNIT} UNION ALL SELECT 100000 + number, {UNIT}, 1e12, 'F' FROM numbers(40)) "
      f"{'WHERE o_custkey != 42' if drop_unit else ''}")
    c(f"CREATE TABLE {name}.lineitem (l_orderkey UInt64, l_quantity Float64, l_price Float64) "
      "ENGINE = MergeTree ORDER BY l_orderkey")
    c(f"INSERT INTO {name}.lineitem SELECT o_orderkey, if(o_custkey = {UNIT}, 1e9, 1 + o_orderkey % 50), "
      f"if(o_custkey = {UNIT}, 1e9, o_orderkey % 500) FROM {name}.orders ARRAY JOIN "
      f"range(if(o_custkey = {UNIT}, 30, 3)) AS i")
    cat = db.catalog
    cat.register(f"{name}.nation", public=True)
    cat.register(f"{name}.customer", privacy_unit="c_custkey", bounds={"c_acctbal": (0, 1000)})
    cat.register(f"{name}.orders", references={"o_custkey": f"{name}.customer.c_custkey"},
                 bounds={"o_totalprice": (0, 1000)}, public_keys={"o_status": ["F", "O"]},
                 max_rows_per_unit=8, max_groups_contributed=2)
    cat.register(f"{name}.lineitem", references={"l_orderkey": f"{name}.orders.o_orderkey"},
                 bounds={"l_quantity": (0, 50), "l_price": (0, 500)}, max_rows_per_unit=20, max_groups_contributed=2)
    db.ledger.set_budget(db.analyst, f"{name}.customer", epsilon=1e9, delta=0.5)


@pytest.fixture(scope="module")
def jdb(db):
    for name in DBS:
        _build(db, name, drop_unit=name == "tjp")
    return db


def test_catalog_shows_public_tables_and_references(jdb):
    nation, lineitem = jdb.catalog.get("tj.nation"), jdb.catalog.get("tj.lineitem")
    assert nation.public and nation.to_dict()["public"] is True
    assert lineitem.to_dict()["references"] == {"l_orderkey": "tj.orders.o_orderkey"}
    text = lineitem.describe()
    assert "through references" in text and "references tj.orders.o_orderkey" in text


@pytest.mark.parametrize("kwargs,message", [
    ({"references": {"l_orderkey": "tj.nothere.x"}}, "not in the privacy catalog"),
    ({"references": {"l_orderkey": "tj.orders.o_custkey"}}, "is not a key"),
    ({"references": {"l_orderkey": "tj.orders.o_nothing"}}, "not a registered column"),
    ({"references": {"nothing": "tj.orders.o_orderkey"}}, "not a registered column"),
    ({"references": {"l_orderkey": "tj.orders.o_orderkey"}, "public": True}, "no references"),
    ({"privacy_unit": "l_orderkey", "public": True}, "no privacy unit"),
])
def test_registration_checks_references(jdb, kwargs, message):
    with pytest.raises(CatalogError, match=message):
        jdb.catalog.register("tj.lineitem", **kwargs)
    assert jdb.catalog.get("tj.lineitem").references  # the stored entry is unchanged


def test_chain_must_end_at_a_unit(jdb):
    jdb.command("CREATE TABLE IF NOT EXISTS tj.rowlevel (k UInt64, v Float64) ENGINE = MergeTree ORDER BY k")
    jdb.command("CREATE TABLE IF NOT EXISTS tj.child (k UInt64) ENGINE = MergeTree ORDER BY k")
    jdb.catalog.register("tj.rowlevel")
    with pytest.raises(CatalogError, match="must end at a table with a privacy_unit"):
        jdb.catalog.register("tj.child", references={"k": "tj.rowlevel.k"}, max_rows_per_unit=3)


def _truth(db, sql):
    return db.raw_query(sql)


ANSWERED = [
    # (query, the exact answer on the bounded data is checked against this truth query)
    ("SELECT COUNT(*) AS n FROM tj.lineitem WHERE l_quantity < 1000",
     "SELECT count() AS n FROM tj.lineitem WHERE l_quantity < 1000"),
    ("SELECT n_name, COUNT(*) AS n FROM tj.customer c JOIN tj.orders o ON o.o_custkey = c.c_custkey "
     "JOIN tj.nation n ON c.c_nationkey = n.n_nationkey WHERE o_totalprice < 2000 GROUP BY n_name ORDER BY n_name",
     "SELECT n_name, count() AS n FROM tj.customer c JOIN tj.orders o ON o.o_custkey = c.c_custkey "
     "JOIN tj.nation n ON c.c_nationkey = n.n_nationkey WHERE o_totalprice < 2000 GROUP BY n_name ORDER BY n_name"),
    ("WITH l AS (SELECT l_orderkey, l_quantity * 2 AS q2 FROM tj.lineitem WHERE l_price < 1000) "
     "SELECT o.o_status AS st, SUM(q2) AS s FROM l JOIN tj.orders o ON l.l_orderkey = o.o_orderkey "
     "GROUP BY st ORDER BY st",
     "SELECT o.o_status AS st, sum(l_quantity * 2) AS s FROM tj.lineitem l JOIN tj.orders o "
     "ON l.l_orderkey = o.o_orderkey WHERE l_price < 1000 GROUP BY st ORDER BY st"),
    ("SELECT COUNT(*) AS n FROM tj.customer WHERE c_nationkey IN (SELECT n_nationkey FROM tj.nation "
     "WHERE n_name = 'FRANCE')",
     "SELECT count() AS n FROM tj.customer WHERE c_nationkey = 0"),
    ("SELECT COUNT(*) AS n FROM tj.customer c LEFT JOIN tj.orders o USING (c_custkey) WHERE c_acctbal < 100",
     None),
    # comma joins: WHERE equalities become the join keys
    ("SELECT n_name, COUNT(*) AS n FROM tj.nation n, tj.customer c, tj.orders o WHERE o.o_custkey = c.c_custkey "
     "AND c.c_nationkey = n.n_nationkey AND o_totalprice < 2000 GROUP BY n_name ORDER BY n_name",
     "SELECT n_name, count() AS n FROM tj.customer c JOIN tj.orders o ON o.o_custkey = c.c_custkey "
     "JOIN tj.nation n ON c.c_nationkey = n.n_nationkey WHERE o_totalprice < 2000 GROUP BY n_name ORDER BY n_name"),
    # a LEFT JOIN's ON condition on the joined table filters it before the join
    ("SELECT COUNT(*) AS n FROM tj.customer c LEFT JOIN tj.orders o ON c.c_custkey = o.o_custkey "
     "AND o.o_status = 'F' WHERE c_acctbal < 2000",
     "SELECT count() AS n FROM tj.customer c LEFT JOIN tj.orders o ON c.c_custkey = o.o_custkey "
     "AND o.o_status = 'F' WHERE c_acctbal < 2000"),
    # EXISTS along the reference, and IN over a per-order aggregate (TPC-H Q4 / Q18 shapes)
    ("SELECT o_status AS st, COUNT(*) AS n FROM tj.orders WHERE EXISTS (SELECT * FROM tj.lineitem "
     "WHERE l_orderkey = o_orderkey AND l_quantity > 40) GROUP BY st ORDER BY st",
     "SELECT o_status AS st, count() AS n FROM tj.orders WHERE o_orderkey IN (SELECT l_orderkey FROM tj.lineitem "
     "WHERE l_quantity > 40) GROUP BY st ORDER BY st"),
    ("SELECT o_status AS st, COUNT(*) AS n FROM tj.orders WHERE NOT EXISTS (SELECT * FROM tj.lineitem "
     "WHERE l_orderkey = o_orderkey AND l_quantity > 40) GROUP BY st ORDER BY st",
     "SELECT o_status AS st, count() AS n FROM tj.orders WHERE o_orderkey NOT IN (SELECT l_orderkey FROM "
     "tj.lineitem WHERE l_quantity > 40) GROUP BY st ORDER BY st"),
    ("SELECT COUNT(*) AS n FROM tj.orders WHERE o_orderkey IN (SELECT l_orderkey FROM tj.lineitem "
     "GROUP BY l_orderkey HAVING SUM(l_quantity) > 60)",
     "SELECT count() AS n FROM tj.orders WHERE o_orderkey IN (SELECT l_orderkey FROM tj.lineitem "
     "GROUP BY l_orderkey HAVING sum(l_quantity) > 60)"),
    ("SELECT COUNT(*) AS n FROM tj.orders WHERE o_custkey IN (SELECT c_custkey FROM tj.customer WHERE c_nationkey = 1)",
     "SELECT count() AS n FROM tj.orders WHERE o_custkey IN (SELECT c_custkey FROM tj.customer WHERE c_nationkey = 1)"),
    # per-unit pre-aggregation joined to the unit's table
    ("SELECT n_name, COUNT(*) AS n FROM (SELECT o_custkey, COUNT(*) AS k FROM tj.orders GROUP BY o_custkey "
     "HAVING k > 2) t JOIN tj.customer c ON c.c_custkey = t.o_custkey JOIN tj.nation n "
     "ON n.n_nationkey = c.c_nationkey GROUP BY n_name ORDER BY n_name",
     "SELECT n_name, count() AS n FROM (SELECT o_custkey, count() AS k FROM tj.orders GROUP BY o_custkey "
     "HAVING k > 2) t JOIN tj.customer c ON c.c_custkey = t.o_custkey JOIN tj.nation n "
     "ON n.n_nationkey = c.c_nationkey GROUP BY n_name ORDER BY n_name"),
]


@pytest.mark.parametrize("sql,truth", ANSWERED, ids=[a[0][:50] for a in ANSWERED])
def test_join_queries_answer_close_to_the_truth(jdb, sql, truth):
    if truth is None:  # USING a column the right side does not have: refused before anything runs
        with pytest.raises(QueryRejected, match="USING"):
            jdb.query(sql, epsilon=1.0)
        return
    df = jdb.query(sql, epsilon=1e4, with_ci=True, confidence=1 - 1e-9)
    exact = _truth(jdb, truth.replace("tj.", "tjp."))  # D′: no heavy unit, so bounding removes nothing
    keys = [c for c in ("n_name", "st") if c in df.columns]
    value = [c for c in df.columns if c not in keys and not c.endswith(("_lo", "_hi"))][0]
    truth_of = {tuple(r[k] for k in keys): float(r[value]) for _, r in exact.iterrows()}
    assert set(truth_of) <= {tuple(r[k] for k in keys) for _, r in df.iterrows()}
    for _, r in df.iterrows():
        # D has the heavy unit too: at most its bounded contribution (M = 20 rows of at most 100)
        true = truth_of.get(tuple(r[k] for k in keys), 0.0)
        assert r[f"{value}_lo"] - 20 * 100 <= true <= r[f"{value}_hi"], (sql, dict(r), true)


def test_per_unit_histogram_tpch_q13_shape(jdb):
    """TPC-H Q13: a per-customer count (LEFT JOIN with an ON filter), then the number of customers
    per count. Each customer is one row of the subquery, so the outer bounds are k = M = 1."""
    sql = ("SELECT c_count, COUNT(*) AS custdist FROM (SELECT c_custkey, COUNT(o_orderkey) AS c_count "
           "FROM tj.customer LEFT OUTER JOIN tj.orders ON c_custkey = o_custkey AND o_status = 'F' "
           "GROUP BY c_custkey) AS c_orders GROUP BY c_count ORDER BY custdist DESC, c_count DESC")
    plan = prepare(jdb, sql, epsilon=1.0, delta=1e-6).plan
    assert (plan.bounding.k, plan.bounding.max_rows) == (1, 1)
    df = jdb.query(sql, epsilon=50.0, delta=1e-6)
    exact = _truth(jdb, sql.replace("COUNT(*)", "count()") + " SETTINGS join_use_nulls = 1")  # SQL's LEFT JOIN
    # a customer without an 'F' order counts 0 (a LEFT JOIN miss is NULL, join_use_nulls = 1; it was
    # 1 when the miss was the default 0); the heavy customer's group (40 orders, 1 customer) is not released
    assert list(df["c_count"]) == [0, 4]
    truth = dict(zip(exact["c_count"], exact["custdist"]))
    for _, r in df.iterrows():
        # Laplace scale 2/50 per count (ε split between selection and the count): |noise| < 1
        # with probability 1 - e^-25 per group
        assert abs(r["custdist"] - truth[r["c_count"]]) < 1


def test_public_domain_releases_every_public_key(jdb):
    df = jdb.query("SELECT n_name, COUNT(*) AS n FROM tj.customer c JOIN tj.nation n "
                   "ON c.c_nationkey = n.n_nationkey GROUP BY n_name", epsilon=1.0)
    assert sorted(df["n_name"]) == ["ATLANTIS", "EMPTY", "FRANCE", "GERMANY", "JAPAN"]
    assert df.attrs["dpch"]["key_mode"] == "public"


@pytest.mark.parametrize("sql,message", [
    ("SELECT COUNT(*) FROM tj.nation", "only public tables"),
    ("SELECT COUNT(*) FROM tj.orders o JOIN tj.customer c ON o.o_totalprice = c.c_acctbal", "along declared references"),
    ("SELECT COUNT(*) FROM tj.lineitem l JOIN tj.customer c ON l.l_orderkey = c.c_custkey", "along declared references"),
    ("SELECT COUNT(*) FROM tj.orders a JOIN tj.orders b ON a.o_orderkey = b.o_orderkey", "self-joins"),
    ("SELECT COUNT(*) FROM tj.orders CROSS JOIN tj.nation", "cross joins are not supported"),
    ("SELECT COUNT(*) FROM tj.orders, tj.nation", "cross joins are not supported"),
    ("SELECT COUNT(*) FROM tj.orders, tj.nation WHERE o_custkey > n_nationkey", "cross joins are not supported"),
    ("SELECT COUNT(*) FROM tj.orders, tj.nation WHERE o_custkey = n_nationkey OR o_status = 'F'",
     "cross joins are not supported"),
    ("SELECT COUNT(*) FROM tj.lineitem, tj.customer WHERE l_orderkey = c_custkey", "along declared references"),
    ("SELECT COUNT(*) FROM tj.orders o RIGHT JOIN tj.customer c ON o.o_custkey = c.c_custkey", "RIGHT JOIN"),
    ("SELECT COUNT(*) FROM tj.orders o FULL JOIN tj.customer c ON o.o_custkey = c.c_custkey", "FULL"),
    ("SELECT COUNT(*) FROM tj.nation n LEFT JOIN tj.customer c ON c.c_nationkey = n.n_nationkey", "LEFT JOIN"),
    ("SELECT COUNT(*) FROM tj.orders o JOIN tj.nation n ON o.o_totalprice > n.n_nationkey", "at least one equality"),
    ("SELECT COUNT(*) FROM tj.orders o JOIN tj.nation n ON o.o_custkey + 1 = n.n_nationkey", "at least one equality"),
    ("SELECT COUNT(*) FROM tj.customer c LEFT JOIN tj.orders o ON c.c_custkey = o.o_custkey AND c.c_acctbal > 1",
     "may read only o's columns"),
    ("SELECT COUNT(*) FROM tj.customer c LEFT JOIN tj.orders o ON c.c_custkey = o.o_custkey AND "
     "throwIf(o.o_totalprice > 5) = 0", "throwif is not on the list"),
    ("SELECT COUNT(*) FROM tj.customer WHERE c_acctbal IN (SELECT o_totalprice FROM tj.orders)",
     "follow the declared reference"),
    ("SELECT COUNT(*) FROM tj.nation WHERE n_nationkey IN (SELECT c_nationkey FROM tj.customer)",
     "only public tables"),
    ("SELECT COUNT(*) FROM tj.customer c JOIN tj.nation n ON c.c_nationkey = n.n_nationkey WHERE n_nationkey IN "
     "(SELECT c_nationkey FROM tj.customer)", "follow the declared reference"),
    ("SELECT COUNT(*) FROM tj.orders WHERE EXISTS (SELECT * FROM tj.lineitem WHERE l_quantity > 10)",
     "correlated with the outer query by exactly one equality"),
    ("SELECT COUNT(*) FROM tj.orders WHERE EXISTS (SELECT * FROM tj.lineitem WHERE l_orderkey = o_orderkey "
     "AND l_price > o_totalprice)", "only in one equality"),
    ("SELECT COUNT(*) FROM tj.orders WHERE EXISTS (SELECT * FROM tj.lineitem WHERE l_price = o_totalprice)",
     "follow the declared reference"),
    ("SELECT COUNT(*) FROM tj.orders WHERE o_orderkey IN (SELECT l_orderkey FROM tj.lineitem "
     "WHERE throwIf(l_quantity > 10) = 0)", "throwif is not on the list"),
    ("SELECT COUNT(*) FROM tj.orders WHERE o_orderkey IN (SELECT l_orderkey FROM tj.lineitem GROUP BY l_price)",
     "may GROUP BY only its selected column"),
    ("SELECT COUNT(*) FROM tj.orders WHERE o_orderkey IN (SELECT l_orderkey FROM tj.lineitem GROUP BY l_orderkey "
     "HAVING l_price > 3)", "only inside COUNT/SUM"),
    ("SELECT COUNT(*) FROM tj.orders WHERE o_orderkey IN (SELECT l_orderkey FROM tj.lineitem GROUP BY l_orderkey "
     "HAVING sum(sum(l_price)) > 3)", "nested aggregates"),
    ("SELECT COUNT(*) FROM tj.orders WHERE o_orderkey IN (SELECT l_orderkey FROM tj.lineitem l JOIN tj.orders o2 "
     "ON l.l_orderkey = o2.o_orderkey)", "JOINS is not supported"),
    ("SELECT COUNT(*) FROM tj.orders WHERE o_orderkey IN (SELECT l_orderkey FROM tjp.lineitem)",
     "same privacy unit"),
    ("SELECT COUNT(*) FROM tj.orders WHERE o_orderkey IN (SELECT l_orderkey FROM tj.lineitem LIMIT 3)",
     "LIMIT is not supported"),
    ("SELECT COUNT(*) FROM tj.customer c WHERE c_nationkey IN (SELECT n_nationkey FROM tj.nation n "
     "WHERE n.n_nationkey = c.c_custkey)", "correlated"),
    ("SELECT COUNT(*) FROM (SELECT o_status, COUNT(*) AS k FROM tj.orders GROUP BY o_status) AS x",
     "GROUP BY a column that determines the privacy unit"),
    ("SELECT COUNT(*) FROM (SELECT COUNT(*) AS k FROM tj.orders) AS x", "must GROUP BY columns"),
    ("SELECT COUNT(*) FROM (SELECT o_custkey, o_status, COUNT(*) AS k FROM tj.orders GROUP BY o_custkey) AS x",
     "each column must be a GROUP BY column"),
    ("SELECT COUNT(*) FROM (SELECT o_custkey, COUNT(DISTINCT o_status) AS k FROM tj.orders GROUP BY o_custkey) x",
     "COUNT\\(DISTINCT"),
    ("SELECT COUNT(*) FROM (SELECT o_custkey, SUM(throwIf(o_totalprice > 1)) AS k FROM tj.orders "
     "GROUP BY o_custkey) x", "throwif is not on the list"),
    ("SELECT SUM(k) FROM (SELECT o_custkey, COUNT(*) AS k FROM tj.orders GROUP BY o_custkey) x",
     "cannot bound|no bounds|bounds"),
    ("SELECT COUNT(*) FROM (SELECT o_custkey, COUNT(*) AS k FROM tj.orders GROUP BY o_custkey ORDER BY k LIMIT 5) x",
     "not supported there"),
    ("SELECT COUNT(*) FROM tj.customer c LEFT JOIN (SELECT o_custkey FROM tj.orders) AS o "
     "ON o.o_custkey = c.c_custkey", "right of a LEFT JOIN"),
    ("SELECT COUNT(*) FROM tj.orders o JOIN tjp.customer c ON o.o_custkey = c.c_custkey", "different privacy units"),
    ("SELECT COUNT(*) FROM tj.orders o JOIN tj.nation n ON n_nationkey = o_custkey JOIN tj.nation n ON 1 = 1",
     "used twice"),
    ("SELECT COUNT(*) FROM tj.orders o JOIN tj.nation n ON n_nationkey = o_custkey JOIN tj.nation m ON 1 = 1",
     "at least one equality"),
    ("SELECT COUNT(*) FROM tj.orders JOIN tj.nation ON n_nationkey = o_custkey WHERE "
     "o_status IN (SELECT * FROM numbers(3))", "table functions"),
])
def test_refused_join_shapes_charge_nothing(jdb, sql, message):
    before = len(jdb.ledger.history(jdb.analyst, "tj.customer"))
    with pytest.raises(QueryRejected, match=message):
        jdb.query(sql, epsilon=1.0)
    assert len(jdb.ledger.history(jdb.analyst, "tj.customer")) == before


SENSITIVITY = [
    "SELECT COUNT(*) AS n, SUM(l_quantity) AS q FROM tj.lineitem",
    "SELECT n_name, COUNT(*) AS n, SUM(o_totalprice) AS s FROM tj.customer c JOIN tj.orders o "
    "ON o.o_custkey = c.c_custkey JOIN tj.nation n ON c.c_nationkey = n.n_nationkey GROUP BY n_name",
    "SELECT o_status, SUM(l_price) AS s FROM tj.lineitem l JOIN tj.orders o ON l.l_orderkey = o.o_orderkey "
    "GROUP BY o_status",
    "SELECT n_name, AVG(l_quantity) AS a FROM tj.lineitem l JOIN tj.orders o ON l.l_orderkey = o.o_orderkey "
    "JOIN tj.customer c ON o.o_custkey = c.c_custkey JOIN tj.nation n ON n.n_nationkey = c.c_nationkey GROUP BY n_name",
    "SELECT n_name, COUNT(*) AS n, SUM(l_price) AS s FROM tj.lineitem, tj.orders, tj.customer, tj.nation "
    "WHERE l_orderkey = o_orderkey AND o_custkey = c_custkey AND n_nationkey = c_nationkey GROUP BY n_name",
    "SELECT COUNT(*) AS n, SUM(o_totalprice) AS s FROM tj.customer c LEFT JOIN tj.orders o "
    "ON c.c_custkey = o.o_custkey AND o.o_status = 'F'",
    "SELECT o_status, COUNT(*) AS n, SUM(o_totalprice) AS s FROM tj.orders WHERE EXISTS (SELECT * FROM tj.lineitem "
    "WHERE l_orderkey = o_orderkey AND l_quantity > 40) GROUP BY o_status",
    "SELECT o_status, COUNT(*) AS n FROM tj.orders WHERE NOT EXISTS (SELECT * FROM tj.lineitem "
    "WHERE l_orderkey = o_orderkey AND l_quantity < 40) GROUP BY o_status",
    "SELECT COUNT(*) AS n, SUM(o_totalprice) AS s FROM tj.orders WHERE o_orderkey IN "
    "(SELECT l_orderkey FROM tj.lineitem GROUP BY l_orderkey HAVING SUM(l_quantity) > 60)",
    "SELECT c_count, COUNT(*) AS n FROM (SELECT c_custkey, COUNT(o_orderkey) AS c_count FROM tj.customer "
    "LEFT JOIN tj.orders ON c_custkey = o_custkey AND o_status = 'F' GROUP BY c_custkey) t GROUP BY c_count",
    "SELECT n_name, COUNT(*) AS n FROM (SELECT o_custkey, COUNT(*) AS k FROM tj.orders GROUP BY o_custkey) t "
    "JOIN tj.customer c ON c.c_custkey = t.o_custkey JOIN tj.nation n ON n.n_nationkey = c.c_nationkey GROUP BY n_name",
]


@pytest.mark.parametrize("sql", SENSITIVITY, ids=[s[:60] for s in SENSITIVITY])
def test_bounding_after_the_join_keeps_the_declared_sensitivity(jdb, sql):
    """The un-noised quantities of the rewritten query (bounding on, noise off) on D and on D′ differ
    by at most the plan's L1/L2 sensitivities, although unit 42 fans out to 1 200 joined rows."""
    delta = 1e-6 if "GROUP BY" in sql else 0.0
    prepared = prepare(jdb, sql, epsilon=1.0, delta=delta)
    plan = prepared.plan
    rw = rewrite_for_sensitivity_check(plan)
    results = []
    for name in DBS:  # the same plan (same salt, same bounds) on D and on D′
        df = jdb.raw_query(rw.sql.replace("`tj`.", f"`{name}`."))
        keys = [o.name for o in plan.bound.outputs if o.kind == "key"]
        results.append({tuple(str(df[k].iloc[i]) for k in keys):
                        np.array([int(df[c].iloc[i]) for c in rw.internal_columns], dtype=np.int64)
                        for i in range(len(df))})
    base, other = results
    zero = np.zeros(len(plan.quantities), dtype=np.int64)
    diffs = np.array([base.get(k, zero) - other.get(k, zero) for k in set(base) | set(other)], dtype=float)
    moved = 0.0
    for q in plan.quantities:
        col = diffs[:, q.index]
        assert float(np.abs(col).sum()) <= q.l1 + 1e-9, (q.label, np.abs(col).sum(), q.l1)
        assert math.sqrt(float((col ** 2).sum())) <= q.l2 + 1e-9
        moved = max(moved, float(np.abs(col).sum()) / q.l1)
    assert moved > 0.5  # the heavy unit uses most of its allowance: the check is not vacuous


def test_explain_lists_the_tables_and_how_each_reaches_the_unit(jdb):
    ex = jdb.explain("SELECT n_name, COUNT(*) AS n FROM tj.lineitem, tj.orders, tj.customer, tj.nation "
                     "WHERE l_orderkey = o_orderkey AND o_custkey = c_custkey AND n_nationkey = c_nationkey "
                     "AND o_orderkey IN (SELECT l_orderkey FROM tj.lineitem GROUP BY l_orderkey "
                     "HAVING SUM(l_quantity) > 3) GROUP BY n_name", epsilon=1.0)
    assert ex.privacy_unit == "tj.customer.c_custkey"
    assert ex.relation[:4] == [
        "lineitem: FROM tj.lineitem, unit through l_orderkey = tj.orders.o_orderkey → o_custkey",
        "orders: INNER JOIN tj.orders, unit column o_custkey",
        "customer: INNER JOIN tj.customer, unit column c_custkey",
        "nation: INNER JOIN tj.nation, public"]
    # (key, unit) pairs: the semi-join filters a row by its own unit's lineitems only
    assert ex.relation[4].startswith("semi-join: (isNotNull(`orders`.`o_orderkey`) AND (`orders`.`o_orderkey`, "
                                     "`orders`.`o_custkey`) IN (SELECT __dp_s.`l_orderkey`, __dp_sh0.`o_custkey`")
    text = str(ex)
    assert "joined relation (bounded per unit after the join; charged to tj.customer):" in text
    assert ex.to_dict()["relation"] == ex.relation


def test_count_distinct_of_a_column_that_holds_the_unit(jdb):
    """In a join, c_custkey and o_custkey equal the unit on every row: COUNT(DISTINCT) of either is
    the distinct-unit count (sensitivity k), and GROUP BY either is refused like GROUP BY the unit."""
    sql = ("SELECT n_name, COUNT(DISTINCT c_custkey) AS a, COUNT(DISTINCT o_custkey) AS b FROM tj.customer, "
           "tj.orders, tj.nation WHERE c_custkey = o_custkey AND c_nationkey = n_nationkey GROUP BY n_name")
    plan = prepare(jdb, sql, epsilon=1.0).plan
    assert [a.func for a in plan.bound.aggregates] == ["count_distinct_unit"]  # both are one aggregate
    assert len(plan.quantities) == 1  # one noisy quantity serves both
    with pytest.raises(QueryRejected, match=r"grouping by the privacy unit \(c_custkey\)"):
        jdb.query("SELECT c_custkey, COUNT(*) FROM tj.customer, tj.orders WHERE c_custkey = o_custkey "
                  "GROUP BY c_custkey", epsilon=1.0, delta=1e-6)
    # o_custkey is NULL-or-default for a customer without orders: not the unit on every row, so it
    # is a distinct count of values (bounded by the rows each unit keeps), not of units
    plan = prepare(jdb, "SELECT COUNT(DISTINCT o_custkey) FROM tj.customer c LEFT JOIN tj.orders o "
                        "ON c.c_custkey = o.o_custkey", epsilon=1.0).plan
    assert [a.func for a in plan.bound.aggregates] == ["count_distinct"]


def test_contribution_bounds_given_with_the_query(jdb):
    """k, M, C given with one query replace the catalog's for that query only; the rewrite enforces
    them (the heavy unit's un-noised contribution moves by at most the new sensitivity, and by
    more than half of it), and bad values are refused before anything runs."""
    sql = ("SELECT o_status, COUNT(*) AS n, SUM(l_price) AS s FROM tj.lineitem l JOIN tj.orders o "
           "ON l.l_orderkey = o.o_orderkey GROUP BY o_status")
    plan = prepare(jdb, sql, epsilon=1.0, max_groups_contributed=1, max_rows_per_unit=3).plan
    assert (plan.bounding.k, plan.bounding.max_rows) == (1, 3)
    assert prepare(jdb, sql, epsilon=1.0).plan.bounding.max_rows == 20  # the catalog's, unchanged
    count = next(q for q in plan.quantities if q.kind == "rows")
    assert count.l1 == 3
    rw = rewrite_for_sensitivity_check(plan)
    per_db = [jdb.raw_query(rw.sql.replace("`tj`.", f"`{name}`.")) for name in DBS]
    totals = [int(df[rw.internal_columns[count.index]].sum()) for df in per_db]
    assert 1.5 < totals[0] - totals[1] <= 3  # unit 42 (1 200 joined rows) adds at most M = 3 rows
    for bad in (0, -1, 1.5, True, "3"):
        with pytest.raises(InvalidParameter, match="max_rows_per_unit must be an integer"):
            jdb.query(sql, epsilon=1.0, max_rows_per_unit=bad)
