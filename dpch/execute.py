"""Stage 5 of the controller: run the rewritten query on the connection's backend (the embedded
engine or a ClickHouse server; both return a pandas DataFrame).

Errors are re-raised as ``BackendError`` carrying only the ClickHouse error code and name: a
ClickHouse message can quote row values (e.g. "Cannot parse 'alice@example.com' as Int64") or the
query text (which holds the secret salt), and DPCH error messages never contain either
(DESIGN.md, invariant 5).
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING

import pandas as pd

from .errors import BackendError

if TYPE_CHECKING:
    from .backends import Formatted
    from .rewrite import Rewritten

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


def execute(backend, rewritten: Rewritten) -> pd.DataFrame:
    """Run ``rewritten.sql``; raise BackendError with a sanitised message on failure."""
    return _sanitized(lambda: backend.query_df(rewritten.sql))


def execute_formatted(backend, rewritten: Rewritten, fmt: str, settings: dict[str, str] | None = None) -> Formatted:
    """Run ``rewritten.released_sql`` (the analyst's columns only) and return the engine's
    rendering of it in output format ``fmt``; errors as for ``execute``."""
    return _sanitized(lambda: backend.query_formatted(rewritten.formatted_sql(settings), fmt))


def _sanitized(run):
    try:
        return run()
    except Exception as exc:  # DPCHError or any driver error: the same data-free message
        raise BackendError(f"the rewritten query failed: {sanitize_error(str(exc))}") from None
