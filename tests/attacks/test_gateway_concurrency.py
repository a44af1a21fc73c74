"""Parallel engine sessions (issue 27 "Done when", issue 33 item 3): through the real gateway process,
one analyst's slow query keeps neither another analyst's DP query nor ``/ping`` waiting, one analyst
cannot take every engine session, and concurrent DP queries are charged exactly once each.

The slow query is legitimate and accepted: a DP COUNT over ``demo.purchases`` joined with a public
dimension table whose 2 000 000 rows all carry one region, so the join yields about 4 000 × 2·10^6 =
8·10^9 rows before the per-unit bounding. No machine gets through that in ``SLOW_LIMIT`` = 6 s (this
one joins about 3·10^7 rows/s), so the query runs until alice's own engine limit stops it with
ClickHouse's TIMEOUT_EXCEEDED (159): it holds an engine session for 6 s, deterministically. Her ε is
charged before it runs, as for any accepted query.

``BOUND`` = 5 s is the issue's "no single request keeps another user waiting more than 5 s", a
correctness bound, not a benchmark: while alice's slow queries ran, bob's DP query took 0.2-0.4 s
and a ping milliseconds here (2 cores, load average 9 from other jobs), so a correct gateway stays
far below it, while the one-engine-thread gateway made bob wait for the rest of alice's query (6 s
minus the 0.5 s head start: above the bound). Each check also asserts ORDER: bob was answered
while alice's query was still running, so the bound is never met by a slow query that happened to
end early. The fixture sends one query per user first: a process's first query imports the planner
and makes the probe tables, a start-up cost that is not waiting.
"""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from pathlib import Path

import httpx
import pytest

from dpch.engine_worker import EngineLimits, WorkerBackend
from dpch.errors import BackendError
from dpch.gateway.errors import from_dpch
from dpch.ledger import Ledger
from dpch.users import UserStore
from test_gateway import Server  # the real `dpch serve` process of tests/test_gateway.py

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
USERS = {"alice": "alice-secret-1", "bob": "bob-secret-22"}
BOUND = 5.0
SLOW_LIMIT = 6.0  # alice's max_execution_time (her user record): how long her slow query holds a session
SESSIONS = 4
DIM_ROWS = 2_000_000
SLOW = ("SELECT COUNT(*) AS n FROM demo.purchases AS p JOIN demo.dim AS d ON p.region = d.region "
        "SETTINGS dpch_epsilon = 0.01")
FAST = "SELECT region, COUNT(*) AS n FROM demo.purchases GROUP BY region SETTINGS dpch_epsilon = 0.05"

# the store, made in its own process (one process holds a store): demo.purchases registered as
# `dpch demo` registers it (without the demo's own timed runs), and the public dimension
_STORE = """
import sys
import dpch
from dpch.demo import REGIONS, create_purchases
db = dpch.connect(sys.argv[1], analyst="admin")
create_purchases(db, rows=20000)
db.catalog.register("demo.purchases", privacy_unit="user_id", bounds={"amount": (0, 610), "age": (18, 100)},
                    max_groups_contributed=1, max_rows_per_unit=24, public_keys={"region": REGIONS})
db.command("CREATE TABLE demo.dim (region String, k UInt32) ENGINE = MergeTree ORDER BY k")
db.command(f"INSERT INTO demo.dim SELECT '{REGIONS[0]}' AS region, number AS k FROM numbers({sys.argv[2]})")
db.catalog.register("demo.dim", public=True)
db.close()
"""


def _run(*args, stdin=None):
    r = subprocess.run([PY, *args], input=stdin, capture_output=True, text=True, cwd=ROOT, timeout=180)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    d = tmp_path_factory.mktemp("concurrency")
    _run("-c", _STORE, str(d), str(DIM_ROWS))
    users = UserStore(d)
    ledger = Ledger(d / "ledger.sqlite")
    for name, pw in USERS.items():
        users.add(name, pw)
        ledger.set_budget(name, "demo.purchases", 100.0, 1e-3)
    ledger.close()
    users.set_limits("alice", {"max_execution_time": SLOW_LIMIT})
    server = Server(d, "--engine-sessions", str(SESSIONS), start_timeout=90).start()
    try:
        g = {"url": server.url, "dir": d}
        for user in USERS:  # warm: the first query of a process imports the planner and makes the probe tables
            assert _post(g, user, FAST).status_code == 200
        yield g
    finally:
        server.stop()


def _post(gw, user, sql, timeout=120):
    return httpx.post(gw["url"] + "/", content=sql.encode(), auth=(user, USERS[user]), timeout=timeout)


def _code(r) -> str:
    return r.headers.get("X-ClickHouse-Exception-Code", "")


def _in_background(fn, n=1):
    """Start ``n`` threads running ``fn()``; returns (threads, results list filled as they end)."""
    out: list = []

    def run():
        out.append(fn())

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    return threads, out


def _others_during(gw, slow_threads):
    """While ``slow_threads`` run: bob's DP query and a ping, three times. Each must be answered
    within BOUND, and the slow requests must still be running after the last (asserted order)."""
    time.sleep(0.5)  # the slow requests reach the engine (their planning takes milliseconds)
    worst = 0.0
    with httpx.Client(timeout=60) as c:
        for _ in range(3):
            t0 = time.perf_counter()
            r = c.post(gw["url"] + "/", content=FAST.encode(), auth=("bob", USERS["bob"]))
            assert r.status_code == 200, r.text
            assert len(r.text.strip().splitlines()) == 5  # the five public regions, each released
            t1 = time.perf_counter()
            assert c.get(gw["url"] + "/ping").text == "Ok.\n"
            worst = max(worst, t1 - t0, time.perf_counter() - t1)
    assert all(t.is_alive() for t in slow_threads), "the slow query ended before the others were answered"
    return worst


def test_a_slow_query_keeps_no_one_waiting(gw):
    threads, out = _in_background(lambda: _post(gw, "alice", SLOW))
    worst = _others_during(gw, threads)
    for t in threads:
        t.join()
    assert worst < BOUND
    # alice's query was accepted and ran until her own engine limit stopped it
    assert _code(out[0]) == "159" and "TIMEOUT_EXCEEDED" in out[0].text, out[0].text


def test_one_analyst_cannot_take_every_engine_session(gw):
    """Alice sends SESSIONS slow queries at once: at most SESSIONS - 1 run (the last waits its
    turn), so bob still finds an engine session."""
    threads, out = _in_background(lambda: _post(gw, "alice", SLOW), n=SESSIONS)
    worst = _others_during(gw, threads)
    for t in threads:
        t.join()
    assert worst < BOUND
    assert [_code(r) for r in out] == ["159"] * SESSIONS  # each ran (in turn) until alice's limit


def _charges(gw) -> list[tuple[str, float, str]]:
    """Every charge in the ledger (analyst, ε, outcome), read-only while the gateway runs (WAL)."""
    with closing(sqlite3.connect(f"file:{gw['dir'] / 'ledger.sqlite'}?mode=ro", uri=True)) as c:
        return c.execute("SELECT analyst, epsilon, outcome FROM charges ORDER BY id").fetchall()


def _spent(gw) -> dict[str, tuple[float, int]]:
    with closing(sqlite3.connect(f"file:{gw['dir'] / 'ledger.sqlite'}?mode=ro", uri=True)) as c:
        return {a: (e, n) for a, e, n in c.execute("SELECT analyst, spent_epsilon, n_charges FROM budgets")}


def test_concurrent_queries_are_each_charged_once(gw):
    """16 concurrent DP queries of two analysts, each with its own ε (k/1024: exact in binary, so
    sums are exact): all answered, and the ledger holds exactly one charge per query with that ε,
    no lost and no double charge, and each budget's running total moved by exactly their sum."""
    before_rows, before_spent = len(_charges(gw)), _spent(gw)
    jobs = [(user, (8 * i + j + 1) / 1024) for i, user in enumerate(USERS) for j in range(8)]

    def one(job):
        user, eps = job
        sql = f"SELECT COUNT(*) AS n FROM demo.purchases WHERE amount > 10 SETTINGS dpch_epsilon = {eps!r}"
        return _post(gw, user, sql)

    with ThreadPoolExecutor(len(jobs)) as pool:
        answers = list(pool.map(one, jobs))
    for (user, eps), r in zip(jobs, answers):
        assert r.status_code == 200, r.text
        assert float(r.headers["X-DPCH-Epsilon"]) == eps
        float(r.text.strip())
    new = _charges(gw)[before_rows:]
    assert Counter((a, e) for a, e, _ in new) == Counter(jobs)
    assert {o for _, _, o in new} <= {"executed", "settled"}, new
    after_spent = _spent(gw)
    for user in USERS:
        e0, n0 = before_spent[user]
        e1, n1 = after_spent[user]
        assert n1 - n0 == 8
        assert e1 - e0 == pytest.approx(sum(e for u, e in jobs if u == user), rel=1e-12)
    log = [json.loads(line) for line in (gw["dir"] / "access.log").read_text().splitlines()]
    accepted = [x for x in log if x.get("outcome") == "accepted" and x.get("kind") == "dp"]
    assert Counter((x["user"], x["epsilon"]) for x in accepted[-16:]) == Counter(jobs)


# -- the multiplexed worker itself (no gateway) -----------------------------------------------------------

@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    w = WorkerBackend(tmp_path_factory.mktemp("mux"), margin=1.0, sessions=2)
    yield w
    w.close()


HEAVY = "SELECT count() AS n FROM numbers(100000000000) WHERE sipHash64(number) % 7 = 1"


def test_answers_come_back_out_of_order(worker):
    """A statement that runs into its 2 s limit on one engine session, and 20 short ones on the
    other meanwhile: each caller gets its own answer (ids), all while the long one still runs."""
    threads, out = _in_background(lambda: _error_code(lambda: worker.query_df(HEAVY, limits=EngineLimits(2.0))))
    time.sleep(0.3)
    with ThreadPoolExecutor(4) as pool:  # 4 callers, 1 free session: they also wait for it in turn
        got = list(pool.map(lambda i: int(worker.query_df(f"SELECT {i} AS a")["a"][0]), range(20)))
    assert got == list(range(20))
    assert threads[0].is_alive()
    threads[0].join()
    assert out == [159]


def _error_code(fn):
    try:
        fn()
    except BackendError as exc:
        return from_dpch(exc).code
    return None


def test_a_stuck_worker_fails_every_call_in_flight_then_recovers(worker):
    """The deadline backstop with several calls in flight: the worker (stopped with SIGSTOP: in
    production a statement stuck where ClickHouse checks no timeout) is killed once, every call in
    flight fails with TIMEOUT_EXCEEDED, and the fresh worker answers."""
    before, restarts = worker.pid, worker.restarts
    os.kill(before, signal.SIGSTOP)
    threads, out = _in_background(lambda: _error_code(lambda: worker.query_df("SELECT 1",
                                                                            limits=EngineLimits(0.5))), n=2)
    for t in threads:
        t.join()
    assert out == [159, 159]
    assert worker.restarts == restarts + 1 and worker.pid != before
    assert worker.query_df("SELECT 42 AS a")["a"].tolist() == [42]
