"""What the real-relation probe (dpch.probe_db, issue 26 item 3) adds to the pre-charge type check.

A 3-table join (lineitem → orders → customer, plus the reference chain lineitem's unit takes),
three query shapes, interleaved in one run. Per query, the type check with the passed-check cache
cleared ("cold": what a new query text pays) and with it warm (a repeated text):

- old: the relation replaced by ONE row of its own columns (``rewrite_probe(plan)``), the probe
  before this change;
- new: the real relation on the one-row probe tables (``probe_db.check_before_charge``: the
  sqlglot table swap + the probe queries); "swap" alone is the uncached sqlglot parse + swap +
  render of the relation (cached by text afterwards);

and the whole ``db.query`` for scale. Also the one-time cost of creating a probe table.

    .venv/bin/python bench/bench_probe.py [--reps 100]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import dpch
from dpch import probe_db, typecheck
from dpch.controller import prepare
from dpch.rewrite import rewrite_probe

QUERIES = [
    "SELECT COUNT(*) AS n, SUM(l_quantity) AS q FROM bp.lineitem l JOIN bp.orders o ON l.l_orderkey = o.o_orderkey "
    "JOIN bp.customer c ON o.o_custkey = c.c_custkey",
    "SELECT o_status, COUNT(*) AS n FROM bp.lineitem l JOIN bp.orders o ON l.l_orderkey = o.o_orderkey "
    "JOIN bp.customer c ON o.o_custkey = c.c_custkey WHERE c_acctbal > 10 GROUP BY o_status",
    "SELECT COUNT(*) AS n FROM bp.lineitem l JOIN bp.orders o ON l.l_orderkey = o.o_orderkey "
    "JOIN bp.customer c ON o.o_custkey = c.c_custkey WHERE c_nationkey IN (SELECT n_nationkey FROM bp.nation)",
]


def _setup(db) -> None:
    c = db.command
    c("CREATE DATABASE bp")
    c("CREATE TABLE bp.nation (n_nationkey UInt32, n_name String) ENGINE = MergeTree ORDER BY n_nationkey")
    c("INSERT INTO bp.nation SELECT number, toString(number) FROM numbers(25)")
    c("CREATE TABLE bp.customer (c_custkey UInt64, c_nationkey UInt32, c_acctbal Float64) ENGINE = MergeTree "
      "ORDER BY c_custkey")
    c("INSERT INTO bp.customer SELECT number, number % 25, number % 1000 FROM numbers(3000)")
    c("CREATE TABLE bp.orders (o_orderkey UInt64, o_custkey UInt64, o_status String) ENGINE = MergeTree "
      "ORDER BY o_orderkey")
    c("INSERT INTO bp.orders SELECT number, number % 3000, if(number % 2 = 0, 'F', 'O') FROM numbers(30000)")
    c("CREATE TABLE bp.lineitem (l_orderkey UInt64, l_quantity Float64) ENGINE = MergeTree ORDER BY l_orderkey")
    c("INSERT INTO bp.lineitem SELECT number % 30000, number % 50 FROM numbers(120000)")
    cat = db.catalog
    cat.register("bp.nation", public=True)
    cat.register("bp.customer", privacy_unit="c_custkey", bounds={"c_acctbal": (0, 1000)})
    cat.register("bp.orders", references={"o_custkey": "bp.customer.c_custkey"}, public_keys={"o_status": ["F", "O"]},
                 max_rows_per_unit=10)
    cat.register("bp.lineitem", references={"l_orderkey": "bp.orders.o_orderkey"}, bounds={"l_quantity": (0, 50)},
                 max_rows_per_unit=40)
    db.ledger.set_budget(db.analyst, "bp.customer", 1e9)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=100, help="repetitions per query shape")
    args = ap.parse_args()
    db = dpch.connect(tempfile.mkdtemp(prefix="bench_probe_"), analyst="bench")
    _setup(db)
    t0 = time.perf_counter()
    for t in ("bp.nation", "bp.customer", "bp.orders", "bp.lineitem"):
        probe_db.ensure_probe_table(db.backend, db.catalog.get(t))
    create_ms = (time.perf_counter() - t0) * 1e3 / 4
    prepared = [prepare(db, sql, epsilon=1.0).plan for sql in QUERIES]
    cols = {k: [] for k in ("old cold", "new cold", "old warm", "new warm", "swap", "db.query")}

    def timed(key, fn):
        t = time.perf_counter()
        fn()
        cols[key].append((time.perf_counter() - t) * 1e3)

    def old(plan):
        typecheck.check_runs(db.backend, plan.entry, plan.bound, rewrite_probe(plan).sql)

    for _ in range(args.reps):
        for sql, plan in zip(QUERIES, prepared):
            typecheck._PASSED.clear()  # the two probes' texts differ: neither hits the other's entry
            timed("old cold", lambda: old(plan))
            probe_db._tables_of.cache_clear()  # a new text: the relation is parsed again too
            probe_db._swapped.cache_clear()
            timed("new cold", lambda: probe_db.check_before_charge(db, plan))
            timed("old warm", lambda: old(plan))
            timed("new warm", lambda: probe_db.check_before_charge(db, plan))
            probe_db._tables_of.cache_clear()
            probe_db._swapped.cache_clear()
            timed("swap", lambda: probe_db.swap_tables(plan.entry.table_sql, probe_db.probe_tables(db)))
            timed("db.query", lambda: db.query(sql, epsilon=1.0))
    n = len(cols["db.query"])
    print(f"{n} queries (3 shapes x {args.reps}), p50 in ms; probe table creation (one time, per table): "
          f"{create_ms:.1f} ms")
    print(" ".join(f"{k:>9s}" for k in cols))
    print(" ".join(f"{statistics.median(v):9.2f}" for v in cols.values()))
    added = statistics.median(cols["new cold"]) - statistics.median(cols["old cold"])
    print(f"added per new query text: {added:+.2f} ms (p50 db.query {statistics.median(cols['db.query']):.2f} ms); "
          f"added per repeated text: {statistics.median(cols['new warm']) - statistics.median(cols['old warm']):+.2f} ms")
    db.close()


if __name__ == "__main__":
    main()
