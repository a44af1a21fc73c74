"""Stage 2 of the controller: bind a parsed query to its catalog entry.

``bind(parsed, entry) -> BoundQuery``. Resolves columns (table qualifiers, SELECT aliases, GROUP BY
positions), checks every column is registered and every function is on the allow-list, and splits
the query into:

- ``keys``: the GROUP BY expressions (row-level expressions of registered columns);
- ``aggregates``: the DP aggregates, normalised to ``AggCall(func, arg, cond)`` with ``func`` one of
  count, count_distinct_unit, count_distinct (of a non-unit expression), sum, avg, var_samp, var_pop,
  stddev_samp, stddev_pop, quantile, quantiles;
- ``outputs``, ``having`` and ``order``: *templates* over released values only. In a template an
  aggregate is replaced by the column ``__dp_a<i>`` and a group key by ``__dp_k<j>``; any other
  column left in a template is a raw value, which is rejected. So every output column is, by
  construction, a noisy aggregate, a group key, or a function of those and constants
  (post-processing).

Functions are allow-listed (pure, deterministic, reading nothing but their arguments; each one also
has a totality rule in ``dpch.totality.FUNCTION_RULES``, which the next stage enforces): a function
that reads other data (``dictGet``, ``joinGet``, ``file``...), has side effects, draws randomness or
is a DPCH noise/``dp_*`` function is rejected with its name.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from sqlglot import exp

from .catalog import TableEntry, base_type, date_kind
from .errors import QueryRejected
from .function_rules import EXTRACT_UNITS as _EXTRACT_UNITS
from .function_rules import _NODE_NAMES, FUNCTION_RULES, NON_DP_AGGREGATES, func_name
from .parse import ParsedQuery, as_typed
from .sql_ast import sql_of  # noqa: F401 - re-exported: moved to the shared SQL helpers

INTERNAL_PREFIX = "__dp_"
AGG_PREFIX = "__dp_a"
KEY_PREFIX = "__dp_k"

DP_FUNCS = ("count", "count_distinct_unit", "count_distinct", "sum", "avg", "var_samp", "var_pop", "stddev_samp", "stddev_pop",
            "quantile", "quantiles")

# --- scalar functions/operators (sqlglot node classes, by name) --------------------------------
_ALLOWED_NODE_NAMES = """
Add Sub Mul Div IntDiv Mod Neg Paren EQ NEQ GT GTE LT LTE NullSafeEQ NullSafeNEQ And Or Xor Not
Like ILike RegexpLike RegexpILike SimilarTo Is In Between DPipe BitwiseAnd BitwiseOr BitwiseXor BitwiseNot
BitwiseLeftShift BitwiseRightShift Cast TryCast Literal Boolean Null Column Identifier Array Tuple
Interval Var DataType DataTypeParam Abs Sign Round Floor Ceil Trunc Sqrt Cbrt Pow Exp Ln Log Log2 Log10
Least Greatest If Case Coalesce Nullif Lower Upper Length Substring Concat ConcatWs StartsWith EndsWith
Trim TimestampTrunc DateTrunc StrPosition Pi Year Month Day Quarter Week DayOfWeek DayOfMonth DayOfYear
Hour Minute Second CurrentDate CurrentTimestamp CurrentDatetime DateAdd DateSub DateDiff
TimestampAdd TimestampSub TimestampDiff StrToDate StrToTime TimeToStr UnixToTime
TimeToUnix Left Right Reverse Replace Repeat Pad Initcap Bracket Levenshtein Chr Ascii
RegexpExtract RegexpReplace Split ArrayContains ArrayContainsAll ArrayOverlaps ArraySize
Unhex Hex MD5 SHA SHA2 IsNan IsInf Ordered Kwarg Distinct Star Slice
Upper Lower
"""
_ALLOWED_NODES = tuple(c for c in (getattr(exp, n, None) for n in _ALLOWED_NODE_NAMES.split()) if c is not None) \
    + tuple(c for c, n in _NODE_NAMES.items() if FUNCTION_RULES[n].kind != "reject")  # the one rule set's classes

_ALLOWED_ANONYMOUS = set("""
abs sign round roundbankers roundtoexp2 floor ceil ceiling trunc truncate sqrt cbrt pow power exp exp2 exp10
log ln log2 log10 log1p intdiv intdivorzero modulo moduloorzero positivemodulo plus minus multiply divide
negate least greatest e pi isfinite isinfinite isnan gcd lcm sin cos tan asin acos atan
if multiif ifnull nullif coalesce isnull isnotnull isnullable
equals notequals less greater lessorequals greaterorequals and or not xor in notin
has hasany hasall indexof empty notempty length
lower upper lowerutf8 upperutf8 lengthutf8 char_length character_length substring substr substringutf8
concat concatwithseparator startswith endswith trim trimleft trimright trimboth ltrim rtrim position
positioncaseinsensitive positionutf8 locate like notlike ilike notilike match replaceall replaceone replace
replaceregexpall replaceregexpone reverse left right leftpad rightpad lpad rpad splitbychar splitbystring
splitbywhitespace extract tostring tofixedstring
tofloat64 tofloat32 toint8 toint16 toint32 toint64 toint128 toint256 touint8 touint16 touint32 touint64
touint128 touint256 todecimal32 todecimal64 todecimal128 toint64orzero toint32orzero tofloat64orzero
toint64ornull toint32ornull tofloat64ornull tostringornull todate todate32 todatetime todatetime64
todateorzero todateornull todatetimeornull tobool accuratecastornull
toyear tomonth todayofmonth todayofweek todayofyear toquarter tohour tominute tosecond toisoweek toweek
toisoyear toyyyymm toyyyymmdd toyyyymmddhhmmss tostartofday tostartofweek tostartofmonth
tostartofquarter tostartofyear tostartofhour tostartofminute tostartoffiveminutes tostartoffifteenminutes
tostartofinterval tomonday tolastdayofmonth tostartoftenminutes toyearweek tolastdayofweek tostartofisoyear
datediff date_diff dateadd date_add datesub date_sub
adddays addweeks addmonths addyears addhours addminutes addseconds addquarters subtractdays
subtractweeks subtractmonths subtractyears subtracthours subtractminutes subtractseconds today yesterday
now formatdatetime tounixtimestamp fromunixtimestamp date_trunc datetrunc timeslot torelativedaynum
torelativemonthnum torelativeyearnum torelativeweeknum age
array tuple
""".split())

# Aggregates that exist in ClickHouse but have no DP mechanism here (for the error message).
_NON_DP_AGGREGATES = NON_DP_AGGREGATES

_VAR_NAMES = {
    "varsamp": "var_samp", "var_samp": "var_samp", "variance": "var_samp", "variance_samp": "var_samp",
    "varpop": "var_pop", "var_pop": "var_pop", "variance_pop": "var_pop",
    "stddevsamp": "stddev_samp", "stddev_samp": "stddev_samp", "stddev": "stddev_samp",
    "stddevpop": "stddev_pop", "stddev_pop": "stddev_pop", "std": "stddev_pop",
}


# ClickHouse's distinct counts (exact or sketched): answered as the DP distinct count (issue 31)
_DISTINCT_COUNTS = frozenset("uniq uniqexact uniqcombined uniqcombined64 uniqhll12 uniqtheta countdistinct "
                             "approx_count_distinct".split())
# what to write instead of a ClickHouse aggregate that has no DP form here (by name prefix)
_DP_WAYS = (("quantile", "quantile(q)(x) or quantiles(q1, ...)(x)"), ("median", "median(x)"),
            ("arg", "MIN/MAX of the column, or GROUP BY it"), ("any", "GROUP BY the column"),
            ("grouparray", "GROUP BY the column"), ("groupuniqarray", "GROUP BY the column"),
            ("topk", "GROUP BY the column with COUNT(*) and ORDER BY ... LIMIT k"))


def _dp_way(low: str) -> str:
    way = next((w for prefix, w in _DP_WAYS if low.startswith(prefix)), None)
    return f"; the DP way to ask: {way}" if way else ""


def _reject(msg: str) -> QueryRejected:
    return QueryRejected(msg)


def aggregate_refs(template: exp.Expression) -> list[int]:
    """The indices of the aggregates whose placeholders (``__dp_a<i>``) a template uses, in walk
    order."""
    return [int(n.name[len(AGG_PREFIX):]) for n in template.walk()
            if isinstance(n, exp.Column) and n.name.startswith(AGG_PREFIX)]


def _is_dpch_name(name: str) -> bool:
    low = name.lower()
    return low.startswith("dpch_") or low.startswith("dp_")


# ------------------------------------------------------------------------------------------------
# Bound query
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class KeySpec:
    index: int
    expr: exp.Expression  # row-level expression over unqualified registered columns
    columns: tuple[str, ...]
    name: str  # output name when selected as-is (alias or SQL text)
    sql: str  # ClickHouse SQL of expr
    query_sql: str | None = field(default=None, repr=False, compare=False)  # the analyst's text, for messages

    @property
    def placeholder(self) -> str:
        return f"{KEY_PREFIX}{self.index}"

    @property
    def text(self) -> str:
        """The key as the analyst typed it, for messages (computed only when one is raised)."""
        return as_typed(self.expr, self.query_sql)


@dataclass(frozen=True)
class AggCall:
    index: int
    func: str  # one of DP_FUNCS
    arg: exp.Expression | None  # None for COUNT(*) / COUNT(DISTINCT unit)
    cond: exp.Expression | None  # the -If condition (countIf/sumIf/avgIf), row level
    text: str  # normalised SQL of the call as written
    levels: tuple[float, ...] = ()  # quantile levels (quantile: one, quantiles: one or more)

    @property
    def placeholder(self) -> str:
        return f"{AGG_PREFIX}{self.index}"


@dataclass(frozen=True)
class OutputColumn:
    name: str
    template: exp.Expression
    kind: str  # "key" | "aggregate" | "derived" | "constant"
    ref: int | None = None  # key or aggregate index for kind key/aggregate


@dataclass(frozen=True)
class OrderItem:
    template: exp.Expression
    desc: bool
    nulls_first: bool | None


@dataclass(frozen=True)
class BoundQuery:
    parsed: ParsedQuery
    entry: TableEntry
    where: exp.Expression | None
    keys: tuple[KeySpec, ...]
    aggregates: tuple[AggCall, ...]
    outputs: tuple[OutputColumn, ...]
    having: exp.Expression | None
    order: tuple[OrderItem, ...]
    limit: int | None
    offset: int | None
    grouped: bool = field(default=False)

    @property
    def sql(self) -> str:
        return self.parsed.sql


# ------------------------------------------------------------------------------------------------
# Binder
# ------------------------------------------------------------------------------------------------

class _Binder:
    def __init__(self, parsed: ParsedQuery, entry: TableEntry):
        self.parsed = parsed
        self.entry = entry
        self.select = parsed.select
        self.qualifiers = {parsed.table}
        if parsed.alias:
            self.qualifiers.add(parsed.alias)
        if parsed.database:
            self.qualifiers.add(f"{parsed.database}.{parsed.table}")
        self.aggs: list[AggCall] = []
        self.agg_index: dict[str, int] = {}
        self.keys: list[KeySpec] = []
        self.aliases: dict[str, exp.Expression] = {}  # alias -> original select expression (unqualified)
        self.output_templates: dict[str, exp.Expression] = {}  # alias -> its template
        self.shared_sum_bases: set[str] = set()  # see _shifted_sum
        self._sum_shifts: dict[int, tuple] = {}  # id(SUM node) -> (e, c, SQL of e)
        self._shared_refs: dict[str, tuple[int, int]] = {}  # SQL of e -> (SUM(e), COUNT(e)) indices

    # -- columns ------------------------------------------------------------------------------
    def _unqualify(self, node: exp.Expression) -> exp.Expression:
        """Strip table qualifiers, in place (the parse tree is ours; callers copy when needed)."""
        for col in list(node.find_all(exp.Column)):
            table = col.text("table")
            db = col.text("db")
            if table:
                qual = f"{db}.{table}" if db else table
                if qual not in self.qualifiers and table not in self.qualifiers:
                    raise _reject(f"unknown table qualifier {qual!r} in {sql_of(col)}: the query reads only "
                                  f"{self.entry.table}")
                col.set("table", None)
                col.set("db", None)
                col.set("catalog", None)
        return node

    def _check_column(self, name: str) -> None:
        if name.startswith(INTERNAL_PREFIX):
            raise _reject(f"column names starting with {INTERNAL_PREFIX} are reserved by DPCH")
        if name not in self.entry.columns:
            raise _reject(f"column {name!r} is not a registered column of {self.entry.table}; "
                          f"registered: {', '.join(sorted(self.entry.columns))}")

    # -- function allow-list ------------------------------------------------------------------
    def _check_scalar_node(self, node: exp.Expression, where: str) -> None:
        if isinstance(node, exp.Anonymous):
            name = func_name(node)
            if _is_dpch_name(name):
                raise _reject(f"the query calls {name}(...) in {where}: DPCH adds the noise itself; write the "
                              "plain aggregate (COUNT, SUM, AVG, ...) instead of dp_*/dpch_* functions")
            low = name.lower()
            if low in _NON_DP_AGGREGATES or (low.endswith("if") and low[:-2] in _NON_DP_AGGREGATES):
                raise _reject(f"non-DP aggregate {name}(...) in {where}: supported aggregates are COUNT(*), "
                              "COUNT(col), COUNT(DISTINCT <privacy unit>), SUM, AVG, VAR/STDDEV (and countIf, "
                              "sumIf, avgIf)")
            if low not in _ALLOWED_ANONYMOUS:
                raise _reject(f"function {name}() is not supported in {where}: only pure scalar functions "
                              "(arithmetic, comparison, string, date, conditional, type conversion) are allowed")
            return
        if isinstance(node, exp.In):
            if node.args.get("query") is not None or node.args.get("unnest") is not None:
                raise _reject("IN (subquery) is not supported: use a literal list")
            if node.args.get("field") is not None:
                raise _reject("IN <table> is not supported: use a literal list")
            return
        if isinstance(node, _ALLOWED_NODES):
            return
        if isinstance(node, (exp.AggFunc, exp.AnonymousAggFunc, exp.CombinedAggFunc, exp.ParameterizedAgg)):
            raise _reject(f"aggregate {func_name(node)}(...) is not allowed in {where}")
        if isinstance(node, exp.Func):
            name = func_name(node)
            if _is_dpch_name(name):
                raise _reject(f"the query calls {name}(...): DPCH adds the noise itself")
            raise _reject(f"function {name}() is not supported in {where}")
        raise _reject(f"the construct {type(node).__name__} ({sql_of(node)[:60]}) is not supported in {where}")

    def _check_row_expr(self, node: exp.Expression, where: str) -> tuple[str, ...]:
        """A row-level expression (WHERE, GROUP BY key, aggregate argument/condition): registered
        columns, allowed functions, no aggregates. Returns the columns it reads."""
        cols: list[str] = []
        for n in node.walk():
            if isinstance(n, exp.Column):
                if n.text("table"):
                    raise _reject(f"unknown table qualifier in {sql_of(n)}")
                self._check_column(n.name)
                if n.name not in cols:
                    cols.append(n.name)
                continue
            if isinstance(n, exp.Identifier) and isinstance(n.parent, exp.Column):
                continue
            if _is_aggregate(n):
                raise _reject(f"aggregate {func_name(n)}(...) is not allowed in {where}"
                              + ("; use HAVING to filter on aggregates" if where == "WHERE" else ""))
            if isinstance(n, exp.Star):
                raise _reject(f"* is not allowed in {where}")
            if isinstance(n, exp.Distinct):
                raise _reject(f"DISTINCT is not allowed in {where}")
            self._check_scalar_node(n, where)
        return tuple(cols)

    # -- aggregates ---------------------------------------------------------------------------
    def _add_agg(self, func: str, arg, cond, node: exp.Expression, levels: tuple[float, ...] = ()) -> int:
        if arg is not None:
            self._check_row_expr(arg, f"the argument of {sql_of(node)}")
        if cond is not None:
            self._check_row_expr(cond, f"the condition of {sql_of(node)}")
        text = sql_of(node)
        key = f"{func}|{sql_of(arg) if arg is not None else ''}|{sql_of(cond) if cond is not None else ''}|{levels}"
        if key in self.agg_index:
            return self.agg_index[key]
        idx = len(self.aggs)
        self.aggs.append(AggCall(idx, func, arg, cond, text, levels))
        self.agg_index[key] = idx
        return idx

    def _unit_columns(self) -> set[str]:
        """The privacy unit column, and in a joined relation the columns equal to it on every row
        (e.g. c_custkey and o_custkey when customer and orders are joined on them)."""
        unit = self.entry.privacy_unit
        return ({unit} if unit else set()) | set(getattr(self.entry, "unit_aliases", ()))

    def _typed(self, node: exp.Expression) -> str:
        """``node`` as the analyst typed it (for messages; dpch.parse.as_typed)."""
        return as_typed(node, self.parsed.sql)

    def _distinct_count(self, node: exp.Expression, args: list[exp.Expression],
                        cond: exp.Expression | None = None) -> int:
        """COUNT(DISTINCT x) and ClickHouse's uniq, uniqExact, uniqCombined(64), uniqHLL12, uniqTheta,
        countDistinct (issue 31): all the DP distinct count of x (several arguments: of the tuple),
        an exact count plus noise. With a condition (uniqIf(x, c)): the distinct non-NULL values of
        if(c, x, NULL), which the distinct count skips as COUNT(DISTINCT) does."""
        if not args:
            raise _reject(f"{self._typed(node)}: a distinct count takes one expression, e.g. COUNT(DISTINCT x)")
        arg = args[0] if len(args) == 1 else exp.Tuple(expressions=list(args))
        if cond is None and self.entry.privacy_unit is not None and isinstance(arg, exp.Column) \
                and arg.name in self._unit_columns():
            return self._add_agg("count_distinct_unit", None, None, node)
        if cond is not None:  # only fewer values: the per-unit bound of the distinct count still holds
            arg = exp.If(this=cond, true=arg, false=exp.Null())
        # other expressions: each unit's rows are capped, so it adds at most that many values
        return self._add_agg("count_distinct", arg, None, node)

    def _aggregate(self, node: exp.Expression) -> int:
        """Normalise one aggregate call (already unqualified) and register it."""
        if isinstance(node, exp.Count):
            arg = node.this
            if isinstance(arg, exp.Distinct):
                exprs = arg.expressions
                if len(exprs) != 1:
                    raise _reject(f"{self._typed(node)}: COUNT(DISTINCT ...) takes one expression (for several "
                                  "columns write COUNT(DISTINCT (a, b)))")
                return self._distinct_count(node, exprs)
            if node.expressions:
                raise _reject(f"{self._typed(node)}: COUNT takes at most one argument")
            if arg is None or isinstance(arg, exp.Star):
                return self._add_agg("count", None, None, node)
            if isinstance(arg, exp.Literal) or isinstance(arg, exp.Boolean):
                return self._add_agg("count", None, None, node)
            return self._add_agg("count", arg, None, node)
        if isinstance(node, exp.CountIf):
            return self._add_agg("count", None, node.this, node)
        if isinstance(node, exp.Sum):
            if isinstance(node.this, exp.Distinct):
                raise _reject(f"{self._typed(node)}: SUM(DISTINCT ...) is not supported (its sensitivity is "
                              "unbounded); use SUM")
            return self._add_agg("sum", node.this, None, node)
        if isinstance(node, exp.Avg):
            if isinstance(node.this, exp.Distinct):
                raise _reject(f"{self._typed(node)}: AVG(DISTINCT ...) is not supported; use AVG")
            return self._add_agg("avg", node.this, None, node)
        for cls, func in ((exp.Variance, "var_samp"), (getattr(exp, "VariancePop", None), "var_pop"),
                          (exp.Stddev, "stddev_samp"), (getattr(exp, "StddevPop", None), "stddev_pop"),
                          (getattr(exp, "StddevSamp", None), "stddev_samp")):
            if cls is not None and isinstance(node, cls):
                if isinstance(node.this, exp.Distinct):
                    raise _reject(f"{self._typed(node)}: DISTINCT inside a variance is not supported")
                return self._add_agg(func, node.this, None, node)
        quantile = self._quantile(node)
        if quantile is not None:
            func, arg, levels, cond = quantile
            return self._add_agg(func, arg, cond, node, levels)
        name = func_name(node)
        low = name.lower()
        if isinstance(node, exp.ApproxDistinct):  # uniq(a, b) is parsed as uniq(a) with "accuracy" b
            return self._distinct_count(node, [a for a in (node.this, node.args.get("accuracy")) if a is not None])
        if low in _DISTINCT_COUNTS and isinstance(node, (exp.AnonymousAggFunc, exp.Anonymous)):
            return self._distinct_count(node, node.expressions)
        if low in _DISTINCT_COUNTS and isinstance(node, exp.ParameterizedAgg):  # uniqCombined(17)(x)
            return self._distinct_count(node, node.args.get("params") or [])
        if isinstance(node, (exp.AnonymousAggFunc, exp.Anonymous)) and low in _VAR_NAMES:
            args = node.expressions
            if len(args) != 1:
                raise _reject(f"{self._typed(node)}: {name} takes one argument")
            return self._add_agg(_VAR_NAMES[low], args[0], None, node)
        if isinstance(node, exp.CombinedAggFunc):
            args = node.expressions
            if low == "sumif" and len(args) == 2:
                return self._add_agg("sum", args[0], args[1], node)
            if low == "avgif" and len(args) == 2:
                return self._add_agg("avg", args[0], args[1], node)
            if low == "countif" and len(args) == 1:
                return self._add_agg("count", None, args[0], node)
            if low == "countdistinct":
                return self._distinct_count(node, args)
            if low[:-2] in _DISTINCT_COUNTS and low.endswith("if") and len(args) >= 2:
                return self._distinct_count(node, args[:-1], args[-1])
            raise _reject(f"{self._typed(node)}: the aggregate combinator form {name} is not supported (supported: "
                          "countIf, sumIf, avgIf, minIf, maxIf, uniqIf; otherwise put the condition in WHERE)")
        if _is_dpch_name(name):
            raise _reject(f"the query calls {name}(...): DPCH adds the noise itself; write the plain aggregate "
                          "(COUNT, SUM, AVG, ...) instead of dp_*/dpch_* functions")
        typed = self._typed(node)
        name = typed.split("(", 1)[0].strip() or name  # as written (argMax, not sqlglot's arg_max)
        raise _reject(f"non-DP aggregate {name} ({typed}){_dp_way(name.lower())}. Supported: COUNT(*), "
                      "COUNT(col), COUNT(DISTINCT x) (or uniq(x)), SUM, AVG, VAR/STDDEV, median, quantile(q), "
                      "quantiles(q, ...), MIN, MAX, and countIf, sumIf, avgIf, minIf, maxIf, uniqIf")

    def _quantile(self, node: exp.Expression) -> tuple[str, exp.Expression, tuple[float, ...],
                                                       exp.Expression | None] | None:
        """median(x), quantile(q)(x), quantiles(q1, ...)(x), MIN(x) (level 0), MAX(x) (level 1),
        minIf(x, c), maxIf(x, c) as (func, argument, levels, condition), or None for other
        aggregates. Levels must be numeric literals in [0, 1] (they are public: they pick the
        mechanism's score, never a data value)."""
        if isinstance(node, (exp.Min, exp.Max)):
            if isinstance(node.this, exp.Distinct) or node.expressions:
                raise _reject(f"{self._typed(node)}: {'MIN' if isinstance(node, exp.Min) else 'MAX'} takes one "
                              "argument")
            return "quantile", node.this, (0.0 if isinstance(node, exp.Min) else 1.0,), None
        if isinstance(node, exp.CombinedAggFunc) and func_name(node).lower() in ("minif", "maxif") \
                and len(node.expressions) == 2:  # the rows where c holds, as countIf/sumIf do
            x, cond = node.expressions
            return "quantile", x, (0.0 if func_name(node).lower() == "minif" else 1.0,), cond
        if isinstance(node, exp.Quantile):
            return "quantile", node.this, (self._level(node.args.get("quantile"), node),), None
        if isinstance(node, exp.ParameterizedAgg) and func_name(node).lower() in ("quantile", "quantiles"):
            params = node.args.get("params") or []
            if len(params) != 1:
                raise _reject(f"{self._typed(node)}: {func_name(node)}(...)(x) takes one argument x")
            levels = tuple(self._level(v, node) for v in node.expressions)
            if not levels or (func_name(node).lower() == "quantile" and len(levels) != 1):
                raise _reject(f"{self._typed(node)}: give the level(s) as quantile(q)(x) or quantiles(q1, q2, ...)(x)")
            if len(levels) > 100:
                raise _reject(f"{self._typed(node)}: at most 100 quantile levels per call")
            return ("quantile" if func_name(node).lower() == "quantile" else "quantiles"), params[0], levels, None
        if isinstance(node, exp.Anonymous) and func_name(node).lower() == "median":
            if len(node.expressions) != 1:
                raise _reject(f"{self._typed(node)}: median takes one argument")
            return "quantile", node.expressions[0], (0.5,), None
        return None

    def _level(self, level: exp.Expression | None, node: exp.Expression) -> float:
        value = None
        if isinstance(level, exp.Literal) and not level.is_string:
            value = float(level.this)
        if value is None or not (0.0 <= value <= 1.0):
            raise _reject(f"{self._typed(node)}: a quantile level must be a number literal in [0, 1]")
        return value

    # -- shifted sums ---------------------------------------------------------------------------
    def _find_shared_sum_bases(self) -> None:
        """The expressions e summed with two or more constant shifts in this query (SUM(e),
        SUM(e + 1), SUM(e - 2.5), ...; ClickBench Q29 has 90): see _shifted_sum."""
        sel = self.select
        roots = list(sel.expressions) + [sel.args[a] for a in ("having", "order") if sel.args.get(a) is not None]
        shifts: dict[str, set[str]] = {}
        for root in roots:
            for n in root.find_all(exp.Sum):
                base, c = _sum_shift(self._unqualify(n))  # in place, as the templates do
                if base is not None:
                    text = sql_of(base)
                    self._sum_shifts[id(n)] = (base, c, text)
                    shifts.setdefault(text, set()).add(c)
        self.shared_sum_bases = {b for b, cs in shifts.items() if len(cs) >= 2}

    def _shifted_sum(self, node: exp.Expression) -> exp.Expression | None:
        """SUM(e ± c), c a number literal, when e is summed with two or more shifts in the query:
        the template SUM(e) ± c·COUNT(e), over the two shared quantities SUM(e) and COUNT(e)
        instead of one quantity per shift. Exact: Σ(e + c) = Σe + c·#{e not NULL} on the rows
        bounding keeps (clipping e + c to [lo + c, hi + c] is clipping e, then adding c), and a
        function of released values is post-processing (Dwork & Roth Prop. 2.1), so the query
        stays ε-DP with the same charge; its k shifted sums split the budget over 2 quantities
        instead of k (ClickHouse's own optimizer rewrites sum(x + c) the same way)."""
        if not self.shared_sum_bases:
            return None
        base, c, text = self._sum_shifts.get(id(node)) or (*_sum_shift(node), None)
        if base is None or c == "0":
            return None
        text = text or sql_of(base)
        if text not in self.shared_sum_bases:
            return None
        if text not in self._shared_refs:  # one SUM(e) and one COUNT(e) per base
            self._shared_refs[text] = (self._aggregate(exp.Sum(this=base.copy())),
                                       self._aggregate(exp.Count(this=base.copy())))
        i, j = self._shared_refs[text]
        total, count = exp.column(f"{AGG_PREFIX}{i}"), exp.column(f"{AGG_PREFIX}{j}")
        negative = c.startswith("-")
        shift = exp.Mul(this=exp.Literal.number(c.lstrip("-")), expression=count)
        return exp.Paren(this=(exp.Sub if negative else exp.Add)(this=total, expression=shift))

    def _in_column_type(self, node: exp.Expression, placeholder: exp.Expression) -> exp.Expression:
        """MIN/MAX/median/quantile of a bare Date/DateTime column is released on the column's
        numbers (days / seconds since the epoch, bounded by the catalog's dates); the template
        converts the released number back to the column's type (post-processing)."""
        q = self._quantile(node)
        arg = q[1] if q is not None else None
        kind = date_kind(self.entry.columns.get(arg.name, "")) if isinstance(arg, exp.Column) else None
        if kind is None:
            return placeholder
        if q[0] == "quantiles":
            raise _reject(f"{self._typed(node)}: quantiles of a Date/DateTime column are not supported; "
                          "use quantile(q)(col) for each level")
        typ = base_type(self.entry.columns[arg.name])

        def call(name: str, *args: exp.Expression) -> exp.Expression:
            return exp.Anonymous(this=name, expressions=list(args))

        rounded = call("round", placeholder)
        if typ == "Date":
            return call("toDate", call("toUInt16", rounded))
        if typ == "Date32":
            return call("toDate32", call("toInt32", rounded))
        zone = typ[len("DateTime("):-1].strip() if typ.startswith("DateTime(") else None
        tz = [exp.Literal.string(zone.strip("'"))] if zone else []
        return call("toDateTime", call("toUInt32", rounded), *tz)

    # -- templates ----------------------------------------------------------------------------
    def _template(self, node: exp.Expression, where: str, *, use_aliases: bool) -> exp.Expression:
        """Replace aggregates and group keys by placeholders; resolve aliases (HAVING/ORDER BY)."""
        root = self._unqualify(node)
        holder = exp.Paren(this=root)  # so the root itself can be replaced (mutates in place)

        def visit(n: exp.Expression) -> exp.Expression | None:
            if _is_aggregate(n):
                for inner in n.walk():
                    if inner is not n and _is_aggregate(inner):
                        raise _reject(f"nested aggregates ({sql_of(n)}) are not supported")
                shifted = self._shifted_sum(n)
                if shifted is not None:
                    return shifted
                return self._in_column_type(n, exp.column(f"{AGG_PREFIX}{self._aggregate(n)}"))
            for key in self.keys:
                if n == key.expr:
                    return exp.column(key.placeholder)
            if isinstance(n, exp.Column):
                name = n.name
                if name.startswith(INTERNAL_PREFIX):
                    raise _reject(f"column names starting with {INTERNAL_PREFIX} are reserved by DPCH")
                if use_aliases and name in self.output_templates:
                    return self.output_templates[name].copy()
                if use_aliases and name in self.aliases:
                    return self._template(self.aliases[name].copy(), where, use_aliases=False)
                if name in self.entry.columns:
                    raise _reject(f"column {name!r} is used in {where} outside an aggregate but is not a GROUP BY "
                                  f"key: releasing raw values is not differentially private; aggregate it "
                                  f"(e.g. SUM({name})) or add it to GROUP BY")
                raise _reject(f"unknown column {name!r} in {where}")
            return None

        def walk(n: exp.Expression) -> None:
            for child in list(n.iter_expressions()):
                repl = visit(child)
                if repl is not None:
                    child.replace(repl)
                else:
                    walk(child)

        walk(holder)
        out = holder.this
        for n in out.walk():
            if isinstance(n, exp.Column):
                if not n.name.startswith(INTERNAL_PREFIX):  # pragma: no cover - visit() handles all
                    raise _reject(f"raw column {n.name!r} in {where}")
                continue
            if isinstance(n, exp.Identifier) and isinstance(n.parent, exp.Column):
                continue
            self._check_scalar_node(n, where)
        return out

    # -- main ---------------------------------------------------------------------------------
    def bind(self) -> BoundQuery:
        sel = self.select
        _normalise_extract(sel)
        items = list(sel.expressions)
        if not items:
            raise _reject("empty SELECT list")

        # aliases (global in ClickHouse; here: usable in WHERE, GROUP BY, HAVING, ORDER BY)
        for item in items:
            if isinstance(item, exp.Alias):
                alias = item.alias
                if alias.startswith(INTERNAL_PREFIX):
                    raise _reject(f"aliases starting with {INTERNAL_PREFIX} are reserved by DPCH")
                if alias in self.aliases:
                    raise _reject(f"the alias {alias!r} is defined twice")
                self.aliases[alias] = self._unqualify(item.this)

        self._find_shared_sum_bases()

        # GROUP BY keys
        group = sel.args.get("group")
        if group is not None:
            for g in group.expressions:
                self._add_key(g, items)
        grouped = bool(self.keys)

        # WHERE
        where = None
        if sel.args.get("where") is not None:
            where = self._resolve_where(sel.args["where"].this)
            self._check_row_expr(where, "WHERE")

        # SELECT outputs
        outputs: list[OutputColumn] = []
        used_names: set[str] = set()
        for item in items:
            alias = item.alias if isinstance(item, exp.Alias) else None
            body = item.this if isinstance(item, exp.Alias) else item
            name = alias or _default_name(body, self.parsed.sql)
            template = self._template(body, "SELECT", use_aliases=False)
            base = name
            n = 1
            while name in used_names:
                name = f"{base}_{n}"
                n += 1
            used_names.add(name)
            kind, ref = _classify(template)
            outputs.append(OutputColumn(name=name, template=template, kind=kind, ref=ref))
            if alias:
                self.output_templates[alias] = template

        having = None
        if sel.args.get("having") is not None:
            having = self._template(sel.args["having"].this, "HAVING", use_aliases=True)

        order: list[OrderItem] = []
        if sel.args.get("order") is not None:
            for o in sel.args["order"].expressions:
                target = o.this if isinstance(o, exp.Ordered) else o
                if isinstance(target, exp.Literal) and not target.is_string and target.this.isdigit():
                    pos = int(target.this)
                    if not 1 <= pos <= len(outputs):
                        raise _reject(f"ORDER BY position {pos} is out of range")
                    template = outputs[pos - 1].template.copy()
                else:
                    template = self._template(target, "ORDER BY", use_aliases=True)
                desc = bool(o.args.get("desc")) if isinstance(o, exp.Ordered) else False
                nulls_first = o.args.get("nulls_first") if isinstance(o, exp.Ordered) else None
                order.append(OrderItem(template, desc, nulls_first))

        limit = offset = None
        if sel.args.get("limit") is not None:
            limit = int(sel.args["limit"].args["expression"].this)
        if sel.args.get("offset") is not None:
            offset = int(sel.args["offset"].args["expression"].this)

        if not self.aggs and not grouped:
            raise _reject("the query has no aggregate and no GROUP BY: DPCH answers aggregate queries "
                          "(COUNT, SUM, AVG, VAR/STDDEV); selecting rows is not differentially private")
        for key in self.keys:
            held = self._unit_columns() & set(key.columns)
            if held:
                raise _reject(f"GROUP BY {key.sql}: grouping by the privacy unit ({min(held)}) would release "
                              "per-unit values")

        return BoundQuery(parsed=self.parsed, entry=self.entry, where=where, keys=tuple(self.keys),
                          aggregates=tuple(self.aggs), outputs=tuple(outputs), having=having,
                          order=tuple(order), limit=limit, offset=offset, grouped=grouped)

    def _resolve_where(self, node: exp.Expression) -> exp.Expression:
        node = self._unqualify(node)
        holder = exp.Paren(this=node)
        for col in list(holder.find_all(exp.Column)):
            name = col.name
            if name not in self.entry.columns and name in self.aliases:
                target = self.aliases[name]
                if any(_is_aggregate(n) for n in target.walk()):
                    raise _reject(f"WHERE refers to {name!r}, an aggregate: use HAVING to filter on aggregates")
                col.replace(target.copy())
        return holder.this

    def _add_key(self, g: exp.Expression, items: list[exp.Expression]) -> None:
        target = g
        name = None
        names_item = True  # a position or an alias: the key is a SELECT item
        if isinstance(g, exp.Literal) and not g.is_string and g.this.isdigit():
            pos = int(g.this)
            if not 1 <= pos <= len(items):
                raise _reject(f"GROUP BY position {pos} is out of range")
            item = items[pos - 1]
            target = (item.this if isinstance(item, exp.Alias) else item).copy()
            name = item.alias if isinstance(item, exp.Alias) else None
        elif isinstance(g, exp.Literal):
            raise _reject("GROUP BY a constant is not supported")
        elif isinstance(g, exp.Column) and not g.text("table") and g.name not in self.entry.columns \
                and g.name in self.aliases:
            name = g.name
            target = self.aliases[g.name].copy()
        else:
            names_item = False
        target = self._unqualify(target)
        if any(_is_aggregate(n) for n in target.walk()):
            raise _reject(f"GROUP BY {self._typed(target)}: grouping by an aggregate is not supported")
        cols = self._check_row_expr(target, "GROUP BY")
        if not cols and names_item:
            # a position or alias naming a constant SELECT item (ClickBench's `SELECT 1, URL, ...
            # GROUP BY 1, URL`): one value on every row splits no group, so the key is dropped and
            # the item stays a constant output. All keys constant = no GROUP BY: one row, released
            # whatever the data (a constant group could otherwise be absent on an empty table).
            return
        if not cols:
            raise _reject(f"GROUP BY {self._typed(target)}: a key must depend on a column")
        for existing in self.keys:
            if existing.expr == target:
                return
        if name is None:
            for item in items:
                if isinstance(item, exp.Alias) and self._unqualify(item.this) == target:
                    name = item.alias
                    break
        self.keys.append(KeySpec(index=len(self.keys), expr=target, columns=cols,
                                 name=name or _default_name(target, self.parsed.sql), sql=sql_of(target),
                                 query_sql=self.parsed.sql))


def _is_aggregate(node: exp.Expression) -> bool:
    if isinstance(node, (exp.AggFunc, exp.AnonymousAggFunc, exp.CombinedAggFunc, exp.ParameterizedAgg)):
        return True
    if isinstance(node, exp.Anonymous):
        low = func_name(node).lower()
        return low in _VAR_NAMES or low in _NON_DP_AGGREGATES or low in ("count", "sum", "avg")
    return False


# EXTRACT(<unit> FROM t) as the ClickHouse date-part function it means (ClickBench Q18's key
# `extract(minute FROM EventTime)`); other units are left for the allow-list to reject.


def _normalise_extract(select: exp.Expression) -> None:
    """Replace EXTRACT(YEAR|QUARTER|MONTH|DAY|HOUR|MINUTE|SECOND FROM t) by toYear(t), ...,
    toSecond(t), in place: the same value, and functions the totality rules already cover."""
    for node in list(select.find_all(exp.Extract)):
        unit = node.this
        name = _EXTRACT_UNITS.get(unit.name.upper()) if isinstance(unit, (exp.Var, exp.Column)) else None
        if name is not None and node.expression is not None:
            node.replace(exp.Anonymous(this=name, expressions=[node.expression]))


def _sum_shift(node: exp.Sum) -> tuple[exp.Expression | None, str]:
    """(e, c) for SUM(e + c), SUM(c + e), SUM(e - c) with c a number literal (c as text, "-…"
    when subtracted); (e, "0") for another SUM(e); (None, "") for SUM(DISTINCT …)."""
    arg = node.this
    if isinstance(arg, exp.Distinct) or arg is None:
        return None, ""

    def number(n: exp.Expression) -> str | None:
        return n.this if isinstance(n, exp.Literal) and not n.is_string else None

    def bare(n: exp.Expression) -> exp.Expression:
        while isinstance(n, exp.Paren):
            n = n.this
        return n

    arg = bare(arg)
    if isinstance(arg, exp.Add):
        if number(arg.expression) is not None:
            return bare(arg.this), number(arg.expression)
        if number(arg.this) is not None:
            return bare(arg.expression), number(arg.this)
    if isinstance(arg, exp.Sub) and number(arg.expression) is not None:
        return bare(arg.this), "-" + number(arg.expression)
    return arg, "0"


def _default_name(node: exp.Expression, sql: str | None = None) -> str:
    """The output name of an unaliased item: its ClickHouse SQL, or the text as typed where the
    parser renamed a function (toStartOfMonth(d), not dateTrunc('MONTH', d); issue 31)."""
    if isinstance(node, exp.Column):
        return node.name
    rendered = sql_of(node)
    low = rendered.lower()
    if any(n.meta.get("clickhouse_name", "").lower() not in low for n in node.walk()):
        return as_typed(node, sql)
    return rendered


def _classify(template: exp.Expression) -> tuple[str, int | None]:
    if isinstance(template, exp.Column):
        name = template.name
        if name.startswith(AGG_PREFIX):
            return "aggregate", int(name[len(AGG_PREFIX):])
        if name.startswith(KEY_PREFIX):
            return "key", int(name[len(KEY_PREFIX):])
    has_ref = any(isinstance(n, exp.Column) for n in template.walk())
    return ("derived" if has_ref else "constant"), None


def bind(parsed: ParsedQuery, entry: TableEntry) -> BoundQuery:
    """Bind ``parsed`` to ``entry`` (see the module docstring). Raises QueryRejected."""
    return _Binder(parsed, entry).bind()
