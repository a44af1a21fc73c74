"""What the pre-charge type check (dpch.typecheck, issue 11) costs per controller query.

For three query shapes on a small table (so the fixed costs show), in one run, interleaved:
`prepare` (parse → bind → total → plan → rewrite), the type check cold (its cache cleared: two
probe queries on a row of defaults) and warm (a repeated query text), and the whole `db.query`.

    .venv/bin/python bench/bench_typecheck.py [--reps 21]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import dpch
from dpch import typecheck
from dpch.controller import prepare
from dpch.rewrite import rewrite_probe

QUERIES = [
    "SELECT COUNT(*) AS n, SUM(amount) AS s FROM bench_tc.t",
    "SELECT region, COUNT(*) AS n, AVG(amount) AS a FROM bench_tc.t GROUP BY region",
    "SELECT COUNT(*) AS n FROM bench_tc.t WHERE toInt64(name) > 3 AND intDiv(qty, 7) < 100",
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=21)
    args = ap.parse_args()
    db = dpch.connect(tempfile.mkdtemp(prefix="bench_tc_"), analyst="bench")
    db.command("CREATE DATABASE bench_tc")
    db.command("CREATE TABLE bench_tc.t (user_id UInt64, name String, region String, qty Int64, amount Float64) "
               "ENGINE = MergeTree ORDER BY user_id")
    db.command("INSERT INTO bench_tc.t SELECT number % 10000, toString(number), ['a', 'b', 'c'][number % 3 + 1], "
               "number, number % 500 FROM numbers(100000)")
    db.catalog.register("bench_tc.t", privacy_unit="user_id", bounds={"amount": (0, 500), "qty": (0, 1000)},
                        max_rows_per_unit=10, public_keys={"region": ["a", "b", "c"]})
    db.ledger.set_budget(db.analyst, "bench_tc.t", 1e9)
    print(f"{'query':60s} {'prepare':>9s} {'check cold':>11s} {'check warm':>11s} {'db.query':>9s} {'cold/query':>10s}")
    for sql in QUERIES:
        prep, cold, warm, whole = [], [], [], []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            p = prepare(db, sql, epsilon=1.0)
            t1 = time.perf_counter()
            probe = rewrite_probe(p.plan).sql
            typecheck._PASSED.clear()
            t2 = time.perf_counter()
            typecheck.check_runs(db.backend, p.plan.entry, p.plan.bound, probe)
            t3 = time.perf_counter()
            typecheck.check_runs(db.backend, p.plan.entry, p.plan.bound, probe)
            t4 = time.perf_counter()
            db.query(sql, epsilon=1.0)
            t5 = time.perf_counter()
            prep.append(t1 - t0)
            cold.append(t3 - t2)
            warm.append(t4 - t3)
            whole.append(t5 - t4)
        m = [statistics.median(x) * 1e3 for x in (prep, cold, warm, whole)]
        print(f"{sql[:60]:60s} {m[0]:8.2f}ms {m[1]:10.2f}ms {m[2]:10.3f}ms {m[3]:8.2f}ms {m[1] / m[3]:10.2f}")
    db.close()


if __name__ == "__main__":
    main()
