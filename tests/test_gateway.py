"""The DP gateway (`dpch serve`), tested as a real process on loopback with clickhouse-connect and
plain HTTP (httpx, raw sockets)."""
from __future__ import annotations

import base64
import json
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from dpch.dp_functions import rewrite_sql
from dpch.errors import InvalidParameter, QueryRejected

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
PASSWORD = "alice-secret-1"


def _cli(*args, stdin=None, check=True):
    r = subprocess.run([PY, "-m", "dpch.cli", *args], input=stdin, capture_output=True, text=True, cwd=ROOT,
                       timeout=120)
    if check and r.returncode != 0:
        raise AssertionError(f"dpch {' '.join(args)} failed: {r.stderr}")
    return r


_DEMO_TEMPLATES: dict[int, Path] = {}


def demo_dir(tmp_path_factory, name: str, rows: int = 2000) -> Path:
    """A fresh data directory holding what `dpch demo --rows ROWS` leaves (tables, catalog, ledger):
    the demo runs once per (test process, rows), taking 4-5 s, and each caller gets a copy
    (milliseconds). No process holds the template's store while it is copied."""
    if rows not in _DEMO_TEMPLATES:
        template = tmp_path_factory.mktemp(f"demo_template_{rows}")
        _cli("demo", "--data-dir", str(template), "--rows", str(rows))
        _DEMO_TEMPLATES[rows] = template
    d = tmp_path_factory.mktemp(name)
    shutil.copytree(_DEMO_TEMPLATES[rows], d, symlinks=True, dirs_exist_ok=True)  # the store links relatively
    return d


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A real `dpch serve` process on a free port; ``args`` are more `dpch serve` options (the
    gateway attack tests share it)."""

    def __init__(self, data_dir: Path, *args: str, start_timeout: float = 60):
        self.data_dir = data_dir
        self.args = args
        self.start_timeout = start_timeout
        self.port = _free_port()
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen([PY, "-m", "dpch.cli", "serve", "--data-dir", str(self.data_dir), "--port",
                                      str(self.port), "--body-timeout", "2", *self.args], cwd=ROOT,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.time() + self.start_timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"gateway exited: {self.proc.stdout.read()}")
            try:
                if httpx.get(self.url + "/ping", timeout=1).text == "Ok.\n":
                    return self
            except httpx.HTTPError:
                time.sleep(0.1)
        raise AssertionError("gateway did not start")

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def stop(self, sig=signal.SIGTERM):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)

    def alive(self):
        return self.proc.poll() is None and httpx.get(self.url + "/ping", timeout=2).text == "Ok.\n"


@pytest.fixture(scope="module")
def setup_dir(tmp_path_factory):
    d = demo_dir(tmp_path_factory, "gw", 20000)
    _cli("users", "add", "alice", "--password-stdin", "--data-dir", str(d), stdin=PASSWORD + "\n")
    _cli("users", "add", "bob", "--password-stdin", "--data-dir", str(d), stdin="bob-secret-22\n")
    _cli("budget", "set", "--data-dir", str(d), "--analyst", "alice", "--dataset", "demo.purchases",
         "--epsilon", "1000", "--delta", "1e-3")
    zones = d / "zones.csv"  # a public dimension table, loaded and registered with the CLI
    zones.write_text("region,zone\n" + "".join(f"{r},{z}\n" for r, z in
                                               [("north", "N"), ("south", "S"), ("east", "E"), ("west", "W")]))
    _cli("load", "demo.zones", str(zones), "--data-dir", str(d), "--no-progress")
    _cli("catalog", "register", "demo.zones", "--public", "--data-dir", str(d))
    return d


@pytest.fixture(scope="module")
def server(setup_dir):
    s = Server(setup_dir).start()
    yield s
    s.stop()
    out = s.proc.stdout.read()
    assert "dpch serve: stopped" in out, out  # graceful: the lifespan shutdown ran (uvicorn re-raises SIGTERM)


def q(server, sql, user="alice", password=PASSWORD, **params):
    return httpx.post(server.url + "/", params=params, content=sql.encode(), auth=(user, password), timeout=30)


# -- unit: dp_* rewriting --------------------------------------------------------------------------

def test_dp_functions_rewrite_unit():
    rw = rewrite_sql("SELECT region, dp_count(1) AS n, dp_sum(amount, 0, 1000, 2) AS s, dp_avg(age, 0, 50, 1) "
                     "FROM demo.purchases GROUP BY region ORDER BY dp_count(1) DESC")
    assert rw.epsilon == 4 and rw.delta == 0 and rw.mechanism == "laplace"
    assert rw.weights == {"n": 1, "s": 2, "dp_avg(age, 0, 50, 1)": 0.5}
    assert "SUM(least(greatest(amount, 0), 1000))" in rw.sql and "ORDER BY COUNT(*) DESC" in rw.sql
    g = rewrite_sql("SELECT dp_count_gaussian(1, 1e-6), dp_sum_gaussian(amount, 0, 1, 1, 1e-6) FROM t")
    assert g.mechanism == "gaussian" and g.delta == pytest.approx(2e-6)
    for bad, exc in [("SELECT dp_count(0) FROM t", InvalidParameter), ("SELECT dp_sum(x, 5, 1, 1) FROM t", InvalidParameter),
                     ("SELECT dp_count(1) + 1 FROM t", QueryRejected), ("SELECT dp_count(1), dp_count_gaussian(1, 1e-6) FROM t", QueryRejected),
                     ("SELECT dp_sum(x, 0, 1) FROM t", QueryRejected), ("SELECT dpch_laplace(1, 1) FROM t", QueryRejected),
                     ("SELECT dp_sum(x, 0, y, 1) FROM t", QueryRejected)]:
        with pytest.raises(exc):
            rewrite_sql(bad)


# -- protocol --------------------------------------------------------------------------------------

def test_ping_and_metadata(server):
    r = httpx.get(server.url + "/ping")
    assert r.status_code == 200 and r.text == "Ok.\n"
    r = q(server, "SELECT version(), timezone(), currentUser()")
    assert r.status_code == 200 and r.text.strip().split("\t")[1:] == ["UTC", "alice"]
    assert q(server, "SHOW DATABASES").text.split() == ["default", "demo"]
    assert q(server, "SHOW TABLES FROM demo").text.split() == ["purchases", "zones"]
    rows = [l.split("\t") for l in q(server, "DESCRIBE TABLE demo.purchases").text.strip().splitlines()]
    assert {r[0] for r in rows} == {"age", "amount", "purchase_id", "region", "user_id"}
    assert any("bounds [0, 610]" in r[4] for r in rows if r[0] == "amount")
    cols = json.loads(q(server, "SELECT name, dpch_upper_bound FROM system.columns WHERE table = 'purchases' "
                        "AND name = 'amount' FORMAT JSONEachRow").text)
    assert cols == {"name": "amount", "dpch_upper_bound": 610}
    for denied in ["SELECT * FROM system.tables_x", "SELECT * FROM dpch_meta.catalog", "SELECT * FROM system.parts",
                   "INSERT INTO demo.purchases VALUES (1)", "CREATE TABLE x (a Int8) ENGINE=Memory",
                   "SELECT * FROM file('/etc/passwd')", "SELECT * FROM numbers(3)", "DROP FUNCTION dp_sum",
                   "SELECT dpch_laplace(1, 1)", "SELECT COUNT(*) FROM demo.nonexistent SETTINGS dpch_epsilon = 1",
                   "SELECT COUNT(*) FROM demo.purchases SETTINGS max_threads = 1", "SHOW CREATE TABLE demo.purchases"]:
        r = q(server, denied)
        assert r.status_code == 403 and r.headers["X-ClickHouse-Exception-Code"] == "497", (denied, r.text)
        assert r.text.startswith("Code: 497. DB::Exception: ") and r.text.rstrip().endswith("(ACCESS_DENIED)")


def test_clickhouse_connect(server):
    import clickhouse_connect

    c = clickhouse_connect.get_client(host="127.0.0.1", port=server.port, username="alice", password=PASSWORD)
    assert c.query("SELECT currentUser()").result_rows == [("alice",)]
    df = c.query_df("SELECT region, COUNT(*) AS n, AVG(amount) AS a FROM demo.purchases GROUP BY region",
                    settings={"dpch_epsilon": 1, "dpch_with_ci": 1})
    assert set(df.columns) == {"region", "n", "a", "n_lo", "n_hi", "a_lo", "a_hi"}
    assert sorted(df.region) == ["centre", "east", "north", "south", "west"]
    assert all(abs(n - 4000) < 500 for n in df.n)
    arrow = c.query_arrow("SELECT dp_count(1) AS n FROM demo.purchases")
    assert arrow.column_names == ["n"]
    assert c.query_df("SHOW TABLES FROM demo")["name"].tolist() == ["purchases", "zones"]
    with pytest.raises(Exception, match="9104"):
        c.query("SELECT COUNT(*) FROM demo.purchases")
    c.close()


def test_formats(server):
    sql = "SELECT region, COUNT(*) AS n FROM demo.purchases GROUP BY region SETTINGS dpch_epsilon = 0.5"
    for fmt, check in [("TabSeparatedWithNamesAndTypes", lambda t: t.splitlines()[:2] == ["region\tn", "String\tInt64"]),
                       ("JSON", lambda t: len(json.loads(t)["data"]) == 5),
                       ("JSONEachRow", lambda t: len(t.strip().splitlines()) == 5),
                       ("JSONCompact", lambda t: len(json.loads(t)["data"]) == 5),
                       ("CSVWithNames", lambda t: t.splitlines()[0] == '"region","n"')]:
        r = q(server, sql + f" FORMAT {fmt}")
        assert r.status_code == 200 and r.headers["X-ClickHouse-Format"] == fmt and check(r.text), (fmt, r.text)
        assert json.loads(r.headers["X-ClickHouse-Summary"])["read_rows"] == "0"
        assert float(r.headers["X-DPCH-Epsilon"]) == pytest.approx(0.5)
    r = q(server, "SELECT COUNT(*) AS n FROM demo.purchases", default_format="Native", dpch_epsilon="0.5")
    assert r.status_code == 200 and r.content[:4] == b"\x01\x01\x01n"
    r = q(server, "SELECT COUNT(*) AS n FROM demo.purchases FORMAT Bogus SETTINGS dpch_epsilon = 1")
    assert r.status_code == 400 and r.headers["X-ClickHouse-Exception-Code"] in ("73", "62")


def test_settings_epsilon_and_dp_functions_charge(server):
    def spent():
        out = _cli("budget", "show", "--data-dir", str(server.data_dir), "--analyst", "alice").stdout
        return float(out.splitlines()[2].split()[5])
    # the budget CLI reads the ledger while the gateway holds it (SQLite WAL, one host)
    s0 = spent()
    r = q(server, "SELECT COUNT(*) AS n FROM demo.purchases SETTINGS dpch_epsilon = 0.25, dpch_mechanism = 'laplace'")
    assert r.status_code == 200, r.text
    r = q(server, "SELECT dp_count(0.5) AS n, dp_sum(amount, 0, 100000, 0.25) AS s FROM demo.purchases "
                  "FORMAT JSONEachRow")
    assert r.status_code == 200, r.text
    assert float(r.headers["X-DPCH-Epsilon"]) == pytest.approx(0.75)
    assert spent() == pytest.approx(s0 + 1.0)
    r = q(server, "SELECT COUNT(*) FROM demo.purchases")
    assert r.status_code == 400 and "dpch_epsilon" in r.text and r.headers["X-ClickHouse-Exception-Code"] == "9104"
    assert spent() == pytest.approx(s0 + 1.0)


def test_auth_failures_are_identical(server):
    cases = {"wrong password": dict(auth=("alice", "nope")), "unknown user": dict(auth=("mallory", "nope")),
             "missing": {}, "X-ClickHouse headers": dict(headers={"X-ClickHouse-User": "alice", "X-ClickHouse-Key": "x"}),
             "url params": dict(params={"user": "alice", "password": "x"})}
    bodies = {}
    for name, kw in cases.items():
        r = httpx.post(server.url + "/", content=b"SELECT 1", timeout=10, **kw)
        assert r.status_code == 403 and r.headers["X-ClickHouse-Exception-Code"] == "516", name
        bodies[name] = r.text.split("DB::Exception: ", 1)[1].split(": ", 1)[1]  # after the echoed user name
    assert len(set(bodies.values())) == 1, bodies
    # the other ways to authenticate work
    assert httpx.post(server.url + "/", content=b"SELECT 1", headers={"X-ClickHouse-User": "alice",
                      "X-ClickHouse-Key": PASSWORD}).text == "1\n"
    assert httpx.post(server.url + "/", params={"user": "alice", "password": PASSWORD, "query": "SELECT 1"}).text == "1\n"
    # timing: unknown user vs wrong password (both run one argon2 verification, which dominates).
    # Interleaved samples (load drifts hit both alike), medians of 9, ratio within 1.5 either way,
    # up to 3 attempts: a correct gateway fails only if load spikes skew 5 of 9 samples of one side
    # by 50% in three attempts running; a gateway that skipped argon2 for unknown users would show
    # a ratio of about 10 (argon2 ≈ 30-50 ms here against ≈ 2 ms for a request).
    def medians():
        known, unknown = [], []
        for _ in range(9):
            for user, out in (("alice", known), ("nobody", unknown)):
                t0 = time.perf_counter()
                httpx.post(server.url + "/", content=b"SELECT 1", auth=(user, "wrong-password"))
                out.append(time.perf_counter() - t0)
        return statistics.median(known), statistics.median(unknown)
    tries = []
    for _ in range(3):
        known, unknown = medians()
        tries.append((known, unknown))
        if max(known, unknown) <= 1.5 * min(known, unknown):
            break
    else:
        pytest.fail(f"auth failure time depends on whether the user exists: {tries}")


def test_bad_http_input(server):
    r = httpx.post(server.url + "/", content=b"SELECT 1 " + b" " * (2 << 20), auth=("alice", PASSWORD))
    assert r.status_code == 413 and "TOO_MANY_BYTES" in r.text
    r = httpx.post(server.url + "/", content=b"SELECT 1", headers={"Authorization": "Basic !!!notbase64"})
    assert r.status_code == 400 and r.text.startswith("Code: 36.")
    r = httpx.post(server.url + "/", content=b"SELECT 1",
                   headers={"Authorization": "Basic " + base64.b64encode(b"no-colon").decode()})
    assert r.status_code == 400
    r = q(server, "SELECT 1 FORMAT NoSuchFormat")
    assert r.status_code == 400 and r.headers["X-ClickHouse-Exception-Code"] == "73"
    r = q(server, "SELECT COUNT(*) FROM demo.purchases SETTINGS dpch_epsilon = 1; DROP TABLE demo.purchases")
    assert r.status_code == 400 and "Multi-statements" in r.text
    r = httpx.post(server.url + "/", content=b"SELECT '\xff\xfe'", auth=("alice", PASSWORD))
    assert r.status_code == 400 and r.headers["X-ClickHouse-Exception-Code"] == "27"
    r = httpx.get(server.url + "/?query=SELECT%20%27%FF%27", auth=("alice", PASSWORD))
    assert r.status_code == 400
    r = q(server, "SELEC garbage ((")
    assert r.status_code in (400, 403)
    # slow client: sends headers and part of the body, then stalls; others are served meanwhile
    s = socket.create_connection(("127.0.0.1", server.port))
    auth = base64.b64encode(f"alice:{PASSWORD}".encode()).decode()
    s.sendall(f"POST / HTTP/1.1\r\nHost: x\r\nAuthorization: Basic {auth}\r\nContent-Length: 100\r\n\r\nSELECT".encode())
    t0 = time.perf_counter()
    # not blocked behind the stalled body (the body timeout is seconds; 5 s leaves room for load)
    assert httpx.get(server.url + "/ping").text == "Ok.\n" and time.perf_counter() - t0 < 5
    s.settimeout(10)
    reply = b""
    while b"TIMEOUT" not in reply:  # headers and body may arrive in separate segments
        chunk = s.recv(4096)
        if not chunk:
            break
        reply += chunk
    s.close()
    assert b"408" in reply.split(b"\r\n")[0] and b"TIMEOUT" in reply
    # a connection that sends garbage instead of HTTP
    g = socket.create_connection(("127.0.0.1", server.port))
    g.sendall(b"\x00\x01\x02 not http\r\n\r\n")
    g.settimeout(5)
    try:
        g.recv(100)
    except OSError:
        pass
    g.close()
    assert server.alive()


def test_access_log(server):
    q(server, "SELECT COUNT(*) AS n FROM demo.purchases SETTINGS dpch_epsilon = 0.125")
    q(server, "SELECT 1", password="wrong")
    lines = [json.loads(l) for l in (server.data_dir / "access.log").read_text().splitlines()]
    ok = [l for l in lines if l.get("epsilon") == 0.125]
    assert ok and ok[-1]["user"] == "alice" and ok[-1]["outcome"] == "accepted" and ok[-1]["kind"] == "dp"
    assert {"time", "query_id", "duration_ms", "query_sha256"} <= set(ok[-1])
    assert lines[-1]["outcome"] == "rejected" and lines[-1]["code"] == 516 and lines[-1].get("user") is None
    text = (server.data_dir / "access.log").read_text()
    assert PASSWORD not in text and "wrong" not in text.replace('"error"', "") and "SELECT" not in text


def _burst(url, n, sql, auth):
    results = [None] * n
    barrier = threading.Barrier(n)

    def one(i):
        barrier.wait()
        try:
            r = httpx.post(url + "/", content=sql.encode(), auth=auth, timeout=60)
            results[i] = r.status_code
        except httpx.HTTPError:
            results[i] = "conn"
    ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return results


def test_budget_exhaustion_16_clients(server):
    _cli("budget", "set", "--data-dir", str(server.data_dir), "--analyst", "bob", "--dataset", "demo.purchases",
         "--epsilon", "1.0")
    res = _burst(server.url, 16, "SELECT COUNT(*) FROM demo.purchases SETTINGS dpch_epsilon = 0.1",
                 ("bob", "bob-secret-22"))
    assert res.count(200) == 10 and res.count(403) == 6, res
    r = q(server, "SELECT COUNT(*) FROM demo.purchases SETTINGS dpch_epsilon = 0.1", user="bob", password="bob-secret-22")
    assert r.headers["X-ClickHouse-Exception-Code"] == "9102"


def test_kill9_during_burst_then_restart(setup_dir, server):
    # a second data dir copy would need a second store; use another analyst on the same server dir
    _cli("users", "add", "carol", "--password-stdin", "--data-dir", str(setup_dir), stdin="carol-secret-3\n")
    _cli("budget", "set", "--data-dir", str(setup_dir), "--analyst", "carol", "--dataset", "demo.purchases",
         "--epsilon", "100")
    server.stop()
    s2 = Server(setup_dir).start()
    answered = []
    lock = threading.Lock()

    def client():
        while True:
            try:
                r = httpx.post(s2.url + "/", content=b"SELECT COUNT(*) FROM demo.purchases SETTINGS dpch_epsilon = 0.01",
                               auth=("carol", "carol-secret-3"), timeout=10)
            except httpx.HTTPError:
                return
            if r.status_code == 200:
                with lock:
                    answered.append(r.headers["X-ClickHouse-Query-Id"])
    ts = [threading.Thread(target=client) for _ in range(6)]
    for t in ts:
        t.start()
    deadline = time.time() + 90
    while len(answered) < 5 and time.time() < deadline:  # kill during the burst, once answers flow
        time.sleep(0.05)
    time.sleep(0.3)
    s2.proc.kill()
    s2.proc.wait()
    for t in ts:
        t.join()
    assert answered
    server.start()  # the module's gateway again: the ledger opens (and verifies) at start
    r = q(server, "SELECT COUNT(*) FROM demo.purchases SETTINGS dpch_epsilon = 0.01", user="carol", password="carol-secret-3")
    assert r.status_code == 200
    out = _cli("budget", "show", "--data-dir", str(setup_dir), "--analyst", "carol").stdout
    charges = int(out.splitlines()[2].split()[-1])
    assert charges >= len(answered) + 1, (charges, len(answered))


def test_join_and_cte_through_the_gateway(server):
    sql = ("WITH p AS (SELECT user_id, region, amount FROM demo.purchases WHERE amount < 300) "
           "SELECT z.zone AS zone, COUNT(*) AS n FROM p JOIN demo.zones z ON p.region = z.region "
           "GROUP BY zone ORDER BY zone SETTINGS dpch_epsilon = 0.5 FORMAT JSONEachRow")
    r = q(server, sql)
    assert r.status_code == 200, r.text
    rows = [json.loads(line) for line in r.text.splitlines()]
    assert [row["zone"] for row in rows] == sorted(row["zone"] for row in rows) and rows
    assert float(r.headers["X-DPCH-Epsilon"]) == pytest.approx(0.5)
    r = q(server, "SELECT COUNT(*) FROM demo.zones SETTINGS dpch_epsilon = 1")
    assert r.status_code == 400 and "only public tables" in r.text


# -- partition selection rule (dpch_selection, the gateway's `selection=`) ---------------------------

def _selection_message() -> str:
    from dpch.plan.options import SELECTION_RULES

    return f"dpch_selection must be {', '.join(SELECTION_RULES[:-1])} or {SELECTION_RULES[-1]}"


_SELECTION_MESSAGE = _selection_message()  # the planner's rules (auto, optimal, gaussian, laplace, …)


def test_selection_setting_is_validated_unit():
    """dpch_selection takes the values of db.query(selection=...) and the CLI's --selection
    (dpch.plan.options.SELECTION_RULES), in any case; anything else is DPCH_INVALID_PARAMETER naming
    the setting and the accepted values (no engine, no charge: the settings are read before anything
    runs)."""
    from dpch.gateway.errors import GatewayError
    from dpch.gateway.router import DPOptions
    from dpch.plan.options import SELECTION_RULES

    assert DPOptions.from_settings({}).selection == "auto"
    assert DPOptions.from_settings({"dpch_selection": ""}).selection == "auto"
    for rule in SELECTION_RULES:
        assert DPOptions.from_settings({"dpch_selection": rule.upper()}).selection == rule
    for bad in ["magic", "optimal ", "gauss", "none", "1"]:
        with pytest.raises(GatewayError) as e:
            DPOptions.from_settings({"dpch_selection": bad})
        assert e.value.code == 9103
        assert e.value.message == _SELECTION_MESSAGE


def test_selection_setting_reaches_the_planner(server):
    """A GROUP BY key without a public domain (intDiv(purchase_id, 1000): purchase_id has no bounds)
    is selected privately; dpch_selection picks the rule, in SETTINGS or as a URL parameter, and
    system.settings lists it. The value reaches the planner: the optimal rule cannot be offered at
    δ = 1e-40 (it needs δ ≥ 2^-96), so 'optimal' is refused there before any charge, while 'auto'
    falls back to the Laplace threshold and answers. Bad values, and a rule asked for together with
    dp_* functions (which choose the rule themselves), are refused before any charge."""
    def spent():
        out = _cli("budget", "show", "--data-dir", str(server.data_dir), "--analyst", "alice").stdout
        return float(out.splitlines()[2].split()[5])
    sql = ("SELECT intDiv(purchase_id, 1000) AS b, COUNT(*) AS n FROM demo.purchases GROUP BY b "
           "SETTINGS dpch_epsilon = 0.5, dpch_delta = {delta}, dpch_selection = '{rule}' FORMAT JSONEachRow")
    s0 = spent()
    for rule in ("auto", "optimal", "gaussian", "laplace", "Laplace"):
        r = q(server, sql.format(delta=1e-6, rule=rule))
        assert r.status_code == 200, (rule, r.text)
        assert float(r.headers["X-DPCH-Epsilon"]) == pytest.approx(0.5)
        assert float(r.headers["X-DPCH-Delta"]) == pytest.approx(1e-6)
    r = q(server, "SELECT intDiv(purchase_id, 1000) AS b, COUNT(*) AS n FROM demo.purchases GROUP BY b",
          dpch_epsilon="0.5", dpch_delta="1e-6", dpch_selection="gaussian")
    assert r.status_code == 200, r.text
    assert spent() == pytest.approx(s0 + 3.0)
    r = q(server, sql.format(delta=1e-40, rule="auto"))
    assert r.status_code == 200, r.text
    assert spent() == pytest.approx(s0 + 3.5)
    refused = [(sql.format(delta=1e-40, rule="optimal"), "selection='optimal'"),
               (sql.format(delta=1e-6, rule="magic"), _SELECTION_MESSAGE),
               ("SELECT dp_count(0.5) AS n FROM demo.purchases SETTINGS dpch_selection = 'optimal'",
                "dpch_selection applies to SQL aggregates with dpch_epsilon")]
    for bad, message in refused:
        r = q(server, bad)
        assert r.status_code == 400 and r.headers["X-ClickHouse-Exception-Code"] == "9103", (bad, r.text)
        assert message in r.text and "DPCH_INVALID_PARAMETER" in r.text, r.text
    r = q(server, "SELECT dp_count(0.5) AS n FROM demo.purchases SETTINGS dpch_selection = 'auto'")
    assert r.status_code == 200, r.text
    assert spent() == pytest.approx(s0 + 4.0)
    rows = json.loads(q(server, "SELECT name, default FROM system.settings WHERE name = 'dpch_selection' "
                        "FORMAT JSONEachRow").text)
    assert rows == {"name": "dpch_selection", "default": "auto"}


def test_top_k_setting_is_validated_unit():
    """dpch_top_k takes TOP_K_METHODS in any case; anything else is DPCH_INVALID_PARAMETER naming the
    setting (read before anything runs)."""
    from dpch.gateway.errors import GatewayError
    from dpch.gateway.router import DPOptions
    from dpch.plan.options import TOP_K_METHODS

    assert DPOptions.from_settings({}).top_k == "auto"
    for method in TOP_K_METHODS:
        assert DPOptions.from_settings({"dpch_top_k": method.upper()}).top_k == method
    for bad in ["fast", "peel", " peeling"]:
        with pytest.raises(GatewayError) as e:
            DPOptions.from_settings({"dpch_top_k": bad})
        assert e.value.code == 9103 and "dpch_top_k must be" in e.value.message


def test_top_k_setting_reaches_the_planner(server):
    """A top-n query over the public regions answers with n rows under both methods; peeling on a
    query that is not a top-n query is refused by the planner before any charge (9103), as is a
    method other than auto with dp_* functions; system.settings lists dpch_top_k."""
    sql = ("SELECT region, COUNT(*) AS n FROM demo.purchases GROUP BY region ORDER BY n DESC LIMIT 2 "
           "SETTINGS dpch_epsilon = 0.5, dpch_top_k = '{m}' FORMAT JSONEachRow")
    for method in ("peeling", "post_processing", "AUTO"):
        r = q(server, sql.format(m=method))
        assert r.status_code == 200, (method, r.text)
        assert len([line for line in r.text.splitlines() if line.strip()]) == 2, r.text
    for bad, message in [("SELECT COUNT(*) AS n FROM demo.purchases SETTINGS dpch_epsilon = 0.5, dpch_top_k = 'peeling'",
                          "top_k='peeling' needs a grouped query"),
                         ("SELECT dp_count(0.5) AS n FROM demo.purchases SETTINGS dpch_top_k = 'peeling'",
                          "dpch_top_k applies to SQL aggregates with dpch_epsilon")]:
        r = q(server, bad)
        assert r.status_code == 400 and r.headers["X-ClickHouse-Exception-Code"] == "9103", (bad, r.text)
        assert message in r.text, r.text
    rows = json.loads(q(server, "SELECT name, default FROM system.settings WHERE name = 'dpch_top_k' "
                        "FORMAT JSONEachRow").text)
    assert rows == {"name": "dpch_top_k", "default": "auto"}


# -- sparse vector as one request (POST /dpch/svt) ----------------------------------------------------

def test_sparse_vector_request(server):
    """One request carries the session's queries; ρ and the settlement stay in the gateway. The
    demo table has 20 000 rows (bounded COUNT(*) >= 18 154, one row per unit for most units), the
    threshold 1 000: "amount < 0" (0 rows) is ⊥ and the whole table ⊤ except with probability
    < e^-40 each (ε = 2, c = 2: ν's scale 2·c·Δ/ε2 ≈ 32 with Δ = 10, ρ's ≈ 26). The GROUP BY query
    is refused (null, message), ran nothing and consumed nothing; the charge settles at
    ε1 + ε2/2 for the one ⊤ (Lemma 8), ε1 = ε/(1 + (2c)^(2/3))."""
    below = "SELECT COUNT(*) FROM demo.purchases WHERE amount < 0"
    above = "SELECT COUNT(*) FROM demo.purchases"
    body = {"dataset": "demo.purchases", "threshold": 1000, "epsilon": 2.0, "max_positives": 2,
            "queries": [below, "SELECT region, COUNT(*) FROM demo.purchases GROUP BY region", above, below]}
    r = httpx.post(server.url + "/dpch/svt", json=body, auth=("alice", PASSWORD), timeout=60)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["answers"] == [False, None, True, False] and out["positives"] == 1 and out["stopped_at"] is None
    assert list(out["errors"]) == ["1"] and "GROUP BY" in out["errors"]["1"]
    eps1 = 2.0 / (1 + 4 ** (2 / 3))
    assert out["epsilon_reserved"] == pytest.approx(2.0)
    assert out["epsilon_spent"] == pytest.approx(eps1 + (2.0 - eps1) / 2, rel=1e-9)
    assert float(r.headers["X-DPCH-Epsilon"]) == pytest.approx(out["epsilon_spent"])
    # c = 1: the session stops at the first ⊤; the rest is not run
    body.update(max_positives=1, queries=[above, below, below])
    out = httpx.post(server.url + "/dpch/svt", json=body, auth=("alice", PASSWORD), timeout=60).json()
    assert out["answers"] == [True] and out["stopped_at"] == 1 and out["epsilon_spent"] == pytest.approx(2.0)
    for bad, word in [({**body, "queries": []}, "queries"), ({**body, "epsilon": "1"}, "epsilon"),
                      ({**body, "max_positives": 0}, "max_positives"), ({**body, "extra": 1}, "unknown field")]:
        r = httpx.post(server.url + "/dpch/svt", json=bad, auth=("alice", PASSWORD), timeout=60)
        assert r.status_code == 400 and word in r.text, r.text
    r = httpx.post(server.url + "/dpch/svt", json=body, auth=("alice", "wrong"), timeout=60)
    assert r.status_code == 403 and r.headers["X-ClickHouse-Exception-Code"] == "516", r.text


# -- propose-test-release as one request (POST /dpch/ptr) ---------------------------------------------

def test_ptr_request(server):
    """A robust median through the gateway: the reservation and the settlement happen server side;
    the analyst sees the branch, the value and what was charged (headers as for a query). The
    budget's accountant (basic) settles a ⊥ to ε/2 and a release at ε (docs/PTR.md). Malformed
    bodies are refused naming the field, a bad password like every route."""
    body = {"statistic": "median", "dataset": "demo.purchases", "column": "amount", "epsilon": 0.5,
            "delta": 1e-9, "bound": 50.0}
    r = httpx.post(server.url + "/dpch/ptr", json=body, auth=("alice", PASSWORD), timeout=120)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["branch"] in ("released", "bottom") and out["epsilon_reserved"] == pytest.approx(0.5)
    expected = 0.5 if out["branch"] == "released" else 0.25
    assert out["epsilon_charged"] == pytest.approx(expected)
    assert (out["value"] is None) == (out["branch"] == "bottom")
    if out["value"] is not None:
        assert 0.0 <= out["value"] <= 500.0
    assert float(r.headers["X-DPCH-Epsilon"]) == pytest.approx(expected)
    for bad, word in [({**body, "epsilon": "1"}, "epsilon"), ({**body, "column": ""}, "column"),
                      ({**body, "extra": 1}, "unknown field")]:
        r = httpx.post(server.url + "/dpch/ptr", json=bad, auth=("alice", PASSWORD), timeout=60)
        assert r.status_code == 400 and word in r.text, r.text
    r = httpx.post(server.url + "/dpch/ptr", json=body, auth=("alice", "wrong"), timeout=60)
    assert r.status_code == 403 and r.headers["X-ClickHouse-Exception-Code"] == "516", r.text


def test_auto_bounds_and_bias_headers(server):
    """Issue 29 through the gateway: 'auto' bounds and the bias share as settings, the chosen bounds
    and the noisy shares in X-DPCH-* headers (never in the body), one charge of the requested ε."""
    sql = "SELECT region, COUNT(*) AS n FROM demo.purchases GROUP BY region FORMAT JSONEachRow"
    r = q(server, sql, dpch_epsilon="0.5", dpch_max_rows_per_unit="auto", dpch_max_groups_contributed="auto",
          dpch_bias_share="0.05")
    assert r.status_code == 200, r.text
    assert float(r.headers["X-DPCH-Epsilon"]) == pytest.approx(0.5, rel=1e-12)
    assert "max_rows_per_unit=" in r.headers["X-DPCH-Bounds"]
    for h in ("X-DPCH-Bias-Units-Cut", "X-DPCH-Bias-Values-Clipped", "X-DPCH-Bias-Rows-Dropped"):
        assert 0.0 <= float(r.headers[h]) <= 1.0
    assert {json.loads(line)["region"] for line in r.text.splitlines()} == {"north", "south", "east", "west", "centre"}
    assert "bias" not in r.text
    r = q(server, "SELECT SUM(amount) AS s FROM demo.purchases", dpch_epsilon="0.5", dpch_bounds="auto")
    assert r.status_code == 200 and "bounds[amount]=" in r.headers["X-DPCH-Bounds"], r.text
    bad = q(server, "SELECT COUNT(*) FROM demo.purchases", dpch_epsilon="0.5", dpch_max_rows_per_unit="lots")
    assert bad.status_code != 200 and "integer in [1, 1000000] or auto" in bad.text
