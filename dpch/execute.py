"""Stage 5 of the controller: run the rewritten query on the connection's backend (the embedded
engine or a ClickHouse server; both return a pandas DataFrame).

Errors are re-raised as ``BackendError`` carrying only the ClickHouse error code and name: a
ClickHouse message can quote row values (e.g. "Cannot parse 'alice@example.com' as Int64") or the
query text (which holds the secret salt), and DPCH error messages never contain either
(DESIGN.md, invariant 5).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from .engine import Engine, sanitize_error
from .errors import BackendError

if TYPE_CHECKING:
    from .backends import Formatted
    from .results import Rewritten


def execute(backend: Engine, rewritten: Rewritten) -> pd.DataFrame:
    """Run ``rewritten.sql``; raise BackendError with a sanitised message on failure."""
    return _sanitized(lambda: backend.query_df(rewritten.sql))


def execute_formatted(backend: Engine, rewritten: Rewritten, fmt: str,
                      settings: dict[str, str] | None = None) -> Formatted:
    """Run ``rewritten.released_sql`` (the analyst's columns only) and return the engine's
    rendering of it in output format ``fmt``; errors as for ``execute``."""
    return _sanitized(lambda: backend.query_formatted(rewritten.formatted_sql(settings), fmt))


def _sanitized(run):
    try:
        return run()
    except Exception as exc:  # DPCHError or any driver error: the same data-free message
        raise BackendError(f"the rewritten query failed: {sanitize_error(str(exc))}") from None
