"""The red team's leak cases of issue 27 (items 1, 2 and 4), through the REAL gateway process:
the file-read oracle (a public ``IN (SELECT …)`` whose constant folding read ``file()`` before the
charge), the same through ``/dpch/ptr``'s ``where``, setting and schema readers, and engine
statistics in the body. Each case is sent twice with one bit of the secret flipped (a file prefix
that matches and one that does not), by an analyst with budget and by one without: the two answers
must be identical (status, code, body), and nothing may be charged.
"""
from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from dpch.ledger import Ledger
from dpch.users import UserStore
from test_gateway import Server, demo_dir  # the real `dpch serve` process of tests/test_gateway.py

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
RICH = ("alice", "alice-secret-1")
POOR = ("bob", "bob-secret-22")


def _cli(*args):
    r = subprocess.run([PY, "-m", "dpch.cli", *args], capture_output=True, text=True, cwd=ROOT, timeout=180)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    d = demo_dir(tmp_path_factory, "leaks")
    # a public table for IN (SELECT ...), registered by the owner in a process of its own (this one
    # may hold the test session's embedded store: one store per process)
    owner = ("import dpch\n"
             f"db = dpch.connect({str(d)!r})\n"
             "db.command('CREATE TABLE demo.zones (region String, label String) ENGINE = MergeTree ORDER BY region')\n"
             "db.command('INSERT INTO demo.zones SELECT DISTINCT region, lower(region) FROM demo.purchases')\n"
             "db.catalog.register('demo.zones', public=True)\n"
             "db.close()\n")
    subprocess.run([PY, "-c", owner], check=True, cwd=ROOT, timeout=180)
    with serving_rich_and_poor(d) as url:
        yield url, d


@contextlib.contextmanager
def serving_rich_and_poor(d: Path):
    """`dpch serve` on ``d`` with two analysts: RICH with a budget on demo.purchases, POOR without
    one; yields the gateway's URL."""
    users = UserStore(d)
    users.add(*RICH)
    users.add(*POOR)
    ledger = Ledger(d / "ledger.sqlite")
    ledger.set_budget(RICH[0], "demo.purchases", 100.0, 1e-3)
    ledger.close()
    server = Server(d, start_timeout=90).start()
    try:
        yield server.url
    finally:
        server.stop()


def _charges(d: Path) -> int:
    led = Ledger(d / "ledger.sqlite")
    try:
        return len(led.history())
    finally:
        led.close()


def _post(url: str, auth, sql: str, **params) -> httpx.Response:
    return httpx.post(url + "/", content=sql.encode(), auth=auth, params=params, timeout=120)


def _same(a: httpx.Response, b: httpx.Response) -> bool:
    keep = ("x-clickhouse-exception-code",)
    return (a.status_code, a.content, [a.headers.get(k) for k in keep]) == \
        (b.status_code, b.content, [b.headers.get(k) for k in keep])


# The oracle of the red team: toDecimal32's scale is 2 (valid) or 100 (an analysis error) depending
# on one bit of a file; a flipped prefix gives the other bit.
ORACLES = [
    "SELECT COUNT(*) AS n FROM demo.purchases WHERE region IN (SELECT region FROM demo.zones WHERE "
    "toDecimal32('1', if(startsWith(file('/etc/passwd'), '{p}'), 2, 100)) > 0) SETTINGS dpch_epsilon = 0.1",
    "SELECT COUNT(*) AS n FROM demo.purchases WHERE region IN (SELECT region FROM demo.zones WHERE "
    "startsWith(file('/proc/self/cmdline'), '{p}')) SETTINGS dpch_epsilon = 0.1",
    "SELECT COUNT(*) AS n FROM demo.purchases WHERE region IN (SELECT region FROM demo.zones WHERE "
    "getSetting('max_threads') = {n}) SETTINGS dpch_epsilon = 0.1",
    "SELECT COUNT(*) AS n FROM demo.purchases WHERE region IN (SELECT region FROM demo.zones WHERE "
    "hasColumnInTable('demo', 'purchases', '{p}')) SETTINGS dpch_epsilon = 0.1",
    "SELECT COUNT(*) AS n FROM demo.purchases WHERE throwIf(startsWith(file('/etc/passwd'), '{p}')) = 0 "
    "SETTINGS dpch_epsilon = 0.1",
]


@pytest.mark.parametrize("template", ORACLES, ids=["decimal_scale", "cmdline", "getsetting", "hascolumn", "throwif"])
@pytest.mark.parametrize("who", ["rich", "poor"])
def test_file_and_setting_oracles_answer_the_same_for_both_bits(gw, template, who):
    url, d = gw
    auth = RICH if who == "rich" else POOR
    before = _charges(d)
    hit = _post(url, auth, template.format(p="root:", n=1))
    miss = _post(url, auth, template.format(p="zzzz:", n=999))
    assert hit.status_code != 200 and _same(hit, miss), (hit.status_code, hit.text[:300], miss.text[:300])
    assert b"root" not in hit.content.lower()
    assert _charges(d) == before


@pytest.mark.parametrize("where", ["startsWith(file('/etc/passwd'), '{p}')",
                                   "throwIf(startsWith(file('/etc/passwd'), '{p}')) = 0",
                                   "getSetting('max_threads') > {n}"])
def test_ptr_where_field_gets_the_same_rules(gw, where):
    url, d = gw
    before = _charges(d)
    out = []
    for p, n in (("root:", 1), ("zzzz:", 999)):
        body = {"statistic": "median", "dataset": "demo.purchases", "column": "amount", "epsilon": 1.0,
                "delta": 1e-6, "bound": 10.0, "where": where.format(p=p, n=n)}
        out.append(httpx.post(url + "/dpch/ptr", json=body, auth=RICH, timeout=120))
    assert out[0].status_code != 200 and _same(out[0], out[1]), out[0].text[:300]
    assert _charges(d) == before


@pytest.mark.parametrize("fmt", ["JSON", "JSONCompact", "JSONStrings", "XML"])
@pytest.mark.parametrize("sql", ["SELECT dp_count(1e-9) AS n FROM demo.purchases",
                                 "SELECT COUNT(*) AS n FROM demo.purchases WHERE user_id = 7 SETTINGS dpch_epsilon = 0.01"])
def test_no_engine_statistics_in_any_body(gw, fmt, sql):
    url, _ = gw
    r = _post(url, RICH, f"{sql} FORMAT {fmt}", output_format_write_statistics="1")
    assert r.status_code == 200, r.text[:300]
    low = r.content.lower()
    for word in (b"statistics", b"rows_read", b"bytes_read", b"elapsed", b"rows_before_aggregation"):
        assert word not in low, (fmt, word)
    if fmt.startswith("JSON"):
        doc = json.loads(r.content)
        assert set(doc) <= {"meta", "data", "rows", "rows_before_limit_at_least"}
    summary = r.headers.get("x-clickhouse-summary")
    assert summary is None or "read_rows" not in summary or json.loads(summary).get("read_rows") in ("0", 0)
