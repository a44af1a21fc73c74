"""Metadata queries, answered by the gateway itself from the privacy catalog; no SQL reaches the
engine. Only catalogued tables exist for analysts, with their registered columns and bounds (never
the salt, row counts or anything computed from rows).

Answered: ``SELECT`` of constants and of ``version()``, ``timezone()``, ``serverTimezone()``,
``currentUser()``/``user()``, ``currentDatabase()``/``database()``, ``hostName()``, ``uptime()``;
``SELECT … FROM system.settings | databases | tables | columns | functions`` and
``information_schema.schemata | tables | columns`` (built by dpch.gateway.system_tables: the columns
BI clients read, sizes and row counts NULL) with expressions, ``WHERE``, ``ORDER BY`` and ``LIMIT``
evaluated by dpch.gateway.frame_query (an unknown column is 47 UNKNOWN_IDENTIFIER);
``SHOW DATABASES``, ``SHOW TABLES [FROM db] [LIKE 'p']``, ``DESCRIBE [TABLE] t``,
``EXISTS [TABLE] t``, ``USE db`` (no effect over HTTP). Anything else that is not a DP query is
refused with ACCESS_DENIED by the router.

Bounded cost (issue 27): LIKE/ILIKE is a linear-scan wildcard match (no regular expression, no
backtracking across ``%``), patterns have at most ``MAX_LIKE_PATTERN`` characters, a WHERE at most
``MAX_METADATA_WHERE_NODES`` nodes, and an answer at most ``MAX_RESULT_COLUMNS`` columns and
``MAX_RESULT_CELLS`` cells (dpch.gateway.limits); a larger request is refused before it is computed.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass

import pandas as pd
from sqlglot import exp

from ..plan.options import MECHANISMS, MIXED_RULES, SELECTION_RULES, TOP_K_METHODS
from . import system_tables
from .errors import ACCESS_DENIED, UNKNOWN_TABLE, GatewayError
from .frame_query import Frame, compile_like, like_match, like_series, number, select, too_many_columns

__all__ = ["compile_like", "like_match", "like_series"]  # re-exported: the LIKE matcher's tests import them here

SERVER_VERSION = "26.9.1.1"  # the engine DPCH is tested with; clients use it for feature checks
START_TIME = time.time()

# the DP settings clients may send (clickhouse-connect only sends settings listed here)
DP_SETTINGS = [
    ("dpch_epsilon", "", "Float64", "ε charged for the query (required for plain SQL aggregates)"),
    ("dpch_delta", "0", "Float64", "δ charged for the query (Gaussian noise, partition selection)"),
    ("dpch_mechanism", "auto", "String", " | ".join(MECHANISMS)),
    ("dpch_output_range", "", "String", "lo,hi: public output range of COUNT/SUM (dpch_mechanism = bounded_laplace)"),
    ("dpch_mixed_rule", "thesis", "String", " | ".join(MIXED_RULES) + " (dpch_mechanism = mixed)"),
    ("dpch_with_ci", "0", "Bool", "add <col>_lo/<col>_hi columns"),
    ("dpch_confidence", "0.95", "Float64", "confidence level of the intervals"),
    ("dpch_selection", "auto", "String", " | ".join(SELECTION_RULES) + " (private partition selection rule)"),
    ("dpch_top_k", "auto", "String", " | ".join(TOP_K_METHODS) + " (how ORDER BY <COUNT/SUM> LIMIT n is answered)"),
    ("dpch_max_rows_per_unit", "", "String", "M for this query: an integer, or auto (chosen from the data, privately)"),
    ("dpch_max_groups_contributed", "", "String", "k for this query: an integer, or auto"),
    ("dpch_bounds", "", "String", "auto: the clipping bounds of every numeric column an aggregate reads, chosen "
     "from the data (privately)"),
    ("dpch_auto_share", "0.1", "Float64", "share of ε that chooses the 'auto' bounds"),
    ("dpch_bias_share", "0", "Float64", "share of ε that measures the bias of bounding (X-DPCH-Bias-* headers)"),
]
META_FUNCTIONS = {"version", "timezone", "servertimezone", "currentuser", "user", "current_user",
                  "currentdatabase", "database", "current_database", "hostname", "uptime"}
VIRTUAL_TABLES = {"settings", "databases", "tables", "columns", "functions", "information_schema.schemata",
                  "information_schema.tables", "information_schema.columns"}


@dataclass
class Context:
    user: str
    database: str
    catalog_entries: list  # TableEntry
    like_work: int = 0  # character comparisons spent on LIKE by this query (capped: MAX_LIKE_WORK)


def _settings_df() -> pd.DataFrame:
    from .formats import OUTPUT_SETTINGS

    rows = [{"name": n, "value": v, "changed": 0, "description": d, "min": None, "max": None, "readonly": 0,
             "type": t, "default": v, "alias_for": "", "is_obsolete": 0, "tier": "Production"}
            for n, v, t, d in DP_SETTINGS]
    for n in OUTPUT_SETTINGS:
        v = "," if n == "format_csv_delimiter" else "0"
        rows.append({"name": n, "value": v, "changed": 0, "description": "output format setting", "min": None,
                     "max": None, "readonly": 0, "type": "Bool" if v == "0" else "Char", "default": v,
                     "alias_for": "", "is_obsolete": 0, "tier": "Production"})
    df = pd.DataFrame(rows)
    df["min"] = df["min"].astype(object)
    df["max"] = df["max"].astype(object)
    return df


def _tables_df(ctx: Context) -> pd.DataFrame:
    return system_tables.tables_df(ctx.catalog_entries)


def _databases_df(ctx: Context) -> pd.DataFrame:
    return system_tables.databases_df(ctx.catalog_entries)


def virtual_table(name: str, ctx: Context) -> pd.DataFrame:
    if name.startswith("information_schema."):
        return system_tables.information_schema(name.split(".", 1)[1], ctx.catalog_entries)
    return {"settings": lambda: _settings_df(), "databases": lambda: _databases_df(ctx),
            "tables": lambda: _tables_df(ctx), "columns": lambda: system_tables.columns_df(ctx.catalog_entries),
            "functions": system_tables.functions_df}[name]()


# ------------------------------------------------------------------------------------------------
# constant SELECTs
# ------------------------------------------------------------------------------------------------

def _func_value(name: str, ctx: Context):
    name = name.lower()
    if name == "version":
        return SERVER_VERSION
    if name in ("timezone", "servertimezone"):
        return "UTC"
    if name in ("currentuser", "user", "current_user"):
        return ctx.user
    if name in ("currentdatabase", "database", "current_database"):
        return ctx.database
    if name == "hostname":
        return "dpch-gateway"
    if name == "uptime":
        return int(time.time() - START_TIME)
    raise KeyError(name)


_KNOWN_CLASSES = {"CurrentVersion": "version", "CurrentDatabase": "currentDatabase", "CurrentUser": "currentUser",
                  "CurrentSchema": "currentDatabase"}


def _meta_call_name(node: exp.Expression) -> str | None:
    if isinstance(node, exp.Anonymous):
        return str(node.this)
    name = _KNOWN_CLASSES.get(type(node).__name__)
    if name is not None and not any(v for v in node.args.values()):
        return name
    return None


def is_constant_select(tree: exp.Expression) -> bool:
    return isinstance(tree, exp.Select) and tree.args.get("from_") is None and not tree.args.get("joins")


def answer_constant_select(tree: exp.Select, ctx: Context) -> pd.DataFrame:
    for key, value in tree.args.items():
        if key not in ("expressions", "kind", "hint", "distinct", "limit", "exclude", "operation_modifiers") and value:
            raise GatewayError(ACCESS_DENIED, "only constants and server information can be selected without a table")
    too_many_columns(len(tree.expressions))
    data = {}
    for item in tree.expressions:
        inner = item.this if isinstance(item, exp.Alias) else item
        if isinstance(inner, exp.Literal):
            value = inner.this if inner.is_string else number(inner.this)
            label = inner.sql("clickhouse")
        else:
            fname = _meta_call_name(inner)
            if fname is None or fname.lower() not in META_FUNCTIONS or inner.expressions:
                raise GatewayError(ACCESS_DENIED, "only constants and server information "
                                   f"({', '.join(sorted(META_FUNCTIONS))}) can be selected without a table")
            value = _func_value(fname, ctx)
            label = f"{fname}()"
        name = item.alias if isinstance(item, exp.Alias) else label
        data[name] = [value]
    return pd.DataFrame(data)


# ------------------------------------------------------------------------------------------------
# SELECT … FROM system.<virtual table>: dpch.gateway.frame_query over the table built here
# ------------------------------------------------------------------------------------------------

def virtual_table_name(tree: exp.Select) -> str | None:
    """The key in ``VIRTUAL_TABLES`` (``tables``, ``information_schema.columns`` …) if ``tree``
    reads exactly one of the gateway's system tables, else None."""
    tables = list(tree.find_all(exp.Table))
    if len(tables) != 1 or tree.args.get("joins"):
        return None
    t = tables[0]
    db = (t.db or "").lower()
    if not isinstance(t.this, exp.Identifier) or db not in ("system", "information_schema"):
        return None
    name = t.name.lower() if db == "system" else f"information_schema.{t.name.lower()}"
    return name if name in VIRTUAL_TABLES else None


def answer_virtual_select(tree: exp.Select, name: str, ctx: Context) -> pd.DataFrame:
    """``tree`` over the virtual table ``name``: built from the catalog, nothing reaches the engine."""
    t = next(tree.find_all(exp.Table))
    frame = Frame(virtual_table(name, ctx), names={t.name, f"{t.db}.{t.name}", t.alias_or_name},
                  what=f"the gateway's system table {t.db}.{t.name}", scalar=lambda fn: _func_value(
                      _KNOWN_CLASSES.get(fn, fn), ctx))
    return select(tree, frame)


# ------------------------------------------------------------------------------------------------
# SHOW / DESCRIBE / EXISTS / USE (sqlglot parses them as Command or Describe)
# ------------------------------------------------------------------------------------------------

_IDENT = r"(`[^`]+`|\"[^\"]+\"|[A-Za-z_][A-Za-z0-9_]*)"
_TABLE = rf"{_IDENT}(?:\s*\.\s*{_IDENT})?"


def _unq(s: str | None) -> str | None:
    if s is None:
        return None
    return s[1:-1] if s[:1] in "`\"" else s


def _find(ctx: Context, db: str | None, name: str):
    full = f"{db or ctx.database}.{name}"
    for e in ctx.catalog_entries:
        if e.table == full:
            return e
    raise GatewayError(UNKNOWN_TABLE, f"Table {full} does not exist or is not in the privacy catalog")


def answer_statement(sql: str, ctx: Context) -> pd.DataFrame | None:
    """SHOW/DESCRIBE/EXISTS/USE; None if ``sql`` is none of them."""
    s = sql.strip().rstrip(";").strip()
    m = re.fullmatch(r"(?is)show\s+databases(?:\s+like\s+'([^']*)')?", s)
    if m:
        df = _databases_df(ctx)[["name"]]
        return _like(df, "name", m.group(1))
    m = re.fullmatch(rf"(?is)show\s+(?:full\s+)?tables(?:\s+(?:from|in)\s+{_IDENT})?(?:\s+like\s+'([^']*)')?", s)
    if m:
        db = _unq(m.group(1)) or ctx.database
        df = _tables_df(ctx)
        df = df[df["database"] == db][["name"]].reset_index(drop=True)
        return _like(df, "name", m.group(2))
    m = re.fullmatch(rf"(?is)(?:describe|desc)(?:\s+table)?\s+{_TABLE}", s)
    if m:
        db, name = (_unq(m.group(1)), _unq(m.group(2))) if m.group(2) else (None, _unq(m.group(1)))
        e = _find(ctx, db, name)
        cols = list(e.columns.items())
        return pd.DataFrame({"name": [c for c, _ in cols], "type": [t for _, t in cols],
                             "default_type": [""] * len(cols), "default_expression": [""] * len(cols),
                             "comment": [system_tables.column_comment(e, c) for c, _ in cols],
                             "codec_expression": [""] * len(cols), "ttl_expression": [""] * len(cols)})
    m = re.fullmatch(rf"(?is)exists(?:\s+table)?\s+{_TABLE}", s)
    if m:
        db, name = (_unq(m.group(1)), _unq(m.group(2))) if m.group(2) else (None, _unq(m.group(1)))
        try:
            _find(ctx, db, name)
            found = 1
        except GatewayError:
            found = 0
        return pd.DataFrame({"result": pd.Series([found], dtype="uint8")})
    m = re.fullmatch(rf"(?is)use\s+{_IDENT}", s)
    if m:
        return pd.DataFrame()
    return None


def _like(df: pd.DataFrame, col: str, pattern: str | None) -> pd.DataFrame:
    if pattern is None:
        return df.reset_index(drop=True)
    return df[like_series(df[col], pattern)].reset_index(drop=True)
