"""`dpch ptr`: a propose-test-release statistic (dpch.ptr, docs/PTR.md).

    dpch ptr median demo.purchases amount --epsilon 1 --delta 1e-6 --rows-hint 1000000
    dpch ptr iqr demo.purchases amount --epsilon 1 --delta 1e-6 --where "region = 'north'"
    dpch ptr trimmed-mean demo.purchases amount --alpha 0.1 --epsilon 1 --delta 1e-6 --bound 0.5

Prints the branch (``released`` with the value, or ``bottom``: ⊥), then the ε charged after the
output-DP settlement, the ε reserved, the δ and the proposal. ``--json`` prints the same as one JSON
object. Exit status 0 (also for ⊥: an answer, not an error); 2 for bad arguments or a rejected
query (nothing charged). Connection options as for ``dpch query``.
"""
from __future__ import annotations

import json

from .query import _common, _connect, _float

NAMES = {"median": "median", "iqr": "iqr", "trimmed-mean": "trimmed_mean"}


def cmd_ptr(args) -> int:
    from dpch.ptr import run_ptr

    options = {}
    if args.max_rows is not None:
        options["max_rows_per_unit"] = args.max_rows
    with _connect(args) as db:
        r = run_ptr(db, NAMES[args.statistic], args.table, args.column, epsilon=args.epsilon, delta=args.delta,
                    where=args.where, alpha=args.alpha, bound=args.bound, rows_hint=args.rows_hint,
                    base=args.base, split=args.split, **options)
    if args.json:
        print(json.dumps({"statistic": r.statistic, "branch": r.branch, "value": r.value,
                          "epsilon_charged": r.epsilon_charged, "epsilon_reserved": r.epsilon_reserved,
                          "delta": r.delta, "proposed_scale": r.proposed_scale, "dataset": r.dataset}))
        return 0
    print(f"{r.statistic} of {args.column} on {r.dataset}: "
          + (f"released {r.value:.6g}" if r.released else "bottom (⊥: the test failed, no value)"))
    print(f"ε charged {r.epsilon_charged:.6g} of {r.epsilon_reserved:.6g} reserved (output DP, docs/PTR.md); "
          f"δ {r.delta:g}; proposal {r.proposed_scale!r}")
    return 0


def register(subparsers) -> None:
    s = subparsers.add_parser("ptr", help="propose-test-release: robust median, IQR, trimmed mean "
                              "(⊥ when the data are not stable; ⊥ keeps only the tests' ε)")
    s.add_argument("statistic", choices=sorted(NAMES), help="the statistic")
    s.add_argument("table", help="the table (charged)")
    s.add_argument("column", help="a numeric column with catalog bounds")
    s.add_argument("--epsilon", type=_float, required=True, help="ε reserved (the worst case)")
    s.add_argument("--delta", type=_float, required=True, help="δ, charged whatever the branch")
    s.add_argument("--where", default=None, help="a row filter (SQL condition)")
    s.add_argument("--alpha", type=_float, default=None, help="trimmed-mean: the fraction trimmed (α/2 each end)")
    s.add_argument("--bound", type=_float, default=None, help="median/trimmed-mean: the proposed bound β")
    s.add_argument("--rows-hint", type=int, default=None,
                   help="median/trimmed-mean without --bound: a public estimate of the rows (steers the proposal)")
    s.add_argument("--base", type=_float, default=1.1, help="ratio of M_IQR's log bins (default 1.1)")
    s.add_argument("--split", type=_float, default=0.5, help="fraction of ε for the scale stage (default 0.5)")
    s.add_argument("--max-rows", type=int, default=None, metavar="M",
                   help="rows per unit for this run (replaces the catalog's max_rows_per_unit)")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    _common(s)
    s.set_defaults(func=cmd_ptr)
