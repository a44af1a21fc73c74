"""Throughput of the noise UDFs end to end through ClickHouse (chDB, executable_pool, RowBinary).

    python3 bench/bench_udf_pipe.py                  # 10 M rows, median of 5 runs
    python3 bench/bench_udf_pipe.py --rows 10000000 --runs 5

Measures, in a private temporary chDB store loading clickhouse_config/udf/*.xml:
  * SELECT sum(dpch_<f>(toFloat64(number), 1.0)) FROM numbers(N) vs the same without the UDF
    (rows/s and the slowdown ratio), for laplace, gaussian, laplace_int and gaussian_int;
  * the latency of a one-row call vs SELECT 1 (pool already warm);
  * the program alone on a pipe (no ClickHouse): rows/s for blocks of 65 536 rows.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def make_udf_dir(tmp: Path) -> Path:
    udf = tmp / "udf"
    udf.mkdir()
    for xml in (REPO / "clickhouse_config" / "udf").glob("*.xml"):
        shutil.copyfile(xml, udf / xml.name)
    launcher = udf / "dpch-udf"
    launcher.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m dpch.udf_entry "$@"\n')
    launcher.chmod(0o755)
    return udf


def timings(session, sql: str, runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        session.query(sql, "CSV")
        times.append(time.perf_counter() - t)
    return times


def timed(session, sql: str, runs: int) -> float:
    return statistics.median(timings(session, sql, runs))


def pipe_only(rows: int, block: int = 65536) -> float:
    values = np.empty(block, dtype=[("v", "<f8"), ("s", "<f8")])
    values["v"] = np.arange(block)
    values["s"] = 1.0
    one = f"{block}\n".encode() + values.tobytes()
    nblocks = rows // block
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "dpch.udf_entry", "laplace"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env=env)
    # the program answers while it reads: feed stdin from a thread (as ClickHouse does)
    ready = threading.Event()

    def feed():
        proc.stdin.write(one)  # warm-up block: process start is not part of the throughput
        proc.stdin.flush()
        ready.wait()
        for _ in range(nblocks):
            proc.stdin.write(one)
        proc.stdin.close()

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    assert len(proc.stdout.read(8 * block)) == 8 * block
    t = time.perf_counter()
    ready.set()
    total = 0
    while total < 8 * block * nblocks:
        got = proc.stdout.read(8 * block)
        assert got
        total += len(got)
    elapsed = time.perf_counter() - t
    writer.join()
    proc.wait()
    return nblocks * block / elapsed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)
    os.environ["PYTHONPATH"] = str(REPO)  # the pool processes inherit it

    from chdb import session as chdb_session

    n = args.rows
    with tempfile.TemporaryDirectory(prefix="dpch_bench_udf_") as tmp:
        udf = make_udf_dir(Path(tmp))
        s = chdb_session.Session(f"{tmp}/data?udf_path={udf}")
        try:
            base_sql = f"SELECT sum(toFloat64(number)) FROM numbers({n})"
            base = timed(s, base_sql, args.runs)
            print(f"## UDF throughput through chDB ({n:,} rows, median of {args.runs} runs)\n")
            print("| query | seconds | rows/s | ratio to no-UDF |")
            print("|---|---:|---:|---:|")
            print(f"| `{base_sql}` | {base:.3f} | {n / base / 1e6:.1f} M | 1 |")
            for fn, arg in (("dpch_laplace", "toFloat64(number)"), ("dpch_gaussian", "toFloat64(number)"),
                            ("dpch_laplace_int", "toInt64(number)"), ("dpch_gaussian_int", "toInt64(number)")):
                sql = f"SELECT sum({fn}({arg}, 1.0)) FROM numbers({n})"
                s.query(f"SELECT sum({fn}({arg}, 1.0)) FROM numbers(1000000)", "CSV")  # warm the pool
                t = timed(s, sql, args.runs)
                print(f"| `{sql}` | {t:.3f} | {n / t / 1e6:.2f} M | {t / base:.0f} |")
            ones = timings(s, "SELECT dpch_laplace(1.0, 1.0)", 200)
            one = statistics.median(ones)
            q1, _, q3 = statistics.quantiles(ones, n=4)
            sel1 = timed(s, "SELECT 1", 200)
            print(f"\none-row call: median {one * 1e3:.2f} ms, interquartile range {(q3 - q1) * 1e6:.0f} us "
                  f"(SELECT 1: {sel1 * 1e3:.2f} ms; UDF overhead {(one - sel1) * 1e3:.2f} ms), 200 calls")
        finally:
            s.close()
    rate = pipe_only(min(n, 5_000_000))
    print(f"program alone on a pipe (laplace, blocks of 65,536 rows, one process): {rate / 1e6:.2f} M rows/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
