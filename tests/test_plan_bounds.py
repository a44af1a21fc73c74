"""Per-row bounds (dpch.plan.bounds) on inputs that once made the planner run forever or fail
with a non-rejection error: an analyst's query must be answered or refused quickly."""
from __future__ import annotations

import pytest
import sqlglot

from dpch.catalog import TableEntry
from dpch.errors import QueryRejected
from dpch.plan.bounds import bound_expression

ENTRY = TableEntry(table="d.t", privacy_unit="u", neighbour="add_remove", bounds={"amount": (0.0, 100.0)},
                   max_groups_contributed=1, max_rows_per_unit=1, max_rows_per_group=None, public_keys={},
                   columns={"u": "UInt64", "amount": "Float64"}, salt="s")


def _bound(sql: str):
    return bound_expression(sqlglot.parse_one(sql, read="clickhouse"), ENTRY, "SUM(x)")


@pytest.mark.parametrize("sql,message", [
    # floor() gives integer bounds; int ** int(1e300) used to compute forever
    ("pow(floor(amount), 1e300)", "the bounds overflow"),
    ("pow(round(amount), 1e6)", "the bounds overflow"),
    ("pow(amount, 1e400)", "finite constant exponent"),
])
def test_pow_with_huge_exponents_is_refused(sql, message):
    with pytest.raises(QueryRejected, match=message):
        _bound(sql)


def test_pow_keeps_its_interval():
    assert _bound("pow(floor(amount), 2)")[0] == (0.0, 10000.0)
    assert _bound("pow(amount / 200, 1e300)")[0] == (0.0, 0.0)  # [0, 0.5]^huge underflows to 0
