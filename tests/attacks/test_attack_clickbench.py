"""Attack cases for the query shapes of the ClickBench-style workload (issue 17), under the D / D′
rule of test_attacks.py (same success or failure, same message, same public keys and row count,
charged on both; no message contains unit 42's values).

The pair ``cb`` copies the corpus table ``attacks.d`` (unit 42's name, 11 bytes, is the longest;
every other name has 4) and registers it at k = 3, M = 10 with the declared length bound
``length(name) ∈ [0, 8]``, which unit 42's name exceeds. New shapes: ``length()`` of a String column
inside aggregates (ClickBench Q27), ``GROUP BY 1`` of a constant SELECT item (Q34), many sums of
shifted values (Q29), several keys that are functions of one column (Q35), a CASE key over a string
(Q39), a DATE_TRUNC key ordered by itself with an OFFSET (Q42), and MIN/MAX/median of Date and
DateTime columns bounded by declared dates (Q6; unit 42's dates are in 2099); MIN/MAX/median of one
column sharing one per-unit histogram and COUNT(DISTINCT) over packed value hashes with a NULL bit.
"""
from __future__ import annotations

import pytest

from . import harness
from .test_attacks import DELTA_SEL, C, check_case

PAIR = "cb"
LENGTH_BOUND = 8
# unit 42's day (2099-12-31) and ts (2099-12-31 23:59:59) are far above these
DATE_BOUNDS = {"day": ("2024-01-01", "2024-12-31"), "ts": ("2024-01-01 00:00:00", "2025-01-01 00:00:00")}


@pytest.fixture(scope="module")
def cb_pair(adb):
    pair = harness.Pair("cb", "cb_minus")
    full, minus = pair.tables
    for t in (full, minus):
        adb.command(f"DROP TABLE IF EXISTS {t}")
        adb.command(f"CREATE TABLE {t} AS {harness.DB}.d")
    adb.command(f"INSERT INTO {full} SELECT * FROM {harness.DB}.d")
    adb.command(f"INSERT INTO {minus} SELECT * FROM {harness.DB}.d_minus")
    for t in (full, minus):
        adb.catalog.register(t, privacy_unit="user_id",
                             bounds={**harness.BOUNDS, "length(name)": (0, LENGTH_BOUND), **DATE_BOUNDS},
                             max_groups_contributed=3, max_rows_per_unit=10,
                             public_keys={"region": harness.PUBLIC_REGIONS})
        adb.ledger.set_budget(adb.analyst, t, epsilon=1e6, delta=0.5)
    harness.PAIRS[PAIR] = pair  # check_case finds (D, D′) by pair key
    yield pair
    del harness.PAIRS[PAIR]


CASES = [
    # -- length() inside aggregates (Q27): unit 42's name is longer than the declared bound
    C("cb_avg_length", "SELECT AVG(length(name)) AS l FROM {t}", "AVG(length) of unit 42's long name",
      pair=PAIR, must_answer=True),
    C("cb_sum_lengthutf8_public", "SELECT region, SUM(lengthUTF8(name)) AS s FROM {t} GROUP BY region",
      "SUM(lengthUTF8) by public keys", pair=PAIR, must_answer=True),
    # (a HAVING threshold no noisy count reaches and no LIMIT: which public keys come out of a sort
    # or filter on noisy values is random, so the released key set is then fixed and comparable)
    C("cb_q27_shape", "SELECT region, AVG(length(name)) AS l, COUNT(*) AS c FROM {t} WHERE name <> '' "
                      "GROUP BY region HAVING COUNT(*) > -1000000 ORDER BY l DESC",
      "Q27: AVG(length) + HAVING COUNT + ORDER BY the average", pair=PAIR, must_answer=True),
    C("cb_length_arith", "SELECT SUM(length(name) * 2 - 1) AS s FROM {t} WHERE length(name) > 3",
      "arithmetic on a length, WHERE on a length", pair=PAIR, must_answer=True),
    C("cb_length_undeclared", "SELECT AVG(length(unit_s)) AS l FROM {t}",
      "length of a column without a declared length bound (rejected)", pair=PAIR),
    C("cb_length_of_expression", "SELECT AVG(length(concat(name, name))) AS l FROM {t}",
      "length of an expression (rejected)", pair=PAIR),
    C("cb_length_unit42_only", "SELECT AVG(length(name)) AS l FROM {t} WHERE user_id = 42",
      "AVG(length) of unit 42's rows only", pair=PAIR, must_answer=True),
    # -- GROUP BY a constant SELECT item (Q34)
    C("cb_group_by_constant_public", "SELECT 1, region, COUNT(*) AS c FROM {t} GROUP BY 1, region "
                                     "ORDER BY c DESC LIMIT 10", "Q34 with public keys", pair=PAIR, must_answer=True),
    C("cb_group_by_constant_only", "SELECT 'k' AS one, COUNT(*) AS n FROM {t} WHERE user_id = 42 GROUP BY one",
      "only a constant key: one row whether or not unit 42 has rows", pair=PAIR, must_answer=True),
    C("cb_group_by_constant_selected", "SELECT 1, name, COUNT(*) AS c FROM {t} GROUP BY 1, name "
                                       "ORDER BY c DESC LIMIT 10", "Q34 with selected keys (unit 42's name unique)",
      pair=PAIR, delta=DELTA_SEL, must_answer=True),
    # -- Q29: many sums of shifted values (unit 42's amount above the bound)
    C("cb_many_shifted_sums", "SELECT " + ", ".join(f"SUM(amount + {i}) AS s{i}" for i in range(12)) + " FROM {t}",
      "12 sums of shifted clipped values", pair=PAIR, must_answer=True),
    # -- Q35: several keys that are functions of one column (unit 42's qty unique)
    C("cb_shifted_keys", "SELECT qty, qty - 1, qty - 2, COUNT(*) AS c FROM {t} GROUP BY qty, qty - 1, qty - 2 "
                         "ORDER BY c DESC LIMIT 10", "keys qty, qty - 1, qty - 2", pair=PAIR, delta=DELTA_SEL,
      must_answer=True),
    # -- Q39: a CASE key over a string column
    C("cb_case_key", "SELECT region, CASE WHEN (qty = 0 AND flag) THEN name ELSE '' END AS src, COUNT(*) AS pv "
                     "FROM {t} GROUP BY region, src ORDER BY pv DESC LIMIT 10 OFFSET 1",
      "CASE key that is unit 42's name", pair=PAIR, delta=DELTA_SEL, must_answer=True),
    # -- Q6: MIN/MAX of dates (unit 42's day and ts in 2099, clipped to the declared dates)
    C("cb_min_max_date", "SELECT MIN(day) AS lo, MAX(day) AS hi FROM {t}", "MIN/MAX(day) with unit 42's far day",
      pair=PAIR, must_answer=True),
    C("cb_median_datetime_public", "SELECT region, median(ts) AS m, MAX(ts) AS x FROM {t} GROUP BY region",
      "median/MAX(ts) by public keys", pair=PAIR, must_answer=True),
    C("cb_max_date_unit42_only", "SELECT MAX(day) AS hi FROM {t} WHERE user_id = 42", "MAX(day) of unit 42 only",
      pair=PAIR, must_answer=True),
    C("cb_quantiles_date", "SELECT quantiles(0.1, 0.9)(day) AS q FROM {t}", "quantiles array of a Date (rejected)",
      pair=PAIR),
    C("cb_min_date_undeclared", "SELECT MIN(toDate(ts)) AS d FROM {t}", "MIN of a converted date (rejected)",
      pair=PAIR),
    # -- Q18's key: EXTRACT(minute FROM ts) (unit 42's minute 59 is its own; the others are on the hour)
    C("cb_extract_minute_key", "SELECT extract(minute FROM ts) AS m, COUNT(*) AS c FROM {t} GROUP BY m "
                               "ORDER BY c DESC LIMIT 10", "EXTRACT(minute) key of unit 42's own minute", pair=PAIR,
      delta=DELTA_SEL, must_answer=True),
    C("cb_extract_year_where", "SELECT COUNT(*) AS n FROM {t} WHERE EXTRACT(YEAR FROM day) = 2099",
      "EXTRACT(YEAR) filter that only unit 42 passes", pair=PAIR, must_answer=True),
    # -- Q42: DATE_TRUNC key ordered by itself, with an OFFSET (unit 42's ts in 2099)
    C("cb_date_trunc_minute", "SELECT DATE_TRUNC('minute', ts) AS m, COUNT(*) AS pv FROM {t} "
                              "GROUP BY DATE_TRUNC('minute', ts) ORDER BY DATE_TRUNC('minute', ts) LIMIT 10 OFFSET 5",
      "DATE_TRUNC('minute') key of unit 42's far-future time", pair=PAIR, delta=DELTA_SEL, must_answer=True),
    # -- shared per-unit aggregates (MIN, MAX and median of one column: one histogram) and packed
    # COUNT(DISTINCT) (value hashes, NULL bit), k = 3
    C("cb_min_max_median_shared", "SELECT region, MIN(day) AS lo, MAX(day) AS hi, median(day) AS m FROM {t} "
                                  "GROUP BY region", "MIN/MAX/median of unit 42's far day, one histogram",
      pair=PAIR, must_answer=True),
    C("cb_min_max_shared_private_keys", "SELECT name, MIN(ts) AS lo, MAX(ts) AS hi FROM {t} GROUP BY name",
      "MIN/MAX(ts) under private keys (unit 42's long name)", pair=PAIR, delta=DELTA_SEL, must_answer=True),
    C("cb_count_distinct_null_bit", "SELECT region, COUNT(DISTINCT toInt64OrNull(name)) AS a, "
                                    "COUNT(DISTINCT name) AS b FROM {t} GROUP BY region",
      "COUNT(DISTINCT) of a parse only unit 42's name fails (NULL) and of the names", pair=PAIR, must_answer=True),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
def test_attack_clickbench(adb, cb_pair, case):
    check_case(adb, case)


def test_length_bound_is_tight_for_unit_42(adb, cb_pair):
    """The case above is not vacuous: unit 42's name exceeds the declared bound, the others do not."""
    full, _ = cb_pair.tables
    df = adb.raw_query(f"SELECT max(length(name)) AS l42 FROM {full} WHERE user_id = 42")
    other = adb.raw_query(f"SELECT max(length(name)) AS l FROM {full} WHERE user_id != 42")
    assert int(df["l42"].iloc[0]) > LENGTH_BOUND >= int(other["l"].iloc[0])
