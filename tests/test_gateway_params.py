"""Query parameters (dpch.gateway.params): ``{name:Type}`` placeholders bound from ``param_<name>``
values as typed literals in the parsed statement, never spliced into the SQL text; ClickHouse's
error codes 456 (missing) and 457 (bad value), messages without the value."""
from __future__ import annotations

import pytest
import sqlglot
from sqlglot import exp

from dpch.gateway.errors import GatewayError
from dpch.gateway.params import bind_params


def bind(sql: str, **values) -> exp.Expression:
    return bind_params(sqlglot.parse_one(sql, read="clickhouse"), values)


def literal_values(tree: exp.Expression) -> list:
    return [lit.this for lit in tree.find_all(exp.Literal)]


@pytest.mark.parametrize("typ, value, sql", [
    ("UInt8", "255", "SELECT 255"),
    ("Int64", "-9223372036854775808", "SELECT -9223372036854775808"),
    ("Float64", "1.5", "SELECT 1.5"),
    ("Float64", "-2e3", "SELECT -2000.0"),
    ("String", "it's", "SELECT 'it''s'"),
    ("String", "a\\tb", "SELECT 'a\\tb'"),  # the escaped text format: \t is a tab
    ("Bool", "true", "SELECT TRUE"),
    ("Date", "2024-02-29", "SELECT CAST('2024-02-29' AS DATE)"),
    ("DateTime", "2024-01-02 03:04:05", "SELECT CAST('2024-01-02 03:04:05' AS DateTime)"),
    ("Decimal(10, 2)", "12.34", "SELECT CAST('12.34' AS Decimal(10, 2))"),
    ("Nullable(String)", "\\N", "SELECT CAST(NULL AS Nullable(String))"),
    ("LowCardinality(String)", "x", "SELECT 'x'"),
    ("UUID", "123e4567-e89b-12d3-a456-426614174000", "SELECT CAST('123e4567-e89b-12d3-a456-426614174000' AS UUID)"),
    ("Array(Int32)", "[1, -2]", "SELECT [1, -2]"),
])
def test_values_become_typed_literals(typ, value, sql):
    assert bind(f"SELECT {{p:{typ}}}", p=value).sql("clickhouse") == sql


def test_a_value_never_becomes_sql():
    evil = "x' OR 1 = 1 --"
    tree = bind("SELECT count() FROM t WHERE s = {s:String}", s=evil)
    assert evil in literal_values(tree)  # one string literal holding the whole value
    assert not list(tree.find_all(exp.Or))
    with pytest.raises(GatewayError) as e:  # not an identifier: refused, not spliced
        bind("SELECT count() FROM {t:Identifier}", t="t; DROP TABLE t")
    assert e.value.code == 457


def test_in_an_array_parameter_gives_a_literal_list():
    tree = bind("SELECT count() FROM t WHERE r IN {rs:Array(String)}", rs="['a', 'b']")
    assert tree.sql("clickhouse") == "SELECT count() FROM t WHERE r IN ('a', 'b')"


def test_identifier_parameter():
    assert bind("SELECT count() FROM {t:Identifier}", t="demo.purchases").sql("clickhouse") == \
        "SELECT count() FROM demo.purchases"


@pytest.mark.parametrize("typ, value", [("UInt8", "256"), ("UInt8", "-1"), ("Int32", "1.5"), ("Float64", "ten"),
                                        ("Date", "2024-13-01"), ("Bool", "yes"), ("FixedString(2)", "abc"),
                                        ("Array(Int32)", "[1, 'x']"), ("Array(Int32)", "1"), ("UUID", "nope"),
                                        ("Map(String, String)", "{}")])
def test_bad_values_are_457_without_the_value(typ, value):
    with pytest.raises(GatewayError) as e:
        bind(f"SELECT {{p:{typ}}}", p=value)
    assert e.value.code == 457 and e.value.name == "BAD_QUERY_PARAMETER"
    assert "'p'" in e.value.message and value not in e.value.message


def test_missing_parameter_is_456():
    with pytest.raises(GatewayError) as e:
        bind("SELECT {p:UInt8}")
    assert e.value.code == 456 and "`p`" in e.value.message


def test_no_placeholder_keeps_the_tree():
    tree = sqlglot.parse_one("SELECT 1", read="clickhouse")
    assert bind_params(tree, {"unused": "1"}) is tree
