"""Post-processing over a released answer: ``SELECT … FROM (<inner query>) [AS t] [WHERE …]
[ORDER BY …] [LIMIT …]``, the shape ibis, Superset and Metabase generate around a query.

The inner query is answered by the router's normal path (a DP query charged once through the
controller, or a metadata query); the outer query is then evaluated by dpch.gateway.frame_query
over the inner answer's DataFrame and nothing else. Post-processing of a DP release is free
(dpch_paper.md: differential privacy is closed under post-processing; Dwork & Roth Prop. 2.1), so
the wrapper charges nothing more, provided the outer part reads only released values: it names the
inner query's output columns only, reads no table, and passes the same function rule set
(dpch.function_rules.check_functions) before anything runs.

Checks made before the inner query runs (a refusal charges nothing): the outer query has no JOIN,
GROUP BY, HAVING, window, subquery or aggregate; its functions pass the rule set; every column it
names is an output column of the inner query (as far as the inner SELECT list tells: a ``*`` inner
list defers the check to the released frame).
"""
from __future__ import annotations

from typing import Callable

import pandas as pd
from sqlglot import exp

from ..errors import QueryRejected
from ..function_rules import check_functions
from .errors import ACCESS_DENIED, GatewayError, from_dpch
from .frame_query import UNKNOWN_IDENTIFIER, Frame, select

_OUTER_REFUSED = {"joins": "JOIN", "group": "GROUP BY", "having": "HAVING", "windows": "WINDOW", "qualify": "QUALIFY",
                  "laterals": "ARRAY JOIN", "prewhere": "PREWHERE", "sample": "SAMPLE", "with_": "WITH"}


def inner_query(tree: exp.Expression) -> exp.Select | None:
    """The inner SELECT if ``tree`` is a wrapper: one subquery in FROM, no joins, no aggregate
    in the outer query, and an inner query that aggregates (a DP query), reads a system table, or
    is itself a wrapper. Else None (the tree then takes the normal path, which answers DP queries
    whose FROM is a row-level or per-unit subquery)."""
    if not isinstance(tree, exp.Select) or tree.args.get("joins"):
        return None
    src = tree.args.get("from_")
    sub = src.this if src is not None else None
    if not isinstance(sub, exp.Subquery) or not isinstance(sub.this, exp.Select):
        return None
    inner = sub.this
    if _outer_has_aggregate(tree, sub):
        return None
    if inner_query(inner) is not None or _reads_system(inner) or _aggregates(inner) or \
            inner.args.get("from_") is None:
        return inner
    return None


def _outer_nodes(tree: exp.Select, sub: exp.Expression):
    """The nodes of the outer query, without the inner subquery."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if node is sub:
            continue
        yield node
        stack.extend(node.iter_expressions())


def _aggregates(select_tree: exp.Select) -> bool:
    from .. import dp_functions

    return select_tree.args.get("group") is not None or dp_functions.has_dp_calls(select_tree) or any(
        isinstance(n, exp.AggFunc) or (isinstance(n, exp.Anonymous) and str(n.this).lower().endswith(("if", "state")))
        for n in select_tree.find_all(exp.AggFunc, exp.Anonymous))


def _outer_has_aggregate(tree: exp.Select, sub: exp.Expression) -> bool:
    return tree.args.get("group") is not None or any(isinstance(n, exp.AggFunc) for n in _outer_nodes(tree, sub))


def _reads_system(select_tree: exp.Select) -> bool:
    return any((t.db or "").lower() in ("system", "information_schema") for t in select_tree.find_all(exp.Table))


def _inner_names(inner: exp.Select) -> set[str] | None:
    """The output column names the inner SELECT list states, or None if it has a ``*``."""
    names = set()
    for item in inner.expressions:
        if isinstance(item, exp.Star) or (isinstance(item, exp.Column) and isinstance(item.this, exp.Star)):
            return None
        names.add(item.alias_or_name if isinstance(item, (exp.Alias, exp.Column)) else item.sql("clickhouse"))
        if isinstance(item, exp.Alias) or isinstance(item, exp.Column):
            names.add(item.alias_or_name)
    return names


def check_outer(tree: exp.Select, sub: exp.Subquery) -> None:
    """Everything about the outer query that can be judged from the text, before the inner query
    runs: refused clauses, nested subqueries, the function rule set, and its column names."""
    for key, what in _OUTER_REFUSED.items():
        if tree.args.get(key):
            raise GatewayError(ACCESS_DENIED, f"{what} is not supported in a query over a DP answer (the outer query "
                               "may project, filter, order and limit the released rows)")
    outer = tree.copy()
    outer.args["from_"].set("this", exp.Table(this=exp.to_identifier("dpch_released")))
    for node in outer.walk():
        if isinstance(node, (exp.Subquery, exp.Exists)) or (isinstance(node, exp.Select) and node is not outer):
            raise GatewayError(ACCESS_DENIED, "a subquery outside FROM is not supported in a query over a DP answer")
        if isinstance(node, (exp.Window, exp.AggFunc)):
            raise GatewayError(ACCESS_DENIED, "aggregates and window functions are not supported in a query over a "
                               "DP answer")
    try:
        check_functions(outer)
    except QueryRejected as exc:
        raise from_dpch(exc) from None
    names = _inner_names(sub.this)
    if names is None:
        return
    aliases = {i.alias for i in tree.expressions if isinstance(i, exp.Alias)}
    qualifiers = {sub.alias_or_name} if sub.alias_or_name else set()
    for col in outer.find_all(exp.Column):
        if isinstance(col.this, exp.Star):
            continue
        if col.table and col.table not in qualifiers:
            raise GatewayError(UNKNOWN_IDENTIFIER, f"Unknown expression identifier `{col.table}.{col.name}`: the outer "
                               "query reads the inner query's answer only")
        if col.name not in names and col.name not in aliases:
            raise GatewayError(UNKNOWN_IDENTIFIER, f"Unknown expression identifier `{col.name[:64]}`: the outer query "
                               f"may name the inner query's output columns only ({', '.join(sorted(names))})")


def answer(tree: exp.Select, run_inner: Callable[[exp.Select], tuple[pd.DataFrame, dict]]) -> tuple[pd.DataFrame, dict]:
    """The outer query of ``tree`` over the inner query's answer. ``run_inner(inner)`` answers
    the inner query (charging it, once, if it is a DP query) and returns (DataFrame, meta).
    Privacy: the result is a function of that DataFrame and the query text only (post-processing)."""
    sub = tree.args["from_"].this
    check_outer(tree, sub)
    inner_df, meta = run_inner(sub.this)
    alias = sub.alias_or_name
    frame = Frame(inner_df.reset_index(drop=True), names={alias} if alias else set(),
                  what="the inner query's answer")
    return select(tree, frame), meta
