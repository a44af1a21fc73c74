"""`dpch tune`: choose contribution bounds for a workload (dpch.tune, issue 29).

    dpch tune demo.purchases "SELECT region, COUNT(*) FROM demo.purchases GROUP BY region" \\
         --epsilon 0.1 --query-epsilon 0.5 [--plot tune.png] [--write]

Spends --epsilon (one charge, before anything runs) on noisy histograms of rows and groups per unit,
prints the candidates with the smallest estimated error (noise + bias, in rows) and the best one;
--write puts it into the catalog, --plot draws error against M. Connection options as for
``dpch query``.
"""
from __future__ import annotations

from .query import _common, _connect, _float


def cmd_tune(args) -> int:
    with _connect(args) as db:
        rep = db.tune(args.table, args.sql, epsilon=args.epsilon, query_epsilon=args.query_epsilon,
                      query_delta=args.query_delta, write=args.write)
        top = rep.table.sort_values("total_rows").head(args.top)
        print(top.to_string(index=False, float_format=lambda v: f"{v:,.1f}"))
        print(rep)
        for note in rep.notes:
            print(f"note: {note}")
        if args.plot:
            rep.plot(args.plot)
            print(f"plot: {args.plot}")
    return 0


def register(subparsers) -> None:
    s = subparsers.add_parser("tune", help="choose contribution bounds for a workload (spends a small declared ε)")
    s.add_argument("table", help="the catalogued table the workload reads")
    s.add_argument("sql", nargs="+", help="one or more queries of the workload")
    s.add_argument("--epsilon", type=_float, required=True, help="ε spent on the histograms (one charge)")
    s.add_argument("--query-epsilon", type=_float, required=True, help="ε each workload query will be run at")
    s.add_argument("--query-delta", type=_float, default=0.0, help="δ each workload query will be run at")
    s.add_argument("--write", action="store_true", help="put the best (k, M) into the catalog")
    s.add_argument("--plot", default=None, metavar="PNG", help="draw estimated error against M")
    s.add_argument("--top", type=int, default=10, help="how many candidates to print (default 10)")
    _common(s)
    s.set_defaults(func=cmd_tune)
