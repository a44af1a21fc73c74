"""The `dpch` command line. Each subcommand lives in `dpch/commands/<name>.py` and exposes
`register(subparsers)`; this module only wires them together."""
from __future__ import annotations

import argparse
import importlib
import sys

from .errors import DPCHError

SUBCOMMAND_MODULES = ["demo", "query", "budget", "audit", "load", "serve", "users", "svt", "ptr", "block", "refine"]


def package_version() -> str:
    """The installed distribution's version (package metadata), else dpch.__version__."""
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version("dpch")
    except PackageNotFoundError:
        from . import __version__

        return __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dpch", description="Differential Privacy for ClickHouse")
    parser.add_argument("--version", action="version", version=f"dpch {package_version()}")
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
