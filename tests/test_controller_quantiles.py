"""Quantiles through the controller (issue 15): median(x), quantile(q)(x), quantiles(q, ...)(x),
MIN(x) (level 0) and MAX(x) (level 1) at user level, answered by the kernel's permute-and-flip over
each group's bounded histogram (dpch_quantiles), charged to the ledger.

Sensitivity (D/D′): the per-group histograms the rewritten query builds (noise off) move by at most
`rows` = min(C, M) rows in each of at most k groups (2k for substitution) when one unit is removed
or substituted — the sensitivity QuantileMechanism is calibrated for. Checked on the controller
fixtures, including the heavy unit 0 (1000 rows in every group).
"""
from __future__ import annotations

import pytest

from dpch.bind import bind
from dpch.errors import QueryRejected
from dpch.parse import parse
from dpch.plan import make_plan
from dpch.rewrite import _Rewriter
from test_controller_fixtures import DB, setup_controller_data
from test_controller_sensitivity import _neighbour_table


@pytest.fixture(scope="module")
def qdb(db):
    setup_controller_data(db)
    return db


def _plan(db, sql, table, eps=1.0, delta=0.0):
    return make_plan(bind(parse(sql), db.catalog.get(f"{DB}.{table}")), eps, delta)


def _histograms(db, plan, table_sql):
    """{group key: {quantity index: {bucket: count}}} of the bounded data (noise off)."""
    r = _Rewriter(plan, noise=False, selection=False, table=table_sql)
    df = db.raw_query(r._salted(r.with_public_keys(r.groups_sql())))
    out = {}
    for _, row in df.iterrows():
        key = tuple(str(row[f"__dp_k{j}"]) for j in range(r.nk))
        out[key] = {q.index: dict(zip(map(int, row[q.column][0]), map(int, row[q.column][1])))
                    for q in r.quant_qs}
    return out


SHAPES = [
    ("purchases", "SELECT median(amount) AS m, MAX(age) AS a FROM {t}"),
    ("purchases", "SELECT region, quantile(0.9)(amount) AS p, MIN(price) AS lo FROM {t} GROUP BY region"),
    ("events", "SELECT region, median(amount) AS m, quantiles(0.25, 0.75)(qty) AS iq FROM {t} GROUP BY region"),
    ("subst", "SELECT region, median(amount) AS m FROM {t} GROUP BY region"),
    ("rowlevel", "SELECT region, median(amount) AS m FROM {t} GROUP BY region"),
]


@pytest.mark.parametrize("table,template", SHAPES)
@pytest.mark.parametrize("unit", [0, 7])
def test_histograms_move_by_at_most_rows_in_at_most_k_groups(qdb, table, template, unit):
    relation = "substitute" if table == "subst" else "add_remove"
    sql = template.format(t=f"{DB}.{table}")
    delta = 1e-6 if table in ("events", "subst") else 0.0
    plan = _plan(qdb, sql, table, delta=delta)
    quant = [q for q in plan.quantities if q.kind == "quantile"]
    assert quant
    d = _histograms(qdb, plan, f"{DB}.{table}")
    dprime = _histograms(qdb, plan, _neighbour_table(qdb, table, unit, relation))
    for q in quant:
        moved = []
        for key in set(d) | set(dprime):
            a = d.get(key, {}).get(q.index, {})
            b = dprime.get(key, {}).get(q.index, {})
            l1 = sum(abs(a.get(x, 0) - b.get(x, 0)) for x in set(a) | set(b))
            if l1:
                moved.append(l1)
        # substitution: removal then addition, each within rows per group
        per_group = q.rows * (2 if relation == "substitute" else 1)
        assert all(m <= per_group for m in moved), (moved, q.rows)
        assert len(moved) <= q.coords, (len(moved), q.coords)
    if unit == 0 and table != "rowlevel":
        # the check is not vacuous: removing the heavy unit moves some histogram (a substitute may,
        # by chance of the salted row sampling, keep rows that fall in the very same buckets)
        removed = _histograms(qdb, plan, _neighbour_table(qdb, table, unit, "add_remove"))
        assert removed != d, "the heavy unit must move some histogram"


def test_answers_are_accurate_and_charged(qdb):
    """purchases: 300 users + the heavy one, amounts on [0, 500] (M = 10 rows per unit). At ε = 2
    per quantity, by QuantileMechanism.rank_halfwidth at confidence 1 - 1e-8 a level's
    |(1-α) L - α G| is within h rows of the best bucket's; with n ≈ 3 000 bounded rows over 700
    distinct amounts (≤ 8 rows share a value) a value error of h·(500/n)·4 is generous."""
    from dpch.mechanisms import QuantileMechanism

    sql = f"SELECT median(amount) AS m, quantile(0.9)(amount) AS p90 FROM {DB}.purchases"
    charges = len(qdb.ledger.history("tester", f"{DB}.purchases"))
    df = qdb.query(sql, epsilon=4.0)
    history = qdb.ledger.history("tester", f"{DB}.purchases")
    assert len(history) == charges + 1
    meta = df.attrs["dpch"]
    assert meta["epsilon"] == pytest.approx(4.0)
    col = meta["columns"]["m"]
    assert col["mechanism"] == "exponential" and col["levels"] == [0.5] and col["rows_per_unit_per_group"] == 10
    # no value interval (the column bounds were reported as one before issue 29): the rank interval
    assert col["ci_low"] is None and col["ci_high"] is None and col["rank_halfwidth"] > 0
    assert col["rank_ci"] == col["rank_halfwidth"]  # one level: no recursion
    h = QuantileMechanism(2.0, 10).rank_halfwidth(1, 1 - 1e-8)
    truth = qdb.raw_query(
        f"SELECT quantileExact(0.5)(amount) AS m, quantileExact(0.9)(amount) AS p90 FROM {DB}.purchases")
    for c in ("m", "p90"):
        assert 0 <= df[c][0] <= 500
        assert abs(df[c][0] - truth[c][0]) <= h * 500 / 3000 * 4 + 1, (c, df[c][0], truth[c][0], h)


def test_min_max_are_levels_zero_and_one(qdb):
    plan = _plan(qdb, f"SELECT MIN(amount) AS lo, MAX(amount) AS hi, median(age) AS m FROM {DB}.purchases",
                 "purchases")
    levels = [q.levels for q in plan.quantities if q.kind == "quantile"]
    assert levels == [(0.0,), (1.0,), (0.5,)]


def test_explain_shows_the_mechanism_and_rank_error(qdb):
    text = str(qdb.explain(f"SELECT region, median(amount) AS m FROM {DB}.purchases GROUP BY region",
                           epsilon=1.0))
    assert "exponential mechanism (permute-and-flip)" in text and "rank error" in text
    assert "dpch_quantiles(" in text


@pytest.mark.parametrize("call,problem", [
    ("quantile(x)(amount)", "level must be a number literal"),
    ("quantile(1.5)(amount)", "level must be a number literal"),
    ("quantileExact(0.5)(amount)", "non-DP aggregate"),
    ("medianExact(amount)", "non-DP aggregate"),
    ("median(day)", "needs bounds on column 'day'"),
    ("quantiles()(amount)", "could not parse"),
])
def test_rejections_run_nothing_and_charge_nothing(qdb, call, problem):
    table = f"{DB}.purchases"
    charges = len(qdb.ledger.history("tester", table))
    with pytest.raises(QueryRejected, match=problem):
        qdb.query(f"SELECT {call} AS v FROM {table}", epsilon=1.0)
    assert len(qdb.ledger.history("tester", table)) == charges
