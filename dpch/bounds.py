"""Per-row bounds of an aggregate's argument by interval arithmetic over the catalog's column bounds
(the paper, Remark 1: a Lipschitz/monotone map of a bounded value is bounded), with the clipped
SQL that makes the bound hold by construction. Used by dpch.plan; a stage of its own because it is
the one place that turns an expression into a sensitivity."""
from __future__ import annotations

import math

from sqlglot import exp

from .bind import func_name, sql_of
from .catalog import TableEntry, base_type, is_integer_type, is_nullable, quote_ident
from .errors import QueryRejected

# Implicit bounds from small integer types (documented in docs/CONTROLLER.md).
_TYPE_BOUNDS = {"Bool": (0.0, 1.0), "UInt8": (0.0, 255.0), "Int8": (-128.0, 127.0),
                "UInt16": (0.0, 65535.0), "Int16": (-32768.0, 32767.0)}
_INT_RANGES = {"Int8": (-2 ** 7, 2 ** 7 - 1), "Int16": (-2 ** 15, 2 ** 15 - 1), "Int32": (-2 ** 31, 2 ** 31 - 1),
               "Int64": (-2 ** 63, 2 ** 63 - 1), "UInt8": (0, 2 ** 8 - 1), "UInt16": (0, 2 ** 16 - 1),
               "UInt32": (0, 2 ** 32 - 1), "UInt64": (0, 2 ** 64 - 1)}



def _reject(msg: str) -> QueryRejected:
    return QueryRejected(msg)


def _flit(x: float) -> str:
    """A float literal that parses back exactly (negative values parenthesised)."""
    s = repr(float(x))
    if s in ("inf", "-inf", "nan"):
        raise _reject("a bound is not finite")
    return f"({s})" if s.startswith("-") else s


Interval = tuple[float, float]

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


def _hull(*ivs: Interval | None) -> Interval | None:
    ivs2 = [i for i in ivs if i is not None]
    if not ivs2:
        return None
    return (min(i[0] for i in ivs2), max(i[1] for i in ivs2))


def _finite(iv: Interval, what: str) -> Interval:
    if not (math.isfinite(iv[0]) and math.isfinite(iv[1])):
        raise _reject(f"the bounds of {what} overflow: narrow the column bounds")
    return iv


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
        raise _reject(f"{self.agg_text} needs bounds on column {name!r}: declare them in the catalog, e.g. "
                      f"db.catalog.register({self.entry.table!r}, ..., bounds={{{name!r}: (lo, hi)}})")

    def visit(self, n: exp.Expression) -> tuple[Interval | None, str]:
        if isinstance(n, exp.Paren):
            iv, s = self.visit(n.this)
            return iv, f"({s})"
        if isinstance(n, exp.Column):
            lo, hi = self.column_bounds(n.name)
            col = quote_ident(n.name)
            typ = base_type(self.entry.columns.get(n.name, ""))
            if is_integer_type(typ) and typ not in _WIDE_INTS:
                return (lo, hi), f"least(greatest({col}, {_flit(lo)}), {_flit(hi)})"
            if is_integer_type(typ):  # no common type of Int64/UInt64 and Float64: clip in Float64
                return (lo, hi), f"least(greatest(toFloat64({col}), {_flit(lo)}), {_flit(hi)})"
            return (lo, hi), (f"if(isNaN(toFloat64({col})), {_flit(lo)}, "
                              f"least(greatest(toFloat64({col}), {_flit(lo)}), {_flit(hi)}))")
        if isinstance(n, exp.Literal):
            if n.is_string:
                raise _reject(f"{self.agg_text}: a string literal cannot be summed or averaged")
            v = float(n.this)
            return (v, v), _flit(v)
        if isinstance(n, exp.Boolean):
            v = 1.0 if n.this else 0.0
            return (v, v), _flit(v)
        if isinstance(n, exp.Null):
            self.nullable = True
            return None, "NULL"
        if isinstance(n, exp.Neg):
            iv, s = self.visit(n.this)
            return (None if iv is None else (-iv[1], -iv[0])), f"(-{s})"
        if isinstance(n, (exp.Add, exp.Sub, exp.Mul, exp.Div)):
            a, sa = self.visit(n.this)
            b, sb = self.visit(n.expression)
            if a is None or b is None:
                self.nullable = True
                return None, "NULL"
            op = {exp.Add: "+", exp.Sub: "-", exp.Mul: "*", exp.Div: "/"}[type(n)]
            if isinstance(n, exp.Add):
                iv = (a[0] + b[0], a[1] + b[1])
            elif isinstance(n, exp.Sub):
                iv = (a[0] - b[1], a[1] - b[0])
            elif isinstance(n, exp.Mul):
                c = [a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1]]
                iv = (min(c), max(c))
            else:
                if b[0] <= 0.0 <= b[1]:
                    raise _reject(f"{self.agg_text}: division by {sql_of(n.expression)}, whose bounds include 0, "
                                  "has unbounded sensitivity; divide by a constant or a value bounded away from 0")
                c = [a[0] / b[0], a[0] / b[1], a[1] / b[0], a[1] / b[1]]
                iv = (min(c), max(c))
            return _finite(iv, self.agg_text), f"({sa} {op} {sb})"
        if isinstance(n, exp.IntDiv) or (isinstance(n, exp.Anonymous) and func_name(n).lower() in ("intdiv", "intdivorzero")):
            x, y = (n.this, n.expression) if isinstance(n, exp.IntDiv) else tuple(n.expressions[:2])
            a, sa = self.visit(x)
            b, sb = self.visit(y)
            if a is None or b is None:
                return None, "NULL"
            if b[0] <= 0.0 <= b[1]:
                raise _reject(f"{self.agg_text}: integer division by a value whose bounds include 0")
            c = [a[0] / b[0], a[0] / b[1], a[1] / b[0], a[1] / b[1]]
            return (math.floor(min(c)), math.ceil(max(c))), f"intDivOrZero({sa}, {sb})"
        if isinstance(n, exp.Mod) or (isinstance(n, exp.Anonymous) and func_name(n).lower() in ("modulo", "moduloorzero")):
            x, y = (n.this, n.expression) if isinstance(n, exp.Mod) else tuple(n.expressions[:2])
            a, sa = self.visit(x)
            b, sb = self.visit(y)
            if a is None or b is None:
                return None, "NULL"
            if b[0] <= 0.0 <= b[1]:
                raise _reject(f"{self.agg_text}: modulo by a value whose bounds include 0")
            m = max(abs(b[0]), abs(b[1]))
            lo = 0.0 if a[0] >= 0 else max(a[0], -m)
            hi = 0.0 if a[1] <= 0 else min(a[1], m)
            return (lo, hi), f"moduloOrZero({sa}, {sb})"
        if isinstance(n, exp.Abs):
            a, sa = self.visit(n.this)
            if a is None:
                return None, "NULL"
            lo = 0.0 if a[0] <= 0.0 <= a[1] else min(abs(a[0]), abs(a[1]))
            return (lo, max(abs(a[0]), abs(a[1]))), f"abs({sa})"
        if isinstance(n, (exp.Least, exp.Greatest)) or (
                isinstance(n, exp.Anonymous) and func_name(n).lower() in ("least", "greatest")):
            args = ([n.this] + list(n.expressions)) if isinstance(n, (exp.Least, exp.Greatest)) else list(n.expressions)
            parts = [self.visit(a) for a in args if a is not None]
            ivs = [p[0] for p in parts]
            if any(iv is None for iv in ivs):
                self.nullable = True
                return None, "NULL"
            is_least = isinstance(n, exp.Least) or (isinstance(n, exp.Anonymous) and func_name(n).lower() == "least")
            f = min if is_least else max
            iv = (f(i[0] for i in ivs), f(i[1] for i in ivs))
            name = "least" if is_least else "greatest"
            return iv, f"{name}({', '.join(p[1] for p in parts)})"
        if isinstance(n, exp.Pow) or (isinstance(n, exp.Anonymous) and func_name(n).lower() in ("pow", "power")):
            x, y = (n.this, n.expression) if isinstance(n, exp.Pow) else tuple(n.expressions[:2])
            if not isinstance(y, exp.Literal) or y.is_string:
                raise _reject(f"{self.agg_text}: pow() needs a constant exponent")
            p = float(y.this)
            a, sa = self.visit(x)
            if a is None:
                return None, "NULL"
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
                    raise _reject(f"{self.agg_text}: pow with a negative exponent of a value whose bounds include 0")
            else:
                raise _reject(f"{self.agg_text}: pow with a non-integer exponent needs a non-negative base")
            return _finite(iv, self.agg_text), f"pow({sa}, {_flit(p)})"
        if isinstance(n, (exp.Sqrt, exp.Cbrt)) or (isinstance(n, exp.Anonymous) and func_name(n).lower() in ("sqrt", "cbrt")):
            x = n.this if isinstance(n, (exp.Sqrt, exp.Cbrt)) else n.expressions[0]
            a, sa = self.visit(x)
            if a is None:
                return None, "NULL"
            is_sqrt = isinstance(n, exp.Sqrt) or (isinstance(n, exp.Anonymous) and func_name(n).lower() == "sqrt")
            if is_sqrt:
                if a[0] < 0:
                    raise _reject(f"{self.agg_text}: sqrt of a value whose bounds include negative numbers")
                return (math.sqrt(a[0]), math.sqrt(a[1])), f"sqrt({sa})"
            cb = lambda v: math.copysign(abs(v) ** (1 / 3), v)  # noqa: E731
            return (cb(a[0]), cb(a[1])), f"cbrt({sa})"
        if isinstance(n, exp.Exp) or (isinstance(n, exp.Anonymous) and func_name(n).lower() in ("exp", "exp2", "exp10")):
            x = n.this if isinstance(n, exp.Exp) else n.expressions[0]
            base = math.e if isinstance(n, exp.Exp) else {"exp": math.e, "exp2": 2.0, "exp10": 10.0}[func_name(n).lower()]
            a, sa = self.visit(x)
            if a is None:
                return None, "NULL"
            try:
                iv = (base ** a[0], base ** a[1])
            except OverflowError:
                raise _reject(f"the bounds of {self.agg_text} overflow: narrow the column bounds") from None
            fname = "exp" if isinstance(n, exp.Exp) else func_name(n)
            return _finite(iv, self.agg_text), f"{fname}({sa})"
        if isinstance(n, (exp.Ln, exp.Log)) or (isinstance(n, exp.Anonymous) and func_name(n).lower() in ("ln", "log", "log2", "log10", "log1p")):
            if isinstance(n, exp.Log) and n.expression is not None:
                raise _reject(f"{self.agg_text}: log with a base argument is not supported; use ln/log2/log10")
            x = n.this if isinstance(n, (exp.Ln, exp.Log)) else n.expressions[0]
            fname = "log" if isinstance(n, (exp.Ln, exp.Log)) else func_name(n).lower()
            a, sa = self.visit(x)
            if a is None:
                return None, "NULL"
            shift = 1.0 if fname == "log1p" else 0.0
            if a[0] + shift <= 0:
                raise _reject(f"{self.agg_text}: logarithm of a value whose bounds include non-positive numbers")
            f = {"log": math.log, "ln": math.log, "log2": math.log2, "log10": math.log10, "log1p": math.log1p}[fname]
            return (f(a[0]), f(a[1])), f"{fname}({sa})"
        if isinstance(n, (exp.Floor, exp.Ceil, exp.Round)) or (
                isinstance(n, exp.Anonymous) and func_name(n).lower() in ("floor", "ceil", "ceiling", "round",
                                                                        "roundbankers", "trunc", "truncate")):
            if isinstance(n, exp.Anonymous):
                x = n.expressions[0]
                digits = n.expressions[1] if len(n.expressions) > 1 else None
                fname = func_name(n)
            else:
                x = n.this
                digits = n.args.get("decimals") or n.args.get("expression")
                fname = {exp.Floor: "floor", exp.Ceil: "ceil", exp.Round: "round"}[type(n)]
            a, sa = self.visit(x)
            if a is None:
                return None, "NULL"
            d = 0
            if digits is not None:
                if not isinstance(digits, exp.Literal) or digits.is_string:
                    if isinstance(digits, exp.Neg) and isinstance(digits.this, exp.Literal):
                        d = -int(float(digits.this.this))
                    else:
                        raise _reject(f"{self.agg_text}: rounding needs a constant number of digits")
                else:
                    d = int(float(digits.this))
            if d >= 0:
                iv = (math.floor(a[0]), math.ceil(a[1]))
            else:
                step = 10.0 ** (-d)
                iv = (math.floor(a[0] / step) * step, math.ceil(a[1] / step) * step)
            extra = f", {d}" if digits is not None else ""
            return iv, f"{fname}({sa}{extra})"
        if isinstance(n, exp.Sign) or (isinstance(n, exp.Anonymous) and func_name(n).lower() == "sign"):
            x = n.this if isinstance(n, exp.Sign) else n.expressions[0]
            a, sa = self.visit(x)
            if a is None:
                return None, "NULL"
            lo = -1.0 if a[0] < 0 else (0.0 if a[0] == 0 else 1.0)
            hi = 1.0 if a[1] > 0 else (0.0 if a[1] == 0 else -1.0)
            return (lo, hi), f"sign({sa})"
        if isinstance(n, exp.If):
            cond = sql_of(n.this)
            t, st = self.visit(n.args["true"])
            f_node = n.args.get("false")
            if f_node is None:
                self.nullable = True
                f, sf = None, "NULL"
            else:
                f, sf = self.visit(f_node)
            return _hull(t, f), f"if({cond}, {st}, {sf})"
        if isinstance(n, exp.Case):
            if n.this is not None:
                raise _reject(f"{self.agg_text}: CASE <operand> WHEN ... is not supported inside aggregates; "
                              "use CASE WHEN <condition> ...")
            parts = []
            ivs = []
            for branch in n.args.get("ifs") or []:
                iv, s = self.visit(branch.args["true"])
                ivs.append(iv)
                parts.append(f"WHEN {sql_of(branch.this)} THEN {s}")
            default = n.args.get("default")
            if default is None:
                self.nullable = True
                ivs.append(None)
                parts.append("ELSE NULL")
            else:
                iv, s = self.visit(default)
                ivs.append(iv)
                parts.append(f"ELSE {s}")
            return _hull(*ivs), f"CASE {' '.join(parts)} END"
        if isinstance(n, exp.Anonymous) and func_name(n).lower() == "multiif":
            args = list(n.expressions)
            if len(args) < 3 or len(args) % 2 == 0:
                raise _reject(f"{self.agg_text}: multiIf needs condition/value pairs and a default")
            ivs = []
            parts = []
            for i in range(0, len(args) - 1, 2):
                iv, s = self.visit(args[i + 1])
                ivs.append(iv)
                parts.extend([sql_of(args[i]), s])
            iv, s = self.visit(args[-1])
            ivs.append(iv)
            parts.append(s)
            return _hull(*ivs), f"multiIf({', '.join(parts)})"
        if isinstance(n, exp.Coalesce) or (isinstance(n, exp.Anonymous) and func_name(n).lower() in ("ifnull", "coalesce")):
            args = ([n.this] + list(n.expressions)) if isinstance(n, exp.Coalesce) else list(n.expressions)
            parts = [self.visit(a) for a in args]
            return _hull(*[p[0] for p in parts]), f"coalesce({', '.join(p[1] for p in parts)})"
        if isinstance(n, exp.Nullif) or (isinstance(n, exp.Anonymous) and func_name(n).lower() == "nullif"):
            x = n.this if isinstance(n, exp.Nullif) else n.expressions[0]
            y = n.expression if isinstance(n, exp.Nullif) else n.expressions[1]
            iv, s = self.visit(x)
            self.nullable = True
            return iv, f"nullIf({s}, {sql_of(y)})"
        if isinstance(n, (exp.Cast, exp.TryCast)):
            to = n.args["to"]
            tname = to.sql(dialect="clickhouse")
            bt = base_type(tname)
            iv, s = self.visit(n.this)
            if isinstance(n, exp.TryCast):
                self.nullable = True
            if iv is None:
                return None, "NULL"
            if bt.startswith("Float") or bt.startswith("Decimal"):
                return iv, f"CAST({s} AS {tname})"
            if bt in _INT_RANGES:
                return self._int_cast(iv, s, bt)
            raise _reject(f"{self.agg_text}: CAST to {tname} cannot be bounded; cast to a numeric type")
        if isinstance(n, exp.Anonymous) and func_name(n).lower() == "accuratecastornull":
            # the total conversion of dpch.totality: NULL when the value does not convert
            target = n.expressions[1] if len(n.expressions) > 1 else None
            if not (isinstance(target, exp.Literal) and target.is_string):
                raise _reject(f"{self.agg_text}: accurateCastOrNull needs a constant type")
            bt = base_type(target.this)
            iv, s = self.visit(n.expressions[0])
            self.nullable = True
            if iv is None:
                return None, "NULL"
            if bt.startswith("Float"):
                return iv, f"accurateCastOrNull({s}, {sql_of(target)})"
            if bt in _INT_RANGES:
                iv2, _ = self._int_cast(iv, s, bt)
                return iv2, f"accurateCastOrNull({s}, {sql_of(target)})"
            raise _reject(f"{self.agg_text}: a conversion to {target.this} cannot be bounded; convert to a numeric type")
        if isinstance(n, exp.Anonymous) and func_name(n).lower() in _IDENTITY_CASTS:
            iv, s = self.visit(n.expressions[0])
            return iv, f"{func_name(n)}({s})"
        if isinstance(n, exp.Anonymous) and func_name(n).lower() in _INT_CASTS:
            iv, s = self.visit(n.expressions[0])
            if iv is None:
                return None, "NULL"
            return self._int_cast(iv, s, _INT_CASTS[func_name(n).lower()])
        if isinstance(n, _BOOLEAN_NODES) or (isinstance(n, exp.Anonymous) and func_name(n).lower() in _BOOLEAN_FUNCS):
            # a predicate: 0 or 1 (NULL when an operand is NULL); may read any registered column
            return (0.0, 1.0), f"toUInt8({sql_of(n)})"
        raise _reject(f"{self.agg_text}: cannot bound {sql_of(n)[:80]} inside an aggregate; supported inside "
                      "aggregates: bounded columns, constants, + - * /, abs, least/greatest, pow, sqrt, exp/log, "
                      "rounding, numeric casts, if/CASE/multiIf, coalesce and comparisons")

    def _int_cast(self, iv: Interval, s: str, bt: str) -> tuple[Interval, str]:
        lo_t, hi_t = _INT_RANGES[bt]
        lo, hi = math.floor(iv[0]) if iv[0] < 0 else math.trunc(iv[0]), math.ceil(iv[1]) if iv[1] < 0 else math.trunc(iv[1])
        lo, hi = min(lo, math.trunc(iv[0])), max(hi, math.trunc(iv[1]))
        if lo < lo_t or hi > hi_t:
            raise _reject(f"{self.agg_text}: conversion to {bt} may overflow for the declared bounds")
        return (float(lo), float(hi)), f"to{bt}({s})"


def bound_expression(node: exp.Expression, entry: TableEntry, agg_text: str) -> tuple[Interval, str, bool]:
    """(interval, clipped SQL, nullable) of an aggregate argument."""
    b = _Bounder(entry, agg_text)
    iv, s = b.visit(node)
    if iv is None:
        raise _reject(f"{agg_text}: the argument is always NULL")
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

