"""Generated data and join queries (hypothesis): where bounding and clipping change nothing, DPCH's
noise-off answer over a join is ClickHouse's own answer (tests/test_answers_exact.py does the same
for one table).

Schema: ``customer`` (the unit ``c_custkey``, a segment with a public domain, a nullable balance)
and ``orders`` (``o_custkey`` references the customer; a status with a public domain, a nullable
price). Drawn so that nothing binds: at most 3 orders a customer (M = 10 rows, k = 2 groups
allowed), values inside their bounds, some orders' customers missing (orphans: an INNER join drops
them; a LEFT join from orders keeps them with NULL customer columns, and their unit is the one
their own reference names, docs/CONTROLLER.md "Unit agreement"), some customers without orders (a
LEFT join from customer keeps them with NULL order columns).

Compared per released group as in test_answers_exact: counts exactly, sums within 0.05, averages
within 1e-3 (integer-valued data: the fixed-point grid is exact on them)."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpch.controller import prepare
from dpch.rewrite import rewrite_for_sensitivity_check
from test_answers_exact import assert_same_answers, sql_literal

DB = "t_exact_joins"
SEGMENTS, STATUSES = ["auto", "home", "none"], ["F", "O"]

# (the DP query's FROM, the plain query's FROM)
FROMS = [
    ("{d}.orders AS o INNER JOIN {d}.customer AS c ON o.o_custkey = c.c_custkey",
     "{d}.orders AS o INNER JOIN {d}.customer AS c ON o.o_custkey = c.c_custkey"),
    ("{d}.orders AS o LEFT JOIN {d}.customer AS c ON o.o_custkey = c.c_custkey",
     "{d}.orders AS o LEFT JOIN {d}.customer AS c ON o.o_custkey = c.c_custkey"),
    ("{d}.customer AS c LEFT JOIN {d}.orders AS o ON o.o_custkey = c.c_custkey",
     "{d}.customer AS c LEFT JOIN {d}.orders AS o ON o.o_custkey = c.c_custkey"),
]
# (aggregate, kind); COUNT(o.o_orderkey) counts a customer without orders as 0
AGGS = [("COUNT(*)", "count"), ("COUNT(o.o_orderkey)", "count"), ("COUNT(c.c_balance)", "count"),
        ("SUM(o.o_price)", "sum"), ("AVG(o.o_price)", "avg"), ("SUM(c.c_balance)", "sum"),
        ("COUNT(DISTINCT c.c_custkey)", "count"), ("countIf(o.o_price > 50)", "count")]
KEYS = ["", "o.o_status", "c.c_segment"]
WHERES = ["", "WHERE c.c_balance >= 10", "WHERE o.o_price < 80 OR o.o_price IS NULL"]


def _maybe_null(lo: int, hi: int):
    return st.one_of(st.none(), st.integers(lo, hi).map(float), st.integers(lo, hi).map(float))


@st.composite
def datasets(draw):
    customers = [(c, draw(st.sampled_from(SEGMENTS)), draw(_maybe_null(0, 100))) for c in range(draw(st.integers(1, 8)))]
    orders = []
    for c in range(len(customers) + 2):  # customers len and len + 1 do not exist: their orders are orphans
        for _ in range(draw(st.integers(0, 3))):
            orders.append((len(orders), c, draw(st.sampled_from(STATUSES)), draw(_maybe_null(0, 100))))
    return customers, orders


@st.composite
def queries(draw):
    dp_from, plain_from = draw(st.sampled_from(FROMS))
    aggs = draw(st.lists(st.sampled_from(AGGS), min_size=1, max_size=3, unique=True))
    return dp_from, plain_from, aggs, draw(st.sampled_from(KEYS)), draw(st.sampled_from(WHERES))


@pytest.fixture(scope="module")
def jxdb(db):
    db.command(f"CREATE DATABASE IF NOT EXISTS {DB}")
    return db


def _load(db, customers, orders) -> None:
    c = db.command
    c(f"DROP TABLE IF EXISTS {DB}.orders")
    c(f"DROP TABLE IF EXISTS {DB}.customer")
    c(f"CREATE TABLE {DB}.customer (c_custkey UInt64, c_segment String, c_balance Nullable(Float64)) "
      "ENGINE = MergeTree ORDER BY c_custkey")
    c(f"INSERT INTO {DB}.customer VALUES " + ", ".join(f"({k}, '{s}', {sql_literal(b)})" for k, s, b in customers))
    c(f"CREATE TABLE {DB}.orders (o_orderkey UInt64, o_custkey UInt64, o_status String, o_price Nullable(Float64)) "
      "ENGINE = MergeTree ORDER BY o_orderkey")
    if orders:
        c(f"INSERT INTO {DB}.orders VALUES " + ", ".join(f"({k}, {u}, '{s}', {sql_literal(p)})" for k, u, s, p in orders))
    cat = db.catalog
    cat.register(f"{DB}.customer", privacy_unit="c_custkey", bounds={"c_balance": (0, 100)},
                 public_keys={"c_segment": SEGMENTS}, max_rows_per_unit=10, max_groups_contributed=2, replace=True)
    cat.register(f"{DB}.orders", references={"o_custkey": f"{DB}.customer.c_custkey"}, bounds={"o_price": (0, 100)},
                 public_keys={"o_status": STATUSES}, max_rows_per_unit=10, max_groups_contributed=2, replace=True)
    db.ledger.set_budget(db.analyst, f"{DB}.customer", epsilon=1e9, delta=0.5)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=datasets(), q=queries())
def test_noise_off_answer_over_a_join_is_the_plain_answer(jxdb, data, q):
    dp_from, plain_from, aggs, key, where = q
    _load(jxdb, *data)
    items = ", ".join(f"{a} AS v{i}" for i, (a, _) in enumerate(aggs))
    head, tail = (f"SELECT {key} AS k, {items}", " GROUP BY k") if key else (f"SELECT {items}", "")
    sql = f"{head} FROM {dp_from.format(d=DB)} {where}{tail}"
    plain = jxdb.raw_query(f"{head} FROM {plain_from.format(d=DB)} {where}{tail} "
                           "SETTINGS join_use_nulls = 1")  # SQL's NULLs for a LEFT join's misses, as DPCH
    plan = prepare(jxdb, sql, epsilon=1.0).plan
    got = jxdb.raw_query(rewrite_for_sensitivity_check(plan).sql)
    domain = None if not key else SEGMENTS if key == "c.c_segment" else STATUSES
    assert_same_answers(sql, got, plain, domain, aggs)
