"""`POST /dpch/ptr`, request and response: one propose-test-release statistic (dpch.ptr,
docs/PTR.md) for an authenticated analyst (routed by dpch/gateway/server.py like ``/dpch/svt``).

The run happens inside the gateway, so the ledger's settlement stays on the server side of the
trust boundary: the analyst sees the branch, the noisy value and what was charged.

Request (JSON body): ``{"statistic": "median" | "iqr" | "trimmed_mean", "dataset": "db.table",
"column": "amount", "epsilon": ε, "delta": δ, "where": "…" (optional), "alpha": α (trimmed mean),
"bound": β or "rows_hint": N (median, trimmed mean), "base": b, "split": s (optional),
"max_rows_per_unit": M (optional)}``.

Response (JSON): ``{"statistic", "branch": "released" | "bottom", "value": v or null,
"epsilon_charged", "epsilon_reserved", "delta", "proposed_scale", "receipt"}``. A refused request
(bad field, rejected column/where, budget) charges nothing; its message names the field.

Caps (issue 27; docs/GATEWAY.md "Request limits"), checked here before anything runs or is
charged, each refusal naming its field (36 BAD_ARGUMENTS): ``LIMITS`` below; ``where`` within the
gateway's query caps; names at most 256 characters. dpch.ptr checks the values' meaning after.
"""
from __future__ import annotations

import math
from typing import Any

from ..ptr.run import MIN_BASE
from .errors import BAD_ARGUMENTS, GatewayError
from .limits import check_query_text

FIELDS = ("statistic", "dataset", "column", "epsilon", "delta", "where", "alpha", "bound", "rows_hint", "base",
          "split", "max_rows_per_unit")
NUMBERS = ("epsilon", "delta", "alpha", "bound", "base", "split")
MAX_NAME_CHARS = 256
#: field: the interval it must lie in, as text and as (lowest, highest, open below, open above).
#: ε up to 100 (no larger ε protects anything); base ≥ MIN_BASE (M_IQR's log bins: about
#: ln(65536)/ln(base) of them, a few hundred); integers below 2^53 (exact as floats).
LIMITS = {"epsilon": (0.0, 100.0, True, False), "delta": (0.0, 1.0, True, True), "alpha": (0.0, 1.0, True, True),
          "bound": (0.0, 1e15, True, False), "base": (MIN_BASE, 16.0, False, False),
          "split": (0.0, 1.0, True, True), "rows_hint": (1, 2 ** 53, False, False),
          "max_rows_per_unit": (1, 1_000_000, False, False)}


def _inside(v, lo, hi, open_lo, open_hi) -> bool:
    return (lo < v if open_lo else lo <= v) and (v < hi if open_hi else v <= hi)


def parse_request(body: Any) -> dict:
    """Check the request's shape; raises GatewayError (BAD_ARGUMENTS) naming the field. The
    values themselves are checked by dpch.ptr (InvalidParameter, before anything is charged)."""
    if not isinstance(body, dict):
        raise GatewayError(BAD_ARGUMENTS, "the body must be a JSON object")
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise GatewayError(BAD_ARGUMENTS, f"unknown field(s) {', '.join(unknown)}")
    for name in ("statistic", "dataset", "column"):
        if not isinstance(body.get(name), str) or not body[name] or len(body[name]) > MAX_NAME_CHARS:
            raise GatewayError(BAD_ARGUMENTS, f"{name} must be a non-empty string of at most {MAX_NAME_CHARS} characters")
    for name in ("epsilon", "delta"):
        if name not in body:
            raise GatewayError(BAD_ARGUMENTS, f"{name} is required")
    for name in NUMBERS:
        v = body.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
            raise GatewayError(BAD_ARGUMENTS, f"{name} must be a finite number")
    for name in ("rows_hint", "max_rows_per_unit"):
        v = body.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise GatewayError(BAD_ARGUMENTS, f"{name} must be an integer")
    for name, (lo, hi, open_lo, open_hi) in LIMITS.items():
        v = body.get(name)
        if v is not None and not _inside(v, lo, hi, open_lo, open_hi):
            raise GatewayError(BAD_ARGUMENTS, f"{name} must lie in {'(' if open_lo else '['}{lo:g}, {hi:g}"
                               f"{')' if open_hi else ']'}")
    if body.get("where") is not None:
        if not isinstance(body["where"], str):
            raise GatewayError(BAD_ARGUMENTS, "where must be a SQL condition (a string)")
        check_query_text(body["where"], what="where condition")
    return {k: body[k] for k in FIELDS if body.get(k) is not None}


def run_request(conn, req: dict) -> dict:
    """Run one PTR statistic for ``req`` (parse_request's output) on ``conn`` (the analyst's
    connection) and return the response object."""
    from ..ptr import run_ptr

    kw = dict(req)
    statistic, dataset, column = kw.pop("statistic"), kw.pop("dataset"), kw.pop("column")
    r = run_ptr(conn, statistic, dataset, column, **kw)
    return {"statistic": r.statistic, "branch": r.branch, "value": r.value, "epsilon_charged": r.epsilon_charged,
            "epsilon_reserved": r.epsilon_reserved, "delta": r.delta, "proposed_scale": r.proposed_scale,
            "receipt": getattr(r.receipt, "id", None)}
