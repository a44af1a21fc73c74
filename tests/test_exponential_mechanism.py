"""The exponential mechanism in the kernel (issue 15): permute-and-flip with exact Bernoulli(exp(-γ))
acceptances (dpch._noise.permute_and_flip, dpch.mechanisms.ExponentialMechanism).

Checked against the exact output distribution of permute-and-flip (McKenna & Sheldon 2020):
P(r) = p_r · Σ_{A ⊆ others} |A|!(n-1-|A|)!/n! · Π_{j∈A}(1 - p_j), p_j = exp(-(u* - u_j)/T),
computed independently here by enumerating every visiting order (itertools.permutations)."""
from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from dpch import _noise
from dpch.errors import InvalidParameter
from dpch.mechanisms import ExponentialMechanism


def _by_orders(scores, temperature: float) -> list[float]:
    """P(r) by brute force over the n! visiting orders (independent of the class's formula)."""
    best = max(scores)
    p = [math.exp(-(best - u) / temperature) for u in scores]
    n = len(scores)
    out = [0.0] * n
    for order in itertools.permutations(range(n)):
        reach = 1.0 / math.factorial(n)
        for r in order:
            out[r] += reach * p[r]
            reach *= 1.0 - p[r]
    return out


CASES = [([0, -1, -2, -10], 1.0, 2.0), ([5, 5, 3, 0, 4], 1.0, 0.7), ([0, 0], 0.5, 1.0 / 3.0),
         ([7, 1, 2, 3, 4, 5], 2.0, 1.3)]


@pytest.mark.parametrize("scores,sens,eps", CASES)
def test_formula_equals_brute_force(scores, sens, eps):
    m = ExponentialMechanism.calibrated(sens, eps)
    assert np.allclose(m.probabilities(scores), _by_orders(scores, float(m.temperature)), atol=1e-12)
    assert math.isclose(sum(m.probabilities(scores)), 1.0, rel_tol=1e-12)


@pytest.mark.parametrize("scores,sens,eps", CASES)
def test_sampler_matches_the_exact_distribution(scores, sens, eps):
    """Pearson χ² of 200 000 kernel draws against the exact probabilities, cells with expectation
    < 20 pooled. Threshold: the χ² quantile at 2.5e-8 (four cases: < 1e-7 per run for a correct
    sampler); a sampler off by 1 % in a cell of probability 0.1 gives χ² ≈ 20 + dof on average and
    one off by 3 % gives ≈ 180, well above the thresholds (≈ 38-47)."""
    m = ExponentialMechanism.calibrated(sens, eps)
    n = 200_000
    probs = np.array(m.probabilities(scores))
    counts = np.bincount(m.sample(scores, n), minlength=len(scores))
    expected = probs * n
    big = expected >= 20
    obs = np.append(counts[big], counts[~big].sum())
    exp_ = np.append(expected[big], expected[~big].sum())
    if exp_[-1] == 0:
        obs, exp_ = obs[:-1], exp_[:-1]
    chi2 = float(((obs - exp_) ** 2 / exp_).sum())
    assert chi2 < stats.chi2.isf(2.5e-8, len(obs) - 1), (chi2, counts, expected)


def test_privacy_relation_holds_on_neighbouring_scores():
    """For scores that move by at most Δ per candidate, every output's probability ratio is at
    most e^ε (exact probabilities), and some pair comes within a factor e^(ε/2) of it (the check is
    not vacuous: [0, 0] → [Δ, 0] gives exactly e^(ε/2))."""
    rng = np.random.default_rng(7)  # test inputs only; never used for noise
    worst = 0.0
    for eps, sens in ((1.0, 1), (0.3, 2), (2.5, 1)):
        m = ExponentialMechanism.calibrated(sens, eps)
        pairs = [([0, 0], [sens, 0])]
        for _ in range(200):
            u = rng.integers(-6, 7, size=5)
            pairs.append((list(u), list(u + rng.integers(-sens, sens + 1, size=5))))
        for u, v in pairs:
            a, b = m.probabilities(u), m.probabilities(v)
            loss = max(abs(math.log(x / y)) for x, y in zip(a, b))
            assert loss <= eps + 1e-9, (u, v, loss, eps)
            worst = max(worst, loss / eps)
    assert worst >= 0.5 - 1e-9


@pytest.mark.parametrize("sens,eps", [(1, 1.0), (1, 0.1), (0.5, 1 / 3), (3, 7.0), (1e-3, 1e-6), (2, 1e6)])
def test_calibration_rounds_the_temperature_up_only(sens, eps):
    m = ExponentialMechanism.calibrated(sens, eps)
    exact = 2 * Fraction(sens) / Fraction(eps)
    assert exact <= m.temperature <= exact * (1 + Fraction(1, 2 ** 60)) or m.s == 2 ** 63
    assert m.privacy_function(sens).epsilon <= eps
    assert m.privacy_relation(sens, eps) and not m.privacy_relation(sens, eps * (1 - 1e-9))


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="at least one candidate"):
        _noise.permute_and_flip([], 1, 1, 1)
    with pytest.raises(ValueError):
        _noise.permute_and_flip([1, 2], 0, 1, 1)
    with pytest.raises(ValueError, match="s must be < 2\\^64"):
        _noise.permute_and_flip([1, 2], 1, 2 ** 64, 1)
    for sens, eps in ((0, 1.0), (1, 0.0), (1, float("nan")), (-1, 1.0)):
        with pytest.raises(InvalidParameter):
            ExponentialMechanism.calibrated(sens, eps)
    assert list(_noise.permute_and_flip([3], 1, 1, 4)) == [0, 0, 0, 0]
