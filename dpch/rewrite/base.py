"""Shared pieces of the rewriter: the salt placeholders, the Int128 packing of a row's count and
contribution, and indentation of nested subqueries (the result type, Rewritten, is in dpch.results)."""
from __future__ import annotations

from ..results import ANSWER_ONLY_SETTINGS, Rewritten  # noqa: F401 - re-exported: the result type moved

SALT_PLACEHOLDER = "/*<secret salt>*/"
UNIT_SALT_PLACEHOLDER = "/*<secret unit salt>*/"


_LOW64 = "18446744073709551615"  # 2^64 - 1


def _packed_row(x_sql: str) -> str:
    """One row's Int64 contribution x and its count 1 as one Int128, x·2^64 + 1 (docs/PERFORMANCE.md)."""
    return f"(bitShiftLeft(toInt128({x_sql}), 64) + 1)"


def _unpack_count(packed_sum_sql: str) -> str:
    """The row count of a sum of ``_packed_row`` values: its low 64 bits (exact below 2^64 rows)."""
    return f"toInt64(bitAnd({packed_sum_sql}, {_LOW64}))"


def _unpack_sum(packed_sum_sql: str) -> str:
    """The Int64 sum of a sum of ``_packed_row`` values: its high 64 bits, which are Σx modulo 2^64
    (the count never carries into them), i.e. exactly the value an Int64 ``sum`` wraps to."""
    return f"toInt64(bitShiftRight({packed_sum_sql}, 64))"


def _indent(sql: str, n: int = 2) -> str:
    pad = " " * n
    return "\n".join(pad + line for line in sql.splitlines())
