"""The gateway's confined engine worker (dpch.engine_worker, dpch.confine; issue 27 items 3 and 5).

(a) A file-reading function sent straight to the worker (past every SQL check) reads nothing: not
    /etc/passwd, not the data directory's users.json, ledger.sqlite or access.log, not the gateway's
    /proc entry. An unconfined worker on the same kind of directory does read users.json: the control
    shows that the probe query itself works.
(b) A DP query through the real `dpch serve` process (engine in the worker) is answered.
(c) Each engine limit is enforced with ClickHouse's code, directly and, per user, through the gateway.
(d) A statement that outlives its deadline gets the worker killed and restarted; the next is answered.
"""
from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import httpx
import pytest

from dpch.confine import landlock_abi
from dpch.engine_worker import EngineLimits, WorkerBackend
from dpch.errors import BackendError
from dpch.gateway.errors import from_dpch
from dpch.users import UserStore

pytestmark = pytest.mark.skipif(landlock_abi() < 1, reason="Landlock is not available in this kernel: the "
                                "engine worker cannot be confined here")

PASSWORD = "alice-secret-1"
MARKERS = ("root:", "$argon2", "SQLite format", "SECRET-ACCESS-LOG-LINE")


def _private_files(d):
    """A data directory holding a real user store, a real ledger and an access log."""
    from dpch.ledger import Ledger

    UserStore(d).add("alice", PASSWORD)
    Ledger(d / "ledger.sqlite").close()
    (d / "access.log").write_text('{"user": "alice", "note": "SECRET-ACCESS-LOG-LINE"}\n')
    return d


def _probes(d):
    return [f"SELECT * FROM file('{p}', 'LineAsString')" for p in
            ("/etc/passwd", d / "users.json", d / "ledger.sqlite", d / "access.log", f"/proc/{os.getpid()}/environ",
             f"/proc/{os.getpid()}/cmdline")]


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    w = WorkerBackend(_private_files(tmp_path_factory.mktemp("confined")), margin=1.0)
    assert w.report["confined"] and w.report["report"]["abi"] >= 1
    yield w
    w.close()


def test_file_functions_read_nothing(worker):
    for sql in _probes(worker.data_dir):
        for run in (worker.query_df, lambda s: worker.query_formatted(s, "TabSeparated"), worker.command):
            with pytest.raises(BackendError) as err:
                run(sql)
            text = str(err.value)
            assert "CANNOT_OPEN_FILE" in text or "Permission denied" in text, text[:200]
            assert not any(m in text for m in MARKERS), sql
    # the worker still answers, and its engine works: the noise UDF runs confined
    assert worker.query_df("SELECT dp_count(1.0) AS n FROM numbers(100)")["n"].notna().all()


def test_unconfined_control_reads_the_user_store(tmp_path):
    """The same probe on an unconfined worker returns the file: (a) fails for the right reason."""
    w = WorkerBackend(_private_files(tmp_path), confined=False)
    try:
        assert not w.report["confined"]
        df = w.query_df(f"SELECT * FROM file('{tmp_path / 'users.json'}', 'LineAsString')")
        assert "$argon2" in "".join(map(str, df.iloc[:, 0]))
    finally:
        w.close()


@pytest.mark.parametrize("limit, sql, code", [
    (EngineLimits(max_execution_time=0.5), "SELECT sum(sipHash64(number)) FROM numbers(100000000000)", 159),
    (EngineLimits(max_memory_usage=20_000_000), "SELECT groupArray(number) FROM numbers(10000000)", 241),
    (EngineLimits(max_rows_to_read=1000), "SELECT count() FROM numbers(100000)", 158),
    (EngineLimits(max_result_rows=10), "SELECT number FROM numbers(1000)", 396),
    (EngineLimits(max_bytes_to_read=1000), "SELECT count() FROM numbers(100000)", 307),
    (EngineLimits(), "SELECT 1 SETTINGS max_execution_time = 1000", 452),  # no statement lifts its own limits
])
def test_engine_limits(worker, limit, sql, code):
    with pytest.raises(BackendError) as err:
        worker.query_df(sql, limits=limit)
    assert from_dpch(err.value).code == code, str(err.value)[:200]
    assert worker.query_df("SELECT 42 AS a", limits=limit)["a"].tolist() == [42]  # the limit blocks only the breach


def test_deadline_kills_and_restarts_the_worker(worker):
    # an engine that never answers (here: stopped with SIGSTOP; in production a statement stuck where
    # ClickHouse checks no timeout) is killed at max_execution_time + margin and replaced
    before, restarts = worker.pid, worker.restarts
    os.kill(before, signal.SIGSTOP)
    with pytest.raises(BackendError) as err:
        worker.query_df("SELECT 1", limits=EngineLimits(max_execution_time=0.5))
    assert from_dpch(err.value).code == 159
    assert worker.restarts == restarts + 1 and worker.pid != before
    with pytest.raises(ProcessLookupError):
        os.kill(before, 0)  # the old worker is gone (killed and reaped)
    assert worker.query_df("SELECT 42 AS a")["a"].tolist() == [42]
    with pytest.raises(BackendError):  # and the new worker is confined as well
        worker.query_df(_probes(worker.data_dir)[1])


# -- through the real gateway process ------------------------------------------------------------------

@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    from test_gateway import Server, _cli, demo_dir

    d = demo_dir(tmp_path_factory, "gw_confined")
    for user, pw in (("alice", PASSWORD), ("bob", "bob-secret-22")):
        _cli("users", "add", user, "--password-stdin", "--data-dir", str(d), stdin=pw + "\n")
        _cli("budget", "set", "--data-dir", str(d), "--analyst", user, "--dataset", "demo.purchases",
             "--epsilon", "100", "--delta", "1e-3")
    UserStore(d).set_limits("bob", {"max_rows_to_read": 10})  # bob's statements may read 10 rows
    s = Server(d).start()
    yield s
    s.stop()


def _q(server, sql, user="alice", password=PASSWORD):
    return httpx.post(server.url + "/", content=sql.encode(), auth=(user, password), timeout=60)


def test_gateway_answers_dp_queries_through_the_worker(gateway):
    r = _q(gateway, "SELECT COUNT(*) AS n FROM demo.purchases SETTINGS dpch_epsilon = 1")
    assert r.status_code == 200, r.text
    float(r.text.strip())
    # the engine process is a child of the gateway, in its own session, and is confined
    children = subprocess.run(["ps", "-o", "pid=,args=", "--ppid", str(gateway.proc.pid)], capture_output=True,
                              text=True).stdout
    assert "dpch.engine_worker" in children


def test_gateway_applies_a_users_limits(gateway):
    r = _q(gateway, "SELECT COUNT(*) AS n FROM demo.purchases SETTINGS dpch_epsilon = 1", user="bob",
           password="bob-secret-22")
    assert r.status_code == 500 and r.headers["X-ClickHouse-Exception-Code"] == "158", r.text
    assert "(TOO_MANY_ROWS)" in r.text
    # alice, under the defaults, is answered right after
    assert _q(gateway, "SELECT COUNT(*) AS n FROM demo.purchases SETTINGS dpch_epsilon = 1").status_code == 200


def test_a_data_dir_inside_a_readable_grant_is_refused():
    """A data directory inside a path the engine must read (here site-packages) would expose the user
    store: the worker refuses to confine itself there, so the gateway does not start."""
    import site

    from dpch.engine_worker import check_grants, grants

    d = Path(site.getsitepackages()[0]).resolve() / "dpch_test_datadir"
    with pytest.raises(BackendError, match="cannot be confined"):
        check_grants(d, grants(d, os.getpid()))
