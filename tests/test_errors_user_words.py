"""Errors in the user's words (issue 31 item 4). Each test pins a message's text:
- the SQL is quoted as typed, not as sqlglot rewrites it (toStartOfMonth, not dateTrunc('MONTH', ...));
- an unknown table "does not exist", with close names; a table the engine has but the catalog does
  not "exists but is not in the privacy catalog";
- a missing budget is NoBudget (a BudgetExceeded and a LedgerError, so old handlers still work);
- the advice is in the words of the interface that reports it: Python API, CLI, gateway;
- no raw engine line ("Code: 76 ... Cannot lock file") comes before DPCH's own message.
"""
from __future__ import annotations

import re

import pickle
import subprocess
import sys

import pytest
import sqlglot

from dpch.bind import bind
from dpch.errors import (CLI, GATEWAY, PYTHON, BudgetExceeded, CatalogError, LedgerError, NoBudget, QueryRejected,
                         interface)
from dpch.ledger import Ledger
from dpch.parse import as_typed, parse
from dpch.plan import QueryOptions, make_plan
from test_controller_fixtures import ANALYST, DB, setup_controller_data
from test_datadir_in_use import HOLD


@pytest.fixture(scope="module")
def edb(db):
    setup_controller_data(db)
    return db


def _plan(db, sql: str, delta: float = 0.0):
    return make_plan(bind(parse(sql), db.catalog.get(f"{DB}.purchases")), 1.0, delta, QueryOptions())


# -- the SQL as typed ------------------------------------------------------------------------------

@pytest.mark.parametrize("typed", [
    "toStartOfMonth( day )", "uniq(user_id)", "toDayOfWeek(day)", "dateTrunc('month', day)",
    "formatDateTime(day, '%Y-%m')", "CAST(x AS Float64)", "quantile(0.5)(x)", "-x + 1.5", "x::Int32",
])
def test_as_typed_quotes_the_original_span(typed):
    sql = f"SELECT {typed} AS v FROM t"
    node = sqlglot.parse_one(sql, read="clickhouse").expressions[0].this
    assert as_typed(node, sql) == typed


def test_as_typed_falls_back_to_clickhouse_sql():
    node = sqlglot.parse_one("SELECT toStartOfMonth(day) FROM t", read="clickhouse").expressions[0]
    assert as_typed(node, None) == "dateTrunc('MONTH', day)"
    assert as_typed(node, "SELECT something else entirely FROM t") == "dateTrunc('MONTH', day)"


def test_group_key_is_quoted_as_typed(edb):
    with pytest.raises(QueryRejected) as info:  # delta = 0 and no public keys for this key
        _plan(edb, f"SELECT toStartOfMonth(day) AS m, COUNT(*) AS n FROM {DB}.purchases GROUP BY m")
    assert str(info.value).startswith("GROUP BY toStartOfMonth(day): no public key set applies")
    assert "dateTrunc" not in str(info.value)


def test_unaliased_column_is_named_as_typed(edb):
    """ClickHouse names an unaliased item by its text: toStartOfMonth(day), not dateTrunc('MONTH', day)."""
    sql = (f"SELECT toStartOfMonth(day), toMonday(day), uniq(user_id), COUNT(*) FROM {DB}.purchases "
           "GROUP BY toStartOfMonth(day), toMonday(day)")
    bound = bind(parse(sql), edb.catalog.get(f"{DB}.purchases"))
    assert [o.name for o in bound.outputs] == ["toStartOfMonth(day)", "toMonday(day)", "uniq(user_id)", "COUNT(*)"]


def test_aggregate_is_quoted_as_typed(edb):
    with pytest.raises(QueryRejected) as info:
        _plan(edb, f"SELECT argMax(region, amount) AS r FROM {DB}.purchases")
    assert str(info.value).startswith("non-DP aggregate argMax (argMax(region, amount)); the DP way to ask: "
                                      "MIN/MAX of the column, or GROUP BY it.")
    with pytest.raises(QueryRejected) as info:
        _plan(edb, f"SELECT SUM(DISTINCT  amount) AS s FROM {DB}.purchases")
    assert str(info.value) == ("SUM(DISTINCT  amount): SUM(DISTINCT ...) is not supported (its sensitivity is "
                               "unbounded); use SUM")


def test_uniq_is_no_longer_reported_as_approx_distinct(edb):
    plan = _plan(edb, f"SELECT uniq(user_id) AS u FROM {DB}.purchases")
    assert [a.func for a in plan.bound.aggregates] == ["count_distinct_unit"]
    with pytest.raises(QueryRejected) as info:
        _plan(edb, f"SELECT uniq() AS u FROM {DB}.purchases")
    assert "approx_distinct" not in str(info.value)


# -- unknown tables ----------------------------------------------------------------------------------

def test_misspelled_table_does_not_exist_with_close_matches(edb):
    with pytest.raises(QueryRejected) as info:
        edb.query(f"SELECT COUNT(*) FROM {DB}.purchses", epsilon=1.0)
    # other modules' tables may share the session store (xdist runs whole modules per worker): the
    # close matches ("a or b or c?", closest first) may name others beside ours
    msg = str(info.value)
    head = f"table {DB}.purchses does not exist. Did you mean "
    assert msg.startswith(head) and msg.endswith("?")
    assert f"{DB}.purchases" in msg[len(head):-1].split(" or ")
    with pytest.raises(CatalogError) as info:
        edb.catalog.get(f"{DB}.zzzz_nothing_like_it")
    assert str(info.value) == f"table {DB}.zzzz_nothing_like_it does not exist."


def test_existing_table_not_in_the_catalog_is_told_apart(edb):
    edb.command(f"CREATE TABLE IF NOT EXISTS {DB}.unregistered_words (x Int32) ENGINE = Memory")
    with pytest.raises(CatalogError) as info:
        edb.catalog.get(f"{DB}.unregistered_words")
    exc = info.value
    head = f"table {DB}.unregistered_words exists but is not in the privacy catalog."
    # a registered table with a close name (another module's, in a shared store) may be suggested
    assert re.sub(r" Did you mean [^?]+\?", "", str(exc)) == (
        f"{head} Register it first: db.catalog.register('{DB}.unregistered_words', privacy_unit=..., bounds={{...}})")
    with interface(CLI):
        assert re.sub(r" Did you mean [^?]+\?", "", str(exc)) == (
            f"{head} Register it first: dpch catalog register {DB}.unregistered_words "
            "--privacy-unit COLUMN --bounds COL=LO:HI")
    with interface(GATEWAY):
        assert re.sub(r" Did you mean [^?]+\?", "", str(exc)) == (
            f"{head} Ask the gateway's administrator to register it in the privacy catalog.")


def test_gateway_analyst_learns_nothing_of_tables_outside_the_catalog(edb):
    """Behind the gateway, an existing raw table and a missing one get the same answer, and the
    close names come from the catalog only."""
    edb.command(f"CREATE TABLE IF NOT EXISTS {DB}.unregistered_words (x Int32) ENGINE = Memory")
    with interface(GATEWAY):
        texts = []
        for name in ("unregistered_words", "unregistered_wordz"):
            with pytest.raises(CatalogError) as info:
                edb.catalog.get(f"{DB}.{name}")
            texts.append(str(info.value))
    assert texts[0] == (f"table {DB}.unregistered_words does not exist or is not in the privacy catalog. Ask the "
                        "gateway's administrator to register it in the privacy catalog.")
    assert texts[1] == texts[0].replace("unregistered_words", "unregistered_wordz")


def test_gateway_threads_default_to_the_gateway():
    """`dpch serve` sets the process default: a worker thread (empty context) advises as the gateway."""
    import threading

    from dpch import errors

    seen = []
    errors.set_process_interface(GATEWAY)
    try:
        thread = threading.Thread(target=lambda: seen.append(str(NoBudget("a", "d"))))
        thread.start()
        thread.join()
        with interface(CLI):  # a context set explicitly still wins
            assert "An administrator runs: dpch budget set" in str(NoBudget("a", "d"))
    finally:
        errors.set_process_interface(PYTHON)
    assert "Ask the gateway's administrator" in seen[0]


# -- a missing budget ----------------------------------------------------------------------------------

def test_missing_budget_is_no_budget(tmp_path):
    ledger = Ledger(tmp_path / "ledger.sqlite")
    ledger.set_budget("alice", "demo.purchases", epsilon=1.0)
    for call in (lambda: ledger.get_budget("bob", "demo.purchases"), lambda: ledger.remaining("bob", "x"),
                 lambda: ledger.precheck("bob", "demo.purchases", 0.1)):
        with pytest.raises(NoBudget):
            call()
    with pytest.raises(BudgetExceeded) as info:  # the old handlers keep working
        ledger.precheck("bob", "demo.purchases", 0.1)
    assert isinstance(info.value, LedgerError)
    head = "no budget set for analyst 'bob' on dataset 'demo.purchases'."
    assert str(info.value) == (f"{head} Set one with db.ledger.set_budget('bob', 'demo.purchases', epsilon=EPS, "
                               "delta=DELTA) (an administrator's call).")
    with interface(CLI):
        assert str(info.value) == (f"{head} An administrator runs: dpch budget set --analyst bob --dataset "
                                   "demo.purchases --epsilon EPS [--delta DELTA] [--accountant NAME]")
    with interface(GATEWAY):
        assert str(info.value) == (f"{head} Ask the gateway's administrator to run `dpch budget set --analyst bob "
                                   "--dataset demo.purchases --epsilon EPS` on the gateway's data directory.")
    again = pickle.loads(pickle.dumps(info.value))  # the engine worker sends errors across processes
    assert type(again) is NoBudget and str(again) == str(info.value)


def test_query_without_budget_raises_no_budget(edb):
    edb.command(f"CREATE TABLE IF NOT EXISTS {DB}.no_budget_words (user_id UInt64, amount Float64) "
                "ENGINE = MergeTree ORDER BY user_id")
    if f"{DB}.no_budget_words" not in edb.catalog:
        edb.catalog.register(f"{DB}.no_budget_words", privacy_unit="user_id", bounds={"amount": (0, 10)})
    with pytest.raises(NoBudget) as info:
        edb.query(f"SELECT COUNT(*) FROM {DB}.no_budget_words", epsilon=1.0)
    assert str(info.value).startswith(f"no budget set for analyst '{ANALYST}' on dataset '{DB}.no_budget_words'. "
                                      "Set one with db.ledger.set_budget(")


# -- advice per interface ------------------------------------------------------------------------------

def test_cli_advises_cli_commands(tmp_path, capsys):
    from dpch.cli import main

    ledger = tmp_path / "ledger.sqlite"
    assert main(["budget", "set", "--analyst", "a", "--dataset", "d", "--epsilon", "1", "--ledger", str(ledger)]) == 0
    capsys.readouterr()
    assert main(["budget", "reset", "--analyst", "x", "--dataset", "y", "--yes-i-know", "--ledger", str(ledger)]) == 2
    assert capsys.readouterr().err == (
        "dpch: error: no budget set for analyst 'x' on dataset 'y'. An administrator runs: dpch budget set "
        "--analyst x --dataset y --epsilon EPS [--delta DELTA] [--accountant NAME]\n")
    missing = tmp_path / "nope.sqlite"
    assert main(["budget", "show", "--ledger", str(missing)]) == 2
    assert capsys.readouterr().err == (f"dpch: error: ledger not found at {missing}; no query can be answered. "
                                       f"Create it with `dpch budget set ... --ledger {missing}`.\n")


def test_python_advises_python_calls(tmp_path):
    with pytest.raises(LedgerError) as info:
        Ledger(tmp_path / "nope.sqlite", create=False)
    assert str(info.value) == (f"ledger not found at {tmp_path / 'nope.sqlite'}; no query can be answered. "
                               f"Create it with Ledger('{tmp_path / 'nope.sqlite'}', create=True).")


def test_gateway_advises_the_administrator():
    from dpch.gateway.errors import from_dpch

    err = from_dpch(NoBudget("alice", "demo.purchases"))
    assert "Ask the gateway's administrator to run `dpch budget set --analyst alice" in err.message
    assert "db.ledger" not in err.message


def test_interface_is_scoped():
    exc = NoBudget("a", "d")
    with interface(CLI):
        with interface(GATEWAY):
            assert "gateway's administrator" in str(exc)
        assert "dpch budget set" in str(exc)
    assert "db.ledger.set_budget" in str(exc)
    with pytest.raises(ValueError):
        with interface("web"):
            pass
    assert PYTHON == "python"


# -- no raw engine line ---------------------------------------------------------------------------------

def test_no_raw_engine_line_before_the_data_dir_message(tmp_path):
    data = tmp_path / "data"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(data)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        r = subprocess.run([sys.executable, "-m", "dpch.cli", "catalog", "list", "--data-dir", str(data)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 2
        assert r.stderr.startswith(f"dpch: error: the data directory {data} is in use by process {holder.pid}"), r.stderr
        assert "Code: 76" not in r.stderr and "Cannot lock file" not in r.stderr
        assert r.stderr.rstrip().endswith("Use another directory (--data-dir DIR or $DPCH_DATA_DIR), or run "
                                          "`dpch serve` on this one and send queries to that server.")
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
