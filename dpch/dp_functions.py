"""Rewrite analyst SQL that calls the ``dp_*`` SQL functions into a controller query.

The ``dp_*`` SQL functions (README, "SQL usage") are row-level and have no ledger. Through the
gateway they are never executed: a query that calls them is rewritten into plain aggregates and
answered by the controller (``dpch.controller.run_query``), i.e. with the catalog's privacy unit,
contribution bounding and bounds, and charged to the ledger:

| call | becomes | its ε, δ |
|---|---|---|
| ``dp_count(eps)`` | ``COUNT(*)`` | eps |
| ``dp_sum(x, lo, hi, eps)`` | ``SUM(least(greatest(x, lo), hi))`` | eps |
| ``dp_avg(x, lo, hi, eps)`` | ``AVG(least(greatest(x, lo), hi))`` | eps (split sum/count by the planner) |
| ``dp_count_gaussian(eps, delta)`` | ``COUNT(*)`` | eps, delta (Gaussian) |
| ``dp_sum_gaussian(x, lo, hi, eps, delta)`` | ``SUM(least(greatest(x, lo), hi))`` | eps, delta |
| ``dp_avg_gaussian(x, lo, hi, eps, delta)`` | ``AVG(least(greatest(x, lo), hi))`` | eps, delta |
| ``dp_quantile(x, q, lo, hi, eps)`` | ``quantile(q)(least(greatest(x, lo), hi))`` | eps |
| ``dp_median(x, lo, hi, eps)`` | ``median(least(greatest(x, lo), hi))`` | eps |

Bounds: the controller clips every column to its catalog bounds and derives the per-row interval
by interval arithmetic, so ``least(greatest(x, lo), hi)`` has the interval
``[max(lo, cat_lo), min(hi, cat_hi)]``: the analyst's bounds are intersected with the catalog's and
can only narrow them (a column without catalog bounds is rejected by the controller as usual).

Budget: the query's ε is the sum of the calls' ε (basic composition) and each output column's
quantities get weight ``eps / q`` (``q`` = its number of noisy quantities: 1, or 2 for AVG), so
each call gets the ε it names. δ is the sum of the Gaussian calls' δ plus the ``dpch_delta`` the
query gives (for partition selection). When the query needs private partition selection (GROUP BY
a key without a public domain), selection gets weight equal to the smallest call ε, which is added
to the total: the ledger is charged the composed cost of every call *and* of the selection.

Calls must be whole SELECT items (optionally aliased); the same call may be repeated verbatim in
HAVING/ORDER BY. Laplace and Gaussian calls cannot be mixed in one query (the controller takes one
mechanism per query). All arguments other than ``x`` must be numeric literals.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import sqlglot
from sqlglot import exp

from .errors import InvalidParameter, QueryRejected

# name -> (aggregate, number of value arguments, gaussian)
DP_FUNCTIONS = {
    "dp_count": ("COUNT", 0, False),
    "dp_sum": ("SUM", 1, False),
    "dp_avg": ("AVG", 1, False),
    "dp_count_gaussian": ("COUNT", 0, True),
    "dp_sum_gaussian": ("SUM", 1, True),
    "dp_avg_gaussian": ("AVG", 1, True),
    "dp_quantile": ("QUANTILE", 1, False),
    "dp_median": ("MEDIAN", 1, False),
}
_QUANTITIES = {"COUNT": 1, "SUM": 1, "AVG": 2, "QUANTILE": 1, "MEDIAN": 1}


@dataclass
class DPCall:
    name: str
    aggregate: str
    epsilon: float
    delta: float
    gaussian: bool
    lo: float | None = None
    hi: float | None = None


@dataclass
class Rewritten:
    sql: str
    epsilon: float
    delta: float
    mechanism: str
    weights: dict[str, float]
    calls: list[DPCall] = field(default_factory=list)
    selection_epsilon: float = 0.0  # ε to add when the plan has partition selection


def _func_name(node: exp.Expression) -> str | None:
    if isinstance(node, exp.Anonymous):
        return str(node.this).lower()
    return None


def _is_dp_call(node: exp.Expression) -> bool:
    name = _func_name(node)
    return name is not None and (name in DP_FUNCTIONS or name.startswith(("dp_", "dpch_")))


def has_dp_calls(tree: exp.Expression) -> bool:
    return any(_is_dp_call(n) for n in tree.walk())


def _number(node: exp.Expression, what: str, fn: str) -> float:
    neg = False
    while isinstance(node, (exp.Neg, exp.Paren)):
        if isinstance(node, exp.Neg):
            neg = not neg
        node = node.this
    if not (isinstance(node, exp.Literal) and not node.is_string):
        raise QueryRejected(f"{fn}: {what} must be a numeric literal")
    try:
        v = float(node.this)
    except ValueError:
        raise QueryRejected(f"{fn}: {what} must be a numeric literal") from None
    v = -v if neg else v
    if not math.isfinite(v):
        raise InvalidParameter(f"{fn}: {what} must be finite")
    return v


def _literal(v: float) -> exp.Expression:
    text = repr(float(v)) if not float(v).is_integer() else str(int(v))
    lit = exp.Literal.number(text.lstrip("-"))
    return exp.Neg(this=lit) if v < 0 else lit


def _convert(call: exp.Anonymous) -> tuple[exp.Expression, DPCall]:
    name = _func_name(call)
    if name not in DP_FUNCTIONS:
        raise QueryRejected(f"function {name}() is not available through the gateway; "
                            f"use {', '.join(sorted(DP_FUNCTIONS))} or plain aggregates with SETTINGS dpch_epsilon")
    agg, nvals, gaussian = DP_FUNCTIONS[name]
    args = list(call.expressions)
    level = None
    if agg == "QUANTILE":  # dp_quantile(x, q, lo, hi, eps): take q out, the rest is laid out like dp_sum
        if len(args) != 5:
            raise QueryRejected(f"{name} takes (x, q, lo, hi, eps); got {len(args)} argument(s)")
        level = _number(args.pop(1), "q", name)
        if not 0.0 <= level <= 1.0:
            raise InvalidParameter(f"{name}: q must be in [0, 1]")
    nparams = (2 if nvals else 0) + (2 if gaussian else 1)
    if len(args) != nvals + nparams:
        sig = {"dp_count": "eps", "dp_count_gaussian": "eps, delta"}.get(name, "x, lo, hi, eps" + (", delta" if gaussian else ""))
        raise QueryRejected(f"{name} takes ({sig}); got {len(args)} argument(s)")
    lo = hi = None
    if nvals:
        x = args[0]
        if any(_is_dp_call(n) for n in x.walk()) or any(isinstance(n, exp.AggFunc) for n in x.walk()):
            raise QueryRejected(f"{name}: the value argument cannot contain an aggregate or another dp_ call")
        lo = _number(args[1], "lo", name)
        hi = _number(args[2], "hi", name)
        if lo > hi:
            raise InvalidParameter(f"{name}: lo must be <= hi")
        eps_node = args[3]
    else:
        eps_node = args[0]
    eps = _number(eps_node, "eps", name)
    if eps <= 0:
        raise InvalidParameter(f"{name}: eps must be a finite number > 0")
    delta = 0.0
    if gaussian:
        delta = _number(args[-1], "delta", name)
        if not 0 < delta < 1:
            raise InvalidParameter(f"{name}: delta must be in (0, 1)")
    if agg == "COUNT":
        new: exp.Expression = exp.Count(this=exp.Star())
    else:
        clipped = exp.Anonymous(this="least", expressions=[
            exp.Anonymous(this="greatest", expressions=[x.copy(), _literal(lo)]), _literal(hi)])
        if agg in ("QUANTILE", "MEDIAN"):
            new = exp.Quantile(this=clipped, quantile=_literal(0.5 if level is None else level))
        else:
            new = exp.Sum(this=clipped) if agg == "SUM" else exp.Avg(this=clipped)
    return new, DPCall(name, agg, eps, delta, gaussian, lo, hi)


def rewrite_dp_functions(tree: exp.Expression, *, extra_delta: float = 0.0) -> Rewritten:
    """Rewrite a parsed SELECT (sqlglot, ClickHouse dialect, SETTINGS/FORMAT already removed)."""
    if not isinstance(tree, exp.Select):
        raise QueryRejected("dp_* functions are accepted in one SELECT only")
    tree = tree.copy()
    calls: list[DPCall] = []
    weights: dict[str, float] = {}
    by_text: dict[str, exp.Expression] = {}
    used_names: set[str] = set()
    new_items = []
    for item in tree.expressions:
        inner = item.this if isinstance(item, exp.Alias) else item
        if _is_dp_call(inner):
            new, call = _convert(inner)
            text = inner.sql("clickhouse")
            name = item.alias if isinstance(item, exp.Alias) else text
            if name in used_names:
                raise QueryRejected(f"two output columns are named {name!r}; give the dp_ calls distinct aliases")
            used_names.add(name)
            by_text[text] = new
            calls.append(call)
            weights[name] = call.epsilon / _QUANTITIES[call.aggregate]
            new_items.append(exp.Alias(this=new, alias=exp.to_identifier(name, quoted=True)))
        else:
            if any(_is_dp_call(n) for n in item.walk()):
                raise QueryRejected("a dp_* call must be a whole SELECT item (optionally with an alias), "
                                    "not part of an expression")
            new_items.append(item)
    if not calls:
        raise QueryRejected("no dp_* call in the SELECT list")
    tree.set("expressions", new_items)
    # HAVING / ORDER BY may repeat a SELECT item's call verbatim
    for key in ("where", "group", "having", "order", "limit", "offset", "joins"):
        part = tree.args.get(key)
        if part is None:
            continue
        nodes = part if isinstance(part, list) else [part]
        for node in nodes:
            for n in list(node.walk()):
                if _is_dp_call(n):
                    text = n.sql("clickhouse")
                    if key not in ("having", "order") or text not in by_text:
                        raise QueryRejected("a dp_* call outside the SELECT list must repeat a SELECT item's call "
                                            "verbatim, in HAVING or ORDER BY")
                    n.replace(by_text[text].copy())
    kinds = {c.gaussian for c in calls}
    if len(kinds) > 1:
        raise QueryRejected("cannot mix Laplace dp_* calls and *_gaussian calls in one query (one mechanism per query)")
    gaussian = kinds.pop()
    epsilon = sum(c.epsilon for c in calls)
    delta = sum(c.delta for c in calls) + float(extra_delta or 0.0)
    return Rewritten(sql=tree.sql("clickhouse"), epsilon=epsilon, delta=delta,
                     mechanism="gaussian" if gaussian else "laplace", weights=weights, calls=calls,
                     selection_epsilon=min(c.epsilon for c in calls))


def rewrite_sql(sql: str, *, extra_delta: float = 0.0) -> Rewritten:
    try:
        trees = [t for t in sqlglot.parse(sql, read="clickhouse") if t is not None]
    except sqlglot.errors.ParseError:
        raise QueryRejected("cannot parse the query") from None
    if len(trees) != 1:
        raise QueryRejected("exactly one statement is accepted")
    return rewrite_dp_functions(trees[0], extra_delta=extra_delta)


def run_dp_functions(conn, rewritten: Rewritten, *, with_ci: bool = False, confidence: float | None = None,
                     keys=None, fmt: str | None = None, format_settings: dict[str, str] | None = None):
    """Answer a rewritten dp_* query through the controller (charges the ledger): a DataFrame, or
    with ``fmt`` (and no ``with_ci``) the engine's rendering of it (controller.run_query_formatted)."""
    from .controller import explain_query, run_query, run_query_formatted

    opts: dict = {"mechanism": rewritten.mechanism, "weights": dict(rewritten.weights), "with_ci": with_ci}
    if confidence is not None:
        opts["confidence"] = confidence
    if keys:
        opts["keys"] = keys
    epsilon = rewritten.epsilon
    tree = sqlglot.parse_one(rewritten.sql, read="clickhouse")
    if tree.args.get("group") is not None and rewritten.delta > 0:
        # does the plan select partitions privately? (explain charges and runs nothing)
        ex = explain_query(conn, rewritten.sql, epsilon=epsilon, delta=rewritten.delta, **opts)
        if ex.selection is not None:
            opts["weights"]["partition_selection"] = rewritten.selection_epsilon
            epsilon += rewritten.selection_epsilon
    if fmt is not None and not with_ci:
        return run_query_formatted(conn, rewritten.sql, fmt, epsilon=epsilon, delta=rewritten.delta,
                                   format_settings=format_settings, **opts)
    return run_query(conn, rewritten.sql, epsilon=epsilon, delta=rewritten.delta, **opts)
