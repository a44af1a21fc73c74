"""`dpch load TABLE FILE... [--order-by COL]`: create a table in the embedded engine from CSV,
Parquet or JSON-lines files, with the schema ClickHouse infers (see dpch.load)."""
from __future__ import annotations

import argparse


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "load", help="create a table from CSV/Parquet/JSON-lines files (embedded engine)",
        description="Create TABLE from the files (paths or globs; format from the suffix: .csv, .tsv, "
                    ".parquet, .jsonl, optionally compressed), with the column types ClickHouse infers. "
                    "Then register it in the privacy catalog (dpch catalog register). Trusted operation: "
                    "it reads raw data and charges nothing.")
    p.add_argument("table", help="TABLE or DATABASE.TABLE (the database is created if missing)")
    p.add_argument("files", nargs="+", metavar="FILE", help="files or globs, e.g. data.csv or 'logs/*.parquet'")
    p.add_argument("--order-by", action="append", default=[], metavar="COL",
                   help="sorting key column, e.g. the privacy unit (repeatable; it must have no empty values)")
    p.add_argument("--format", default=None, help="ClickHouse input format, when the suffix does not tell "
                                                   "(e.g. CSVWithNames, Parquet, JSONEachRow)")
    p.add_argument("--if-exists", choices=["fail", "append", "replace"], default="fail",
                   help="when TABLE exists: fail (default), append to it, or replace it")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--data-dir", default=None, help="embedded data directory (default $DPCH_DATA_DIR or ./.dpch_data)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    import sys

    import dpch

    with dpch.connect(args.data_dir) as db:
        result = db.load(args.table, args.files, order_by=args.order_by or None, format=args.format,
                         if_exists=args.if_exists, progress=not args.no_progress and sys.stderr.isatty())
    print(result)
    return 0
