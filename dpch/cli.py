"""The `dpch` command line. Each subcommand lives in `dpch/commands/<name>.py` and exposes
`register(subparsers)`; this module only wires them together."""
from __future__ import annotations

import argparse
import importlib
import sys

from .errors import DPCHError

SUBCOMMAND_MODULES = ["demo", "query", "budget", "audit"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dpch", description="Differential Privacy for ClickHouse")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(f"dpch.commands.{name}")
        except ModuleNotFoundError as exc:  # a subcommand not built yet must not break the others
            if exc.name != f"dpch.commands.{name}":
                raise
            continue
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except DPCHError as exc:
        print(f"dpch: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
