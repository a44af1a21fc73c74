"""Noise-kernel throughput and timing side channel (dpch._noise, one core, in process).

    python3 bench/bench_sampler.py                 # print the tables
    python3 bench/bench_sampler.py --runs 7 --n 1000000

Throughput: samples per CPU-second of the sampling thread (the one-core figure, robust to other
load on the machine) and per wall-clock second, medians of --runs runs of --n samples each, plus
the OS randomness consumed per sample. Timing: wall time of single draws (clock_gettime around each draw, ~20-40 ns of clock
overhead included) grouped by |noise| / scale, which is what the sampler's loop count depends on.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from dpch import _noise as noise  # noqa: E402

CASES = [
    ("bernoulli_exp(1/1)", lambda n: noise.bernoulli_exp(1, 1, n)),
    ("discrete_laplace t/s=3/2", lambda n: noise.discrete_laplace(3, 2, n)),
    ("discrete_laplace t/s=2^40", lambda n: noise.discrete_laplace(2**40, 1, n)),
    ("discrete_gaussian sigma=2.5", lambda n: noise.discrete_gaussian(5, 1, n)),
    ("discrete_gaussian sigma=2^20", lambda n: noise.discrete_gaussian(2**20, 0, n)),
    ("laplace_release (Float64, b=1)", lambda n: noise.laplace_release(np.zeros(n), 1.0)),
    ("laplace_release_int (b=3)", lambda n: noise.laplace_release_int(np.zeros(n, dtype=np.int64), 3.0)),
    ("gaussian_release (Float64, sigma=1)", lambda n: noise.gaussian_release(np.zeros(n), 1.0)),
    ("gaussian_release_int (sigma=2.5)", lambda n: noise.gaussian_release_int(np.zeros(n, dtype=np.int64), 2.5)),
]


def _rates(fn, n: int, runs: int) -> tuple[float, float]:
    """(median samples per CPU-second of this thread, median samples per wall-clock second).
    CPU time is the one-core figure that other processes on the machine do not distort."""
    cpu, wall = [], []
    for _ in range(runs):
        c, w = time.thread_time(), time.perf_counter()
        fn(n)
        cpu.append(n / (time.thread_time() - c))
        wall.append(n / (time.perf_counter() - w))
    return statistics.median(cpu), statistics.median(wall)


def throughput(runs: int, n: int) -> list[tuple[str, float, float, float]]:
    rows = []
    words = max(1, n // 8)
    cpu, wall = _rates(lambda k: noise.random_u64(words), 8 * words, runs)
    rows.append(("getrandom buffer", cpu, wall, float("nan")))
    for name, fn in CASES:
        fn(1000)  # warm up
        b0 = noise.rng_bytes_used()
        cpu, wall = _rates(fn, n, runs)
        bytes_per = (noise.rng_bytes_used() - b0) / (runs * n)
        rows.append((name, cpu, wall, bytes_per))
    return rows


def timing(n: int):
    """Median ns per draw by |noise|/scale bucket (discrete Laplace t/s = 2^40 and 3/2, discrete
    Gaussian sigma = 2^20)."""
    out = []
    for label, fn, scale in (
        ("discrete_laplace t/s=2^40", lambda: noise.timed_discrete_laplace(2**40, 1, n), 2.0**40),
        ("discrete_laplace t/s=3/2", lambda: noise.timed_discrete_laplace(3, 2, n), 1.5),
        ("discrete_gaussian sigma=2^20", lambda: noise.timed_discrete_gaussian(2**20, 0, n), 2.0**20),
    ):
        x, ns = fn()
        ratio = np.abs(x) / scale
        edges = [0, 1, 2, 3, 4, 5, 6, np.inf]
        cells = []
        for lo, hi in zip(edges[:-1], edges[1:]):
            sel = (ratio >= lo) & (ratio < hi)
            cells.append((lo, hi, int(sel.sum()), float(np.median(ns[sel])) if sel.any() else float("nan"),
                          float(np.mean(ns[sel])) if sel.any() else float("nan")))
        slope, intercept = np.polyfit(np.minimum(ratio, 10), ns.astype(float), 1)
        out.append((label, cells, slope, intercept, float(np.median(ns)), float(np.percentile(ns, 99.9))))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--timing-n", type=int, default=2_000_000)
    args = ap.parse_args(argv)
    print(f"## sampler throughput (one core, median of {args.runs} runs of {args.n:,} samples; "
          f"load average {os.getloadavg()[0]:.1f})\n")
    print("| sampler | samples per CPU-second | samples per wall-second | random bytes/sample |")
    print("|---|---:|---:|---:|")
    for name, cpu, wall, bps in throughput(args.runs, args.n):
        if name.startswith("getrandom"):
            print(f"| {name} | {cpu / 1e6:.0f} MB/s | {wall / 1e6:.0f} MB/s | |")
        else:
            print(f"| {name} | {cpu / 1e6:.2f} M | {wall / 1e6:.2f} M | {bps:.1f} |")
    print(f"\n## time per draw vs |noise|/scale ({args.timing_n:,} timed draws each)\n")
    for label, cells, slope, intercept, med, p999 in timing(args.timing_n):
        print(f"{label}: median {med:.0f} ns, 99.9th percentile {p999:.0f} ns, "
              f"least-squares fit of the mean {intercept:.0f} ns + {slope:.0f} ns x |noise|/scale")
        print("| abs(noise)/scale | draws | median ns | mean ns |")
        print("|---|---:|---:|---:|")
        for lo, hi, count, median, mean in cells:
            rng = f"[{lo:g}, {hi:g})" if np.isfinite(hi) else f">= {lo:g}"
            print(f"| {rng} | {count} | {median:.0f} | {mean:.0f} |")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
