"""One rule set for every expression (DESIGN.md invariant 10): which functions a query may call,
wherever they stand.

``check_functions(tree)`` walks the WHOLE analyst statement before anything else happens (the outer
query, subqueries in FROM, CTEs, ``IN (SELECT …)`` / ``EXISTS`` subqueries over public or protected
tables, per-unit subqueries, HAVING, and the SQL that the JSON routes build from their fields, all of
which reach the controller through ``dpch.parse``). Every function must be

- on ``FUNCTION_RULES`` (scalar functions; the totality stage, dpch.totality, then applies each
  rule's kind where rows are private), or
- an aggregate that DPCH knows (the later stages accept only the DP aggregates, and say so);

and a function that reads state outside the query's catalogued tables (files, URLs, other servers,
settings, dictionaries, ``joinGet``, introspection, the server's identity, randomness, sleeping,
throwing) is refused by name (``STATE_READERS``). So nothing the analyst writes can make the engine
read a file or a setting while it analyses the query (constant folding happens before any charge),
and a refusal depends only on the query text. The engine is confined as well (dpch.confine), so a
function that slipped past this list would still read nothing.

This is the bottom layer of the query stages: it imports only sqlglot and the errors.
"""
from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from .errors import QueryRejected


def func_name(node: exp.Expression) -> str:
    """The function name as written (best effort) for messages."""
    if isinstance(node, (exp.Anonymous, exp.AnonymousAggFunc, exp.CombinedAggFunc)):
        return str(node.this) if not isinstance(node.this, exp.Expression) else node.this.name
    if isinstance(node, exp.ParameterizedAgg):
        return str(node.this)
    if isinstance(node, exp.Func):  # the name as typed when the parser kept it (uniq, not approx_distinct)
        return node.meta.get("clickhouse_name") or node.sql_name().lower()
    return type(node).__name__


@dataclass(frozen=True)
class Rule:
    kind: str  # "total" | "rewrite" | "constant" | "reject"
    why: str


def _rules(kind: str, names: str, why: str) -> dict[str, Rule]:
    return {n: Rule(kind, why) for n in names.split()}


# By lower-case ClickHouse name (sqlglot node classes are mapped to these names by _name()).
FUNCTION_RULES: dict[str, Rule] = {
    **_rules("total", "plus minus multiply negate abs sign least greatest",
             "integer arithmetic wraps, float arithmetic gives ±inf/NaN; never throws"),
    **_rules("total", "divide", "float division (x/0 = ±inf or NaN); Decimal operands are converted to Float64 first"),
    **_rules("total", "round roundbankers roundtoexp2 floor ceil ceiling trunc truncate",
             "rounding; the number of digits must be a constant"),
    **_rules("total", "sqrt cbrt pow power exp exp2 exp10 log ln log2 log10 log1p sin cos tan asin acos atan "
                      "pi e isfinite isinfinite isnan moduloorzero",
             "floating-point math returns NaN/inf outside its domain; the -OrZero forms return 0"),
    **_rules("total", "equals notequals less greater lessorequals greaterorequals and or not xor in notin "
                      "isnull isnotnull isnullable if multiif ifnull nullif coalesce case between is",
             "comparisons, logic and conditionals: types are checked before the query runs"),
    **_rules("total", "bitand bitor bitxor bitnot", "bitwise operations on integers"),
    **_rules("total", "length lengthutf8 char_length character_length empty notempty lower upper lowerutf8 "
                      "upperutf8 reverse trim trimleft trimright trimboth ltrim rtrim concat concatwithseparator "
                      "dpipe startswith endswith position positioncaseinsensitive positionutf8 locate tostring "
                      "hex unhex md5 sha sha2 initcap ascii chr splitbywhitespace",
             "string functions whose output is at most their input (or a constant) in size"),
    **_rules("total", "has hasany hasall indexof array tuple", "array membership over literal arrays"),
    **_rules("total", "toyear tomonth todayofmonth todayofweek todayofyear toquarter tohour tominute tosecond "
                      "toisoweek toisoyear toyyyymm toyyyymmdd toyyyymmddhhmmss tostartofday tostartofmonth "
                      "tostartofquarter tostartofyear tostartofhour tostartofminute tostartoffiveminutes "
                      "tostartoffifteenminutes tomonday tolastdayofmonth timeslot torelativedaynum "
                      "torelativemonthnum torelativeyearnum torelativeweeknum adddays addweeks addmonths "
                      "addyears addhours addminutes addseconds addquarters subtractdays subtractweeks "
                      "subtractmonths subtractyears subtracthours subtractminutes subtractseconds today "
                      "yesterday now fromunixtimestamp tostartoftenminutes toyearweek tolastdayofweek "
                      "tostartofisoyear monthname",
             "date parts and date arithmetic on Date/DateTime values (wrap around, never throw)"),
    **_rules("total", "toint64orzero toint32orzero tofloat64orzero toint64ornull toint32ornull tofloat64ornull "
                      "tostringornull todateorzero todateornull todatetimeornull accuratecastornull",
             "the -OrZero/-OrNull conversions never throw"),
    **_rules("rewrite", "intdiv intdivorzero",
             "intDiv throws on a zero divisor, on INT_MIN / -1 and (intDivOrZero too) on a float quotient outside "
             "its result type (Int32 for a Float32) or an infinite divisor: becomes intDivOrZero(if(ok, a, 0), "
             "if(ok, b, 1)) with ok = isFinite(a) AND isFinite(b) AND abs(a / b) < the limit of the result type "
             "(4.6e18 for Int64)"),
    **_rules("rewrite", "modulo mod", "% throws on a zero divisor: becomes moduloOrZero"),
    **_rules("rewrite", "cast toint8 toint16 toint32 toint64 toint128 toint256 touint8 touint16 touint32 touint64 "
                        "touint128 touint256 tofloat32 tofloat64 todate todate32 todatetime tobool "
                        "tounixtimestamp",
             "a conversion of a String (parse) or to an Enum/UUID/Bool can throw on a value: becomes "
             "accurateCastOrNull(x, 'T'); a float NaN/inf to an integer or a date throws: only finite values are "
             "converted (NULL otherwise); other numeric conversions wrap and are total as they are"),
    **_rules("rewrite", "todecimal32 todecimal64 todecimal128 todecimal256",
             "Decimal conversion and arithmetic throw on overflow and on division by zero: computed in Float64, "
             "truncated to the scale"),
    **_rules("constant", "substring substr substringutf8 left right",
             "offset and length must be integer constants (a huge value computed from data throws)"),
    **_rules("constant", "leftpad rightpad lpad rpad pad",
             "the length must be a constant ≤ 10000 and the fill a constant string (output size)"),
    **_rules("constant", "like notlike ilike notilike match regexplike regexpilike extract replaceregexpall "
                         "replaceregexpone regexpextract regexpreplace similarto",
             "the pattern must be a constant string (a pattern compiled from data can fail or be slow)"),
    **_rules("constant", "replace replaceall replaceone",
             "needle and replacement must be constants (output size)"),
    **_rules("constant", "splitbychar splitbystring split", "the separator must be a constant"),
    **_rules("constant", "formatdatetime timetostr", "the format must be a constant string"),
    **_rules("constant", "datediff date_diff age dateadd date_add datesub date_sub datetrunc date_trunc "
                         "timestamptrunc timestampadd timestampsub timestampdiff tostartofinterval interval "
                         "toweek tostartofweek",
             "the unit (or week mode, or interval) must be a constant; a column cannot be a unit"),
    **_rules("constant", "bitshiftleft bitshiftright", "the shift must be a constant ≥ 0 (a negative one throws)"),
    **_rules("reject", "repeat", "its output size is the product of two inputs, so it can grow past the engine's "
                                 "limit for one unit's rows"),
    **_rules("reject", "tofixedstring", "it throws on a string longer than N; use substring(s, 1, N)"),
    **_rules("reject", "levenshtein editdistance levenshteindistance damerauLevenshteinDistance",
             "quadratic cost in the strings' lengths (a timing channel) and a length limit that throws"),
    **_rules("reject", "bracket arrayelement slice", "array subscripts throw on index 0; use has()/indexOf()"),
    **_rules("reject", "gcd lcm positivemodulo", "they throw on some values (INT_MIN, zero)"),
    **_rules("reject", "todatetime64", "DateTime64 is a Decimal: its arithmetic throws on overflow; use toDateTime"),
    **_rules("reject", "strtodate strtotime parsedatetime", "parsing throws on malformed text; use toDateOrNull"),
}


_STRUCTURAL = (exp.Paren, exp.Literal, exp.Boolean, exp.Null, exp.Column, exp.Identifier, exp.Var, exp.DataType,
               exp.DataTypeParam, exp.Ordered, exp.Kwarg, exp.Distinct, exp.Star, exp.Tuple, exp.Array)

# sqlglot node classes → the ClickHouse function they stand for (the rule name)
_CLASS_NAMES = {
    "Add": "plus", "Sub": "minus", "Mul": "multiply", "Div": "divide", "Neg": "negate", "IntDiv": "intdiv",
    "Mod": "modulo", "EQ": "equals", "NEQ": "notequals", "GT": "greater", "GTE": "greaterorequals", "LT": "less",
    "LTE": "lessorequals", "NullSafeEQ": "equals", "NullSafeNEQ": "notequals", "And": "and", "Or": "or",
    "Xor": "xor", "Not": "not", "Like": "like", "ILike": "ilike", "RegexpLike": "match", "RegexpILike": "regexpilike",
    "SimilarTo": "similarto", "Is": "is", "In": "in", "Between": "between", "DPipe": "dpipe", "BitwiseAnd": "bitand",
    "BitwiseOr": "bitor", "BitwiseXor": "bitxor", "BitwiseNot": "bitnot", "BitwiseLeftShift": "bitshiftleft",
    "BitwiseRightShift": "bitshiftright", "Cast": "cast", "TryCast": "cast", "Interval": "interval",
    "Abs": "abs", "Sign": "sign", "Round": "round", "Floor": "floor", "Ceil": "ceil", "Trunc": "trunc",
    "Sqrt": "sqrt", "Cbrt": "cbrt", "Pow": "pow", "Exp": "exp", "Ln": "ln", "Log": "log", "Least": "least",
    "Greatest": "greatest", "If": "if", "Case": "case", "Coalesce": "coalesce", "Nullif": "nullif",
    "Lower": "lower", "Upper": "upper", "Length": "length", "Substring": "substring", "Concat": "concat",
    "ConcatWs": "concatwithseparator", "StartsWith": "startswith", "EndsWith": "endswith", "Trim": "trim",
    "TimestampTrunc": "timestamptrunc", "DateTrunc": "datetrunc", "StrPosition": "position", "Pi": "pi",
    "Year": "toyear", "Month": "tomonth", "Day": "todayofmonth", "Quarter": "toquarter", "Week": "toweek",
    "DayOfWeek": "todayofweek", "DayOfMonth": "todayofmonth", "DayOfYear": "todayofyear", "Hour": "tohour",
    "Minute": "tominute", "Second": "tosecond", "CurrentDate": "today", "CurrentTimestamp": "now",
    "CurrentDatetime": "now", "DateAdd": "dateadd", "DateSub": "datesub", "DateDiff": "datediff",
    "TimestampAdd": "timestampadd", "TimestampSub": "timestampsub", "TimestampDiff": "timestampdiff",
    "StrToDate": "strtodate", "StrToTime": "strtotime", "TimeToStr": "formatdatetime",
    "UnixToTime": "fromunixtimestamp", "TimeToUnix": "tounixtimestamp", "Left": "left", "Right": "right",
    "Reverse": "reverse", "Replace": "replace", "Repeat": "repeat", "Pad": "pad", "Initcap": "initcap",
    "Bracket": "bracket", "Levenshtein": "levenshtein", "Chr": "chr", "Ascii": "ascii",
    "RegexpExtract": "regexpextract", "RegexpReplace": "regexpreplace", "Split": "split",
    "ArrayContains": "has", "ArrayContainsAll": "hasall", "ArrayOverlaps": "hasany", "ArraySize": "length",
    "Unhex": "unhex", "Hex": "hex", "MD5": "md5", "SHA": "sha", "SHA2": "sha2", "IsNan": "isnan", "IsInf": "isinfinite",
    "Slice": "slice", "DayOfWeekIso": "todayofweek", "WeekOfYear": "toisoweek", "YearOfWeekIso": "toisoyear",
    "Monthname": "monthname",
}
_NODE_NAMES = {getattr(exp, c): n for c, n in _CLASS_NAMES.items() if getattr(exp, c, None) is not None}


def rule_name(node: exp.Expression) -> str:
    """The rule name of a node: the ClickHouse function it stands for, lower case ("" for the
    structural nodes: literals, columns, parentheses, types, array/tuple literals)."""
    if isinstance(node, (exp.Anonymous, exp.AnonymousAggFunc, exp.CombinedAggFunc)):
        return func_name(node).lower()
    name = _NODE_NAMES.get(type(node))
    if name is not None:
        return name
    if isinstance(node, _STRUCTURAL):
        return ""
    return f"<{type(node).__name__}>"



# Refused by name everywhere: they read state outside the query's catalogued tables, or make the
# outcome depend on something other than the rows (time, randomness, the server, a throw).
STATE_READERS = frozenset("""
file url s3 s3cluster gcs hdfs hdfscluster azureblobstorage azureblobstoragecluster remote remotesecure cluster
clusterallreplicas input mysql postgresql jdbc odbc mongodb redis sqlite executable iceberg deltalake hudi merge
numbers zeros generaterandom view viewifpermitted loop fuzzjson fuzzquery
throwif sleep sleepeachrow getsetting getsettingordefault getmergetreesetting getserversetting getclientsetting
hascolumnintable hasthreadfuzzer joinget joingetornull dicthas dictisin dictgethierarchy dictgetchildren
dictgetdescendants currentprofiles enabledprofiles defaultprofiles currentroles enabledroles defaultroles
currentuser user current_user currentdatabase database current_database currentschemas current_schemas
hostname hostname fqdn version uptime timezone servertimezone timezoneof getmacro getserverport tcpport
serveruuid buildid displayname getoskernelversion getclienthttpheader filesystemavailable filesystemfree
filesystemcapacity filesystemunreserved addresstoline addresstolinewithinlines addresstosymbol demangle trap
rownumberinblock rownumberinallblocks blocknumber blocksize blockserializedsize runningdifference
runningdifferencestartingwithfirstvalue runningaccumulate neighbor queryid initialqueryid
initialquerystarttime querystarttime transactionid transactionlatestsnapshot transactionoldestsnapshot
zookeepersessionuptime globalvariable catboostevaluate modelevaluate connectionid connection_id
shardnum shardcount istemporarytable partitionid ignore identity materialize tolowcardinality
randomstring randomfixedstring randomprintableascii randomstringutf8 fakedata generateuuidv4 generateuuidv7
generatesnowflakeid generateulid rand rand32 rand64 randconstant canonicalrand randuniform randnormal
randlognormal randexponential randchisquared randstudentt randfisherf randbernoulli randbinomial
randnegativebinomial randpoisson nowinblock now64 errorcodetoname getsubcolumn __getscalar __bitswaptohex
""".split())
_STATE_PREFIXES = ("dictget", "rand", "filesystem", "sleep", "getsetting", "addressto", "transaction", "zookeeper",
                   "initialquery", "s3", "hdfs", "azureblob", "iceberg", "deltalake", "url", "remote", "file",
                   "mysql", "postgres", "odbc", "jdbc", "mongo", "redis", "generateuuid", "__")

# Aggregates known to DPCH: the DP ones and their -If forms, and the ClickHouse aggregates the binding
# stage refuses with a message that names the DP alternative (dpch.bind).
DP_AGGREGATES = frozenset("""
count sum avg min max median quantile quantiles countif sumif avgif minif maxif
varsamp var_samp variance variance_samp varpop var_pop variance_pop stddevsamp stddev_samp stddev stddevpop
stddev_pop std countdistinct
""".split())
NON_DP_AGGREGATES = frozenset("""
min max any anylast anyheavy argmin argmax uniq uniqexact uniqcombined uniqcombined64 uniqhll12
uniqtheta grouparray grouparraysorted grouparraysample groupuniqarray grouparrayinsertat
groupbitand groupbitor groupbitxor groupbitmap quantile quantiles quantileexact quantiletdigest
quantiletiming quantiledeterministic quantilesexact quantilestdigest median medianexact topk topkweighted
summap minmap maxmap sumwithoverflow sumkahan avgweighted corr covarpop covarsamp skewpop skewsamp
kurtpop kurtsamp entropy first_value last_value histogram simplelinearregression
stochasticlinearregression mannwhitneyutest studentttest welchttest boundingratio rankcorr
sequencematch sequencecount windowfunnel retention maxintersections grouparraymovingsum
grouparraymovingavg deltasum categoricalinformationvalue contingency cramersv theilsu
array_agg arrayagg string_agg group_concat listagg approx_count_distinct approx_distinct
approx_quantile percentile_cont percentile_disc mode bool_and bool_or every some
""".split())
# EXTRACT(<unit> FROM t): the ClickHouse date-part function it means (dpch.bind rewrites it so);
# other units are refused
EXTRACT_UNITS = {"YEAR": "toYear", "QUARTER": "toQuarter", "MONTH": "toMonth", "DAY": "toDayOfMonth",
                 "HOUR": "toHour", "MINUTE": "toMinute", "SECOND": "toSecond"}
_AGG_NODES = (exp.AggFunc, exp.AnonymousAggFunc, exp.CombinedAggFunc, exp.ParameterizedAgg)
_FUNC_NODES = (exp.Func, exp.Anonymous) + _AGG_NODES


_COMBINATORS = ("if", "distinct", "ornull", "ordefault", "state", "merge", "array", "foreach", "resample", "map",
                "simplestate", "argmin", "argmax")


def _known_aggregate(name: str) -> bool:
    """An aggregate DPCH knows, with any ClickHouse combinator suffixes (sumDistinct, countIfOrNull):
    the binding stage accepts the DP ones and names the alternative for the others."""
    while True:
        if name in DP_AGGREGATES or name in NON_DP_AGGREGATES:
            return True
        suffix = next((c for c in _COMBINATORS if name.endswith(c) and len(name) > len(c)), None)
        if suffix is None:
            return False
        name = name[: -len(suffix)]


def reads_state(name: str) -> bool:
    """True for a function (lower-case name) that reads state outside the query's tables."""
    low = name.lower()
    return low in STATE_READERS or low.startswith(_STATE_PREFIXES)


def _refuse_state(name: str) -> QueryRejected:
    return QueryRejected(f"function {name} is not on the list of functions DPCH accepts: it reads state outside the query's catalogued tables (files, URLs, settings, "
                         "dictionaries, other tables, the server) or depends on something other than the rows; it is "
                         "refused everywhere in a query (outer query, subqueries, CTEs, IN/EXISTS, HAVING); nothing ran "
                         "and nothing was charged")


def check_functions(tree: exp.Expression) -> None:
    """Refuse any function in ``tree`` (the whole statement, every subquery) that is neither on
    ``FUNCTION_RULES`` nor a known aggregate, and every state reader by name. Reads nothing, so a
    refusal depends on the query text only. Raises QueryRejected."""
    for node in tree.walk():
        if isinstance(node, (exp.Placeholder, exp.Parameter)):
            raise QueryRejected("query parameters/placeholders are not supported: write literal values")
        if isinstance(node, exp.Table) and not isinstance(node.this, exp.Identifier):
            raise QueryRejected(f"table functions ({func_name(node.this)}(...)) are not allowed anywhere in a query: "
                                "query a catalogued table")
        if not isinstance(node, _FUNC_NODES) or isinstance(node, exp.Exists):  # EXISTS: dpch.relation judges it
            continue
        if isinstance(node, exp.Extract) and isinstance(node.this, (exp.Var, exp.Column)) \
                and node.this.name.upper() in EXTRACT_UNITS:
            continue  # a date part (its argument is walked like any other)
        written = func_name(node)
        name = rule_name(node)
        for candidate in (written.lower(), name):
            if reads_state(candidate.strip("<>")):
                raise _refuse_state(written.lower())
        if isinstance(node, (exp.Anonymous, exp.AnonymousAggFunc, exp.CombinedAggFunc, exp.ParameterizedAgg)):
            low = written.lower()
            if low in FUNCTION_RULES or _known_aggregate(low) \
                    or low.startswith(("dp_", "dpch_")):  # dp_* calls: the dp_functions path and bind judge them
                continue
        elif isinstance(node, exp.AggFunc) or name == "" or name in FUNCTION_RULES:  # "": array/tuple literals
            continue
        raise QueryRejected(f"function {written.lower()} is not on the list of functions DPCH accepts (docs/CONTROLLER.md, "
                            "\"Totality\"); the same list applies everywhere in a query (outer query, subqueries, "
                            "CTEs, IN/EXISTS, HAVING); nothing ran and nothing was charged")
