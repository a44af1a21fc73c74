"""Start-up weight (issue 31 item 2): `import dpch`, `dpch --version`, `dpch --help` and
`dpch budget show` do not import the embedded engine or the numeric stack. Checked through
sys.modules in a fresh interpreter, not by timing (speed is measured by bench/bench_startup.py)."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

HEAVY = ("chdb", "pandas", "numpy", "sklearn", "scipy", "matplotlib", "sqlglot")


def loaded_after(code: str) -> set[str]:
    probe = (f"import sys, json, contextlib, io\n{code}\n"
             f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return set(json.loads(r.stdout.strip().splitlines()[-1]))


def cli(args: list[str]) -> str:
    return ("from dpch.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
            f"    try:\n        main({args!r})\n    except SystemExit:\n        pass")


def test_import_dpch_is_light():
    assert loaded_after("import dpch") == set()


@pytest.mark.parametrize("args", [["--version"], ["--help"], [], ["nosuchcommand"]])
def test_top_level_cli_is_light(args):
    assert loaded_after(cli(args)) == set()


def test_budget_show_is_light(tmp_path):
    ledger = tmp_path / "ledger.sqlite"
    from dpch.cli import main

    assert main(["budget", "set", "--analyst", "a", "--dataset", "d", "--epsilon", "1", "--ledger", str(ledger)]) == 0
    assert loaded_after(cli(["budget", "show", "--ledger", str(ledger)])) == set()


def test_connect_is_still_reachable_lazily():
    """PEP 562: the facade loads on first use of dpch.connect; the engine loads when a connection
    opens, pandas when a result needs it."""
    assert loaded_after("import dpch\ndpch.connect\nassert 'dpch.connection' in sys.modules") == set()


def test_metadata_commands_do_not_import_pandas(tmp_path):
    """The catalog reads metadata through dpch.backends.query_records (JSONEachRow), so commands
    that only register, list, show, update or drop tables run without pandas (0.6-0.9 s of
    imports). One interpreter runs them all in turn, each to exit status 0."""
    data = str(tmp_path / "data")
    commands = [["catalog", "register", "default.t", "--privacy-unit", "u", "--bounds", "x=0:1"],
                ["catalog", "list"], ["catalog", "show", "default.t"],
                ["catalog", "update", "default.t", "--max-rows", "2"], ["catalog", "drop", "default.t"]]
    code = ("import dpch\n"
            f"db = dpch.connect({data!r})\n"
            "db.command('CREATE TABLE default.t (u UInt64, x Float64) ENGINE = MergeTree ORDER BY u')\n"
            "db.close()\n"
            "from dpch.cli import main\n"
            f"for args in {commands!r}:\n"
            "    with contextlib.redirect_stdout(io.StringIO()):\n"
            f"        assert main(args + ['--data-dir', {data!r}]) == 0, args\n")
    loaded = loaded_after(code)
    assert "chdb" in loaded and "pandas" not in loaded, loaded  # (chDB's pyarrow loads numpy)


def test_command_table_matches_the_modules():
    """cli.COMMANDS (the top-level listing, built without importing the modules) names each
    command's module and the same help its module registers."""
    from dpch import cli

    def commands(parser):
        return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))

    registered = {c.dest: c.help for c in commands(cli.build_parser(None))._choices_actions}  # every module
    assert registered == {name: help_text for name, (_, help_text) in cli.COMMANDS.items()}
    for name in cli.COMMANDS:  # dispatching a command registers its real parser (it has a func)
        assert "func" in commands(cli.build_parser(name)).choices[name]._defaults, name
        assert "func" not in commands(cli.build_parser("")).choices[name]._defaults, name
