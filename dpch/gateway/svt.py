"""`POST /dpch/svt`: a sparse-vector session as ONE request carrying its queries (issue 16).

The session (dpch.svt: odp_privacy_accounting.md Alg. 2, settled by Lemma 8) runs inside the
gateway, so its noisy threshold ρ and the ledger's settlement token stay on the server side of the
trust boundary: the analyst sees only the ⊤/⊥ answers and what was charged.

Request (JSON body): ``{"dataset": "db.table", "threshold": T, "epsilon": ε, "max_positives": c,
"queries": ["SELECT COUNT(*) FROM db.table WHERE …", …], "split": ε1/ε (optional)}``.

Response (JSON): ``{"answers": [true, false, null, …], "errors": {"2": "…"}, "positives": c′,
"stopped_at": i or null, "epsilon_reserved": ε, "epsilon_spent": ε1 + (c′/c)·ε2, "receipt": id}``.
Queries are answered in order until c ⊤ answers (the rest are not run: ``stopped_at`` is the index
of the first one not run). A query the controller refuses (QueryRejected / InvalidParameter) gets
``null`` and its message in ``errors``; it ran nothing and consumed nothing (its refusal depends on
the query and the catalog only). A request none of whose queries the controller accepts is refused
whole before the session opens: nothing is charged. Any other failure ends the session (its charge
stays at ε) and the request fails without data in its message.

Caps (issue 27; docs/GATEWAY.md "Request limits"), checked before anything runs or is charged:
at most ``MAX_QUERIES`` queries, ``1 <= max_positives <= MAX_QUERIES`` (more ⊤ answers than
queries cannot happen, and the ledger keeps one cell per possible count), each query within the
gateway's query caps (dpch.gateway.limits.check_query_text), ``dataset`` at most 256 characters.
"""
from __future__ import annotations

import math
from typing import Any

from ..errors import InvalidParameter, QueryRejected
from .errors import BAD_ARGUMENTS, GatewayError
from .limits import check_query_text

#: The most queries one request may carry: each is a full DP query (about 50 ms on the engine
#: worker; 100 took 5.2 s, past the 5 s another user may wait).
MAX_QUERIES = 50
#: The most ⊤ answers a session may allow.
MAX_POSITIVES = MAX_QUERIES
MAX_NAME_CHARS = 256


def _number(body: dict, name: str, *, required: bool = True) -> float | None:
    v = body.get(name)
    if v is None and not required:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise GatewayError(BAD_ARGUMENTS, f"{name} must be a finite number")
    return float(v)


def parse_request(body: Any) -> dict:
    """Check the request's shape; raises GatewayError (BAD_ARGUMENTS) naming the field."""
    if not isinstance(body, dict):
        raise GatewayError(BAD_ARGUMENTS, "the body must be a JSON object")
    unknown = sorted(set(body) - {"dataset", "threshold", "epsilon", "max_positives", "queries", "split"})
    if unknown:
        raise GatewayError(BAD_ARGUMENTS, f"unknown field(s) {', '.join(unknown)}")
    dataset = body.get("dataset")
    if not isinstance(dataset, str) or not dataset or len(dataset) > MAX_NAME_CHARS:
        raise GatewayError(BAD_ARGUMENTS, f"dataset must be a table name (db.table, at most {MAX_NAME_CHARS} characters)")
    c = body.get("max_positives", 1)
    if isinstance(c, bool) or not isinstance(c, int) or not 1 <= c <= MAX_POSITIVES:
        raise GatewayError(BAD_ARGUMENTS, f"max_positives must be an integer from 1 to {MAX_POSITIVES}")
    queries = body.get("queries")
    if not isinstance(queries, list) or not queries or not all(isinstance(q, str) for q in queries):
        raise GatewayError(BAD_ARGUMENTS, "queries must be a non-empty list of SQL strings")
    if len(queries) > MAX_QUERIES:
        raise GatewayError(BAD_ARGUMENTS, f"at most {MAX_QUERIES} queries per request (this one has {len(queries)})")
    for i, q in enumerate(queries):
        check_query_text(q, what=f"query {i}")
    return {"dataset": dataset, "threshold": _number(body, "threshold"), "epsilon": _number(body, "epsilon"),
            "max_positives": c, "queries": queries, "split": _number(body, "split", required=False)}


def run_session(conn, req: dict) -> dict:
    """Run one sparse-vector session for ``req`` (parse_request's output) on ``conn`` (the
    analyst's connection) and return the response object."""
    answers: list[bool | None] = []
    errors: dict[str, str] = {}
    stopped_at = None
    svt = conn.sparse_vector(req["dataset"], req["threshold"], req["epsilon"], max_positives=req["max_positives"],
                             split=req["split"])
    svt.refuse_if_none_answerable(req["queries"])  # before the charge
    with svt:
        for i, sql in enumerate(req["queries"]):
            if svt.positives >= svt.max_positives:
                stopped_at = i
                break
            try:
                answers.append(bool(svt.above(sql)))
            except (QueryRejected, InvalidParameter) as exc:
                if svt.state != "open":  # the session itself ended (failed): stop here
                    raise
                answers.append(None)
                errors[str(i)] = str(exc)
    return {"answers": answers, "errors": errors, "positives": svt.positives, "stopped_at": stopped_at,
            "epsilon_reserved": svt.epsilon, "epsilon_spent": svt.epsilon_spent,
            "receipt": getattr(svt.receipt, "id", None)}
