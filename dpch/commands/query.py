"""`dpch query`, `dpch explain` and `dpch catalog register|update|show|list|drop`.

    dpch query "SELECT region, COUNT(*) FROM purchases GROUP BY region" --epsilon 1 [--delta 1e-6]
    dpch explain "SELECT AVG(age) FROM purchases" --epsilon 1
    dpch catalog register purchases --privacy-unit user_id --bounds amount=0:500 --bounds age=18:100 \\
        --max-groups 1 --max-rows 10 --public-keys region=EU,US,ASIA
    dpch catalog register tpch.nation --public
    dpch catalog register tpch.lineitem --references l_orderkey=tpch.orders.o_orderkey --max-rows 100
    dpch catalog update purchases --bounds amount=0:800 --max-rows 20   # changes only what it names
    dpch catalog show purchases | dpch catalog list | dpch catalog drop purchases

Connection options (all subcommands): ``--data-dir DIR`` (embedded engine; default $DPCH_DATA_DIR or
./.dpch_data) or ``--server URL`` with ``--user/--password/--database``; ``--analyst NAME``
(default: the OS user); ``--ledger PATH``.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import warnings


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def _connect(args):
    import dpch

    target = args.server or args.data_dir
    return dpch.connect(target, user=args.user, password=args.password, database=args.database,
                        analyst=args.analyst, ledger_path=args.ledger)


def _common(sp) -> None:
    g = sp.add_argument_group("connection")
    g.add_argument("--data-dir", default=None, help="embedded engine data directory")
    g.add_argument("--server", default=None, metavar="URL", help="ClickHouse server, e.g. http://localhost:8123")
    g.add_argument("--user", default="default")
    g.add_argument("--password", default="")
    g.add_argument("--database", default="default")
    g.add_argument("--analyst", default=None, help="analyst name charged in the ledger (default: OS user)")
    g.add_argument("--ledger", default=None, metavar="PATH", help="ledger file")


def _query_args(sp) -> None:
    sp.add_argument("sql", help="the analyst SQL (one SELECT)")
    sp.add_argument("--epsilon", type=_float, required=True)
    sp.add_argument("--delta", type=_float, default=0.0)
    sp.add_argument("--mechanism", choices=["auto", "laplace", "gaussian", "bounded_laplace", "mixed"], default="auto",
                    help="noise: bounded_laplace (thesis §5.5: outputs in a public range, --output-range for "
                         "COUNT/SUM, AVG in its value bounds; delta > 0) or mixed (thesis §5.3, sound variant; "
                         "delta > 0) besides laplace/gaussian/auto")
    sp.add_argument("--output-range", action="append", default=[], metavar="[COLUMN=]LO,HI",
                    help="with --mechanism bounded_laplace: the public output range of every COUNT/SUM, or of "
                         "one output column (repeatable)")
    sp.add_argument("--mixed-rule", choices=["thesis", "variance"], default=None,
                    help="with --mechanism mixed: the branch rule (default thesis: Gaussian iff Δ <= √π·δ·ε/2)")
    sp.add_argument("--selection", choices=["auto", "optimal", "gaussian", "laplace", "weighted_gaussian"],
                    default="auto", help="private partition selection rule (GROUP BY without public keys, "
                    "delta > 0; weighted_gaussian: k > 1, else the Gaussian threshold)")
    sp.add_argument("--top-k", choices=["auto", "peeling", "post_processing"], default="auto",
                    help="how ORDER BY <COUNT/SUM> LIMIT n is answered: peeling permute-and-flip, then "
                         "the chosen groups' values; or every group noised and sorted")
    sp.add_argument("--weight", action="append", default=[], metavar="LABEL=W",
                    help="budget weight for an output column/quantity label/partition_selection/"
                         "top_k_selection (repeatable)")
    sp.add_argument("--keys", action="append", default=[], metavar="KEY=V1,V2,...",
                    help="public key values for a GROUP BY key for this query (repeatable)")
    sp.add_argument("--max-groups", type=_bound, default=None, metavar="K|auto",
                    help="groups per unit for this query (replaces the catalog's max_groups_contributed); "
                         "auto: chosen from the data with a share of ε (--auto-share)")
    sp.add_argument("--max-rows", type=_bound, default=None, metavar="M|auto",
                    help="rows per unit for this query (replaces the catalog's max_rows_per_unit); auto: as above")
    sp.add_argument("--bounds", action="append", default=[], metavar="auto|COLUMN=auto|COLUMN=LO:HI",
                    help="clipping bounds for this query (replace the catalog's); auto: every numeric column an "
                         "aggregate reads, chosen from the data with a share of ε")
    sp.add_argument("--auto-share", type=_float, default=None, metavar="S",
                    help="share of ε that chooses 'auto' bounds (default 0.1)")
    sp.add_argument("--bias-share", type=_float, default=None, metavar="S",
                    help="share of ε that measures the bias of bounding (units cut, values clipped)")
    sp.add_argument("--max-rows-per-group", type=int, default=None, metavar="C",
                    help="rows per unit and group for this query (replaces the catalog's max_rows_per_group)")
    _common(sp)


def _options(args) -> dict:
    opts: dict = {"mechanism": args.mechanism}
    if args.selection != "auto":
        opts["selection"] = args.selection
    if args.top_k != "auto":
        opts["top_k"] = args.top_k
    if args.weight:
        weights = {}
        for w in args.weight:
            label, _, value = w.rpartition("=")
            if not label:
                raise SystemExit(f"dpch: error: --weight expects LABEL=W, got {w!r}")
            weights[label] = _float(value)
        opts["weights"] = weights
    if args.keys:
        opts["keys"] = {k: v for k, v in (_parse_keys(item) for item in args.keys)}
    if args.output_range:
        opts["output_range"] = _output_range(args.output_range)
    if args.mixed_rule is not None:
        opts["mixed_rule"] = args.mixed_rule
    for flag, name in (("max_groups", "max_groups_contributed"), ("max_rows", "max_rows_per_unit"),
                       ("max_rows_per_group", "max_rows_per_group")):
        if getattr(args, flag) is not None:
            opts[name] = getattr(args, flag)
    for flag in ("auto_share", "bias_share"):
        if getattr(args, flag, None) is not None:
            opts[flag] = getattr(args, flag)
    if getattr(args, "bounds", None):
        opts["bounds"] = _query_bounds(args.bounds)
    return opts


def _query_bounds(items: list[str]):
    """--bounds auto, or COLUMN=auto / COLUMN=LO:HI (repeatable): the option bounds."""
    if items == ["auto"]:
        return "auto"
    out: dict = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise SystemExit(f"dpch: error: --bounds expects auto, COLUMN=auto or COLUMN=LO:HI, got {item!r}")
        if value.strip().lower() == "auto":
            out[name] = "auto"
            continue
        lo, _, hi = value.partition(":")
        try:
            out[name] = (float(lo), float(hi))
        except ValueError:
            raise SystemExit(f"dpch: error: --bounds {item!r}: LO:HI must be two numbers") from None
    return out


def _bound(text: str):
    """A contribution bound: a positive integer or 'auto' (checked by QueryOptions)."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or auto, got {text!r}") from None


def _output_range(items: list[str]):
    """--output-range LO,HI (every COUNT/SUM) or COLUMN=LO,HI (repeatable): the option
    output_range (checked by QueryOptions, which names the parameter in its errors)."""
    from dpch.errors import InvalidParameter

    whole, per = None, {}
    for item in items:
        name, sep, pair = item.rpartition("=")
        parts = pair.split(",")
        if len(parts) != 2:
            raise InvalidParameter("--output-range takes LO,HI or COLUMN=LO,HI")
        try:
            rng = (float(parts[0]), float(parts[1]))
        except ValueError:
            raise InvalidParameter("--output-range takes two numbers LO,HI") from None
        if sep:
            per[name] = rng
        elif whole is not None:
            raise InvalidParameter("--output-range LO,HI given twice")
        else:
            whole = rng
    if whole is not None and per:
        raise InvalidParameter("--output-range: give LO,HI for all columns or COLUMN=LO,HI, not both")
    return whole if whole is not None else per


def _parse_value(text: str):
    try:
        return int(text)
    except ValueError:
        pass
    try:
        f = float(text)
        if math.isfinite(f):
            return f
    except ValueError:
        pass
    return text


def _parse_keys(item: str) -> tuple[str, list]:
    name, sep, values = item.partition("=")
    if not sep or not name:
        raise SystemExit(f"dpch: error: expected KEY=V1,V2,..., got {item!r}")
    return name, [_parse_value(v) for v in values.split(",") if v != ""]


def _print_df(df, fmt: str, with_ci: bool) -> None:
    if fmt == "csv":
        df.to_csv(sys.stdout, index=False)
    elif fmt == "json":
        print(df.to_json(orient="records"))
    else:
        print(df.to_string(index=False))
    if "epsilon_spent" not in df.attrs:
        return
    from dpch.postprocess import spend_summary

    line = spend_summary(df)
    if not with_ci:
        line = line.replace("intervals available", "intervals: add --ci")
    # the table gets its summary under it; csv/json keep stdout machine-readable
    print(line if fmt == "table" else f"dpch: {line}", file=sys.stdout if fmt == "table" else sys.stderr)
    for bias_line in _bias_lines(df.attrs.get("bias")):
        print(bias_line if fmt == "table" else f"dpch: {bias_line}", file=sys.stdout if fmt == "table" else sys.stderr)


def _bias_lines(bias) -> list[str]:
    """The answer's bias estimate (noisy shares) and its warnings, one line each."""
    if not bias:
        return []
    parts = [f"{label} {bias[key]:.1%}" for key, label in (("rows_dropped_share", "rows dropped"),
                                                           ("units_cut_share", "units cut"),
                                                           ("values_clipped_share", "units with clipped values"))
             if bias.get(key) is not None]
    chosen = ", ".join(f"{c['name']}={c['value']}" for c in bias.get("choices", []))
    lines = [f"bias of bounding (estimated, noisy): {', '.join(parts) or 'not measured'}"
             + (f"; bounds chosen from the data: {chosen}" if chosen else "")]
    return lines + [f"warning: {w}" for w in bias.get("warnings", [])]


def _print_remaining(db, df) -> None:
    from dpch.errors import DPCHError

    dataset = df.attrs.get("dataset")
    if not dataset:
        return
    try:
        print(f"budget of {db.analyst} on {dataset}: {db.remaining(dataset)}", file=sys.stderr)
    except DPCHError:
        pass


def cmd_query(args) -> int:
    opts = _options(args)
    opts["with_ci"] = args.ci
    with _connect(args) as db:
        with warnings.catch_warnings():  # the bias warnings are printed as lines under the answer
            warnings.filterwarnings("ignore", message="dpch: ")
            df = db.query(args.sql, epsilon=args.epsilon, delta=args.delta, **opts)
        _print_df(df, args.format, args.ci)
        _print_remaining(db, df)
    return 0


def cmd_explain(args) -> int:
    with _connect(args) as db:
        ex = db.explain(args.sql, epsilon=args.epsilon, delta=args.delta, **_options(args))
        if args.json:
            print(json.dumps(ex.to_dict(), indent=2, default=str))
        else:
            print(ex)
    return 0


def _parse_bounds(items: list[str]) -> dict:
    bounds = {}
    for item in items:
        col, sep, rng = item.partition("=")
        if sep and col and rng.strip().lower() == "auto":
            bounds[col] = "auto"  # chosen per query from the data
            continue
        lo, sep2, hi = rng.partition(":")
        if not (sep and sep2 and col):
            raise SystemExit(f"dpch: error: --bounds expects COL=LO:HI or COL=auto, got {item!r}")
        bounds[col] = (_float(lo), _float(hi))
    return bounds


def _parse_references(items: list[str]) -> dict:
    refs = {}
    for item in items:
        col, sep, target = item.partition("=")
        if not (sep and col and target.count(".") in (1, 2)):
            raise SystemExit(f"dpch: error: --references expects COL=DB.TABLE.COL, got {item!r}")
        refs[col] = target
    return refs


def cmd_catalog_register(args) -> int:
    with _connect(args) as db:
        entry = db.catalog.register(
            args.table, privacy_unit=args.privacy_unit, neighbour=args.neighbour,
            bounds=_parse_bounds(args.bounds), max_groups_contributed=args.max_groups,
            max_rows_per_unit=args.max_rows, max_rows_per_group=args.max_rows_per_group,
            public_keys=dict(_parse_keys(k) for k in args.public_keys),
            columns=args.columns.split(",") if args.columns else None, rotate_salt=args.rotate_salt,
            public=args.public, references=_parse_references(args.references), replace=args.replace,
            distributed=dict(zip(("cluster", "local_table", "sharding_key"), args.distributed)) if args.distributed else None)
        print(entry.describe())
    return 0


def cmd_catalog_update(args) -> int:
    changes: dict = {}
    for name, value in (("privacy_unit", args.privacy_unit), ("neighbour", args.neighbour),
                        ("max_groups_contributed", args.max_groups), ("max_rows_per_unit", args.max_rows),
                        ("max_rows_per_group", args.max_rows_per_group)):
        if value is not None:
            changes[name] = value
    if args.rotate_salt:
        changes["rotate_salt"] = True
    bounds = dict(_parse_bounds(args.bounds))
    bounds.update({col: None for col in args.drop_bounds})
    keys = dict(_parse_keys(k) for k in args.public_keys)
    keys.update({col: None for col in args.drop_public_keys})
    with _connect(args) as db:
        entry = db.catalog.update(args.table, bounds=bounds, public_keys=keys, **changes)
        print(entry.describe())
    return 0


def cmd_catalog_show(args) -> int:
    with _connect(args) as db:
        entry = db.catalog.get(args.table)
        print(json.dumps(entry.to_dict(), indent=2) if args.json else entry.describe())
    return 0


def cmd_catalog_list(args) -> int:
    with _connect(args) as db:
        for entry in db.catalog.list():
            print(f"{entry.table}\tunit={entry.privacy_unit or '(row level)'}\t{entry.neighbour}")
    return 0


def cmd_catalog_drop(args) -> int:
    with _connect(args) as db:
        db.catalog.drop(args.table)
        print(f"dropped {args.table} from the privacy catalog")
    return 0


def cmd_catalog_accelerate(args) -> int:
    with _connect(args) as db:
        if args.list or args.drop or args.drop_stale:
            if args.drop or args.drop_stale:
                for name in db.drop_accelerations(args.table, stale_only=args.drop_stale):
                    print(f"dropped {name}")
            for a in db.accelerations(args.table):
                print(f"{a.name}\t{a.method}\tGROUP BY {', '.join(a.group_by) or '(none)'}\tcolumns {', '.join(a.columns) or '-'}"
                      f"\t{'current' if a.current else 'STALE (catalog changed; accelerate again)'}")
            return 0
        a = db.accelerate(args.table, args.group_by, args.columns.split(",") if args.columns else None,
                          materialize=not args.no_materialize, method=args.method)
        kind = "projection" if a.method == "projection" else "per-unit table dpch_accel."
        print(f"{kind}{a.name} on {a.table}: per-unit states for GROUP BY {', '.join(a.group_by) or '(none)'}, "
              f"SUM/AVG of {', '.join(a.columns) or '(no columns)'}; queries without a WHERE on other "
              "columns now read it")
    return 0


def register(subparsers) -> None:
    q = subparsers.add_parser("query", help="answer a SELECT with differential privacy (charges the budget)")
    _query_args(q)
    q.add_argument("--format", choices=["table", "csv", "json"], default="table")
    q.add_argument("--ci", action="store_true", help="add <col>_lo/<col>_hi columns")
    q.set_defaults(func=cmd_query)

    e = subparsers.add_parser("explain", help="show the rewritten SQL, sensitivities and budget split (free)")
    _query_args(e)
    e.add_argument("--json", action="store_true")
    e.set_defaults(func=cmd_explain)

    c = subparsers.add_parser("catalog", help="manage the privacy catalog")
    c.set_defaults(func=lambda args: (c.print_help(), 2)[1])
    sub = c.add_subparsers(dest="catalog_command", metavar="ACTION")
    r = sub.add_parser("register", help="register a table (a registered one only with --replace; see update)")
    r.add_argument("table")
    r.add_argument("--privacy-unit", default=None, help="privacy unit column (omit for row-level privacy)")
    r.add_argument("--neighbour", choices=["add_remove", "substitute"], default="add_remove")
    r.add_argument("--bounds", action="append", default=[], metavar="COL=LO:HI")
    r.add_argument("--max-groups", type=_bound, default=1, help="max_groups_contributed (k), or auto (chosen per query)")
    r.add_argument("--max-rows", type=_bound, default=1, help="max_rows_per_unit (M), or auto (chosen per query)")
    r.add_argument("--max-rows-per-group", type=int, default=None)
    r.add_argument("--public-keys", action="append", default=[], metavar="COL=V1,V2,...")
    r.add_argument("--columns", default=None, help="comma-separated registered columns (default: all)")
    r.add_argument("--rotate-salt", action="store_true")
    r.add_argument("--public", action="store_true", help="a public table: not protected, joins freely, never charged")
    r.add_argument("--references", action="append", default=[], metavar="COL=DB.TABLE.COL",
                   help="a foreign key to a key of a registered table (the unit is reached through it)")
    r.add_argument("--replace", action="store_true",
                   help="replace a registered table's whole entry (what is not named is dropped)")
    r.add_argument("--distributed", nargs=3, metavar=("CLUSTER", "LOCAL_TABLE", "SHARDING_KEY"), default=None,
                   help="a Distributed table: its cluster, local table and sharding key, checked against its "
                        "definition (a key that is a function of the unit runs the per-unit stage on each shard)")
    _common(r)
    r.set_defaults(func=cmd_catalog_register)
    u = sub.add_parser("update", help="change only the named parts of a registered table's entry")
    u.add_argument("table")
    u.add_argument("--privacy-unit", default=None)
    u.add_argument("--neighbour", choices=["add_remove", "substitute"], default=None)
    u.add_argument("--bounds", action="append", default=[], metavar="COL=LO:HI|COL=auto",
                   help="set a column's bounds (auto: chosen per query from the data)")
    u.add_argument("--drop-bounds", action="append", default=[], metavar="COL", help="remove a column's bounds")
    u.add_argument("--max-groups", type=_bound, default=None, help="max_groups_contributed (k), or auto")
    u.add_argument("--max-rows", type=_bound, default=None, help="max_rows_per_unit (M), or auto")
    u.add_argument("--max-rows-per-group", type=int, default=None)
    u.add_argument("--public-keys", action="append", default=[], metavar="COL=V1,V2,...")
    u.add_argument("--drop-public-keys", action="append", default=[], metavar="COL")
    u.add_argument("--rotate-salt", action="store_true")
    _common(u)
    u.set_defaults(func=cmd_catalog_update)
    s = sub.add_parser("show", help="show one entry")
    s.add_argument("table")
    s.add_argument("--json", action="store_true")
    _common(s)
    s.set_defaults(func=cmd_catalog_show)
    ls = sub.add_parser("list", help="list catalogued tables")
    _common(ls)
    ls.set_defaults(func=cmd_catalog_list)
    d = sub.add_parser("drop", help="remove a table from the catalog")
    d.add_argument("table")
    _common(d)
    d.set_defaults(func=cmd_catalog_drop)
    a = sub.add_parser("accelerate", help="add a per-unit projection that serves user-level GROUP BY queries "
                       "(or --list/--drop them)")
    a.add_argument("table")
    a.add_argument("--group-by", action="append", default=[], metavar="KEY",
                   help="a GROUP BY key (repeat for several; none: ungrouped queries)")
    a.add_argument("--columns", default=None, help="comma-separated bounded columns to hold SUM/AVG for "
                   "(default: every bounded column)")
    a.add_argument("--method", choices=["projection", "table"], default="projection",
                   help="projection (default): a per-unit projection of the table; table: a per-unit "
                   "AggregatingMergeTree in dpch_accel kept by a materialized view (no planning cost for other "
                   "queries; falls back to the table after deletes/updates until built again)")
    a.add_argument("--no-materialize", action="store_true", help="only new parts get the projection")
    a.add_argument("--list", action="store_true", help="list DPCH's projections and per-unit tables of the table")
    a.add_argument("--drop", action="store_true", help="drop all of DPCH's projections and per-unit tables of the table")
    a.add_argument("--drop-stale", action="store_true", help="drop the stale ones only")
    _common(a)
    a.set_defaults(func=cmd_catalog_accelerate)
