"""The per-user query cap of the gateway (issue 33, item 3): ClickHouse's
``max_concurrent_queries_for_user``. A user who already has the maximum of queries in flight
(running on an engine thread or waiting for one) is refused at once with 202
TOO_MANY_SIMULTANEOUS_QUERIES: the refused request's work never starts (so nothing is charged:
the charge is part of that work), other users are unaffected, and the user's next request after
one finishes is accepted. Configurable per user and on ``dpch serve``'s command line.

The engine work here is a function that blocks on an event the test releases: no timing, no engine.
"""
from __future__ import annotations

import asyncio
import threading

import pytest

from dpch.cli import build_parser
from dpch.gateway.errors import GatewayError
from dpch.gateway.limits import DEFAULT_QUERIES_PER_USER, UserQueryCaps
from dpch.gateway.server import Gateway, GatewayConfig


@pytest.fixture
def gateway(tmp_path):
    gw = Gateway(GatewayConfig(data_dir=tmp_path, engine_sessions=4,
                               user_queries=UserQueryCaps(default=2, per_user=(("alice", 1),))))
    yield gw
    gw.engine.shutdown(wait=True)
    gw.auth_pool.shutdown(wait=True)
    gw.access.close()


def _blocking():
    """(work, started, release, calls): ``work(name)`` records its call, signals, waits for release."""
    started, release, calls = threading.Semaphore(0), threading.Event(), []

    def work(name):
        calls.append(name)
        started.release()
        assert release.wait(30)
        return name
    return work, started, release, calls


async def _started(started: threading.Semaphore, n: int) -> None:
    for _ in range(n):
        assert await asyncio.get_running_loop().run_in_executor(None, started.acquire, True, 30)


def test_a_user_at_the_cap_is_refused_with_202_and_nothing_runs(gateway):
    work, started, release, calls = _blocking()

    async def scenario():
        first = asyncio.ensure_future(gateway.on_engine(work, "alice-1", user="alice"))
        await _started(started, 1)
        with pytest.raises(GatewayError) as refused:
            await gateway.on_engine(work, "alice-2", user="alice")
        # bob (default cap 2) runs two at once while alice's first query still holds its slot
        bobs = [asyncio.ensure_future(gateway.on_engine(work, f"bob-{i}", user="bob")) for i in range(2)]
        await _started(started, 2)
        with pytest.raises(GatewayError) as bob_refused:
            await gateway.on_engine(work, "bob-3", user="bob")
        release.set()
        done = [await first] + [await b for b in bobs]
        # after alice's query ended, her next one is accepted
        again = await gateway.on_engine(work, "alice-3", user="alice")
        return refused.value, bob_refused.value, done, again

    refused, bob_refused, done, again = asyncio.run(scenario())
    for err in (refused, bob_refused):
        assert (err.code, err.name, err.status) == (202, "TOO_MANY_SIMULTANEOUS_QUERIES", 503)
        assert err.headers()["X-ClickHouse-Exception-Code"] == "202"
    assert "the maximum is 1" in refused.message and "the maximum is 2" in bob_refused.message
    assert done == ["alice-1", "bob-0", "bob-1"] and again == "alice-3"
    # the refused requests' work never started (the charge is part of it: nothing charged)
    assert sorted(calls) == ["alice-1", "alice-3", "bob-0", "bob-1"]
    assert gateway._in_flight == {}


def test_a_failed_query_frees_its_place(gateway):
    def boom():
        raise RuntimeError("engine failure")

    async def scenario():
        with pytest.raises(RuntimeError):
            await gateway.on_engine(boom, user="alice")
        return await gateway.on_engine(lambda: "ok", user="alice")

    assert asyncio.run(scenario()) == "ok"
    assert gateway._in_flight == {}


def test_zero_means_no_cap_beyond_the_engine_share(tmp_path):
    """Cap 0: more queries than the cap would allow are accepted; the user's engine share
    (engine_sessions - 1 = 1 here) makes the extra ones wait, not fail."""
    gw = Gateway(GatewayConfig(data_dir=tmp_path, engine_sessions=2, user_queries=UserQueryCaps(default=0)))
    work, started, release, calls = _blocking()

    async def scenario():
        jobs = [asyncio.ensure_future(gw.on_engine(work, f"q{i}", user="alice")) for i in range(3)]
        await _started(started, 1)
        release.set()
        return [await j for j in jobs]

    try:
        assert asyncio.run(scenario()) == ["q0", "q1", "q2"]
    finally:
        gw.engine.shutdown(wait=True)
        gw.auth_pool.shutdown(wait=True)
        gw.access.close()


def test_caps_from_the_command_line():
    parser = build_parser("serve")
    args = parser.parse_args(["serve", "--max-concurrent-queries-for-user", "3",
                              "--max-concurrent-queries-for-user", "alice=1",
                              "--max-concurrent-queries-for-user", "bob=0"])
    caps = UserQueryCaps.parse(args.max_concurrent_queries_for_user)
    assert (caps.for_user("alice"), caps.for_user("bob"), caps.for_user("carol")) == (1, 0, 3)
    assert UserQueryCaps.parse(None).for_user("anyone") == DEFAULT_QUERIES_PER_USER
    for bad in (["x"], ["=2"], ["alice=-1"], ["alice=two"]):
        with pytest.raises(ValueError):
            UserQueryCaps.parse(bad)
