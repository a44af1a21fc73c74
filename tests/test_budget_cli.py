"""`dpch budget set|show|history|events|reset` through dpch.cli.main, on a temporary ledger."""
from __future__ import annotations

import pytest

from dpch.cli import main
from dpch.cost import MechanismCost, PrivacyCost
from dpch.ledger import Ledger
from ledger_stores import ledger_target, pg_server  # noqa: F401  (the two stores)


def run(argv) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse errors
        return int(exc.code)


@pytest.fixture
def ledger_path(ledger_target):
    return str(ledger_target)


def test_set_show_history_events(ledger_path, capsys):
    assert run(["budget", "set", "--analyst", "alice", "--dataset", "purchases", "--epsilon", "3", "--delta", "1e-6",
                "--accountant", "zcdp", "--ledger", ledger_path]) == 0
    out = capsys.readouterr().out
    assert "budget set: analyst alice on dataset purchases: ε=3, δ=1e-06, accountant zcdp" in out
    assert "ρ=" in out
    assert run(["budget", "set", "--analyst", "bob", "--dataset", "purchases", "--epsilon", "1",
                "--accountant", "optimal", "--max-queries", "10", "--per-query-epsilon", "0.1", "--ledger", ledger_path]) == 0
    capsys.readouterr()
    with Ledger(ledger_path, create=False) as led:
        cost = PrivacyCost((MechanismCost("laplace", 1.0, 10.0, 0.1, 0.0, None, "COUNT(*)"),))
        r = led.charge("bob", "purchases", cost, "SELECT COUNT(*) FROM purchases")
        led.mark(r, "executed")
    assert run(["budget", "show", "--ledger", ledger_path]) == 0
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    assert lines[0].split()[:4] == ["analyst", "dataset", "accountant", "ε"]
    alice = next(l for l in lines if l.startswith("alice"))
    bob = next(l for l in lines if l.startswith("bob"))
    assert "zcdp" in alice and "0/0.18" in alice  # ρ spent / ρ budget
    assert "optimal" in bob and "1/10" in bob
    assert run(["budget", "show", "--analyst", "bob", "--ledger", ledger_path]) == 0
    out = capsys.readouterr().out
    assert "bob" in out and "alice" not in out
    assert run(["budget", "history", "--ledger", ledger_path]) == 0
    out = capsys.readouterr().out
    assert "SELECT COUNT(*) FROM purchases" in out and "executed" in out and "optimal" in out
    assert run(["budget", "events", "--ledger", ledger_path]) == 0
    out = capsys.readouterr().out
    assert out.count("budget_set") == 2 and "charge" in out and "mark" in out


def test_reset_needs_explicit_flag(ledger_path, capsys):
    assert run(["budget", "set", "--analyst", "alice", "--dataset", "purchases", "--epsilon", "1", "--ledger", ledger_path]) == 0
    with Ledger(ledger_path, create=False) as led:
        led.charge("alice", "purchases", PrivacyCost((MechanismCost("laplace", 1.0, 1.0, 1.0),)), "q")
    capsys.readouterr()
    assert run(["budget", "reset", "--analyst", "alice", "--dataset", "purchases", "--ledger", ledger_path]) == 2
    assert "--yes-i-know" in capsys.readouterr().err
    with Ledger(ledger_path, create=False) as led:
        assert led.remaining("alice", "purchases").remaining.epsilon == 0.0
        assert len(led.events(kind="reset_refused")) == 1
    assert run(["budget", "reset", "--analyst", "alice", "--dataset", "purchases", "--yes-i-know",
                "--ledger", ledger_path]) == 0
    assert "budget reset" in capsys.readouterr().out
    with Ledger(ledger_path, create=False) as led:
        assert led.remaining("alice", "purchases").remaining.epsilon == 1.0
        (ev,) = led.events(kind="budget_reset")
        assert ev.detail["confirm"] is True
    assert run(["budget", "history", "--ledger", ledger_path]) == 0
    assert "reserved" in capsys.readouterr().out  # the forgotten charge is still in the history


@pytest.mark.parametrize("argv", [
    ["budget", "set", "--analyst", "a", "--dataset", "d", "--epsilon", "-1"],
    ["budget", "set", "--analyst", "a", "--dataset", "d", "--epsilon", "abc"],
    ["budget", "set", "--analyst", "a", "--dataset", "d", "--epsilon", "1", "--delta", "2"],
    ["budget", "set", "--analyst", "a", "--dataset", "d", "--epsilon", "1", "--accountant", "nope"],
    ["budget", "set", "--dataset", "d", "--epsilon", "1"],
    ["budget", "set", "--analyst", "a", "--dataset", "d", "--epsilon", "1", "--max-queries", "0"],
    ["budget", "set", "--analyst", "a", "--dataset", "d", "--epsilon", "1", "--accountant", "optimal"],
    ["budget", "set", "--analyst", "a", "--dataset", "d", "--epsilon", "1", "--accountant", "pure", "--delta", "1e-6"],
    ["budget", "set", "--analyst", "", "--dataset", "d", "--epsilon", "1"],
    ["budget", "reset", "--analyst", "a"],
    ["budget", "frobnicate"],
    ["budget"],
])
def test_bad_arguments_exit_2(argv, ledger_path, capsys):
    if argv[1:2] in (["set"], ["reset"]):
        argv = argv + ["--ledger", ledger_path]
    assert run(argv) == 2
    captured = capsys.readouterr()
    assert (captured.err + captured.out).strip()  # says why (or prints the usage)


def test_missing_ledger_is_an_error_for_readers(ledger_path, capsys):
    for cmd in ("show", "history", "events"):
        assert run(["budget", cmd, "--ledger", ledger_path]) == 2
        assert "not found" in capsys.readouterr().err


def test_default_ledger_path_from_environment(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("DPCH_LEDGER", raising=False)
    monkeypatch.setenv("DPCH_DATA_DIR", str(tmp_path / "data"))
    assert run(["budget", "set", "--analyst", "a", "--dataset", "d", "--epsilon", "2"]) == 0
    assert (tmp_path / "data" / "ledger.sqlite").exists()
    monkeypatch.setenv("DPCH_LEDGER", str(tmp_path / "explicit.sqlite"))
    assert run(["budget", "set", "--analyst", "a", "--dataset", "d", "--epsilon", "2"]) == 0
    assert (tmp_path / "explicit.sqlite").exists()
    capsys.readouterr()
    assert run(["budget", "show"]) == 0
    assert "a" in capsys.readouterr().out


def test_backup_and_verify(ledger_path, tmp_path, capsys):
    """`budget backup` writes a consistent SQLite ledger from either store; `budget verify` checks
    both (rows, event chain, totals, histories, incremental states)."""
    assert run(["budget", "set", "--analyst", "a", "--dataset", "d", "--epsilon", "1", "--ledger", ledger_path]) == 0
    with Ledger(ledger_path, create=False) as led:
        for i in range(3):
            led.charge("a", "d", PrivacyCost((MechanismCost("laplace", 1.0, 10.0, 0.1, 0.0, None, "L"),)), f"q{i}")
    copy = str(tmp_path / "copy.sqlite")
    assert run(["budget", "backup", "--ledger", ledger_path, "--to", copy]) == 0
    assert "3 charges" in capsys.readouterr().out
    for target in (ledger_path, copy):
        assert run(["budget", "verify", "--ledger", target]) == 0
        assert "ledger ok: 1 budgets, 3 charges" in capsys.readouterr().out
    with Ledger(copy, create=False) as led:
        assert led.remaining("a", "d").spent.epsilon == pytest.approx(0.3)
    assert run(["budget", "backup", "--ledger", ledger_path, "--to", copy]) == 2  # never overwrites
