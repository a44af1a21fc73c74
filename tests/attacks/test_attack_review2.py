"""Second adversarial review (2026-11-25) of the controller under the D / D′ rule of test_attacks.py:
the same outcome on D and D′ (rejected before the charge with the same message, or answered on
both with the same columns, row count and public keys, charged on both; never charged and then
failed), and no message holding one of unit 42's values (harness.SECRETS).

It covers what test_attack_review.py did not: type names of accurateCastOrNull targets spelled in
another case, per-key subqueries (``IN (SELECT … GROUP BY unit HAVING …)`` and per-unit FROM
subqueries / CTEs) whose HAVING does arithmetic on MIN/MAX, the cost of string functions whose
output grows without being counted by MAX_GROWTH, aggregates over values that are NaN only for
unit 42, public tables with Decimal / DateTime64 columns, derived tables and CTEs with row-level
expressions, result shapes (no aggregate, LIMIT 0, OFFSET, FILTER, aliases), more allowlisted
scalar functions on extreme values, and the order / dtypes of released rows.

Cases marked ``LEAK`` break the rule today and are ``xfail(strict=True)``: each reason names the
exact channel and the suspected code. They must start passing (and then lose the mark) when fixed.

Literals in the SQL below avoid the values in harness.SECRETS.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from . import harness
from .harness import PAIRS
from .test_attacks import DELTA_SEL, C, check_case

CNT = "SELECT COUNT(*) AS n FROM {t}"
Z42 = "(qty < 1000)"  # UInt8, 0 on unit 42's rows only (its qty is huge; every other unit's is in [-100, 100])
SJ = CNT + " WHERE user_id IN (SELECT user_id FROM {t} GROUP BY user_id HAVING %s)"  # per-unit semi-join
NAN = "sqrt(1000 - amount)"  # NaN on unit 42's rows only (its amount is far above 1000)

PUB2 = f"{harness.DB}.rv2_pub"  # a public table with Decimal / DateTime64 / String columns (module fixture)
J = f"SELECT COUNT(*) AS n FROM {{t}} AS t JOIN {PUB2} AS p ON t.region = p.region WHERE "


def OK(case):
    return pytest.param(case, id=case.id)


def LEAK(case, reason: str):
    """A D / D′ side channel found by this review: strict xfail while open, a plain case once fixed."""
    if reason in FIXED:
        return pytest.param(case, id=case.id)
    return pytest.param(case, id=case.id, marks=pytest.mark.xfail(strict=True, reason="LEAK: " + reason))


R_DECIMAL_CASE = ("accurateCastOrNull(x, 'decimal(18, 4)') (any spelling of a Decimal target but 'Decimal…': "
                  "'decimal(…)', 'DECIMAL(…)', 'decimal64(4)', 'Nullable(decimal(…))') keeps a Decimal: "
                  "dpch/totality.py _Totalizer.rewrite replaces the target by Float64 only when "
                  "base_type(target).startswith('Decimal') (case-sensitive), while _check_target accepts it "
                  "case-insensitively ('decimal' in _NULLABLE_TARGETS); the Decimal division by a value that is 0 "
                  "only on unit 42's rows then throws ILLEGAL_DIVISION (code 153) on D only, after the charge")
FIXED = set()  # filled below the reasons

R_HAVING_MINMAX = ("HAVING of a per-key subquery (IN (SELECT user_id … GROUP BY user_id HAVING …) and per-unit "
                   "FROM subqueries / CTEs) may divide MIN/MAX of a Decimal column: "
                   "dpch/relation/semijoins.py _aggregate_argument converts only SUM/AVG arguments to Float64, and "
                   "the totality pass leaves a bare Decimal column (the whole expression) as it is, so "
                   "MIN(price) / (COUNT(*) - 6) or / (MIN(qty) < 1000) throws ILLEGAL_DIVISION (code 153) for unit "
                   "42's group only: error on D, answer on D′, after the charge")


FIXED.add(R_DECIMAL_CASE)  # the Decimal target check is case-insensitive now (dpch/totality.py)
FIXED.add(R_HAVING_MINMAX)  # MIN/MAX of a Decimal run in Float64 in HAVING (dpch/relation/semijoins.py)


def _blow(x: str, k: int, shape: str = "toString([{x}])") -> str:
    for _ in range(k):
        x = shape.format(x=x)
    return x


CASES = [
    # ------------------------------------------------------------ accurateCastOrNull target spelled in lower case
    LEAK(C("rv2_acn_decimal_lower", CNT + f" WHERE accurateCastOrNull(amount, 'decimal(18, 4)') / {Z42} > 0",
           "accurateCastOrNull to 'decimal(…)', divided by 0 on unit 42"), R_DECIMAL_CASE),
    LEAK(C("rv2_acn_decimal_upper", CNT + f" WHERE accurateCastOrNull(amount, 'DECIMAL(18, 4)') / {Z42} > 0",
           "accurateCastOrNull to 'DECIMAL(…)'"), R_DECIMAL_CASE),
    LEAK(C("rv2_acn_decimal64_lower", CNT + f" WHERE accurateCastOrNull(amount, 'decimal64(4)') / {Z42} > 0",
           "accurateCastOrNull to 'decimal64(4)'"), R_DECIMAL_CASE),
    LEAK(C("rv2_acn_nullable_decimal_lower", CNT + f" WHERE accurateCastOrNull(amount, 'Nullable(decimal(18, 4))') "
                                                   f"/ {Z42} > 0", "accurateCastOrNull to 'Nullable(decimal(…))'"),
         R_DECIMAL_CASE),
    LEAK(C("rv2_acn_decimal_countif", f"SELECT countIf(accurateCastOrNull(amount, 'decimal(18, 4)') / {Z42} > 0) AS n "
                                      "FROM {t}", "countIf condition"), R_DECIMAL_CASE),
    LEAK(C("rv2_acn_decimal_key", f"SELECT accurateCastOrNull(amount, 'decimal(18, 4)') / {Z42} > 0 AS g, COUNT(*) AS n "
                                  "FROM {t} GROUP BY g", "GROUP BY key", delta=DELTA_SEL), R_DECIMAL_CASE),
    LEAK(C("rv2_acn_decimal_public_keys", f"SELECT region, COUNT(*) AS n FROM {{t}} WHERE accurateCastOrNull(qty, "
                                          f"'decimal(18, 4)') / {Z42} > 0 GROUP BY region", "public keys + WHERE"),
         R_DECIMAL_CASE),
    LEAK(C("rv2_acn_decimal_semijoin", CNT + f" WHERE user_id IN (SELECT user_id FROM {{t}} WHERE "
                                             f"accurateCastOrNull(amount, 'decimal(18, 4)') / {Z42} > 0)",
           "semi-join subquery WHERE"), R_DECIMAL_CASE),
    OK(C("rv2_acn_decimal_canonical", CNT + f" WHERE accurateCastOrNull(amount, 'Decimal(18, 4)') / {Z42} > 0",
         "canonical spelling (made Float64)", must_answer=True)),
    OK(C("rv2_trycast_decimal_lower", CNT + f" WHERE TRY_CAST(amount AS decimal(18, 4)) / {Z42} > 0",
         "TRY_CAST to decimal (sqlglot normalises the type)", must_answer=True)),
    OK(C("rv2_cast_str_decimal_lower", CNT + f" WHERE CAST(amount, 'decimal(18, 4)') / {Z42} > 0",
         "CAST(x, 'decimal(…)') (refused)")),
    OK(C("rv2_acn_decimal_mul", CNT + " WHERE accurateCastOrNull(qty, 'decimal(9, 4)') * accurateCastOrNull(qty, "
                                      "'decimal(9, 4)') > 0", "Decimal product of unit 42's qty (no overflow check)")),
    # ------------------------------------------------------------ per-key subqueries: HAVING arithmetic on MIN/MAX
    LEAK(C("rv2_sj_having_min_decimal", SJ % "MIN(price) / (MIN(qty) < 1000) > 0",
           "semi-join HAVING MIN(Decimal) / 0 iff unit 42"), R_HAVING_MINMAX),
    LEAK(C("rv2_sj_having_max_decimal", SJ % "MAX(price) / (MAX(qty) < 1000) > 0",
           "semi-join HAVING MAX(Decimal) / 0 iff unit 42"), R_HAVING_MINMAX),
    LEAK(C("rv2_sj_having_min_decimal_count", SJ % "MIN(price) / (COUNT(*) - 6) > 0",
           "semi-join HAVING MIN(Decimal) / (COUNT(*) - 6): 0 only for unit 42's 6 rows"), R_HAVING_MINMAX),
    LEAK(C("rv2_per_unit_having_min_decimal", "SELECT COUNT(*) AS n FROM (SELECT user_id, MIN(price) AS p, COUNT(*) AS c "
                                              "FROM {t} GROUP BY user_id HAVING MIN(price) / (COUNT(*) - 6) > 0) AS x",
           "per-unit FROM subquery HAVING"), R_HAVING_MINMAX),
    LEAK(C("rv2_cte_having_min_decimal", "WITH x AS (SELECT user_id, MIN(price) AS p FROM {t} GROUP BY user_id "
                                         "HAVING MIN(price) / (MIN(qty) < 1000) > 0) SELECT COUNT(*) AS n FROM x",
           "per-unit CTE HAVING"), R_HAVING_MINMAX),
    OK(C("rv2_sj_having_avg_decimal", SJ % "AVG(price) / (COUNT(*) - 6) > 0", "AVG runs in Float64", must_answer=True)),
    OK(C("rv2_sj_having_min_todecimal", SJ % "MIN(toDecimal64(amount, 4)) / (COUNT(*) - 6) > 0",
         "MIN of toDecimal64 (rewritten to Float64)", must_answer=True)),
    OK(C("rv2_sj_having_min_cast_decimal", SJ % "MIN(CAST(amount AS Decimal(18, 4))) / (COUNT(*) - 6) > 0",
         "MIN of a CAST to Decimal (rewritten to Float64)", must_answer=True)),
    OK(C("rv2_sj_having_decimal_pow", SJ % "MIN(price) * MIN(price) * MIN(price) * MIN(price) > 0",
         "Decimal product in HAVING (decimal_check_overflow = 0)")),
    OK(C("rv2_sj_having_decimal_cmp", SJ % "MIN(price) < MIN(qty) * 1000000000000", "Decimal compared with a huge Int64")),
    OK(C("rv2_sj_having_int_div", SJ % "MIN(qty) * 1000000000000 / (MIN(qty) < 1000) > 0", "integer / 0 is a float")),
    OK(C("rv2_sj_having_intdiv_arg", SJ % "MIN(intDiv(1, qty < 1000)) > 0", "intDiv inside MIN (made total)")),
    OK(C("rv2_sj_having_modulo", SJ % "MIN(qty) % (COUNT(*) - 6) > 0", "% in HAVING (refused)")),
    OK(C("rv2_sj_having_string", SJ % "MIN(name) > 5", "String MIN compared with a number (refused)")),
    OK(C("rv2_sj_having_acn_string_literal", SJ % "MIN(accurateCastOrNull(amount, 'decimal(18, 4)')) / (COUNT(*) - 6) > 0",
         "string literal in HAVING (refused)")),
    OK(C("rv2_sj_having_datetime", SJ % "MIN(ts) - MIN(qty) * 100000000000 > 0", "DateTime minus a huge integer")),
    OK(C("rv2_per_unit_outer_decimal", "SELECT COUNT(*) AS n FROM (SELECT user_id, MIN(price) AS p, MIN(qty) AS m FROM {t} "
                                       "GROUP BY user_id) AS x WHERE (p) / (m < 1000) > 0",
         "per-unit Decimal output divided in the outer WHERE (converted)", must_answer=True)),
    # ------------------------------------------------------------ cost of growth not counted by MAX_GROWTH
    # (answers are identical; its timing channel, ClickHouse's query condition cache, which let repeated
    # runs on D′ skip the granule (0.01 s vs 0.13 s on D), is closed by use_query_condition_cache = 0)
    OK(C("rv2_growth_tostring_array", CNT + " WHERE user_id = 42 AND length(" + _blow("name", 12) + ") > 0",
         "toString([...]) nested 12 times (answered)")),
    OK(C("rv2_growth_concat_counted", CNT + " WHERE length(" + _blow("name", 7, "concat({x}, {x})") + ") > 0",
         "concat nested 7 times: growth 128 > MAX_GROWTH (refused)")),
    # ------------------------------------------------------------ aggregates of values NaN only for unit 42
    OK(C("rv2_nan_avg_var", f"SELECT AVG({NAN}) AS a, VAR_POP({NAN}) AS v, STDDEV_SAMP({NAN}) AS sd FROM {{t}}",
         "AVG/VAR/STDDEV of NaN-iff-42", must_answer=True)),
    OK(C("rv2_nan_min_max_median", f"SELECT MIN({NAN}) AS lo, MAX({NAN}) AS hi, median({NAN}) AS m FROM {{t}}",
         "MIN/MAX/median of NaN-iff-42", must_answer=True)),
    OK(C("rv2_nan_quantiles", f"SELECT quantiles(0.1, 0.9)({NAN}) AS qs FROM {{t}}", "quantiles of NaN-iff-42",
         must_answer=True)),
    OK(C("rv2_nan_count_distinct", f"SELECT COUNT({NAN}) AS c, COUNT(DISTINCT {NAN}) AS d FROM {{t}}",
         "COUNT / COUNT(DISTINCT) of NaN-iff-42", must_answer=True)),
    OK(C("rv2_nan_public_keys", f"SELECT region, AVG({NAN}) AS a, SUM({NAN}) AS s FROM {{t}} GROUP BY region",
         "AVG/SUM of NaN-iff-42 by public keys", must_answer=True)),
    OK(C("rv2_nan_if_aggs", f"SELECT sumIf({NAN}, {NAN} > 0) AS s, avgIf(amount, isNaN({NAN})) AS a FROM {{t}}",
         "sumIf/avgIf with NaN conditions", must_answer=True)),
    OK(C("rv2_nan_clamped", f"SELECT SUM(least(greatest({NAN}, 0), 10)) AS s FROM {{t}}", "least/greatest of NaN",
         must_answer=True)),
    OK(C("rv2_nan_k3_public", f"SELECT region, MAX({NAN}) AS hi, COUNT(*) AS n FROM {{t}} GROUP BY region",
         "MAX of NaN-iff-42 at k = 3", pair="k3", must_answer=True)),
    OK(C("rv2_nan_private_keys", f"SELECT isNaN({NAN}) AS g, COUNT(*) AS n FROM {{t}} GROUP BY g",
         "key true only for unit 42", delta=DELTA_SEL, must_answer=True)),
    OK(C("rv2_inf_sum_bounds", "SELECT SUM(least(exp(amount), 10)) AS s FROM {t}", "inf only for unit 42, clamped (bounds overflow: refused)")),
    # ------------------------------------------------------------ public tables with Decimal / DateTime64 columns
    OK(C("rv2_pub_decimal_div", J + "p.w / (t.qty < 1000) > 0", "public Decimal / 0 on unit 42's rows",
         must_answer=True)),
    OK(C("rv2_pub_decimal_paren_div", J + "(p.w) / (t.qty < 1000) > 0", "(public Decimal) / 0", must_answer=True)),
    OK(C("rv2_pub_decimal_mul", J + "p.w * t.qty * 100000000000000 > 0", "public Decimal * a huge private Int64")),
    OK(C("rv2_pub_dt64_interval", J + "p.d + INTERVAL (t.qty * 1000000000) SECOND > p.d",
         "public DateTime64 + a huge private interval (refused)")),
    OK(C("rv2_pub_dt64_addseconds", J + "addSeconds(p.d, t.qty * 1000000000) > p.d", "addSeconds on DateTime64")),
    OK(C("rv2_pub_dt64_compare", J + "p.d < t.ts", "DateTime64 compared with a private DateTime")),
    OK(C("rv2_pub_string_todate", J + "toDate(if(t.qty > 1000, p.s, '2024-01-01')) > t.day",
         "toDate of a public malformed string picked by unit 42", must_answer=True)),
    OK(C("rv2_pub_string_adddays", J + "addDays(p.s, 1) > t.day", "addDays of a public String (refused)")),
    OK(C("rv2_pub_decimal_key", f"SELECT p.w AS w, COUNT(*) AS n FROM {{t}} AS t JOIN {PUB2} AS p ON t.region = p.region "
                                "GROUP BY w", "public Decimal key", must_answer=True)),
    OK(C("rv2_pub_decimal_sum_where", f"SELECT SUM(t.amount) AS s FROM {{t}} AS t JOIN {PUB2} AS p "
                                      "ON t.region = p.region WHERE p.w / (t.qty < 1000) > 0", "SUM + public Decimal",
         must_answer=True)),
    # ------------------------------------------------------------ derived tables and CTEs with row expressions
    OK(C("rv2_derived_parse", "SELECT COUNT(*) AS n FROM (SELECT user_id, toInt64(name) AS z FROM {t}) AS x WHERE z > 0",
         "derived column parses unit 42's name", must_answer=True)),
    OK(C("rv2_derived_unused_intdiv", f"SELECT COUNT(*) AS n FROM (SELECT user_id, intDiv(1, {Z42}) AS z FROM {{t}}) AS x",
         "unused derived column divides by 0", must_answer=True)),
    OK(C("rv2_cte_decimal_div", f"WITH x AS (SELECT user_id, price / {Z42} AS z FROM {{t}}) SELECT COUNT(*) AS n FROM x "
                                "WHERE z > 0", "CTE column dividing a Decimal", must_answer=True)),
    OK(C("rv2_cte_where_paren_decimal", f"WITH x AS (SELECT user_id, qty FROM {{t}} WHERE (price) / {Z42} > 0) "
                                        "SELECT COUNT(*) AS n FROM x", "CTE WHERE dividing a parenthesised Decimal",
         must_answer=True)),
    # ------------------------------------------------------------ result shapes
    OK(C("rv2_shape_no_aggregate", "SELECT 1 AS x FROM {t} WHERE user_id = 42", "rows without an aggregate (refused)")),
    OK(C("rv2_shape_constant_public_groups", "SELECT 1 AS x FROM {t} WHERE user_id = 42 GROUP BY region",
         "a constant per public group", must_answer=True)),
    OK(C("rv2_shape_keys_only_public", "SELECT region FROM {t} WHERE user_id = 42 GROUP BY region",
         "public keys without an aggregate", must_answer=True)),
    OK(C("rv2_shape_keys_only_private", "SELECT name FROM {t} GROUP BY name", "private keys without an aggregate",
         delta=DELTA_SEL, must_answer=True)),
    OK(C("rv2_shape_group_by_unit", "SELECT user_id, COUNT(*) AS n FROM {t} GROUP BY user_id",
         "grouping by the unit (refused)", delta=DELTA_SEL)),
    OK(C("rv2_shape_limit0", CNT + " LIMIT 0", "LIMIT 0", must_answer=True)),
    OK(C("rv2_shape_offset", CNT + " LIMIT 1 OFFSET 1", "OFFSET past the one row", must_answer=True)),
    OK(C("rv2_shape_public_offset", "SELECT region, COUNT(*) AS n FROM {t} GROUP BY region ORDER BY region LIMIT 2 "
                                    "OFFSET 3", "OFFSET over public keys", must_answer=True)),
    OK(C("rv2_shape_filter_clause", "SELECT COUNT(*) FILTER (WHERE toInt64(name) > 0) AS n FROM {t}",
         "FILTER (WHERE parse) (refused)")),
    OK(C("rv2_shape_alias_shadows_key", "SELECT name AS region, COUNT(*) AS n FROM {t} GROUP BY region",
         "a private column aliased as the public key (refused)")),
    OK(C("rv2_shape_alias_if_key", "SELECT if(qty > 1000, 'NEW', region) AS region, COUNT(*) AS n FROM {t} "
                                   "GROUP BY region", "alias renaming unit 42's rows (refused)")),
    OK(C("rv2_shape_public_expr_key", "SELECT lower(region) AS r, COUNT(*) AS n FROM {t} GROUP BY r",
         "expression of a public key column", must_answer=True)),
    OK(C("rv2_shape_distinct", "SELECT DISTINCT region FROM {t}", "SELECT DISTINCT (refused)")),
    OK(C("rv2_shape_union", CNT + " UNION ALL " + CNT + " WHERE user_id = 42", "UNION ALL (refused)")),
    OK(C("rv2_shape_window", "SELECT region, COUNT(*) OVER (PARTITION BY region) AS n FROM {t}", "window (refused)")),
    OK(C("rv2_shape_arrayjoin", CNT + " WHERE arrayJoin(splitByChar('1', name)) != ''", "arrayJoin (refused)")),
    OK(C("rv2_shape_lambda", CNT + " WHERE arrayExists(x -> x = 'a', splitByChar('1', name))", "lambda (refused)")),
    OK(C("rv2_shape_scalar_subquery", CNT + " WHERE qty > (SELECT max(qty) FROM {t})", "scalar subquery (refused)")),
    # ------------------------------------------------------------ allowlisted scalar functions on extreme values
    OK(C("rv2_fn_dayofweek_mode", CNT + " WHERE toDayOfWeek(day, if(qty > 1000, 99, 0)) > 0",
         "toDayOfWeek with a data-chosen mode (refused)")),
    OK(C("rv2_fn_trim_column_chars", CNT + " WHERE trim(BOTH unit_s FROM name) != ''", "trim characters from a column")),
    OK(C("rv2_fn_concat_ws_column_sep", CNT + " WHERE concatWithSeparator(unit_s, name, name) != ''",
         "concatWithSeparator with a column separator")),
    OK(C("rv2_fn_round_huge_digits", CNT + " WHERE round(amount, 400) > 0 AND round(qty, -30) >= 0",
         "round with huge constant digits")),
    OK(C("rv2_fn_position_empty_needle", CNT + " WHERE position(name, '', 100) >= 0 AND locate(name, 'a', qty) >= 0",
         "position with an empty needle / a column start")),
    OK(C("rv2_fn_tostartofinterval_huge", CNT + " WHERE toStartOfInterval(day, INTERVAL 100000 YEAR) <= day AND "
                                                "toStartOfInterval(ts, INTERVAL 1000000000 SECOND) <= ts",
         "toStartOfInterval with huge constants")),
    OK(C("rv2_fn_tostartofinterval_origin", CNT + " WHERE toStartOfInterval(ts, INTERVAL 1 DAY, if(qty > 1000, ts + 100, "
                                                  "toDateTime('2000-01-01 00:00:00'))) <= ts",
         "toStartOfInterval with a data-chosen origin (refused)")),
    OK(C("rv2_fn_relative_nums", CNT + " WHERE timeSlot(ts) <= ts AND toRelativeWeekNum(day) > 0 "
                                       "AND toRelativeMonthNum(ts) > 0 AND toLastDayOfMonth(day) > day",
         "timeSlot / toRelative*Num on 2099 dates")),
    OK(C("rv2_fn_fromunixtimestamp_huge", CNT + " WHERE fromUnixTimestamp(qty * 1000000000000) > ts",
         "fromUnixTimestamp of a huge Int64")),
    OK(C("rv2_fn_split_whitespace_col", CNT + " WHERE length(splitByWhitespace(name, qty)) > 0",
         "splitByWhitespace with a column max_substrings")),
    OK(C("rv2_fn_initcap_unhex_chr", CNT + " WHERE initcap(name) != '' AND unhex(name) != '' AND chr(big) != ''",
         "initcap / unhex / chr of unit 42's values")),
    OK(C("rv2_fn_sha2_widths", CNT + " WHERE sha2(name, 512) != '' AND sha2(name, qty) != ''", "sha2 widths")),
    OK(C("rv2_fn_shift_operator", CNT + " WHERE (if(qty > 1000, '', 'abcd') << 8) != ''",
         "bit shift of a String shorter than the shift (refused)")),
    OK(C("rv2_fn_float_to_int", CNT + " WHERE toInt64(exp(amount)) > 0 AND CAST(exp(amount) AS Int64) > 0 "
                                      "AND toUInt8(sqrt(-amount)) > 0 AND toUInt64(amount * 1e30) > 0",
         "inf/NaN/huge floats to integers")),
    OK(C("rv2_fn_float_to_date", CNT + " WHERE toDate(amount * 1e30) > day AND CAST(amount * 1e30 AS DateTime) > ts",
         "huge floats to dates")),
    OK(C("rv2_fn_wide_intdiv", CNT + " WHERE intDiv(toInt256(qty), toInt256(qty < 1000)) >= 0 "
                                     "AND intDiv(toInt128(amount), 0.0000001) >= 0", "intDiv on Int128/256")),
    OK(C("rv2_fn_ip_casts", CNT + " WHERE CAST(if(qty > 1000, 'zz', '1.2.3.4') AS IPv4) IS NOT NULL "
                                  "AND CAST(if(qty > 1000, 'zz', '::1') AS IPv6) IS NOT NULL",
         "IPv4/IPv6 casts of data-chosen strings")),
    OK(C("rv2_fn_acn_targets", CNT + " WHERE accurateCastOrNull(name, 'Bool') OR accurateCastOrNull(amount * 1e30, "
                                     "'Int256') > 0 OR accurateCastOrNull(name, 'Date32') > day "
                                     "OR accurateCastOrNull(name, 'DateTime(''UTC'')') > ts",
         "accurateCastOrNull to Bool/Int256/Date32/DateTime(tz)")),
    OK(C("rv2_fn_date_parts_2099", CNT + " WHERE toWeek(day, 3) > 0 AND toYYYYMMDDhhmmss(ts) > 0 "
                                         "AND formatDateTime(ts, '%Q %f') != '' AND age('year', day, ts) > 0",
         "date parts of 2099 dates")),
]


@pytest.fixture(scope="module")
def public_table2(adb):
    adb.command(f"DROP TABLE IF EXISTS {PUB2}")
    adb.command(f"CREATE TABLE {PUB2} (region String, w Decimal(18, 4), d DateTime64(3), s String) "
                "ENGINE = MergeTree ORDER BY region")
    adb.command(f"INSERT INTO {PUB2} VALUES ('EU', 1.5, '2024-01-01 00:00:00', 'zz'), "
                "('US', 2.5, '2024-01-01 00:00:00', '2024-01-01'), ('ASIA', 3.5, '2024-01-01 00:00:00', '2024-01-01')")
    adb.catalog.register(PUB2, public=True)
    return PUB2


def _finite_values(o) -> None:
    """Released numbers are finite: noise never gives NaN/inf, so one would reveal unit 42."""
    if o.status != "ok":
        return
    meta = (o.df.attrs.get("dpch", {}) or {}).get("columns", {}) or {}
    for col in o.df.columns:
        if (meta.get(col) or {}).get("kind") == "key":
            continue
        for v in o.df[col]:
            for x in np.atleast_1d(np.asarray(v, dtype=object)):
                if isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool):
                    assert math.isfinite(float(x)), f"column {col} released a non-finite value {x!r}"


@pytest.mark.parametrize("case", CASES)
def test_attack_review2(adb, public_table2, case):
    o, o_minus = check_case(adb, case)
    _finite_values(o)
    _finite_values(o_minus)


def test_review2_corpus_ids_unique():
    ids = [p.values[0].id for p in CASES]
    assert len(ids) == len(set(ids))


# --------------------------------------------------------------------------------------------------
# Order and dtypes of released rows
# --------------------------------------------------------------------------------------------------

ORDER_QUERIES = [
    ("SELECT region, COUNT(*) AS n FROM {t} GROUP BY region", {}),
    ("SELECT qty, COUNT(*) AS n FROM {t} GROUP BY qty", {"keys": {"qty": [5000, 1, 2, -5]}}),
    ("SELECT nregion, COUNT(*) AS n FROM {t} GROUP BY nregion", {"keys": {"nregion": [None, "EU", "US"]}}),
    ("SELECT day, COUNT(*) AS n FROM {t} GROUP BY day", {"keys": {"day": ["2099-12-30", "2024-01-01", "2024-01-02"]}}),
]


@pytest.mark.parametrize("sql, options", ORDER_QUERIES, ids=["region", "qty_keys", "nregion_null_key", "day_keys"])
def test_public_rows_order_and_dtypes(adb, sql, options):
    """Without ORDER BY, the released public keys come in the same order with the same dtypes on D
    and D′ (an order that followed the data would be a channel the sorted-key check misses)."""
    shapes = []
    for table in PAIRS["k1"].tables:
        df = adb.query(sql.format(t=table), epsilon=1.0, **options)
        shapes.append(([harness._keyval(v) for v in df.iloc[:, 0]], [str(t) for t in df.dtypes]))
    assert shapes[0] == shapes[1], shapes
