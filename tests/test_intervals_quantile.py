"""Quantile intervals (issue 29 item 4): a rank interval ±r rows from the exponential mechanism's
own utility bound (Quantity.rank_ci, QuantileMechanism.rank_halfwidth), and, where the query also
releases a COUNT of the same rows, the level interval α ± r'/n_lo; never the column bounds.

Coverage (noise on): 400 groups of ~150 rows, one row per unit, x distinct integers on a grid of
bucket width 1 (bounds (0, 65536), 2^16 buckets), so each bucket holds at most one row and the tie
term of docs/CONTROLLER.md "Intervals" is at most one row. Per group, with probability >= 0.95
every level's released bucket b has L(b) <= αn + r + 1 rows below it and L(b) + c(b) >= αn − r − 1
at or below it (n the group's rows: the truth is the raw data, which bounding keeps whole). The
groups' releases are independent, so the misses are stochastically below Binomial(400, 0.05); each
check allows fewer than c = the least count with P[Binomial(400, 0.05) >= c] < 0.25e-6 (three
checks in this file: a correct implementation fails with probability < 1e-6).

Exact (no randomness): the rank statement against QuantileMechanism.probabilities on small grids.
"""
from __future__ import annotations

import numpy as np
import pytest

from test_intervals_57 import _upper_limit

DB = "t_intervals_quantile"
ANALYST = "tester"
T = f"{DB}.q"


@pytest.fixture(scope="module")
def qdb(db):
    db.command(f"CREATE DATABASE IF NOT EXISTS {DB}")
    db.command(f"DROP TABLE IF EXISTS {T}")
    db.command(f"CREATE TABLE {T} (uid UInt64, g UInt16, x Int64) ENGINE = MergeTree ORDER BY uid")
    db.command(f"INSERT INTO {T} SELECT number, cityHash64(number, 'g') % 400, toInt64(number) FROM numbers(60000)")
    db.catalog.register(T, privacy_unit="uid", bounds={"g": (0, 399), "x": (0, 65536)},
                        max_groups_contributed=1, max_rows_per_unit=1)
    db.ledger.set_budget(ANALYST, T, epsilon=1e6, delta=0.5)
    return db


def _rows(db) -> dict[int, np.ndarray]:
    raw = db.raw_query(f"SELECT g, x FROM {T}")
    return {int(g): np.sort(part["x"].to_numpy()) for g, part in raw.groupby("g")}


def _ranks(xs: np.ndarray, value: float) -> tuple[int, int]:
    """(rows below the released value's bucket, rows at or below it): bucket width 1."""
    b = int(np.floor(value))
    return int((xs < b).sum()), int((xs <= b).sum())


def test_median_rank_and_level_intervals_cover(qdb):
    df = qdb.query(f"SELECT g, median(x) AS m, COUNT(*) AS n FROM {T} GROUP BY g", epsilon=4.0, with_ci=True)
    assert list(df.columns) == ["g", "m", "m_rank_ci", "m_level_lo", "m_level_hi", "n", "n_lo", "n_hi"]
    col = df.attrs["dpch"]["columns"]["m"]
    assert col["ci_low"] is None and col["ci_high"] is None  # the column bounds are no interval
    assert df.attrs["ci_low"]["m"] is None and "rank_ci" in df.attrs["ci_notes"]["m"]
    r = float(df["m_rank_ci"][0])
    assert r == col["rank_ci"] and col["level_ci_count"] == "n"
    rows = _rows(qdb)
    rank_miss = level_miss = 0
    for g, m, lo, hi in zip(df["g"], df["m"], df["m_level_lo"], df["m_level_hi"]):
        xs = rows[int(g)]
        n = len(xs)
        below, upto = _ranks(xs, m)
        rank_miss += not (below <= 0.5 * n + r + 1 and upto >= 0.5 * n - r - 1)
        level_miss += not (below <= hi * n + 1 and upto >= lo * n - 1)
    limit = _upper_limit(len(df), 0.05, 0.25e-6)
    assert rank_miss < limit and level_miss < limit
    # informative: r and the level interval are a fraction of the ~150 rows, not the whole range
    assert r < 30 and np.median(df["m_level_hi"] - df["m_level_lo"]) < 0.4


def test_three_levels_recursion_rank_interval_covers(qdb):
    levels = (0.1, 0.5, 0.9)
    df = qdb.query(f"SELECT g, quantiles{levels}(x) AS qs FROM {T} GROUP BY g", epsilon=3.0, with_ci=True)
    assert list(df.columns) == ["g", "qs", "qs_rank_ci"]  # no COUNT: no level interval
    r = float(df["qs_rank_ci"][0])
    rows = _rows(qdb)
    miss = 0
    for g, values in zip(df["g"], df["qs"]):
        xs = rows[int(g)]
        n = len(xs)
        ok = True
        for a, v in zip(levels, values):
            below, upto = _ranks(xs, v)
            # three levels: one tie row per depth of the recursion (two) on each side
            ok &= below <= a * n + r + 2 and upto >= a * n - r - 2
        miss += not ok
    assert miss < _upper_limit(len(df), 0.05, 0.25e-6)
    assert r < 100


def test_count_of_other_rows_gives_no_level_interval(qdb):
    """countIf counts other rows than the histogram's: no level interval from it."""
    df = qdb.query(f"SELECT median(x) AS m, countIf(x > 5) AS n FROM {T}", epsilon=1.0, with_ci=True)
    assert list(df.columns) == ["m", "m_rank_ci", "n", "n_lo", "n_hi"]


# -- exact: the rank statement against the mechanism's exact output law (small grids) ---------

def _violation(counts, alphas, outcome_probs, r, tie) -> float:
    """P[some level's released bucket b has L(b) > αn + r + tie(α) or L(b) + c(b) < αn − r − tie(α)]."""
    n = sum(counts)
    below = np.concatenate([[0], np.cumsum(counts)])  # below[b] = rows in buckets < b
    bad = 0.0
    for buckets, p in outcome_probs.items():
        for a, b in zip(alphas, buckets):
            if below[b] > a * n + r + tie(a) or below[b + 1] < a * n - r - tie(a):
                bad += p
                break
    return bad


@pytest.mark.parametrize("alphas", [(0.5,), (0.0,), (1.0,), (0.25, 0.75), (0.1, 0.5, 0.9)])
@pytest.mark.parametrize("seed", range(4))
def test_rank_statement_holds_under_the_exact_law(alphas, seed):
    """Quantity.rank_ci's statement (docs/CONTROLLER.md "Intervals"), checked exactly with
    QuantileMechanism.probabilities on 12-bucket histograms (random counts, some heavy buckets):
    the probability of a violation is at most β = 1 − confidence. Tie term t: one or two levels,
    the rows of the bucket holding the αn-th row; three levels (depth 2), the rows of the heaviest
    bucket, twice per depth."""
    from dpch.mechanisms import QuantileMechanism

    rng = np.random.default_rng(seed)
    counts = [int(c) for c in rng.choice([0, 1, 3, 8], size=12)]
    n = sum(counts)
    below = np.concatenate([[0], np.cumsum(counts)])
    mech = QuantileMechanism(2.0, 1)
    conf = 0.5  # a low confidence keeps r well below n, so a wrong statement would show
    m = len(alphas)
    h = mech.rank_halfwidth(m, conf, buckets=len(counts))
    r = h if m <= 2 else m.bit_length() * h
    assert r < n

    def tie(a):
        if m >= 3:
            return 2 * m.bit_length() * max(counts)
        b = int(np.searchsorted(below, a * n, side="right")) - 1  # the bucket holding rank αn
        return counts[min(max(b, 0), len(counts) - 1)]
    assert _violation(counts, alphas, mech.probabilities(counts, list(alphas)), r, tie) <= 1 - conf
