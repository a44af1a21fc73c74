"""The web console's HTTP surface (issue 30 item 5), without a browser: a real `dpch serve` process
driven with httpx. GET / (ClickHouse's "Ok." for clients, the page for browsers), /play and its
assets served by the gateway itself, CORS as ClickHouse does it (add_http_cors_header, OPTIONS 204),
and the console's JSON routes: budget and history of the authenticated analyst only, catalog
metadata, explain that runs and charges nothing. tests/test_console_browser.py drives the page."""
from __future__ import annotations

import json
import re

import httpx
import pytest

from dpch.gateway.console.middleware import prefers_html
from test_gateway import Server, _cli, demo_dir

ALICE = ("alice", "alice-console-1")
BOB = ("bob", "bob-console-22")
BROWSER_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8"
QUERY = "SELECT region, COUNT(*) AS n FROM demo.purchases GROUP BY region ORDER BY region"


def make_data_dir(tmp_path_factory, name):
    """The demo table, alice (ε = 5, δ = 1e-5 on demo.purchases) and bob (ε = 2): the console tests'
    data directory."""
    d = demo_dir(tmp_path_factory, name)
    for user, password in (ALICE, BOB):
        _cli("users", "add", user, "--password-stdin", "--data-dir", str(d), stdin=password + "\n")
    _cli("budget", "set", "--data-dir", str(d), "--analyst", "alice", "--dataset", "demo.purchases",
         "--epsilon", "5", "--delta", "1e-5")
    _cli("budget", "set", "--data-dir", str(d), "--analyst", "bob", "--dataset", "demo.purchases", "--epsilon", "2")
    return d


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(make_data_dir(tmp_path_factory, "console")).start()
    yield s
    s.stop()


def get(server, path, auth=ALICE, **kw):
    return httpx.get(server.url + path, auth=auth, timeout=30, **kw)


def budget_of(server, auth=ALICE):
    r = get(server, "/dpch/budget", auth=auth)
    assert r.status_code == 200, r.text
    return {b["dataset"]: b for b in r.json()}


# -- unit ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("accept,html", [
    (BROWSER_ACCEPT, True), ("text/html", True), ("text/html;q=0.9, */*;q=0.1", True),
    ("*/*", False), ("", False), ("application/json", False), ("text/plain, text/html;q=0.5", False),
    ("text/html;q=0", False), ("text/html;q=bad, */*", False)])
def test_prefers_html(accept, html):
    assert prefers_html(accept) is html


# -- GET / and the page ----------------------------------------------------------------------------

def test_root_answers_ok_to_clients_and_the_console_to_browsers(server):
    for headers in ({}, {"Accept": "*/*"}, {"Accept": "application/json"}):
        r = httpx.get(server.url + "/", headers=headers, timeout=10)  # no credentials, as ClickHouse
        assert (r.status_code, r.text) == (200, "Ok.\n")
        assert r.headers["content-type"].startswith("text/plain")
    r = get(server, "/", headers={"Accept": "*/*"})  # with credentials and no query: still "Ok."
    assert (r.status_code, r.text) == (200, "Ok.\n")
    head = httpx.head(server.url + "/", timeout=10)
    assert head.status_code == 200 and head.content == b""
    page = httpx.get(server.url + "/", headers={"Accept": BROWSER_ACCEPT}, timeout=10)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "<title>DPCH console</title>" in page.text
    assert page.text == httpx.get(server.url + "/play", timeout=10).text
    # a query still goes to the query route, whatever the Accept header says
    r = get(server, "/", params={"query": "SELECT 1"}, headers={"Accept": BROWSER_ACCEPT})
    assert (r.status_code, r.text) == (200, "1\n")
    r = get(server, "/", params={"user": "alice"}, headers={"Accept": "*/*"}, auth=None)
    assert r.status_code != 200  # parameters without a query are a query request, as in ClickHouse


def test_every_asset_is_served_by_the_gateway(server):
    page = httpx.get(server.url + "/play", timeout=10)
    csp = page.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert page.headers["x-frame-options"] == "DENY"
    refs = [r for r in re.findall(r'(?:src|href)="([^"]+)"', page.text) if not r.startswith("data:")]
    assert sorted(refs) == ["/play/static/console.css", "/play/static/console.js"]
    for ref, ctype in (("/play/static/console.js", "text/javascript"), ("/play/static/console.css", "text/css")):
        r = httpx.get(server.url + ref, timeout=10)
        assert r.status_code == 200 and r.headers["content-type"].startswith(ctype) and len(r.content) > 500
        assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", r.text), ref  # no CDN, no remote URL
    assert not re.search(r"https?://", page.text)
    for bad in ("/play/static/nope.js", "/play/static/..%2Fstatic.py", "/play/static/index.html"):
        assert httpx.get(server.url + bad, timeout=10).status_code == 404
    r = httpx.get(server.url + "/dashboard", timeout=10)
    assert r.status_code == 302 and r.headers["location"] == "/play"


# -- CORS ------------------------------------------------------------------------------------------

def test_cors_header_as_clickhouse_adds_it(server):
    def post(params, headers, auth=ALICE):
        return httpx.post(server.url + "/", params=params, headers=headers, content=b"SELECT 1", auth=auth, timeout=10)

    origin = {"Origin": "https://bi.example"}
    r = post({"add_http_cors_header": "1"}, origin)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "*"
    assert "X-DPCH-Epsilon" in r.headers["access-control-expose-headers"]
    assert "access-control-allow-origin" not in post({"add_http_cors_header": "0"}, origin).headers
    assert "access-control-allow-origin" not in post({"add_http_cors_header": "1"}, {}).headers  # no Origin
    assert "access-control-allow-origin" not in post({}, origin).headers
    bad = post({"add_http_cors_header": "1"}, origin, auth=("alice", "wrong"))
    assert bad.status_code == 403 and bad.headers["access-control-allow-origin"] == "*"  # errors are readable too
    r = httpx.post(server.url + "/", params={"add_http_cors_header": "1", "dpch_epsilon": "0.25"}, headers=origin,
                   content=QUERY.encode(), auth=ALICE, timeout=30)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "*"
    assert float(r.headers["x-dpch-epsilon"]) == 0.25


@pytest.mark.parametrize("path", ["/", "/play", "/dpch/budget", "/query"])
def test_options_preflight_is_204_with_the_allow_headers(server, path):
    r = httpx.request("OPTIONS", server.url + path, timeout=10,
                      headers={"Origin": "https://bi.example", "Access-Control-Request-Method": "POST",
                               "Access-Control-Request-Headers": "x-clickhouse-user, x-clickhouse-key"})
    assert r.status_code == 204 and r.content == b""
    assert r.headers["access-control-allow-origin"] == "*"
    assert {"POST", "GET", "OPTIONS"} <= {m.strip() for m in r.headers["access-control-allow-methods"].split(",")}
    allowed = {h.strip().lower() for h in r.headers["access-control-allow-headers"].split(",")}
    assert {"x-clickhouse-user", "x-clickhouse-key", "authorization"} <= allowed
    assert r.headers["access-control-max-age"] == "86400"


# -- JSON routes -----------------------------------------------------------------------------------

def test_json_routes_need_credentials(server):
    for path in ("/dpch/budget", "/dpch/history", "/dpch/catalog"):
        for auth in (None, ("alice", "wrong"), ("nobody", "x")):
            r = get(server, path, auth=auth)
            assert r.status_code == 403 and r.headers["x-clickhouse-exception-code"] == "516", (path, auth)
    r = httpx.post(server.url + "/dpch/explain", params={"dpch_epsilon": "1"}, content=QUERY.encode(), timeout=10)
    assert r.headers["x-clickhouse-exception-code"] == "516"


def test_budget_and_history_show_only_the_analysts_own_rows(server):
    before = budget_of(server)["demo.purchases"]
    n_before = len(get(server, "/dpch/history").json())
    r = httpx.post(server.url + "/", params={"dpch_epsilon": "0.5"}, content=QUERY.encode(), auth=ALICE, timeout=30)
    assert r.status_code == 200, r.text
    after = budget_of(server)["demo.purchases"]
    assert after["epsilon"] == 5 and after["accountant"] == "basic"
    assert after["epsilon_left"] == pytest.approx(before["epsilon_left"] - 0.5, abs=1e-12)
    assert after["queries"] == before["queries"] + 1
    hist = get(server, "/dpch/history").json()
    assert len(hist) == n_before + 1
    assert hist[-1]["dataset"] == "demo.purchases" and hist[-1]["epsilon"] == 0.5 and hist[-1]["query"] == QUERY
    assert hist == sorted(hist, key=lambda h: h["id"])
    # bob sees his own budget, untouched, and none of alice's charges
    assert budget_of(server, BOB)["demo.purchases"]["epsilon_left"] == 2
    assert get(server, "/dpch/history", auth=BOB).json() == []
    assert "alice" not in get(server, "/dpch/budget", auth=BOB).text


def test_catalog_is_declared_metadata_only(server):
    tables = {t["table"]: t for t in get(server, "/dpch/catalog").json()}
    p = tables["demo.purchases"]
    assert p["privacy_unit"] == "user_id" and not p["public"] and p["neighbour"] in ("add_remove", "substitute")
    cols = {c["name"]: c for c in p["columns"]}
    assert cols["user_id"]["privacy_unit"] and not cols["amount"]["privacy_unit"]
    assert cols["amount"]["bounds"] is not None and cols["amount"]["bounds"][0] < cols["amount"]["bounds"][1]
    assert cols["region"]["public_keys_count"] == len(cols["region"]["public_keys"]) > 0
    assert set(p) == {"table", "public", "privacy_unit", "neighbour", "max_groups_contributed", "max_rows_per_unit",
                      "max_rows_per_group", "references", "columns"}
    assert set(cols["amount"]) == {"name", "type", "privacy_unit", "bounds", "public_keys", "public_keys_count"}
    assert "salt" not in json.dumps(tables)


def explain(server, sql, auth=ALICE, **params):
    return httpx.post(server.url + "/dpch/explain", params=params, content=sql.encode(), auth=auth, timeout=30)


def test_explain_runs_and_charges_nothing(server):
    before = budget_of(server)["demo.purchases"]
    r = explain(server, QUERY, dpch_epsilon="1")
    assert r.status_code == 200, r.text
    ex = r.json()
    assert ex["epsilon"] == pytest.approx(1) and ex["table"] == "demo.purchases"
    assert "total cost: ε=1" in ex["text"] and "timings_ms" not in ex and "controller time" not in ex["text"]
    assert not re.search(r"toUInt64\(\d{6,}\)", ex["sql"] + ex["text"])  # the catalog's salt stays masked
    settings = explain(server, QUERY + " SETTINGS dpch_epsilon = 0.75").json()  # SETTINGS in the text
    assert settings["epsilon"] == pytest.approx(0.75)
    dp = explain(server, "SELECT region, dp_count(0.5) AS n FROM demo.purchases GROUP BY region").json()
    assert dp["epsilon"] == pytest.approx(0.5)
    refusals = [(explain(server, QUERY), "9104"),  # no ε
                (explain(server, "SELECT user_id FROM demo.purchases", dpch_epsilon="1"), "9101"),
                (explain(server, "SELECT count() FROM system.tables", dpch_epsilon="1"), None),
                (explain(server, QUERY, dpch_epsilon="100"), "9102"),  # more than is left: the ledger's precheck
                (explain(server, "SELECT (", dpch_epsilon="1"), "62"),
                (explain(server, "SHOW TABLES", dpch_epsilon="1"), "497")]
    for r, code in refusals:
        assert r.status_code >= 400 and r.text.startswith("Code: "), r.text
        if code is not None:
            assert r.headers["x-clickhouse-exception-code"] == code, r.text
    after = budget_of(server)["demo.purchases"]
    assert (after["epsilon_left"], after["queries"]) == (before["epsilon_left"], before["queries"])
