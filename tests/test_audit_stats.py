"""Unit tests of the audit's statistics (dpch.audit.stats / analysis): exact values, no engine.

Randomised tests here use the audit's own guarantee: with confidence 1 − α the certified ε_LB is
below the true ε. They run at α = 1e-8 (so a correct implementation fails with probability below
1e-8 per audit; this module runs fewer than 10 audits, below 1e-7 in total).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import beta, binomtest

from dpch.audit.analysis import analyse
from dpch.audit.stats import (IntervalEvent, certify, cp_lower, cp_upper, epsilon_lower_bound,
                              interval_counts, lowbit, mi_accuracy_bound, search_intervals)

ALPHA = 1e-8


def test_clopper_pearson_closed_forms():
    # k = 0: upper bound solves (1 − p)^n = α; k = n: lower bound solves p^n = α.
    for n in (1, 10, 1000):
        for alpha in (0.05, 1e-3, 1e-8):
            # (betaincinv is accurate to ~1e-9 relative at these extreme levels)
            assert cp_upper(0, n, alpha) == pytest.approx(-math.expm1(math.log(alpha) / n), rel=1e-8)
            assert cp_lower(n, n, alpha) == pytest.approx(alpha ** (1 / n), rel=1e-8)
    assert cp_lower(0, 10, 0.05) == 0.0
    assert cp_upper(10, 10, 0.05) == 1.0


def test_clopper_pearson_matches_scipy_exact_interval():
    # A one-sided bound at level α is one end of the two-sided exact interval at level 1 − 2α.
    for k, n in ((3, 17), (250, 1000), (9990, 10000)):
        ci = binomtest(k, n).proportion_ci(confidence_level=0.9, method="exact")
        assert cp_lower(k, n, 0.05) == pytest.approx(ci.low, rel=1e-9)
        assert cp_upper(k, n, 0.05) == pytest.approx(ci.high, rel=1e-9)
        assert cp_lower(k, n, 0.01) == pytest.approx(beta.ppf(0.01, k, n - k + 1), rel=1e-9)


def test_epsilon_lower_bound_formula_with_delta():
    p_lo, q_hi, eps = epsilon_lower_bound(7000, 10000, 2000, 10000, 0.05, delta=0.0)
    assert p_lo == pytest.approx(cp_lower(7000, 10000, 0.025))
    assert q_hi == pytest.approx(cp_upper(2000, 10000, 0.025))
    assert eps == pytest.approx(math.log(p_lo / q_hi))
    _, _, eps_d = epsilon_lower_bound(7000, 10000, 2000, 10000, 0.05, delta=0.1)
    assert eps_d == pytest.approx(math.log((p_lo - 0.1) / q_hi))
    # A numerator below δ certifies nothing.
    assert epsilon_lower_bound(5, 10000, 5, 10000, 0.05, delta=0.5)[2] == 0.0


def test_lowbit_is_the_two_adic_valuation():
    x = np.array([1.0, 0.75, 3 * 2.0 ** -60, 6.0, -2.0 ** 40, 0.0, np.nan, np.inf, 5e-324])
    out = lowbit(x)
    assert list(out[:5]) == [0, -2, -60, 1, 40]
    assert out[5] > 1000 and np.isnan(out[6]) and np.isnan(out[7])
    assert out[8] == -1074  # the smallest subnormal


def test_interval_counts_match_brute_force():
    rng = np.random.default_rng(0)
    x = np.sort(np.concatenate([rng.integers(0, 6, 50).astype(float), [np.nan, np.nan]]))
    bounds = np.array([0.0, 2.0, 3.0, 5.0])
    counts, lo_vals, hi_vals = interval_counts(x, bounds)
    for i, lo in enumerate(lo_vals):
        for j, hi in enumerate(hi_vals):
            expected = int(np.sum((x >= lo) & (x <= hi))) if lo <= hi else -1
            assert counts[i, j] == expected


def test_membership_bound_and_laplace_attains_it():
    assert mi_accuracy_bound(0.0) == 0.5
    assert mi_accuracy_bound(1.0) == pytest.approx(math.e / (1 + math.e))
    assert mi_accuracy_bound(1.0, 0.1) == pytest.approx((math.e + 0.1) / (1 + math.e))
    # Discrete Laplace with scale 1/ε on a count: P(K ≥ 0) = 1/(1 + e^-ε) = e^ε/(1 + e^ε).
    eps = 1.0
    q = math.exp(-eps)
    p_nonneg = (1 - q) / (1 + q) / (1 - q)
    assert p_nonneg == pytest.approx(mi_accuracy_bound(eps))


def test_certify_uses_the_favoured_side_as_numerator():
    in_d = np.array([True] * 80 + [False] * 20)
    in_dp = np.array([True] * 20 + [False] * 80)
    a = certify("m", "e", "D", in_d, in_dp, alpha=0.05, delta=0.0)
    b = certify("m", "e", "D′", in_dp, in_d, alpha=0.05, delta=0.0)
    assert a.epsilon_lb == pytest.approx(b.epsilon_lb) and a.epsilon_lb > 0.5
    c = certify("m", "e", "D′", in_d, in_dp, alpha=0.05, delta=0.0)
    assert c.epsilon_lb == 0.0


def test_search_finds_threshold_between_point_masses():
    d = np.array([[1.0]] * 90 + [[0.0]] * 10)
    dp = np.array([[0.0]] * 90 + [[1.0]] * 10)
    cand = search_intervals(d, dp, ["x"], alpha=0.05, delta=0.0)
    ev = cand.event
    assert isinstance(ev, IntervalEvent)
    assert ev.contains(np.array([1.0]))[0] != ev.contains(np.array([0.0]))[0]


def test_deterministic_release_is_a_violation():
    """No noise at all (the true count 100 vs 99): infinite privacy loss. With 1000 held-out
    samples per side and α/6 per one-sided bound, the event {x ≥ 100} certifies
    ln((α/6)^(1/1000) / (1 − (α/6)^(1/1000))) ≈ 3.9."""
    a = analyse(np.full(2000, 100.0), np.full(2000, 99.0), epsilon=2.0, confidence=1 - ALPHA)
    assert a.violation and a.epsilon_lb > 3.8


def test_identical_distributions_certify_nothing_much():
    rng = np.random.default_rng(1)
    a = analyse(rng.laplace(size=4000), rng.laplace(size=4000), epsilon=0.1, confidence=1 - ALPHA)
    assert not a.violation
    assert set(a.curves) == {c.method for c in a.certificates}
    assert len(a.certificates) == 3


def test_missing_coordinates_become_presence_features():
    """An output present on D but absent (NaN) on D′ — e.g. a group released only on D — is a
    distinguishing event by itself."""
    d = np.column_stack([np.full(2000, 5.0), np.ones(2000)])
    dp = np.column_stack([np.full(2000, np.nan), np.ones(2000)])
    a = analyse(d, dp, epsilon=1.0, confidence=1 - ALPHA, names=["g1", "g2"])
    assert a.violation


def test_input_validation():
    with pytest.raises(ValueError):
        analyse(np.zeros(100), np.zeros(100), epsilon=1.0, confidence=1.0)
    with pytest.raises(ValueError):
        analyse(np.zeros((100, 2)), np.zeros((100, 3)), epsilon=1.0)
    with pytest.raises(ValueError):
        analyse(np.zeros(4), np.zeros(4), epsilon=1.0)


def test_boosting_ignores_a_column_never_seen_in_training():
    """Regression (CI, bb97394): a group released in 1 of 2000 runs, in the half the classifier was
    not trained on, left an all-NaN training column that sklearn's binning rejects. Such a column
    is dropped; an all-empty training set gives a constant score."""
    from dpch.audit.learned import BoostingDistinguisher

    rng = np.random.default_rng(0)
    x_d = np.column_stack([rng.normal(1.0, 1.0, 400), np.full(400, np.nan)])
    x_dp = np.column_stack([rng.normal(0.0, 1.0, 400), np.full(400, np.nan)])
    model = BoostingDistinguisher(max_iter=20).fit(x_d, x_dp)
    probe = np.array([[3.0, 5.0], [-3.0, np.nan]])
    s = model.score(probe)
    assert s[0] > 0.5 > s[1]  # still learns from the observed column
    empty = BoostingDistinguisher(max_iter=20).fit(np.full((50, 1), np.nan), np.full((50, 1), np.nan))
    assert np.all(empty.score(np.array([[1.0], [np.nan]])) == 0.5)
