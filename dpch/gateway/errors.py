"""Gateway errors in ClickHouse's wire shape: ``Code: N. DB::Exception: <message>. (NAME)``, an
HTTP status and the ``X-ClickHouse-Exception-Code`` header.

Real ClickHouse codes are used where one fits. DPCH's own rejections use the range 9100-9199:

| code | name | HTTP | meaning |
|---|---|---|---|
| 9101 | DPCH_QUERY_REJECTED | 400 | the controller cannot make the query private (nothing ran, nothing charged) |
| 9102 | DPCH_BUDGET_EXCEEDED | 403 | the ledger refused the charge (nothing ran) |
| 9103 | DPCH_INVALID_PARAMETER | 400 | ε/δ/mechanism/bounds/weights out of range |
| 9104 | DPCH_MISSING_EPSILON | 400 | a DP query without ``dpch_epsilon`` |
| 9105 | DPCH_LEDGER_UNAVAILABLE | 500 | the ledger cannot be read or written: fail closed |
| 9106 | DPCH_ENGINE_ERROR | 500 | the engine failed while running a charged query (the charge stays) |

An engine limit (dpch.engine_worker.EngineLimits) breached by a statement is answered with
ClickHouse's own code: 159 TIMEOUT_EXCEEDED (also when the gateway had to stop the engine worker at
its deadline), 241 MEMORY_LIMIT_EXCEEDED, 158 TOO_MANY_ROWS, 396 TOO_MANY_ROWS_OR_BYTES (result
rows), 307 TOO_MANY_BYTES (bytes read), 452 SETTING_CONSTRAINT_VIOLATION (a statement that names a
limit). A DP query is charged before it runs, so its charge stays.

Messages never carry data values or the catalog salt: controller messages name constructs only,
and engine errors are reduced to their code and name.
"""
from __future__ import annotations

import re

from ..errors import (GATEWAY, BackendError, BudgetExceeded, CatalogError, DPCHError, InvalidParameter, LedgerError,
                      QueryRejected, interface)

# real ClickHouse codes
SYNTAX_ERROR = (62, "SYNTAX_ERROR", 400)
UNKNOWN_FORMAT = (73, "UNKNOWN_FORMAT", 400)
BAD_ARGUMENTS = (36, "BAD_ARGUMENTS", 400)
UNKNOWN_TABLE = (60, "UNKNOWN_TABLE", 404)
UNKNOWN_DATABASE = (81, "UNKNOWN_DATABASE", 404)
CANNOT_PARSE_INPUT = (27, "CANNOT_PARSE_INPUT_ASSERTION_FAILED", 400)
HTTP_LENGTH_REQUIRED = (381, "HTTP_LENGTH_REQUIRED", 411)
TOO_LARGE_REQUEST = (307, "TOO_MANY_BYTES", 413)
TIMEOUT = (159, "TIMEOUT_EXCEEDED", 408)
ACCESS_DENIED = (497, "ACCESS_DENIED", 403)
AUTHENTICATION_FAILED = (516, "AUTHENTICATION_FAILED", 403)
REQUIRED_PASSWORD = (194, "REQUIRED_PASSWORD", 403)
UNKNOWN_SETTING = (115, "UNKNOWN_SETTING", 400)
NOT_IMPLEMENTED = (48, "NOT_IMPLEMENTED", 501)
UNSUPPORTED_METHOD = (1, "UNSUPPORTED_METHOD", 405)
TOO_MANY_SIMULTANEOUS_QUERIES = (202, "TOO_MANY_SIMULTANEOUS_QUERIES", 503)
UNKNOWN_EXCEPTION = (1002, "UNKNOWN_EXCEPTION", 500)
# engine limits (dpch.engine_worker), keyed by the name ClickHouse puts at the end of its message
ENGINE_LIMITS = {
    "TIMEOUT_EXCEEDED": TIMEOUT,
    "MEMORY_LIMIT_EXCEEDED": (241, "MEMORY_LIMIT_EXCEEDED", 500),
    "TOO_MANY_ROWS": (158, "TOO_MANY_ROWS", 500),
    "TOO_MANY_ROWS_OR_BYTES": (396, "TOO_MANY_ROWS_OR_BYTES", 500),
    "TOO_MANY_BYTES": (307, "TOO_MANY_BYTES", 500),
    "SETTING_CONSTRAINT_VIOLATION": (452, "SETTING_CONSTRAINT_VIOLATION", 400),
}
# DPCH range
DPCH_QUERY_REJECTED = (9101, "DPCH_QUERY_REJECTED", 400)
DPCH_BUDGET_EXCEEDED = (9102, "DPCH_BUDGET_EXCEEDED", 403)
DPCH_INVALID_PARAMETER = (9103, "DPCH_INVALID_PARAMETER", 400)
DPCH_MISSING_EPSILON = (9104, "DPCH_MISSING_EPSILON", 400)
DPCH_LEDGER_UNAVAILABLE = (9105, "DPCH_LEDGER_UNAVAILABLE", 500)
DPCH_ENGINE_ERROR = (9106, "DPCH_ENGINE_ERROR", 500)

AUTH_FAILED_MESSAGE = "{user}: Authentication failed: password is incorrect, or there is no user with such name"


class GatewayError(Exception):
    def __init__(self, kind: tuple[int, str, int], message: str):
        super().__init__(message)
        self.code, self.name, self.status = kind
        self.message = message

    def body(self) -> bytes:
        msg = self.message.rstrip(".")
        return f"Code: {self.code}. DB::Exception: {msg}. ({self.name})\n".encode("utf-8", "replace")

    def headers(self) -> dict[str, str]:
        return {"X-ClickHouse-Exception-Code": str(self.code)}


_CODE_RE = re.compile(r"Code: (\d+)")
_NAME_RE = re.compile(r"\(([A-Z][A-Z0-9_]+)\)")


def from_dpch(exc: BaseException) -> GatewayError:
    """Map an exception raised while answering a DP query. Unknown exceptions become a generic
    error without their text (it could hold anything). Advice is in the gateway's words."""
    with interface(GATEWAY):
        return _from_dpch(exc)


def _from_dpch(exc: BaseException) -> GatewayError:
    if isinstance(exc, GatewayError):
        return exc
    if isinstance(exc, BudgetExceeded):
        return GatewayError(DPCH_BUDGET_EXCEEDED, str(exc))
    if isinstance(exc, InvalidParameter):
        return GatewayError(DPCH_INVALID_PARAMETER, str(exc))
    if isinstance(exc, (QueryRejected, CatalogError)):
        return GatewayError(DPCH_QUERY_REJECTED, str(exc))
    if isinstance(exc, LedgerError):
        return GatewayError(DPCH_LEDGER_UNAVAILABLE, "the budget ledger is unavailable; nothing was answered")
    if isinstance(exc, BackendError):
        text = str(exc)
        code = _CODE_RE.search(text)
        names = _NAME_RE.findall(text)
        if names and names[-1] in ENGINE_LIMITS:  # the limit's name only: the message may quote the query
            return GatewayError(ENGINE_LIMITS[names[-1]], f"the query exceeded an engine limit ({names[-1]}); "
                                "a charge made for it stays")
        detail = f"engine error {code.group(1) if code else '?'} {names[-1] if names else ''}".strip()
        return GatewayError(DPCH_ENGINE_ERROR, f"the engine failed to run the query ({detail})")
    if isinstance(exc, DPCHError):
        return GatewayError(DPCH_QUERY_REJECTED, str(exc))
    return GatewayError(UNKNOWN_EXCEPTION, f"internal error ({type(exc).__name__})")
