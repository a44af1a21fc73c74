"""Intervals of derived columns (issue 29 item 4): arithmetic over released aggregates gets the
interval image of the aggregates' intervals (dpch.intervals.derived_ci, union bound); where that
is not sound the column says so (NaN bounds and a note); every result says its intervals cover the
noise only (df.attrs["ci_note"]).

Coverage (noise on): 500 groups of ~200 rows, one row per unit (M = 1, k = 1). The truth is the
same query on the bounded data with noise off (rewrite_for_sensitivity_check). Each group's
interval covers its truth with probability >= 0.95 (union bound over exact noise intervals), and
the groups' noises are independent, so the misses of one column are stochastically below
Binomial(500, 0.05); the test allows fewer than c = the least count with
P[Binomial(500, 0.05) >= c] < 0.25e-6 per column (two columns: a correct implementation fails
with probability < 1e-6).

Soundness of each interval rule (no privacy noise): points drawn in random boxes (fixed seed)
always map inside the rule's interval.
"""
from __future__ import annotations

import math
import re

import numpy as np
import pytest
from sqlglot import exp, parse_one

from dpch.controller import prepare
from dpch.intervals import DENOMINATOR, NOISE_ONLY, QUANTILE_IN_EXPRESSION, _Eval
from dpch.rewrite import rewrite_for_sensitivity_check
from test_intervals_57 import _upper_limit

DB = "t_intervals_derived"
ANALYST = "tester"
T = f"{DB}.d"


@pytest.fixture(scope="module")
def ddb(db):
    db.command(f"CREATE DATABASE IF NOT EXISTS {DB}")
    db.command(f"DROP TABLE IF EXISTS {T}")
    db.command(f"CREATE TABLE {T} (uid UInt64, g UInt16, x Int64) ENGINE = MergeTree ORDER BY uid")
    db.command(f"INSERT INTO {T} SELECT number, number % 500, toInt64(cityHash64(number, 'x') % 201) "
               f"FROM numbers(100000)")
    db.catalog.register(T, privacy_unit="uid", bounds={"g": (0, 499), "x": (0, 200)},
                        max_groups_contributed=1, max_rows_per_unit=1)
    db.ledger.set_budget(ANALYST, T, epsilon=1e6, delta=0.5)
    return db


def _truth(db, sql):
    rw = rewrite_for_sensitivity_check(prepare(db, sql, epsilon=1.0).plan)
    return db.raw_query(rw.sql).set_index("g")


def test_ratio_and_difference_cover_the_bounded_truth(ddb):
    sql = f"SELECT g, countIf(x > 100) / COUNT(*) AS r, SUM(x) - 2 * COUNT(*) AS d FROM {T} GROUP BY g"
    df = ddb.query(sql, epsilon=1.0, with_ci=True)
    assert list(df.columns) == ["g", "r", "r_lo", "r_hi", "d", "d_lo", "d_hi"]
    assert df.attrs["ci_note"] == NOISE_ONLY and "noise only" in NOISE_ONLY
    assert df.attrs["ci_low"]["r"] == list(df["r_lo"])
    truth = _truth(ddb, sql).loc[df["g"]]
    limit = _upper_limit(len(df), 0.05, 0.25e-6)
    for c in ("r", "d"):
        lo, hi, t = df[f"{c}_lo"].to_numpy(), df[f"{c}_hi"].to_numpy(), truth[c].to_numpy()
        assert not np.isnan(lo).any() and (lo <= df[c]).all() and (df[c] <= hi).all()
        assert int(((t < lo) | (t > hi)).sum()) < limit, c
    # informative: the ratio's interval is far narrower than [0, 1]
    assert np.median(df["r_hi"] - df["r_lo"]) < 0.3
    assert "r" not in df.attrs["ci_notes"]


def test_denominator_interval_containing_zero_gives_nan_and_note(ddb):
    # x > 1000 holds for no row: every group's count is 0, so its noisy count's interval reaches 0
    # except with probability 0.025 per group (independent): some row has no interval except with
    # probability 0.025^500
    sql = f"SELECT g, COUNT(*) / countIf(x > 1000) AS r FROM {T} GROUP BY g"
    df = ddb.query(sql, epsilon=1.0, with_ci=True)
    lo, hi = df["r_lo"].to_numpy(), df["r_hi"].to_numpy()
    assert np.isnan(lo).any()
    assert (np.isnan(lo) == np.isnan(hi)).all()
    assert df.attrs["ci_notes"]["r"] == DENOMINATOR == "no interval: the denominator's interval contains 0"
    assert df.attrs["dpch"]["columns"]["r"]["ci_note"] == DENOMINATOR


def test_no_sound_rule_says_so(ddb):
    df = ddb.query(f"SELECT median(x) - 1 AS m1 FROM {T}", epsilon=1.0, with_ci=True)
    assert math.isnan(df["m1_lo"][0]) and math.isnan(df["m1_hi"][0])
    assert df.attrs["ci_notes"]["m1"] == QUANTILE_IN_EXPRESSION


RULES = ["a / b", "a * b", "abs(a - b)", "pow(a, 2)", "pow(a, 3)", "greatest(a, b)", "least(a, -b)",
         "round(a, 1)", "round(a)", "floor(a) + ceil(b)", "sqrt(abs(a))", "exp(a / 10)", "-a + 3 * b",
         "toFloat64(a) - 1.5"]


@pytest.mark.parametrize("expr", RULES)
def test_interval_rules_are_sound(expr):
    """Every point of the box maps inside the interval (vectorised over 2000 random boxes)."""
    rng = np.random.default_rng(29)
    n = 2000
    a0, b0 = rng.uniform(-5, 5, (2, n))
    wa, wb = rng.exponential(1.0, (2, n))
    env = {"a": (a0 - wa, a0 + wa), "b": (b0 - wb, b0 + wb)}
    node = parse_one(f"SELECT {expr}", read="clickhouse").expressions[0]
    ev = _Eval(env, n)
    lo, hi = ev.ev(node)
    ok = ~ev.bad
    assert ok.sum() > n // 4  # the rule gives most boxes an interval
    f = _numpy_of(node)
    for t in np.linspace(0, 1, 11):
        for s in np.linspace(0, 1, 11):
            (al, ah), (bl, bh) = env["a"], env["b"]  # points clipped into the box (float sums may overshoot)
            v = f(np.clip(al + t * (ah - al), al, ah), np.clip(bl + s * (bh - bl), bl, bh))
            assert ((lo[ok] <= v[ok]) & (v[ok] <= hi[ok])).all(), (expr, t, s)


def _numpy_of(node: exp.Expression):
    """The expression as a numpy function of (a, b), independently of dpch.intervals."""
    py = node.sql(dialect="clickhouse")
    for name, repl in (("toFloat64", ""), ("abs", "np.abs"), ("power", "np.power"), ("pow", "np.power"),
                       ("greatest", "np.maximum"), ("least", "np.minimum"), ("round", "np.round"),
                       ("floor", "np.floor"), ("ceil", "np.ceil"), ("sqrt", "np.sqrt"), ("exp", "np.exp")):
        py = re.sub(rf"(?<![.\w]){name}\(", repl + "(", py, flags=re.IGNORECASE)
    return lambda a, b: eval(py, {"np": np, "a": a, "b": b})  # noqa: S307 - test-local expressions
