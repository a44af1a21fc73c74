"""clickhouse-connect (Python, HTTP) against a real `dpch serve`: connect, list tables and columns,
a DP query (query_df), server-side query parameters, a post-processing wrapper, and a refusal shown
as a ClickHouse error without a charge."""
from __future__ import annotations

import clickhouse_connect
import pytest
from clickhouse_connect.driver.exceptions import DatabaseError

from .conftest import USER, assert_clickhouse_error, charges
from test_gateway import PASSWORD


@pytest.fixture(scope="module")
def client(gateway):
    c = clickhouse_connect.get_client(host="127.0.0.1", port=gateway.port, username=USER, password=PASSWORD,
                                      database="demo")
    yield c
    c.close()


def test_lists_tables_and_columns(client):
    assert [r[0] for r in client.query("SHOW TABLES FROM demo").result_rows] == ["purchases"]
    rows = client.query("SELECT name, type, is_in_primary_key, default_kind FROM system.columns "
                        "WHERE database = 'demo' AND table = 'purchases' ORDER BY position").result_rows
    assert [r[0] for r in rows] == ["age", "amount", "purchase_id", "region", "user_id"]
    assert all(r[2] == 0 and r[3] == "" for r in rows)
    t = client.query("SELECT engine, engine_full, total_rows, total_bytes FROM system.tables "
                     "WHERE database = 'demo' AND name = 'purchases'").result_rows
    assert t == [("DPCH", "", None, None)]  # nothing about the data: no row count, no size


def test_dp_query_df_is_charged_once(client, gateway):
    before = charges(gateway)
    df = client.query_df("SELECT region, count() AS n FROM demo.purchases GROUP BY region",
                         settings={"dpch_epsilon": 1})
    assert sorted(df["region"]) == ["centre", "east", "north", "south", "west"]
    assert charges(gateway) == before + 1


def test_query_parameters_bound_server_side(client, gateway):
    before = charges(gateway)
    rows = client.query("SELECT region, count() AS n FROM demo.purchases WHERE amount > {a:Float64} "
                        "AND region IN {rs:Array(String)} GROUP BY region",
                        parameters={"a": 10, "rs": ["north", "south"]}, settings={"dpch_epsilon": 1}).result_rows
    assert {r[0] for r in rows} <= {"north", "south", "centre", "east", "west"}
    assert charges(gateway) == before + 1
    with pytest.raises(DatabaseError) as e:  # a value that is not a Float64: 457, nothing charged
        client.query("SELECT region, count() AS n FROM demo.purchases WHERE amount > {a:Float64} GROUP BY region",
                     parameters={"a": "ten"}, settings={"dpch_epsilon": 1})
    assert_clickhouse_error(str(e.value), 457)
    assert charges(gateway) == before + 1


def test_wrapper_orders_and_limits_the_release(client, gateway):
    before = charges(gateway)
    rows = client.query("SELECT region, n FROM (SELECT region, count() AS n FROM demo.purchases GROUP BY region) AS t "
                        "WHERE n > -1000000 ORDER BY n DESC LIMIT 2", settings={"dpch_epsilon": 1}).result_rows
    assert len(rows) == 2 and rows[0][1] >= rows[1][1]
    assert charges(gateway) == before + 1


def test_refusal_is_a_clickhouse_error_and_charges_nothing(client, gateway):
    before = charges(gateway)
    with pytest.raises(DatabaseError) as e:
        client.query("SELECT user_id, count() AS n FROM demo.purchases GROUP BY user_id", settings={"dpch_epsilon": 1})
    assert_clickhouse_error(str(e.value), 9101)
    assert "user_id" in str(e.value)  # names the construct (the privacy unit), not a value
    assert charges(gateway) == before
