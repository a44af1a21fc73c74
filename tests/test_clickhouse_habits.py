"""ClickHouse habits (issue 31 item 5): uniq*, count(DISTINCT), the -If combinators and the date
functions ClickHouse users put in GROUP BY are answered as their DP equivalents.

Two checks for each:
- the plan is the DP equivalent's: the same quantities with the same declared sensitivities
  (uniq(x) is COUNT(DISTINCT x), countIf(c) a COUNT, sumIf(x, c) a SUM, minIf/maxIf a quantile);
- D versus D′ with the noise off (the harness of tests/test_controller_sensitivity.py and
  tests/test_controller_quantiles.py): removing or substituting one unit, the heavy unit 0 among
  them, moves every un-noised released quantity by at most its declared sensitivity (L1 and L2
  over all groups), and the heavy unit moves something (the check is not vacuous).
"""
from __future__ import annotations

import pytest

from dpch.bind import bind
from dpch.errors import QueryRejected
from dpch.parse import parse
from dpch.plan import QueryOptions, make_plan
from test_controller_fixtures import DB, setup_controller_data
from test_controller_quantiles import test_histograms_move_by_at_most_rows_in_at_most_k_groups as _check_histograms
from test_controller_sensitivity import test_neighbouring_datasets as _check_neighbours

# the date functions of issue 31 as group keys (toStartOfHour/toHour need a DateTime: the fixtures'
# `day` is a Date), and a few more that ClickHouse users group by
DATE_KEYS = ["toStartOfMonth(day)", "toStartOfWeek(day)", "toStartOfDay(day)", "toStartOfHour(toDateTime(day))",
             "toYear(day)", "toMonth(day)", "toYYYYMM(day)", "toDate(day)", "toStartOfQuarter(day)",
             "toStartOfYear(day)", "toDayOfWeek(day)", "toHour(toDateTime(day))", "dateTrunc('month', day)",
             "toISOWeek(day)", "toISOYear(day)", "toMonday(day)", "toYYYYMMDD(day)", "toStartOfTenMinutes(toDateTime(day))",
             "toYearWeek(day)", "toLastDayOfWeek(day)", "monthName(day)", "formatDateTime(day, '%Y-%m')"]

HABITS = [
    # (table, query template with {t}, delta)
    ("purchases", "SELECT uniq(user_id) AS a, uniqExact(user_id) AS b, uniqCombined(user_id) AS c, "
                  "uniqHLL12(user_id) AS d, count(DISTINCT user_id) AS e FROM {t}", 0.0),
    ("purchases", "SELECT region, uniq(category) AS a, uniqCombined64(qty) AS b, countDistinct(price) AS c, "
                  "uniqTheta(user_id * 100 + qty) AS d FROM {t} GROUP BY region", 0.0),
    ("events", "SELECT category, uniqExact(user_id) AS u, uniq(region, qty) AS t FROM {t} GROUP BY category", 1e-6),
    ("subst", "SELECT uniqIf(category, qty > 3) AS c, uniqExactIf(user_id, flag) AS u FROM {t}", 0.0),
    ("rowlevel", "SELECT region, uniq(concat(toString(user_id), category, toString(amount), toString(day))) AS c, "
                 "uniqIf(qty, flag) AS q FROM {t} GROUP BY region", 0.0),
    ("purchases", "SELECT region, countIf(amount > 200) AS c, sumIf(amount, flag) AS s, avgIf(age, qty > 3) AS a "
                  "FROM {t} GROUP BY region", 0.0),
    ("events", "SELECT countIf(flag) AS c, sumIf(qty, amount > 100) AS s, avgIf(amount, flag) AS a FROM {t}", 0.0),
    ("rowlevel", "SELECT region, countIf(flag) AS c, sumIf(amount, qty > 0) AS s FROM {t} GROUP BY region", 0.0),
] + [("events", f"SELECT {key} AS k, COUNT(*) AS n, SUM(amount) AS s FROM {{t}} GROUP BY k", 1e-6)
     for key in DATE_KEYS]

QUANTILE_HABITS = [
    ("purchases", "SELECT minIf(amount, qty > 3) AS lo, maxIf(price, flag) AS hi FROM {t}"),
    ("purchases", "SELECT region, minIf(age, flag) AS lo, maxIf(amount, qty > 3) AS hi FROM {t} GROUP BY region"),
]


@pytest.fixture(scope="module")
def hdb(db):
    setup_controller_data(db)
    return db


def _plan(db, table: str, sql: str, delta: float = 1e-6):
    return make_plan(bind(parse(sql), db.catalog.get(f"{DB}.{table}")), 1.0, delta, QueryOptions())


def _sensitivities(plan) -> list[tuple[str, float, float]]:
    return [(q.kind, q.l1, q.l2) for q in plan.quantities]


@pytest.mark.parametrize("habit,dp_form", [
    ("uniq(category)", "COUNT(DISTINCT category)"),
    ("uniqExact(qty)", "COUNT(DISTINCT qty)"),
    ("uniqCombined(price)", "COUNT(DISTINCT price)"),
    ("uniqHLL12(age)", "COUNT(DISTINCT age)"),
    ("uniqCombined64(region)", "COUNT(DISTINCT region)"),
    ("countDistinct(category)", "COUNT(DISTINCT category)"),
    ("uniq(user_id)", "COUNT(DISTINCT user_id)"),
    ("uniq(region, qty)", "COUNT(DISTINCT (region, qty))"),
    ("countIf(amount > 200)", "COUNT(*)"),
    ("sumIf(amount, flag)", "SUM(amount)"),
    ("avgIf(age, qty > 3)", "AVG(age)"),
    ("minIf(amount, flag)", "MIN(amount)"),
    ("maxIf(amount, flag)", "MAX(amount)"),
])
def test_habit_is_planned_as_its_dp_equivalent(hdb, habit, dp_form):
    """Same quantities, same declared L1/L2 sensitivities: the habit is the DP aggregate."""
    t = f"{DB}.purchases"
    habit_plan = _plan(hdb, "purchases", f"SELECT region, {habit} AS v FROM {t} GROUP BY region")
    dp_plan = _plan(hdb, "purchases", f"SELECT region, {dp_form} AS v FROM {t} GROUP BY region")
    assert _sensitivities(habit_plan) == _sensitivities(dp_plan)
    assert [a.func for a in habit_plan.bound.aggregates] == [a.func for a in dp_plan.bound.aggregates]


def test_uniq_matches_count_distinct_on_the_same_rows(hdb):
    """uniq(x) releases the same un-noised quantity as COUNT(DISTINCT x) (the same row SQL)."""
    t = f"{DB}.purchases"
    a = _plan(hdb, "purchases", f"SELECT uniq(category) AS v FROM {t}", 0.0)
    b = _plan(hdb, "purchases", f"SELECT COUNT(DISTINCT category) AS v FROM {t}", 0.0)
    assert [q.row_sql for q in a.quantities] == [q.row_sql for q in b.quantities]


@pytest.mark.parametrize("key", DATE_KEYS)
def test_date_functions_are_group_keys(hdb, key):
    plan = _plan(hdb, "events", f"SELECT {key} AS k, COUNT(*) AS n FROM {DB}.events GROUP BY k")
    assert [k.name for k in plan.bound.keys] == ["k"]


@pytest.mark.parametrize("table,template,delta", HABITS, ids=[h[1][:70] for h in HABITS])
def test_habits_move_by_at_most_the_declared_sensitivity(hdb, table, template, delta):
    _check_neighbours(hdb, table, template, delta)


@pytest.mark.parametrize("table,template", QUANTILE_HABITS)
@pytest.mark.parametrize("unit", [0, 7])
def test_min_max_if_histograms_move_by_at_most_rows(hdb, table, template, unit):
    _check_histograms(hdb, table, template, unit)


@pytest.mark.parametrize("sql,expected", [
    ("SELECT anyIf(amount, flag) FROM {t}", "anyIf(amount, flag): the aggregate combinator form anyIf is not supported "
                                            "(supported: countIf, sumIf, avgIf, minIf, maxIf, uniqIf; otherwise put "
                                            "the condition in WHERE)"),
    ("SELECT quantileExact(0.5)(amount) FROM {t}", "non-DP aggregate quantileExact (quantileExact(0.5)(amount)); the "
                                                   "DP way to ask: quantile(q)(x) or quantiles(q1, ...)(x)."),
    ("SELECT topK(3)(region) FROM {t}", "non-DP aggregate topK (topK(3)(region)); the DP way to ask: GROUP BY the "
                                        "column with COUNT(*) and ORDER BY ... LIMIT k."),
    ("SELECT argMax(region, amount) FROM {t}", "non-DP aggregate argMax (argMax(region, amount)); the DP way to ask: "
                                               "MIN/MAX of the column, or GROUP BY it."),
])
def test_refusals_name_the_dp_way(hdb, sql, expected):
    with pytest.raises(QueryRejected) as info:
        _plan(hdb, "purchases", sql.format(t=f"{DB}.purchases"))
    assert expected in str(info.value)
