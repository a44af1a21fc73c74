"""DP SQL functions against the plain query, same data, same engine, interleaved in one run.

    python3 bench/bench_sql_functions.py [--rows 10000000] [--reps 9]

Query: dp_count + dp_sum GROUP BY 100 groups (issue 2 target: ratio <= 1.2), plus the clipped
float sum (what a float-unsafe implementation would run) to show what the exact fixed-point
summation costs on top of clipping.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import dpch

QUERIES = {
    "plain": "SELECT g, count(), sum(amount) FROM bench_sqlfn.t GROUP BY g FORMAT Null",
    "clipped float sum (not DP)": "SELECT g, count(), sum(least(greatest(amount, 0.), 500.)) "
                                  "FROM bench_sqlfn.t GROUP BY g FORMAT Null",
    "dp_count + dp_sum": "SELECT g, dp_count(1.0), dp_sum(amount, 0, 500, 1.0) FROM bench_sqlfn.t "
                         "GROUP BY g FORMAT Null",
    "dp_count_gaussian + dp_sum_gaussian": "SELECT g, dp_count_gaussian(1.0, 1e-6), "
                                           "dp_sum_gaussian(amount, 0, 500, 1.0, 1e-6) FROM bench_sqlfn.t "
                                           "GROUP BY g FORMAT Null",
    "dp_avg": "SELECT g, dp_avg(amount, 0, 500, 1.0) FROM bench_sqlfn.t GROUP BY g FORMAT Null",
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--reps", type=int, default=9)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, dpch.connect(tmp) as db:
        db.command("CREATE DATABASE bench_sqlfn")
        db.command("CREATE TABLE bench_sqlfn.t (g UInt8, amount Float64) ENGINE = MergeTree ORDER BY g")
        db.command(f"INSERT INTO bench_sqlfn.t SELECT cityHash64(number) % 100, "
                   f"(cityHash64(number, 'a') % 60000) / 100 FROM numbers({args.rows})")
        db.command("OPTIMIZE TABLE bench_sqlfn.t FINAL")
        for sql in QUERIES.values():  # warm the caches and the UDF pools
            db.raw_query(sql.replace(" FORMAT Null", ""))
        times = {name: [] for name in QUERIES}
        for _ in range(args.reps):  # interleaved, so load changes hit every query alike
            for name, sql in QUERIES.items():
                t = time.perf_counter()
                db.command(sql)
                times[name].append(time.perf_counter() - t)
    base = statistics.median(times["plain"])
    print(f"{args.rows:,} rows, 100 groups, median of {args.reps} interleaved runs\n")
    print("| query | median ms | min–max ms | ratio to plain |")
    print("|---|---:|---:|---:|")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"| {name} | {med * 1000:.0f} | {min(ts) * 1000:.0f}–{max(ts) * 1000:.0f} | {med / base:.2f} |")


if __name__ == "__main__":
    main()
