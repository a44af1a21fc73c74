"""Stage 2b of the controller: every row-level expression made total (DESIGN.md, invariant 7).

``make_total(bound, types) -> BoundQuery``. A row-level expression (WHERE, a GROUP BY key, an
aggregate's argument or condition) runs on private rows, and ClickHouse short-circuits AND/OR/if:
a function that can throw, or whose cost grows with a value, turns "did this query fail / take
long" into an exact oracle for one unit's rows (`WHERE user_id = 42 AND intDiv(1, 0) = 1`). So
every function here is one of:

- **total**: cannot throw on any value of its argument types, and its cost and output size are at
  most a constant times its inputs' size (arithmetic wraps or gives inf/NaN, comparisons, string
  and date functions with bounded output);
- **rewritten** to a total form: ``intDiv`` → ``intDivOrZero``, ``%``/``modulo`` →
  ``moduloOrZero``, a cast or ``toT(x)`` that can fail on a value → ``accurateCastOrNull(x, 'T')``
  (NULL when x does not convert), Decimal arithmetic → Float64 arithmetic;
- **constant-argument**: total once some arguments are constants within a range (``substring``
  offsets, pad lengths, regular expressions and formats, date units): checked here;
- **rejected**, with the reason (``repeat``, ``toFixedString``, edit distances, array subscripts,
  regular expressions built from data, ...).

``FUNCTION_RULES`` is the table (docs/CONTROLLER.md prints it). What a NULL produced by a total
form means, per position: in WHERE and in -If conditions, false (the row is not counted); in a
GROUP BY key, the NULL group; inside an aggregate's argument, the row is skipped as SQL aggregates
skip NULL (COUNT(x) counts non-NULL values).

Types come from the engine (`types(sql list) -> type list`, a DESCRIBE that reads no data); the
controller's type check afterwards runs the whole rewritten query on one row of default values
before anything is charged (dpch.typecheck), which catches what depends on constants only.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Sequence

from sqlglot import exp

from .bind import BoundQuery
from .catalog import base_type
from .errors import QueryRejected
from .function_rules import FUNCTION_RULES, Rule, func_name
from .function_rules import rule_name as _name
from .sql_ast import sql_of

TypesOf = Callable[[Sequence[str]], list[str]]



# Date and time functions parse a String argument row by row (a date, a time zone): the parse
# throws on malformed text, so such an argument must be a constant (checked once, while the query is
# analysed) or of a non-String type. The first argument of the conversions and of toString is
# exempt: the conversions are rewritten to total forms, and toString of a String is the identity.
_DATE_FUNCS = {n for n, r in FUNCTION_RULES.items()
               if r.why in {FUNCTION_RULES[f].why for f in ("toyear", "formatdatetime", "datediff")}} - {"interval"}
_FIRST_EXEMPT = {"tostring", "todate", "todate32", "todatetime", "tounixtimestamp"}

# sub-second units are missing on purpose: they turn a DateTime into a DateTime64 (a Decimal), whose
# arithmetic throws on overflow
_UNITS = {"SECOND", "MINUTE", "HOUR", "DAY", "WEEK", "MONTH", "QUARTER", "YEAR"}
_UNITS |= {u + "S" for u in _UNITS}
_MAX_PAD = 10_000
_MAX_OFFSET = 2 ** 31
_STRINGY = ("String", "FixedString")
_CAST_TARGETS = {"toint8": "Int8", "toint16": "Int16", "toint32": "Int32", "toint64": "Int64",
                 "toint128": "Int128", "toint256": "Int256", "touint8": "UInt8", "touint16": "UInt16",
                 "touint32": "UInt32", "touint64": "UInt64", "touint128": "UInt128", "touint256": "UInt256",
                 "tofloat32": "Float32", "tofloat64": "Float64", "todate": "Date", "todate32": "Date32",
                 "todatetime": "DateTime", "tobool": "Bool"}
_SAFE_FROM_NUMBER = ("Int", "UInt", "Float", "Date", "DateTime", "String")  # target families total from numbers
# targets accurateCastOrNull converts without throwing (an Enum throws on an unknown name; composite
# types cannot be Nullable)
_NULLABLE_TARGETS = ("int", "uint", "float", "decimal", "date", "datetime", "string", "uuid", "ipv4", "ipv6", "bool",
                     "text", "varchar", "char", "double", "real", "bigint", "smallint", "tinyint", "timestamp")
_DECIMAL_TARGETS = ("datetime64", "timestamp")  # Decimal-based: rejected as conversion targets


def _check_target(target: str, where: str) -> None:
    if base_type(target).lower().startswith("interval"):
        raise _reject(f"{where}: a conversion to {target} makes an interval, whose date arithmetic throws on "
                      "overflow; add a number of units with addDays/addSeconds/... instead")
    if base_type(target).lower().startswith(_DECIMAL_TARGETS):
        raise _reject(f"{where}: a conversion to {target} gives a Decimal-based DateTime64, whose arithmetic throws "
                      "on overflow; convert to DateTime")
    if not base_type(target).lower().startswith(_NULLABLE_TARGETS):
        raise _reject(f"{where}: a conversion to {target} can throw on a value (an Enum on an unknown name) or "
                      "cannot be made total; convert to a number, a date, a string or a UUID, or compare Enum "
                      "columns with string constants")


def _reject(msg: str) -> QueryRejected:
    return QueryRejected(msg)



_INTDIV_LIMIT = "4.6e18"  # < 2^63 with room for float rounding of the quotient


# the largest quotient an integer division may compute, by its result type: intDiv of a Float32
# gives an Int32 and throws above 2^31; of integers the quotient fits its type anyway (but INT_MIN
# / -1, which the limit also excludes); 64-bit limits leave room for the float rounding of x / y
_INTDIV_LIMITS = {"Int8": "127", "Int16": "32767", "Int32": "2147483647", "UInt8": "255", "UInt16": "65535",
                  "UInt32": "4294967295", "Int64": _INTDIV_LIMIT, "UInt64": "1.8e19"}


def _total_intdiv(x: exp.Expression, y: exp.Expression, result_type: str = "Int32") -> exp.Expression:
    """intDivOrZero(if(ok, x, 0), if(ok, y, 1)), ok = isFinite(x) AND isFinite(y) AND abs(x / y) <
    the limit of the division's result type: the integer division only sees a quotient that fits."""
    limit = _INTDIV_LIMITS.get(base_type(result_type), "2147483647")  # unknown: the smallest float result
    in_range = exp.LT(this=exp.Anonymous(this="abs", expressions=[exp.Div(this=exp.Paren(this=x.copy()),
                                                                           expression=exp.Paren(this=y.copy()))]),
                      expression=exp.Literal.number(limit))
    # an infinite divisor gives a quotient of 0 that still throws: both operands must be finite
    ok = exp.And(this=exp.And(this=exp.Anonymous(this="isFinite", expressions=[x.copy()]),
                              expression=exp.Anonymous(this="isFinite", expressions=[y.copy()])),
                 expression=in_range)
    return exp.Anonymous(this="intDivOrZero", expressions=[
        exp.If(this=ok.copy(), true=x.copy(), false=exp.Literal.number(0)),
        exp.If(this=ok, true=y.copy(), false=exp.Literal.number(1))])


# Output size of string functions relative to their largest input (an upper bound). A chain of
# them multiplies; an expression whose bound exceeds MAX_GROWTH is rejected, because its cost
# would then depend on the lengths of one unit's strings by more than a constant factor.
MAX_GROWTH = 64
_GROWTH = {"hex": 2.0, "concat": None, "concatwithseparator": None, "dpipe": None}  # None: number of arguments


def _growth(node: exp.Expression) -> float:
    name = _name(node)
    children = [c for c in node.iter_expressions() if isinstance(c, exp.Expression)]
    inner = max((_growth(c) for c in children), default=1.0)
    if name in _GROWTH:
        factor = _GROWTH[name] or float(max(1, len(children)))
    elif name in ("replace", "replaceall", "replaceone"):
        parts = [c for c in children if _is_const_string(c)]
        needle = len(parts[0].this) if len(parts) >= 1 else 1
        repl = len(parts[1].this) if len(parts) >= 2 else 1
        factor = max(1.0, repl / max(1, needle))
    elif name in ("replaceregexpall", "replaceregexpone", "regexpreplace"):
        parts = [c for c in children if _is_const_string(c)]
        factor = 1.0 + (len(parts[-1].this) if parts else 1)  # an empty match at every position
    else:
        factor = 1.0
    return factor * inner


_SAFE_AMOUNTS = {"Int8", "Int16", "Int32", "Int64", "UInt8", "UInt16", "UInt32"}
_DATE_ADD = {f"{op}{unit}" for op in ("add", "subtract")
             for unit in ("days", "weeks", "months", "years", "hours", "minutes", "seconds", "quarters")}


_DATE_ADD_UNIT = {"dateadd", "datesub", "date_add", "date_sub", "timestampadd", "timestampsub"}  # (unit, n, d)


def _type_probe_sql(node: exp.Expression) -> str:
    """The SQL whose type decides the node's total form: the argument of a conversion, the amount
    of a date addition, or for an integer division its own result type (asked with materialized
    operands: a constant division by zero would otherwise throw while it is analysed). Always a
    copy (.sql()): sql_of generates in place, and the ClickHouse generator rewrites nodes."""
    if isinstance(node, exp.IntDiv) or (isinstance(node, exp.Anonymous)
                                        and func_name(node).lower() in ("intdiv", "intdivorzero")):
        x, y = (node.this, node.expression) if isinstance(node, exp.IntDiv) else node.expressions[:2]
        return (f"intDivOrZero(materialize({x.sql(dialect='clickhouse')}), "
                f"materialize({y.sql(dialect='clickhouse')}))")
    return _conversion_arg(node).sql(dialect="clickhouse")


def _conversion_arg(node: exp.Expression) -> exp.Expression:
    """The argument whose type decides the total form (the amount of a date addition)."""
    if isinstance(node, exp.Anonymous):
        name = func_name(node).lower()
        return node.expressions[1] if name in _DATE_ADD or name in _DATE_ADD_UNIT else node.expressions[0]
    if isinstance(node, (exp.DateAdd, exp.DateSub, exp.TimestampAdd, exp.TimestampSub)):
        return node.expression
    return node.this


def _finite_int(x: exp.Expression) -> exp.Expression:
    """toInt64 of a float that is never NaN/inf (0 then): the conversion cannot throw."""
    return exp.Anonymous(this="toInt64", expressions=[exp.If(
        this=exp.Anonymous(this="isFinite", expressions=[x.copy()]), true=x.copy(), false=exp.Literal.number(0))])


def _int_literal(node: exp.Expression | None) -> int | None:
    if isinstance(node, exp.Neg):
        v = _int_literal(node.this)
        return None if v is None else -v
    if isinstance(node, exp.Paren):
        return _int_literal(node.this)
    if isinstance(node, exp.Literal) and not node.is_string:
        try:
            return int(node.this)
        except ValueError:
            return None
    return None


def _is_const_string(node: exp.Expression | None) -> bool:
    return isinstance(node, exp.Literal) and node.is_string


def _stringy(typ: str) -> bool:
    return base_type(typ).startswith(_STRINGY)


class _Totalizer:
    def __init__(self, bound: BoundQuery | None, types: TypesOf | None, entry=None):
        self.bound = bound
        self.entry = bound.entry if bound is not None else entry
        self.types = types
        self.pending: list[exp.Expression] = []  # nodes whose total form depends on a type
        self.parsed: list[tuple[str, str, exp.Expression]] = []  # (where, function, argument): must not be a String

    # -- checks ---------------------------------------------------------------------------------
    def check(self, root: exp.Expression, where: str) -> None:
        growth = _growth(root)
        if growth > MAX_GROWTH:
            raise _reject(f"{where}: the string functions in this expression can make its output {growth:.0f} times "
                          f"larger than its input (more than {MAX_GROWTH}): its cost would depend on one unit's "
                          "strings; nothing ran and nothing was charged")
        for node in root.walk():
            name = _name(node)
            if isinstance(node, exp.Var) and not isinstance(node.parent, (exp.DataType, exp.DataTypeParam)):
                if node.name.upper() not in _UNITS:
                    raise _reject(f"{where}: {node.name!r} is not a time unit ({', '.join(sorted(u.lower() for u in _UNITS if not u.endswith('S')))}); "
                                  "a column cannot be used as a unit")
            if not name:
                continue
            rule = FUNCTION_RULES.get(name)
            if rule is None:
                raise _reject(f"{where}: {name.strip('<>')} is not on the list of functions that are total on private "
                              "rows (docs/CONTROLLER.md, \"Totality\"); nothing ran and nothing was charged")
            if rule.kind == "reject":
                raise _reject(f"{where}: {name}() is not allowed on private rows: {rule.why}")
            self._constant_args(node, name, where)

    def _constant_args(self, node: exp.Expression, name: str, where: str) -> None:
        args = list(node.expressions) if isinstance(node, exp.Anonymous) else []

        def need(cond: bool, what: str) -> None:
            if not cond:
                raise _reject(f"{where}: {name}(): {what} on private rows; nothing ran and nothing was charged")

        if name in ("substring", "substr", "substringutf8"):
            rest = args[1:] if args else [node.args.get("start"), node.args.get("length")]
            for a in rest:
                if a is not None:
                    v = _int_literal(a)
                    need(v is not None and abs(v) <= _MAX_OFFSET, "offset and length must be integer constants")
        elif name in ("left", "right"):
            n = args[1] if len(args) > 1 else node.args.get("expression")
            v = _int_literal(n)
            need(v is not None and abs(v) <= _MAX_OFFSET, "the length must be an integer constant")
        elif name in ("leftpad", "rightpad", "lpad", "rpad", "pad"):
            n = args[1] if len(args) > 1 else node.args.get("expression")
            fill = args[2] if len(args) > 2 else node.args.get("fill_pattern")
            v = _int_literal(n)
            need(v is not None and 0 <= v <= _MAX_PAD, f"the length must be a constant in [0, {_MAX_PAD}]")
            need(fill is None or _is_const_string(fill), "the fill must be a constant string")
        elif name in ("like", "notlike", "ilike", "notilike", "match", "regexpilike", "similarto"):
            pattern = args[1] if len(args) > 1 else node.args.get("expression")
            need(_is_const_string(pattern), "the pattern must be a constant string")
        elif name in ("extract", "regexpextract"):
            pattern = args[1] if len(args) > 1 else node.args.get("expression")
            need(_is_const_string(pattern), "the pattern must be a constant string")
            group = args[2] if len(args) > 2 else node.args.get("group")
            need(group is None or _int_literal(group) is not None, "the group must be an integer constant")
        elif name in ("replaceregexpall", "replaceregexpone", "replaceall", "replaceone"):
            need(len(args) == 3 and _is_const_string(args[1]) and _is_const_string(args[2]),
                 "pattern and replacement must be constant strings")
        elif name in ("replace", "regexpreplace"):
            parts = args[1:] if args else [node.args.get("expression"), node.args.get("replacement")]
            need(all(_is_const_string(p) for p in parts if p is not None), "needle and replacement must be constants")
        elif name in ("splitbychar", "splitbystring", "split"):
            sep = args[0] if args else node.args.get("expression")
            need(_is_const_string(sep), "the separator must be a constant string")
        elif name in ("formatdatetime",):
            fmt = args[1] if len(args) > 1 else node.args.get("format")
            need(_is_const_string(fmt), "the format must be a constant string")
        elif name in ("datediff", "date_diff", "age", "dateadd", "date_add", "datesub", "date_sub"):
            if args:  # Anonymous spelling: the unit is the first argument
                need(_is_const_string(args[0]) or isinstance(args[0], exp.Var), "the unit must be a constant")
            else:
                unit = node.args.get("unit")
                need(unit is None or isinstance(unit, exp.Var) or _is_const_string(unit), "the unit must be a constant")
        elif name in ("datetrunc", "date_trunc", "timestamptrunc"):
            unit = args[0] if args else node.args.get("unit")
            need(unit is None or isinstance(unit, exp.Var) or _is_const_string(unit), "the unit must be a constant")
        elif name == "tostartofinterval":
            iv = args[1] if len(args) > 1 else None
            v = _int_literal(iv.this) if isinstance(iv, exp.Interval) else None
            if isinstance(iv, exp.Interval) and v is None and _is_const_string(iv.this):
                v = int(iv.this.this) if iv.this.this.isdigit() else None
            need(v is not None and v > 0, "the interval must be a positive constant")
        elif name in ("toweek", "tostartofweek"):
            need(len(args) < 2 or _int_literal(args[1]) is not None, "the mode must be an integer constant")
        elif name in ("bitshiftleft", "bitshiftright"):
            v = _int_literal(args[1] if len(args) > 1 else node.args.get("expression"))
            need(v is not None and v >= 0, "the shift must be a constant ≥ 0")
        elif name == "accuratecastornull" and args:
            need(len(args) == 2 and _is_const_string(args[1]), "the type must be a constant string")
            _check_target(args[1].this, where)
        elif name in ("round", "roundbankers", "floor", "ceil", "trunc", "truncate"):
            digits = args[1] if len(args) > 1 else (node.args.get("decimals") if not args else None)
            need(digits is None or _int_literal(digits) is not None, "the number of digits must be an integer constant")

    # -- rewriting ------------------------------------------------------------------------------
    def collect(self, root: exp.Expression) -> None:
        """Nodes whose total form depends on a type (asked of the engine, see _type_probe_sql):
        conversions, integer divisions (their result type sets the quotient limit) and date
        additions (their amount)."""
        for node in root.walk():
            name = _name(node)
            if name in ("cast", "intdiv", "intdivorzero", "tounixtimestamp") or name in _CAST_TARGETS \
                    or name.startswith("todecimal") \
                    or (name in _DATE_ADD and len(node.expressions) == 2) or (name == "interval" and node.this is not None) \
                    or (name in _DATE_ADD_UNIT and (len(node.expressions) == 3 if isinstance(node, exp.Anonymous)
                                                    else node.args.get("expression") is not None)):
                self.pending.append(node)

    def collect_parsed(self, root: exp.Expression, where: str) -> None:
        """Arguments that a date function (or date ± INTERVAL) would parse if they were Strings:
        those computed from a column (a constant is parsed once, while the query is analysed)."""
        for node in root.walk():
            name = _name(node)
            args = list(node.expressions) if isinstance(node, exp.Anonymous) else \
                [c for c in node.iter_expressions() if isinstance(c, exp.Expression)]
            if name in _FIRST_EXEMPT:
                args = args[1:]
            elif name not in _DATE_FUNCS and not any(isinstance(a, exp.Interval) for a in args):
                continue
            for a in args:
                if not isinstance(a, exp.Interval) and a.find(exp.Column) is not None:
                    self.parsed.append((where, name or "an INTERVAL addition", a))

    def _typed(self, roots: list[tuple[str, exp.Expression]]) -> dict[int, str]:
        """Check and collect every root, then ask the types of the collected nodes in one call:
        {id(node): type}. A String argument of a date function is rejected here."""
        for where, root in roots:
            self.check(root, where)
            self.collect(root)
            self.collect_parsed(root, where)
        if not self.pending and not self.parsed:
            return {}
        sqls = [_type_probe_sql(n) for n in self.pending] + [a.sql(dialect="clickhouse") for _, _, a in self.parsed]
        types = self.types(sqls) if self.types is not None else ["String"] * len(sqls)  # unknown: the worst (a parse)
        for (where, name, _), t in zip(self.parsed, types[len(self.pending):]):
            if _stringy(t):
                raise _reject(f"{where}: {name}(): an argument computed from the rows is a String, which ClickHouse "
                              "would parse row by row as a date or a time zone (the parse throws on malformed text); "
                              "use a constant, a Date/DateTime column, or toDateOrNull/toDateTimeOrNull; nothing ran "
                              "and nothing was charged")
        return {id(n): t for n, t in zip(self.pending, types)}

    def rewrite(self, root: exp.Expression, arg_types: dict[int, str]) -> exp.Expression:
        holder = exp.Paren(this=root)
        # children before parents (reversed breadth-first order): a rewrite copies its arguments,
        # which must already be in their total form
        for node in reversed(list(holder.walk(bfs=True))):
            name = _name(node)
            if name in ("intdiv", "intdivorzero"):
                x, y = (node.this, node.expression) if isinstance(node, exp.IntDiv) else node.expressions[:2]
                node.replace(_total_intdiv(x, y, arg_types.get(id(node), "")))
            elif name in ("modulo", "mod"):
                x, y = (node.this, node.expression) if isinstance(node, exp.Mod) else node.expressions[:2]
                node.replace(exp.Paren(this=exp.Anonymous(this="moduloOrZero", expressions=[x, y])))
            elif id(node) in arg_types and (name in _DATE_ADD or name in _DATE_ADD_UNIT or name == "interval"):
                # the amount must be an Int64-range integer: a UInt64 above 2^63 throws "numeric
                # overflow", a fractional amount makes a DateTime64 (a Decimal) that throws on overflow
                amount = _conversion_arg(node)
                if not isinstance(amount, exp.Literal) and base_type(arg_types[id(node)]) not in _SAFE_AMOUNTS:
                    amount.replace(_finite_int(amount))
            elif id(node) in arg_types:
                self._conversion(node, name, arg_types[id(node)])
            elif name == "accuratecastornull" and isinstance(node, exp.Anonymous) and len(node.expressions) == 2 \
                    and base_type(node.expressions[1].this).lower().startswith("decimal"):
                node.expressions[1].replace(exp.Literal.string("Float64"))  # Decimal arithmetic throws
        for col in list(holder.find_all(exp.Column)):  # Decimal arithmetic, casts, comparisons throw: Float64
            typ = base_type(self.entry.columns.get(col.name, ""))
            top = col
            while isinstance(top.parent, exp.Paren) and top.parent is not holder:
                top = top.parent
            under = top.parent is not holder  # anything but the whole expression (a key, an aggregated column)
            if typ.startswith("Decimal") and under:
                col.replace(exp.Anonymous(this="toFloat64", expressions=[col.copy()]))
            elif typ.startswith("DateTime64") and under and not (
                    isinstance(top.parent, exp.Predicate)
                    and all(o is top or o.find(exp.Column) is None for o in top.parent.iter_expressions())):
                raise _reject(f"column {col.name!r} is a DateTime64 (a Decimal): arithmetic and conversions on it "
                              "throw on overflow; compare it with constants or group by it as it is")
        return holder.this

    def _conversion(self, node: exp.Expression, name: str, arg_type: str) -> None:
        arg = _conversion_arg(node)
        if name.startswith("todecimal"):
            scale = node.expressions[1] if len(node.expressions) > 1 else None
            digits = _int_literal(scale)
            if digits is None:
                raise _reject(f"{name}(): the scale must be an integer constant")
            as_float = exp.Anonymous(this="accurateCastOrNull", expressions=[arg.copy(), exp.Literal.string("Float64")])
            node.replace(exp.Anonymous(this="trunc", expressions=[as_float, exp.Literal.number(digits)]))
            return
        if name == "tounixtimestamp":
            if _stringy(arg_type):
                as_time = exp.Anonymous(this="accurateCastOrNull", expressions=[arg.copy(), exp.Literal.string("DateTime")])
                node.replace(exp.Anonymous(this="toUnixTimestamp", expressions=[as_time]))
            return
        target = node.args["to"].sql(dialect="clickhouse") if isinstance(node, exp.Cast) else _CAST_TARGETS[name]
        tb = base_type(target)
        _check_target(target, f"{name}()")
        if tb.startswith("Decimal"):
            node.replace(exp.Anonymous(this="accurateCastOrNull", expressions=[arg.copy(), exp.Literal.string("Float64")]))
            return
        if tb.startswith("FixedString"):
            raise _reject(f"a conversion to {target} throws on longer strings; use substring(s, 1, N)")
        total_as_is = not _stringy(arg_type) and tb.startswith(_SAFE_FROM_NUMBER) and tb != "Bool"
        if not total_as_is:
            node.replace(exp.Anonymous(this="accurateCastOrNull", expressions=[arg.copy(), exp.Literal.string(target)]))
        elif base_type(arg_type).startswith(("Float", "BFloat", "Decimal")) and tb.startswith(("Int", "UInt", "Date")):
            # (a Decimal argument is computed in Float64 after this pass, so it counts as a float)
            # a float NaN/inf to an integer or a date throws: convert only finite values (NULL otherwise)
            finite = exp.Anonymous(this="isFinite", expressions=[arg.copy()])
            node.set("this" if isinstance(node, exp.Cast) else "expressions",
                     exp.If(this=finite.copy(), true=arg.copy(), false=exp.Literal.number(0))
                     if isinstance(node, exp.Cast) else
                     [exp.If(this=finite.copy(), true=arg.copy(), false=exp.Literal.number(0))])
            node.replace(exp.If(this=finite, true=node.copy(), false=exp.Null()))

    # -- main -----------------------------------------------------------------------------------
    def run_templates(self) -> BoundQuery:
        """Post-processing over released values (outputs, HAVING, ORDER BY): not private, but an
        accepted query must not fail at run time either, so the same rules apply."""
        b = self.bound
        outputs = [o.template.copy() for o in b.outputs]
        having = b.having.copy() if b.having is not None else None
        order = [o.template.copy() for o in b.order]
        arg_types = self._typed([("SELECT", t) for t in outputs] + ([("HAVING", having)] if having is not None else [])
                                + [("ORDER BY", t) for t in order])
        new_outputs = tuple(replace(o, template=self.rewrite(t, arg_types)) for o, t in zip(b.outputs, outputs))
        new_order = tuple(replace(o, template=self.rewrite(t, arg_types)) for o, t in zip(b.order, order))
        new_having = self.rewrite(having, arg_types) if having is not None else None
        return replace(b, outputs=new_outputs, having=new_having, order=new_order)

    def run(self) -> BoundQuery:
        b = self.bound
        roots: list[tuple[str, exp.Expression]] = []
        where = b.where.copy() if b.where is not None else None
        if where is not None:
            roots.append(("WHERE", where))
        keys = [k.expr.copy() for k in b.keys]
        roots += [(f"GROUP BY {k.sql}", e) for k, e in zip(b.keys, keys)]
        args = [(a.arg.copy() if a.arg is not None else None, a.cond.copy() if a.cond is not None else None)
                for a in b.aggregates]
        for a, (arg, cond) in zip(b.aggregates, args):
            for part in (arg, cond):
                if part is not None:
                    roots.append((a.text, part))
        arg_types = self._typed(roots)
        new_where = self.rewrite(where, arg_types) if where is not None else None
        new_keys = []
        for k, e in zip(b.keys, keys):
            e2 = self.rewrite(e, arg_types)
            # always rebuilt: sqlglot caches a node's hash, so == can miss an in-place rewrite
            new_keys.append(replace(k, expr=e2, sql=sql_of(e2)))
        new_aggs = []
        for a, (arg, cond) in zip(b.aggregates, args):
            arg2 = self.rewrite(arg, arg_types) if arg is not None else None
            cond2 = self.rewrite(cond, arg_types) if cond is not None else None
            new_aggs.append(replace(a, arg=arg2, cond=cond2))
        return replace(b, where=new_where, keys=tuple(new_keys), aggregates=tuple(new_aggs))


def make_total(bound: BoundQuery, types: TypesOf | None = None) -> BoundQuery:
    """Check and rewrite every row-level expression of ``bound`` into a total form (module
    docstring). Raises QueryRejected naming the function and why; runs nothing, charges nothing.
    ``types`` gives the engine's types of SQL expressions over the table (None: assume String,
    i.e. the conservative total form)."""
    return _Totalizer(bound, types).run()


def make_total_expressions(roots: Sequence[tuple[str, exp.Expression]], entry, types: TypesOf | None
                           ) -> list[exp.Expression]:
    """The same for row-level expressions that run inside a joined relation (a LEFT JOIN's ON
    condition, the WHERE of a semi-join's subquery): ``roots`` are (where, expression over
    ``entry``'s unqualified columns); returns their total forms, in order."""
    t = _Totalizer(None, types, entry)
    copies = [(where, node.copy()) for where, node in roots]
    arg_types = t._typed(copies)
    return [t.rewrite(node, arg_types) for _, node in copies]


def make_total_templates(bound: BoundQuery, key_types: Sequence[str] | None = None) -> BoundQuery:
    """The same for the post-processing templates (outputs, HAVING, ORDER BY) over released
    values; ``key_types`` are the GROUP BY keys' types."""
    def types(sqls: Sequence[str]) -> list[str]:
        # released aggregates are numbers, keys have the engine's types; anything else is unknown
        # (the conservative total form)
        out = []
        for sql in sqls:
            name = sql.strip('`"')
            if name.startswith("__dp_a"):
                out.append("Float64")
            elif name.startswith("__dp_k") and key_types is not None:
                out.append(key_types[int(name[len("__dp_k"):])])
            else:
                out.append("String")
        return out
    return _Totalizer(bound, types).run_templates()


def rules_table() -> str:
    """FUNCTION_RULES as a Markdown table (docs/CONTROLLER.md)."""
    by_why: dict[tuple[str, str], list[str]] = {}
    for name, rule in FUNCTION_RULES.items():
        by_why.setdefault((rule.kind, rule.why), []).append(name)
    lines = ["| rule | functions | why |", "|---|---|---|"]
    for (kind, why), names in by_why.items():
        lines.append(f"| {kind} | {', '.join(f'`{n}`' for n in names)} | {why} |")
    return "\n".join(lines)


__all__ = ["FUNCTION_RULES", "MAX_GROWTH", "Rule", "make_total", "make_total_templates", "rules_table"]
