"""Timing side channel of a quantile release (issue 15; DESIGN invariant 7): release times of the
kernel's quantile routine on neighbouring histograms D and D' (one row apart, the auditor's
worst-case design dpch.audit.quantile_design), interleaved, fed to the auditor as outputs.

    .venv/bin/python bench/bench_quantile_timing.py [--n 20000] [--eps 1.0]

A consistent verdict (ε_LB well below ε) means the times do not distinguish D from D' at this
sample size. The early-exit permute-and-flip gave ε_LB = 1.6 > 1 here (before commit be20783)."""
from __future__ import annotations

import argparse
import time

import numpy as np

from dpch import _noise
from dpch.audit import audit_samples, quantile_design
from dpch.mechanisms import QUANTILE_BUCKETS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20_000, help="releases per side")
    ap.add_argument("--eps", type=float, default=1.0)
    args = ap.parse_args()
    d = quantile_design(0.5, 0, 100, args.eps, improving=20)
    keys = [b for b, _ in d.counts]
    on_d = [n for _, n in d.counts]
    on_dprime = [n - (b == d.removed_bucket) for b, n in d.counts]
    times = {0: np.empty(args.n), 1: np.empty(args.n)}
    for i in range(args.n):
        for side, counts in ((0, on_d), (1, on_dprime)):
            t0 = time.perf_counter_ns()
            _noise.quantile_buckets(keys, counts, QUANTILE_BUCKETS, [0.5], args.eps, 1, 1)
            times[side][i] = (time.perf_counter_ns() - t0) / 1e3
    print(f"median release time: D {np.median(times[0]):.0f} µs, D' {np.median(times[1]):.0f} µs "
          f"({QUANTILE_BUCKETS} buckets)")
    print(audit_samples(times[0], times[1], epsilon=args.eps).text())


if __name__ == "__main__":
    main()
