"""`dpch audit "SQL" --epsilon 1.0`: empirical privacy audit of one query on neighbouring datasets
(see dpch.audit and docs/AUDIT.md). Exit status 0 when consistent, 1 on a VIOLATION."""
from __future__ import annotations

import argparse


def register(subparsers) -> None:
    from dpch.audit.neighbours import KINDS

    p = subparsers.add_parser(
        "audit", help="empirically test a query's privacy claim on neighbouring datasets",
        description="Run the query many times on a dataset D and a neighbour D′ built in the engine, "
                    "choose output events on half the samples, certify them on the other half, and "
                    "report the empirical ε lower bound with a verdict. Trusted/admin operation: it "
                    "runs the query thousands of times, so use test or synthetic data.")
    p.add_argument("sql", help="the query to audit (a dp_* SQL function query, or analyst SQL with --via controller)")
    p.add_argument("--epsilon", type=float, required=True, help="the claimed ε")
    p.add_argument("--delta", type=float, default=0.0, help="the claimed δ (default 0)")
    p.add_argument("--neighbour", "--neighbor", default=None, choices=KINDS,
                   help="neighbour relation (default remove-row; with --via controller the catalog's)")
    p.add_argument("--samples", type=int, default=20_000, help="runs per side (default 20000)")
    p.add_argument("--confidence", type=float, default=0.95, help="confidence of ε_LB (default 0.95)")
    p.add_argument("--table", default=None, help="the table to vary, when the query reads several")
    p.add_argument("--where", default=None,
                   help="choose the record: SQL predicate selecting the row (or unit) to remove/replace")
    p.add_argument("--record", action="append", default=[], metavar="COLUMN=VALUE",
                   help="choose the record: a column value of the row to add/substitute (repeatable)")
    p.add_argument("--unit-column", default=None, help="privacy unit column for *-unit neighbours")
    p.add_argument("--via", choices=["sql", "controller"], default="sql",
                   help="run the SQL as written (default) or audit the controller's rewrite")
    p.add_argument("--selection", default=None, metavar="RULE",
                   help="with --via controller: the partition selection rule, as dpch query --selection "
                        "(checked by the planner)")
    p.add_argument("--top-k", default=None, metavar="METHOD",
                   help="with --via controller: how a top-n query is answered (auto, peeling, post_processing), "
                        "as dpch query --top-k (checked by the planner)")
    p.add_argument("--methods", default="search,logistic,boosting",
                   help="comma-separated: search, logistic, boosting (default all)")
    p.add_argument("--pilot", type=int, default=1000, help="runs per candidate in the worst-case search")
    p.add_argument("--max-rows", type=int, default=10_000, help="sample larger tables down to this many rows")
    p.add_argument("--report-dir", default=None, help="write report.json, report.txt and PNG plots here")
    p.add_argument("--json", action="store_true", help="print the JSON report instead of text")
    p.add_argument("--seed", type=int, default=0, help="seed of the classifiers (not of the noise)")
    p.add_argument("--data-dir", default=None, help="embedded data directory (default $DPCH_DATA_DIR or ./.dpch_data)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_run)


def _parse_record(items: list[str]) -> dict[str, object]:
    from dpch.errors import InvalidParameter

    out: dict[str, object] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep or not name.strip():
            raise InvalidParameter("--record takes COLUMN=VALUE")
        raw = raw.strip()
        value: object = raw
        for conv in (int, float):
            try:
                value = conv(raw)
                break
            except ValueError:
                continue
        if isinstance(value, str) and len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"":
            value = raw[1:-1]
        out[name.strip()] = value
    return out


def _run(args: argparse.Namespace) -> int:
    import sys

    import dpch
    from dpch.audit import audit
    from dpch.errors import InvalidParameter

    methods = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    if not methods:
        raise InvalidParameter("--methods must name at least one method")
    options = {}
    for flag, name, value in (("--selection", "selection", args.selection), ("--top-k", "top_k", args.top_k)):
        if value is not None:
            if args.via != "controller":
                raise InvalidParameter(f"{flag} needs --via controller")
            options[name] = value
    options = options or None
    try:
        with dpch.connect(args.data_dir) as db:
            report = audit(db, args.sql, epsilon=args.epsilon, delta=args.delta,
                           neighbour=args.neighbour, samples=args.samples,
                           confidence=args.confidence, table=args.table, where=args.where,
                           record=_parse_record(args.record) or None, unit_column=args.unit_column,
                           via=args.via, methods=methods, pilot=args.pilot, max_rows=args.max_rows,
                           report_dir=args.report_dir, progress=not args.no_progress and sys.stderr.isatty(),
                           seed=args.seed, options=options)
    except ValueError as exc:
        raise InvalidParameter(str(exc)) from exc
    print(report.to_json() if args.json else report.text())
    return 1 if report.violation else 0
