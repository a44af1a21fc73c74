"""`dpch demo`: deterministic sample data in the embedded engine, then DP queries on it."""
from __future__ import annotations

import argparse


def register(subparsers) -> None:
    p = subparsers.add_parser("demo", help="generate sample data and run DP queries on the embedded engine")
    p.add_argument("--rows", type=int, default=1_000_000, help="rows of sample purchases (default 1M)")
    p.add_argument("--epsilon", type=float, default=1.0, help="ε per released value (default 1.0)")
    p.add_argument("--data-dir", default=None, help="embedded data directory (default $DPCH_DATA_DIR or ./.dpch_data)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    import dpch
    from dpch.demo import run_demo

    if args.rows <= 0:
        raise dpch.InvalidParameter("--rows must be a positive integer")
    with dpch.connect(args.data_dir) as db:
        run_demo(db, rows=args.rows, eps=args.epsilon)
    return 0
