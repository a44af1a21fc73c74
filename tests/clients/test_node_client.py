"""@clickhouse/client (Node.js, the official ClickHouse JS client) against a real `dpch serve`:
connect, list tables and columns, a DP query with ``query_params`` (sent as ``param_<name>``), and
a refusal caught as a ClickHouse error. Needs ``node`` and ``npm``; the package is installed once
from the npm registry into ``tests/clients/.node_cache`` (git-ignored) and reused; the test is
skipped, saying why, when node/npm or the registry is unavailable."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import USER, charges
from test_gateway import PASSWORD

CACHE = Path(__file__).resolve().parent / ".node_cache"
PACKAGE = "@clickhouse/client@1"

SCRIPT = r"""
const { createClient } = require('@clickhouse/client');
const [url, username, password] = process.argv.slice(2);
(async () => {
  const c = createClient({ url, username, password, database: 'demo', clickhouse_settings: { dpch_epsilon: '1' } });
  const out = {};
  out.tables = (await (await c.query({ query: 'SHOW TABLES FROM demo', format: 'JSONEachRow' })).json()).map(r => r.name);
  out.columns = (await (await c.query({
    query: 'SELECT name, type FROM system.columns WHERE database = {db:String} AND table = {t:String} ORDER BY position',
    query_params: { db: 'demo', t: 'purchases' }, format: 'JSONEachRow' })).json()).map(r => r.name);
  out.dp = (await (await c.query({
    query: 'SELECT region, count() AS n FROM demo.purchases WHERE amount >= {lo:Float64} GROUP BY region ORDER BY region',
    query_params: { lo: 0 }, format: 'JSONEachRow' })).json()).map(r => r.region);
  try {
    await (await c.query({ query: 'SELECT amount FROM demo.purchases', format: 'JSONEachRow' })).json();
    out.refusal = null;
  } catch (e) { out.refusal = { code: e.code, message: e.message }; }
  await c.close();
  console.log('RESULT ' + JSON.stringify(out));
})().catch(e => { console.error(e); process.exit(1); });
"""


def _installed() -> Path:
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node/npm are not installed")
    if not (CACHE / "node_modules" / "@clickhouse" / "client").is_dir():
        CACHE.mkdir(exist_ok=True)
        try:
            r = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefix", str(CACHE), PACKAGE],
                               capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired:
            pytest.skip("npm install @clickhouse/client timed out (registry unreachable?)")
        if r.returncode != 0:
            pytest.skip(f"npm install @clickhouse/client failed (registry unreachable?): {r.stderr[-300:]}")
    return CACHE


def test_node_client(gateway):
    cache = _installed()
    before = charges(gateway)
    script = cache / "dpch_client_test.js"
    script.write_text(SCRIPT)
    r = subprocess.run(["node", str(script), gateway.url, USER, PASSWORD], capture_output=True, text=True,
                       timeout=120, cwd=cache)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, r.stdout + r.stderr
    out = json.loads(line[len("RESULT "):])
    assert out["tables"] == ["purchases"]
    assert out["columns"] == ["age", "amount", "purchase_id", "region", "user_id"]
    assert out["dp"] == ["centre", "east", "north", "south", "west"]
    assert out["refusal"]["code"] == "9101", out["refusal"]
    assert charges(gateway) == before + 1  # the DP query only; the refusal charged nothing
