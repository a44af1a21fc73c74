"""§5.7 confidence intervals (biswal_thesis_dp_foundations.md §5.7, Cor. 5.7.1) in the result
metadata (issue 16).

Exact checks (no randomness): the noise half-widths against the exact tail of the discrete law,
computed independently with mpmath at 60 digits:
- BoundedLaplaceMechanism.ci_halfwidth: at centres j across the grid {0..n} (ends, middle, k
  from an end; closed-form geometric tails of P(v | j) ∝ λ^|v − j|), P(|V − j| > k) <= 1 − level,
  and k is tight (1e-6 relative below k an end or the middle centre has more outside);
- LaplaceMechanism.ci_halfwidth (integer kernel, r = 1): P(|K| > k) <= 1 − level < P(|K| > k − 1).

Simulated checks (thresholds chosen so that correct code fails each with probability < 1e-6):
- through the controller, 1000 groups of 200 rows drawn from a population Bernoulli(0.3) on [0, 1]
  (the rows are a fixed pseudo-random function of the row number, cityHash64; only the noise is
  random): the noise interval ci_low/ci_high covers each group's bounded-data mean, and the
  population interval covers μ = 0.3, each with probability >= 0.95 per group (the first exactly
  by the union bound over exact noise intervals; the second up to the normal approximation of a
  200-row Bernoulli mean, where it has a large margin: z_(0.0125)·0.5/√200 = 0.079 against the
  sample mean's sd 0.032, i.e. 2.4 sd). The misses are then stochastically below Binomial(1000,
  0.05); the test allows at most c = the least count with P[Binomial(1000, 0.05) >= c] < 1e-6 / 2;
- MixedNoiseMechanism's Gaussian-branch interval (Cor. 5.7.1) on X̄ + Z with X̄ ~ N(μ, σ²/n): its
  coverage is exactly the level (up to the grid term, which only widens it), so over 20000 draws
  the misses are below the Binomial(20000, 0.05) 1e-6 quantile and above its lower 1e-6 quantile
  (a two-sided check: the interval is not vacuous either).
"""
from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from scipy.stats import binom

from dpch.mechanisms import BoundedLaplaceMechanism, LaplaceMechanism, MixedNoiseMechanism
from dpch.mechanisms.intervals import population_mean_interval

mpmath.mp.dps = 60
DB = "t_intervals57"
ANALYST = "tester"


def _upper_limit(n: int, p: float, fail: float) -> int:
    """The least c with P[Binomial(n, p) >= c] < fail."""
    c = int(n * p)
    while binom.sf(c - 1, n, p) >= fail:
        c += 1
    return c


# -- exact ------------------------------------------------------------------------------------

def _bounded_tail(j: int, n: int, k: int, tau) -> mpmath.mpf:
    """P(|V − j| > k) for P(v | j) ∝ λ^|v − j| on {0..n}, λ = e^(−1/τ): geometric sums."""
    lam = mpmath.e ** (-1 / mpmath.mpf(tau))
    def side(m):  # Σ_{i=k+1..m} λ^i  (m = the distance to that end)
        return lam ** (k + 1) * (1 - lam ** (m - k)) / (1 - lam) if m > k else mpmath.mpf(0)
    z = (1 - lam ** (j + 1)) / (1 - lam) + lam * (1 - lam ** (n - j)) / (1 - lam)
    return (side(j) + side(n - j)) / z


@pytest.mark.parametrize("scale,hi,level", [(1.0, 5.0, 0.95), (3.0, 40.0, 0.9), (0.5, 100.0, 0.99)])
def test_bounded_halfwidth_against_exact_tail(scale, hi, level):
    m = BoundedLaplaceMechanism(scale, 0.0, hi)
    r = m.granularity
    n = m.grid_points
    tau = m.noise_scale_units
    h = m.ci_halfwidth(level)
    k = round((h - r / 2) / r)
    beta = 1 - level
    centres = sorted(j for j in {0, 1, k, k + 1, n // 4, n // 2, n // 2 + 1, n - k, n - 1, n} if 0 <= j <= n)
    assert max(_bounded_tail(j, n, k, tau) for j in centres) <= beta
    # tight: 1e-6 (relative) below k some centre (an end or the middle) has more than β outside
    # (the code keeps a 1e-9 relative margin on the tail against float error: ~500 grid units)
    k_less = int(k * (1 - 1e-6))
    assert max(_bounded_tail(j, n, k_less, tau) for j in (0, n // 2)) > beta


@pytest.mark.parametrize("scale,level", [(2.0, 0.95), (7.5, 0.99), (30.0, 0.9)])
def test_laplace_halfwidth_is_the_exact_quantile(scale, level):
    m = LaplaceMechanism(scale, True)
    assert m.granularity == 1.0
    lam = mpmath.e ** (-1 / mpmath.mpf(m.noise_scale_units))
    k = int(round(m.ci_halfwidth(level)))

    def tail(k):  # P(|K| > k) = 2 Σ_{i>k} (1−λ)/(1+λ) λ^i
        return 2 * (1 - lam) / (1 + lam) * lam ** (k + 1) / (1 - lam)
    assert tail(k) <= 1 - level < tail(k - 1)


# -- simulated: the controller's metadata -----------------------------------------------------

@pytest.fixture(scope="module")
def pdb(db):
    db.command(f"CREATE DATABASE IF NOT EXISTS {DB}")
    db.command(f"DROP TABLE IF EXISTS {DB}.pop")
    db.command(f"CREATE TABLE {DB}.pop (uid UInt64, g UInt16, x Float64) ENGINE = MergeTree ORDER BY uid")
    db.command(f"INSERT INTO {DB}.pop SELECT number, number % 1000, "
               f"if(cityHash64(number, 'pop') % 10 < 3, 1., 0.) FROM numbers(200000)")
    db.catalog.register(f"{DB}.pop", privacy_unit="uid", bounds={"g": (0, 999), "x": (0, 1)},
                        max_groups_contributed=1, max_rows_per_unit=1)
    db.ledger.set_budget(ANALYST, f"{DB}.pop", epsilon=1e6, delta=0.5)
    return db


def test_avg_intervals_cover(pdb):
    df = pdb.query(f"SELECT g, AVG(x) AS a FROM {DB}.pop GROUP BY g", epsilon=1.0)
    meta = df.attrs["dpch"]["columns"]["a"]
    assert meta["ci_level"] == 0.95 and "§5.7" in meta["population_ci"]
    truth = pdb.raw_query(f"SELECT g, avg(x) AS m FROM {DB}.pop GROUP BY g ORDER BY g")
    m = dict(zip(truth["g"], truth["m"]))
    lo, hi = np.array(meta["ci_low"]), np.array(meta["ci_high"])
    plo, phi = np.array(meta["population_ci_low"]), np.array(meta["population_ci_high"])
    sample_mean = np.array([m[g] for g in df["g"]])
    limit = _upper_limit(len(df), 0.05, 0.5e-6)
    assert int(((sample_mean < lo) | (sample_mean > hi)).sum()) < limit
    assert int(((0.3 < plo) | (0.3 > phi)).sum()) < limit
    assert (plo <= lo + 1e-12).all() and (phi >= hi - 1e-12).all()  # the sampling part only widens
    assert np.median(phi - plo) < 0.3  # informative: far narrower than the range [0, 1]


def test_population_interval_formula():
    """The widening is z_(β/4)·(hi − lo)/2/√n_lo (independent: scipy's normal quantile)."""
    from scipy.stats import norm

    lo, hi = population_mean_interval(np.array([0.4]), np.array([0.5]), np.array([100.0]), 0.0, 2.0, 0.1)
    w = norm.isf(0.1 / 4) * 1.0 / 10.0
    assert lo[0] == pytest.approx(0.4 - w, rel=1e-12) and hi[0] == pytest.approx(0.5 + w, rel=1e-12)
    lo, hi = population_mean_interval(np.array([0.1]), np.array([1.9]), np.array([0.5]), 0.0, 2.0, 0.1)
    assert lo[0] == 0.0 and hi[0] == 2.0  # clamped to the bounds; n_lo below 1 counts as 1


def test_mixed_gaussian_interval_coverage():
    mech = MixedNoiseMechanism.calibrated(1.0, 1.0, 1e-5, rule="variance")
    mech = MixedNoiseMechanism(mech.sensitivity, math.inf, mech.laplace, mech.gaussian, "forced")
    assert mech.uses_gaussian
    mu, var, n, draws, level = 10.0, 4.0, 50, 20000, 0.95
    rng = np.random.default_rng(12345)  # the sample mean's own randomness (not privacy noise)
    xbar = rng.normal(mu, math.sqrt(var / n), draws)
    released = np.asarray(mech.sample(0.0, draws), dtype=float) + xbar
    h = mech.confidence_interval(0.0, level, population_variance=var, n=n).upper
    misses = int((np.abs(released - mu) > h).sum())
    assert misses < _upper_limit(draws, 0.05, 0.5e-6)
    assert binom.cdf(misses, draws, 0.05) > 0.5e-6  # not vacuous: close to the nominal level
