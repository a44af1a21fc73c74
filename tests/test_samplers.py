"""Tests of the noise kernel `dpch._noise` (udf/noise.pyx, udf/dpch_kernel.h) against
docs/NOISE.md and the exact distributions of Canonne, Kamath & Steinke 2020 (CKS20).

Statistical design (non-flaky): every statistical check rejects only when its p-value is below
ALPHA = 1e-8. Chi-square tests use bins with an expected count of at least 100 (tails pooled), where
the chi-square approximation of the statistic's upper tail is accurate, and binomial checks use the
exact binomial test. (Checked for the 13 chi-square tests here: the exact tail of the Pearson
statistic with Poisson counts, computed by convolving the per-bin distributions, exceeds the nominal
1e-8 by at most 35 % (the 7-bin discrete Gaussian with sigma 0.75), so each rejects a correct
sampler with probability below 1.4e-8.) There are fewer than 50 statistical checks in this file,
so a correct implementation fails a run with probability below 50 * 1.4e-8 < 1e-6. Sample sizes
(1e6 for the fast paths, 2e5 for the arbitrary-precision path) are chosen so that each check runs
in well under a second and still detects gross errors (a wrong scale by a few percent shifts
P[X = 0] by many standard errors).

Moment checks use thresholds of at least 6.5 standard errors (two-sided normal tail < 1e-10 plus a
generous allowance for the non-normality of the estimator); each is stated where it is used.
"""
from __future__ import annotations

import math
import os
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

noise = pytest.importorskip("dpch._noise", reason="build the kernel: python3 setup.py build_ext --inplace")

ALPHA = 1e-8
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)


# ------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------

def chi2_pvalue(observed: np.ndarray, expected_prob: np.ndarray) -> float:
    n = observed.sum()
    expected = expected_prob * n
    assert expected.min() >= 100, "bins must have an expected count >= 100"
    stat = float(((observed - expected) ** 2 / expected).sum())
    return float(stats.chi2.sf(stat, len(observed) - 1))


def integer_gof(samples: np.ndarray, support: np.ndarray, pmf: np.ndarray) -> float:
    """Chi-square p-value of integer samples against a symmetric pmf given on `support` (a
    contiguous range holding all but a negligible mass). Values with an expected count below 100
    are pooled into one bin per tail."""
    n = len(samples)
    keep = pmf * n >= 100
    lo, hi = support[keep].min(), support[keep].max()
    centre = np.arange(lo, hi + 1)
    probs = pmf[(support >= lo) & (support <= hi)]
    left = pmf[support < lo].sum()
    right = pmf[support > hi].sum()
    counts = np.bincount(np.clip(samples, lo - 1, hi + 1) - (lo - 1), minlength=len(centre) + 2)
    obs = counts[1:-1].astype(float)
    exp = probs.copy()
    # pool each tail into its own bin, or into the outermost bin when too small
    if left * n >= 100:
        obs = np.concatenate([[counts[0]], obs])
        exp = np.concatenate([[left], exp])
    else:
        obs[0] += counts[0]
        exp[0] += left
    if right * n >= 100:
        obs = np.concatenate([obs, [counts[-1]]])
        exp = np.concatenate([exp, [right]])
    else:
        obs[-1] += counts[-1]
        exp[-1] += right
    return chi2_pvalue(obs, exp / exp.sum())


def dlap_pmf(scale: float, half_width: int):
    lam = math.exp(-1.0 / scale)
    support = np.arange(-half_width, half_width + 1)
    pmf = (1 - lam) / (1 + lam) * np.exp(-np.abs(support) / scale)
    return support, pmf


def dgauss_pmf(sigma: float):
    half_width = int(12 * sigma) + 20  # mass beyond: < exp(-72)
    support = np.arange(-half_width, half_width + 1)
    w = np.exp(-(support.astype(float) ** 2) / (2 * sigma * sigma))
    return support, w / w.sum()


def binom_ok(k: int, n: int, p: float) -> bool:
    return stats.binomtest(int(k), int(n), p).pvalue >= ALPHA


# ------------------------------------------------------------------------------------------------
# Bernoulli(exp(-gamma)) and uniform integers
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("num,den", [(1, 3), (1, 1), (5, 2), (7, 1),
                                     # 128-bit path: gamma just below 2 with a 129-bit denominator
                                     (2**128 - 12345, 2**127 - 7)])
def test_bernoulli_exp_frequency(num, den):
    n = 1_000_000
    x = noise.bernoulli_exp(num, den, n)
    assert x.dtype == np.bool_ and x.shape == (n,)
    p = math.exp(-num / den)
    assert binom_ok(x.sum(), n, p), (num, den, x.mean(), p)


def test_bernoulli_exp_arbitrary_precision_path():
    # den >= 2^127 goes through the exact Python-int path; gamma = 1/2 exactly
    n = 200_000
    den = 2**200 + 1
    x = noise.bernoulli_exp((den - 1) // 2 + 0, den, n)  # gamma = (2^199)/(2^200 + 1) ~ 1/2
    p = math.exp(-((den - 1) // 2) / den)
    assert binom_ok(x.sum(), n, p)


def test_bernoulli_exp_edge_cases():
    assert noise.bernoulli_exp(0, 5, 10_000).all()  # exp(0) = 1
    # gamma = 1e40: Pr[True] = exp(-1e40) = 0 to any precision
    assert not noise.bernoulli_exp(10**40, 1, 10_000).any()
    assert not noise.bernoulli_exp(10**6, 1, 1_000).any()
    assert noise.bernoulli_exp(1, 1, 0).shape == (0,)


def test_uniform_small_range_chi_square():
    n = 600_000
    x = noise.uniform(6, n)
    assert x.dtype == np.uint64 and int(x.max()) <= 5
    assert chi2_pvalue(np.bincount(x.astype(np.int64), minlength=6).astype(float),
                       np.full(6, 1 / 6)) >= ALPHA


def test_uniform_large_range_no_modulo_bias():
    # m = 3 * 2^61: the three thirds [k 2^61, (k+1) 2^61) are equally likely; a modulo reduction
    # of 64 random bits would give the first third probability 1/2 (detected by miles).
    n = 300_000
    x = noise.uniform(3 * 2**61, n)
    thirds = np.bincount((x >> np.uint64(61)).astype(np.int64), minlength=3)
    assert len(thirds) == 3
    assert chi2_pvalue(thirds.astype(float), np.full(3, 1 / 3)) >= ALPHA
    assert not noise.uniform(1, 1000).any()


def test_random_words_and_fork_safety():
    a = noise.random_u64(4)
    b = noise.random_u64(4)
    assert a.dtype == np.uint64 and not np.array_equal(a, b)  # equal with probability 2^-256
    # A forked child must not reuse the parent's buffered random bytes (pthread_atfork handler).
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.write(w, noise.random_u64(4).tobytes())
        finally:
            os._exit(0)
    os.close(w)
    child = b""
    while len(child) < 32:
        chunk = os.read(r, 32)
        if not chunk:
            break
        child += chunk
    os.close(r)
    os.waitpid(pid, 0)
    parent = noise.random_u64(4).tobytes()
    assert len(child) == 32
    assert child != parent  # equal with probability 2^-256 for a correct implementation


# ------------------------------------------------------------------------------------------------
# discrete Laplace (CKS20 Alg. 2)
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("t,s", [(3, 2),   # scale 3/2, s a power of two (shift path)
                                 (7, 3),   # scale 7/3, general s (division path)
                                 (1, 1),
                                 (5, 1)])
def test_discrete_laplace_goodness_of_fit(t, s):
    n = 1_000_000
    x = noise.discrete_laplace(t, s, n)
    assert x.dtype == np.int64 and x.shape == (n,)
    support, pmf = dlap_pmf(t / s, int(60 * t / s) + 10)
    assert integer_gof(x, support, pmf) >= ALPHA


def test_discrete_laplace_large_scale():
    """t/s = 2^40, the scale the Float64 release uses: bins on |X| in units of t/4 with the exact
    tail formula Pr[|X| >= a] = 2 lam^a / (1 + lam) (a >= 1), lam = exp(-s/t); and the sign."""
    n = 1_000_000
    t = 2**40
    x = noise.discrete_laplace(t, 1, n)
    lam = math.exp(-1 / t)
    edges = [int(i * t / 4) for i in range(1, 21)]
    tail = [2 * math.exp(-a / t) / (1 + lam) for a in edges]  # Pr[|X| >= a]
    probs = np.array([1 - tail[0]] + [tail[i] - tail[i + 1] for i in range(len(tail) - 1)] + [tail[-1]])
    a = np.abs(x)
    obs = np.bincount(np.searchsorted(edges, a, side="right"), minlength=len(probs)).astype(float)
    assert chi2_pvalue(obs, probs) >= ALPHA
    nonzero = x[x != 0]
    assert binom_ok((nonzero > 0).sum(), len(nonzero), 0.5)


def test_discrete_laplace_tiny_scale_is_exact_zero():
    # t/s = 3 / 2^45 and 3 / 2^200 (shift >= 128): Pr[X != 0] = 2 lam/(1 + lam) < 2 exp(-2^43)
    assert not noise.discrete_laplace(3, 2**45, 100_000).any()
    assert not noise.discrete_laplace(3, 2**200, 100_000).any()


# ------------------------------------------------------------------------------------------------
# discrete Gaussian (CKS20 Alg. 3)
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("S,q,n", [(5, 1, 1_000_000),        # sigma = 2.5
                                   (3, 2, 1_000_000),        # sigma = 0.75 (t = 1)
                                   (1000, 0, 1_000_000),     # sigma = 1000
                                   # sigma = 2.5 with S >= 2^32: every acceptance test takes the
                                   # exact arbitrary-precision path (smaller n: slower path)
                                   (5 * 2**31, 32, 200_000)])
def test_discrete_gaussian_goodness_of_fit(S, q, n):
    sigma = S / 2**q
    x = noise.discrete_gaussian(S, q, n)
    assert x.dtype == np.int64 and x.shape == (n,)
    support, pmf = dgauss_pmf(sigma)
    if sigma > 100:
        # bins of width sigma/10 (exact sums of the pmf)
        width = int(sigma // 10)
        idx = (support + width // 2) // width
        xs = (x + width // 2) // width
        uniq = np.arange(idx.min(), idx.max() + 1)
        bin_p = np.bincount(idx - idx.min(), weights=pmf, minlength=len(uniq))
        assert integer_gof(xs, uniq, bin_p) >= ALPHA
    else:
        assert integer_gof(x, support, pmf) >= ALPHA


def test_discrete_gaussian_release_sigma():
    """S = 2^20, q = 0 (the largest sigma the Float64 release uses). Bins of width sigma/4 on
    [-3.5 sigma, 3.5 sigma] plus two tails; bin probabilities from the normal CDF at half-integers
    (the discrete Gaussian sum differs from it by O(1/sigma^2) = 1e-12, far below sampling error)."""
    n = 1_000_000
    sigma = 2.0**20
    x = noise.discrete_gaussian(2**20, 0, n)
    edges = np.arange(-14, 15) * (sigma / 4)  # +-3.5 sigma: every bin expects >= 200
    cdf = stats.norm.cdf((edges - 0.5) / sigma)
    probs = np.concatenate([[cdf[0]], np.diff(cdf), [1 - cdf[-1]]])
    obs = np.bincount(np.searchsorted(edges - 0.5, x, side="right"), minlength=len(probs)).astype(float)
    assert chi2_pvalue(obs, probs) >= ALPHA


# ------------------------------------------------------------------------------------------------
# grids and rationals (docs/NOISE.md), against hand-computed values
# ------------------------------------------------------------------------------------------------

def test_grid_hand_computed():
    assert noise.grid(1.0, 40) == 2.0**-40       # ceil(log2 1) = 0
    assert noise.grid(1.5, 40) == 2.0**-39       # ceil(log2 1.5) = 1
    assert noise.grid(2.0, 20) == 2.0**-19       # exact power of two: ceil(log2 2) = 1
    assert noise.grid(3.0, 20) == 2.0**-18
    assert noise.grid(0.75, 40) == 2.0**-40
    assert noise.grid(0.5, 40) == 2.0**-41
    assert noise.grid(2.0**50, 40) == 1024.0


def test_laplace_parameters_hand_computed():
    # scale 1: r = 2^-40, u = 2^40, p = 0, t = 2^40
    assert tuple(noise.laplace_parameters(1.0)) == (-40, 2.0**-40, 2**40, 1)
    # scale 3: c = 2, r = 2^-38, u = 3 * 2^38 in (2^39, 2^40], p = 0
    assert tuple(noise.laplace_parameters(3.0)) == (-38, 2.0**-38, 3 * 2**38, 1)
    # scale 0.1 (double 3602879701896397 / 2^55): c = -3, r = 2^-43,
    # u = 3602879701896397 / 2^12 = 879609302220.8000..., t = 879609302221
    assert tuple(noise.laplace_parameters(0.1)) == (-43, 2.0**-43, 879609302221, 1)
    # Int64, scale 0.3: r = 1, u = 0.3, ceil(log2 0.3) = -1, p = 41, t = ceil(0.3 * 2^41)
    # 0.3 = 5404319552844595 / 2^54 -> 0.3 * 2^41 = 5404319552844595 / 2^13 = 659706976665.6...
    assert tuple(noise.laplace_parameters(0.3, integer=True)) == (0, 1.0, 659706976666, 2**41)
    # Int64, scale 2^50: r = 2^10, u = 2^40, p = 0
    assert tuple(noise.laplace_parameters(2.0**50, integer=True)) == (10, 1024.0, 2**40, 1)


def test_gaussian_parameters_hand_computed():
    # sigma 2.5: c = 2, r = 2^-18, u = 2.5 * 2^18 = 655360, q = 0
    assert tuple(noise.gaussian_parameters(2.5)) == (-18, 2.0**-18, 655360, 1)
    # Int64, sigma 2.5: r = 1, u = 2.5, ceil(log2 2.5) = 2, q = 18, S = 655360 (sigma exactly 2.5)
    assert tuple(noise.gaussian_parameters(2.5, integer=True)) == (0, 1.0, 655360, 2**18)
    # Int64, sigma 1e-300: q = 20 - ceil(log2 1e-300) = 20 + 996 = 1016
    k, r, S, den = noise.gaussian_parameters(1e-300, integer=True)
    assert (k, r, den) == (0, 1.0, 2**1016)
    assert S == math.ceil(Fraction(1e-300) * 2**1016)


def _reference_params(scale: float, bits: int, integer: bool):
    """Independent implementation of the NOISE.md rules in exact rational arithmetic."""
    x = Fraction(scale)
    c = 0
    while Fraction(2) ** c < x:
        c += 1
    while Fraction(2) ** (c - 1) >= x:
        c -= 1
    k = c - bits
    if integer:
        k = max(0, k)
    u = x / Fraction(2) ** k
    cu = 0
    while Fraction(2) ** cu < u:
        cu += 1
    while Fraction(2) ** (cu - 1) >= u:
        cu -= 1
    p = max(0, bits - cu)
    num = math.ceil(u * 2**p)
    return k, num, 2**p


def test_parameters_match_exact_rational_reference():
    rng = np.random.default_rng(12345)  # test inputs only; never used for noise
    scales = list(np.exp(rng.uniform(-60, 60, size=300))) + [1.0, 2.0, 0.5, 3.0, 1e-300, 5e-324, 1e300]
    for scale in scales:
        for integer in (False, True):
            k, r, t, s = noise.laplace_parameters(scale, integer=integer)
            assert (k, t, s) == _reference_params(scale, 40, integer), (scale, integer)
            assert Fraction(t, s) >= Fraction(scale) / Fraction(2) ** k  # rounding adds noise only
            k, r, S, den = noise.gaussian_parameters(scale, integer=integer)
            assert (k, S, den) == _reference_params(scale, 20, integer), (scale, integer)
            assert Fraction(S, den) >= Fraction(scale) / Fraction(2) ** k


def test_parameters_agree_with_calibration_module():
    calibration = pytest.importorskip("dpch.calibration")
    if not hasattr(calibration, "release_params"):
        pytest.skip("dpch.calibration.release_params not available")
    for scale in (1e-9, 0.1, 0.3, 1.0, 2.5, 3.0, 1e6, 2.0**50, 1e300):
        for integer in (False, True):
            k, _, t, s = noise.laplace_parameters(scale, integer=integer)
            assert calibration.release_params(scale, 40, integer) == (k, t, s.bit_length() - 1)
            k, _, S, den = noise.gaussian_parameters(scale, integer=integer)
            assert calibration.release_params(scale, 20, integer) == (k, S, den.bit_length() - 1)


# ------------------------------------------------------------------------------------------------
# releases: rounding, grid, saturation
# ------------------------------------------------------------------------------------------------

def test_round_half_even_exact():
    # r = 2^-1: value/r = 0.5, 1.5, -0.5, 2.5 -> 0, 2, -0, 2 (ties to even)
    assert noise.round_to_grid([0.25, 0.75, -0.25, 1.25, 1.3], -1).tolist() == [0.0, 2.0, -0.0, 2.0, 3.0]
    assert noise.round_to_grid_int([1, 3, -1, -3, 5, 7, 6], 1).tolist() == [0, 2, 0, -2, 2, 4, 3]
    big = [INT64_MIN, 2**62, 2**62 + 1, INT64_MAX]
    assert noise.round_to_grid_int(big, 63).tolist() == [-1, 0, 1, 1]
    assert noise.round_to_grid_int([INT64_MIN, INT64_MAX, -5, 5], 64).tolist() == [0, 0, 0, 0]
    assert noise.round_to_grid_int([-7, 7], 0).tolist() == [-7, 7]


def test_laplace_release_output_on_grid():
    n = 100_000
    for scale in (1.0, 0.1, 3.7e-5, 12345.678):
        k, r, t, s = noise.laplace_parameters(scale)
        values = np.linspace(-10, 10, n)
        out = noise.laplace_release(values, scale)
        units = out / r  # exact: division by a power of two
        assert np.array_equal(units, np.round(units)), scale
        m = noise.round_to_grid(values, k)
        # K = units - m is the noise in grid units: scale about t/s = 2^40 units, mean 0.
        # |mean(K)| / (t/s) has standard error sqrt(2/n) = 0.0045: 6.5 s.e. = 0.029
        assert abs(np.mean((units - m) / (t / s))) < 0.03


def test_laplace_release_int_rounding_and_grid():
    # scale 2^45: r = 2^5 = 32, t/s = 2^40. values/r = 1.5 -> m = 2, 0.5 -> 0, 2.5 -> 2, -1.5 -> -2
    n = 200_000
    scale = 2.0**45
    k, r, t, s = noise.laplace_parameters(scale, integer=True)
    assert (k, r, t, s) == (5, 32.0, 2**40, 1)
    for value, m in ((48, 2), (16, 0), (80, 2), (-48, -2)):
        out = noise.laplace_release_int(np.full(n, value, dtype=np.int64), scale)
        assert out.dtype == np.int64
        assert not (out % 32).any()
        K = out // 32 - m
        # the noise in units of t/s: mean 0, sd sqrt(2); 6.5 s.e. = 6.5 sqrt(2/n) = 0.021
        assert abs(np.mean(K / 2.0**40)) < 0.021, value


def test_laplace_release_int_small_scale_is_exact_on_integers():
    # scale 0.01 -> r = 1 and t/s >= 0.01: Pr[K != 0] = 2 lam/(1+lam) with lam = exp(-100)
    values = np.arange(-500_000, 500_000, dtype=np.int64)
    assert np.array_equal(noise.laplace_release_int(values, 0.01), values)


def test_laplace_release_int_saturates():
    # value INT64_MAX, scale 1 (t/s = 2^40 / 2^40 = 1): K >= 0 saturates to INT64_MAX.
    # Pr[K >= 0] = 1/(1 + lam), lam = exp(-1) (exact binomial test); K < -60 has prob. < e^-60.
    n = 200_000
    out = noise.laplace_release_int(np.full(n, INT64_MAX, dtype=np.int64), 1.0)
    assert out.min() >= INT64_MAX - 60
    assert binom_ok((out == INT64_MAX).sum(), n, 1 / (1 + math.exp(-1)))
    out = noise.laplace_release_int(np.full(n, INT64_MIN, dtype=np.int64), 1.0)
    assert out.max() <= INT64_MIN + 60
    assert binom_ok((out == INT64_MIN).sum(), n, 1 / (1 + math.exp(-1)))


def test_release_huge_values_round_to_themselves():
    # |value / r| >= 2^126: the noise is below half an ulp and r (m + K) rounds to the value
    assert noise.laplace_release([1e300, -1e300, 1.7e308], 1e-10).tolist() == [1e300, -1e300, 1.7e308]
    assert noise.gaussian_release([1.7e308], 1.0).tolist() == [1.7e308]


def test_gaussian_release_moments_and_grid():
    n = 1_000_000
    out = noise.gaussian_release(np.zeros(n), 1.0)
    k, r, S, den = noise.gaussian_parameters(1.0)
    units = out / r
    assert np.array_equal(units, np.round(units))
    # sigma in grid units is S/den = 2^20 exactly (sigma = 1): mean 0 (s.e. 0.001), variance 1
    # (s.e. sqrt(2/n) = 0.0014); thresholds 0.0065 and 0.01 are >= 6.5 s.e.
    assert abs(out.mean()) < 0.0065
    assert abs(out.var() - 1.0) < 0.01


def test_gaussian_release_int_matches_discrete_gaussian():
    # sigma 2.5 on Int64: r = 1, S/2^q = 655360/2^18 = 2.5 exactly -> K ~ N_Z(0, 2.5^2)
    n = 1_000_000
    out = noise.gaussian_release_int(np.zeros(n, dtype=np.int64), 2.5)
    support, pmf = dgauss_pmf(2.5)
    assert integer_gof(out, support, pmf) >= ALPHA
    values = np.arange(-1000, 1000, dtype=np.int64)
    assert np.array_equal(noise.gaussian_release_int(values, 1e-5), values)  # Pr[K != 0] < e^-1e9


def test_gaussian_release_int_tiny_sigma_arbitrary_precision():
    # sigma 1e-300: q = 1016, every Y != 0 candidate is decided with exact big integers
    values = np.arange(-50, 50, dtype=np.int64)
    assert np.array_equal(noise.gaussian_release_int(values, 1e-300), values)


def test_release_preserves_shape():
    v = np.zeros((3, 4))
    assert noise.laplace_release(v, 1.0).shape == (3, 4)
    assert noise.gaussian_release_int(np.zeros((2, 2), dtype=np.int64), 1.0).shape == (2, 2)
    assert noise.laplace_release([], 1.0).shape == (0,)


# ------------------------------------------------------------------------------------------------
# bad inputs: ValueError naming the problem, never a data value
# ------------------------------------------------------------------------------------------------

BAD_SCALES = [(0.0, "must be > 0"), (-1.0, "must be > 0"), (float("nan"), "NaN"),
              (float("inf"), "infinite"), (float("-inf"), "infinite"), ("abc", "finite number"),
              (None, "finite number")]


@pytest.mark.parametrize("fn", ["laplace_release", "gaussian_release"])
@pytest.mark.parametrize("scale,msg", BAD_SCALES)
def test_bad_scale_float(fn, scale, msg):
    with pytest.raises(ValueError, match=msg):
        getattr(noise, fn)(np.array([123456.789]), scale)


@pytest.mark.parametrize("fn", ["laplace_release_int", "gaussian_release_int"])
@pytest.mark.parametrize("scale,msg", BAD_SCALES)
def test_bad_scale_int(fn, scale, msg):
    with pytest.raises(ValueError, match=msg):
        getattr(noise, fn)(np.array([123456], dtype=np.int64), scale)


@pytest.mark.parametrize("fn", ["laplace_release", "gaussian_release"])
@pytest.mark.parametrize("bad,what", [(float("nan"), "NaN"), (float("inf"), "infinite"),
                                      (float("-inf"), "infinite")])
def test_bad_values_name_the_problem_not_the_data(fn, bad, what):
    values = np.array([123456.789, 98765.4321, bad])
    with pytest.raises(ValueError) as exc:
        getattr(noise, fn)(values, 1.0)
    message = str(exc.value)
    assert what in message and "index 2" in message
    assert "123456" not in message and "98765" not in message


def test_bad_value_types():
    with pytest.raises(ValueError, match="integers"):
        noise.laplace_release_int(np.array([1.5]), 1.0)
    with pytest.raises(ValueError, match="Int64 range"):
        noise.gaussian_release_int(np.array([2**64 - 1], dtype=np.uint64), 1.0)
    with pytest.raises(ValueError, match="numeric"):
        noise.laplace_release(np.array(["a"]), 1.0)


@pytest.mark.parametrize("call,msg", [
    (lambda: noise.discrete_laplace(0, 1, 1), "t must be >= 1"),
    (lambda: noise.discrete_laplace(1, 0, 1), "s must be >= 1"),
    (lambda: noise.discrete_laplace(2**63, 2**20, 1), "t must be < 2"),
    (lambda: noise.discrete_laplace(2**51 + 1, 2, 1), "scale t/s must be"),
    (lambda: noise.discrete_laplace(3, 3 * 2**64, 1), "power of two"),
    (lambda: noise.discrete_laplace(1.5, 1, 1), "t must be an integer"),
    (lambda: noise.discrete_laplace(1, 1, -1), "n must be >= 0"),
    (lambda: noise.discrete_gaussian(0, 0, 1), "S must be >= 1"),
    (lambda: noise.discrete_gaussian(1, -1, 1), "q must be >= 0"),
    (lambda: noise.discrete_gaussian(2**63, 30, 1), "S must be < 2"),
    (lambda: noise.discrete_gaussian(2**41 + 1, 0, 1), "sigma"),
    (lambda: noise.discrete_gaussian(1, 5000, 1), "q must be <= 4096"),
    (lambda: noise.bernoulli_exp(-1, 1, 1), "num must be >= 0"),
    (lambda: noise.bernoulli_exp(1, 0, 1), "den must be >= 1"),
    (lambda: noise.uniform(0, 1), "m must be >= 1"),
    (lambda: noise.uniform(2**64, 1), "m must be < 2"),
    (lambda: noise.grid(0.0, 40), "must be > 0"),
    (lambda: noise.grid(float("nan"), 40), "NaN"),
    (lambda: noise.laplace_parameters(-2.0), "must be > 0"),
    (lambda: noise.gaussian_parameters(float("inf")), "infinite"),
])
def test_bad_sampler_arguments(call, msg):
    with pytest.raises(ValueError, match=msg):
        call()
