"""Controller benchmarks (results: bench/RESULTS.md, section "Controller").

1. The controller's own time: parse + bind + plan + rewrite (no execution, no ledger), per query,
   for a set of typical queries (median and p90 over many repetitions, GC on).
2. User-level DP SUM/COUNT GROUP BY 100 groups over 10 M rows and 1 M units against the plain
   query on the same engine, in one run (interleaved repetitions, medians); again with a per-unit
   projection (dpch.accelerate) on a copy of the table.

    python3 bench/bench_controller.py [--rows 10000000] [--units 1000000] [--reps 7] [--data-dir DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dpch  # noqa: E402
from dpch.controller import prepare  # noqa: E402

CONTROLLER_QUERIES = {
    "count": "SELECT COUNT(*) FROM bench.events",
    "group_count_sum": "SELECT g, COUNT(*) AS n, SUM(amount) AS s FROM bench.events GROUP BY g",
    "issue_example": "SELECT g, COUNT(*) AS n, SUM(amount) AS revenue, AVG(age) AS mean_age FROM bench.events "
                     "WHERE age >= 30 GROUP BY g",
    "having_order_limit": "SELECT g, COUNT(*) AS n, SUM(amount) / COUNT(*) AS avg_amt FROM bench.events "
                          "GROUP BY g HAVING n > 100 ORDER BY n DESC LIMIT 10",
    "var_stddev_distinct": "SELECT COUNT(DISTINCT user_id) AS u, STDDEV_POP(amount) AS sd, VAR_SAMP(age) AS v "
                           "FROM bench.events",
    "threshold_gaussian": "SELECT cat, COUNT(*) AS n, SUM(amount * 2 + 1) AS s FROM bench.events GROUP BY cat",
}


def controller_times(db, reps: int) -> dict:
    out = {}
    for name, sql in CONTROLLER_QUERIES.items():
        delta = 1e-6 if name == "threshold_gaussian" else 0.0
        prepare(db, sql, epsilon=1.0, delta=delta)  # warm imports and caches of the first call
        totals, stages = [], {"parse": [], "bind": [], "plan": [], "rewrite": []}
        for i in range(reps):
            # vary ε (never the warm-up's 1.0) so that no plan or calibration is reused from a cache
            p = prepare(db, sql, epsilon=1.0 + (i + 1) * 1e-3, delta=delta)
            totals.append(p.controller_ms)
            for k, v in p.timings_ms.items():
                stages[k].append(v)
        totals.sort()
        out[name] = {"median_ms": statistics.median(totals), "p90_ms": totals[int(0.9 * len(totals))],
                     "stages_median_ms": {k: round(statistics.median(v), 3) for k, v in stages.items()}}
    return out


def build_data(db, rows: int, units: int) -> None:
    groups = [f"g{i:02d}" for i in range(100)]
    keys = {"g": groups, "gs": groups}
    db.command("CREATE DATABASE IF NOT EXISTS bench")
    db.command("DROP TABLE IF EXISTS bench.events")
    db.command("CREATE TABLE bench.events (user_id UInt64, g LowCardinality(String), gs String, cat String, "
               "amount Float64, age UInt8) ENGINE = MergeTree ORDER BY user_id")
    per = max(1, rows // units)
    # each unit has `per` rows over 2 of the 100 groups (so k = 1 bounding really drops rows)
    db.command(f"INSERT INTO bench.events SELECT intDiv(number, {per}) AS user_id, "
               f"concat('g', leftPad(toString((cityHash64(intDiv(number, {per})) + number % 2) % 100), 2, '0')) AS g, "
               f"toString(g) AS gs, "
               f"concat('c', toString(number % 1000)) AS cat, toFloat64(number % 1000) / 2 AS amount, "
               f"toUInt8(18 + number % 70) AS age FROM numbers({rows})")
    db.command("OPTIMIZE TABLE bench.events FINAL")
    db.catalog.register("bench.events", privacy_unit="user_id", bounds={"amount": (0, 500), "age": (18, 100)},
                        max_groups_contributed=1, max_rows_per_unit=per,
                        public_keys=keys)
    db.ledger.set_budget(db.analyst, "bench.events", epsilon=1e9, delta=0.5)
    # the same rows under row-level privacy (no per-unit stage): isolates the cost of user-level bounding
    db.command("DROP TABLE IF EXISTS bench.events_rows")
    db.command("CREATE TABLE bench.events_rows AS bench.events")
    db.command("INSERT INTO bench.events_rows SELECT * FROM bench.events")
    db.catalog.register("bench.events_rows", bounds={"amount": (0, 500), "age": (18, 100)},
                        public_keys=keys)
    db.ledger.set_budget(db.analyst, "bench.events_rows", epsilon=1e9, delta=0.5)
    # the same rows, user level, with per-unit projections (dpch.accelerate); a copy because
    # ClickHouse would otherwise use the projections for bench.events too
    db.command("DROP TABLE IF EXISTS bench.events_accel")
    db.command("CREATE TABLE bench.events_accel AS bench.events")
    db.command("INSERT INTO bench.events_accel SELECT * FROM bench.events")
    entry = db.catalog.get("bench.events")
    db.catalog.register("bench.events_accel", privacy_unit="user_id", bounds=dict(entry.bounds),
                        max_groups_contributed=1, max_rows_per_unit=per,
                        public_keys=keys)
    db.ledger.set_budget(db.analyst, "bench.events_accel", epsilon=1e9, delta=0.5)
    for key in ("g", "gs"):
        db.accelerate("bench.events_accel", [key], ["amount"])
    db.command("OPTIMIZE TABLE bench.events_accel FINAL")  # one part, as bench.events (one state row per unit)


def end_to_end(db, reps: int, key: str, table: str = "bench.events") -> dict:
    """Plain vs DP (public keys) for GROUP BY ``key``; interleaved repetitions."""
    plain = f"SELECT {key}, count() AS n, sum(amount) AS s FROM {table} GROUP BY {key}"
    dp_sql = f"SELECT {key}, COUNT(*) AS n, SUM(amount) AS s FROM {table} GROUP BY {key}"
    db.raw_query(plain)  # warm up (page cache, UDF pool start-up)
    db.query(dp_sql, epsilon=1.0)
    t_plain, t_dp = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        db.raw_query(plain)
        t1 = time.perf_counter()
        df = db.query(dp_sql, epsilon=1.0)
        t2 = time.perf_counter()
        t_plain.append(t1 - t0)
        t_dp.append(t2 - t1)
    assert len(df) == 100
    mp, md = statistics.median(t_plain), statistics.median(t_dp)
    return {"plain_median_s": mp, "dp_median_s": md, "ratio": md / mp, "plain_min_s": min(t_plain),
            "dp_min_s": min(t_dp), "ratio_of_mins": min(t_dp) / min(t_plain)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--units", type=int, default=1_000_000)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--controller-reps", type=int, default=200)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)
    data_dir = args.data_dir or tempfile.mkdtemp(prefix="dpch_bench_controller_")
    os.environ.setdefault("DPCH_DATA_DIR", data_dir)
    db = dpch.connect(data_dir, analyst="bench")
    try:
        t0 = time.perf_counter()
        build_data(db, args.rows, args.units)
        build_s = time.perf_counter() - t0
        ctl = controller_times(db, args.controller_reps)
        e2e = {f"user level, GROUP BY {k}": end_to_end(db, args.reps, k) for k in ("g", "gs")}
        e2e.update({f"user level + per-unit projection, GROUP BY {k}": end_to_end(db, args.reps, k, "bench.events_accel")
                    for k in ("g", "gs")})
        e2e.update({f"row level, GROUP BY {k}": end_to_end(db, args.reps, k, "bench.events_rows")
                    for k in ("g", "gs")})
    finally:
        db.close()
    result = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
              "rows": args.rows, "units": args.units, "build_s": build_s, "controller": ctl, "end_to_end": e2e}
    print(json.dumps({k: v for k, v in result.items()}, indent=1, default=float))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
