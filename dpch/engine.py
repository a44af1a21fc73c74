"""What every stage shares about the engine (bottom layer: imports nothing of the pipeline).

- ``Engine``: the interface a stage receives as an argument (the embedded engine and the server
  backend of dpch.backends both satisfy it); no stage imports a backend.
- ``QUERY_SETTINGS`` / ``with_settings``: the settings every rewritten or analysed query runs with.
- ``sanitize_error``: an engine error reduced to its code and name, so no DPCH message echoes a
  row value or the salted query text (DESIGN.md, invariant 5).
- ``default_row_sql``: one row of a table's column-type defaults (the type check's probe row).
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Protocol

from .catalog_model import TableEntry, quote_ident, quote_string

if TYPE_CHECKING:
    import pandas as pd
    from .backends import Formatted


class Engine(Protocol):
    """The engine as the stages see it (the part of dpch.backends.Backend they use): analysed or
    executed SQL in, a DataFrame or the engine's rendering out."""

    def query_df(self, sql: str) -> pd.DataFrame: ...

    def query_formatted(self, sql: str, fmt: str) -> Formatted: ...

    def command(self, sql: str) -> None: ...


# Settings of every rewritten query: no short-circuit evaluation (the cost of WHERE and of
# conditions does not depend on which rows match), Decimal overflow does not throw, and a CAST of a
# NULL (which the total forms produce) stays NULL instead of throwing; if/CASE branches of different
# types get a classic supertype or a type error, never a Variant (whose conversions the totality
# rules do not cover: CAST of a Variant holding NaN to an integer throws); no query condition cache
# (it skips granules where an earlier run matched no row, so the time of a repeated WHERE would
# tell whether unit 42's rows match it); readonly = 2 (no statement derived from analyst SQL can
# write, whatever slipped past the checks; settings after it may still be set: DESIGN.md inv. 10).
QUERY_SETTINGS = ("short_circuit_function_evaluation = 'disable', decimal_check_overflow = 0, "
                  "cast_keep_nullable = 1, use_variant_as_common_type = 0, use_query_condition_cache = 0, "
                  "readonly = 2")


def with_settings(sql: str, extra: dict[str, str] | None = None) -> str:
    """``sql`` with a SETTINGS clause: QUERY_SETTINGS, then ``extra`` (names and values validated
    by the caller; values are quoted here)."""
    more = "".join(f", {k} = {quote_string(v)}" for k, v in (extra or {}).items())
    return f"{sql}\nSETTINGS {QUERY_SETTINGS}{more}"


def default_row_sql(entry: TableEntry) -> str:
    """A one-row subquery with the table's registered columns at their types' default values.
    materialize(): the columns are not constants, as a table's are not; otherwise ClickHouse folds
    expressions over them while it analyses the query, and an error the real columns would raise
    then (a String compared with a Date, a time zone that is not constant) goes unseen."""
    cols = ", ".join(f"materialize(defaultValueOfTypeName({quote_string(t)})) AS {quote_ident(c)}"
                     for c, t in entry.columns.items())
    return f"(SELECT {cols})"


_CODE_RE = re.compile(r"Code:\s*(\d+)")
_NAME_RE = re.compile(r"\(([A-Z][A-Z0-9_]{3,})\)")

_HINTS = {
    "UNKNOWN_FUNCTION": "a DPCH function is missing on the engine: deploy clickhouse_config (UDF XML and "
                        "SQL functions) on the server",
    "TIMEOUT_EXCEEDED": "the query took too long",
    "MEMORY_LIMIT_EXCEEDED": "the query ran out of memory",
    "UNKNOWN_TABLE": "the catalogued table does not exist any more; re-create it or drop it from the catalog",
    "UNKNOWN_IDENTIFIER": "a catalogued column does not exist any more; re-register the table",
    "ACCESS_DENIED": "the ClickHouse user may not read this table or call the DPCH functions",
    "READONLY": "the ClickHouse user is read-only and may not change settings",
}


def sanitize_error(message: str) -> str:
    """ClickHouse error code and name only (plus a hint for common causes)."""
    code = _CODE_RE.search(message)
    names = _NAME_RE.findall(message)
    name = names[-1] if names else None
    parts = []
    if code:
        parts.append(f"ClickHouse error code {code.group(1)}")
    if name:
        parts.append(f"({name})")
    text = " ".join(parts) if parts else "ClickHouse raised an error"
    if name in _HINTS:
        text += f": {_HINTS[name]}"
    elif "dpch-udf" in message or "Child process" in message or "executable" in message.lower():
        text += ": the noise UDF program failed (see the engine's log)"
    return text
