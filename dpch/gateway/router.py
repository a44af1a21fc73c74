"""One query through the gateway, on the engine thread:

    SQL ─► parse (sqlglot, one statement) ─► FORMAT / SETTINGS taken out ─► route:
        SHOW / DESCRIBE / EXISTS / constants / system.{settings,databases,tables,columns}
            ─► dpch.gateway.metadata (answered from the catalog, nothing reaches the engine)
        SELECT on catalogued tables calling dp_*()  ─► dpch.dp_functions ─► controller.run_query
        SELECT on catalogued tables + dpch_epsilon ─► controller.run_query
        anything else ─► ACCESS_DENIED
    ─► DataFrame of released values ─► dpch.gateway.formats (ClickHouse's formatters)
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import pandas as pd
import sqlglot
from sqlglot import exp

from .. import dp_functions
from ..plan.options import MECHANISMS, SELECTION_RULES, TOP_K_METHODS
from . import metadata, params, postprocess_wrapper
from .formats import resolve_format
from .errors import (ACCESS_DENIED, DPCH_INVALID_PARAMETER, DPCH_MISSING_EPSILON, SYNTAX_ERROR, GatewayError,
                     from_dpch)

_FORMAT_NAME = re.compile(r"[A-Za-z0-9_]+")
_DENIED_DATABASES = {"system", "information_schema", "dpch_meta", "dpch_accel"}  # dpch_accel: per-unit states
DP_SETTING_NAMES = {n for n, *_ in metadata.DP_SETTINGS}


@dataclass
class Answer:
    """``df`` to be rendered in ``fmt``, or ``body`` already rendered by the engine (DP answers
    without CI columns: the query that computes them renders them)."""

    df: pd.DataFrame | None
    kind: str  # metadata | dp | dp_functions
    fmt: str
    meta: dict = field(default_factory=dict)
    body: bytes | None = None
    rows: int | None = None


def _setting_value(node: exp.Expression) -> str:
    neg = False
    while isinstance(node, (exp.Neg, exp.Paren)):
        neg = not neg if isinstance(node, exp.Neg) else neg
        node = node.this
    if isinstance(node, exp.Literal):
        return ("-" if neg else "") + str(node.this)
    if isinstance(node, (exp.Column, exp.Identifier, exp.Var)) and not neg:
        return node.name
    if isinstance(node, exp.Boolean):
        return "1" if node.this else "0"
    raise GatewayError(DPCH_INVALID_PARAMETER, "SETTINGS values must be literals")


def query_settings(tree: exp.Expression) -> dict[str, str]:
    """The dpch_* settings of a SETTINGS clause (removed from the tree); any other setting is refused."""
    items = tree.args.get("settings") or []
    out: dict[str, str] = {}
    for item in items:
        if not isinstance(item, exp.EQ) or not isinstance(item.this, (exp.Column, exp.Identifier)):
            raise GatewayError(ACCESS_DENIED, "malformed SETTINGS clause")
        name = item.this.name
        if name.lower() not in DP_SETTING_NAMES:
            raise GatewayError(ACCESS_DENIED, f"setting {name[:64]!r} cannot be changed through the gateway; "
                               f"only {', '.join(sorted(DP_SETTING_NAMES))} are accepted")
        out[name.lower()] = _setting_value(item.expression)
    if items:
        tree.set("settings", None)
    return out


@dataclass
class DPOptions:
    epsilon: float | None = None
    delta: float = 0.0
    mechanism: str = "auto"
    with_ci: bool = False
    confidence: float | None = None
    selection: str = "auto"
    top_k: str = "auto"
    output_range: tuple | None = None  # mechanism bounded_laplace (option output_range)
    mixed_rule: str | None = None  # mechanism mixed (option mixed_rule)
    bounds: dict = field(default_factory=dict)  # per-query contribution bounds and shares (issue 29)

    @classmethod
    def from_settings(cls, s: dict[str, str]) -> "DPOptions":
        o = cls()

        def num(name):
            try:
                v = float(s[name])
            except ValueError:
                raise GatewayError(DPCH_INVALID_PARAMETER, f"{name} must be a number") from None
            if not math.isfinite(v):
                raise GatewayError(DPCH_INVALID_PARAMETER, f"{name} must be finite")
            return v

        if s.get("dpch_epsilon", "") != "":
            o.epsilon = num("dpch_epsilon")
        if s.get("dpch_delta", "") != "":
            o.delta = num("dpch_delta")
        if s.get("dpch_mechanism"):
            o.mechanism = s["dpch_mechanism"].lower()
            if o.mechanism not in MECHANISMS:
                raise GatewayError(DPCH_INVALID_PARAMETER, f"dpch_mechanism must be {', '.join(MECHANISMS[:-1])} "
                                   f"or {MECHANISMS[-1]}")
        if s.get("dpch_output_range", "") != "":  # "lo,hi"; QueryOptions checks the pair
            parts = s["dpch_output_range"].split(",")
            try:
                o.output_range = (float(parts[0]), float(parts[1])) if len(parts) == 2 else ()
            except ValueError:
                raise GatewayError(DPCH_INVALID_PARAMETER, "dpch_output_range must be lo,hi") from None
            if len(o.output_range) != 2:
                raise GatewayError(DPCH_INVALID_PARAMETER, "dpch_output_range must be lo,hi")
        if s.get("dpch_mixed_rule", "") != "":
            o.mixed_rule = s["dpch_mixed_rule"].lower()
        if s.get("dpch_with_ci", "") != "":
            v = s["dpch_with_ci"].lower()
            if v not in ("0", "1", "true", "false"):
                raise GatewayError(DPCH_INVALID_PARAMETER, "dpch_with_ci must be 0 or 1")
            o.with_ci = v in ("1", "true")
        if s.get("dpch_confidence", "") != "":
            o.confidence = num("dpch_confidence")
        for name in ("dpch_max_rows_per_unit", "dpch_max_groups_contributed"):
            v = s.get(name, "").strip().lower()
            if v == "auto":
                o.bounds[name[5:]] = "auto"
            elif v != "":
                if not v.isdigit() or len(v) > 7:
                    raise GatewayError(DPCH_INVALID_PARAMETER, f"{name} must be an integer in [1, 1000000] or auto")
                o.bounds[name[5:]] = int(v)
        if s.get("dpch_bounds", "") != "":
            if s["dpch_bounds"].strip().lower() != "auto":
                raise GatewayError(DPCH_INVALID_PARAMETER, "dpch_bounds must be auto (fixed bounds are the catalog's)")
            o.bounds["bounds"] = "auto"
        for name in ("dpch_auto_share", "dpch_bias_share"):
            if s.get(name, "") != "":
                o.bounds[name[5:]] = num(name)
        if s.get("dpch_selection", "") != "":
            o.selection = s["dpch_selection"].lower()
            if o.selection not in SELECTION_RULES:
                raise GatewayError(DPCH_INVALID_PARAMETER,
                                   f"dpch_selection must be {', '.join(SELECTION_RULES[:-1])} or {SELECTION_RULES[-1]}")
        if s.get("dpch_top_k", "") != "":
            o.top_k = s["dpch_top_k"].lower()
            if o.top_k not in TOP_K_METHODS:
                raise GatewayError(DPCH_INVALID_PARAMETER,
                                   f"dpch_top_k must be {', '.join(TOP_K_METHODS[:-1])} or {TOP_K_METHODS[-1]}")
        return o


def split_trailing_format(sql: str) -> tuple[str, str | None]:
    """(statement, format name) of ``… FORMAT name [;]``, else (sql, None). Linear time: a regex
    anchored at the end rescans every whitespace run (quadratic: 20 000 spaces took 10 s, holding
    the GIL), so the last two words are taken by hand."""
    end = len(sql.rstrip())
    if end and sql[end - 1] == ";":
        end = len(sql[:end - 1].rstrip())
    name_start = end
    while name_start > 0 and not sql[name_start - 1].isspace():
        name_start -= 1
    name = sql[name_start:end]
    kw_end = len(sql[:name_start].rstrip())
    kw_start = kw_end - len("FORMAT")
    if (not _FORMAT_NAME.fullmatch(name) or kw_start <= 0 or sql[kw_start:kw_end].upper() != "FORMAT"
            or not sql[kw_start - 1].isspace()):
        return sql, None
    return sql[:kw_start].rstrip(), name


def _parse(sql: str) -> list[exp.Expression]:
    try:
        trees = [t for t in sqlglot.parse(sql, read="clickhouse") if t is not None]
    except (sqlglot.errors.ParseError, sqlglot.errors.TokenError, ValueError, RecursionError):
        raise GatewayError(SYNTAX_ERROR, "Syntax error: the query cannot be parsed") from None
    return trees


CREATE_VIEW_REFUSAL = ("CREATE VIEW is not available through the DP gateway (a view would answer its query again, "
                       "uncharged, on every read). Wrap the query instead: SELECT … FROM (<DP query>) AS t "
                       "[WHERE …] [ORDER BY …] [LIMIT …] post-processes its released rows at no extra cost; with ibis, "
                       "give the schema: con.sql(query, schema=...)")


def answer(gw, user: str, sql: str, url_settings: dict[str, str], database: str,
           default_format: str | None = None, format_settings: dict[str, str] | None = None,
           query_params: dict[str, str] | None = None) -> Answer:
    """Route and answer one query (called on the engine thread). ``format_settings``: output
    format settings, validated (dpch.gateway.formats.output_settings). ``query_params``: the
    values of ``{name:Type}`` placeholders (``param_<name>``), bound by dpch.gateway.params."""
    if not sql.strip():
        raise GatewayError(SYNTAX_ERROR, "Empty query")
    if len(_split_statements(sql)) > 1:
        raise GatewayError(SYNTAX_ERROR, "Multi-statements are not allowed")
    ctx = metadata.Context(user=user, database=database, catalog_entries=gw.catalog_entries())
    # SHOW / DESCRIBE / EXISTS / USE
    bare, fmt = split_trailing_format(sql)
    if re.match(r"(?is)\s*(show|describe|desc|exists|use)\b", bare):
        fmt = resolve_format(fmt or default_format)
        df = metadata.answer_statement(bare, ctx)
        if df is None:
            raise GatewayError(ACCESS_DENIED, "this statement is not available through the DP gateway")
        return Answer(df, "metadata", fmt)
    trees = _parse(sql)
    if len(trees) != 1:
        raise GatewayError(SYNTAX_ERROR, "Multi-statements are not allowed" if trees else "Empty query")
    tree = params.bind_params(trees[0], query_params or {})
    if tree is not trees[0]:
        sql = tree.sql("clickhouse")  # the ledger records the statement with its parameters bound
    if isinstance(tree, exp.Create) and str(tree.args.get("kind") or "").upper() == "VIEW":
        raise GatewayError(ACCESS_DENIED, CREATE_VIEW_REFUSAL)
    if not isinstance(tree, exp.Select):
        raise GatewayError(ACCESS_DENIED, f"{type(tree).__name__.upper()} statements are not allowed: the gateway "
                           "answers DP SELECT queries and metadata queries only")
    fmt_node = tree.args.get("format")
    fmt = None
    if fmt_node is not None:
        fmt = fmt_node.name if hasattr(fmt_node, "name") and fmt_node.name else fmt_node.sql("clickhouse")
        tree.set("format", None)
    fmt = resolve_format(fmt or default_format)  # before anything is charged
    settings = dict(url_settings)
    settings.update(query_settings(tree))
    for t in tree.find_all(exp.Table):
        if not isinstance(t.this, exp.Identifier):
            raise GatewayError(ACCESS_DENIED, "table functions are not allowed")
    return _route(gw, ctx, user, tree, sql, settings, fmt, format_settings, want_df=False)


def _route(gw, ctx, user: str, tree: exp.Select, sql: str, settings: dict[str, str], fmt: str,
           format_settings: dict[str, str] | None, want_df: bool) -> Answer:
    """Answer one SELECT (its FORMAT and SETTINGS taken out). ``want_df``: a DataFrame answer
    (the inner query of a wrapper), not the engine's rendering."""
    database = ctx.database
    if postprocess_wrapper.inner_query(tree) is not None:
        def run_inner(inner: exp.Select):
            inner_settings = {**settings, **query_settings(inner)}
            return _route(gw, ctx, user, inner, inner.sql("clickhouse"), inner_settings, fmt, format_settings, True)

        df, inner_answer = postprocess_wrapper.answer(tree, lambda inner: _df_of(run_inner(inner)))
        return Answer(df, inner_answer.kind, fmt, inner_answer.meta, rows=len(df))
    if metadata.is_constant_select(tree):
        if any(True for _ in tree.find_all(exp.Subquery, exp.Select)) and list(tree.find_all(exp.Select))[1:]:
            raise GatewayError(ACCESS_DENIED, "subqueries are not allowed here")
        return Answer(metadata.answer_constant_select(tree, ctx), "metadata", fmt)
    vname = metadata.virtual_table_name(tree)
    if vname is not None:
        return Answer(metadata.answer_virtual_select(tree, vname, ctx), "metadata", fmt)

    catalogued = {e.table for e in ctx.catalog_entries}
    with_ = tree.args.get("with_")
    ctes = {c.alias_or_name.lower() for c in with_.expressions} if with_ is not None else set()
    for t in tree.find_all(exp.Table):
        if not t.db and t.name.lower() in ctes:
            continue  # a CTE of this query (dpch.relation resolves it)
        db = t.db or database
        if db.lower() in _DENIED_DATABASES or f"{db}.{t.name}" not in catalogued:
            raise GatewayError(ACCESS_DENIED, f"table {db}.{t.name} is not in the privacy catalog "
                               "(or does not exist); only catalogued tables can be queried, with DP")
        if not t.db:
            t.set("db", exp.to_identifier(db))
    opts = DPOptions.from_settings(settings)
    conn = gw.connection(user)
    try:
        if dp_functions.has_dp_calls(tree):
            if opts.selection != "auto":  # run_dp_functions chooses the rule itself: refuse, never ignore
                raise GatewayError(DPCH_INVALID_PARAMETER, "dpch_selection applies to SQL aggregates with "
                                   "dpch_epsilon; queries calling dp_* functions use dpch_selection = 'auto'")
            if opts.top_k != "auto":
                raise GatewayError(DPCH_INVALID_PARAMETER, "dpch_top_k applies to SQL aggregates with "
                                   "dpch_epsilon; queries calling dp_* functions use dpch_top_k = 'auto'")
            if opts.bounds:
                raise GatewayError(DPCH_INVALID_PARAMETER, f"{', '.join('dpch_' + n for n in opts.bounds)} apply "
                                   "to SQL aggregates with dpch_epsilon; dp_* functions take their bounds as arguments")
            rw = dp_functions.rewrite_dp_functions(tree, extra_delta=opts.delta)
            out = dp_functions.run_dp_functions(conn, rw, with_ci=opts.with_ci, confidence=opts.confidence,
                                                fmt=None if want_df else fmt, format_settings=format_settings)
            kind = "dp_functions"
        else:
            if opts.epsilon is None:
                raise GatewayError(DPCH_MISSING_EPSILON, "this query needs a privacy budget: add SETTINGS "
                                   "dpch_epsilon = <ε> (and dpch_delta for Gaussian noise or private groups), "
                                   "pass dpch_epsilon as a URL parameter or client setting, or call dp_count(ε), "
                                   "dp_sum(x, lo, hi, ε), dp_avg(x, lo, hi, ε)")
            o: dict = {"mechanism": opts.mechanism, "selection": opts.selection, "top_k": opts.top_k}
            for name in ("output_range", "mixed_rule"):  # the thesis mechanisms' options, passed through
                if getattr(opts, name) is not None:
                    o[name] = getattr(opts, name)
            if opts.confidence is not None:
                o["confidence"] = opts.confidence
            o.update(opts.bounds)
            from ..controller import run_query, run_query_formatted

            # the tree is the statement without its FORMAT and SETTINGS; the ledger records the text sent
            if opts.with_ci or want_df:  # CI columns are computed in Python: DataFrame path, rendered after
                out = run_query(conn, sql, epsilon=opts.epsilon, delta=opts.delta, tree=tree,
                                with_ci=opts.with_ci, **o)
            else:
                out = run_query_formatted(conn, sql, fmt, epsilon=opts.epsilon, delta=opts.delta, tree=tree,
                                          format_settings=format_settings, **o)
            kind = "dp"
    except GatewayError:
        raise
    except Exception as exc:  # noqa: BLE001 - mapped to a data-free message
        raise from_dpch(exc) from None
    if isinstance(out, pd.DataFrame):
        meta = out.attrs.get("dpch", {})
        return Answer(out, kind, fmt, {"epsilon": meta.get("epsilon"), "delta": meta.get("delta"),
                                       "receipt": meta.get("receipt"), "dataset": meta.get("table"),
                                       "bias": out.attrs.get("bias")}, rows=len(out))
    bias = getattr(out, "bias", None)
    return Answer(None, kind, fmt, {"epsilon": out.epsilon, "delta": out.delta, "receipt": out.receipt,
                                    "dataset": out.dataset, "bias": bias.to_dict() if bias else None},
                  body=out.body, rows=out.rows)


def bias_headers(bias: dict | None) -> dict[str, str]:
    """The X-DPCH-Bias-* response headers of an answer's bias estimate (noisy shares; no data value),
    and X-DPCH-Warning when a share is above the warning threshold (dpch.plan.profile)."""
    if not bias:
        return {}
    out = {}
    for key, header in (("rows_dropped_share", "Rows-Dropped"), ("units_cut_share", "Units-Cut"),
                        ("values_clipped_share", "Values-Clipped")):
        if bias.get(key) is not None:
            out[f"X-DPCH-Bias-{header}"] = f"{bias[key]:.4f}"
    if bias.get("choices"):
        out["X-DPCH-Bounds"] = ", ".join(f"{c['name']}={c['value']}" for c in bias["choices"])
    if bias.get("warnings"):
        out["X-DPCH-Warning"] = "; ".join(bias["warnings"])
    return out


def _df_of(ans: Answer) -> tuple[pd.DataFrame, Answer]:
    if ans.df is None:  # not reached: want_df answers are DataFrames
        raise GatewayError(ACCESS_DENIED, "the inner query cannot be post-processed")
    return ans.df, ans


def _split_statements(sql: str) -> list[str]:
    """Statements separated by ';' outside quotes and comments (a trailing ';' is allowed)."""
    parts, buf, i, n = [], [], 0, len(sql)
    quote = None
    while i < n:
        c = sql[i]
        if quote:
            buf.append(c)
            if c == "\\" and i + 1 < n:
                buf.append(sql[i + 1])
                i += 2
                continue
            if c == quote:
                quote = None
        elif c in "'\"`":
            quote = c
            buf.append(c)
        elif sql.startswith("--", i) or c == "#":
            j = sql.find("\n", i)
            i = n if j < 0 else j
            continue
        elif sql.startswith("/*", i):
            j = sql.find("*/", i + 2)
            i = n if j < 0 else j + 2
            continue
        elif c == ";":
            parts.append("".join(buf))
            buf = []
        else:
            buf.append(c)
        i += 1
    parts.append("".join(buf))
    return [p for p in parts if p.strip()]
