"""Shared pieces of the rewriter: the salt placeholders, the result type, the Int128 packing of a
row's count and contribution, and indentation of nested subqueries."""
from __future__ import annotations

from dataclasses import dataclass

from ..engine import with_settings

SALT_PLACEHOLDER = "/*<secret salt>*/"

# Output settings forced on every rendered answer, after the client's (DESIGN.md invariant 11).
ANSWER_ONLY_SETTINGS = {"output_format_write_statistics": "0", "rows_before_aggregation": "0",
                        "exact_rows_before_limit": "0"}
_NO_LIMIT = "18446744073709551615"  # the largest LIMIT: keeps every released row
UNIT_SALT_PLACEHOLDER = "/*<secret unit salt>*/"


@dataclass(frozen=True)
class Rewritten:
    sql: str  # executable (contains the salt)
    display_sql: str  # for explain/logs (salt masked)
    output_names: tuple[str, ...]  # the analyst's columns, in order
    internal_columns: tuple[str, ...]  # __dp_n<i> columns appended for post-processing
    # executable, the analyst's columns only (no internal columns), without a SETTINGS clause: what
    # a client that wants the released values rendered by the engine runs (formatted_sql)
    released_sql: str = ""

    def formatted_sql(self, settings: dict[str, str] | None = None) -> str:
        """``released_sql`` with the query settings plus ``settings`` (output format settings,
        already validated by the caller), rendered so that the answer carries released values and
        nothing else (DESIGN.md invariant 11): no engine statistics (rows/bytes read, elapsed), no
        rows before aggregation, and an outermost LIMIT so that ``rows_before_limit_at_least``
        counts released rows (an inner LIMIT would otherwise report the rows it saw)."""
        wrapped = f"SELECT * FROM (\n{self.released_sql}\n) LIMIT {_NO_LIMIT}"
        return with_settings(wrapped, {**(settings or {}), **ANSWER_ONLY_SETTINGS})


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
