"""curl (plain HTTP, as in ClickHouse's HTTP interface docs) against a real `dpch serve`: list
tables and columns, a DP query with a ``param_`` query parameter, and a refusal with ClickHouse's
error body and X-ClickHouse-Exception-Code header."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from .conftest import USER, assert_clickhouse_error, charges
from test_gateway import PASSWORD

pytestmark = pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")


def curl(gateway, sql: str, *params: str) -> tuple[int, str, str]:
    """(HTTP status, headers, body) of ``curl --data-binary sql`` with URL parameters."""
    url = gateway.url + "/?" + "&".join(params)
    r = subprocess.run(["curl", "-sS", "-D", "-", "-u", f"{USER}:{PASSWORD}", url, "--data-binary", sql],
                       capture_output=True, text=True, timeout=120)
    head, _, body = r.stdout.partition("\n\n")  # text mode: CRLF read as LF
    return int(head.split()[1]), head, body


def test_tables_and_columns(gateway):
    status, _, body = curl(gateway, "SHOW TABLES FROM demo")
    assert status == 200 and body.split() == ["purchases"]
    status, _, body = curl(gateway, "SELECT name, type FROM system.columns WHERE table = 'purchases' "
                                    "ORDER BY position FORMAT TSV")
    assert status == 200
    assert [ln.split("\t")[0] for ln in body.splitlines()] == ["age", "amount", "purchase_id", "region", "user_id"]


def test_dp_query_with_parameter(gateway):
    before = charges(gateway)
    status, head, body = curl(gateway, "SELECT region, count() AS n FROM demo.purchases WHERE region = {r:String} "
                                       "GROUP BY region ORDER BY region", "dpch_epsilon=1", "param_r=north")
    assert status == 200, body
    assert [ln.split("\t")[0] for ln in body.splitlines()] == ["centre", "east", "north", "south", "west"]
    assert "x-dpch-epsilon: 1.0" in head.lower()
    assert charges(gateway) == before + 1


def test_refusal(gateway):
    before = charges(gateway)
    status, head, body = curl(gateway, "SELECT region, count() AS n FROM demo.purchases WHERE region = {r:String} "
                                       "GROUP BY region", "dpch_epsilon=1")
    assert status == 400 and "x-clickhouse-exception-code: 456" in head.lower()
    assert_clickhouse_error(body, 456)
    status, head, body = curl(gateway, "SELECT nosuch FROM system.tables")
    assert status == 404
    assert_clickhouse_error(body, 47)
    assert charges(gateway) == before
