"""Sensitivity-check mode (tests only): run the rewritten query with the noise switched off and
partition selection disabled on neighbouring datasets D and D′, and assert that every noisy
quantity (hence every released value) changes by at most the sensitivity the planner declared
(L1 and L2 over all groups). D′ removes one privacy unit with all its rows (add_remove), or
replaces its rows by other rows (substitute); unit 0 has 1000 rows over every group.

This checks that contribution bounding really bounds: a rewrite that forgot a per-unit cap, or
selected rows with a rule depending on other units, fails here."""
from __future__ import annotations

import math

import numpy as np
import pytest

from dpch.bind import bind
from dpch.parse import parse
from dpch.plan import QueryOptions, make_plan
from dpch.rewrite import rewrite_for_sensitivity_check
from test_controller_fixtures import DB, setup_controller_data

QUERIES = [
    # (table, query template with {t}, delta)
    ("purchases", "SELECT COUNT(*) AS n, SUM(amount) AS s, AVG(age) AS a FROM {t}", 0.0),
    ("purchases", "SELECT region, COUNT(*) AS n, SUM(amount) AS s, AVG(price) AS a, VAR_POP(age) AS v "
                  "FROM {t} GROUP BY region", 0.0),
    ("purchases", "SELECT region, COUNT(DISTINCT user_id) AS u, SUM(price * qty) AS pq FROM {t} "
                  "WHERE age > 25 GROUP BY region", 0.0),
    ("purchases", "SELECT category, countIf(amount > 200) AS c, sumIf(qty, flag) AS q FROM {t} GROUP BY category",
     1e-6),
    ("events", "SELECT category, COUNT(*) AS n, SUM(amount) AS s, COUNT(DISTINCT user_id) AS u FROM {t} "
               "GROUP BY category", 1e-6),
    ("events", "SELECT region, qty, COUNT(*) AS n, AVG(amount) AS a FROM {t} GROUP BY region, qty", 1e-6),
    ("events", "SELECT COUNT(*) AS n, SUM(amount - 250) AS s, STDDEV_POP(qty) AS sd FROM {t}", 0.0),
    ("subst", "SELECT COUNT(*) AS n, SUM(amount) AS s, AVG(age) AS a FROM {t}", 0.0),
    ("subst", "SELECT category, COUNT(*) AS n, SUM(amount - 100) AS s, COUNT(DISTINCT user_id) AS u FROM {t} "
              "GROUP BY category", 1e-6),
    ("rowlevel", "SELECT region, COUNT(*) AS n, SUM(amount) AS s FROM {t} GROUP BY region", 0.0),
    ("onerow", "SELECT category, COUNT(*) AS n, COUNT(DISTINCT user_id) AS u, SUM(qty) AS q FROM {t} "
               "GROUP BY category", 1e-6),
    ("onerow", "SELECT COUNT(*) AS n, COUNT(DISTINCT user_id) AS u FROM {t}", 0.0),
    ("rowlevel", "SELECT category, SUM(qty * 2 - 5) AS s, AVG(amount) AS a FROM {t} GROUP BY category", 1e-6),
    # COUNT(DISTINCT non-unit) (issue 15): distinct values among the kept rows
    ("purchases", "SELECT COUNT(DISTINCT user_id * 100 + qty) AS c, COUNT(DISTINCT price) AS p FROM {t}", 0.0),
    ("purchases", "SELECT region, COUNT(DISTINCT category) AS c, COUNT(*) AS n FROM {t} GROUP BY region", 0.0),
    ("events", "SELECT region, COUNT(DISTINCT concat(category, toString(qty))) AS c FROM {t} GROUP BY region", 1e-6),
    ("subst", "SELECT category, COUNT(DISTINCT day) AS c FROM {t} GROUP BY category", 1e-6),
    ("rowlevel", "SELECT region, COUNT(DISTINCT concat(toString(user_id), category, toString(amount))) AS c "
                 "FROM {t} GROUP BY region", 0.0),
]

# units whose removal / substitution is checked (0 is the heavy unit: 1000 rows, every group)
UNITS = [0, 7, 123]

# replacement rows for the substitute relation: the unit's rows become 700 extreme rows in other groups
_SUBST_ROWS = """
SELECT toUInt64({u}) AS user_id, ['EU', 'US', 'ASIA'][i % 3 + 1] AS region,
       concat('z', toString(i % 17)) AS category, if(i % 2 = 0, 0., 10000.) AS amount,
       toUInt8(if(i % 2 = 0, 0, 200)) AS age, toInt32(if(i % 2 = 0, -50, 50)) AS qty,
       toNullable(if(i % 2 = 0, -5., 500.)) AS price, toDate('2024-06-01') AS day, i % 2 = 0 AS flag
FROM (SELECT arrayJoin(range(700)) AS i)
"""


@pytest.fixture(scope="module")
def sdb(db):
    setup_controller_data(db)
    return db


def _same(a: dict, b: dict) -> bool:
    """Whether two answers of ``_quantities`` release the same groups with the same values."""
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def _quantities(db, plan, table_sql):
    rw = rewrite_for_sensitivity_check(plan, table=table_sql)
    df = db.raw_query(rw.sql)
    key_cols = [o.name for o in plan.bound.outputs if o.kind == "key"]
    out = {}
    for i in range(len(df)):
        key = tuple(str(df[c].iloc[i]) for c in key_cols)
        out[key] = np.array([int(df[c].iloc[i]) for c in rw.internal_columns], dtype=np.int64)
    return out


def _neighbour_table(db, table, unit, relation):
    name = f"{DB}.sens_dprime"
    db.command(f"DROP TABLE IF EXISTS {name}")
    db.command(f"CREATE TABLE {name} AS {DB}.{table}")
    if table == "rowlevel":
        # row level: the unit is one row; remove the first row of user `unit`
        db.command(f"INSERT INTO {name} SELECT * FROM {DB}.{table} ORDER BY user_id, category, amount, age, day "
                   f"LIMIT 1000000 OFFSET 0")
        db.command(f"DROP TABLE IF EXISTS {name}_tmp")
        db.command(f"CREATE TABLE {name}_tmp AS {name}")
        db.command(f"INSERT INTO {name}_tmp SELECT * FROM {name} WHERE NOT (user_id = {unit} AND "
                   f"(user_id, category, amount, age, day) IN (SELECT user_id, category, amount, age, day FROM {name} "
                   f"WHERE user_id = {unit} ORDER BY category, amount, age, day LIMIT 1))")
        db.command(f"DROP TABLE {name}")
        db.command(f"RENAME TABLE {name}_tmp TO {name}")
        return name
    db.command(f"INSERT INTO {name} SELECT * FROM {DB}.{table} WHERE user_id != {unit}")
    if relation == "substitute":
        db.command(f"INSERT INTO {name} {_SUBST_ROWS.format(u=unit)}")
    return name


@pytest.mark.parametrize("table,template,delta", QUERIES, ids=[q[1][:60] for q in QUERIES])
def test_neighbouring_datasets(sdb, table, template, delta):
    entry = sdb.catalog.get(f"{DB}.{table}")
    sql = template.format(t=f"{DB}.{table}")
    bound = bind(parse(sql), entry)
    plan = make_plan(bound, 1.0, delta, QueryOptions())
    base = _quantities(sdb, plan, None)
    assert base, "the query returned no groups"
    worst = 0.0
    for unit in UNITS:
        dprime = _neighbour_table(sdb, table, unit, entry.neighbour)
        other = _quantities(sdb, plan, dprime)
        keys = set(base) | set(other)
        zero = np.zeros(len(plan.quantities), dtype=np.int64)
        diffs = np.array([base.get(k, zero) - other.get(k, zero) for k in keys], dtype=float)
        for q in plan.quantities:
            col = diffs[:, q.index]
            l1 = float(np.abs(col).sum())
            l2 = float(math.sqrt((col ** 2).sum()))
            assert l1 <= q.l1 + 1e-9, f"{q.label}: L1 change {l1} > declared {q.l1} (unit {unit})"
            assert l2 <= q.l2 + 1e-9, f"{q.label}: L2 change {l2} > declared {q.l2} (unit {unit})"
            worst = max(worst, l1 / q.l1)
    # the check is not vacuous: some unit moves something. A substitute may, by chance of the salted
    # row sampling (a new salt each run), keep rows that release the very same values, and a distinct
    # count need not move when one unit's kept rows leave it as it was: then removing some unit of
    # the table must move something. The units are tried in turn until one does (the first almost
    # always): each of the 300 moves uniqExactIf(user_id, flag) when one of its kept rows has a flag,
    # so all of them failing by chance is out of the question. (Seen twice with uniqIf/uniqExactIf
    # before 2026-11-29, more often than chance: the rows outside the -If condition shared one hash
    # and one order for all units, and could fill every unit's allowance; they now come last,
    # tests/test_bounding_samples.py)
    if worst == 0.0 and entry.neighbour == "substitute":
        worst = float(not all(_same(base, _quantities(sdb, plan, _neighbour_table(sdb, table, unit, "add_remove")))
                              for unit in UNITS + [u for u in range(300) if u not in UNITS]))
    assert worst > 0.0


def test_count_rows_is_not_count_units_when_k_exceeds_one(sdb):
    """M = 1, k = 2: a unit keeps two groups but only one row; COUNT(*) < COUNT(DISTINCT unit)."""
    entry = sdb.catalog.get(f"{DB}.onerow")
    sql = f"SELECT region, COUNT(*) AS n, COUNT(DISTINCT user_id) AS u FROM {DB}.onerow GROUP BY region"
    plan = make_plan(bind(parse(sql), entry), 1.0, 1e-6, QueryOptions())
    assert plan.aggregates[0].roles["count"] != plan.aggregates[1].roles["count"]
    base = _quantities(sdb, plan, None)
    n = sum(int(v[plan.aggregates[0].roles["count"]]) for v in base.values())
    u = sum(int(v[plan.aggregates[1].roles["count"]]) for v in base.values())
    assert n == 300 and u > n  # one row per unit in total, up to two groups per unit


def test_heavy_unit_is_truncated(sdb):
    """Unit 0 has 1000 rows; with M = 10 its COUNT(*) contribution is exactly 10."""
    entry = sdb.catalog.get(f"{DB}.purchases")
    plan = make_plan(bind(parse(f"SELECT COUNT(*) AS n FROM {DB}.purchases"), entry), 1.0, 0.0, QueryOptions())
    base = _quantities(sdb, plan, None)
    other = _quantities(sdb, plan, _neighbour_table(sdb, "purchases", 0, "add_remove"))
    assert int(base[()][0] - other[()][0]) == 10


def test_selection_rule_depends_only_on_own_rows(sdb):
    """Which group a unit keeps (k = 1) must not change when another unit is removed."""
    entry = sdb.catalog.get(f"{DB}.purchases")
    sql = f"SELECT category, COUNT(DISTINCT user_id) AS u FROM {DB}.purchases GROUP BY category"
    plan = make_plan(bind(parse(sql), entry), 1.0, 1e-6, QueryOptions())
    base = _quantities(sdb, plan, None)
    other = _quantities(sdb, plan, _neighbour_table(sdb, "purchases", 7, "add_remove"))
    changed = [k for k in set(base) | set(other)
               if int(base.get(k, [0])[0]) != int(other.get(k, [0])[0])]
    assert len(changed) == 1  # exactly the one group unit 7 kept
