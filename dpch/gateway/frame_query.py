"""A small SELECT evaluator over a pandas DataFrame of values that are already public: the
gateway's virtual system tables (dpch.gateway.metadata) and the released rows of a DP answer
(dpch.gateway.postprocess_wrapper). Nothing here reaches the engine, so no engine function can run.

Why pandas and not the engine over a temporary table: the engine worker holds the private tables,
runs every statement read-only, and a table built from released values would have to be written
there (a write path the gateway otherwise never needs). Evaluating here sees the released frame
and nothing else, by construction: the only input is the DataFrame.

Accepted: ``SELECT [DISTINCT] item, … [WHERE] [ORDER BY] [LIMIT [OFFSET]]`` where an item is ``*``,
``t.*``, a column (optionally qualified by the source's name or alias) or an expression built from
columns, literals, NULL, arithmetic, comparisons, ``AND OR NOT``, ``IS [NOT] NULL``, ``IN (list)``,
``[NOT] LIKE/ILIKE``, ``CASE``/``if``/``multiIf``, ``coalesce``/``ifNull`` and the few string and
number functions of ``FUNCTIONS``. An unknown column is ClickHouse's 47 UNKNOWN_IDENTIFIER.

Bounded cost (issue 27): at most ``MAX_METADATA_WHERE_NODES + MAX_RESULT_COLUMNS`` expression nodes per query, LIKE as a
linear-scan wildcard match with a per-query work cap, at most ``MAX_RESULT_COLUMNS`` columns and
``MAX_RESULT_CELLS`` cells; a larger request is refused before it is computed.
"""
from __future__ import annotations

import operator
import re
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pandas as pd
from sqlglot import exp

from .errors import ACCESS_DENIED, GatewayError
from .limits import (MAX_LIKE_PATTERN, MAX_LIKE_WORK, MAX_METADATA_WHERE_NODES, MAX_RESULT_CELLS,
                     MAX_RESULT_COLUMNS)

UNKNOWN_IDENTIFIER = (47, "UNKNOWN_IDENTIFIER", 404)
ILLEGAL_TYPE_OF_ARGUMENT = (43, "ILLEGAL_TYPE_OF_ARGUMENT", 400)


@dataclass
class Frame:
    """The rows a query reads: ``df``, the names a column may be qualified with (``names``), what
    it is in messages (``what``), and ``scalar``: the value of a server function (metadata only;
    raises KeyError for any other name)."""

    df: pd.DataFrame
    names: set[str]
    what: str
    scalar: Callable[[str], object] | None = None
    like_work: int = 0  # character comparisons spent on LIKE by this query (capped: MAX_LIKE_WORK)
    extra: dict = field(default_factory=dict)  # SELECT aliases, visible to WHERE and ORDER BY


def deny(what: str, frame_what: str):
    raise GatewayError(ACCESS_DENIED, f"{what} is not supported in queries on {frame_what}")


def too_many_columns(n: int) -> None:
    if n > MAX_RESULT_COLUMNS:
        raise GatewayError(ACCESS_DENIED, f"too many columns ({n}); the gateway answers at most {MAX_RESULT_COLUMNS} "
                           "columns without a table or from its system tables")


def number(text: str) -> int | float:
    """A numeric literal: an integer if it is one Python converts (at most 4 300 digits), else a
    float, as ClickHouse reads integers too long for its types as Float64."""
    if re.fullmatch(r"\d+", text):
        try:
            return int(text)
        except ValueError:
            pass
    try:
        return float(text)
    except ValueError:  # 0x1F and the like
        return float(int(text, 0)) if re.fullmatch(r"0[xXbB][0-9a-fA-F]+", text) else float("nan")


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


def like_series(values: pd.Series, pattern: str, ignore_case: bool = False, ctx=None) -> pd.Series:
    """LIKE (ILIKE) over a column; NULL never matches. The comparisons a query may spend on LIKE
    are capped (``MAX_LIKE_WORK``, counted in ``ctx.like_work``): a value of n characters costs at
    most n·w, w the sum over the non-empty segments of their length if they hold ``_`` (a search
    with comparisons at each position), else 1 (``str.find``); checked before the column is scanned."""
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


# ------------------------------------------------------------------------------------------------
# expressions: a value is a scalar or a Series aligned with the frame's index
# ------------------------------------------------------------------------------------------------

def _map(fn, *args):
    """Apply a scalar function elementwise over the Series among ``args`` (scalars broadcast)."""
    series = [a for a in args if isinstance(a, pd.Series)]
    if not series:
        return fn(*args)
    idx = series[0].index
    cols = [a.tolist() if isinstance(a, pd.Series) else [a] * len(idx) for a in args]
    return pd.Series([fn(*row) for row in zip(*cols)], index=idx, dtype=object)


def _null(v) -> bool:
    return v is None or (isinstance(v, float) and np.isnan(v)) or v is pd.NA


def _str(v):
    if _null(v):
        return None
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def _to_int(v):
    return None if _null(v) else int(float(v))


def _to_float(v):
    return None if _null(v) else float(v)


def _concat(*vs):
    return None if any(_null(v) for v in vs) else "".join(_str(v) for v in vs)


# scalar functions the evaluator computes (lower-case ClickHouse names); each is total over the
# values of a released or catalogue column (NULL in, NULL out)
FUNCTIONS: dict[str, Callable] = {
    "lower": lambda s: _map(lambda v: None if _null(v) else str(v).lower(), s),
    "upper": lambda s: _map(lambda v: None if _null(v) else str(v).upper(), s),
    "length": lambda s: _map(lambda v: None if _null(v) else len(str(v)), s),
    "empty": lambda s: _map(lambda v: (not _null(v)) and len(str(v)) == 0, s),
    "notempty": lambda s: _map(lambda v: (not _null(v)) and len(str(v)) > 0, s),
    "tostring": lambda s: _map(_str, s),
    "toint64": lambda s: _map(_to_int, s),
    "toint32": lambda s: _map(_to_int, s),
    "touint64": lambda s: _map(_to_int, s),
    "touint8": lambda s: _map(_to_int, s),
    "tofloat64": lambda s: _map(_to_float, s),
    "abs": lambda s: _map(lambda v: None if _null(v) else abs(v), s),
    "round": lambda s, d=0: _map(lambda v, k: None if _null(v) else round(float(v), int(k)), s, d),
    "concat": lambda *s: _map(_concat, *s),
    "startswith": lambda s, p: _map(lambda v, q: None if _null(v) else str(v).startswith(str(q)), s, p),
    "endswith": lambda s, p: _map(lambda v, q: None if _null(v) else str(v).endswith(str(q)), s, p),
}
_NODE_FUNCS = {exp.Lower: "lower", exp.Upper: "upper", exp.Length: "length", exp.Abs: "abs", exp.Round: "round",
               exp.Concat: "concat", exp.StartsWith: "startswith"}
_CMP = {exp.EQ: operator.eq, exp.NEQ: operator.ne, exp.LT: operator.lt, exp.LTE: operator.le,
        exp.GT: operator.gt, exp.GTE: operator.ge}
_ARITH = {exp.Add: operator.add, exp.Sub: operator.sub, exp.Mul: operator.mul, exp.Div: operator.truediv,
          exp.Mod: operator.mod}


def _bool(v, frame: Frame) -> pd.Series:
    if isinstance(v, pd.Series):
        return v.map(lambda x: False if _null(x) else bool(x)).astype(bool)
    return pd.Series([False if _null(v) else bool(v)] * len(frame.df), index=frame.df.index, dtype=bool)


def _column(node: exp.Column, frame: Frame):
    table = node.table
    if table and table not in frame.names:
        raise GatewayError(UNKNOWN_IDENTIFIER, f"Unknown expression identifier `{table}.{node.name}`: the query reads "
                           f"{frame.what} only")
    name = node.name
    if name in frame.extra:
        return frame.extra[name]
    if name in frame.df.columns:
        return frame.df[name]
    known = ", ".join(map(str, list(frame.df.columns)[:60]))
    raise GatewayError(UNKNOWN_IDENTIFIER, f"Unknown expression identifier `{name[:64]}` in {frame.what}; "
                       f"its columns are: {known}")


def _call_name(node: exp.Expression) -> str | None:
    if isinstance(node, exp.Anonymous):
        return str(node.this).lower()
    return _NODE_FUNCS.get(type(node))


def evaluate(node: exp.Expression, frame: Frame):
    """The value of ``node`` over ``frame``: a scalar or a Series."""
    if isinstance(node, (exp.Paren, exp.Alias)):
        return evaluate(node.this, frame)
    if isinstance(node, exp.Column):
        if isinstance(node.this, exp.Star):
            deny("* inside an expression", frame.what)
        return _column(node, frame)
    if isinstance(node, exp.Literal):
        return node.this if node.is_string else number(node.this)
    if isinstance(node, exp.Null):
        return None
    if isinstance(node, exp.Boolean):
        return bool(node.this)
    if isinstance(node, exp.Neg):
        v = evaluate(node.this, frame)
        return _map(lambda x: None if _null(x) else -x, v)
    if isinstance(node, (exp.And, exp.Or)):
        a, b = _bool(evaluate(node.this, frame), frame), _bool(evaluate(node.expression, frame), frame)
        return (a & b) if isinstance(node, exp.And) else (a | b)
    if isinstance(node, exp.Not):
        return ~_bool(evaluate(node.this, frame), frame)
    for cls, fn in _CMP.items():
        if isinstance(node, cls):
            return _map(lambda x, y: False if _null(x) or _null(y) else fn(x, y),
                        evaluate(node.this, frame), evaluate(node.expression, frame))
    for cls, fn in _ARITH.items():
        if isinstance(node, cls):
            return _map(lambda x, y: None if _null(x) or _null(y) or (fn in (operator.truediv, operator.mod) and y == 0)
                        else fn(x, y), evaluate(node.this, frame), evaluate(node.expression, frame))
    if isinstance(node, exp.Is):
        v = evaluate(node.this, frame)
        if not isinstance(node.expression, exp.Null):
            deny("IS other than IS [NOT] NULL", frame.what)
        return _map(_null, v)
    if isinstance(node, exp.In):
        if node.args.get("query") or node.args.get("field") or node.args.get("unnest"):
            deny("IN other than a literal list", frame.what)
        a = evaluate(node.this, frame)
        vals = [evaluate(v, frame) for v in node.expressions]
        if any(isinstance(v, pd.Series) for v in vals):
            deny("IN with columns in the list", frame.what)
        as_text = {_str(v) for v in vals}
        return _map(lambda x: (not _null(x)) and (x in vals or _str(x) in as_text), a)
    if isinstance(node, (exp.Like, exp.ILike)):
        a, pat = evaluate(node.this, frame), evaluate(node.expression, frame)
        if not isinstance(pat, str):
            deny("LIKE with a pattern that is not a string literal", frame.what)
        if not isinstance(a, pd.Series):
            a = pd.Series([a] * len(frame.df), index=frame.df.index, dtype=object)
        return like_series(a, pat, ignore_case=isinstance(node, exp.ILike), ctx=frame)
    if isinstance(node, exp.Case):
        return _case([(w.this, w.args["true"]) for w in node.args.get("ifs") or []], node.args.get("default"), frame)
    if isinstance(node, exp.If):
        return _case([(node.this, node.args["true"])], node.args.get("false"), frame)
    if isinstance(node, (exp.Coalesce,)):
        return _coalesce([node.this, *node.expressions], frame)
    name = _call_name(node)
    if name == "ifnull" or name == "coalesce":
        return _coalesce(node.expressions, frame)
    if name == "multiif":
        args = node.expressions
        return _case(list(zip(args[:-1:2], args[1:-1:2])), args[-1] if len(args) % 2 else None, frame)
    if name is not None and frame.scalar is not None:
        try:
            if not (isinstance(node, exp.Anonymous) and node.expressions):
                return frame.scalar(name)
        except KeyError:
            pass
    if name in FUNCTIONS:
        args = [evaluate(a, frame) for a in _call_args(node)]
        return FUNCTIONS[name](*args)
    if frame.scalar is not None:  # metadata: version(), currentDatabase() … parsed as their own classes
        try:
            return frame.scalar(type(node).__name__)
        except KeyError:
            pass
    deny(f"the expression {node.sql('clickhouse')[:60]!r}", frame.what)


def _call_args(node: exp.Expression) -> list[exp.Expression]:
    """The arguments of a function node in order (sqlglot keeps them in ``this``, ``expression``,
    ``expressions`` or named slots such as Round's ``decimals``)."""
    out: list[exp.Expression] = []
    for v in node.args.values():
        if isinstance(v, exp.Expression):
            out.append(v)
        elif isinstance(v, list):
            out.extend(a for a in v if isinstance(a, exp.Expression))
    return out


def _case(branches, default, frame: Frame):
    n = len(frame.df)
    out = pd.Series([None] * n, index=frame.df.index, dtype=object)
    done = pd.Series([False] * n, index=frame.df.index, dtype=bool)
    for cond, value in branches:
        hit = _bool(evaluate(cond, frame), frame) & ~done
        v = evaluate(value, frame)
        out[hit] = v[hit] if isinstance(v, pd.Series) else v
        done |= hit
    if default is not None:
        v = evaluate(default, frame)
        out[~done] = v[~done] if isinstance(v, pd.Series) else v
    return out


def _coalesce(args, frame: Frame):
    return _map(lambda *vs: next((v for v in vs if not _null(v)), None), *[evaluate(a, frame) for a in args])


# ------------------------------------------------------------------------------------------------
# SELECT
# ------------------------------------------------------------------------------------------------

ALLOWED_CLAUSES = {"expressions", "kind", "hint", "distinct", "limit", "offset", "exclude", "operation_modifiers",
                   "from_", "where", "order"}


def _label(node: exp.Expression) -> str:
    if isinstance(node, exp.Alias):
        return node.alias
    if isinstance(node, exp.Column):
        return node.name
    return node.sql("clickhouse")


def _broadcast(v, frame: Frame) -> pd.Series:
    """A Series over the frame; computed (object) columns get the dtype their values have, so the
    renderer gives them a numeric or Bool type rather than String."""
    if not isinstance(v, pd.Series):
        v = pd.Series([v] * len(frame.df), index=frame.df.index, dtype=object)
    return v.infer_objects() if v.dtype == object else v


def _int_literal(node, what: str, frame: Frame) -> int:
    if not (isinstance(node, exp.Literal) and not node.is_string and node.this.isdigit()):
        deny(f"a {what} other than a non-negative integer literal", frame.what)
    return int(node.this)


def select(tree: exp.Select, frame: Frame) -> pd.DataFrame:
    """Answer ``tree`` (its FROM already resolved to ``frame``) over ``frame.df`` only."""
    for key, value in tree.args.items():
        if key not in ALLOWED_CLAUSES and value:
            deny(key.upper().rstrip("_"), frame.what)
    too_many_columns(len(tree.expressions))
    # each node costs one pass over the rows; a SELECT list of MAX_RESULT_COLUMNS columns stays under the cap
    cap = MAX_METADATA_WHERE_NODES + MAX_RESULT_COLUMNS
    nodes = sum(1 for n in tree.walk() if not isinstance(n, exp.Identifier)) - \
        sum(1 for n in tree.args["from_"].walk() if not isinstance(n, exp.Identifier))
    if nodes > cap:
        deny(f"a query of more than {cap} expression nodes", frame.what)
    out: dict[str, pd.Series] = {}
    try:
        for item in tree.expressions:
            inner = item.this if isinstance(item, exp.Alias) else item
            if isinstance(inner, exp.Star) or (isinstance(inner, exp.Column) and isinstance(inner.this, exp.Star)):
                if isinstance(inner, exp.Column) and inner.table and inner.table not in frame.names:
                    raise GatewayError(UNKNOWN_IDENTIFIER, f"Unknown table expression identifier `{inner.table}`")
                if inner.args.get("except_") or inner.args.get("replace") or inner.args.get("rename"):
                    deny("* EXCEPT/REPLACE", frame.what)
                for c in frame.df.columns:
                    out[c] = frame.df[c]
                continue
            out[_label(item)] = _broadcast(evaluate(inner, frame), frame)
        too_many_columns(len(out))
        frame.extra = {k: v for k, v in out.items() if k not in frame.df.columns or k in _aliases(tree)}
        result = pd.DataFrame(out, index=frame.df.index) if out else pd.DataFrame(index=frame.df.index)
        where = tree.args.get("where")
        if where is not None:
            mask = _bool(evaluate(where.this, frame), frame)
            result = result[mask.values]
        order = tree.args.get("order")
        if order is not None and len(result):
            result = _order(result, order, frame)
    except RecursionError:
        deny("an expression nested this deeply", frame.what)
    except (TypeError, ValueError, OverflowError, ArithmeticError):
        raise GatewayError(ILLEGAL_TYPE_OF_ARGUMENT, f"an expression of the query cannot be computed over {frame.what} "
                           "(mixed types?)") from None
    if tree.args.get("distinct"):
        result = result.drop_duplicates()
    offset = tree.args.get("offset")
    limit = tree.args.get("limit")
    start = _int_literal(offset.expression, "OFFSET", frame) if offset is not None else 0
    if limit is not None:
        result = result.iloc[start:start + _int_literal(limit.expression, "LIMIT", frame)]
    elif start:
        result = result.iloc[start:]
    if len(result.columns) * len(result) > MAX_RESULT_CELLS:
        deny(f"an answer of more than {MAX_RESULT_CELLS} cells (add LIMIT)", frame.what)
    return result.reset_index(drop=True)


def _aliases(tree: exp.Select) -> set[str]:
    return {i.alias for i in tree.expressions if isinstance(i, exp.Alias)}


def _order(result: pd.DataFrame, order: exp.Order, frame: Frame) -> pd.DataFrame:
    keys, asc, nulls_first = [], [], []
    cols = list(result.columns)
    for o in order.expressions:
        node = o.this
        if isinstance(node, exp.Literal) and not node.is_string and node.this.isdigit():
            pos = int(node.this)
            if not 1 <= pos <= len(cols):
                deny(f"ORDER BY position {pos} (the answer has {len(cols)} columns)", frame.what)
            v = result[cols[pos - 1]]
        else:
            v = _broadcast(evaluate(node, frame), frame).loc[result.index]
        keys.append(v)
        asc.append(not o.args.get("desc"))
        nulls_first.append(bool(o.args.get("nulls_first")))
    tmp = pd.DataFrame({f"k{i}": k.values for i, k in enumerate(keys)}, index=result.index)
    # one stable sort per key, last key first: NULLs placed per key as asked
    idx = tmp.index
    for i in reversed(range(len(keys))):
        col = tmp.loc[idx, f"k{i}"]
        srt = col.sort_values(ascending=asc[i], kind="stable", na_position="first" if nulls_first[i] else "last",
                              key=lambda s: s.map(_sort_key))
        idx = srt.index
    return result.loc[idx]


def _sort_key(v):
    return v if not isinstance(v, bool) else int(v)
