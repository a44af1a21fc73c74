"""`dpch svt`: a sparse-vector (AboveThreshold) session over a file of test queries (dpch.svt).

    dpch svt --dataset demo.purchases --threshold 1000 --epsilon 1 --max-positives 3 --file queries.sql

One query per line (blank lines and lines starting with ``--`` are skipped); each must be an
ungrouped COUNT or SUM over the dataset. Prints one line per query, ``ABOVE`` or ``below`` and the
query (``REJECTED`` with the reason for a query the session refuses: it ran nothing and consumed
nothing), stops after max-positives ⊤ answers, then prints the ε spent (settled by the ledger at
ε1 + (c′/c)·ε2). Exit status 0; 1 if a query was rejected; 2 for bad arguments (nothing charged).
Connection options as for ``dpch query``.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

from .query import _common, _connect, _float


def _fail(message: str) -> int:
    print(f"dpch: error: {message}", file=sys.stderr)
    return 2


def read_queries(path: str) -> list[str]:
    text = Path(path).read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("--")]


def cmd_svt(args) -> int:
    from dpch.errors import DPCHError, InvalidParameter, QueryRejected

    if not (math.isfinite(args.epsilon) and args.epsilon > 0):
        return _fail("--epsilon must be a finite number > 0")
    if args.max_positives < 1:
        return _fail("--max-positives must be an integer >= 1")
    if not math.isfinite(args.threshold):
        return _fail("--threshold must be a finite number")
    if args.split is not None and not (0.0 < args.split < 1.0):
        return _fail("--split (the fraction of ε for the threshold noise) must lie in (0, 1)")
    try:
        queries = read_queries(args.file)
    except OSError as exc:
        return _fail(f"cannot read --file {args.file!r}: {exc.strerror or type(exc).__name__}")
    except UnicodeDecodeError:
        return _fail(f"--file {args.file!r} is not UTF-8 text")
    if not queries:
        return _fail(f"--file {args.file!r} holds no query (one per line); nothing charged")
    rejected = 0
    with _connect(args) as db:
        svt = db.sparse_vector(args.dataset, threshold=args.threshold, epsilon=args.epsilon,
                               max_positives=args.max_positives, split=args.split)
        try:
            svt.refuse_if_none_answerable(queries)  # before the charge
        except (QueryRejected, InvalidParameter) as exc:
            return _fail(str(exc))
        with svt:
            for i, sql in enumerate(queries):
                if svt.positives >= svt.max_positives:
                    print(f"stopped: {svt.max_positives} ⊤ answer(s) reached; {len(queries) - i} query(ies) not run")
                    break
                try:
                    above = svt.above(sql)
                except (QueryRejected, InvalidParameter) as exc:
                    rejected += 1
                    print(f"REJECTED\t{sql}\t{exc}")
                    continue
                print(f"{'ABOVE' if above else 'below'}\t{sql}")
        print(f"ε spent: {svt.epsilon_spent:.6g} of the {args.epsilon:g} reserved ({svt.positives} ⊤ of at most "
              f"{args.max_positives}; odp_privacy_accounting.md Lemma 8)")
        try:
            print(f"budget of {db.analyst} on {svt.dataset}: {db.remaining(svt.dataset)}", file=sys.stderr)
        except DPCHError:
            pass
    return 1 if rejected else 0


def register(subparsers) -> None:
    s = subparsers.add_parser("svt", help="sparse vector (AboveThreshold): which queries exceed a threshold "
                              "(charges ε once, settles ε1 + (c'/c)·ε2)")
    s.add_argument("--dataset", required=True, help="the table every query reads (charged)")
    s.add_argument("--threshold", type=_float, required=True, help="T, in the queries' value units")
    s.add_argument("--epsilon", type=_float, required=True, help="ε = ε1 + ε2 reserved for the session")
    s.add_argument("--max-positives", type=int, default=1, metavar="C", help="stop after C ⊤ answers (default 1)")
    s.add_argument("--split", type=_float, default=None, metavar="F",
                   help="ε1 = F·ε for the threshold noise (default: ε1/ε2 = 1/(2C)^(2/3))")
    s.add_argument("--file", required=True, help="test queries, one per line (ungrouped COUNT or SUM)")
    _common(s)
    s.set_defaults(func=cmd_svt)
