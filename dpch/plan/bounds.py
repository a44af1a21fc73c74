"""Per-row bounds of an aggregate's argument by interval arithmetic over the catalog's column bounds
(the paper, Remark 1: a Lipschitz/monotone map of a bounded value is bounded), with the clipped
SQL that makes the bound hold by construction. Used by dpch.plan.planner; a stage of its own because
it is the one place that turns an expression into a sensitivity.

The bounding rules are a table, ``_RULES``, from node kind to rule: one small function per kind of
expression. A kind is a sqlglot expression class (a node takes the rule of the nearest class on its
class hierarchy, as ``isinstance`` would) or, for a function sqlglot does not parse
(``exp.Anonymous``), its lower-cased name; a function that comes both ways (``sqrt`` as ``exp.Sqrt``
and as an anonymous call) has both kinds registered to the same rule. A rule gets the bounder (to
bound its operands, note that the value may be NULL and name the aggregate in messages) and the
node, and returns (interval, or None when the value is always NULL; clipped SQL). A node that no
rule covers is rejected."""
from __future__ import annotations

import math
import operator
from types import MappingProxyType
from typing import Any, Callable, Mapping

from sqlglot import exp

from ..bind import func_name, sql_of
from ..catalog import (TableEntry, base_type, date_kind, is_integer_type, is_nullable, is_string_type,
                       length_bound_key, quote_ident)
from ..errors import QueryRejected

# Implicit bounds from small integer types (documented in docs/CONTROLLER.md).
_TYPE_BOUNDS = {"Bool": (0.0, 1.0), "UInt8": (0.0, 255.0), "Int8": (-128.0, 127.0),
                "UInt16": (0.0, 65535.0), "Int16": (-32768.0, 32767.0)}
_INT_RANGES = {"Int8": (-2 ** 7, 2 ** 7 - 1), "Int16": (-2 ** 15, 2 ** 15 - 1), "Int32": (-2 ** 31, 2 ** 31 - 1),
               "Int64": (-2 ** 63, 2 ** 63 - 1), "UInt8": (0, 2 ** 8 - 1), "UInt16": (0, 2 ** 16 - 1),
               "UInt32": (0, 2 ** 32 - 1), "UInt64": (0, 2 ** 64 - 1)}

_BOOLEAN_NODES = tuple(c for c in (getattr(exp, n, None) for n in (
    "EQ NEQ GT GTE LT LTE NullSafeEQ NullSafeNEQ And Or Xor Not Like ILike RegexpLike RegexpILike In Between Is "
    "StartsWith EndsWith ArrayContains ArrayContainsAll ArrayOverlaps IsNan IsInf").split()) if c is not None)
_BOOLEAN_FUNCS = {"equals", "notequals", "less", "greater", "lessorequals", "greaterorequals", "and", "or", "not",
                  "xor", "in", "notin", "has", "hasany", "hasall", "empty", "notempty", "like", "notlike", "ilike",
                  "notilike", "match", "startswith", "endswith", "isnull", "isnotnull", "isfinite", "isinfinite",
                  "isnan"}
_IDENTITY_CASTS = {"tofloat64", "tofloat32", "todecimal32", "todecimal64", "todecimal128"}
_WIDE_INTS = {"Int64", "UInt64", "Int128", "UInt128", "Int256", "UInt256"}
_INT_CASTS = {"toint8": "Int8", "toint16": "Int16", "toint32": "Int32", "toint64": "Int64", "touint8": "UInt8",
              "touint16": "UInt16", "touint32": "UInt32", "touint64": "UInt64"}

Interval = tuple[float, float]
Bounded = tuple[Interval | None, str]  # (interval, None when always NULL; clipped SQL)


def float_literal(x: float) -> str:
    """A float literal that parses back exactly (negative values parenthesised)."""
    s = repr(float(x))
    if s in ("inf", "-inf", "nan"):
        raise QueryRejected("a bound is not finite")
    return f"({s})" if s.startswith("-") else s


def clamp_sql(x: str, lo: str, hi: str) -> str:
    """``x`` clipped to [lo, hi], a NULL ``x`` staying NULL (so that AVG, COUNT(x), quantiles and
    MIN/MAX skip it, as SQL does). Not ``least(greatest(x, lo), hi)``: since ClickHouse 24.12
    least/greatest ignore NULL arguments (``greatest(NULL, 0) = 0`` on chDB 26.9; the old behaviour
    is the setting ``least_greatest_legacy_null_behavior``), which counted every NULL as the lower
    bound. A comparison with NULL is NULL and ``if`` takes a NULL condition as false, so NULL reaches
    the last branch. Written into the expression, not a setting, so that per-unit projections and
    materialized views, computed under their inserting session's settings, hold the same values."""
    return f"if({x} < {lo}, {lo}, if({x} > {hi}, {hi}, {x}))"


def clip_float_sql(s: str, lo: float, hi: float) -> str:
    """``s`` as Float64 clipped to [lo, hi], NaN mapped to lo, NULL kept NULL (``clamp_sql``)."""
    return (f"if(isNaN(toFloat64({s})), {float_literal(lo)}, "
            f"{clamp_sql(f'toFloat64({s})', float_literal(lo), float_literal(hi))})")


def _hull(*ivs: Interval | None) -> Interval | None:
    ivs2 = [i for i in ivs if i is not None]
    if not ivs2:
        return None
    return (min(i[0] for i in ivs2), max(i[1] for i in ivs2))


def _finite(iv: Interval, what: str) -> Interval:
    if not (math.isfinite(iv[0]) and math.isfinite(iv[1])):
        raise QueryRejected(f"the bounds of {what} overflow: narrow the column bounds")
    return iv


def _span(a: Interval, b: Interval, op: Callable[[float, float], float]) -> Interval:
    """The smallest and largest of ``op`` over the corners of a × b."""
    c = [op(a[0], b[0]), op(a[0], b[1]), op(a[1], b[0]), op(a[1], b[1])]
    return (min(c), max(c))


class _Bounder:
    """Computes (interval, clipped SQL) for an expression in value position."""

    def __init__(self, entry: TableEntry, agg_text: str):
        self.entry = entry
        self.agg_text = agg_text
        self.nullable = False

    def column_bounds(self, name: str) -> Interval:
        typ = self.entry.columns.get(name, "")
        if is_nullable(typ):
            self.nullable = True
        if name in self.entry.bounds:
            return self.entry.bounds[name]
        implied = _TYPE_BOUNDS.get(base_type(typ))
        if implied is not None:
            return implied
        raise QueryRejected(f"{self.agg_text} needs bounds on column {name!r}: declare them in the catalog, e.g. "
                            f"db.catalog.update({self.entry.table!r}, bounds={{{name!r}: (lo, hi)}})")

    def reject(self, what: str) -> QueryRejected:
        """The rejection ``<aggregate>: <what>``."""
        return QueryRejected(f"{self.agg_text}: {what}")

    def visit(self, n: exp.Expression) -> Bounded:
        rule = _rule_for(n)
        if rule is None:
            raise self.reject(f"cannot bound {sql_of(n)[:80]} inside an aggregate; supported inside "
                              "aggregates: bounded columns, constants, + - * /, abs, least/greatest, pow, sqrt, "
                              "exp/log, rounding, numeric casts, if/CASE/multiIf, coalesce and comparisons")
        return rule(self, n)


Rule = Callable[[_Bounder, Any], Bounded]


# -- operands of a rule's node: a sqlglot node's own fields, or an anonymous call's arguments ---------

def _operand(n: exp.Expression) -> exp.Expression:
    return n.expressions[0] if isinstance(n, exp.Anonymous) else n.this


def _operands(n: exp.Expression) -> tuple[exp.Expression, ...]:
    return tuple(n.expressions[:2]) if isinstance(n, exp.Anonymous) else (n.this, n.expression)


def _arguments(n: exp.Expression) -> list[exp.Expression]:
    return list(n.expressions) if isinstance(n, exp.Anonymous) else [n.this] + list(n.expressions)


# -- the rules ------------------------------------------------------------------------------------

def _paren(b: _Bounder, n: exp.Paren) -> Bounded:
    iv, s = b.visit(n.this)
    return iv, f"({s})"


def _column(b: _Bounder, n: exp.Column) -> Bounded:
    lo, hi = b.column_bounds(n.name)
    col = quote_ident(n.name)
    typ = base_type(b.entry.columns.get(n.name, ""))
    if date_kind(typ) is not None:  # Date/DateTime as its number: days / seconds since the epoch
        return (lo, hi), clamp_sql(f"toFloat64(toInt64({col}))", float_literal(lo), float_literal(hi))
    if is_integer_type(typ) and typ not in _WIDE_INTS:
        return (lo, hi), clamp_sql(col, float_literal(lo), float_literal(hi))
    if is_integer_type(typ):  # no common type of Int64/UInt64 and Float64: clip in Float64
        return (lo, hi), clamp_sql(f"toFloat64({col})", float_literal(lo), float_literal(hi))
    return (lo, hi), clip_float_sql(col, lo, hi)


def _literal(b: _Bounder, n: exp.Literal) -> Bounded:
    if n.is_string:
        raise b.reject("a string literal cannot be summed or averaged")
    v = float(n.this)
    return (v, v), float_literal(v)


def _boolean(b: _Bounder, n: exp.Boolean) -> Bounded:
    v = 1.0 if n.this else 0.0
    return (v, v), float_literal(v)


def _null(b: _Bounder, n: exp.Null) -> Bounded:
    b.nullable = True
    return None, "NULL"


def _neg(b: _Bounder, n: exp.Neg) -> Bounded:
    iv, s = b.visit(n.this)
    return (None if iv is None else (-iv[1], -iv[0])), f"(-{s})"


def _arithmetic(b: _Bounder, n: exp.Binary, op: str, interval: Callable[[Interval, Interval], Interval]) -> Bounded:
    """``x op y``: NULL when either side is always NULL, else the interval of the two intervals."""
    x, sx = b.visit(n.this)
    y, sy = b.visit(n.expression)
    if x is None or y is None:
        b.nullable = True
        return None, "NULL"
    return _finite(interval(x, y), b.agg_text), f"({sx} {op} {sy})"


def _add(b: _Bounder, n: exp.Add) -> Bounded:
    return _arithmetic(b, n, "+", lambda x, y: (x[0] + y[0], x[1] + y[1]))


def _sub(b: _Bounder, n: exp.Sub) -> Bounded:
    return _arithmetic(b, n, "-", lambda x, y: (x[0] - y[1], x[1] - y[0]))


def _mul(b: _Bounder, n: exp.Mul) -> Bounded:
    return _arithmetic(b, n, "*", lambda x, y: _span(x, y, operator.mul))


def _div(b: _Bounder, n: exp.Div) -> Bounded:
    def quotient(x: Interval, y: Interval) -> Interval:
        if y[0] <= 0.0 <= y[1]:
            raise b.reject(f"division by {sql_of(n.expression)}, whose bounds include 0, has unbounded "
                           "sensitivity; divide by a constant or a value bounded away from 0")
        return _span(x, y, operator.truediv)

    return _arithmetic(b, n, "/", quotient)


def _integer_division(b: _Bounder, n: exp.Expression, function: str, what: str,
                      interval: Callable[[Interval, Interval], Interval]) -> Bounded:
    """intDiv / modulo, written as their total forms ``function``: NULL when either side is always
    NULL, rejected when the divisor's bounds include 0."""
    x, y = _operands(n)
    a, sa = b.visit(x)
    c, sc = b.visit(y)
    if a is None or c is None:
        return None, "NULL"
    if c[0] <= 0.0 <= c[1]:
        raise b.reject(f"{what} by a value whose bounds include 0")
    return interval(a, c), f"{function}({sa}, {sc})"


def _int_div_interval(a: Interval, c: Interval) -> Interval:
    lo, hi = _span(a, c, operator.truediv)
    return (math.floor(lo), math.ceil(hi))


def _modulo_interval(a: Interval, c: Interval) -> Interval:
    m = max(abs(c[0]), abs(c[1]))
    return (0.0 if a[0] >= 0 else max(a[0], -m), 0.0 if a[1] <= 0 else min(a[1], m))


def _int_div(b: _Bounder, n: exp.Expression) -> Bounded:
    return _integer_division(b, n, "intDivOrZero", "integer division", _int_div_interval)


def _modulo(b: _Bounder, n: exp.Expression) -> Bounded:
    return _integer_division(b, n, "moduloOrZero", "modulo", _modulo_interval)


def _abs(b: _Bounder, n: exp.Abs) -> Bounded:
    a, sa = b.visit(n.this)
    if a is None:
        return None, "NULL"
    lo = 0.0 if a[0] <= 0.0 <= a[1] else min(abs(a[0]), abs(a[1]))
    return (lo, max(abs(a[0]), abs(a[1]))), f"abs({sa})"


def _extreme(b: _Bounder, n: exp.Expression, name: str, pick: Callable) -> Bounded:
    """least / greatest: ``pick`` (min / max) of the lower and of the upper bounds."""
    parts = [b.visit(a) for a in _arguments(n) if a is not None]
    ivs = [p[0] for p in parts]
    if any(iv is None for iv in ivs):
        b.nullable = True
        return None, "NULL"
    iv = (pick(i[0] for i in ivs), pick(i[1] for i in ivs))  # type: ignore[index]
    call = f"{name}({', '.join(p[1] for p in parts)})"
    if b.nullable:  # NULL if an argument is NULL, as the interval assumes (ClickHouse's ignores it: clamp_sql)
        call = f"if({' OR '.join(f'isNull({p[1]})' for p in parts)}, NULL, {call})"
    return iv, call


def _least(b: _Bounder, n: exp.Expression) -> Bounded:
    return _extreme(b, n, "least", min)


def _greatest(b: _Bounder, n: exp.Expression) -> Bounded:
    return _extreme(b, n, "greatest", max)


def _pow(b: _Bounder, n: exp.Expression) -> Bounded:
    x, y = _operands(n)
    if not isinstance(y, exp.Literal) or y.is_string:
        raise b.reject("pow() needs a constant exponent")
    p = float(y.this)
    if not math.isfinite(p):
        raise b.reject("pow() needs a finite constant exponent")
    a, sa = b.visit(x)
    if a is None:
        return None, "NULL"
    # floats, never Python ints (floor/round/intDiv give int bounds): int ** 1e300 would run forever
    a = (float(a[0]), float(a[1]))
    try:
        return _finite(_pow_interval(b, a, p), b.agg_text), f"pow({sa}, {float_literal(p)})"
    except OverflowError:
        raise b.reject("pow(): the bounds overflow; narrow the column bounds or the exponent") from None


def _pow_interval(b: _Bounder, a: Interval, p: float) -> Interval:
    if p == int(p) and p >= 0:
        pi = int(p)
        if pi % 2 == 0:
            lo = 0.0 if a[0] <= 0.0 <= a[1] else min(abs(a[0]), abs(a[1])) ** pi
            iv = (lo, max(abs(a[0]), abs(a[1])) ** pi)
        else:
            iv = (a[0] ** pi, a[1] ** pi)
    elif a[0] >= 0.0:
        if p > 0:
            iv = (a[0] ** p, a[1] ** p)
        elif a[0] > 0.0:
            iv = (a[1] ** p, a[0] ** p)
        else:
            raise b.reject("pow with a negative exponent of a value whose bounds include 0")
    else:
        raise b.reject("pow with a non-integer exponent needs a non-negative base")
    return iv


def _sqrt(b: _Bounder, n: exp.Expression) -> Bounded:
    a, sa = b.visit(_operand(n))
    if a is None:
        return None, "NULL"
    if a[0] < 0:
        raise b.reject("sqrt of a value whose bounds include negative numbers")
    return (math.sqrt(a[0]), math.sqrt(a[1])), f"sqrt({sa})"


def _cbrt(b: _Bounder, n: exp.Expression) -> Bounded:
    a, sa = b.visit(_operand(n))
    if a is None:
        return None, "NULL"
    cb = lambda v: math.copysign(abs(v) ** (1 / 3), v)  # noqa: E731
    return (cb(a[0]), cb(a[1])), f"cbrt({sa})"


_EXP_BASES = {"exp": math.e, "exp2": 2.0, "exp10": 10.0}


def _exp(b: _Bounder, n: exp.Expression) -> Bounded:
    x = _operand(n)
    fname = "exp" if isinstance(n, exp.Exp) else func_name(n)
    base = _EXP_BASES[fname.lower()]
    a, sa = b.visit(x)
    if a is None:
        return None, "NULL"
    try:
        iv = (base ** a[0], base ** a[1])
    except OverflowError:
        raise QueryRejected(f"the bounds of {b.agg_text} overflow: narrow the column bounds") from None
    return _finite(iv, b.agg_text), f"{fname}({sa})"


_LOGARITHMS = {"log": math.log, "ln": math.log, "log2": math.log2, "log10": math.log10, "log1p": math.log1p}


def _logarithm(b: _Bounder, n: exp.Expression) -> Bounded:
    if isinstance(n, exp.Log) and n.expression is not None:
        raise b.reject("log with a base argument is not supported; use ln/log2/log10")
    x = _operand(n)
    fname = func_name(n).lower() if isinstance(n, exp.Anonymous) else "log"
    a, sa = b.visit(x)
    if a is None:
        return None, "NULL"
    shift = 1.0 if fname == "log1p" else 0.0
    if a[0] + shift <= 0:
        raise b.reject("logarithm of a value whose bounds include non-positive numbers")
    f = _LOGARITHMS[fname]
    return (f(a[0]), f(a[1])), f"{fname}({sa})"


_ROUNDING = {exp.Floor: "floor", exp.Ceil: "ceil", exp.Round: "round"}


def _rounding_digits(b: _Bounder, digits: exp.Expression | None) -> int:
    """The constant number of digits of a rounding function (0 when not given)."""
    if digits is None:
        return 0
    if isinstance(digits, exp.Literal) and not digits.is_string:
        return int(float(digits.this))
    if isinstance(digits, exp.Neg) and isinstance(digits.this, exp.Literal):
        return -int(float(digits.this.this))
    raise b.reject("rounding needs a constant number of digits")


def _rounding(b: _Bounder, n: exp.Expression) -> Bounded:
    if isinstance(n, exp.Anonymous):
        x = n.expressions[0]
        digits = n.expressions[1] if len(n.expressions) > 1 else None
        fname = func_name(n)
    else:
        x = n.this
        digits = n.args.get("decimals") or n.args.get("expression")
        fname = _ROUNDING[type(n)]
    a, sa = b.visit(x)
    if a is None:
        return None, "NULL"
    d = _rounding_digits(b, digits)
    if d >= 0:
        iv = (math.floor(a[0]), math.ceil(a[1]))
    else:
        step = 10.0 ** (-d)
        iv = (math.floor(a[0] / step) * step, math.ceil(a[1] / step) * step)
    extra = f", {d}" if digits is not None else ""
    return iv, f"{fname}({sa}{extra})"


def _sign(b: _Bounder, n: exp.Expression) -> Bounded:
    a, sa = b.visit(_operand(n))
    if a is None:
        return None, "NULL"
    lo = -1.0 if a[0] < 0 else (0.0 if a[0] == 0 else 1.0)
    hi = 1.0 if a[1] > 0 else (0.0 if a[1] == 0 else -1.0)
    return (lo, hi), f"sign({sa})"


def _if(b: _Bounder, n: exp.If) -> Bounded:
    cond = sql_of(n.this)
    t, st = b.visit(n.args["true"])
    f_node = n.args.get("false")
    if f_node is None:
        b.nullable = True
        f, sf = None, "NULL"
    else:
        f, sf = b.visit(f_node)
    return _hull(t, f), f"if({cond}, {st}, {sf})"


def _case(b: _Bounder, n: exp.Case) -> Bounded:
    if n.this is not None:
        raise b.reject("CASE <operand> WHEN ... is not supported inside aggregates; use CASE WHEN <condition> ...")
    parts = []
    ivs = []
    for branch in n.args.get("ifs") or []:
        iv, s = b.visit(branch.args["true"])
        ivs.append(iv)
        parts.append(f"WHEN {sql_of(branch.this)} THEN {s}")
    default = n.args.get("default")
    if default is None:
        b.nullable = True
        ivs.append(None)
        parts.append("ELSE NULL")
    else:
        iv, s = b.visit(default)
        ivs.append(iv)
        parts.append(f"ELSE {s}")
    return _hull(*ivs), f"CASE {' '.join(parts)} END"


def _multi_if(b: _Bounder, n: exp.Anonymous) -> Bounded:
    args = list(n.expressions)
    if len(args) < 3 or len(args) % 2 == 0:
        raise b.reject("multiIf needs condition/value pairs and a default")
    ivs = []
    parts = []
    for i in range(0, len(args) - 1, 2):
        iv, s = b.visit(args[i + 1])
        ivs.append(iv)
        parts.extend([sql_of(args[i]), s])
    iv, s = b.visit(args[-1])
    ivs.append(iv)
    parts.append(s)
    return _hull(*ivs), f"multiIf({', '.join(parts)})"


def _coalesce(b: _Bounder, n: exp.Expression) -> Bounded:
    parts = [b.visit(a) for a in _arguments(n)]
    return _hull(*[p[0] for p in parts]), f"coalesce({', '.join(p[1] for p in parts)})"


def _nullif(b: _Bounder, n: exp.Expression) -> Bounded:
    x, y = (n.expressions[0], n.expressions[1]) if isinstance(n, exp.Anonymous) else (n.this, n.expression)
    iv, s = b.visit(x)
    b.nullable = True
    return iv, f"nullIf({s}, {sql_of(y)})"


def _int_conversion(b: _Bounder, iv: Interval, s: str, bt: str) -> tuple[Interval, str]:
    """The conversion of a value in ``iv`` to the integer type ``bt``: rejected when it may overflow."""
    lo_t, hi_t = _INT_RANGES[bt]
    lo, hi = math.floor(iv[0]) if iv[0] < 0 else math.trunc(iv[0]), math.ceil(iv[1]) if iv[1] < 0 else math.trunc(iv[1])
    lo, hi = min(lo, math.trunc(iv[0])), max(hi, math.trunc(iv[1]))
    if lo < lo_t or hi > hi_t:
        raise b.reject(f"conversion to {bt} may overflow for the declared bounds")
    return (float(lo), float(hi)), f"to{bt}({s})"


def _cast(b: _Bounder, n: exp.Cast) -> Bounded:
    tname = n.args["to"].sql(dialect="clickhouse")
    bt = base_type(tname)
    iv, s = b.visit(n.this)
    if isinstance(n, exp.TryCast):
        b.nullable = True
    if iv is None:
        return None, "NULL"
    if bt.startswith("Float") or bt.startswith("Decimal"):
        return iv, f"CAST({s} AS {tname})"
    if bt in _INT_RANGES:
        return _int_conversion(b, iv, s, bt)
    raise b.reject(f"CAST to {tname} cannot be bounded; cast to a numeric type")


def _accurate_cast_or_null(b: _Bounder, n: exp.Anonymous) -> Bounded:
    # the total conversion of dpch.totality: NULL when the value does not convert
    target = n.expressions[1] if len(n.expressions) > 1 else None
    if not (isinstance(target, exp.Literal) and target.is_string):
        raise b.reject("accurateCastOrNull needs a constant type")
    bt = base_type(target.this)
    iv, s = b.visit(n.expressions[0])
    b.nullable = True
    if iv is None:
        return None, "NULL"
    if bt.startswith("Float"):
        return iv, f"accurateCastOrNull({s}, {sql_of(target)})"
    if bt in _INT_RANGES:
        iv2, _ = _int_conversion(b, iv, s, bt)
        return iv2, f"accurateCastOrNull({s}, {sql_of(target)})"
    raise b.reject(f"a conversion to {target.this} cannot be bounded; convert to a numeric type")


def _identity_cast(b: _Bounder, n: exp.Anonymous) -> Bounded:
    iv, s = b.visit(n.expressions[0])
    return iv, f"{func_name(n)}({s})"


def _int_cast(b: _Bounder, n: exp.Anonymous) -> Bounded:
    iv, s = b.visit(n.expressions[0])
    if iv is None:
        return None, "NULL"
    return _int_conversion(b, iv, s, _INT_CASTS[func_name(n).lower()])


def _length(b: _Bounder, n: exp.Expression) -> Bounded:
    """``length(s)`` (bytes) or ``lengthUTF8(s)``/``char_length(s)`` (code points, never more than
    the bytes) of a String column: the declared bounds ``length(col)`` of the catalog, or N for a
    FixedString(N); clipped to them in SQL, so the bound holds by construction (Remark 1 as for a
    column) whatever the data."""
    arg = _operand(n)
    bytes_ = isinstance(n, exp.Length) and bool(n.args.get("binary"))
    fname = "length" if bytes_ else "lengthUTF8"
    if not isinstance(arg, exp.Column):
        raise b.reject(f"{fname}() is bounded only of a String column (declared bounds 'length(col)')")
    typ = b.entry.columns.get(arg.name, "")
    if not is_string_type(typ):
        raise b.reject(f"{fname}({arg.name}) is bounded only for a String column")
    if is_nullable(typ):
        b.nullable = True
    declared = b.entry.bounds.get(length_bound_key(arg.name))
    bt = base_type(typ)
    if declared is not None:
        lo, hi = declared
    elif bt.startswith("FixedString("):
        lo = hi = float(int(bt[len("FixedString("):-1]))  # exactly N bytes (code points <= N: clipped)
    else:
        raise b.reject(f"cannot bound {fname}({arg.name}): it needs bounds on the length of {arg.name!r}: "
                       f"declare them in the catalog, e.g. db.catalog.update({b.entry.table!r}, "
                       f"bounds={{{length_bound_key(arg.name)!r}: (0, hi)}})")
    # UInt64 has no common type with Float64: convert first (a length is far below 2^53)
    return (lo, hi), clamp_sql(f"toFloat64({fname}({quote_ident(arg.name)}))", float_literal(lo), float_literal(hi))


def _predicate(b: _Bounder, n: exp.Expression) -> Bounded:
    # a predicate: 0 or 1 (NULL when an operand is NULL); may read any registered column
    return (0.0, 1.0), f"toUInt8({sql_of(n)})"


# -- the table ------------------------------------------------------------------------------------

def _table(*rules: tuple[tuple[type[exp.Expression] | str, ...], Rule]) -> Mapping[type[exp.Expression] | str, Rule]:
    table: dict[type[exp.Expression] | str, Rule] = {}
    for kinds, rule in rules:
        for kind in kinds:
            if kind in table:
                raise AssertionError(f"two bounding rules for {kind}")
            table[kind] = rule
    return MappingProxyType(table)


# node kind -> rule: a sqlglot class, or the lower-cased name of an exp.Anonymous function
_RULES = _table(
    ((exp.Paren,), _paren),
    ((exp.Column,), _column),
    ((exp.Literal,), _literal),
    ((exp.Boolean,), _boolean),
    ((exp.Null,), _null),
    ((exp.Neg,), _neg),
    ((exp.Add,), _add),
    ((exp.Sub,), _sub),
    ((exp.Mul,), _mul),
    ((exp.Div,), _div),
    ((exp.IntDiv, "intdiv", "intdivorzero"), _int_div),
    ((exp.Mod, "modulo", "moduloorzero"), _modulo),
    ((exp.Abs,), _abs),
    ((exp.Least, "least"), _least),
    ((exp.Greatest, "greatest"), _greatest),
    ((exp.Pow, "pow", "power"), _pow),
    ((exp.Sqrt, "sqrt"), _sqrt),
    ((exp.Cbrt, "cbrt"), _cbrt),
    ((exp.Exp, *_EXP_BASES), _exp),
    ((exp.Ln, exp.Log, *_LOGARITHMS), _logarithm),
    ((*_ROUNDING, "floor", "ceil", "ceiling", "round", "roundbankers", "trunc", "truncate"), _rounding),
    ((exp.Sign, "sign"), _sign),
    ((exp.If,), _if),
    ((exp.Case,), _case),
    (("multiif",), _multi_if),
    ((exp.Coalesce, "ifnull", "coalesce"), _coalesce),
    ((exp.Nullif, "nullif"), _nullif),
    ((exp.Cast, exp.TryCast), _cast),
    (("accuratecastornull",), _accurate_cast_or_null),
    (tuple(sorted(_IDENTITY_CASTS)), _identity_cast),
    (tuple(_INT_CASTS), _int_cast),
    ((exp.Length, "lengthutf8"), _length),
    ((*_BOOLEAN_NODES, *sorted(_BOOLEAN_FUNCS)), _predicate),
)


def _rule_for(n: exp.Expression) -> Rule | None:
    if isinstance(n, exp.Anonymous):
        return _RULES.get(func_name(n).lower())
    return next((_RULES[c] for c in type(n).__mro__ if c in _RULES), None)


def bound_expression(node: exp.Expression, entry: TableEntry, agg_text: str) -> tuple[Interval, str, bool]:
    """(interval, clipped SQL, nullable) of an aggregate argument."""
    b = _Bounder(entry, agg_text)
    iv, s = b.visit(node)
    if iv is None:
        raise QueryRejected(f"{agg_text}: the argument is always NULL")
    return _finite(iv, agg_text), s, b.nullable


def expr_nullable(node: exp.Expression, entry: TableEntry) -> bool:
    """Conservative: can this row-level expression be NULL?"""
    for n in node.walk():
        if isinstance(n, exp.Column) and is_nullable(entry.columns.get(n.name, "")):
            return True
        if isinstance(n, (exp.Null, exp.Nullif, exp.TryCast)):
            return True
        if isinstance(n, exp.Case) and n.args.get("default") is None:
            return True
        if isinstance(n, exp.If) and n.args.get("false") is None:
            return True
        if isinstance(n, exp.Anonymous) and ("ornull" in func_name(n).lower() or func_name(n).lower() == "nullif"):
            return True
    return False
