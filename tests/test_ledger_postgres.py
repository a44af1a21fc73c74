"""The PostgreSQL ledger store against a real server (tests/ledger_stores.py starts it): a charge is
one SERIALIZABLE transaction retried after a serialization failure; several processes on one ledger
charge exactly the budget; a process killed mid-run leaves no answered query uncharged; durability
settings; credentials never appear in messages. The shared behaviour (every ledger test) runs
against both stores through the `ledger_target` fixture."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from dpch.cost import MechanismCost, PrivacyCost
from dpch.errors import LedgerError
from dpch.ledger import Ledger
from dpch.ledger.postgres_store import PostgresLedgerStore, redact
from ledger_stores import pg_server  # noqa: F401  (the PostgreSQL server)

REPO = Path(__file__).resolve().parents[1]
EPS = 0.125  # dyadic: N charges of it sum to exactly N/8, so "exactly N fit" has no rounding slack


def lap(eps: float = EPS) -> PrivacyCost:
    return PrivacyCost((MechanismCost("laplace", 1.0, 1.0 / eps, eps, 0.0, None, "COUNT(*)"),))


# ---------------------------------------------------------------------------------------------
# several processes on one ledger (bench/bench_ledger.py runs the full-size version)
# ---------------------------------------------------------------------------------------------

WORKER = textwrap.dedent("""
    import os, sys, threading, types
    _pkg = types.ModuleType("dpch")  # the ledger only: no engine import
    _pkg.__path__ = [os.path.join(os.environ["DPCH_REPO"], "dpch")]
    sys.modules["dpch"] = _pkg
    from dpch.cost import MechanismCost, PrivacyCost
    from dpch.errors import BudgetExceeded, LedgerError
    from dpch.ledger import Ledger
    from dpch.ledger.postgres_store import PostgresLedgerStore
    url, n_threads, eps, turns = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4] == "1"
    cost = PrivacyCost((MechanismCost("laplace", 1.0, 1.0 / eps, eps, 0.0, None, "COUNT(*)"),))
    out = threading.Lock()
    # one connection per client
    handles = [Ledger(store=PostgresLedgerStore(url, create=False, serialize_writers=turns)) for _ in range(n_threads)]
    print("ready", flush=True)
    sys.stdin.readline()  # "go"
    def client(i):
        led = handles[i]
        while True:
            try:
                r = led.charge("alice", "sales", cost, f"client {i}")
            except BudgetExceeded:
                break
            except LedgerError as exc:  # not charged: this query must not be answered; try again
                with out:
                    print("E", exc.__class__.__name__, flush=True)
                continue
            with out:  # the query is answered only now, after its charge committed
                print("A", r.id, flush=True)
    threads = [threading.Thread(target=client, args=(i,)) for i in range(n_threads)]
    for t in threads: t.start()
    for t in threads: t.join()
    retries = sum(h.store.retries for h in handles)
    print("D", retries, flush=True)
""")


@dataclass
class GatewayRun:
    answered: list[int] = field(default_factory=list)  # charge ids whose query was answered
    charged: list[int] = field(default_factory=list)  # charge ids in the ledger afterwards
    errors: int = 0
    retries: int = 0
    seconds: float = 0.0
    killed: int | None = None


def run_gateways(url: str, *, processes: int, threads: int, n: int, kill_after: int | None = None,
                 timeout: float = 240, serialize_writers: bool = True) -> GatewayRun:
    """`processes` processes with `threads` clients each charge one analyst's budget of exactly n
    queries (ε = n·EPS) on the PostgreSQL ledger at `url` until it refuses. With kill_after, the
    first process is killed with SIGKILL once that many queries were answered in all.
    serialize_writers=False: without the writers' advisory lock (SERIALIZABLE and retries only)."""
    with Ledger(url) as led:
        if any(s.analyst == "alice" for s in led.budgets()):  # a run before: start a new generation
            led.reset("alice", "sales", confirm=True)
        led.set_budget("alice", "sales", n * EPS)
    env = dict(os.environ, DPCH_REPO=str(REPO))
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, url, str(threads), str(EPS),
                               "1" if serialize_writers else "0"], env=env, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for _ in range(processes)]
    result, lock = GatewayRun(), threading.Lock()
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready", p.stderr.read()

        def reader(p: subprocess.Popen) -> None:
            for line in p.stdout:
                kind, _, rest = line.strip().partition(" ")
                with lock:
                    if kind == "A":
                        result.answered.append(int(rest))
                    elif kind == "E":
                        result.errors += 1
                    elif kind == "D":
                        result.retries += int(rest)
                    if kill_after is not None and result.killed is None and len(result.answered) >= kill_after:
                        procs[0].send_signal(signal.SIGKILL)
                        result.killed = procs[0].pid

        readers = [threading.Thread(target=reader, args=(p,)) for p in procs]
        for t in readers:
            t.start()
        start = time.monotonic()
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        for p in procs:
            p.wait(timeout=timeout)
        for t in readers:
            t.join()
        result.seconds = time.monotonic() - start
        for i, p in enumerate(procs):
            if not (kill_after is not None and i == 0):
                assert p.returncode == 0, p.stderr.read()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    with Ledger(url, create=False) as led:  # opening verifies rows, chain, totals, states
        gen = [s.generation for s in led.budgets() if s.analyst == "alice"][0]
        result.charged = [h.id for h in led.history("alice", "sales") if h.generation == gen]
    return result


def test_three_processes_charge_exactly_the_budget(pg_server):
    url = pg_server.new_schema()
    for _ in range(2):
        run = run_gateways(url, processes=3, threads=4, n=40)
        assert sorted(run.answered) == sorted(run.charged)
        assert len(run.charged) == 40 and len(set(run.charged)) == 40


def test_without_the_writers_lock_serializable_alone_charges_exactly_the_budget(pg_server):
    """The advisory lock only saves work: with SERIALIZABLE and its retries alone the count is exact."""
    run = run_gateways(pg_server.new_schema(), processes=3, threads=3, n=25, serialize_writers=False)
    assert sorted(run.answered) == sorted(run.charged) and len(set(run.charged)) == 25


def test_kill_9_mid_run_leaves_no_answered_query_uncharged(pg_server):
    url = pg_server.new_schema()
    run = run_gateways(url, processes=3, threads=4, n=60, kill_after=10)
    assert run.killed is not None
    assert set(run.answered) <= set(run.charged)  # every answered query was charged
    # exactly the budget: the survivors use what the killed process did not (a charge whose answer
    # died with its process stays charged: fail closed)
    assert len(run.charged) == 60 and len(set(run.charged)) == 60


# ---------------------------------------------------------------------------------------------
# SERIALIZABLE and its retries
# ---------------------------------------------------------------------------------------------

def _conflicting(a: Ledger, b: Ledger, calls: list):
    """A transaction function that, on its first run, lets `b` commit a charge on the budget row
    it has already read, then writes that row: PostgreSQL must abort it (40001)."""
    def fn(txn):
        calls.append(1)
        row = txn.get_budget("alice", "sales")
        if len(calls) == 1:
            b.charge("alice", "sales", lap(), "the other gateway")
        txn.put_budget(replace(row, updated_at=row.updated_at + 1))
        return len(calls)
    return fn


def _optimistic(url: str, **kw) -> Ledger:
    """A handle without the writers' advisory lock: SERIALIZABLE and retries alone."""
    return Ledger(store=PostgresLedgerStore(url, create=False, serialize_writers=False, **kw))


def test_serialization_failure_is_retried(pg_server):
    url = pg_server.new_schema()
    Ledger(url).close()
    with _optimistic(url) as a, _optimistic(url) as b:
        a.set_budget("alice", "sales", 1.0)
        calls: list = []
        assert a.store.transaction(_conflicting(a, b, calls)) == 2  # the first attempt was aborted, then re-run
        assert a.store.retries == 1
        assert len(a.history()) == 1
        a.verify()


def test_exhausted_retries_fail_closed(pg_server):
    url = pg_server.new_schema()
    with Ledger(url) as admin:
        admin.set_budget("alice", "sales", 1.0)
    with _optimistic(url, max_attempts=1) as a, _optimistic(url) as b:
        with pytest.raises(LedgerError, match="must not run"):
            a.store.transaction(_conflicting(a, b, []))
        assert len(a.history()) == 1  # only b's charge; nothing of the aborted transaction


def test_charges_commit_synchronously_marks_do_not(pg_server):
    """synchronous_commit is on for charges (durable before the query runs) and off only for the
    outcome mark, inside its own transaction (like SQLite's synchronous=NORMAL for marks)."""
    url = pg_server.new_schema()
    with Ledger(url) as led:
        led.set_budget("alice", "sales", 1.0)
        seen = []
        store = led.store
        real = store._run

        def spy(fn, begin, durable):
            def wrapped(txn):
                seen.append((durable, txn.conn.execute("SHOW synchronous_commit").fetchone()[0]))
                return fn(txn)
            return real(wrapped, begin, durable)
        store._run = spy
        r = led.charge("alice", "sales", lap(), "q")
        led.mark(r, "executed")
        del store._run
        assert seen[0] == (True, "on") and seen[-1] == (False, "off")
        assert store.conn.execute("SHOW synchronous_commit").fetchone()[0] == "on"


def test_server_without_fsync_is_refused(pg_server):
    url = pg_server.new_schema()
    with pg_server.admin() as conn:
        conn.execute("ALTER SYSTEM SET fsync = off")
        conn.execute("SELECT pg_reload_conf()")
    try:
        time.sleep(0.5)
        with pytest.raises(LedgerError, match="fsync"):
            Ledger(url)
    finally:
        with pg_server.admin() as conn:
            conn.execute("ALTER SYSTEM RESET fsync")
            conn.execute("SELECT pg_reload_conf()")
        time.sleep(0.5)
    Ledger(url).close()


def test_foreign_tables_and_missing_ledger_are_refused(pg_server):
    url = pg_server.new_schema()
    with pytest.raises(LedgerError, match="not found"):
        Ledger(url, create=False)
    with pg_server.admin() as conn:
        schema = url.rsplit("%3D", 1)[1]
        conn.execute(f"CREATE TABLE {schema}.meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        conn.execute(f"INSERT INTO {schema}.meta VALUES ('app', 'something else')")
    with pytest.raises(LedgerError, match="not a DPCH ledger"):
        Ledger(url)


def test_tampered_rows_are_refused(pg_server):
    url = pg_server.new_schema()
    with Ledger(url) as led:
        led.set_budget("alice", "sales", 1.0)
        led.charge("alice", "sales", lap(), "q")
    with pg_server.admin() as conn:
        schema = url.rsplit("%3D", 1)[1]
        conn.execute(f"UPDATE {schema}.charges SET eff_epsilon = 0")
    with pytest.raises(LedgerError, match="checksum"):
        Ledger(url, create=False)


def test_credentials_never_appear_in_messages(pg_server):
    url = "postgresql://postgres:s3cret-pw@127.0.0.1:1/nowhere"  # nothing listens on port 1
    with pytest.raises(LedgerError) as info:
        Ledger(url)
    assert "s3cret-pw" not in str(info.value) and "127.0.0.1" in str(info.value)
    assert "s3cret-pw" not in redact(url)


# ---------------------------------------------------------------------------------------------
# `dpch serve` gateways on one PostgreSQL ledger
# ---------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_two_gateways_on_one_ledger_answer_exactly_the_budget(pg_server, tmp_path_factory):
    """Two real `dpch serve --ledger postgresql://…` processes (each with its own embedded engine
    and demo data) and 8 concurrent clients: an analyst whose budget allows exactly 12 queries gets
    exactly 12 answers in all, the rest are refused by the ledger (403)."""
    import httpx
    from concurrent.futures import ThreadPoolExecutor

    from test_gateway import PASSWORD, Server, _cli, demo_dir

    url, n = pg_server.new_schema(), 12
    gateways = []
    try:
        for i in range(2):
            d = demo_dir(tmp_path_factory, f"gw{i}")
            _cli("users", "add", "alice", "--password-stdin", "--data-dir", str(d), stdin=PASSWORD + "\n")
            gateways.append(Server(d, "--ledger", url))
        _cli("budget", "set", "--ledger", url, "--analyst", "alice", "--dataset", "demo.purchases",
             "--epsilon", str(n * 0.5))
        for g in gateways:
            g.start()

        def client(i: int) -> list[int]:
            codes = []
            while True:
                r = httpx.post(gateways[i % 2].url + "/", content=b"SELECT dp_count(0.5) AS n FROM demo.purchases",
                               auth=("alice", PASSWORD), timeout=60)
                codes.append(r.status_code)
                if r.status_code != 200:
                    return codes

        with ThreadPoolExecutor(8) as pool:
            codes = [c for cs in pool.map(client, range(8)) for c in cs]
        assert codes.count(200) == n and set(codes) == {200, 403}
        with Ledger(url, create=False) as led:
            assert led.remaining("alice", "demo.purchases").queries == n
    finally:
        for g in gateways:
            g.stop()


def test_dpch_ledger_environment_variable_may_name_a_postgresql_ledger(pg_server, monkeypatch):
    url = pg_server.new_schema()
    monkeypatch.setenv("DPCH_LEDGER", url)
    with Ledger() as led:
        assert isinstance(led.store, PostgresLedgerStore) and led.path == redact(url)
        led.set_budget("alice", "sales", 1.0)
    with Ledger(url, create=False) as led:
        assert led.get_budget("alice", "sales").epsilon == 1.0
