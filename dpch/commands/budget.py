"""`dpch budget set|show|history|events|reset`: administer the privacy-budget ledger.

Every subcommand takes `--data-dir DIR` or `--ledger PATH` (default: $DPCH_LEDGER, else
<data dir>/ledger.sqlite with data dir = $DPCH_DATA_DIR or ./.dpch_data). Only `set` creates a missing ledger; the others refuse
to run on a missing one. Bad arguments exit with code 2.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import math
import sys
from pathlib import Path
from typing import Sequence

from ..accounting import ACCOUNTANTS, _fmt, get_accountant
from ..budget_units import budget_report, report_for
from ..errors import InvalidParameter
from ..ledger import Ledger, default_ledger_path


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0: {text!r}")
    return v


def _unit_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(v) or not 0 <= v < 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1): {text!r}")
    return v


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1: {text!r}")
    return v


def register(subparsers) -> None:
    p = subparsers.add_parser("budget", help="set, show, reset privacy budgets (the ledger)",
                              description="Administer the privacy-budget ledger.")
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])
    sub = p.add_subparsers(dest="budget_command", metavar="ACTION")

    def common(sp):
        where = sp.add_mutually_exclusive_group()
        where.add_argument("--data-dir", default=None, metavar="DIR", help="data directory holding ledger.sqlite")
        where.add_argument("--ledger", default=None, metavar="PATH|URL",
                           help=f"ledger file or postgresql:// URL (default: $DPCH_LEDGER or $DPCH_DATA_DIR/ledger.sqlite; now {default_ledger_path()})")

    s = sub.add_parser("set", help="set or change a budget")
    s.add_argument("--analyst", required=True)
    s.add_argument("--dataset", required=True)
    s.add_argument("--epsilon", required=True, type=_positive_float)
    s.add_argument("--delta", default=0.0, type=_unit_float)
    s.add_argument("--accountant", default="basic", choices=list(ACCOUNTANTS))
    s.add_argument("--max-queries", type=_positive_int, default=None,
                   help="k (optimal, declared advanced/adaptive), n (paper_gaussian), else a cap")
    s.add_argument("--per-query-epsilon", type=_positive_float, default=None, help="declared per-query ε0")
    s.add_argument("--per-query-delta", type=_unit_float, default=None, help="declared per-query δ0 (default 0)")
    s.add_argument("--gamma", type=_positive_float, default=None, help="γ of the paper's Thm 5 (default ε/2)")
    s.add_argument("--mechanism-delta", type=_unit_float, default=None,
                   help="part of δ for the mechanisms' own δ (advanced filter: default δ/2; zcdp: default 0)")
    common(s)
    s.set_defaults(func=_cmd_set)

    sh = sub.add_parser("show", help="budgets with spent and remaining")
    sh.add_argument("--analyst")
    sh.add_argument("--dataset")
    common(sh)
    sh.set_defaults(func=_cmd_show)

    h = sub.add_parser("history", help="the charges (all generations)")
    h.add_argument("--analyst")
    h.add_argument("--dataset")
    h.add_argument("--limit", type=_positive_int, default=None, help="only the last N charges")
    h.add_argument("--full-query", action="store_true", help="print the whole query text")
    common(h)
    h.set_defaults(func=_cmd_history)

    e = sub.add_parser("events", help="the audit log: budget changes, charges, rejections, resets")
    e.add_argument("--analyst")
    e.add_argument("--dataset")
    e.add_argument("--kind")
    e.add_argument("--limit", type=_positive_int, default=None)
    common(e)
    e.set_defaults(func=_cmd_events)

    r = sub.add_parser("reset", help="forget what a budget has spent (recorded; needs --yes-i-know)")
    r.add_argument("--analyst", required=True)
    r.add_argument("--dataset", required=True)
    r.add_argument("--yes-i-know", action="store_true",
                   help="confirm: the privacy already spent is real; a reset only changes the bookkeeping")
    common(r)
    r.set_defaults(func=_cmd_reset)

    bk = sub.add_parser("backup", help="write a consistent copy of the ledger (SQLite online backup)")
    bk.add_argument("--to", required=True, metavar="FILE", help="target file (must not exist)")
    common(bk)
    bk.set_defaults(func=_cmd_backup)

    v = sub.add_parser("verify", help="check the ledger: pages, checksums, event chain, totals, histories")
    common(v)
    v.set_defaults(func=_cmd_verify)


def _open(args, *, create: bool = False) -> Ledger:
    if args.data_dir:
        return Ledger(Path(args.data_dir) / "ledger.sqlite", create=create)
    return Ledger(args.ledger or default_ledger_path(), create=create)


def _ts(t: float) -> str:
    return _dt.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    line = lambda cells: "  ".join(c.ljust(widths[i]) for i, c in enumerate(cells)).rstrip()
    out = [line(headers), line(["-" * w for w in widths])]
    out += [line(r) for r in rows]
    return "\n".join(out)


def _cmd_set(args) -> int:
    params = {"max_queries": args.max_queries, "per_query_epsilon": args.per_query_epsilon,
              "per_query_delta": args.per_query_delta, "gamma": args.gamma, "mechanism_delta": args.mechanism_delta}
    with _open(args, create=True) as ledger:
        b = ledger.set_budget(args.analyst, args.dataset, args.epsilon, args.delta, args.accountant, **params)
        report = report_for(ledger, args.analyst, args.dataset)
        status = ledger.remaining(args.analyst, args.dataset)
    extra = ", ".join(f"{k}={_fmt(v) if isinstance(v, float) else v}" for k, v in b.params().items()
                      if v is not None and not (k == "per_query_delta" and v == 0))
    print(f"budget set: analyst {b.analyst} on dataset {b.dataset}: ε={_fmt(b.epsilon)}, δ={_fmt(b.delta)}, "
          f"accountant {b.accountant}" + (f" ({extra})" if extra else ""))
    print(report)
    print(f"in the accountant's own terms: {status.remaining.describe()}")
    return 0


def _cmd_show(args) -> int:
    with _open(args) as ledger:
        statuses = [s for s in ledger.budgets()
                    if (args.analyst is None or s.analyst == args.analyst) and (args.dataset is None or s.dataset == args.dataset)]
        charges = ledger.history(args.analyst, args.dataset) if statuses else []
    reports = [budget_report(s, [r.effective_cost() for r in charges if (r.analyst, r.dataset, r.generation)
                                 == (s.analyst, s.dataset, s.generation)]) for s in statuses]
    if not statuses:
        print("no budgets" + (" match" if args.analyst or args.dataset else " set"))
        return 0
    rows = []
    for s, rep in zip(statuses, reports):
        b = s.budget
        rows.append([s.analyst, s.dataset, b.accountant, _fmt(b.epsilon), _fmt(b.delta),
                     _fmt(s.spent.epsilon), _fmt(s.spent.delta), _fmt(rep.epsilon_left), _fmt(rep.delta_at),
                     "-" if s.spent.rho is None else f"{_fmt(s.spent.rho)}/{_fmt(get_accountant(b.accountant).limits(b).rho)}",
                     str(s.queries) + ("" if b.max_queries is None else f"/{b.max_queries}")])
    print(_table(["analyst", "dataset", "accountant", "ε", "δ", "ε spent", "δ spent", "ε left", "at δ", "ρ spent/budget",
                  "queries"], rows))
    for rep in reports:
        print(f"{rep.analyst} on {rep.dataset}: {rep}")
    return 0


def _cmd_history(args) -> int:
    with _open(args) as ledger:
        records = ledger.history(args.analyst, args.dataset)
    if args.limit:
        records = records[-args.limit:]
    if not records:
        print("no charges")
        return 0
    rows = []
    for r in records:
        q = r.query_text if args.full_query else (r.query_text[:48] + ("…" if len(r.query_text) > 48 else ""))
        q = " ".join(q.split())
        eps = _fmt(r.epsilon) if r.effective_epsilon == r.epsilon else f"{_fmt(r.epsilon)}→{_fmt(r.effective_epsilon)}"
        rows.append([str(r.id), _ts(r.created_at), r.analyst, r.dataset, str(r.generation), r.accountant, eps,
                     _fmt(r.delta), _fmt(r.rho), r.outcome, r.query_hash[:12], q])
    print(_table(["id", "time", "analyst", "dataset", "gen", "accountant", "ε", "δ", "ρ", "outcome", "query hash", "query"],
                 rows))
    return 0


def _cmd_events(args) -> int:
    with _open(args) as ledger:
        events = ledger.events(args.analyst, args.dataset, args.kind)
    if args.limit:
        events = events[-args.limit:]
    rows = []
    for e in events:
        d = e.detail
        if e.kind == "rejected":
            info = d.get("reason", "")
        elif e.kind == "charge":
            info = f"ε={_fmt(d.get('epsilon'))} δ={_fmt(d.get('delta'))} total ε={_fmt(d.get('total_epsilon'))}"
        elif e.kind == "budget_set":
            b = d.get("budget", {})
            info = f"ε={_fmt(b.get('epsilon'))} δ={_fmt(b.get('delta'))} {b.get('accountant')}"
        elif e.kind == "budget_reset":
            info = f"confirmed; forgot {d.get('charges_forgotten')} charges"
        else:
            info = ", ".join(f"{k}={v}" for k, v in sorted(d.items()))
        rows.append([str(e.id), _ts(e.ts), e.kind, e.analyst or "", e.dataset or "",
                     "" if e.charge_id is None else str(e.charge_id), info])
    print(_table(["id", "time", "event", "analyst", "dataset", "charge", "detail"], rows) if rows else "no events")
    return 0


def _cmd_reset(args) -> int:
    if not args.yes_i_know:
        print("dpch: error: reset forgets the privacy already spent; repeat with --yes-i-know to confirm",
              file=sys.stderr)
        with _open(args) as ledger:
            try:
                ledger.reset(args.analyst, args.dataset, confirm=False)
            except InvalidParameter:
                pass
        return 2
    with _open(args) as ledger:
        ledger.reset(args.analyst, args.dataset, confirm=True)
        status = ledger.remaining(args.analyst, args.dataset)
        report = report_for(ledger, args.analyst, args.dataset)
    print(f"budget reset: analyst {args.analyst} on dataset {args.dataset} (generation {status.generation}); {report}")
    return 0


def _cmd_backup(args) -> int:
    with _open(args) as ledger:
        ledger.backup(args.to)
    with Ledger(args.to, create=False) as copy:  # the copy opens and verifies as a ledger
        n = len(copy.history())
    print(f"ledger backed up to {args.to} ({n} charges); it opens as a ledger with --ledger {args.to}")
    return 0


def _cmd_verify(args) -> int:
    with _open(args) as ledger:  # opening runs the full check; an inconsistency raises LedgerError (exit 2)
        n = len(ledger.history())
        budgets = len(ledger.budgets())
    print(f"ledger ok: {budgets} budgets, {n} charges; checksums, event chain, running totals, histories and the "
          f"incremental accountant states (against a full recomputation) verified")
    return 0
