"""`dpch refine`: early stopping (dpch.early_stop, odp_privacy_accounting.md §5).

    dpch refine "SELECT COUNT(*) FROM demo.purchases WHERE region = 'north'" \\
         --epsilon-per-step 0.05 --max-steps 10 --target-relative 0.02

Prints one line per step (the measurement, the combined estimate, the interval's half-width),
then the estimate with its interval, the steps run, the ε reserved and the ε charged after the
settlement. Exit status 0; 2 for bad arguments or a refused query (nothing charged). Connection
options as for ``dpch query``.
"""
from __future__ import annotations

import math
import sys

from .query import _common, _connect, _float


def cmd_refine(args) -> int:
    if not (math.isfinite(args.epsilon_per_step) and args.epsilon_per_step > 0):
        print("dpch: error: --epsilon-per-step must be a finite number > 0", file=sys.stderr)
        return 2
    if args.target_halfwidth is None and args.target_relative is None:
        print("dpch: error: give --target-halfwidth or --target-relative (or both)", file=sys.stderr)
        return 2

    def show(step) -> None:
        print(f"step {step.step}\tmeasurement {step.measurement:.6g}\testimate {step.estimate:.6g}\t"
              f"half-width {step.halfwidth:.6g}")

    with _connect(args) as db:
        r = db.refine(args.sql, epsilon_per_step=args.epsilon_per_step, max_steps=args.max_steps,
                      target_halfwidth=args.target_halfwidth, target_relative=args.target_relative,
                      confidence=args.confidence, on_step=show)
        print(r.describe())
    return 0


def register(subparsers) -> None:
    s = subparsers.add_parser("refine", help="early stopping: refine a noisy COUNT/SUM until its interval is "
                              "narrow enough (charged for the steps run, ODP Lemma 11)")
    s.add_argument("sql", help="one ungrouped COUNT or SUM over a catalogued table")
    s.add_argument("--epsilon-per-step", type=_float, required=True, help="ε of each measurement")
    s.add_argument("--max-steps", type=int, default=10, help="at most this many steps (reserved up front)")
    s.add_argument("--target-halfwidth", type=_float, default=None, help="stop when the half-width is <= this")
    s.add_argument("--target-relative", type=_float, default=None,
                   help="stop when the half-width is <= this fraction of |estimate|")
    s.add_argument("--confidence", type=_float, default=0.95, help="interval level (default 0.95)")
    _common(s)
    s.set_defaults(func=cmd_refine)
