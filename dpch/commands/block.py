"""`dpch block`: a Block-DP I/II mean or median of one catalogued column (dpch.block_dp).

    dpch block demo.purchases amount --statistic median --mechanism block_dp_2 --blocks 20 --epsilon 0.5

Prints the noisy value, the noise's interval and the ε charged. Exit status 0; 2 for bad arguments
or a refused release (nothing charged). Connection options as for ``dpch query``.
"""
from __future__ import annotations

import math
import sys

from .query import _common, _connect, _float


def cmd_block(args) -> int:
    if not (math.isfinite(args.epsilon) and args.epsilon > 0):
        print("dpch: error: --epsilon must be a finite number > 0", file=sys.stderr)
        return 2
    if args.blocks < 1:  # --mechanism and --statistic are checked by argparse (choices)
        print("dpch: error: --blocks must be an integer >= 1", file=sys.stderr)
        return 2
    with _connect(args) as db:
        r = db.block_dp(args.dataset, args.column, epsilon=args.epsilon, statistic=args.statistic,
                        mechanism=args.mechanism, blocks=args.blocks, ci_level=args.ci_level)
        print(r.describe())
    return 0


def register(subparsers) -> None:
    s = subparsers.add_parser("block", help="Block-DP I/II mean or median of a column (thesis §5.4, corrected)")
    s.add_argument("dataset", help="the catalogued table (charged)")
    s.add_argument("column", help="a numeric column with catalog bounds")
    s.add_argument("--statistic", choices=["mean", "median"], default="median")
    s.add_argument("--mechanism", choices=["block_dp_1", "block_dp_2"], default="block_dp_2",
                   help="block_dp_1: value blocks, noise per block; block_dp_2: unit-hash blocks, one noise")
    s.add_argument("--blocks", type=int, default=10, metavar="M", help="number of blocks m (default 10)")
    s.add_argument("--epsilon", type=_float, required=True)
    s.add_argument("--ci-level", type=_float, default=0.95, help="level of the noise interval (default 0.95)")
    _common(s)
    s.set_defaults(func=cmd_block)
