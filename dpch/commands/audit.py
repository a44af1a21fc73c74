"""`dpch audit "SQL" --epsilon 1.0`: empirical privacy audit of one query on neighbouring datasets
(see dpch.audit and docs/AUDIT.md). `dpch audit --svt --epsilon 1.0 --design`: the sparse-vector
session's audit, overall and per output-DP class (dpch.audit.svt, docs/AUDIT.md §10). Exit status
0 when consistent, 1 on a VIOLATION."""
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
    p.add_argument("sql", nargs="?", default=None,
                   help="the query to audit (a dp_* SQL function query, or analyst SQL with --via controller); "
                        "not with --svt")
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
    p.add_argument("--mechanism", default=None, metavar="NAME",
                   help="with --via controller: the noise mechanism, as dpch query --mechanism (e.g. "
                        "bounded_laplace, mixed; checked by the planner)")
    p.add_argument("--output-range", action="append", default=[], metavar="[COLUMN=]LO,HI",
                   help="with --via controller and --mechanism bounded_laplace: as dpch query --output-range")
    p.add_argument("--mixed-rule", default=None, metavar="RULE",
                   help="with --via controller and --mechanism mixed: thesis or variance")
    p.add_argument("--methods", default="search,logistic,boosting",
                   help="comma-separated: search, logistic, boosting (default all)")
    p.add_argument("--pilot", type=int, default=1000, help="runs per candidate in the worst-case search")
    p.add_argument("--max-rows", type=int, default=10_000, help="sample larger tables down to this many rows")
    p.add_argument("--report-dir", default=None, help="write report.json, report.txt and PNG plots here")
    p.add_argument("--json", action="store_true", help="print the JSON report instead of text")
    p.add_argument("--seed", type=int, default=0, help="seed of the classifiers (not of the noise)")
    p.add_argument("--data-dir", default=None, help="embedded data directory (default $DPCH_DATA_DIR or ./.dpch_data)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    g = p.add_argument_group("sparse vector (--svt; docs/AUDIT.md §10)")
    g.add_argument("--svt", action="store_true",
                   help="audit the sparse-vector session (dpch.svt) instead of one query: ε_LB overall and per "
                        "output class (c′ ⊤ answers) against the ε the session settles for that class")
    g.add_argument("--design", action="store_true",
                   help="build the near-tight design (dpch.audit.svt.svt_design) in --database and audit it")
    g.add_argument("--database", default="dpch_audit_svt", help="database for --design (default dpch_audit_svt)")
    g.add_argument("--d", dest="svt_d", default=None, metavar="TABLE", help="dataset D (without --design)")
    g.add_argument("--dprime", dest="svt_dprime", default=None, metavar="TABLE",
                   help="dataset D′, a neighbour of D (without --design)")
    g.add_argument("--queries", default=None, metavar="FILE",
                   help="test queries, one per line, {table} standing for the dataset (without --design)")
    g.add_argument("--threshold", type=float, default=None, help="the session's threshold T (--design: its own)")
    g.add_argument("--max-positives", "-c", type=int, default=1, help="c: stop after c ⊤ answers (default 1)")
    g.add_argument("--real-sessions", type=int, default=30,
                   help="genuine sessions per side checking the fast path (default 30; 0: skip)")
    g.add_argument("--slow", action="store_true", help="run every sample as a genuine session (no fast path)")
    g.add_argument("--analyst", default=None,
                   help="the analyst whose budget the sessions charge (default: the OS user; --design gives "
                        "it a large odp budget on the design's tables)")
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


def _svt_inputs(db, args: argparse.Namespace) -> tuple[str, str, list[str], float]:
    """(D, D′, queries, threshold) from --design or --d/--dprime/--queries/--threshold."""
    from dpch.audit.svt import build_svt_design, svt_design
    from dpch.errors import InvalidParameter

    if args.design:
        if args.svt_d or args.svt_dprime or args.queries:
            raise InvalidParameter("--design builds D, D′ and the queries: not with --d/--dprime/--queries")
        design = svt_design(args.epsilon, args.max_positives)
        d, dp, queries = build_svt_design(db, design, database=args.database)
        threshold = design.threshold if args.threshold is None else args.threshold
        return d, dp, queries, threshold
    missing = [flag for flag, v in (("--d", args.svt_d), ("--dprime", args.svt_dprime),
                                    ("--queries", args.queries), ("--threshold", args.threshold)) if v is None]
    if missing:
        raise InvalidParameter(f"--svt needs --design, or {', '.join(missing)}")
    try:
        with open(args.queries, encoding="utf-8") as f:
            queries = [line.strip() for line in f if line.strip() and not line.lstrip().startswith("--")]
    except OSError as exc:
        raise InvalidParameter(f"--queries: cannot read {args.queries}: {exc.strerror}") from None
    if not queries:
        raise InvalidParameter("--queries: the file has no query")
    if any("{table}" not in q for q in queries):
        raise InvalidParameter("--queries: every query must read {table} (the dataset, D or D′)")
    return args.svt_d, args.svt_dprime, queries, args.threshold


def _svt_json(report) -> str:
    import json

    return json.dumps({
        "epsilon": report.epsilon, "max_positives": report.max_positives, "samples": report.samples,
        "confidence": report.confidence, "settled_epsilon_per_class": list(report.claims),
        "certificates": [{"class": c.cls, "claimed": c.claimed, "epsilon_lb": c.epsilon_lb,
                          "violation": c.violation, "favours": c.favours, "k_d": c.k_d, "k_dprime": c.k_dprime,
                          "n": c.n, "event": ["".join("T" if b else "F" for b in a) for a in c.event]}
                         for c in report.certificates],
        "fast_path_p_value": report.fast_path_p_value, "real_sessions": report.real_sessions,
        "real_spent_ok": report.real_spent_ok, "violation": report.violation}, indent=2)


def _run_svt(args: argparse.Namespace) -> int:
    import dpch
    from dpch.audit.svt import audit_svt
    from dpch.errors import InvalidParameter

    if args.sql is not None:
        raise InvalidParameter("--svt audits the sparse-vector session: give no SQL (--design or --queries)")
    if args.max_positives < 1:
        raise InvalidParameter("--max-positives must be >= 1")
    if args.real_sessions < 0:
        raise InvalidParameter("--real-sessions must be >= 0")
    try:
        with dpch.connect(args.data_dir, analyst=args.analyst) as db:
            d, dp, queries, threshold = _svt_inputs(db, args)
            report = audit_svt(db, d, dp, queries, threshold, args.epsilon, args.max_positives,
                               samples=args.samples, real_sessions=args.real_sessions,
                               confidence=args.confidence, fast=not args.slow)
    except ValueError as exc:
        raise InvalidParameter(str(exc)) from exc
    print(_svt_json(report) if args.json else report.summary())
    return 1 if report.violation else 0


def _run(args: argparse.Namespace) -> int:
    import sys

    if args.svt:
        return _run_svt(args)
    if args.sql is None:
        from dpch.errors import InvalidParameter

        raise InvalidParameter("dpch audit needs the SQL to audit (or --svt)")

    import dpch
    from dpch.audit import audit
    from dpch.errors import InvalidParameter

    methods = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    if not methods:
        raise InvalidParameter("--methods must name at least one method")
    options = {}
    thesis = []
    if args.output_range:
        from dpch.commands.query import _output_range

        thesis.append(("--output-range", "output_range", _output_range(args.output_range)))
    for flag, name, value in (("--selection", "selection", args.selection), ("--top-k", "top_k", args.top_k),
                              ("--mechanism", "mechanism", args.mechanism),
                              ("--mixed-rule", "mixed_rule", args.mixed_rule), *thesis):
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
