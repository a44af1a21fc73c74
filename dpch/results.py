"""The rewrite stage's result, shared by the stages after it (bottom layer): ``Rewritten``, the
query that the type check, the executor and post-processing receive, and the output settings forced
on every rendered answer."""
from __future__ import annotations

from dataclasses import dataclass

from .engine import with_settings

# Output settings forced on every rendered answer, after the client's (DESIGN.md invariant 11).
ANSWER_ONLY_SETTINGS = {"output_format_write_statistics": "0", "rows_before_aggregation": "0",
                        "exact_rows_before_limit": "0"}
_NO_LIMIT = "18446744073709551615"  # the largest LIMIT: keeps every released row


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
