"""SQLAlchemy with clickhouse-connect's dialect (``clickhousedb://``, as Superset uses it) and
pandas.read_sql against a real `dpch serve`: reflection (schemas, tables, columns, a Table loaded
from the server), a DP query, and a refusal shown as a ClickHouse error."""
from __future__ import annotations

import pandas as pd
import pytest
import sqlalchemy
from sqlalchemy import inspect, text

from .conftest import USER, assert_clickhouse_error, charges
from test_gateway import PASSWORD


@pytest.fixture(scope="module")
def engine(gateway):
    e = sqlalchemy.create_engine(f"clickhousedb://{USER}:{PASSWORD}@127.0.0.1:{gateway.port}/demo")
    yield e
    e.dispose()


def test_reflection(engine):
    insp = inspect(engine)
    assert "demo" in insp.get_schema_names()
    assert insp.get_table_names(schema="demo") == ["purchases"]
    cols = insp.get_columns("purchases", schema="demo")  # runs SELECT engine, engine_full, comment FROM system.tables
    assert [c["name"] for c in cols] == ["age", "amount", "purchase_id", "region", "user_id"]
    assert "privacy unit" in next(c["comment"] for c in cols if c["name"] == "user_id")
    assert insp.get_view_names(schema="demo") == []
    assert insp.has_table("purchases", schema="demo")
    table = sqlalchemy.Table("purchases", sqlalchemy.MetaData(schema="demo"), autoload_with=engine)
    assert set(table.columns.keys()) == {"age", "amount", "purchase_id", "region", "user_id"}


def test_read_sql_dp_query(engine, gateway):
    before = charges(gateway)
    df = pd.read_sql("SELECT region, count() AS n FROM demo.purchases GROUP BY region SETTINGS dpch_epsilon = 1",
                     engine)
    assert sorted(df["region"]) == ["centre", "east", "north", "south", "west"]
    assert charges(gateway) == before + 1


def test_refusal(engine, gateway):
    before = charges(gateway)
    with engine.connect() as conn, pytest.raises(Exception) as e:
        conn.execute(text("SELECT amount FROM demo.purchases SETTINGS dpch_epsilon = 1")).fetchall()
    assert_clickhouse_error(str(e.value), 9101)
    assert charges(gateway) == before
