"""Tests for dpch.mechanisms: the privacy relations (Tumult-style privacy_function /
privacy_relation) against hand-computed grid terms, exact rational arithmetic, exact discrete
sums, dp_accounting and scipy."""
from __future__ import annotations

import dataclasses
import math
import random
import re
from fractions import Fraction

import numpy as np
import pytest
import scipy.stats as st

from dpch import calibration as cal
from dpch.cost import MechanismCost
from dpch.errors import InvalidParameter
from dpch.mechanisms import GaussianMechanism, LaplaceMechanism, PrivacyLoss

warnings_filter = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def dg_pmf(sigma: float, n: int | None = None):
    """Discrete Gaussian pmf on [-n, n] (test-only, numpy)."""
    n = n or int(40 * sigma) + 5
    y = np.arange(-n, n + 1)
    w = np.exp(-(y.astype(np.float64) ** 2) / (2 * sigma * sigma))
    return y, w / w.sum()


# ----------------------------------------------------------------------------------------------
# Laplace
# ----------------------------------------------------------------------------------------------

def test_laplace_privacy_function_hand_grid_term():
    # b = 3·2^50: r = 2^(ceil(log2 b) - 40) = 2^(52 - 40) = 4096
    b = 3.0 * 2 ** 50
    m = LaplaceMechanism(b)
    assert m.granularity == 4096.0 and m.grid_term == 4096.0
    assert m.privacy_function(10.0).epsilon == pytest.approx((10.0 + 4096.0) / b, rel=1e-15)
    # Int64 with the same big scale: r = 4096 too, the value is rounded
    assert LaplaceMechanism(b, integer=True).grid_term == 4096.0
    # Int64 with b = 2: r = max(1, 2^-39) = 1 and integers are not rounded: ε = Δ/b exactly
    mi = LaplaceMechanism(2.0, integer=True)
    assert mi.granularity == 1.0 and mi.grid_term == 0.0
    assert mi.privacy_function(1.0) == PrivacyLoss(epsilon=0.5, delta=0.0, rho=None)
    # Float64 with b = 2: r = 2^(1 - 40)
    assert LaplaceMechanism(2.0).privacy_function(1.0).epsilon == pytest.approx(
        (1 + 2.0 ** -39) / 2, rel=1e-15)


@pytest.mark.parametrize("integer", [False, True])
def test_laplace_calibrated_meets_epsilon_exactly(integer):
    rng = random.Random(3)
    for _ in range(300):
        sens = math.exp(rng.uniform(-10, 12))
        eps = math.exp(rng.uniform(-6, 2))
        m = LaplaceMechanism.calibrated(sens, eps, integer=integer)
        loss = m.privacy_function(sens)
        assert loss.epsilon <= eps and loss.delta == 0.0
        assert m.privacy_relation(sens, eps)
        # exact rational: (Δ + r)/b <= ε, r computed here from the definition
        r = 2.0 ** (math.ceil(math.log2(m.scale)) - 40)
        assert Fraction(sens) + Fraction(r) <= Fraction(eps) * Fraction(m.scale)
        # and the calibration is tight: the slack 2·grid(Δ/ε, 40)/ε costs at most 2^-38/ε of ε
        assert loss.epsilon >= eps * (1 - 2.0 ** -37 / eps)
        assert not m.privacy_relation(sens, math.nextafter(loss.epsilon, 0.0))


def test_laplace_privacy_function_rounds_up():
    m = LaplaceMechanism(3.0)
    eps = m.privacy_function(1.0).epsilon
    assert Fraction(eps) >= (Fraction(1) + Fraction(m.grid_term)) / Fraction(3)
    assert m.privacy_relation(1.0, eps)


def test_laplace_variance_vs_scipy_dlaplace():
    for b in (0.3, 1.0, 2.5, 17.0):
        m = LaplaceMechanism(b, integer=True)
        tau = m.noise_scale_units
        assert b <= tau < b * (1 + 2.0 ** -38)
        assert m.variance == pytest.approx(st.dlaplace(1.0 / tau).var(), rel=1e-12)
    m = LaplaceMechanism(11.0)  # Float64: discrete on a fine grid, ≈ continuous 2b²
    assert m.variance == pytest.approx(2 * 11.0 ** 2, rel=1e-10)


@pytest.mark.parametrize("b", [0.4, 1.0, 2.0, 5.3, 40.0])
@pytest.mark.parametrize("level", [0.5, 0.9, 0.95, 0.99])
def test_laplace_int_ci_exact_coverage_and_minimal(b, level):
    m = LaplaceMechanism(b, integer=True)
    h = m.ci_halfwidth(level)
    assert h == int(h)
    a = 1.0 / m.noise_scale_units
    cover = st.dlaplace.cdf(h, a) - st.dlaplace.cdf(-h - 1, a)
    assert cover >= level
    if h >= 1:
        assert st.dlaplace.cdf(h - 1, a) - st.dlaplace.cdf(-h, a) < level


@pytest.mark.parametrize("level", [0.5, 0.95, 0.999])
def test_laplace_float_ci_close_to_continuous(level):
    b = 7.25
    m = LaplaceMechanism(b)
    h = m.ci_halfwidth(level)
    cont = st.laplace.isf((1 - level) / 2, scale=b)
    assert abs(h - cont) <= 2 * m.granularity
    assert m.accuracy(1 - level) == h


def test_laplace_sql_and_udf_names():
    m = LaplaceMechanism.calibrated(1.0, 0.1)
    sql = m.sql("count()")
    match = re.fullmatch(r"dpch_laplace\(count\(\), (.+)\)", sql)
    assert match and float(match.group(1)) == m.scale  # repr keeps every bit
    assert repr(m.scale) == match.group(1)
    assert LaplaceMechanism(1.0, integer=True).sql("toInt64(count())").startswith(
        "dpch_laplace_int(toInt64(count()), ")
    assert LaplaceMechanism(1e-5).sql("x") == "dpch_laplace(x, 1e-05)"
    for bad in ("", "   ", None, 3):
        with pytest.raises(InvalidParameter, match="value_sql"):
            m.sql(bad)


def test_laplace_cost_for_the_ledger():
    m = LaplaceMechanism.calibrated(2.0, 0.5)
    c = m.cost(2.0, epsilon=0.5, label="SUM(x)")
    assert isinstance(c, MechanismCost)
    assert (c.kind, c.scale, c.epsilon, c.delta, c.rho, c.label) == ("laplace", m.scale, 0.5, 0.0,
                                                                     None, "SUM(x)")
    assert c.sensitivity == 2.0 + m.grid_term
    assert m.cost(2.0).epsilon == m.privacy_function(2.0).epsilon
    with pytest.raises(InvalidParameter, match="epsilon"):
        m.cost(2.0, epsilon=0.49)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan, "1", 1e-320])
def test_laplace_rejects_bad_scale(bad):
    with pytest.raises(InvalidParameter):
        LaplaceMechanism(bad)


def test_mechanisms_are_frozen_and_validate_flags():
    m = LaplaceMechanism(1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.scale = 2.0  # type: ignore[misc]
    with pytest.raises(InvalidParameter, match="integer"):
        LaplaceMechanism(1.0, integer=1)  # type: ignore[arg-type]
    with pytest.raises(InvalidParameter, match="integer"):
        GaussianMechanism(1.0, integer="yes")  # type: ignore[arg-type]
    assert (m.input_metric, m.output_measure) == ("L1", "PureDP")
    g = GaussianMechanism(1.0)
    assert (g.input_metric, g.output_measure) == ("L2", "zCDP")


# ----------------------------------------------------------------------------------------------
# Gaussian
# ----------------------------------------------------------------------------------------------

def test_gaussian_privacy_function_hand_grid_term():
    s = 3.0  # r = 2^(2 - 20)
    g = GaussianMechanism(s)
    r = 2.0 ** -18
    assert g.granularity == r
    assert g.privacy_function(1.0) == PrivacyLoss(None, None, pytest.approx((1 + r) ** 2 / 18,
                                                                           rel=1e-15))
    gi = GaussianMechanism(s, integer=True)
    assert gi.granularity == 1.0 and gi.grid_term == 0.0
    assert gi.privacy_function(1.0).rho == pytest.approx(1 / 18, rel=1e-15)
    big = GaussianMechanism(3.0 * 2 ** 30, integer=True)  # r = 2^(32 - 20) > 1: rounded
    assert big.grid_term == 2.0 ** 12
    # ρ is rounded up
    rho = g.privacy_function(1.0).rho
    assert Fraction(rho) >= (Fraction(1) + Fraction(r)) ** 2 / (2 * Fraction(s) ** 2)


@warnings_filter
@pytest.mark.parametrize("integer", [False, True])
@pytest.mark.parametrize("sens,eps,delta", [(1.0, 1.0, 1e-5), (1.0, 0.1, 1e-6), (3.0, 2.0, 1e-9),
                                            (10.0, 0.5, 1e-5)])
def test_gaussian_calibrated_meets_eps_delta(integer, sens, eps, delta):
    g = GaussianMechanism.calibrated(sens, eps, delta, integer=integer)
    assert g.privacy_relation(sens, eps, delta)
    assert g.delta_for_epsilon(sens, eps) <= delta
    loss = g.epsilon_delta(sens, delta)
    assert loss.delta == delta and loss.epsilon <= eps * (1 + 1e-9)
    assert g.delta_for_epsilon(sens, loss.epsilon) <= delta
    if not integer:
        # the grid only adds: never better than the continuous Gaussian at Δ (dp_accounting).
        # (Int64 with r = 1 can be better or worse than continuous: the lattice effect.)
        from dp_accounting.pld import privacy_loss_mechanism as plm

        cont = plm.GaussianPrivacyLoss(g.sigma, sensitivity=sens).get_delta_for_epsilon(
            loss.epsilon)
        assert cont <= delta * (1 + 1e-9)


@pytest.mark.parametrize("sens,eps,delta", [(1.0, 1.0, 1e-5), (2.0, 0.3, 1e-7), (1.0, 4.0, 1e-6)])
def test_gaussian_int_relation_is_exact_discrete(sens, eps, delta):
    """For r = 1 the relation is the exact discrete δ (CKS20 Thm 7), checked here against an
    independent pmf sum; a 10 % smaller σ must fail the relation."""
    g = GaussianMechanism.calibrated(sens, eps, delta, integer=True)
    su = g.noise_sigma_units
    y, p = dg_pmf(su)
    d = int(sens)
    shifted = np.interp(y - d, y, p, left=0.0, right=0.0)
    exact = float(np.sum(np.maximum(0.0, p - math.exp(eps) * shifted)))
    assert g.delta_for_epsilon(sens, eps) == pytest.approx(exact, rel=1e-6)
    assert exact <= delta
    assert not GaussianMechanism(g.sigma * 0.9, integer=True).privacy_relation(sens, eps, delta)


def test_gaussian_epsilon_delta_vs_dp_accounting_continuous():
    """Float64 mechanism: ε(δ) sits just above the continuous ε at sensitivity Δ (grid and lattice
    add a few parts per million), never below it."""
    import dp_accounting

    g = GaussianMechanism(10.0)
    eps = g.epsilon_delta(1.0, 1e-5).epsilon
    cont = dp_accounting.get_epsilon_gaussian(10.0, 1e-5)
    assert cont <= eps <= cont * (1 + 1e-4)


def test_gaussian_zcdp_fallback_for_large_delta_regime():
    # tiny σ/Δ: the lattice bounds are void (T < 0), the zCDP conversion still gives a valid δ
    g = GaussianMechanism(0.3)
    rho = g.privacy_function(5.0).rho
    assert g.delta_for_epsilon(5.0, 400.0) <= cal.zcdp_delta(rho, 400.0)
    assert g.delta_for_epsilon(5.0, 0.1) <= 1.0


def test_gaussian_variance():
    for s in (0.4, 1.3, 3.0):  # exact discrete variance (< σ_u², CKS20)
        g = GaussianMechanism(s, integer=True)
        y, p = dg_pmf(g.noise_sigma_units)
        assert g.variance == pytest.approx(float(np.sum(p * y.astype(np.float64) ** 2)), rel=1e-12)
        assert g.variance <= g.noise_sigma_units ** 2 * (1 + 1e-15)
    g = GaussianMechanism(5.0, integer=True)
    y, p = dg_pmf(g.noise_sigma_units)
    assert g.variance == pytest.approx(float(np.sum(p * y.astype(np.float64) ** 2)), rel=1e-12)
    g = GaussianMechanism(5.0)
    assert g.variance == pytest.approx(25.0, rel=1e-6)


@pytest.mark.parametrize("s", [0.4, 1.0, 3.74, 12.0])
@pytest.mark.parametrize("level", [0.5, 0.9, 0.95, 0.999])
def test_gaussian_int_ci_coverage(s, level):
    g = GaussianMechanism(s, integer=True)
    h = g.ci_halfwidth(level)
    assert h == int(h)
    y, p = dg_pmf(g.noise_sigma_units)
    assert float(np.sum(p[np.abs(y) <= h])) >= level
    # not wasteful: at most one unit more than the continuous quantile (plus the σ floor)
    assert h <= max(math.ceil(st.norm.isf((1 - level) / 2) * g.noise_sigma_units), math.ceil(s)) + 1


@pytest.mark.parametrize("level", [0.9, 0.95, 0.999])
def test_gaussian_float_ci_close_to_continuous(level):
    g = GaussianMechanism(4.5)
    h = g.ci_halfwidth(level)
    cont = 4.5 * st.norm.isf((1 - level) / 2)
    assert cont - 1e-12 <= h <= cont + 2 * g.granularity
    assert g.accuracy(1 - level) == h


def test_gaussian_sql_and_udf_names():
    g = GaussianMechanism.calibrated(1.0, 1.0, 1e-5)
    sql = g.sql("sum(x)")
    match = re.fullmatch(r"dpch_gaussian\(sum\(x\), (.+)\)", sql)
    assert match and float(match.group(1)) == g.sigma
    gi = GaussianMechanism.calibrated(1.0, 1.0, 1e-5, integer=True)
    assert gi.udf_name == "dpch_gaussian_int"
    assert gi.sql("c") == f"dpch_gaussian_int(c, {gi.sigma!r})"


@pytest.mark.parametrize("method", ["analytic", "paper", "classical"])
def test_gaussian_calibrated_methods(method):
    g = GaussianMechanism.calibrated(1.0, 0.5, 1e-6, method=method)
    assert g.sigma == cal.gaussian_sigma(1.0, 0.5, 1e-6, method)
    assert g.privacy_relation(1.0, 0.5, 1e-6)


def test_gaussian_cost_for_the_ledger():
    g = GaussianMechanism.calibrated(1.0, 1.0, 1e-5, integer=True)
    c = g.cost(1.0, 1e-5, epsilon=1.0, label="COUNT(*)")
    assert (c.kind, c.scale, c.epsilon, c.delta, c.label) == ("gaussian", g.sigma, 1.0, 1e-5,
                                                              "COUNT(*)")
    assert c.sensitivity == 1.0
    assert c.rho == pytest.approx(1.0 / (2 * g.sigma ** 2), rel=1e-15)
    assert g.cost(1.0, 1e-5).epsilon <= 1.0 * (1 + 1e-9)
    with pytest.raises(InvalidParameter):
        g.cost(1.0, 1e-5, epsilon=0.9)


@pytest.mark.parametrize("bad", [0.0, -2.0, math.inf, math.nan, None])
def test_gaussian_rejects_bad_sigma(bad):
    with pytest.raises(InvalidParameter, match="sigma"):
        GaussianMechanism(bad)


def test_relation_rejects_bad_parameters():
    g = GaussianMechanism(2.0)
    with pytest.raises(InvalidParameter, match="sensitivity"):
        g.privacy_function(-1.0)
    with pytest.raises(InvalidParameter, match="delta"):
        g.epsilon_delta(1.0, 0.0)
    with pytest.raises(InvalidParameter, match="epsilon"):
        g.privacy_relation(1.0, 0.0, 1e-5)
