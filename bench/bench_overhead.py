"""The controller's own time per query (issue 17: <= 1 ms p50 for parse -> rewrite -> charge).

Three numbers per run, on a tiny table (execution is not the point here):

* ``prepare``: parse + bind + plan + rewrite (``dpch.controller.prepare``), per query of
  bench_controller.CONTROLLER_QUERIES, ε varied per repetition so that no calibration is reused
  from a cache (an analyst who repeats a query at the same ε gets cache hits and is faster);
* ``charge``: the ledger's durable charge + mark of one query (two SQLite transactions in WAL mode
  with synchronous=FULL: each commit waits for an fsync);
* ``fsync floor``: one empty-ish SQLite commit with the same pragmas, the cost of the durability
  DESIGN.md requires (a charge must survive a crash before the query runs).

    .venv/bin/python bench/bench_overhead.py [--reps 300] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import dpch  # noqa: E402
from bench_controller import CONTROLLER_QUERIES  # noqa: E402
from dpch.controller import prepare  # noqa: E402


def _setup(db) -> None:
    db.raw_query("CREATE DATABASE IF NOT EXISTS bench")
    db.raw_query("CREATE TABLE bench.events (user_id UInt64, g LowCardinality(String), gs String, cat String, "
                 "amount Float64, age Int32) ENGINE = MergeTree ORDER BY tuple()")
    db.raw_query("INSERT INTO bench.events SELECT number % 100, toString(number % 7), toString(number % 7), "
                 "toString(number % 3), number % 500, 20 + number % 60 FROM numbers(1000)")
    db.catalog.register("bench.events", privacy_unit="user_id", max_groups_contributed=1, max_rows_per_unit=10,
                        bounds={"amount": (0, 500), "age": (0, 120)},
                        public_keys={"g": [str(i) for i in range(7)]})
    db.ledger.set_budget(db.analyst, "bench.events", epsilon=1e9)


def prepare_times(db, reps: int) -> dict:
    out = {}
    for name, sql in CONTROLLER_QUERIES.items():
        delta = 1e-6 if name == "threshold_gaussian" else 0.0
        prepare(db, sql, epsilon=1.0, delta=delta)  # imports and first-call caches
        totals, stages = [], {}
        for i in range(reps):
            p = prepare(db, sql, epsilon=1.0 + i * 1e-3, delta=delta)
            totals.append(p.controller_ms)
            for k, v in p.timings_ms.items():
                stages.setdefault(k, []).append(v)
        totals.sort()
        out[name] = {"p50_ms": statistics.median(totals), "p90_ms": totals[int(0.9 * len(totals))],
                     "stages_p50_ms": {k: round(statistics.median(v), 3) for k, v in stages.items()}}
    return out


def charge_times(db, reps: int) -> dict:
    p = prepare(db, CONTROLLER_QUERIES["group_count_sum"], epsilon=1e-3)
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        receipt = db.ledger.charge(db.analyst, p.dataset, p.plan.cost, "bench")
        db.ledger.mark(receipt, "executed")
        ts.append((time.perf_counter() - t) * 1e3)
    return {"p50_ms": statistics.median(ts), "p90_ms": sorted(ts)[int(0.9 * len(ts))]}


def fsync_floor(directory: str, reps: int) -> dict:
    conn = sqlite3.connect(os.path.join(directory, "floor.sqlite"), isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE t (x INTEGER)")
    ts = []
    for i in range(reps):
        t = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO t VALUES (?)", (i,))
        conn.execute("COMMIT")
        ts.append((time.perf_counter() - t) * 1e3)
    conn.close()
    return {"p50_ms": statistics.median(ts), "p90_ms": sorted(ts)[int(0.9 * len(ts))]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dpch-overhead-") as d:
        db = dpch.connect(d)
        _setup(db)
        res = {"prepare": prepare_times(db, args.reps), "charge": charge_times(db, min(args.reps, 100)),
               "fsync_floor": fsync_floor(d, min(args.reps, 100)), "load_average": os.getloadavg()}
        db.close()
    print("| query | p50 ms | p90 ms | parse / bind / plan / rewrite (p50 ms) |\n|---|---|---|---|")
    for name, r in res["prepare"].items():
        s = r["stages_p50_ms"]
        print(f"| {name} | {r['p50_ms']:.3f} | {r['p90_ms']:.3f} | "
              + " / ".join(f"{s.get(k, float('nan')):.3f}" for k in ("parse", "bind", "plan", "rewrite")) + " |")
    print(f"\nledger charge + mark: p50 {res['charge']['p50_ms']:.2f} ms (p90 {res['charge']['p90_ms']:.2f}); "
          f"one SQLite commit with synchronous=FULL: p50 {res['fsync_floor']['p50_ms']:.2f} ms; "
          f"load average {res['load_average'][0]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
