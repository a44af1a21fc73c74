"""The `dpch` command line. Each subcommand lives in `dpch/commands/<module>.py` and exposes
`register(subparsers)`; this module only wires them together.

Only the module of the command being run is imported (issue 31: `dpch --version` must not load the
engine, pandas or scipy). `--help` and `--version` import no command module at all: the top-level
listing comes from `COMMANDS` below, which tests/test_startup.py keeps equal to what each module
registers.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from .errors import CLI, DPCHError, interface

# command -> (module in dpch.commands, its one-line help in the top-level listing), in listing order
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("demo", "generate sample data and run DP queries on the embedded engine"),
    "query": ("query", "answer a SELECT with differential privacy (charges the budget)"),
    "explain": ("query", "show the rewritten SQL, sensitivities and budget split (free)"),
    "catalog": ("query", "manage the privacy catalog"),
    "budget": ("budget", "set, show, reset privacy budgets (the ledger)"),
    "audit": ("audit", "empirically test a query's privacy claim on neighbouring datasets"),
    "load": ("load", "create a table from CSV/Parquet/JSON-lines files (embedded engine)"),
    "serve": ("serve", "run the DP gateway (ClickHouse HTTP interface) in the foreground"),
    "users": ("users", "manage the gateway's users (dpch serve)"),
    "svt": ("svt", "sparse vector (AboveThreshold): which queries exceed a threshold "
                   "(charges ε once, settles ε1 + (c'/c)·ε2)"),
    "ptr": ("ptr", "propose-test-release: robust median, IQR, trimmed mean "
                   "(⊥ when the data are not stable; ⊥ keeps only the tests' ε)"),
    "block": ("block", "Block-DP I/II mean or median of a column (thesis §5.4, corrected)"),
    "refine": ("refine", "early stopping: refine a noisy COUNT/SUM until its interval is narrow enough "
                         "(charged for the steps run, ODP Lemma 11)"),
    "tune": ("tune", "choose contribution bounds for a workload (spends a small declared ε)"),
}


def package_version() -> str:
    """dpch.__version__ (tests/test_packaging.py checks it is the installed distribution's: reading
    the package metadata here would import importlib.metadata and email, 1/3 of `--version`'s time)."""
    from . import __version__

    return __version__


class _VersionAction(argparse.Action):
    """`--version`, reading the package metadata only when asked."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, help="show program's version number and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"dpch {package_version()}")
        parser.exit()


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser with `command`'s module registered (None: every module, as before issue 31).
    The other commands are listed by name and help only, so that their modules are not imported."""
    parser = argparse.ArgumentParser(prog="dpch", description="Differential Privacy for ClickHouse")
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    wanted = {COMMANDS[command][0]} if command in COMMANDS else set()
    if command is None:
        wanted = {module for module, _ in COMMANDS.values()}
    registered: set[str] = set()
    for name, (module, help_text) in COMMANDS.items():
        if module not in wanted:
            sub.add_parser(name, help=help_text, add_help=False)  # listed in --help; never dispatched
        elif module not in registered:
            registered.add(module)
            importlib.import_module(f"dpch.commands.{module}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # the command is the first word (the top level has no option taking a value); "" = none yet
    command = argv[0] if argv and not argv[0].startswith("-") else ""
    args = build_parser(command).parse_args(argv)
    with interface(CLI):  # errors advise `dpch ...` commands, also when printed below
        try:
            return int(args.func(args) or 0)
        except DPCHError as exc:
            print(f"dpch: error: {exc}", file=sys.stderr)
            return 2


if __name__ == "__main__":
    sys.exit(main())
