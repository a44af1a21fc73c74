"""Adversarial review of the controller's newer shapes (COUNT(DISTINCT expr), shared MIN/MAX/median,
string and date functions, casts, conditionals, GROUP BY expressions, HAVING, top-n, semi-joins,
joins with a public table, SQL-text injections) under the D / D′ rule of test_attacks.py: the same
outcome on D and D′ (rejected before the charge with the same message, or answered on both with the
same columns, row count and public keys, charged on both; never charged and then failed), and no
message holding one of unit 42's values (harness.SECRETS).

Cases marked ``LEAK`` and ``DEFECT`` broke the rule when the review found them (2026-11-25) and
pass since the fixes; each names what was wrong:

- ``LEAK: ...``: the outcome differed on D and D′ (the query ran on D′ and failed at run time on D:
  an exact membership oracle for unit 42, at the cost of one charge);
- ``DEFECT: ...``: accepted and charged, then failed at run time identically on D and D′ (not a
  D / D′ channel by itself, but it broke "a query is type-checked before it is charged").

Literals in the SQL below avoid the values in harness.SECRETS: a rejection may quote the analyst's
own SQL, and the secret check would then flag the analyst's literal.
"""
from __future__ import annotations

import pytest

from . import harness
from .test_attacks import DELTA_SEL, C, check_case

CNT = "SELECT COUNT(*) AS n FROM {t}"
# a string only unit 42's rows make unparsable (its qty is 7777777; every other unit's is in [-100, 100])
SD = "if(qty > 1000, 'zz', '2024-01-01')"
TZ = "if(qty > 1000, 'zz', 'UTC')"
# a divisor that is 0 on unit 42's rows only (UInt8)
Z42 = "(qty < 1000)"

PUB = f"{harness.DB}.rv_pub"  # a public lookup table (module fixture)


def LEAK(case, reason: str):
    """A case that leaked before the fix (``reason``: what was wrong); it must pass now."""
    return pytest.param(case, id=case.id)


def DEFECT(case, reason: str):
    """A case that was charged and then failed before the fix; it must pass now."""
    return pytest.param(case, id=case.id)


def OK(case):
    return pytest.param(case, id=case.id)


R_PAREN = ("a Decimal column in parentheses (or in a tuple) is not converted to Float64 "
           "(dpch/totality.py _Totalizer.rewrite tests only col.parent), so Decimal division by a value that "
           "is 0 only on unit 42's rows throws ILLEGAL_DIVISION on D only")
R_TRYCAST = ("TRY_CAST targets are never checked (_constant_args checks only the anonymous accurateCastOrNull; "
             "exp.TryCast is not rewritten) and _check_target lets Decimal and Interval* (prefix 'int') through: "
             "an Enum target throws UNKNOWN_ELEMENT_OF_ENUM, DateTime64/IntervalNanosecond arithmetic throws "
             "DECIMAL_OVERFLOW, Decimal division throws ILLEGAL_DIVISION, on unit 42's rows only")
R_STRDATE = ("date arithmetic (addDays/addMonths/addSeconds/subtractDays/addWeeks/dateAdd/date_sub, +/- INTERVAL) "
             "on a String argument parses it per row: CANNOT_PARSE_DATETIME on D only (FUNCTION_RULES calls them "
             "total for Date/DateTime values but never checks the argument type)")
R_TZ = ("a non-constant time zone argument of toString(DateTime, tz), formatDateTime(t, fmt, tz) or "
        "fromUnixTimestamp(x, fmt, tz) is read per row: BAD_ARGUMENTS for unit 42's invalid zone, on D only "
        "(only formatDateTime's format is checked constant)")
R_PROBE = ("the pre-charge probe (dpch/typecheck.py) evaluates the expressions over a one-row subquery of "
           "constants, so ClickHouse folds if(<col> > 1000, 'a', 'b') to a constant there; on the table the "
           "argument is a column and the query fails at analysis (NO_COMMON_TYPE / ILLEGAL_COLUMN) after the charge")

CASES = [
    # ------------------------------------------------------------ the headline oracles: "is unit 42 in the table?"
    LEAK(C("rv_unit_paren_decimal", CNT + " WHERE (price) / (user_id != 42) > 0", "(Decimal) / 0 iff unit 42"), R_PAREN),
    LEAK(C("rv_unit_trycast_enum", CNT + " WHERE TRY_CAST(if(user_id = 42, 'zz', 'day') AS Enum8('day' = 1)) = 'day'",
           "TRY_CAST to an Enum iff unit 42"), R_TRYCAST),
    LEAK(C("rv_unit_adddays_string", CNT + " WHERE addDays(if(user_id = 42, 'zz', '2024-01-01'), 1) > day",
           "addDays parse iff unit 42"), R_STRDATE),
    LEAK(C("rv_unit_tostring_tz", CNT + " WHERE toString(ts, if(user_id = 42, 'zz', 'UTC')) != ''",
           "toString time zone iff unit 42"), R_TZ),
    # ------------------------------------------------------------ Decimal in parentheses (LEAK)
    OK(C("rv_decimal_div_bare", CNT + f" WHERE price / {Z42} > 0", "Decimal / 0 on unit 42 (converted to Float64)")),
    OK(C("rv_decimal_intdiv_paren", CNT + f" WHERE intDiv((price), {Z42}) > 0", "intDiv of a parenthesised Decimal")),
    OK(C("rv_decimal_mod_paren", CNT + f" WHERE (price) % {Z42} > 0", "% of a parenthesised Decimal")),
    OK(C("rv_decimal_mul_paren", CNT + " WHERE (price) * (price) * (price) > 0", "Decimal overflow (no check)")),
    LEAK(C("rv_decimal_div_paren", CNT + f" WHERE (price) / {Z42} > 0", "(Decimal) / 0 iff unit 42"), R_PAREN),
    LEAK(C("rv_decimal_div_double_paren", CNT + f" WHERE ((price)) / {Z42} > 0", "((Decimal)) / 0 iff unit 42"),
         R_PAREN),
    LEAK(C("rv_decimal_div_neg_paren", CNT + f" WHERE -(price) / {Z42} > 0", "-(Decimal) / 0 iff unit 42"), R_PAREN),
    LEAK(C("rv_decimal_tuple_div", CNT + f" WHERE ((price, 1) / {Z42}) = (1, 1)", "(Decimal, 1) / 0 iff unit 42"),
         R_PAREN),
    LEAK(C("rv_decimal_paren_countif", f"SELECT countIf((price) / {Z42} > 0) AS n FROM {{t}}",
           "countIf condition (Decimal) / 0"), R_PAREN),
    LEAK(C("rv_decimal_paren_sum_if", f"SELECT SUM(if((price) / {Z42} > 0, 1, 0)) AS s FROM {{t}}",
           "if() condition inside SUM"), R_PAREN),
    LEAK(C("rv_decimal_paren_nullif", f"SELECT SUM(nullIf(amount, (price) / {Z42})) AS s FROM {{t}}",
           "nullIf's second argument inside SUM"), R_PAREN),
    LEAK(C("rv_decimal_paren_count_distinct", f"SELECT COUNT(DISTINCT (price) / {Z42}) AS v FROM {{t}}",
           "COUNT(DISTINCT (Decimal) / 0)"), R_PAREN),
    LEAK(C("rv_decimal_paren_min_max", f"SELECT MIN(amount) AS lo, MAX(amount) AS hi FROM {{t}} WHERE (price) / {Z42} > 0",
           "shared MIN/MAX with a WHERE dividing a Decimal"), R_PAREN),
    LEAK(C("rv_decimal_paren_key", f"SELECT (price) / {Z42} > 0 AS g, COUNT(*) AS n FROM {{t}} GROUP BY 1",
           "GROUP BY key dividing a Decimal", delta=DELTA_SEL), R_PAREN),
    LEAK(C("rv_decimal_paren_derived", f"SELECT COUNT(*) AS n FROM (SELECT user_id, price AS p, qty FROM {{t}}) AS x "
                                       f"WHERE (p) / {Z42} > 0", "derived-table alias of a Decimal"), R_PAREN),
    OK(C("rv_decimal_derived_bare", f"SELECT COUNT(*) AS n FROM (SELECT user_id, price AS p, qty FROM {{t}}) AS x "
                                    f"WHERE p / {Z42} > 0", "derived-table alias of a Decimal, no parentheses")),
    # ------------------------------------------------------------ TRY_CAST / accurateCastOrNull targets
    OK(C("rv_trycast_enum_column", CNT + " WHERE TRY_CAST(unit_s AS Enum8('day' = 1)) = 'day'",
         "TRY_CAST of a column to an Enum (fails on the default row: refused)")),
    OK(C("rv_trycast_fixedstring", CNT + " WHERE TRY_CAST(name AS FixedString(4)) != ''",
         "TRY_CAST to FixedString(4) of unit 42's long name")),
    OK(C("rv_trycast_dt64_compare", CNT + " WHERE TRY_CAST(qty AS DateTime64(3)) > ts", "TRY_CAST to DateTime64, compared")),
    OK(C("rv_trycast_int8", CNT + " WHERE TRY_CAST(name AS Int8) > 0", "TRY_CAST of a name to Int8")),
    OK(C("rv_sum_trycast_decimal", "SELECT SUM(TRY_CAST(amount AS Decimal(5, 2))) AS s FROM {t}",
         "SUM of a narrow Decimal TRY_CAST of a clipped value", must_answer=True)),
    OK(C("rv_avg_max_trycast_decimal", "SELECT AVG(TRY_CAST(amount AS Decimal(5, 2))) AS a, "
                                       "MAX(TRY_CAST(amount AS Decimal(5, 2))) AS m FROM {t}", "AVG/MAX of a TRY_CAST")),
    OK(C("rv_median_trycast_decimal_k3", "SELECT region, median(TRY_CAST(big AS Decimal(5, 0))) AS m FROM {t} "
                                         "GROUP BY region", "median of a TRY_CAST by public keys", pair="k3")),
    LEAK(C("rv_trycast_enum_value", CNT + " WHERE TRY_CAST(if(qty > 1000, 'zz', 'day') AS Enum8('day' = 1)) = 'day'",
           "TRY_CAST to an Enum of a data-chosen name"), R_TRYCAST),
    LEAK(C("rv_count_distinct_trycast_enum", "SELECT COUNT(DISTINCT TRY_CAST(if(qty > 1000, 'zz', 'day') AS "
                                             "Enum8('day' = 1))) AS v FROM {t}", "COUNT(DISTINCT TRY_CAST(... Enum))"),
         R_TRYCAST),
    LEAK(C("rv_trycast_dt64_plus", CNT + " WHERE TRY_CAST(ts AS DateTime64(9)) + INTERVAL (qty * 1000000) SECOND > ts",
           "DateTime64 via TRY_CAST + a huge interval"), R_TRYCAST),
    LEAK(C("rv_trycast_dt64_minus", CNT + " WHERE TRY_CAST(ts AS DateTime64(9)) - INTERVAL (qty * 1000000) SECOND < ts",
           "DateTime64 via TRY_CAST - a huge interval"), R_TRYCAST),
    LEAK(C("rv_trycast_dt64_addseconds", CNT + " WHERE addSeconds(TRY_CAST(ts AS DateTime64(9)), qty * 1000000) > ts",
           "addSeconds on a TRY_CAST DateTime64"), R_TRYCAST),
    LEAK(C("rv_trycast_decimal_div", CNT + f" WHERE TRY_CAST(amount AS Decimal(18, 4)) / {Z42} > 0",
           "TRY_CAST to Decimal, divided by 0 on unit 42"), R_TRYCAST),
    LEAK(C("rv_trycast_decimal_name_div", CNT + f" WHERE TRY_CAST(name AS Decimal(18, 4)) / {Z42} > 0",
           "TRY_CAST of a name to Decimal, divided"), R_TRYCAST),
    LEAK(C("rv_accuratecast_decimal_div", CNT + f" WHERE accurateCastOrNull(amount, 'Decimal(18, 4)') / {Z42} > 0",
           "accurateCastOrNull to Decimal, divided"), R_TRYCAST),
    LEAK(C("rv_accuratecast_interval_ns", CNT + " WHERE ts + accurateCastOrNull(qty * 1000000000000, "
                                               "'IntervalNanosecond') > ts", "accurateCastOrNull to IntervalNanosecond"),
         R_TRYCAST),
    OK(C("rv_cast_str_interval", CNT + " WHERE ts + CAST(qty * 1000000000000, 'IntervalNanosecond') > ts",
         "CAST(x, 'IntervalNanosecond') (refused)")),
    # ------------------------------------------------------------ date arithmetic on a String (LEAK)
    LEAK(C("rv_adddays_string", CNT + f" WHERE addDays({SD}, 1) > day", "addDays parses a data-chosen string"), R_STRDATE),
    LEAK(C("rv_subtractdays_string", CNT + f" WHERE subtractDays({SD}, 1) > day", "subtractDays of a string"), R_STRDATE),
    LEAK(C("rv_addmonths_string", CNT + f" WHERE addMonths({SD}, 1) > day", "addMonths of a string"), R_STRDATE),
    LEAK(C("rv_addseconds_string", CNT + f" WHERE addSeconds({SD}, 1) > ts", "addSeconds of a string"), R_STRDATE),
    LEAK(C("rv_dateadd_string", CNT + f" WHERE dateAdd(day, 1, {SD}) > day", "dateAdd of a string"), R_STRDATE),
    LEAK(C("rv_date_sub_string", CNT + f" WHERE date_sub(DAY, 1, {SD}) > day", "date_sub of a string"), R_STRDATE),
    LEAK(C("rv_plus_interval_string", CNT + f" WHERE {SD} + INTERVAL 1 DAY > day", "string + INTERVAL"), R_STRDATE),
    LEAK(C("rv_minus_interval_string", CNT + f" WHERE {SD} - INTERVAL 1 DAY > day", "string - INTERVAL"), R_STRDATE),
    LEAK(C("rv_countif_adddays_string", f"SELECT countIf(addDays({SD}, 1) > day) AS n FROM {{t}}",
           "countIf condition with addDays of a string"), R_STRDATE),
    LEAK(C("rv_public_keys_addweeks_string", f"SELECT region, COUNT(*) AS n FROM {{t}} WHERE addWeeks({SD}, 1) > day "
                                             "GROUP BY region", "public keys + addWeeks of a string"), R_STRDATE),
    LEAK(C("rv_semijoin_adddays_string", f"SELECT COUNT(*) AS n FROM {{t}} WHERE user_id IN (SELECT user_id FROM {{t}} "
                                         f"WHERE addDays({SD}, 1) > day)", "semi-join subquery WHERE"), R_STRDATE),
    OK(C("rv_timestampadd_string", CNT + f" WHERE timestampAdd({SD}, INTERVAL 1 DAY) > day", "timestampAdd of a string")),
    OK(C("rv_date_trunc_string", CNT + f" WHERE date_trunc('day', {SD}) > day", "date_trunc of a string")),
    OK(C("rv_tostartofweek_string", CNT + f" WHERE toStartOfWeek({SD}) > day", "toStartOfWeek of a string")),
    OK(C("rv_tomonday_string", CNT + f" WHERE toMonday({SD}) > day", "toMonday of a string")),
    OK(C("rv_toyear_string", CNT + f" WHERE toYear({SD}) > 2000", "toYear of a string")),
    OK(C("rv_tostartofmonth_string", CNT + f" WHERE toStartOfMonth({SD}) > day", "toStartOfMonth of a string")),
    OK(C("rv_toyyyymm_string", CNT + f" WHERE toYYYYMM({SD}) > 200001", "toYYYYMM of a string")),
    OK(C("rv_datediff_string", CNT + f" WHERE dateDiff('day', day, {SD}) > 0", "dateDiff of a string")),
    OK(C("rv_formatdatetime_string", CNT + f" WHERE formatDateTime({SD}, '%Y') != ''", "formatDateTime of a string")),
    OK(C("rv_relativedaynum_string", CNT + f" WHERE toRelativeDayNum({SD}) > 0", "toRelativeDayNum of a string")),
    OK(C("rv_timeslot_string", CNT + " WHERE timeSlot(if(qty > 1000, 'zz', '2024-01-01 00:00:00')) > ts",
         "timeSlot of a string")),
    OK(C("rv_adddays_name", CNT + " WHERE addDays(name, 1) > ts", "addDays of a name (fails on the default row)")),
    OK(C("rv_interval_string_amount", CNT + " WHERE day + INTERVAL if(qty > 1000, 'zz', '1') DAY > day",
         "INTERVAL with a string amount")),
    OK(C("rv_adddays_string_amount", CNT + " WHERE addDays(day, if(qty > 1000, 'zz', '1')) > day",
         "addDays with a string amount")),
    # ------------------------------------------------------------ date arithmetic on dates (total)
    OK(C("rv_addyears_date", CNT + " WHERE addYears(day, qty) > day", "addYears by unit 42's huge qty")),
    OK(C("rv_addyears_datetime", CNT + " WHERE addYears(ts, qty) > ts", "addYears(DateTime) by a huge qty")),
    OK(C("rv_interval_year_col", CNT + " WHERE day + INTERVAL qty YEAR > day", "Date + INTERVAL qty YEAR")),
    OK(C("rv_date32_interval", CNT + " WHERE toDate32(day) + INTERVAL qty YEAR > day", "Date32 + a huge interval")),
    OK(C("rv_date32_addmonths", CNT + " WHERE addMonths(toDate32(day), qty) > day", "addMonths(Date32, huge)")),
    OK(C("rv_date32_datediff", CNT + " WHERE dateDiff('second', toDate32(day), toDate32(day) + INTERVAL qty YEAR) > 0",
         "dateDiff over a huge Date32 shift")),
    OK(C("rv_todate32_big", CNT + " WHERE toDate32(big) > toDate32('2000-01-01')", "toDate32 of unit 42's big")),
    OK(C("rv_todatetime_huge_float", CNT + " WHERE toDateTime(amount * 1e20) > ts", "toDateTime of a huge float")),
    OK(C("rv_todate_huge_float", CNT + " WHERE toDate(amount * 1e20) > day", "toDate of a huge float")),
    OK(C("rv_fromunixtimestamp_big", CNT + " WHERE fromUnixTimestamp(big) > ts", "fromUnixTimestamp of unit 42's big")),
    OK(C("rv_fromunixtimestamp_fmt", CNT + " WHERE fromUnixTimestamp(big, '%Y-%m-%d') != ''",
         "fromUnixTimestamp with a constant format")),
    OK(C("rv_fromunixtimestamp_float", CNT + " WHERE fromUnixTimestamp(amount * 1e300) > ts",
         "fromUnixTimestamp of a float (refused)")),
    OK(C("rv_dateadd_nanosecond_str", CNT + " WHERE dateAdd('nanosecond', qty * 1000000000000, ts) > ts",
         "dateAdd with a sub-second unit as a string (refused)")),
    OK(C("rv_datetime_plus_float", CNT + " WHERE ts + amount * 1e9 > ts", "DateTime + a huge float")),
    OK(C("rv_date_plus_float", CNT + " WHERE day + amount * 1e9 > day", "Date + a huge float")),
    OK(C("rv_toyyyymm_key", "SELECT toYYYYMM(day) AS m, COUNT(*) AS n FROM {t} GROUP BY m", "toYYYYMM key (2099 for 42)",
         options={"keys": {"toYYYYMM(day)": [202401, 202402]}})),
    OK(C("rv_tostartofmonth_key_sel", "SELECT toStartOfMonth(day) AS m, COUNT(*) AS n FROM {t} GROUP BY m",
         "toStartOfMonth key, unit 42's own month", delta=DELTA_SEL, must_answer=True)),
    OK(C("rv_datediff_units", CNT + " WHERE dateDiff('year', day, ts) + dateDiff('month', day, ts) "
                                    "+ age('day', day, ts) > 0", "dateDiff/age with constant unit strings")),
    # ------------------------------------------------------------ time zone arguments
    LEAK(C("rv_tostring_tz", CNT + f" WHERE toString(ts, {TZ}) != ''", "toString(ts, data-chosen zone)"), R_TZ),
    LEAK(C("rv_formatdatetime_tz", CNT + f" WHERE formatDateTime(ts, '%Y', {TZ}) != ''",
           "formatDateTime with a data-chosen zone"), R_TZ),
    LEAK(C("rv_fromunixtimestamp_tz", CNT + f" WHERE fromUnixTimestamp(qty, '%Y', {TZ}) != ''",
           "fromUnixTimestamp with a data-chosen zone"), R_TZ),
    LEAK(C("rv_tostring_tz_key", f"SELECT toString(ts, {TZ}) AS g, COUNT(*) AS n FROM {{t}} GROUP BY 1",
           "GROUP BY toString(ts, zone)", delta=DELTA_SEL), R_TZ),
    LEAK(C("rv_tostring_tz_countif", f"SELECT countIf(toString(ts, {TZ}) != '') AS n FROM {{t}}",
           "countIf with toString(ts, zone)"), R_TZ),
    LEAK(C("rv_tostring_tz_count_distinct", f"SELECT COUNT(DISTINCT toString(ts, {TZ})) AS v FROM {{t}}",
           "COUNT(DISTINCT toString(ts, zone))"), R_TZ),
    OK(C("rv_tostring_tz_column", CNT + " WHERE toString(ts, unit_s) != ''", "toString(ts, column)")),
    OK(C("rv_tostring_date_tz", CNT + f" WHERE toString(day, {TZ}) != ''", "toString(Date, zone)")),
    OK(C("rv_tostartofday_tz", CNT + f" WHERE toStartOfDay(ts, {TZ}) > ts", "toStartOfDay(ts, zone)")),
    OK(C("rv_tostartofinterval_tz", CNT + f" WHERE toStartOfInterval(ts, INTERVAL 1 DAY, {TZ}) <= ts",
         "toStartOfInterval(ts, i, zone)")),
    OK(C("rv_now_tz", CNT + f" WHERE now({TZ}) > ts", "now(zone)")),
    OK(C("rv_todatetime_tz", CNT + f" WHERE toDateTime(ts, {TZ}) > ts", "toDateTime(ts, zone)")),
    OK(C("rv_date_trunc_tz", CNT + f" WHERE date_trunc('day', ts, {TZ}) <= ts", "date_trunc(unit, ts, zone)")),
    OK(C("rv_timeslot_tz", CNT + f" WHERE timeSlot(ts, {TZ}) <= ts", "timeSlot(ts, zone)")),
    OK(C("rv_tostartofhour_tz", CNT + f" WHERE toStartOfHour(ts, {TZ}) <= ts", "toStartOfHour(ts, zone)")),
    OK(C("rv_constant_tz", CNT + " WHERE toYear(ts, 'Asia/Tokyo') + toHour(ts, 'UTC') > 0 "
                                 "AND toString(ts, 'Europe/Berlin') != ''", "constant zones")),
    DEFECT(C("rv_toyear_tz", CNT + f" WHERE toYear(ts, {TZ}) > 0", "toYear(ts, zone)"), R_PROBE),
    DEFECT(C("rv_toyyyymm_tz", CNT + f" WHERE toYYYYMM(ts, {TZ}) > 0", "toYYYYMM(ts, zone)"), R_PROBE),
    DEFECT(C("rv_datediff_tz", CNT + f" WHERE dateDiff('day', ts, ts, {TZ}) >= 0", "dateDiff(..., zone)"), R_PROBE),
    DEFECT(C("rv_tostartofmonth_tz", CNT + f" WHERE toStartOfMonth(ts, {TZ}) <= ts", "toStartOfMonth(ts, zone)"),
           R_PROBE),
    DEFECT(C("rv_tounixtimestamp_tz", CNT + f" WHERE toUnixTimestamp(ts, {TZ}) > 0", "toUnixTimestamp(ts, zone)"),
           R_PROBE),
    # ------------------------------------------------------------ implicit conversions in comparisons
    OK(C("rv_enum_eq_value", CNT + " WHERE kind = if(qty > 1000, 'zz', 'a')", "Enum = a data-chosen unknown name")),
    OK(C("rv_enum_in_value", CNT + " WHERE kind IN (if(qty > 1000, 'zz', 'a'))", "Enum IN (data-chosen name)")),
    OK(C("rv_enum_neq_value", CNT + " WHERE kind != if(qty > 1000, 'zz', 'a')", "Enum != a data-chosen name")),
    OK(C("rv_enum_if_branches", CNT + " WHERE if(flag, kind, if(qty > 1000, 'zz', 'a')) = 'a'",
         "if(Enum, data-chosen String)")),
    OK(C("rv_enum_multiif_branches", CNT + " WHERE multiIf(flag, kind, if(qty > 1000, 'zz', 'a')) = 'a'",
         "multiIf(Enum, data-chosen String)")),
    OK(C("rv_enum_case_branches", CNT + " WHERE CASE WHEN flag THEN kind ELSE if(qty > 1000, 'zz', 'a') END = 'a'",
         "CASE(Enum, data-chosen String)")),
    OK(C("rv_uuid_in_value", CNT + " WHERE uid IN (if(qty > 1000, 'zz', '00000000-0000-4000-8000-000000000000'))",
         "UUID IN (data-chosen string)")),
    OK(C("rv_least_date_string", CNT + f" WHERE least(day, {SD}) > day", "least(Date, data-chosen String)")),
    OK(C("rv_coalesce_nullable_value", CNT + " WHERE coalesce(nregion, if(qty > 1000, 'zz', 'a')) != ''",
         "coalesce of unit 42's NULL with a data-chosen string")),
    DEFECT(C("rv_uuid_eq_value", CNT + " WHERE uid = if(qty > 1000, 'zz', '00000000-0000-4000-8000-000000000000')",
             "UUID = data-chosen string"), R_PROBE),
    DEFECT(C("rv_date_eq_value", CNT + f" WHERE day = {SD}", "Date = data-chosen string"), R_PROBE),
    DEFECT(C("rv_datetime_gt_value", CNT + " WHERE ts > if(qty > 1000, 'zz', '2024-01-01 00:00:00')",
             "DateTime > data-chosen string"), R_PROBE),
    DEFECT(C("rv_bool_eq_value", CNT + " WHERE flag = if(qty > 1000, 'zz', 'true')", "Bool = data-chosen string"),
           R_PROBE),
    DEFECT(C("rv_int_eq_value", CNT + " WHERE qty = if(qty > 1000, 'zz', '1')", "Int64 = data-chosen string"), R_PROBE),
    DEFECT(C("rv_date_between_value", CNT + f" WHERE day BETWEEN {SD} AND '2025-01-01'",
             "Date BETWEEN a data-chosen string"), R_PROBE),
    # ------------------------------------------------------------ COUNT(DISTINCT expr)
    OK(C("rv_cd_split_array", "SELECT COUNT(DISTINCT splitByChar('[', name)) AS v FROM {t}",
         "COUNT(DISTINCT array) split on unit 42's '['", must_answer=True)),
    OK(C("rv_cd_tuple_nullable", "SELECT COUNT(DISTINCT (nregion, name)) AS v FROM {t}",
         "COUNT(DISTINCT (nullable, name))", must_answer=True)),
    OK(C("rv_cd_array_nullable", "SELECT COUNT(DISTINCT [nregion]) AS v FROM {t}", "COUNT(DISTINCT [nullable])")),
    OK(C("rv_cd_null_literal", "SELECT COUNT(DISTINCT NULL) AS v FROM {t}", "COUNT(DISTINCT NULL)")),
    OK(C("rv_cd_parse_or_null", "SELECT COUNT(DISTINCT toDateOrNull(name)) AS v, "
                                "COUNT(DISTINCT extract(name, '[a-z]+')) AS w FROM {t}",
         "COUNT(DISTINCT toDateOrNull / extract)", must_answer=True)),
    OK(C("rv_cd_strings_dates_public", "SELECT region, COUNT(DISTINCT toStartOfMonth(day)) AS v, "
                                       "COUNT(DISTINCT lower(name)) AS w FROM {t} GROUP BY region",
         "COUNT(DISTINCT toStartOfMonth/lower) by public keys", must_answer=True)),
    OK(C("rv_cd_typed_columns", "SELECT COUNT(DISTINCT price) AS a, COUNT(DISTINCT uid) AS b, COUNT(DISTINCT kind) AS c, "
                                "COUNT(DISTINCT ts) AS d FROM {t}", "COUNT(DISTINCT Decimal/UUID/Enum/DateTime)",
         must_answer=True)),
    OK(C("rv_cd_with_quantiles", "SELECT COUNT(DISTINCT if(qty > 1000, NULL, qty)) AS v, MIN(qty) AS lo, MAX(qty) AS hi, "
                                 "median(qty) AS m FROM {t}", "COUNT(DISTINCT NULL-iff-42) next to shared quantiles",
         must_answer=True)),
    OK(C("rv_cd_unit42_only", "SELECT COUNT(DISTINCT user_id) AS u, COUNT(DISTINCT name) AS v FROM {t} WHERE user_id = 42",
         "COUNT(DISTINCT) of unit 42's rows only", must_answer=True)),
    OK(C("rv_cd_k3_parse_public", "SELECT region, COUNT(DISTINCT toInt64OrNull(name)) AS v FROM {t} GROUP BY region",
         "COUNT(DISTINCT toInt64OrNull(name)), k = 3", pair="k3", must_answer=True)),
    OK(C("rv_cd_string_funcs", "SELECT COUNT(DISTINCT substring(name, 1, 3)) AS a, COUNT(DISTINCT match(name, '^[0-9]+$')) "
                               "AS b, COUNT(DISTINCT length(name)) AS c FROM {t}", "COUNT(DISTINCT string functions)",
         must_answer=True)),
    OK(C("rv_cd_date_funcs", "SELECT COUNT(DISTINCT toYYYYMM(day)) AS a, COUNT(DISTINCT dateDiff('day', day, "
                             "toDate('2024-01-01'))) AS b FROM {t}", "COUNT(DISTINCT toYYYYMM / dateDiff)",
         must_answer=True)),
    OK(C("rv_cd_private_keys_k3", "SELECT substring(name, 1, 2) AS g, COUNT(DISTINCT name) AS v FROM {t} GROUP BY g",
         "COUNT(DISTINCT name) under private keys, k = 3", pair="k3", delta=DELTA_SEL, must_answer=True)),
    OK(C("rv_cd_intdiv_rewritten", "SELECT COUNT(DISTINCT intDiv(qty, toInt64(qty < 1000))) AS v FROM {t}",
         "COUNT(DISTINCT intDiv by 0 on unit 42) (rewritten total)", must_answer=True)),
    # ------------------------------------------------------------ MIN / MAX / median / quantile
    OK(C("rv_q_shared_unit42_only", "SELECT MIN(amount) AS lo, MAX(amount) AS hi, median(amount) AS m FROM {t} "
                                    "WHERE user_id = 42", "shared quantiles of unit 42's rows only", must_answer=True)),
    OK(C("rv_q_levels_k3", "SELECT region, quantile(0.9)(amount) AS p90, quantiles(0.1, 0.5)(amount) AS qs "
                           "FROM {t} GROUP BY region", "quantile + quantiles by region, k = 3", pair="k3",
         must_answer=True)),
    OK(C("rv_q_expression", "SELECT MIN(amount * 2 - 1) AS lo, MAX(amount * 2 - 1) AS hi FROM {t}",
         "MIN/MAX of a bounded expression", must_answer=True)),
    OK(C("rv_q_conditional", "SELECT MAX(if(qty > 1000, amount, 0)) AS hi, median(CASE WHEN flag THEN qty ELSE 0 END) AS m "
                             "FROM {t}", "MAX/median of a conditional that picks unit 42", must_answer=True)),
    OK(C("rv_q_unbounded_parse", "SELECT MIN(toInt64OrNull(name)) AS lo FROM {t}", "MIN of an unbounded parse")),
    OK(C("rv_q_bad_level", "SELECT quantile(1.5)(amount) AS q FROM {t}", "quantile level outside [0, 1]")),
    OK(C("rv_q_date_undeclared", "SELECT median(day) AS m FROM {t}", "median of a Date without date bounds")),
    OK(C("rv_q_private_keys", "SELECT name AS g, MIN(qty) AS lo, MAX(qty) AS hi FROM {t} GROUP BY g",
         "MIN/MAX under private keys (unit 42's own name)", delta=DELTA_SEL, must_answer=True)),
    OK(C("rv_q_having_order", "SELECT region, median(amount) AS m FROM {t} GROUP BY region HAVING m > -1e9 ORDER BY region",
         "HAVING/ORDER BY over a released median", must_answer=True)),
    # ------------------------------------------------------------ string functions
    OK(C("rv_str_case_compare", CNT + " WHERE lower(name) = 'abc[x' OR upper(name) = 'X' OR lowerUTF8(name) = 'y'",
         "lower/upper/lowerUTF8")),
    OK(C("rv_str_length_substring", CNT + " WHERE length(name) > 5 AND substring(name, 5, 100) != '' "
                                          "AND left(name, 2) != right(name, 2)", "length/substring/left/right")),
    OK(C("rv_str_regexp_consts", CNT + " WHERE match(name, '^[0-9]+$') OR name REGEXP '\\\\[' OR extract(name, '[a-z]+') != ''",
         "match/REGEXP/extract with constant patterns")),
    OK(C("rv_str_like_consts", CNT + " WHERE name LIKE '%[%' OR name ILIKE '%zz%' OR name LIKE '%\\\\%'",
         "LIKE/ILIKE with constant patterns")),
    OK(C("rv_str_position_split", CNT + " WHERE position(name, '[') > 0 OR has(splitByChar('[', name), 'abc')",
         "position/splitByChar")),
    OK(C("rv_str_transform", CNT + " WHERE length(concat(reverse(name), hex(name), replaceRegexpAll(name, '[0-9]', ''), "
                                   "leftPad(name, 20, '*'), trim(name))) > 0", "reverse/hex/replaceRegexpAll/leftPad/trim")),
    OK(C("rv_str_leftpad_empty_fill", CNT + " WHERE leftPad(if(qty > 1000, '', 'xxxxxx'), 5, '') != ''",
         "leftPad with an empty fill of a data-chosen short string")),
    OK(C("rv_str_chr_ascii", CNT + " WHERE chr(qty) != '' AND ascii(name) > 0", "chr of unit 42's huge qty, ascii")),
    OK(C("rv_str_position_col_needle", CNT + " WHERE position(name, unit_s) >= 0", "position with a column needle")),
    OK(C("rv_str_lower_key", "SELECT lower(name) AS g, COUNT(*) AS n FROM {t} GROUP BY g", "lower(name) key",
         delta=DELTA_SEL, must_answer=True)),
    OK(C("rv_str_length_key", "SELECT length(name) AS g, COUNT(*) AS n FROM {t} GROUP BY g",
         "length key (only unit 42's is 11)", delta=DELTA_SEL, must_answer=True)),
    OK(C("rv_str_extract_key_k3", "SELECT extract(name, '[a-zA-Z]+') AS g, COUNT(*) AS n FROM {t} GROUP BY g",
         "extract key (non-empty only for unit 42), k = 3", pair="k3", delta=DELTA_SEL, must_answer=True)),
    OK(C("rv_str_replace_growth", CNT + " WHERE length(replaceAll(replaceAll(name, 'a', 'aaaaaaaaaa'), 'a', "
                                        "'aaaaaaaaaa')) > 0", "replaceAll growth 100x (refused)")),
    # ------------------------------------------------------------ casts and arithmetic
    OK(C("rv_cast_narrow_ints", CNT + " WHERE CAST(amount AS Int8) != 0 OR toUInt8(qty) > 0 OR CAST(big AS Int8) > 0",
         "narrow integer casts of unit 42's huge values (wrap)")),
    OK(C("rv_cast_wide_ints", CNT + " WHERE toInt128(amount * 1e300) > 0 OR toUInt256(amount * 1e300) > 0 "
                                    "OR CAST(amount * 1e300 AS Int256) > 0", "wide integer casts of a huge float")),
    OK(C("rv_cast_ipv4_uuid", CNT + " WHERE CAST(qty AS IPv4) IS NULL OR CAST(qty AS UUID) IS NULL",
         "CAST of an integer to IPv4/UUID")),
    OK(C("rv_cast_nullable_enum", CNT + " WHERE CAST(name AS Nullable(Enum8('a' = 1))) = 'a'",
         "CAST to Nullable(Enum8) (refused)")),
    OK(C("rv_accuratecast_enum", CNT + " WHERE accurateCastOrNull(name, 'Enum8(''a'' = 1)') = 'a'",
         "accurateCastOrNull to an Enum (refused)")),
    OK(C("rv_arith_wrap", CNT + " WHERE qty * 9223372036854775807 > 0 OR big * big > 0 OR negate(big) < 0 "
                                "OR abs(-9223372036854775807 - 1 + qty) > 0", "integer wrap-around")),
    OK(C("rv_arith_float", CNT + " WHERE amount / 0 > 0 OR exp(amount) > 0 OR pow(qty, qty) > 0 OR sqrt(-amount) > 0 "
                                 "OR log(amount - amount) < 0", "float arithmetic to inf/NaN")),
    OK(C("rv_arith_intdiv_float32", CNT + " WHERE intDiv(toFloat32(amount), toFloat32(0.0001)) > 0",
         "intDiv of Float32 (Int32 result) over unit 42's amount")),
    OK(C("rv_arith_intdiv_wrapped", CNT + " WHERE intDiv(big * 1000000, -1) < 0", "intDiv of a wrapped UInt64")),
    OK(C("rv_arith_modulo_zero", CNT + " WHERE moduloOrZero(qty, toInt64(qty < 1000)) >= 0 AND qty % toInt64(qty < 1000) "
                                       ">= 0", "modulo by 0 on unit 42 (total)")),
    OK(C("rv_arith_shift", CNT + " WHERE bitShiftLeft(qty, 70) >= 0", "shift by 70")),
    OK(C("rv_sum_intdiv_tiny", "SELECT SUM(intDiv(amount, 0.00000000000000010836)) AS s FROM {t}",
         "SUM of an intDiv whose quotient exceeds Int64 only at the clipped bound")),
    # ------------------------------------------------------------ CASE / if / multiIf in aggregates
    OK(C("rv_sum_case", "SELECT SUM(CASE WHEN qty > 1000 THEN amount ELSE 0 END) AS s, "
                        "SUM(multiIf(qty > 1000, amount, flag, 1, 0)) AS t FROM {t}", "SUM(CASE/multiIf picking unit 42)",
         must_answer=True)),
    OK(C("rv_count_if_null", "SELECT COUNT(if(qty > 1000, NULL, 1)) AS n, AVG(if(user_id = 42, amount, NULL)) AS a FROM {t}",
         "COUNT/AVG of NULL-iff-42 values", must_answer=True)),
    OK(C("rv_sumif_avgif", "SELECT sumIf(amount, qty > 1000) AS s, avgIf(qty, flag) AS a FROM {t}", "sumIf/avgIf",
         must_answer=True)),
    # ------------------------------------------------------------ GROUP BY / HAVING / ORDER BY … LIMIT
    OK(C("rv_key_if_public", "SELECT if(qty > 1000, 'big', region) AS r, COUNT(*) AS n FROM {t} GROUP BY r",
         "key expression renaming unit 42's rows, keys given", options={"keys": {"r": ["EU", "US", "big"]}})),
    OK(C("rv_two_public_keys", "SELECT region, kind, COUNT(*) AS n FROM {t} GROUP BY region, kind",
         "two public keys", options={"keys": {"kind": ["a", "b"]}}, must_answer=True)),
    OK(C("rv_having_limit", "SELECT region, SUM(amount) AS s FROM {t} GROUP BY region HAVING s > -1e12 "
                            "ORDER BY region LIMIT 2", "HAVING + ORDER BY key + LIMIT", must_answer=True)),
    OK(C("rv_having_key_filter", "SELECT region, COUNT(*) AS n FROM {t} GROUP BY region HAVING region != 'EU'",
         "HAVING on a public key", must_answer=True)),
    OK(C("rv_topk_sum_k3", "SELECT region, SUM(qty) AS s FROM {t} GROUP BY region ORDER BY s DESC LIMIT 1",
         "top-1 by a sum of unit 42's clipped qty", pair="k3", options={"top_k": "peeling"}, must_answer=True)),
    OK(C("rv_topk_post_processing", "SELECT region, COUNT(*) AS n FROM {t} GROUP BY region ORDER BY n DESC LIMIT 2",
         "top-2 by post-processing", options={"top_k": "post_processing"}, must_answer=True)),
    OK(C("rv_topk_having", "SELECT region, COUNT(*) AS n FROM {t} GROUP BY region HAVING n > 0 ORDER BY n DESC LIMIT 2",
         "top-2 with HAVING", options={"top_k": "peeling"})),
    OK(C("rv_order_by_parse_limit", "SELECT region, COUNT(*) AS n FROM {t} GROUP BY region "
                                    "ORDER BY toInt64(toString(n)) LIMIT 1", "ORDER BY a parse of a noisy count")),
    # ------------------------------------------------------------ joins with a public table
    OK(C("rv_join_public_label", f"SELECT p.label AS label, COUNT(*) AS n FROM {{t}} AS t JOIN {PUB} AS p "
                                 "ON t.region = p.region GROUP BY label", "public label via a region join",
         must_answer=True)),
    OK(C("rv_join_public_unit", f"SELECT COUNT(*) AS n FROM {{t}} AS t JOIN {PUB} AS p ON t.user_id = p.k",
         "singling out unit 42 through a public table")),
    OK(C("rv_left_join_on_paren_decimal", f"SELECT COUNT(*) AS n FROM {{t}} AS t LEFT JOIN {PUB} AS p "
                                          "ON t.user_id = p.k AND (t.price) / (t.qty < 1000) > 0",
         "LEFT JOIN ON with a private condition (refused)")),
    LEAK(C("rv_join_where_adddays", f"SELECT COUNT(*) AS n FROM {{t}} AS t JOIN {PUB} AS p ON t.region = p.region "
                                    f"WHERE addDays({SD}, 1) > t.day", "joined WHERE with addDays of a string"),
         R_STRDATE),
    LEAK(C("rv_join_where_paren_decimal", f"SELECT COUNT(*) AS n FROM {{t}} AS t JOIN {PUB} AS p ON t.region = p.region "
                                          f"WHERE (t.price) / (t.qty < 1000) > 0", "joined WHERE dividing a Decimal"),
         R_PAREN),
    LEAK(C("rv_join_where_tz", f"SELECT COUNT(*) AS n FROM {{t}} AS t JOIN {PUB} AS p ON t.user_id = p.k "
                               "WHERE toString(t.ts, if(t.qty > 1000, 'zz', 'UTC')) != ''",
           "joined WHERE with a data-chosen zone"), R_TZ),
    # ------------------------------------------------------------ SQL-text and option injections
    OK(C("rv_inj_settings", CNT + " SETTINGS max_rows_to_read = 1993, read_overflow_mode = 'throw'",
         "a row-count limit between |D′| and |D| (refused)")),
    OK(C("rv_inj_format", CNT + " FORMAT JSON", "FORMAT clause (refused)")),
    OK(C("rv_inj_two_statements", CNT + "; SELECT 1", "two statements (refused)")),
    OK(C("rv_inj_comment_settings", CNT + " WHERE qty > 0 -- */ SETTINGS max_rows_to_read = 1993, "
                                          "read_overflow_mode = 'throw' /*\n", "a line comment closing a block comment")),
    OK(C("rv_inj_string_escape", CNT + " WHERE name = 'x\\' OR user_id = 42 --'", "backslash-escaped quote")),
    OK(C("rv_inj_keys_quotes", "SELECT region, COUNT(*) AS n FROM {t} GROUP BY region", "quotes in keys=",
         options={"keys": {"region": ["EU'); DROP TABLE x; --", "a\\", "US"]}}, must_answer=True)),
    OK(C("rv_inj_huge_bounds_option", "SELECT region, SUM(amount) AS s FROM {t} GROUP BY region", "max_rows_per_unit=2^63",
         options={"max_rows_per_unit": 2 ** 63})),
]


@pytest.fixture(scope="module")
def public_table(adb):
    adb.command(f"DROP TABLE IF EXISTS {PUB}")
    adb.command(f"CREATE TABLE {PUB} (region String, label String, k UInt64) ENGINE = MergeTree ORDER BY region")
    adb.command(f"INSERT INTO {PUB} VALUES ('EU', 'europe', 42), ('US', 'americas', 7), ('ASIA', 'asia', 8)")
    adb.catalog.register(PUB, public=True)
    return PUB


@pytest.mark.parametrize("case", CASES)
def test_attack_review(adb, public_table, case):
    check_case(adb, case)


def test_review_corpus_ids_unique():
    ids = [p.values[0].id for p in CASES]
    assert len(ids) == len(set(ids))
