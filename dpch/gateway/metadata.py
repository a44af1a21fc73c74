"""Metadata queries, answered by the gateway itself from the privacy catalog; no SQL reaches the
engine. Only catalogued tables exist for analysts, with their registered columns and bounds (never
the salt, row counts or anything computed from rows).

Answered: ``SELECT`` of constants and of ``version()``, ``timezone()``, ``serverTimezone()``,
``currentUser()``/``user()``, ``currentDatabase()``/``database()``, ``hostName()``, ``uptime()``;
``SELECT … FROM system.settings | system.databases | system.tables | system.columns`` with plain
columns, simple ``WHERE`` (``= != < > IN LIKE ILIKE AND OR NOT``), ``ORDER BY`` and ``LIMIT``;
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
from .errors import ACCESS_DENIED, UNKNOWN_TABLE, GatewayError
from .limits import (MAX_LIKE_PATTERN, MAX_LIKE_WORK, MAX_METADATA_WHERE_NODES, MAX_RESULT_CELLS,
                     MAX_RESULT_COLUMNS)

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
]
META_FUNCTIONS = {"version", "timezone", "servertimezone", "currentuser", "user", "current_user",
                  "currentdatabase", "database", "current_database", "hostname", "uptime"}
VIRTUAL_TABLES = {"settings", "databases", "tables", "columns"}


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


def _column_comment(entry, col: str) -> str:
    parts = []
    if entry.privacy_unit == col:
        parts.append("privacy unit (cannot be grouped by or released)")
    b = entry.bounds.get(col)
    if b is not None:
        parts.append(f"bounds [{b[0]:g}, {b[1]:g}]")
    keys = entry.public_keys.get(col)
    if keys:
        parts.append(f"public keys ({len(keys)} values)")
    return "; ".join(parts)


def _tables_df(ctx: Context) -> pd.DataFrame:
    rows = []
    for e in ctx.catalog_entries:
        db, name = e.table.split(".", 1)
        unit = e.privacy_unit or "(row level)"
        rows.append({"database": db, "name": name, "engine": "DPCH", "is_temporary": 0,
                     "comment": f"DP table: privacy unit {unit}, neighbour {e.neighbour}, "
                                f"k={e.max_groups_contributed}, max rows per unit={e.max_rows_per_unit}"})
    return pd.DataFrame(rows, columns=["database", "name", "engine", "is_temporary", "comment"])


def _databases_df(ctx: Context) -> pd.DataFrame:
    names = sorted({e.table.split(".", 1)[0] for e in ctx.catalog_entries} | {"default"})
    return pd.DataFrame({"name": names, "engine": ["Atomic"] * len(names), "comment": [""] * len(names)})


def _columns_df(ctx: Context) -> pd.DataFrame:
    rows = []
    for e in ctx.catalog_entries:
        db, name = e.table.split(".", 1)
        for pos, (col, typ) in enumerate(e.columns.items(), start=1):
            b = e.bounds.get(col)
            rows.append({"database": db, "table": name, "name": col, "type": typ, "position": pos,
                         "default_kind": "", "default_expression": "", "comment": _column_comment(e, col),
                         "is_in_partition_key": 0, "is_in_sorting_key": 0, "is_in_primary_key": 0,
                         "is_in_sampling_key": 0, "compression_codec": "",
                         "dpch_lower_bound": None if b is None else float(b[0]),
                         "dpch_upper_bound": None if b is None else float(b[1]),
                         "dpch_privacy_unit": int(e.privacy_unit == col)})
    cols = ["database", "table", "name", "type", "position", "default_kind", "default_expression", "comment",
            "is_in_partition_key", "is_in_sorting_key", "is_in_primary_key", "is_in_sampling_key",
            "compression_codec", "dpch_lower_bound", "dpch_upper_bound", "dpch_privacy_unit"]
    df = pd.DataFrame(rows, columns=cols)
    for c in ("dpch_lower_bound", "dpch_upper_bound"):
        df[c] = df[c].astype("Float64")
    return df


def virtual_table(name: str, ctx: Context) -> pd.DataFrame:
    return {"settings": lambda: _settings_df(), "databases": lambda: _databases_df(ctx),
            "tables": lambda: _tables_df(ctx), "columns": lambda: _columns_df(ctx)}[name]()


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


def _too_many_columns(n: int) -> None:
    if n > MAX_RESULT_COLUMNS:
        raise GatewayError(ACCESS_DENIED, f"too many columns ({n}); the gateway answers at most {MAX_RESULT_COLUMNS} "
                           "columns without a table or from its system tables")


def _number(text: str) -> int | float:
    """A numeric literal: an integer if it is one Python converts (at most 4 300 digits), else a
    float, as ClickHouse reads integers too long for its types as Float64."""
    if re.fullmatch(r"\d+", text):
        try:
            return int(text)
        except ValueError:
            pass
    return float(text)


def answer_constant_select(tree: exp.Select, ctx: Context) -> pd.DataFrame:
    for key, value in tree.args.items():
        if key not in ("expressions", "kind", "hint", "distinct", "limit", "exclude", "operation_modifiers") and value:
            raise GatewayError(ACCESS_DENIED, "only constants and server information can be selected without a table")
    _too_many_columns(len(tree.expressions))
    data = {}
    for item in tree.expressions:
        inner = item.this if isinstance(item, exp.Alias) else item
        if isinstance(inner, exp.Literal):
            value = inner.this if inner.is_string else _number(inner.this)
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
# SELECT … FROM system.<virtual table>: a tiny evaluator (columns, literals, simple predicates)
# ------------------------------------------------------------------------------------------------

def virtual_table_name(tree: exp.Select) -> str | None:
    """``settings``/``databases``/``tables``/``columns`` if ``tree`` reads exactly one of the
    gateway's system tables, else None."""
    tables = list(tree.find_all(exp.Table))
    if len(tables) != 1:
        return None
    t = tables[0]
    if not isinstance(t.this, exp.Identifier) or (t.db or "").lower() not in ("system", "information_schema"):
        return None
    name = t.name.lower()
    return name if name in VIRTUAL_TABLES else None


def _deny(what: str):
    raise GatewayError(ACCESS_DENIED, f"{what} is not supported in queries on the gateway's system tables")


def _eval(node: exp.Expression, df: pd.DataFrame, ctx: Context):
    if isinstance(node, exp.Paren):
        return _eval(node.this, df, ctx)
    if isinstance(node, exp.Column):
        if node.name not in df.columns:
            raise GatewayError(UNKNOWN_TABLE if False else ACCESS_DENIED, f"unknown column {node.name!r}")
        return df[node.name]
    if isinstance(node, exp.Literal):
        return node.this if node.is_string else float(node.this)
    if isinstance(node, (exp.Boolean,)):
        return bool(node.this)
    fname = _meta_call_name(node)
    if fname is not None and fname.lower() in META_FUNCTIONS:
        return _func_value(fname, ctx)
    if isinstance(node, exp.And):
        return _eval(node.this, df, ctx) & _eval(node.expression, df, ctx)
    if isinstance(node, exp.Or):
        return _eval(node.this, df, ctx) | _eval(node.expression, df, ctx)
    if isinstance(node, exp.Not):
        return ~_eval(node.this, df, ctx)
    ops = {exp.EQ: lambda a, b: a == b, exp.NEQ: lambda a, b: a != b, exp.LT: lambda a, b: a < b,
           exp.LTE: lambda a, b: a <= b, exp.GT: lambda a, b: a > b, exp.GTE: lambda a, b: a >= b}
    for cls, fn in ops.items():
        if isinstance(node, cls):
            a, b = _eval(node.this, df, ctx), _eval(node.expression, df, ctx)
            res = fn(a, b)
            return res if isinstance(res, pd.Series) else pd.Series([bool(res)] * len(df), index=df.index)
    if isinstance(node, exp.In):
        a = _eval(node.this, df, ctx)
        vals = [_eval(v, df, ctx) for v in node.expressions]
        if not isinstance(a, pd.Series) or any(isinstance(v, pd.Series) for v in vals) or node.args.get("query"):
            _deny("this IN")
        return a.astype(str).isin([str(v) for v in vals]) | a.isin(vals)
    if isinstance(node, (exp.Like, exp.ILike)):
        a, pat = _eval(node.this, df, ctx), _eval(node.expression, df, ctx)
        if not isinstance(a, pd.Series) or not isinstance(pat, str):
            _deny("this LIKE")
        return like_series(a, pat, ignore_case=isinstance(node, exp.ILike), ctx=ctx)
    _deny(f"the expression {type(node).__name__}")


# ------------------------------------------------------------------------------------------------
# LIKE without regular expressions: O(len(value) · len(pattern)) per value, whatever the pattern
# ------------------------------------------------------------------------------------------------

def compile_like(pattern: str, ignore_case: bool = False) -> list[list[str | None]]:
    """The pattern's segments between ``%`` wildcards; a segment is a list of characters, None
    for ``_`` (any one character). ``\\x`` is the character x (ClickHouse's escapes ``\\%``,
    ``\\_``, ``\\\\``). Consecutive ``%`` give empty segments, which match trivially."""
    if len(pattern) > MAX_LIKE_PATTERN:
        raise GatewayError(ACCESS_DENIED, f"LIKE pattern too long ({len(pattern)} characters; the limit is "
                           f"{MAX_LIKE_PATTERN})")
    if ignore_case:
        pattern = pattern.lower()
    segs: list[list[str | None]] = [[]]
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            segs[-1].append(pattern[i + 1])
            i += 2
            continue
        if c == "%":
            segs.append([])
        else:
            segs[-1].append(None if c == "_" else c)
        i += 1
    return segs


def _seg_at(s: str, pos: int, seg: list[str | None]) -> bool:
    return all(ch is None or s[pos + k] == ch for k, ch in enumerate(seg))


def _seg_find(s: str, seg: list[str | None], start: int, end: int) -> int:
    """The leftmost p in [start, end - len(seg)] where ``seg`` matches, or -1."""
    if None not in seg:
        return s.find("".join(seg), start, end)  # type: ignore[arg-type]
    for p in range(start, end - len(seg) + 1):
        if _seg_at(s, p, seg):
            return p
    return -1


def like_match(s: str, segs: list[list[str | None]]) -> bool:
    """Whether ``s`` matches the compiled pattern. The first segment is anchored at the start, the
    last at the end; each middle segment is matched leftmost after the previous one. Leftmost is
    always the best choice (a later start leaves less room for the rest), so no position is ever
    revisited: one left-to-right scan."""
    if len(segs) == 1:
        return len(s) == len(segs[0]) and _seg_at(s, 0, segs[0])
    first, last = segs[0], segs[-1]
    end = len(s) - len(last)
    if end < len(first) or not _seg_at(s, 0, first) or not _seg_at(s, end, last):
        return False
    pos = len(first)
    for seg in segs[1:-1]:
        if not seg:
            continue
        p = _seg_find(s, seg, pos, end)
        if p < 0:
            return False
        pos = p + len(seg)
    return True


def like_series(values: pd.Series, pattern: str, ignore_case: bool = False, ctx: Context | None = None) -> pd.Series:
    """LIKE (ILIKE) over a column; NULL never matches. The comparisons a query may spend on LIKE
    are capped (``MAX_LIKE_WORK``, counted in ``ctx``): a value of n characters costs at most n·w,
    w the sum over the non-empty segments of their length if they hold ``_`` (a search with
    comparisons at each position), else 1 (``str.find``); checked before the column is scanned."""
    segs = compile_like(pattern, ignore_case)
    texts = [None if v is None or (not isinstance(v, str) and pd.isna(v)) else str(v) for v in values]
    width = max(1, sum(len(seg) if None in seg else 1 for seg in segs if seg))
    work = sum(len(t) + 1 for t in texts if t is not None) * width
    spent = (ctx.like_work if ctx is not None else 0) + work
    if spent > MAX_LIKE_WORK:
        raise GatewayError(ACCESS_DENIED, "the LIKE patterns of this query are too costly on the gateway's system "
                           "tables; use simpler or fewer patterns")
    if ctx is not None:
        ctx.like_work = spent
    out = [t is not None and like_match(t.lower() if ignore_case else t, segs) for t in texts]
    return pd.Series(out, index=values.index, dtype=bool)


def answer_virtual_select(tree: exp.Select, name: str, ctx: Context) -> pd.DataFrame:
    allowed = {"expressions", "kind", "hint", "distinct", "limit", "offset", "exclude", "operation_modifiers",
               "from_", "where", "order"}
    for key, value in tree.args.items():
        if key not in allowed and value:
            _deny(key.upper())
    if tree.args.get("distinct"):
        _deny("DISTINCT")
    _too_many_columns(len(tree.expressions))
    df = virtual_table(name, ctx)
    where = tree.args.get("where")
    if where is not None:
        if sum(1 for _ in where.walk()) > MAX_METADATA_WHERE_NODES:
            _deny(f"a WHERE clause of more than {MAX_METADATA_WHERE_NODES} nodes")
        try:
            mask = _eval(where.this, df, ctx)
        except RecursionError:
            _deny("an expression nested this deeply")
        if not isinstance(mask, pd.Series):
            mask = pd.Series([bool(mask)] * len(df), index=df.index)
        df = df[mask.fillna(False).astype(bool)]
    order = tree.args.get("order")
    if order is not None:
        by, asc = [], []
        for o in order.expressions:
            col = o.this
            if not isinstance(col, exp.Column) or col.name not in df.columns:
                _deny("ORDER BY other than columns")
            by.append(col.name)
            asc.append(not o.args.get("desc"))
        df = df.sort_values(by, ascending=asc, kind="stable")
    offset = tree.args.get("offset")
    limit = tree.args.get("limit")
    start = int(offset.expression.this) if offset is not None and isinstance(offset.expression, exp.Literal) else 0
    if limit is not None:
        lim = limit.expression
        if not isinstance(lim, exp.Literal):
            _deny("a non-constant LIMIT")
        df = df.iloc[start:start + int(lim.this)]
    elif start:
        df = df.iloc[start:]
    out = {}
    for item in tree.expressions:
        inner = item.this if isinstance(item, exp.Alias) else item
        if isinstance(inner, exp.Star):
            for c in df.columns:
                out[c] = df[c]
            continue
        if isinstance(inner, exp.Column) and inner.name in df.columns:
            out[item.alias if isinstance(item, exp.Alias) else inner.name] = df[inner.name]
            continue
        _deny("a SELECT item other than a column or *")
    _too_many_columns(len(out))
    if len(out) * len(df) > MAX_RESULT_CELLS:
        _deny(f"an answer of more than {MAX_RESULT_CELLS} cells (add LIMIT)")
    return pd.DataFrame(out).reset_index(drop=True)


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
                             "comment": [_column_comment(e, c) for c, _ in cols],
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
