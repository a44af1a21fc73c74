"""The rewritten SQL's levels (issue 33, "Cheap planning"): no pass-through level, and the merged
levels keep their meaning.

ClickHouse's analysis of the rewritten query grows with its levels (docs/PERFORMANCE.md, "The
engine's analysis"), so the rewriter emits no level that only passes columns through: the
selection threshold is the WHERE of the level above the draw (not a ``SELECT * ... WHERE`` level),
the released values are the outer query's WITH aliases (not a level of their own), and a COUNT-only
k > 1 plan's group stage reads the unfolded rows directly. The exactness of each (same rows with
the noise off) is what tests/test_rewrite_equivalence.py, test_controller_sensitivity.py and the
attack corpus check on every accepted shape; this module checks the structure, and the one property
that the flattened selection must keep: the released selection count is the draw that passed the
threshold (a second call of the noise UDF would differ from it)."""
from __future__ import annotations

import re

import pytest
import sqlglot
from sqlglot import exp

from dpch.controller import prepare
from test_controller_fixtures import ANALYST, DB, setup_controller_data

# (table, query, options): each kind of plan whose stages differ (k = 1 with public keys, k > 1
# with selection, COUNT-only and with a sum, top-n peeling, quantiles, HAVING and ORDER BY)
PLANS = [
    ("purchases", "SELECT region, COUNT(*) AS n FROM {t} GROUP BY region", {}),
    ("purchases", "SELECT region, AVG(amount) AS a, SUM(qty) AS s FROM {t} GROUP BY region HAVING a > 3 ORDER BY a",
     {}),
    ("purchases", "SELECT COUNT(*) AS n, SUM(amount) AS s FROM {t}", {}),
    ("events", "SELECT category, COUNT(*) AS n FROM {t} GROUP BY category", {"delta": 1e-5}),
    ("events", "SELECT category, SUM(amount) AS s, COUNT(*) AS n FROM {t} GROUP BY category ORDER BY n DESC",
     {"delta": 1e-5}),
    ("events", "SELECT region, COUNT(*) AS n FROM {t} GROUP BY region ORDER BY n DESC LIMIT 2",
     {"delta": 1e-5, "top_k": "peeling"}),
    ("purchases", "SELECT region, median(amount) AS m FROM {t} GROUP BY region", {}),
    ("subst", "SELECT category, COUNT(DISTINCT qty) AS d FROM {t} GROUP BY category", {"delta": 1e-5}),
]


@pytest.fixture(scope="module")
def ldb(db):
    setup_controller_data(db)
    return db


def _pass_through(select: exp.Select) -> bool:
    """A level that only renames or forwards its subquery's columns: bare columns (or *), nothing
    else in the level (no WHERE, GROUP BY, JOIN, ARRAY JOIN, ORDER BY, LIMIT, HAVING)."""
    if any(select.args.get(k) for k in ("where", "group", "joins", "order", "limit", "having", "with", "with_")):
        return False
    if select.find(exp.Lateral, exp.Unnest):  # ARRAY JOIN
        return False
    items = [e.this if isinstance(e, exp.Alias) else e for e in select.expressions]
    return all(isinstance(e, (exp.Column, exp.Star)) for e in items)


@pytest.mark.parametrize("table,sql,options", PLANS)
def test_no_level_only_passes_columns_through(ldb, table, sql, options):
    prepared = prepare(ldb, sql.format(t=f"{DB}.{table}"), epsilon=1.0, **options)
    # sqlglot 30 reads the parametric groupArraySorted[Distinct][ArgMin](N)(x) as an alias: its parameter goes
    # (the levels are what this test looks at)
    text = re.sub(r"(groupArraySorted(?:Distinct)?(?:ArgMin)?)\(\d+\)\(", r"\1(", prepared.rewritten.display_sql)
    tree = sqlglot.parse_one(text.replace("<secret salt>", "0"), dialect="clickhouse")
    selects = list(tree.find_all(exp.Select))
    assert len(selects) >= 4  # the walk sees the nested levels (guards the check against a parse that hides them)
    bad = [s.sql(dialect="clickhouse")[:160] for s in selects if _pass_through(s)]
    assert not bad, bad
    # a `SELECT * FROM (…) WHERE …` level is gone: the threshold is the parent's own WHERE
    assert not [s for s in selects if [type(e) for e in s.expressions] == [exp.Star] and s.args.get("where")]


def test_the_released_selection_count_is_the_draw_that_passed_the_threshold(ldb):
    """Groups whose true selection count sits at the threshold are released about half the time; each
    released row's selection count must be >= the threshold (one draw, filtered and released).
    Sizes: 120 groups of exactly T units each, 4 runs. A released row below T cannot happen when the
    filter and the release read one draw, so that check has no false alarms. Non-vacuity: the number
    of released groups over the 4 runs is Binomial(480, p) with p = the rule's exact release
    probability at a count of T (0.48 here; checked to lie in [0.2, 0.8]); the test needs
    0 < released < 480, which fails with probability p^480 + (1 - p)^480 < 2 · 0.8^480 < 1e-46."""
    from test_controller_fixtures import create_table

    prepared = prepare(ldb, f"SELECT category, COUNT(*) AS n FROM {DB}.events GROUP BY category",
                       epsilon=1.0, delta=1e-5)
    sel = prepared.plan.selection
    assert sel is not None
    threshold, groups = int(sel.threshold), 120
    # every unit in one group of its own category, T units per category, 1 row each
    rows = (f"SELECT number AS user_id, 'EU' AS region, concat('g', toString(intDiv(number, {threshold}))) AS category, "
            f"1. AS amount, toUInt8(20) AS age, toInt32(1) AS qty, toNullable(1.) AS price, toDate('2024-01-01') AS day, "
            f"true AS flag FROM numbers({groups * threshold})")
    create_table(ldb, "at_threshold", rows)
    ldb.catalog.register(f"{DB}.at_threshold", privacy_unit="user_id", bounds={"amount": (0, 10)},
                         max_groups_contributed=3, max_rows_per_unit=20, max_rows_per_group=5)
    ldb.ledger.set_budget(ANALYST, f"{DB}.at_threshold", epsilon=1e9, delta=0.5)
    p = prepare(ldb, f"SELECT category, COUNT(*) AS n FROM {DB}.at_threshold GROUP BY category",
                epsilon=1.0, delta=1e-5)
    assert p.plan.selection is not None and int(p.plan.selection.threshold) == threshold
    assert 0.2 <= p.plan.selection.release_probability(threshold) <= 0.8
    column = p.plan.quantities[p.plan.selection.quantity].noisy_column + "_out"
    released = []
    for _ in range(4):
        df = ldb.raw_query(p.rewritten.sql)
        assert (df[column] >= threshold).all(), df[column].min()
        released.append(len(df))
    assert 0 < sum(released) < 4 * groups, released
