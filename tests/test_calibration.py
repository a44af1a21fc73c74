"""Tests for dpch.calibration against published numbers, independent libraries (dp_accounting,
scipy, mpmath) and exact rational / exact-sum computations. No test checks a formula against
itself."""
from __future__ import annotations

import ast
import math
import pathlib
import random
from fractions import Fraction

import numpy as np
import pytest
import scipy.stats as st

from dpch import calibration as cal
from dpch.errors import InvalidParameter

warnings_filter = pytest.mark.filterwarnings("ignore::DeprecationWarning")

SECRET = 987654.321  # a "data-like" value that must never appear in an error message


# ----------------------------------------------------------------------------------------------
# Independent reference implementations (test-only)
# ----------------------------------------------------------------------------------------------

def exact_discrete_gaussian_delta_np(d: int, sigma: float, eps: float) -> float:
    """CKS20 Thm 7 by a vectorised sum over the pmf, with the worst-case set and the bracket
    exponents computed in exact rational arithmetic (independent of dpch's implementation)."""
    s2f = Fraction(sigma) ** 2
    x = 2 * Fraction(eps) * s2f  # y is in the set iff (2y + d)d > 2εσ²
    k = math.floor((x / d - d) / 2) + 1
    assert (2 * k + d) * d > x >= (2 * (k - 1) + d) * d
    assert k >= 1, "test helper expects T > 0"
    base = float(Fraction((2 * k + d) * d) - x)  # > 0
    s2 = sigma * sigma
    n_terms = int(-k + math.sqrt(k * k + 100.0 * s2)) + 10
    parts = []
    for j0 in range(0, n_terms, 1 << 20):
        j = np.arange(j0, min(n_terms, j0 + (1 << 20)), dtype=np.int64)
        w = np.exp(-(j * (2 * k + j)).astype(np.float64) / (2.0 * s2))
        c = -np.expm1(-(base + 2.0 * d * j.astype(np.float64)) / (2.0 * s2))
        parts.append(float(np.sum(w * c)))
    if sigma >= 2.0:
        log_z = math.log(sigma) + 0.5 * math.log(2.0 * math.pi)
    else:
        y = np.arange(-int(50 * sigma) - 5, int(50 * sigma) + 6, dtype=np.float64)
        log_z = math.log(float(np.sum(np.exp(-y * y / (2.0 * s2)))))
    return math.exp(math.log(math.fsum(parts)) - (k * k) / (2.0 * s2) - log_z)


def mpmath_discrete_delta(d: int, sigma: float, eps: float) -> float:
    """Brute force with 40 significant digits: Σ_y max(0, p(y) - e^ε p(y - d))."""
    import mpmath as mp

    mp.mp.dps = 40
    s = mp.mpf(sigma)
    n = int(60 * sigma) + 60 + d
    f = {y: mp.e ** (-(mp.mpf(y) ** 2) / (2 * s * s)) for y in range(-n - d, n + d + 1)}
    z = mp.fsum(f[y] for y in range(-n, n + 1))
    ee = mp.e ** mp.mpf(eps)
    tot = mp.fsum(max(mp.mpf(0), f[y] - ee * f[y - d]) for y in range(-n, n + 1))
    return float(tot / z)


def mpmath_gaussian_delta(sens: float, sigma: float, eps: float) -> float:
    import mpmath as mp

    mp.mp.dps = 60
    a = mp.mpf(sens) / (2 * mp.mpf(sigma))
    b = mp.mpf(eps) * mp.mpf(sigma) / mp.mpf(sens)
    phi = lambda t: mp.erfc(-t / mp.sqrt(2)) / 2  # noqa: E731
    return float(phi(a - b) - mp.e ** mp.mpf(eps) * phi(-a - b))


# ----------------------------------------------------------------------------------------------
# Module hygiene: the UDF program imports this module
# ----------------------------------------------------------------------------------------------

def test_calibration_imports_stdlib_only():
    src = pathlib.Path(cal.__file__).read_text()
    allowed = {"__future__", "fractions", "functools", "math", "numbers", "dataclasses", "statistics",
               "dpch.errors"}
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module]
        else:
            continue
        for name in names:
            assert name in allowed, f"calibration.py imports {name}"


def test_gaussian_sigma_is_cached():
    cal._gaussian_sigma_cached.cache_clear()
    a = cal.gaussian_sigma(1.0, 0.7, 1e-6)
    b = cal.gaussian_sigma(1.0, 0.7, 1e-6)
    assert a == b
    assert cal._gaussian_sigma_cached.cache_info().hits >= 1


# ----------------------------------------------------------------------------------------------
# grid (docs/NOISE.md)
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("bits", [20, 40])
def test_grid_exact_at_and_around_powers_of_two(bits):
    for k in list(range(-60, 61)) + [-1000, 1000]:
        p = math.ldexp(1.0, k)
        assert cal.grid(p, bits) == math.ldexp(1.0, k - bits)
        assert cal.grid(math.nextafter(p, math.inf), bits) == math.ldexp(1.0, k + 1 - bits)
        assert cal.grid(math.nextafter(p, 0.0), bits) == math.ldexp(1.0, k - bits)


def test_grid_matches_log2_definition_off_powers_of_two():
    rng = random.Random(7)
    for _ in range(2000):
        x = math.exp(rng.uniform(-200, 200))
        m, _ = math.frexp(x)
        if abs(m - 0.5) < 1e-9:
            continue
        assert cal.grid(x, 40) == 2.0 ** (math.ceil(math.log2(x)) - 40)
        assert cal.grid(x, 20) == 2.0 ** (math.ceil(math.log2(x)) - 20)


def test_grid_subnormal_and_rejections():
    assert cal.grid(5e-324, 0) == 5e-324  # 2^-1074
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(InvalidParameter):
            cal.grid(bad, 20)
    with pytest.raises(InvalidParameter):
        cal.grid(1e-320, 40)  # 2^-1103: the grid would underflow


def test_release_params_follow_noise_md():
    # Float Laplace: u = b/r in (2^39, 2^40], p = 0, t = ceil(u).
    b = 3.0
    k, t, p = cal.release_params(b, 40, False)
    assert (k, p) == (2 - 40, 0) and t == math.ceil(b * 2 ** 38)
    # Int Gaussian with small sigma: r = 1, q = 20 - ceil(log2 σ), S = ceil(σ 2^q).
    s = 3.7
    k, S, q = cal.release_params(s, 20, True)
    assert (k, q) == (0, 18) and S == math.ceil(3.7 * 2 ** 18)
    r, su = cal.kernel_noise_scale(s, 20, True)
    assert r == 1.0 and su >= s and su - s < 2 ** -18
    # Int Laplace with a big scale: r = grid(b, 40) > 1.
    b = 3.0 * 2 ** 50
    assert cal.granularity(b, 40, True) == 2.0 ** 12
    assert cal.granularity(0.5, 40, True) == 1.0


# ----------------------------------------------------------------------------------------------
# validation helpers
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [0, -1.0, math.inf, -math.inf, math.nan, "1", None, True])
def test_check_epsilon_rejects(bad):
    with pytest.raises(InvalidParameter, match="epsilon"):
        cal.check_epsilon(bad)


@pytest.mark.parametrize("bad", [0, 1, 1.5, -0.1, math.nan, math.inf, "0.1", None])
def test_check_delta_rejects(bad):
    with pytest.raises(InvalidParameter, match="delta"):
        cal.check_delta(bad)


def test_check_helpers_accept_and_return_floats():
    assert cal.check_epsilon(1) == 1.0 and isinstance(cal.check_epsilon(1), float)
    assert cal.check_epsilon(np.float32(0.5)) == 0.5
    assert cal.check_delta(1e-9) == 1e-9
    assert cal.check_bounds(-1, 2) == (-1.0, 2.0)
    assert cal.check_bounds(3.0, 3.0) == (3.0, 3.0)


@pytest.mark.parametrize("lo,hi", [(1.0, 0.0), (math.nan, 1.0), (0.0, math.inf), (-math.inf, 0.0),
                                   ("a", 1.0)])
def test_check_bounds_rejects(lo, hi):
    with pytest.raises(InvalidParameter, match="bounds"):
        cal.check_bounds(lo, hi)


def test_error_messages_never_contain_values():
    calls = [
        lambda: cal.check_epsilon(-SECRET),
        lambda: cal.check_delta(SECRET),
        lambda: cal.check_bounds(SECRET, -SECRET),
        lambda: cal.check_sensitivity(-SECRET),
        lambda: cal.laplace_scale(-SECRET, 1.0),
        lambda: cal.paper_gaussian_sigma(1.0, SECRET, 0.01),
        lambda: cal.classical_gaussian_sigma(1.0, SECRET, 0.01),
    ]
    for call in calls:
        with pytest.raises(InvalidParameter) as exc:
            call()
        assert "987654" not in str(exc.value)


# ----------------------------------------------------------------------------------------------
# Laplace
# ----------------------------------------------------------------------------------------------

def test_laplace_scale_hand_values():
    # Δ/ε = 1 -> grid(1, 40) = 2^-40, b = 1 + 2^-39.
    assert cal.laplace_scale(1.0, 1.0) == 1.0 + 2.0 ** -39
    # Δ/ε = 10 -> grid(10, 40) = 2^(4-40), b = 10 + 2·2^-36/0.1 (to rounding).
    assert cal.laplace_scale(1.0, 0.1) == pytest.approx(10.0 + 20.0 * 2.0 ** -36, rel=1e-15)


def _laplace_cases():
    rng = random.Random(11)
    cases = [(1.0, 1.0), (1.0, 0.1), (2.0, 1.0), (1.0, 3.0), (3.0, 3.0), (1e-9, 1e-3),
             (1e12, 0.5), (0.75, 0.75)]
    # Δ/ε exactly at, just below and just above powers of two
    for k in (-5, 0, 7, 30):
        p = math.ldexp(1.0, k)
        for x in (p, math.nextafter(p, 0.0), math.nextafter(p, math.inf), p * (1 - 2 ** -41)):
            cases.append((x * 0.3, 0.3))
    for _ in range(400):
        cases.append((math.exp(rng.uniform(-20, 20)), math.exp(rng.uniform(-7, 3))))
    return cases


def test_laplace_grid_slack_is_exact_for_many_parameters():
    for sens, eps in _laplace_cases():
        b = cal.laplace_scale(sens, eps)
        r = cal.grid(b, 40)
        # exact: Δ + r <= ε b (the UDF's ε = (Δ + r)/b does not exceed ε)
        assert Fraction(sens) + Fraction(r) <= Fraction(eps) * Fraction(b), (sens, eps)
        assert (sens + r) / b <= eps
        # and the slack is tiny: b - Δ/ε = 2·grid(Δ/ε, 40)/ε <= (Δ/ε)·2^-38/ε (+ a few ulps)
        assert b <= (sens / eps) * (1 + 2.0 ** -38 / eps + 2.0 ** -50)
        assert b >= sens / eps


@pytest.mark.parametrize("sens,eps,name", [(0.0, 1.0, "sensitivity"), (-1.0, 1.0, "sensitivity"),
                                           (math.inf, 1.0, "sensitivity"),
                                           (math.nan, 1.0, "sensitivity"),
                                           (1.0, 0.0, "epsilon"), (1.0, math.inf, "epsilon"),
                                           (1.0, -2.0, "epsilon"), (1.0, math.nan, "epsilon")])
def test_laplace_scale_rejects(sens, eps, name):
    with pytest.raises(InvalidParameter, match=name):
        cal.laplace_scale(sens, eps)


def test_laplace_scale_overflow_rejected():
    with pytest.raises(InvalidParameter):
        cal.laplace_scale(1e300, 1e-300)


# ----------------------------------------------------------------------------------------------
# Continuous Gaussian: analytic (Balle & Wang 2018), paper Cor 1, classical
# ----------------------------------------------------------------------------------------------

def test_analytic_sigma_published_values():
    # Balle & Wang 2018 (analytic Gaussian), Δ = 1, δ = 1e-5
    assert cal.analytic_gaussian_sigma(1.0, 1.0, 1e-5) == pytest.approx(3.73, abs=0.005)
    assert cal.analytic_gaussian_sigma(1.0, 0.1, 1e-5) == pytest.approx(30.75, abs=0.005)


@warnings_filter
@pytest.mark.parametrize("eps,delta", [(1.0, 1e-5), (0.1, 1e-5), (0.01, 1e-6), (0.5, 1e-9),
                                       (3.0, 1e-3), (10.0, 1e-12), (0.05, 0.2), (50.0, 1e-30)])
def test_analytic_sigma_vs_dp_accounting(eps, delta):
    import dp_accounting

    ours = cal.analytic_gaussian_sigma(1.0, eps, delta)
    theirs = dp_accounting.get_sigma_gaussian(eps, delta)
    assert ours == pytest.approx(theirs, rel=1e-9)
    # linear in the sensitivity
    assert cal.analytic_gaussian_sigma(7.5, eps, delta) == pytest.approx(7.5 * theirs, rel=1e-9)


@pytest.mark.parametrize("sens,eps,delta", [(1.0, 1.0, 1e-5), (2.5, 0.3, 1e-7), (0.01, 5.0, 1e-3),
                                            (1.0, 0.1, 1e-10), (3.0, 1.0, 1e-100)])
def test_analytic_sigma_is_the_smallest_valid(sens, eps, delta):
    s = cal.analytic_gaussian_sigma(sens, eps, delta)
    assert mpmath_gaussian_delta(sens, s, eps) <= delta * (1 + 1e-12)
    assert cal.gaussian_delta(sens, s, eps) <= delta
    smaller = s * (1 - 1e-9)
    assert mpmath_gaussian_delta(sens, smaller, eps) > delta


@warnings_filter
@pytest.mark.parametrize("sens,sigma,eps", [(1.0, 3.73, 1.0), (2.0, 1.0, 0.5), (1.0, 30.0, 0.1),
                                            (5.0, 2.0, 4.0), (1.0, 0.5, 0.0)])
def test_gaussian_delta_vs_dp_accounting_pld(sens, sigma, eps):
    from dp_accounting.pld import privacy_loss_mechanism as plm

    theirs = plm.GaussianPrivacyLoss(sigma, sensitivity=sens).get_delta_for_epsilon(eps)
    assert cal.gaussian_delta(sens, sigma, eps) == pytest.approx(theirs, rel=1e-9)


@pytest.mark.parametrize("sens,sigma,eps", [(1.0, 3.0, 5.0), (1.0, 5.0, 4.0), (1.0, 1.0, 25.0)])
def test_gaussian_delta_tiny_values_vs_mpmath(sens, sigma, eps):
    ours = cal.gaussian_delta(sens, sigma, eps)
    ref = mpmath_gaussian_delta(sens, sigma, eps)
    assert ours == pytest.approx(ref, rel=1e-9)
    assert 0.0 < ours < 1e-40


@warnings_filter
@pytest.mark.parametrize("sigma,delta", [(3.73, 1e-5), (1.0, 1e-3), (30.0, 1e-6), (0.7, 0.01)])
def test_gaussian_epsilon_vs_dp_accounting(sigma, delta):
    import dp_accounting

    eps = cal.gaussian_epsilon(1.0, sigma, delta)
    assert eps == pytest.approx(dp_accounting.get_epsilon_gaussian(sigma, delta), rel=1e-8)
    assert cal.gaussian_delta(1.0, sigma, eps) <= delta
    assert cal.gaussian_delta(1.0, sigma, eps * (1 - 1e-9)) > delta


def test_paper_cor1_hand_computation():
    # δ = 1e-5: ln(1/δ) = 11.512925464970229, α = √(2·11.5129...) = 4.798525..., σ = 2αΔ/ε
    assert cal.paper_gaussian_sigma(1.0, 1.0, 1e-5) == pytest.approx(9.597051, rel=1e-6)
    assert cal.paper_gaussian_sigma(3.0, 0.5, 0.1) == pytest.approx(
        2 * math.sqrt(2 * 2.302585092994046) * 3.0 / 0.5, rel=1e-12)
    # the corollary's guarantee holds under the exact profile (it is loose by design)
    for eps in (0.1, 1.0, 4.0):
        for delta in (0.1, 1e-3, 1e-8):
            s = cal.paper_gaussian_sigma(1.0, eps, delta)
            assert cal.gaussian_delta(1.0, s, eps) <= delta
            assert s >= cal.analytic_gaussian_sigma(1.0, eps, delta)


@pytest.mark.parametrize("eps,delta,name", [(4.01, 1e-5, "epsilon"), (1.0, 0.11, "delta"),
                                            (1.0, 0.5, "delta")])
def test_paper_cor1_rejects_outside_validity(eps, delta, name):
    with pytest.raises(InvalidParameter, match=name):
        cal.paper_gaussian_sigma(1.0, eps, delta)
    with pytest.raises(InvalidParameter):
        cal.gaussian_sigma(1.0, eps, delta, method="paper")


def test_classical_hand_computation_and_validity():
    # Δ = 1, ε = 0.5, δ = 1e-5: √(2 ln(125000)) / 0.5 = √(23.472138...) / 0.5 = 9.689616...
    assert cal.classical_gaussian_sigma(1.0, 0.5, 1e-5) == pytest.approx(9.689616, rel=1e-6)
    for eps in (0.01, 0.3, 0.99):
        for delta in (0.5, 1e-3, 1e-12):
            s = cal.classical_gaussian_sigma(2.0, eps, delta)
            assert cal.gaussian_delta(2.0, s, eps) <= delta
    for bad in (1.0, 1.5, 10.0):
        with pytest.raises(InvalidParameter, match="epsilon"):
            cal.classical_gaussian_sigma(1.0, bad, 1e-5)


@pytest.mark.parametrize("func", [cal.analytic_gaussian_sigma, cal.paper_gaussian_sigma,
                                  cal.classical_gaussian_sigma, cal.gaussian_sigma])
@pytest.mark.parametrize("args,name", [((0.0, 0.5, 1e-5), "sensitivity"),
                                       ((1.0, -0.5, 1e-5), "epsilon"),
                                       ((1.0, 0.5, 0.0), "delta"), ((1.0, 0.5, 1.0), "delta"),
                                       ((math.inf, 0.5, 1e-5), "sensitivity")])
def test_gaussian_sigma_functions_reject(func, args, name):
    with pytest.raises(InvalidParameter, match=name):
        func(*args)


def test_gaussian_sigma_rejects_unknown_method():
    with pytest.raises(InvalidParameter, match="method"):
        cal.gaussian_sigma(1.0, 1.0, 1e-5, method="laplace")


# ----------------------------------------------------------------------------------------------
# gaussian_sigma: grid slack of docs/NOISE.md
# ----------------------------------------------------------------------------------------------

def _gaussian_cases():
    rng = random.Random(5)
    cases = [(1.0, 1.0, 1e-5), (1.0, 0.1, 1e-5), (100.0, 0.5, 1e-9), (1e-6, 2.0, 1e-3),
             (1e9, 0.01, 1e-6), (3.0, 8.0, 1e-12), (1.0, 1e-4, 1e-5)]
    for _ in range(60):
        cases.append((math.exp(rng.uniform(-10, 10)), math.exp(rng.uniform(-5, 2)),
                      10 ** rng.uniform(-12, -2)))
    return cases


@pytest.mark.parametrize("method", ["analytic", "paper", "classical"])
def test_gaussian_grid_slack(method):
    for sens, eps, delta in _gaussian_cases():
        if method == "paper" and eps > 4:
            continue
        if method == "classical" and eps >= 1:
            continue
        s = cal.gaussian_sigma(sens, eps, delta, method)
        r = cal.grid(s, 20)
        # the continuous Gaussian at the rounded sensitivity Δ + r (docs/NOISE.md) ...
        assert cal.gaussian_delta(sens + r, s, eps) <= delta, (sens, eps, delta)
        # ... and at Δ + 1.5 r, what the discrete kernel needs (lattice bound (a))
        assert cal.gaussian_delta(sens + 1.5 * r, s, eps) <= delta, (sens, eps, delta)
        # docs/NOISE.md formula, computed here by hand (no crossing in these cases)
        sm = {"analytic": cal.analytic_gaussian_sigma, "paper": cal.paper_gaussian_sigma,
              "classical": cal.classical_gaussian_sigma}[method]
        g = cal.grid(sm(sens, eps, delta), 20)
        if cal.grid(sm(sens + 2 * g, eps, delta), 20) == g:
            assert s == pytest.approx(sm(sens + 2 * g, eps, delta), rel=1e-12)


def test_gaussian_sigma_power_of_two_crossing():
    """σ_m(Δ) just below 2^k: the plain formula lands above 2^k with a doubled grid and no slack
    left for the discrete kernel; gaussian_sigma iterates so that σ >= σ_m(Δ + 2·grid(σ))."""
    s1 = cal.analytic_gaussian_sigma(1.0, 1.0, 1e-5)
    sens = 8.0 / s1  # σ_m(Δ) ≈ 8 = 2^3
    sens = math.nextafter(sens, 0.0)
    sm = cal.analytic_gaussian_sigma(sens, 1.0, 1e-5)
    g = cal.grid(sm, 20)
    naive = cal.analytic_gaussian_sigma(sens + 2 * g, 1.0, 1e-5)
    assert cal.grid(naive, 20) == 2 * g  # the crossing happens
    s = cal.gaussian_sigma(sens, 1.0, 1e-5)
    r = cal.grid(s, 20)
    assert r == 2 * g and s > naive
    assert s >= cal.analytic_gaussian_sigma(sens + 2 * r, 1.0, 1e-5)
    assert cal.gaussian_udf_delta(sens, s, 1.0, False) <= 1e-5


# ----------------------------------------------------------------------------------------------
# Discrete Gaussian (CKS20): exact δ, bounds, and the calibrated σ of the kernel
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("d,sigma,eps", [(1, 3.73, 1.0), (1, 1.0, 3.0), (2, 2.0, 0.5),
                                         (3, 0.6, 2.0),
                                         (1, 12.5, 0.2)])
def test_discrete_delta_vs_mpmath_bruteforce(d, sigma, eps):
    ref = mpmath_discrete_delta(d, sigma, eps)
    assert cal.discrete_gaussian_delta(d, sigma, eps) == pytest.approx(ref, rel=1e-12)


@warnings_filter
@pytest.mark.parametrize("d,sigma,eps", [(1, 3.73, 1.0), (2, 2.0, 0.5), (3, 10.0, 0.3),
                                         (5, 40.0, 0.2)])
def test_discrete_delta_vs_dp_accounting(d, sigma, eps):
    from dp_accounting.pld import privacy_loss_mechanism as plm

    theirs = plm.DiscreteGaussianPrivacyLoss(sigma, sensitivity=d).get_delta_for_epsilon(eps)
    assert cal.discrete_gaussian_delta(d, sigma, eps) == pytest.approx(theirs, rel=1e-9)


def test_discrete_exceeds_continuous_for_small_sigma():
    """The finding that motivates the discrete check (module docstring): at σ = 3.73, ε = 1,
    d = 1 the discrete Gaussian's δ is 3.4 % above the continuous one."""
    disc = cal.discrete_gaussian_delta(1, 3.73, 1.0)
    cont = cal.gaussian_delta(1.0, 3.73, 1.0)
    assert disc == pytest.approx(1.0366449e-5, rel=1e-6)
    assert cont == pytest.approx(1.0028150e-5, rel=1e-6)
    assert disc / cont > 1.03


def test_discrete_delta_monotone_in_shift():
    for sigma in (0.5, 1.0, 2.7, 5.0):
        for eps in (0.05, 0.5, 2.0):
            ds = [cal.discrete_gaussian_delta(j, sigma, eps) for j in range(1, 7)]
            assert all(a <= b * (1 + 1e-12) for a, b in zip(ds, ds[1:]))


def test_discrete_bounds_dominate_exact():
    for sigma in (0.4, 1.0, 2.0, 3.73, 8.0, 21.0, 77.0, 300.0):
        for eps in (0.01, 0.2, 1.0, 3.0):
            for d in (1, 2, 5):
                exact = exact_or_none(d, sigma, eps)
                if exact is None:
                    continue
                assert cal._dg_bound_midpoint(d, sigma, eps) >= exact * (1 - 1e-12)
                assert cal._dg_bound_trapezoid(d, sigma, eps) >= exact * (1 - 1e-12)
                assert cal.discrete_gaussian_delta_bound(d, sigma, eps) >= exact * (1 - 1e-12)


def exact_or_none(d, sigma, eps):
    if cal._dg_terms(d, sigma, eps) > 200_000:
        return None
    return cal.discrete_gaussian_delta(d, sigma, eps)


def test_trapezoid_bound_is_tight_for_large_sigma():
    exact = cal.discrete_gaussian_delta(8, 1000.0, 0.001)
    assert cal.discrete_gaussian_delta_bound(8, 1000.0, 0.001) <= exact * (1 + 1e-4)


def test_discrete_delta_rejects_bad_input():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(InvalidParameter, match="sensitivity"):
            cal.discrete_gaussian_delta(bad, 1.0, 1.0)
    with pytest.raises(InvalidParameter, match="sigma"):
        cal.discrete_gaussian_delta(1, 1e7, 1e-6, max_terms=1000)


FLOAT_UDF_CASES = [(1.0, 1.0, 1e-5), (1.0, 0.1, 1e-6), (37.5, 2.0, 1e-9), (0.001, 0.5, 1e-7)]


@pytest.mark.parametrize("sens,eps,delta", FLOAT_UDF_CASES)
def test_float_udf_discrete_delta_at_calibrated_sigma(sens, eps, delta):
    """CKS20 Thm 7 summed exactly over the pmf, in grid units: the kernel's σ_u = S/2^q (in
    (2^19, 2^20])
    and the worst grid-unit shift floor(Δ/r) + 1. The calibrated σ keeps δ <= target."""
    s = cal.gaussian_sigma(sens, eps, delta)
    r, su = cal.kernel_noise_scale(s, 20, False)
    assert 2 ** 19 < su <= 2 ** 20
    d = math.floor(sens / r) + 1
    exact = exact_discrete_gaussian_delta_np(d, su, eps)
    assert exact <= delta
    # the library's cheap bound agrees and is conservative
    bound = cal.gaussian_udf_delta(sens, s, eps, False)
    assert exact <= bound <= delta
    assert bound <= exact * (1 + 1e-6)


@warnings_filter
def test_float_udf_discrete_delta_vs_dp_accounting():
    from dp_accounting.pld import privacy_loss_mechanism as plm

    s = cal.gaussian_sigma(1.0, 0.1, 1e-6)
    r, su = cal.kernel_noise_scale(s, 20, False)
    d = math.floor(1.0 / r) + 1
    theirs = plm.DiscreteGaussianPrivacyLoss(su, sensitivity=d).get_delta_for_epsilon(0.1)
    assert theirs <= 1e-6
    assert exact_discrete_gaussian_delta_np(d, su, 0.1) == pytest.approx(theirs, rel=1e-8)


@pytest.mark.parametrize("sens,eps,delta", [(1.0, 1.0, 1e-5), (1.0, 0.1, 1e-5), (1.0, 3.0, 1e-8),
                                            (2.0, 0.5, 1e-6), (5.0, 1.0, 1e-9), (1.0, 0.01, 1e-5),
                                            (3.0, 10.0, 1e-4)])
def test_int_udf_discrete_delta_at_calibrated_sigma(sens, eps, delta):
    """dpch_gaussian_int with r = 1: exact discrete δ at the kernel's S/2^q <= target, and the
    calibration is tight (0.1 % less σ breaks it)."""
    s = cal.gaussian_sigma(sens, eps, delta, integer=True)
    r, su = cal.kernel_noise_scale(s, 20, True)
    assert r == 1.0
    d = math.floor(sens)
    exact = exact_discrete_gaussian_delta_np(d, su, eps)
    assert exact <= delta
    _, su_small = cal.kernel_noise_scale(s * 0.999, 20, True)
    assert exact_discrete_gaussian_delta_np(d, su_small, eps) > delta


def test_count_sigma_for_int_udf_must_use_integer_calibration():
    """The float-calibrated σ (continuous analytic + 2·grid) is not enough for dpch_gaussian_int
    at Δ = 1: the exact discrete δ is 3.4 % above the target."""
    s_float = cal.gaussian_sigma(1.0, 1.0, 1e-5)
    _, su = cal.kernel_noise_scale(s_float, 20, True)
    assert exact_discrete_gaussian_delta_np(1, su, 1.0) > 1.03e-5
    s_int = cal.gaussian_sigma(1.0, 1.0, 1e-5, integer=True)
    assert 3.735 < s_int < 3.745


def test_int_path_large_sigma_uses_bounds_and_stays_valid():
    # d = 1, ε = 1e-4: the exact sum would take ~450 000 terms; the bounds decide.
    s = cal.gaussian_sigma(1.0, 1e-4, 1e-5, integer=True)
    assert s <= cal.analytic_gaussian_sigma(1.0, 1e-4, 1e-5) * 1.001
    _, su = cal.kernel_noise_scale(s, 20, True)
    assert exact_discrete_gaussian_delta_np(1, su, 1e-4) <= 1e-5


# ----------------------------------------------------------------------------------------------
# zCDP
# ----------------------------------------------------------------------------------------------

@warnings_filter
@pytest.mark.parametrize("sens,sigma", [(1.0, 3.0), (2.0, 1.0), (0.5, 10.0)])
def test_zcdp_rho_vs_dp_accounting_rdp(sens, sigma):
    from dp_accounting import dp_event, rdp

    orders = [2.0, 4.0, 16.0]
    acc = rdp.RdpAccountant(orders=orders)
    acc.compose(dp_event.GaussianDpEvent(noise_multiplier=sigma / sens))
    rho = cal.zcdp_rho(sens, sigma)
    for alpha, r in zip(orders, acc._rdp):  # Rényi DP of order α is α·ρ
        assert r == pytest.approx(alpha * rho, rel=1e-12)


def test_zcdp_delta_is_a_valid_but_looser_bound():
    for sigma in (1.0, 3.73, 20.0):
        rho = cal.zcdp_rho(1.0, sigma)
        for eps in (0.5, 1.0, 3.0):
            assert cal.zcdp_delta(rho, eps) >= cal.gaussian_delta(1.0, sigma, eps)
    assert cal.zcdp_delta(1.0, 0.5) == 1.0


# ----------------------------------------------------------------------------------------------
# Accuracy and confidence intervals
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("level", [0.5, 0.9, 0.95, 0.99, 1 - 1e-9])
def test_laplace_ci_vs_scipy(level):
    b = 2.5
    assert cal.laplace_ci_halfwidth(b, level) == pytest.approx(
        st.laplace.isf((1 - level) / 2, scale=b), rel=1e-9)
    assert st.laplace.cdf(cal.laplace_ci_halfwidth(b, level), scale=b) - st.laplace.cdf(
        -cal.laplace_ci_halfwidth(b, level), scale=b) == pytest.approx(level, rel=1e-9)


@pytest.mark.parametrize("level", [0.5, 0.9, 0.95, 0.99, 1 - 1e-12])
def test_gaussian_ci_vs_scipy(level):
    s = 3.7
    assert cal.gaussian_ci_halfwidth(s, level) == pytest.approx(
        s * st.norm.isf((1 - level) / 2), rel=1e-9)


def test_default_level_is_95_percent():
    assert cal.laplace_ci_halfwidth(1.0) == pytest.approx(math.log(20.0))
    assert cal.gaussian_ci_halfwidth(1.0) == pytest.approx(1.959963984540054)


@pytest.mark.parametrize("beta", [0.5, 0.05, 1e-6])
def test_accuracy_vs_scipy_tails(beta):
    b, s = 1.7, 2.2
    alpha_l = cal.laplace_accuracy(b, beta)
    assert 2 * st.laplace.sf(alpha_l, scale=b) == pytest.approx(beta, rel=1e-9)
    alpha_g = cal.gaussian_accuracy(s, beta)
    assert 2 * st.norm.sf(alpha_g, scale=s) == pytest.approx(beta, rel=1e-9)
    # DPSQL table: α = (2Δ/ε)√(log(1.25/δ))·erf⁻¹(1 - β) for the classical σ
    from scipy.special import erfinv

    sig = cal.classical_gaussian_sigma(1.0, 0.5, 1e-5)
    assert cal.gaussian_accuracy(sig, beta) == pytest.approx(
        2 / 0.5 * math.sqrt(math.log(1.25 / 1e-5)) * erfinv(1 - beta), rel=1e-9)


def test_noisy_mean_ci_thesis_cor_5_7_1():
    h = cal.noisy_mean_ci_halfwidth(0.3, 4.0, 100, 0.95)
    assert h == pytest.approx(st.norm.isf(0.025) * math.sqrt(4.0 / 100 + 0.09), rel=1e-9)
    with pytest.raises(InvalidParameter, match="n"):
        cal.noisy_mean_ci_halfwidth(0.3, 4.0, 0, 0.95)


@pytest.mark.parametrize("bad", [0.0, 1.0, -0.5, math.nan])
def test_ci_rejects_bad_level(bad):
    with pytest.raises(InvalidParameter, match="level"):
        cal.laplace_ci_halfwidth(1.0, bad)
    with pytest.raises(InvalidParameter, match="beta"):
        cal.gaussian_accuracy(1.0, bad)


def test_confidence_interval_dataclass():
    ci = cal.ConfidenceInterval.around(10.0, 2.5, 0.9)
    assert (ci.lower, ci.upper, ci.level, ci.halfwidth) == (7.5, 12.5, 0.9, 2.5)
    with pytest.raises(InvalidParameter):
        cal.ConfidenceInterval.around(1.0, -1.0, 0.9)


def test_gaussian_grid_too_coarse_fails_closed():
    """σ/Δ above ~2^18: grid(σ, 20) grows as fast as σ, so no σ satisfies the docs/NOISE.md
    requirement; the calibration refuses instead of returning an unsafe σ."""
    assert cal.analytic_gaussian_sigma(1.0, 1e-5, 1e-100) > 2 ** 19
    with pytest.raises(InvalidParameter, match="too small for the Gaussian noise grid"):
        cal.gaussian_sigma(1.0, 1e-5, 1e-100)
    with pytest.raises(InvalidParameter, match="too small for the Gaussian noise grid"):
        cal.gaussian_sigma(1.0, 1e-5, 1e-100, integer=True)


def test_gaussian_udf_delta_trivial_when_nothing_is_protected():
    assert cal.gaussian_udf_delta(1e300, 1.0, 1.0, False) == 1.0
    assert cal.gaussian_udf_delta(1e300, 1.0, 1.0, True) == 1.0


@pytest.mark.parametrize("sens, eps, delta", [(1, 1.0, 1e-5), (1, 3.0, 1e-6), (7, 0.5, 1e-6), (1000, 1.0, 1e-9)])
def test_udf_gaussian_sigma_is_valid_for_both_kernels(sens, eps, delta):
    """dpch_gaussian_sigma feeds dpch_gaussian_int in the SQL functions: the integer kernel's exact
    discrete δ (CKS20 Thm 7, via gaussian_udf_delta) must meet the target, and so must the Float64
    kernel's."""
    from dpch.calibration import gaussian_udf_delta, udf_gaussian_sigma

    s = udf_gaussian_sigma(sens, eps, delta)
    assert gaussian_udf_delta(sens, s, eps, True) <= delta
    assert gaussian_udf_delta(sens, s, eps, False) <= delta
