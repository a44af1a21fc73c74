"""dpch.totality: every row-level function is total, rewritten to a total form, constant-checked or
rejected (DESIGN.md invariant 7; issue 11). Unit tests of the pass, and an engine test that runs
every allowed function family through the whole controller on a table of extreme values."""
from __future__ import annotations

import pytest

from dpch import bind as bind_mod
from dpch import function_rules, totality
from dpch.bind import bind, sql_of
from dpch.catalog import TableEntry
from dpch.errors import QueryRejected
from dpch.parse import parse

DB = "dpch_total"
COLUMNS = {"user_id": "UInt64", "name": "String", "qty": "Int64", "amount": "Float64", "price": "Decimal(18, 4)",
           "day": "Date", "ts": "DateTime", "kind": "Enum8('a' = 1, 'b' = 2)", "nname": "Nullable(String)",
           "flag": "UInt8"}


def _entry() -> TableEntry:
    return TableEntry(table=f"{DB}.x", privacy_unit="user_id", neighbour="add_remove", columns=COLUMNS,
                      bounds={"qty": (-100.0, 100.0), "amount": (0.0, 500.0), "price": (0.0, 100.0)},
                      max_groups_contributed=1, max_rows_per_unit=10, max_rows_per_group=None, public_keys={},
                      salt="00" * 16)


def _types(sqls):
    return [COLUMNS.get(s.strip("`\""), "Float64") for s in sqls]


def total_where(condition: str) -> str:
    b = bind(parse(f"SELECT COUNT(*) FROM {DB}.x WHERE {condition}"), _entry())
    return sql_of(totality.make_total(b, _types).where)


def test_every_allowed_function_has_a_totality_rule():
    anonymous = [n for n in bind_mod._ALLOWED_ANONYMOUS if n not in totality.FUNCTION_RULES]
    classes = [c.__name__ for c in bind_mod._ALLOWED_NODES
               if c not in function_rules._NODE_NAMES and not issubclass(c, function_rules._STRUCTURAL)]
    assert anonymous == [] and classes == []
    assert {r.kind for r in totality.FUNCTION_RULES.values()} == {"total", "rewrite", "constant", "reject"}
    assert "| reject |" in totality.rules_table()


@pytest.mark.parametrize("condition,expected", [
    # the quotient limit follows the division's result type (here the fake types say Float64:
    # unknown, so the smallest, Int32's)
    ("intDiv(1, qty) = 0", "intDivOrZero(CASE WHEN isFinite(1) AND isFinite(qty) AND abs((1) / (qty)) < 2147483647 "
                           "THEN 1 ELSE 0 END"),
    ("intDivOrZero(amount * 1e12, 1) > 0", "abs((amount * 1e12) / (1)) < 2147483647"),
    ("qty % 3 = 0", "moduloOrZero(qty, 3)"),
    ("modulo(qty, qty) = 0", "moduloOrZero(qty, qty)"),
    ("toInt64(name) > 0", "accurateCastOrNull(name, 'Int64')"),
    ("toDate(name) > today()", "accurateCastOrNull(name, 'Date')"),
    ("CAST(name AS Int32) > 0", "accurateCastOrNull(name, 'Int32')"),
    ("name::UInt8 > 0", "accurateCastOrNull(name, 'UInt8')"),
    ("toDecimal64(amount, 4) > 1", "trunc(accurateCastOrNull(amount, 'Float64'), 4)"),
    ("price * 2 > 1", "toFloat64(price) * 2"),
    ("price / qty > 1", "toFloat64(price) / qty"),
    ("toUnixTimestamp(name) > 0", "toUnixTimestamp(accurateCastOrNull(name, 'DateTime'))"),
    ("tobool(name)", "accurateCastOrNull(name, 'Bool')"),
    # float NaN/inf to an integer or a date throws: only finite values are converted
    ("toInt64(amount) > 0", "CASE WHEN isFinite(amount) THEN toInt64(CASE WHEN isFinite(amount) THEN amount ELSE 0 END)"),
    ("CAST(amount AS Int8) > 0", "CASE WHEN isFinite(amount) THEN CAST(CASE WHEN isFinite(amount) THEN amount ELSE 0 END AS Int8)"),
    ("toDate(amount) > today()", "CASE WHEN isFinite(amount) THEN toDate("),
    # nested: the inner conversion is rewritten before the outer one copies it
    ("toDecimal64(toDecimal64(amount, 4), 4) > 0",
     "trunc(accurateCastOrNull(trunc(accurateCastOrNull(amount, 'Float64'), 4), 'Float64'), 4)"),
    ("intDiv(intDiv(qty, 0), 2) = 0", "intDivOrZero(CASE WHEN isFinite(intDivOrZero(CASE WHEN"),
    # a Decimal anywhere but as the whole expression is a Float64: its arithmetic throws, and compared
    # with a column it wraps (decimal_check_overflow = 0); parentheses and tuples do not hide it
    ("price > 1.5", "toFloat64(price) > 1.5"),
    ("(price) / qty > 1", "(toFloat64(price)) / qty"),
    ("((price)) / qty > 1", "((toFloat64(price))) / qty"),
    ("(price, 1) = (1, 1)", "(toFloat64(price), 1)"),
    # TRY_CAST is rendered CAST(x AS Nullable(T)), which throws like CAST: the same total forms
    ("TRY_CAST(name AS Int32) > 0", "accurateCastOrNull(name, 'Int32')"),
    ("TRY_CAST(amount AS Decimal(18, 4)) > 0", "accurateCastOrNull(amount, 'Float64')"),
    ("accurateCastOrNull(amount, 'Decimal(18, 4)') > 0", "accurateCastOrNull(amount, 'Float64')"),
])
def test_partial_functions_become_total(condition, expected):
    assert expected in total_where(condition)


@pytest.mark.parametrize("condition,kept", [
    ("toInt64(qty) > 0", "toInt64(qty)"),  # integer → integer wraps, never throws
    ("toDate(qty) > today()", "toDate(qty)"),
    ("toString(name) = 'a'", "toString(name)"),  # toString of a String is the identity, no parse
    ("addDays(day, qty) > today()", "addDays(day, qty)"),  # date arithmetic on a Date
    ("lower(name) = 'a'", "lower(name)"),
])
def test_total_functions_stay(condition, kept):
    assert kept in total_where(condition)


@pytest.mark.parametrize("condition,match", [
    ("repeat(name, 3) = ''", "repeat"),
    ("length(hex(hex(hex(hex(hex(hex(hex(name)))))))) > 0", "times larger"),
    ("length(replaceAll(replaceAll(name, 'a', 'aaaaaaaaaa'), 'a', 'aaaaaaaaaa')) > 0", "times larger"),
    ("toFixedString(name, 3) = 'abc'", "tofixedstring"),
    ("levenshteinDistance(name, 'a') > 1", "levenshtein"),
    ("[1, 2][qty] = 1", "bracket"),
    ("gcd(qty, 2) = 1", "gcd"),
    ("match(name, name)", "constant"),
    ("name LIKE name", "constant"),
    ("substring(name, qty, 2) = 'a'", "integer constants"),
    ("substring(name, 1, 9223372036854775807) = 'a'", "integer constants"),
    ("leftPad(name, qty) = 'a'", "constant in"),
    ("leftPad(name, 100000000) = 'a'", "constant in"),
    ("replaceAll(name, 'a', name) = ''", "constant"),
    ("splitByChar(name, 'a,b') = []", "separator"),
    ("formatDateTime(day, name) = ''", "format"),
    ("dateDiff(name, day, day) = 0", "not a time unit"),
    ("day + INTERVAL 3 name > today()", "not a time unit"),
    ("bitShiftLeft(qty, qty) > 0", "bitShiftLeft"),
    ("CAST(name AS Enum8('a' = 1)) = 'a'", "Enum"),
    ("accurateCastOrNull(name, 'Enum8(''a'' = 1)') = 'a'", "Enum"),
    ("accurateCastOrNull(name, name) = 'a'", "constant"),
    ("round(amount, qty) > 0", "digits"),
    ("toStartOfInterval(ts, INTERVAL 0 DAY) > now()", "positive"),
    ("toDecimal64(amount, qty) > 0", "scale"),
    ("TRY_CAST(name AS Enum8('a' = 1)) = 'a'", "Enum"),
    ("TRY_CAST(ts AS DateTime64(9)) > now()", "DateTime64"),
    ("ts + accurateCastOrNull(qty, 'IntervalNanosecond') > ts", "interval"),
    # a String computed from the rows, parsed row by row as a date or a time zone
    ("addDays(name, 1) > day", "parse row by row"),
    ("name + INTERVAL 1 DAY > day", "parse row by row"),
    ("dateDiff('day', name, day) > 0", "parse row by row"),
    ("toString(ts, name) != ''", "parse row by row"),
    ("formatDateTime(ts, '%Y', name) != ''", "parse row by row"),
    ("toYear(ts, nname) > 0", "parse row by row"),
])
def test_rejections_name_the_function_and_reason(condition, match):
    with pytest.raises(QueryRejected, match=match):
        total_where(condition)


def test_post_processing_is_made_total_too():
    sql = (f"SELECT COUNT(*) AS n, toInt64(toString(COUNT(*))) AS p, intDiv(100, COUNT(*)) AS d FROM {DB}.x "
           f"HAVING toInt64(toString(n)) > 0 ORDER BY toInt64(n)")
    b = totality.make_total_templates(totality.make_total(bind(parse(sql), _entry()), _types), [])
    out = {o.name: sql_of(o.template) for o in b.outputs}
    assert "accurateCastOrNull(toString(" in out["p"] and "intDivOrZero(" in out["d"]
    assert "accurateCastOrNull" in sql_of(b.having)
    order = sql_of(b.order[0].template)  # a released number: truncation stays (NaN/inf guarded)
    assert "toInt64(" in order and "accurateCastOrNull" not in order and "isFinite" in order


def test_aggregate_arguments_conditions_and_keys_are_made_total():
    sql = (f"SELECT toInt64(name) AS k, countIf(intDiv(1, qty) = 0) AS c, SUM(intDiv(qty, 2)) AS s "
           f"FROM {DB}.x GROUP BY k")
    b = totality.make_total(bind(parse(sql), _entry()), _types)
    assert b.keys[0].sql == "accurateCastOrNull(name, 'Int64')"
    assert "intDivOrZero" in sql_of(b.aggregates[0].cond) and "intDivOrZero" in sql_of(b.aggregates[1].arg)


# ---------------------------------------------------------------------------------------------
# Through the engine: every family on extreme values; nothing may throw at run time
# ---------------------------------------------------------------------------------------------

EXTREMES = f"""
INSERT INTO {DB}.ext SELECT
    number % 40 AS user_id,
    [ '', 'abc', '2024-13-45', '99999999999999999999999', '-1', 'NaN', repeat('x', 5000), '1e400', 'ä€', '0x1F' ][number % 10 + 1] AS name,
    [ -9223372036854775808, 9223372036854775807, 0, -1, 1, 2 ][number % 6 + 1] AS qty,
    [ 0., -0., nan, inf, -inf, 1e308, -1e308, 5e-324 ][number % 8 + 1] AS amount,
    [ toDecimal64(0, 4), toDecimal64(99999999999999.9999, 4), toDecimal64(-99999999999999.9999, 4) ][number % 3 + 1] AS price,
    [ toDate('1970-01-01'), toDate('2149-06-06'), toDate('2024-02-29') ][number % 3 + 1] AS day,
    [ toDateTime(0), toDateTime('2106-02-07 06:28:15'), now() ][number % 3 + 1] AS ts,
    ['a', 'b'][number % 2 + 1] AS kind,
    if(number % 4 = 0, NULL, toString(number)) AS nname,
    number % 2 AS flag
FROM numbers(400)
"""

ENGINE_CONDITIONS = [
    "intDiv(qty, qty - qty) = 0", "intDiv(qty, -1) = 0", "qty % 0 = 0", "modulo(qty, -1) = 0",
    "toInt64(name) > 0", "toUInt8(name) = 1", "toFloat64(name) > 0", "toDate(name) > today()",
    "toDateTime(name) > now()", "toDecimal64(name, 4) > 1", "toDecimal32(qty, 9) > 1", "toDecimal64(amount, 4) > 0",
    "CAST(name AS Int64) > 0", "name::Date > today()", "isNull(CAST(name AS UUID))",
    "toBool(name)",
    "toUnixTimestamp(name) > 0", "price / 0 > 1", "price * price > 1", "price - price * 1e30 < 0",
    "qty * qty > 0", "abs(qty) > 0", "-qty > 0", "sqrt(qty) > 0", "log(amount) > 0", "pow(amount, qty) > 0",
    "exp(amount) > 1", "round(amount, 2) > 0", "intDiv(qty, amount) = 0", "intDiv(amount, qty) = 0",
    "intDiv(toFloat32(qty), length(name)) = 0", "intDiv(qty, 0) = 0", "toInt64(amount) > 0", "CAST(amount AS Int8) > 0",
    "toDate(amount) > today()", "toDateTime(amount) > now()", "toUInt32(amount / 0) = 0", "intDivOrZero(qty, 0) = 0", "amount / 0 > 0",
    "lower(name) = 'a'", "upper(name) = 'A'", "length(name) > 3", "reverse(name) = ''", "concat(name, name) = ''",
    "substring(name, 2, 3) = 'bc'", "substring(name, -5) = ''", "left(name, 2) = 'ab'", "leftPad(name, 20, '*') = ''",
    "position(name, 'b') > 0", "name LIKE '%b%'", "match(name, '^[0-9]+$')", "extract(name, '([0-9]+)') = '1'",
    "replaceRegexpAll(name, 'a+', 'b') = ''", "replaceAll(name, 'a', 'bb') = ''", "splitByChar(',', name) = []",
    "startsWith(name, 'a')", "trim(name) = ''", "hex(name) = ''",
    "toYear(day) > 2000", "toStartOfMonth(day) > today()", "addDays(day, qty) > today()", "addYears(ts, qty) > now()",
    "addDays(day, amount) > today()", "addDays(day, toUInt64(qty)) > today()", "ts + INTERVAL amount SECOND > now()",
    "dateAdd(day, amount, day) > today()", "date_sub(HOUR, toUInt64(qty), ts) > now()",
    "dateDiff('day', day, ts) > 0", "dateDiff(day, day, ts) > 0", "day + INTERVAL 3 DAY > today()",
    "toStartOfInterval(ts, INTERVAL 1 HOUR) > now()", "formatDateTime(ts, '%Y-%m') = ''", "date_trunc('month', day) > today()",
    "if(flag = 1, toInt64(name), 0) > 0", "multiIf(flag = 1, intDiv(1, qty), qty = 0, toInt64(name), 1) > 0",
    "CASE WHEN flag = 1 THEN toDate(name) ELSE today() END > today()",
    "coalesce(toInt64(nname), 0) > 0", "nullIf(name, '') = 'a'", "isNull(toInt64OrNull(name))",
    "kind = name", "kind IN ('a', 'b')", "has([1, 2], qty)",
    "user_id = 42 AND intDiv(1, qty - qty) = 0",
]


@pytest.fixture(scope="module")
def tdb(db):
    db.command(f"CREATE DATABASE IF NOT EXISTS {DB}")
    db.command(f"DROP TABLE IF EXISTS {DB}.ext")
    cols = ", ".join(f"`{c}` {t}" for c, t in COLUMNS.items())
    db.command(f"CREATE TABLE {DB}.ext ({cols}) ENGINE = MergeTree ORDER BY user_id")
    db.command(EXTREMES)
    db.catalog.register(f"{DB}.ext", privacy_unit="user_id", bounds={"qty": (-100, 100), "amount": (0, 500),
                                                                      "price": (0, 100)},
                        max_groups_contributed=2, max_rows_per_unit=10)
    db.ledger.set_budget(db.analyst, f"{DB}.ext", 1e9, 0.5)
    return db


@pytest.mark.parametrize("condition", ENGINE_CONDITIONS)
def test_accepted_functions_never_throw_on_extreme_values(tdb, condition):
    """Each condition runs in WHERE, in a countIf condition and, for the keys, in GROUP BY; with the
    type check passed, running on the extreme rows must not fail (a failure would be an oracle)."""
    before = tdb.ledger.remaining(tdb.analyst, f"{DB}.ext").queries
    df = tdb.query(f"SELECT COUNT(*) AS n, countIf({condition}) AS c FROM {DB}.ext WHERE {condition}", epsilon=1.0)
    assert list(df.columns) == ["n", "c"] and len(df) == 1
    assert tdb.ledger.remaining(tdb.analyst, f"{DB}.ext").queries == before + 1


@pytest.mark.parametrize("key", ["toInt64(name)", "toDate(name)", "nullIf(name, name)", "nname", "intDiv(qty, 0)"])
@pytest.mark.parametrize("k", [1, 2])
def test_nullable_and_total_keys_answer_at_every_k(tdb, key, k):
    tdb.catalog.register(f"{DB}.ext", privacy_unit="user_id", bounds={"qty": (-100, 100), "amount": (0, 500),
                                                                      "price": (0, 100)},
                         max_groups_contributed=k, max_rows_per_unit=10, replace=True)
    df = tdb.query(f"SELECT {key} AS g, COUNT(*) AS n, SUM(amount) AS s FROM {DB}.ext GROUP BY g",
                   epsilon=1.0, delta=1e-6)
    assert list(df.columns) == ["g", "n", "s"]


def test_null_public_key_is_a_group(tdb):
    df = tdb.query(f"SELECT nname AS g, COUNT(*) AS n FROM {DB}.ext GROUP BY g", epsilon=50.0,
                   keys={"g": [None, "1", "1"]})
    assert len(df) == 2  # NULL and '1', the duplicate released once
    null_n = df.loc[df["g"].isna(), "n"].iloc[0]
    assert null_n > 20  # 100 NULL rows over 10 units each capped at 10 rows: ≈ 100 ± a few (ε = 50)
