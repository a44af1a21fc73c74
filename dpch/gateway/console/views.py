"""What the console's JSON routes answer, as plain functions of the ledger, the catalog or a
connection (called on an engine thread). Each reads only the authenticated analyst's own rows or
catalog metadata declared by the administrator; none reads a private row or charges anything."""
from __future__ import annotations

import math

import sqlglot
from sqlglot import exp

from ... import dp_functions
from ...budget_units import budget_report
from ..errors import ACCESS_DENIED, DPCH_MISSING_EPSILON, SYNTAX_ERROR, GatewayError
from ..router import DPOptions, query_settings, split_trailing_format

MAX_HISTORY = 2000  # charges in one answer (the newest)
MAX_KEYS_SHOWN = 100  # public keys listed per column (their count is given too)
MAX_QUERY_CHARS = 500  # of the analyst's own query text in the history


def json_safe(v):
    """``v`` with non-finite floats as None and tuples as lists (JSON.parse rejects NaN)."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {str(k): json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_safe(x) for x in v]
    if v is None or isinstance(v, (bool, int, str)):
        return v
    return str(v)


def budgets(ledger, analyst: str) -> list[dict]:
    """The analyst's budgets, one row per dataset: what was granted, spent and is left, in the
    administrator's units (dpch.budget_units). Other analysts' budgets are never returned."""
    out = []
    for st in ledger.budgets():
        if st.analyst != analyst:
            continue
        costs = [r.effective_cost() for r in ledger.history(analyst, st.dataset) if r.generation == st.generation]
        rep = budget_report(st, costs)
        out.append({"dataset": st.dataset, "accountant": rep.accountant, "generation": st.generation,
                    "epsilon": rep.epsilon, "delta": rep.delta, "epsilon_spent": rep.epsilon_spent,
                    "epsilon_left": rep.epsilon_left, "delta_at": rep.delta_at, "delta_spent": st.spent.delta,
                    "delta_left": st.remaining.delta, "queries": rep.queries, "queries_left": rep.queries_left,
                    "text": str(rep)})
    return json_safe(sorted(out, key=lambda r: r["dataset"]))


def history(ledger, analyst: str) -> list[dict]:
    """The analyst's own charges, oldest first (the newest ``MAX_HISTORY``): when, on which dataset
    and budget generation, the ε/δ that count now (after any settlement) and the ε reserved."""
    rows = sorted(ledger.history(analyst=analyst), key=lambda r: r.id)[-MAX_HISTORY:]
    return json_safe([{"id": r.id, "dataset": r.dataset, "generation": r.generation, "time": r.created_at,
                       "epsilon": r.effective_epsilon, "delta": r.effective_delta, "reserved_epsilon": r.epsilon,
                       "outcome": r.outcome, "query": r.query_text[:MAX_QUERY_CHARS]} for r in rows])


def catalog(entries) -> list[dict]:
    """The catalogued tables as the administrator declared them: privacy unit, neighbour relation,
    contribution limits, column types, bounds and public keys. Public keys are released by design
    (every public key appears in a grouped answer); no row count, size or salt is read."""
    out = []
    for e in entries:
        cols = []
        for name, typ in e.columns.items():
            b = e.bounds.get(name)
            keys = list(e.public_keys.get(name) or ())
            cols.append({"name": name, "type": typ, "privacy_unit": e.privacy_unit == name,
                         "bounds": None if b is None else [float(b[0]), float(b[1])],
                         "public_keys": keys[:MAX_KEYS_SHOWN], "public_keys_count": len(keys)})
        out.append({"table": e.table, "public": bool(e.public), "privacy_unit": e.privacy_unit,
                    "neighbour": e.neighbour, "max_groups_contributed": e.max_groups_contributed,
                    "max_rows_per_unit": e.max_rows_per_unit, "max_rows_per_group": e.max_rows_per_group,
                    "references": {c: list(r) for c, r in e.references.items()}, "columns": cols})
    return json_safe(sorted(out, key=lambda t: t["table"]))


def _controller_options(opts: DPOptions) -> dict:
    o: dict = {"mechanism": opts.mechanism, "selection": opts.selection, "top_k": opts.top_k}
    for name in ("output_range", "mixed_rule", "confidence"):
        if getattr(opts, name) is not None:
            o[name] = getattr(opts, name)
    return o


def explain(conn, sql: str, url_settings: dict[str, str]) -> dict:
    """What ``sql`` would do and cost, with the same DP settings as the query route (URL
    parameters, or SETTINGS in the text) and dp_* calls rewritten as the router rewrites them.
    Nothing runs and nothing is charged. Like the charging path, the ledger first confirms
    (read-only) that the analyst can afford the declared cost, before the engine is asked for the
    types of anything the analyst wrote (DESIGN.md invariant 10)."""
    from ...controller import explain_prepared, prepare

    bare, _ = split_trailing_format(sql)
    if not bare.strip():
        raise GatewayError(SYNTAX_ERROR, "Empty query")
    try:
        trees = [t for t in sqlglot.parse(bare, read="clickhouse") if t is not None]
    except (sqlglot.errors.ParseError, sqlglot.errors.TokenError, ValueError, RecursionError):
        raise GatewayError(SYNTAX_ERROR, "Syntax error: the query cannot be parsed") from None
    if len(trees) != 1 or not isinstance(trees[0], exp.Select):
        raise GatewayError(ACCESS_DENIED, "explain applies to one DP SELECT query")
    tree = trees[0]
    tree.set("format", None)
    settings = dict(url_settings)
    settings.update(query_settings(tree))
    opts = DPOptions.from_settings(settings)

    def run(text, eps, dlt, o):
        return explain_prepared(prepare(conn, text, epsilon=eps, delta=dlt, precheck=True, **o))

    if dp_functions.has_dp_calls(tree):
        rw = dp_functions.rewrite_dp_functions(tree, extra_delta=opts.delta)
        o = {"mechanism": rw.mechanism, "weights": dict(rw.weights)}
        ex = run(rw.sql, rw.epsilon, rw.delta, o)
        if ex.selection is not None and rw.delta > 0:  # as run_dp_functions: selection gets its own ε
            o["weights"]["partition_selection"] = rw.selection_epsilon
            ex = run(rw.sql, rw.epsilon + rw.selection_epsilon, rw.delta, o)
    else:
        if opts.epsilon is None:
            raise GatewayError(DPCH_MISSING_EPSILON, "explain needs the ε the query would be charged: fill in ε "
                               "(dpch_epsilon), or call dp_count(ε), dp_sum(x, lo, hi, ε), dp_avg(x, lo, hi, ε)")
        ex = run(tree.sql("clickhouse"), opts.epsilon, opts.delta, _controller_options(opts))
    out = ex.to_dict()
    out.pop("timings_ms", None)  # an answer carries no timings (invariant 11)
    out["text"] = "\n".join(line for line in str(ex).splitlines() if not line.startswith("controller time"))
    return json_safe(out)
