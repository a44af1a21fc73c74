"""The reflection queries clients send, as exact strings, against a real `dpch serve`.

RECORDED were captured by running the real client (clickhouse-connect 1.12, its SQLAlchemy dialect
through SQLAlchemy 2.0 and pandas.read_sql, ibis 12) against the gateway through a logging proxy.
The JDBC-style query (DBeaver/Metabase use the ClickHouse JDBC driver's DatabaseMetaData) and the
Grafana-plugin queries are written in the shape of those clients' source, not recorded here (no JVM
or Grafana on this machine). Each must answer without a value computed from rows."""
from __future__ import annotations

import httpx
import pytest

from .conftest import USER
from test_gateway import PASSWORD

RECORDED = [
    # clickhouse-connect get_client()
    ("SELECT version(), timezone()", None),
    ("SELECT name, value, readonly FROM system.settings LIMIT 10000", None),
    ("SELECT 1 AS check", None),
    # SQLAlchemy clickhousedb:// reflection (inspect(), Table(autoload_with=...), pandas.read_sql)
    ("SELECT currentDatabase()", [["demo"]]),
    ("SHOW DATABASES", [["default"], ["demo"]]),
    ("SHOW TABLES FROM `demo`", [["purchases"]]),
    ("SELECT engine, engine_full, comment FROM system.tables WHERE database = 'demo' AND name = 'purchases'",
     [["DPCH", "", "DP table: privacy unit user_id, neighbour add_remove, k=1, max rows per unit=24"]]),
    ("EXISTS TABLE `demo`.`purchases`", [[1]]),
    ("DESCRIBE TABLE `demo`.`purchases`", None),
    ("SELECT name FROM system.tables WHERE database = 'demo' AND engine IN ('View', 'WindowView') ORDER BY name", []),
    ("SELECT name FROM system.tables WHERE database = 'demo' AND engine = 'MaterializedView' ORDER BY name", []),
    ("SELECT * FROM (SELECT name FROM system.tables WHERE database = 'demo' AND engine IN ('View', 'WindowView') "
     "ORDER BY name) LIMIT 0", []),
    # ibis list_tables() and table()
    ("SELECT   name FROM system.tables WHERE   database = CURRENT_DATABASE() OR is_temporary", [["purchases"]]),
    ("DESCRIBE purchases", None),
]
WRITTEN = [
    # ClickHouse JDBC DatabaseMetaData.getTables shape (DBeaver, Metabase)
    ("SELECT NULL AS TABLE_CAT, t.database AS TABLE_SCHEM, t.name AS TABLE_NAME, CASE WHEN t.engine LIKE '%View' "
     "THEN 'VIEW' WHEN t.is_temporary = 1 THEN 'LOCAL TEMPORARY' ELSE 'TABLE' END AS TABLE_TYPE, t.comment AS REMARKS "
     "FROM system.tables t WHERE t.database LIKE 'demo' AND t.name LIKE '%' ORDER BY TABLE_TYPE, TABLE_SCHEM, TABLE_NAME",
     None),
    ("SELECT table_schema, table_name, column_name, data_type, is_nullable FROM information_schema.columns "
     "WHERE table_schema = 'demo' AND table_name = 'purchases' ORDER BY ordinal_position", None),
    ("SELECT database, name, engine, total_rows, total_bytes FROM system.tables WHERE database = 'demo'",
     [["demo", "purchases", "DPCH", None, None]]),
    # Grafana's ClickHouse plugin: databases, tables, columns
    ("SELECT name FROM system.databases", [["default"], ["demo"]]),
    ("SELECT name FROM system.tables WHERE database = 'demo' ORDER BY name", [["purchases"]]),
    ("SELECT name, type FROM system.columns WHERE database = 'demo' AND table = 'purchases'", None),
    ("SELECT name, is_aggregate FROM system.functions WHERE name = 'dp_sum'", [["dp_sum", 1]]),
    ("SELECT c.name, c.default_kind, c.is_in_primary_key, c.is_in_sorting_key, c.compression_codec, "
     "c.data_compressed_bytes FROM system.columns AS c WHERE c.database = 'demo' AND c.name = 'age'",
     [["age", "", 0, 0, "", None]]),
]


@pytest.mark.parametrize("sql, rows", RECORDED + WRITTEN)
def test_reflection_query(gateway, sql, rows):
    r = httpx.post(gateway.url + "/", params={"database": "demo", "default_format": "JSONCompact"},
                   content=sql.encode(), auth=(USER, PASSWORD), timeout=60)
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    if rows is not None:
        assert data == rows
    else:
        assert data  # answered with at least one row


def test_unknown_column_is_unknown_identifier(gateway):
    r = httpx.post(gateway.url + "/", content=b"SELECT engine, nosuch FROM system.tables", auth=(USER, PASSWORD),
                   timeout=60)
    assert r.status_code == 404 and r.headers["X-ClickHouse-Exception-Code"] == "47"
    assert "Unknown expression identifier `nosuch`" in r.text and "(UNKNOWN_IDENTIFIER)" in r.text
