"""Property test of invariant 7 (issue 11): a query the controller accepts never fails at run time.

Random row-level expressions are built from the allowed functions over columns holding extreme
values (INT64_MIN/MAX, NaN, ±inf, unparsable strings, NULLs, Decimal extremes, the Date range
ends); each goes into WHERE, a countIf condition and a GROUP BY key. Each query must either be
rejected before the charge (QueryRejected / InvalidParameter, ledger unchanged), or run and be
charged. An accepted query that then fails would be an oracle (its failure depends on the rows).
The examples are derandomized: the same expressions every run, so the test is deterministic.
`make test` runs 80 examples (240 queries); `make test-long` (DPCH_LONG=1) the full 250. Each example
checks the whole property on its own (three queries, each rejected uncharged or run and charged).
"""
from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpch.errors import InvalidParameter, QueryRejected
from test_totality import DB, tdb  # noqa: F401  (the extreme-values table fixture)

NUM_LEAVES = ["qty", "amount", "user_id", "flag", "price", "0", "-1", "2", "toUInt64(18446744073709551615)", "-0.", "inf", "9223372036854775807", "(-9223372036854775807 - 1)",
              "0.5", "1e308", "-1e-300", "nan"]
STR_LEAVES = ["name", "nname", "'abc'", "''", "'2024-01-01'", "'12'", "toString(kind)", "'1e400'", "'-0x10'"]
DATE_LEAVES = ["day", "ts", "today()"]


def _num(children):
    num, strs, dates, conds = children
    return st.one_of(
        st.builds(lambda a, b, op: f"({a} {op} {b})", num, num, st.sampled_from(["+", "-", "*", "/", "%"])),
        st.builds(lambda f, a, b: f"{f}({a}, {b})", st.sampled_from(["intDiv", "intDivOrZero", "least", "greatest",
                                                                   "moduloOrZero", "pow"]), num, num),
        st.builds(lambda f, a: f"{f}({a})", st.sampled_from(["abs", "sqrt", "log", "exp", "toInt64", "toUInt8",
                                                            "toFloat64", "toInt32", "negate", "sign", "floor"]), num),
        st.builds(lambda a: f"toDecimal64({a}, 4)", num),
        st.builds(lambda a, t: f"CAST({a} AS {t})", num, st.sampled_from(["Int8", "UInt64", "Float32", "Int64"])),
        st.builds(lambda f, s: f"{f}({s})", st.sampled_from(["toInt64", "toFloat64", "toUInt32", "length",
                                                            "toUnixTimestamp"]), strs),
        st.builds(lambda s: f"position({s}, 'a')", strs),
        st.builds(lambda f, d: f"{f}({d})", st.sampled_from(["toYear", "toDayOfMonth", "toUnixTimestamp"]), dates),
        st.builds(lambda d1, d2: f"dateDiff('day', {d1}, {d2})", dates, dates),
        st.builds(lambda c, a, b: f"if({c}, {a}, {b})", conds, num, num),
        st.builds(lambda c, a, b: f"multiIf({c}, {a}, {b})", conds, num, num),
        st.builds(lambda a: f"round({a}, 2)", num),
        st.builds(lambda f, a: f"{f}({a})", st.sampled_from(["cbrt", "exp2", "log2", "ceil", "trunc", "roundBankers",
                                                            "toFloat32", "toUInt16", "toInt16", "toDate32"]), num),
        st.builds(lambda a, b: f"intDivOrZero({a}, {b})", num, num),
        st.builds(lambda s: f"toInt64OrZero({s})", strs),
        st.builds(lambda s: f"indexOf(['a', 'b'], {s})", strs),
        st.builds(lambda s, t: f"positionCaseInsensitive({s}, {t})", strs, strs),
        st.builds(lambda d: f"toRelativeDayNum({d})", dates),
        st.builds(lambda d: f"toYYYYMM({d})", dates),
        st.builds(lambda s: f"CAST({s} AS UUID) IS NULL", strs),
        st.builds(lambda a: f"toDecimal32({a}, 2)", num),
        st.builds(lambda a, b: f"({a} / {b})", num, num),
        st.builds(lambda a: f"CAST({a} AS Decimal(10, 2))", num),
        st.builds(lambda s: f"lengthUTF8({s})", strs),
        st.builds(lambda s: f"extract({s}, '[0-9]+') = ''", strs),
    )


def _str(children):
    num, strs, dates, conds = children
    return st.one_of(
        st.builds(lambda f, s: f"{f}({s})", st.sampled_from(["lower", "upper", "reverse", "trim", "hex"]), strs),
        st.builds(lambda a, b: f"concat({a}, {b})", strs, strs),
        st.builds(lambda s: f"substring({s}, 2, 3)", strs),
        st.builds(lambda s: f"leftPad({s}, 5, '*')", strs),
        st.builds(lambda s: f"replaceAll({s}, 'a', 'bb')", strs),
        st.builds(lambda a: f"toString({a})", num),
        st.builds(lambda d: f"formatDateTime({d}, '%Y-%m')", dates),
        st.builds(lambda c, a, b: f"if({c}, {a}, {b})", conds, strs, strs),
        st.builds(lambda s: f"replaceRegexpAll({s}, '[0-9]', 'x')", strs),
        st.builds(lambda s: f"rightPad({s}, 3, 'z')", strs),
        st.builds(lambda s: f"left({s}, 2)", strs),
        st.builds(lambda a: f"toString(toDecimal64({a}, 2))", num),
        st.builds(lambda d: f"toString({d})", dates),
        st.builds(lambda s: f"coalesce({s}, 'x')", strs),
        st.builds(lambda s: f"nullIf({s}, '')", strs),
        st.builds(lambda s: f"concatWithSeparator('-', {s}, {s})", strs),
        st.builds(lambda s: f"upperUTF8({s})", strs),
        st.builds(lambda s: f"unhex({s})", strs),
    )


def _date(children):
    num, strs, dates, conds = children
    return st.one_of(
        st.builds(lambda s: f"toDate({s})", strs),
        st.builds(lambda d, a: f"addDays({d}, {a})", dates, num),
        st.builds(lambda d: f"toStartOfMonth({d})", dates),
        st.builds(lambda d: f"({d} + INTERVAL 1 DAY)", dates),
        st.builds(lambda a: f"toDate({a})", num),
        st.builds(lambda s: f"toDateTime({s})", strs),
        st.builds(lambda d, a: f"addMonths({d}, {a})", dates, num),
        st.builds(lambda d, a: f"subtractYears({d}, {a})", dates, num),
        st.builds(lambda d, a: f"({d} - INTERVAL {a} HOUR)", dates, num),
        st.builds(lambda d: f"toMonday({d})", dates),
        st.builds(lambda d: f"toStartOfInterval({d}, INTERVAL 7 DAY)", dates),
        st.builds(lambda d: f"date_trunc('week', {d})", dates),
        st.builds(lambda a: f"fromUnixTimestamp({a})", num),
        st.builds(lambda a: f"toDateTime({a})", num),
        st.builds(lambda d, a: f"dateAdd(day, {a}, {d})", dates, num),
    )


def _cond(children):
    num, strs, dates, conds = children
    return st.one_of(
        st.builds(lambda a, b, op: f"({a} {op} {b})", num, num, st.sampled_from([">", "<=", "=", "!="])),
        st.builds(lambda a, b: f"({a} = {b})", strs, strs),
        st.builds(lambda s: f"({s} LIKE '%a%')", strs),
        st.builds(lambda s: f"match({s}, '^[0-9]+$')", strs),
        st.builds(lambda d: f"({d} > toDate('2020-01-01'))", dates),
        st.builds(lambda a, b, op: f"({a} {op} {b})", conds, conds, st.sampled_from(["AND", "OR"])),
        st.builds(lambda c: f"(NOT {c})", conds),
        st.builds(lambda a: f"isNull({a})", num),
        st.builds(lambda a: f"({a} IN (1, 2))", num),
        st.builds(lambda c: f"(user_id = 3 AND {c})", conds),
        st.builds(lambda s: f"({s} ILIKE 'A%')", strs),
        st.builds(lambda s: f"startsWith({s}, 'a')", strs),
        st.builds(lambda s: f"has(['a', 'b'], {s})", strs),
        st.builds(lambda a, b: f"({a} BETWEEN {b} AND 10)", num, num),
        st.builds(lambda a: f"isNaN({a})", num),
        st.builds(lambda s: f"(kind = {s})", strs),
        st.builds(lambda s: f"({s} IN ('a', NULL))", strs),
        st.builds(lambda a, b: f"({a} <=> {b})", num, num),
    )


def _typed(depth: int):
    leaves = (st.sampled_from(NUM_LEAVES), st.sampled_from(STR_LEAVES), st.sampled_from(DATE_LEAVES),
              st.sampled_from(["(flag = 1)", "(qty > 0)", "(name = 'abc')"]))
    if depth == 0:
        return leaves
    children = _typed(depth - 1)
    return tuple(st.one_of(leaf, make(children)) for leaf, make in zip(leaves, (_num, _str, _date, _cond)))


EXPRS = _typed(3)


def _run(db, sql: str, **kw) -> str:
    before = db.ledger.remaining(db.analyst, f"{DB}.ext").queries
    try:
        db.query(sql, **kw)
    except (QueryRejected, InvalidParameter):
        assert db.ledger.remaining(db.analyst, f"{DB}.ext").queries == before, f"rejected but charged: {sql}"
        return "rejected"
    # anything else (BackendError after the charge) propagates and fails the test with the query
    assert db.ledger.remaining(db.analyst, f"{DB}.ext").queries == before + 1
    return "ok"


EXAMPLES = 250 if os.environ.get("DPCH_LONG") == "1" else 80


@settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(cond=EXPRS[3], key=EXPRS[1], value=EXPRS[0])
def test_accepted_random_expressions_never_fail(tdb, cond, key, value):  # noqa: F811
    _run(tdb, f"SELECT COUNT(*) AS n, countIf({cond}) AS c FROM {DB}.ext WHERE {cond}", epsilon=1.0)
    _run(tdb, f"SELECT {key} AS g, COUNT(*) AS n FROM {DB}.ext WHERE {cond} GROUP BY g", epsilon=1.0, delta=1e-6)
    _run(tdb, f"SELECT {value} AS g, COUNT(*) AS n FROM {DB}.ext GROUP BY g", epsilon=1.0, delta=1e-6)


def test_the_fuzzer_reaches_accepted_queries(tdb):  # noqa: F811
    """Guard against a vacuous property: a plain generated-style query is accepted and charged."""
    assert _run(tdb, f"SELECT COUNT(*) AS n FROM {DB}.ext WHERE (toInt64(name) > 2) AND match(name, '^[0-9]+$')",
                epsilon=1.0) == "ok"
