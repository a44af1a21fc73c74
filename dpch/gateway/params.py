"""Query parameters as ClickHouse defines them: ``{name:Type}`` placeholders in the SQL, values in
``param_<name>`` URL parameters (what clickhouse-connect's and @clickhouse/client's ``query_params``
send). A value is parsed as a literal of its type (ClickHouse reads it in the escaped text format)
and bound as a sqlglot node in the parsed statement, never spliced into the SQL text, so a value
can never become SQL. Errors use ClickHouse's codes: 456 UNKNOWN_QUERY_PARAMETER for a
placeholder without a value, 457 BAD_QUERY_PARAMETER for a value that is not a literal of its type.
Messages name the parameter and the type, never the value.

``{name:Identifier}`` binds a (possibly ``db.``-qualified) identifier; what it names is then judged
like any identifier written in the query (catalogued tables only).
"""
from __future__ import annotations

import datetime as dt
import re
import uuid
from decimal import Decimal, InvalidOperation

import sqlglot
from sqlglot import exp

from .errors import GatewayError

UNKNOWN_QUERY_PARAMETER = (456, "UNKNOWN_QUERY_PARAMETER", 400)
BAD_QUERY_PARAMETER = (457, "BAD_QUERY_PARAMETER", 400)

_INT_BITS = {exp.DataType.Type.TINYINT: 8, exp.DataType.Type.SMALLINT: 16, exp.DataType.Type.INT: 32,
             exp.DataType.Type.BIGINT: 64, exp.DataType.Type.INT128: 128, exp.DataType.Type.INT256: 256}
_UINT_BITS = {exp.DataType.Type.UTINYINT: 8, exp.DataType.Type.USMALLINT: 16, exp.DataType.Type.UINT: 32,
              exp.DataType.Type.UBIGINT: 64, exp.DataType.Type.UINT128: 128, exp.DataType.Type.UINT256: 256}
_FLOATS = {exp.DataType.Type.FLOAT, exp.DataType.Type.DOUBLE}
_STRINGS = {exp.DataType.Type.TEXT, exp.DataType.Type.VARCHAR, exp.DataType.Type.CHAR, exp.DataType.Type.NCHAR,
            exp.DataType.Type.NVARCHAR}
_DATES = {exp.DataType.Type.DATE, exp.DataType.Type.DATE32}
_DATETIMES = {exp.DataType.Type.DATETIME, exp.DataType.Type.DATETIME64, exp.DataType.Type.TIMESTAMP}
_ESCAPES = {"\\": "\\", "'": "'", '"': '"', "t": "\t", "n": "\n", "r": "\r", "0": "\0", "b": "\b", "f": "\f",
            "a": "\a", "v": "\v", "N": "\\N"}
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)?")


class _Bad(ValueError):
    """The value is not a literal of the type (the caller names the parameter)."""


def _unescape(text: str) -> str:
    """ClickHouse's escaped text format: backslash escapes, ``\\xHH``."""
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c != "\\" or i + 1 == len(text):
            out.append(c)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "x" and re.fullmatch(r"[0-9A-Fa-f]{2}", text[i + 2:i + 4]):
            out.append(chr(int(text[i + 2:i + 4], 16)))
            i += 4
            continue
        out.append(_ESCAPES.get(nxt, nxt))
        i += 2
    return "".join(out)


def _type_sql(dtype: exp.DataType) -> str:
    return dtype.sql("clickhouse")


def _integer(text: str, bits: int, signed: bool) -> exp.Expression:
    if not re.fullmatch(r"[+-]?\d{1,80}", text.strip()):
        raise _Bad
    v = int(text)
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    if not lo <= v <= hi:
        raise _Bad
    lit = exp.Literal.number(abs(v))
    return exp.Neg(this=lit) if v < 0 else lit


def _float(text: str) -> exp.Expression:
    t = text.strip().lower()
    if t in ("inf", "+inf", "-inf", "nan", "+nan", "-nan", "infinity", "-infinity"):
        return exp.Anonymous(this="toFloat64", expressions=[exp.Literal.string(t.replace("infinity", "inf"))])
    if not re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?", t):
        raise _Bad
    v = float(t)
    lit = exp.Literal.number(repr(abs(v)))
    return exp.Neg(this=lit) if v < 0 or t.startswith("-") else lit


def _scalar(text: str, dtype: exp.DataType) -> exp.Expression:
    """``text`` as a literal of ``dtype`` (a sqlglot node), or _Bad."""
    t = dtype.this
    if dtype.args.get("nullable"):
        if text == "\\N" or text.upper() == "NULL":
            return exp.cast(exp.Null(), _type_sql(dtype), dialect="clickhouse")
        inner = dtype.copy()
        inner.set("nullable", False)
        return _scalar(text, inner)
    if t == exp.DataType.Type.LOWCARDINALITY:
        return _scalar(text, dtype.expressions[0])
    if t in _INT_BITS:
        return _integer(text, _INT_BITS[t], True)
    if t in _UINT_BITS:
        return _integer(text, _UINT_BITS[t], False)
    if t in _FLOATS:
        return _float(text)
    if t == exp.DataType.Type.BOOLEAN:
        v = text.strip().lower()
        if v not in ("true", "false", "1", "0"):
            raise _Bad
        return exp.Boolean(this=v in ("true", "1"))
    if t in _STRINGS or t == exp.DataType.Type.FIXEDSTRING:
        s = _unescape(text)
        if t == exp.DataType.Type.FIXEDSTRING and dtype.expressions:
            if len(s.encode("utf-8")) > int(dtype.expressions[0].this.this):
                raise _Bad
            return exp.cast(exp.Literal.string(s), _type_sql(dtype), dialect="clickhouse")
        return exp.Literal.string(s)
    if t in (exp.DataType.Type.DECIMAL, exp.DataType.Type.DECIMAL32, exp.DataType.Type.DECIMAL64,
             exp.DataType.Type.DECIMAL128, exp.DataType.Type.DECIMAL256):
        try:
            d = Decimal(text.strip())
        except InvalidOperation:
            raise _Bad from None
        if not d.is_finite():
            raise _Bad
        return exp.cast(exp.Literal.string(str(d)), _type_sql(dtype), dialect="clickhouse")
    if t in _DATES:
        try:
            dt.date.fromisoformat(text.strip())
        except ValueError:
            raise _Bad from None
        return exp.cast(exp.Literal.string(text.strip()), _type_sql(dtype), dialect="clickhouse")
    if t in _DATETIMES:
        v = text.strip()
        if not re.fullmatch(r"\d{1,10}", v):
            try:
                dt.datetime.fromisoformat(v)
            except ValueError:
                raise _Bad from None
            if not re.fullmatch(r"\d{4}-\d{2}-\d{2}([ T]\d{2}:\d{2}:\d{2}(\.\d{1,9})?)?", v):
                raise _Bad
        return exp.cast(exp.Literal.string(v), _type_sql(dtype), dialect="clickhouse")
    if t == exp.DataType.Type.UUID:
        try:
            v = str(uuid.UUID(text.strip()))
        except ValueError:
            raise _Bad from None
        return exp.cast(exp.Literal.string(v), "UUID", dialect="clickhouse")
    raise _Unsupported


class _Unsupported(Exception):
    pass


def _array_items(text: str, dtype: exp.DataType) -> list[exp.Expression]:
    """``[v1, v2, …]`` (ClickHouse's quoted form inside arrays) as literals of the element type."""
    elem = dtype.expressions[0]
    try:
        node = sqlglot.parse_one(text, read="clickhouse")
    except (sqlglot.errors.ParseError, sqlglot.errors.TokenError, ValueError, RecursionError):
        raise _Bad from None
    if not isinstance(node, exp.Array):
        raise _Bad
    items = []
    for v in node.expressions:
        neg = isinstance(v, exp.Neg)
        lit = v.this if neg else v
        if isinstance(lit, exp.Null):
            items.append(_scalar("\\N", elem))
        elif isinstance(lit, exp.Literal) and lit.is_string and not neg:
            # inside an array, strings are quoted literals, already read by the parser
            items.append(exp.Literal.string(lit.this) if elem.this in _STRINGS else _scalar(lit.this, elem))
        elif isinstance(lit, exp.Literal):
            items.append(_scalar(("-" if neg else "") + lit.this, elem))
        elif isinstance(lit, exp.Boolean):
            items.append(_scalar("true" if lit.this else "false", elem))
        else:
            raise _Bad
    return items


def bind_params(tree: exp.Expression, values: dict[str, str]) -> exp.Expression:
    """Replace every ``{name:Type}`` placeholder of ``tree`` by the value of parameter ``name``
    parsed as a literal of ``Type`` (a new tree; ``tree`` is not changed). Raises GatewayError
    456/457 before anything runs or is charged."""
    if not any(isinstance(n, exp.Placeholder) and n.args.get("kind") is not None for n in tree.walk()):
        return tree
    tree = tree.copy()
    for ph in [n for n in tree.walk() if isinstance(n, exp.Placeholder) and n.args.get("kind") is not None]:
        name = ph.name
        kind = ph.args["kind"]
        if name not in values:
            raise GatewayError(UNKNOWN_QUERY_PARAMETER, f"Substitution `{name[:64]}` is not set")
        text = values[name]
        type_name = kind if isinstance(kind, str) else _type_sql(kind)
        try:
            if isinstance(kind, str):  # sqlglot reads {t:Identifier} with the kind as text
                if kind.lower() != "identifier":
                    raise _Unsupported
                _bind_identifier(ph, text.strip())
                continue
            if kind.this == exp.DataType.Type.ARRAY:
                items = _array_items(text, kind)
                parent = ph.parent
                if isinstance(parent, exp.In) and parent.args.get("field") is ph:  # x IN {a:Array(T)}
                    parent.set("field", None)
                    parent.set("expressions", items)
                else:
                    ph.replace(exp.Array(expressions=items))
                continue
            ph.replace(_scalar(text, kind))
        except _Bad:
            raise GatewayError(BAD_QUERY_PARAMETER, f"the value of query parameter '{name[:64]}' cannot be parsed "
                               f"as {type_name[:64]}") from None
        except _Unsupported:
            raise GatewayError(BAD_QUERY_PARAMETER, f"query parameter '{name[:64]}' has type {type_name[:64]}, which "
                               "the gateway does not bind; use a number, string, Bool, Date, DateTime, Decimal, "
                               "UUID, Nullable, LowCardinality or Array type, or Identifier") from None
    return tree


def _bind_identifier(ph: exp.Placeholder, text: str) -> None:
    if not _IDENTIFIER.fullmatch(text):
        raise _Bad
    parts = text.split(".")
    parent = ph.parent
    if isinstance(parent, exp.Table) and parent.this is ph:
        parent.set("this", exp.to_identifier(parts[-1]))
        if len(parts) == 2:
            parent.set("db", exp.to_identifier(parts[0]))
        return
    ph.replace(exp.column(parts[-1], table=parts[0] if len(parts) == 2 else None))
