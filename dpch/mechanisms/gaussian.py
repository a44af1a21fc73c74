"""The discrete Gaussian mechanism on the release grid: ρ-zCDP and (ε, δ)-DP for L2 sensitivity Δ
(CKS20 Thm 7 / Cor. 13; docs/NOISE.md)."""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction

from dpch import calibration as cal
from dpch.cost import MechanismCost
from dpch.errors import InvalidParameter
from dpch.mechanisms.base import (PrivacyLoss, _check_integer_flag, _check_value_sql,
                                  _float_literal, _up)


@functools.lru_cache(maxsize=1024)
def _gaussian_epsilon_cached(sigma: float, integer: bool, sensitivity: float, delta: float
                             ) -> float:
    mech = GaussianMechanism(sigma, integer)

    def ok(e: float) -> bool:
        return mech.delta_for_epsilon(sensitivity, e) <= delta

    if ok(0.0):
        return 0.0
    # Start from the continuous answer at the kernel's effective sensitivity, then bracket.
    r = mech.granularity
    d_eff = sensitivity + mech.grid_term + 0.5 * r
    guess = cal.gaussian_epsilon(d_eff, sigma, delta) or 1e-12
    hi = guess
    step = guess * 2.0 ** -20
    while not ok(hi):
        step *= 2.0
        hi = guess + step
        if not math.isfinite(hi):
            raise InvalidParameter("no finite epsilon reaches this delta")
    lo = hi
    step = hi * 2.0 ** -20
    while lo > 0.0 and ok(lo):
        hi = lo
        lo = max(0.0, hi - step)
        step *= 2.0
    return cal._bisect_increasing_ok(ok, lo, hi, 1e-10)


@dataclass(frozen=True)
class GaussianMechanism:
    """``dpch_gaussian(value, σ)`` / ``dpch_gaussian_int(value, σ)``: the discrete Gaussian of
    CKS20 on the grid ``r = grid(σ, 20)`` (``max(1, ·)`` for Int64). Input metric: L2
    sensitivity Δ. Output measure: zCDP, ``ρ = (Δ + r)²/(2σ²)`` (CKS20 Thm 4; Bun & Steinke
    Prop. 1.6), r replaced by 0 for Int64 values when r = 1. Approximate DP: ``epsilon_delta``
    and ``delta_for_epsilon`` (exact discrete δ, CKS20 Thm 7, or the lattice bounds of
    dpch.calibration; never the continuous formula alone)."""

    sigma: float
    integer: bool = False

    input_metric = "L2"
    output_measure = "zCDP"
    grid_bits = cal.GAUSSIAN_GRID_BITS

    def __post_init__(self) -> None:
        s = cal._positive_finite(self.sigma, "sigma")
        object.__setattr__(self, "sigma", s)
        _check_integer_flag(self.integer)
        cal.grid(s, self.grid_bits)  # raises if the grid underflows

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def calibrated(cls, sensitivity: float, epsilon: float, delta: float, integer: bool = False,
                   method: str = "analytic") -> "GaussianMechanism":
        """The mechanism with ``σ = dpch.calibration.gaussian_sigma(Δ, ε, δ, method,
        integer=integer)``: (ε, δ)-DP for L2-sensitivity Δ for the kernel's discrete noise."""
        integer = _check_integer_flag(integer)
        return cls(cal.gaussian_sigma(sensitivity, epsilon, delta, method, integer=integer),
                   integer)

    # -- the kernel's parameters --------------------------------------------------------------

    @property
    def granularity(self) -> float:
        """The grid r of the UDF (docs/NOISE.md table)."""
        return cal.granularity(self.sigma, self.grid_bits, self.integer)

    @property
    def grid_term(self) -> float:
        """What rounding to the grid adds to the sensitivity: r, or 0 for Int64 values when
        r = 1."""
        r = self.granularity
        return 0.0 if (self.integer and r == 1.0) else r

    @property
    def noise_sigma_units(self) -> float:
        """The discrete Gaussian σ in grid units the kernel uses, ``S/2^q >= σ/r``."""
        return cal.kernel_noise_scale(self.sigma, self.grid_bits, self.integer)[1]

    @property
    def udf_name(self) -> str:
        return "dpch_gaussian_int" if self.integer else "dpch_gaussian"

    # -- privacy relation ---------------------------------------------------------------------

    def privacy_function(self, sensitivity: float) -> PrivacyLoss:
        """ρ-zCDP for L2-sensitivity Δ: ``ρ = (Δ + r)²/(2σ²)`` rounded up (CKS20 Thm 4: the
        discrete Gaussian with integer shift d <= (Δ + r)/r grid units and σ_u >= σ/r is
        d²/(2σ_u²)-zCDP)."""
        d = cal.check_sensitivity(sensitivity)
        num = Fraction(d) + Fraction(self.grid_term)
        rho = num * num / (2 * Fraction(self.sigma) ** 2)
        return PrivacyLoss(epsilon=None, delta=None, rho=_up(rho))

    def delta_for_epsilon(self, sensitivity: float, epsilon: float) -> float:
        """An upper bound on the δ(ε) of the kernel's noise at L2-sensitivity Δ: the smaller of
        ``dpch.calibration.gaussian_udf_delta`` (exact discrete δ, CKS20 Thm 7, or the lattice
        bounds) and the zCDP conversion exp(-(ε - ρ)²/(4ρ)) (Bun & Steinke Prop. 1.3)."""
        e = cal._real(epsilon, "epsilon")
        if not (e >= 0.0 and math.isfinite(e)):
            raise InvalidParameter("epsilon must be a finite number >= 0")
        rho = self.privacy_function(sensitivity).rho
        assert rho is not None
        return min(cal.gaussian_udf_delta(sensitivity, self.sigma, e, self.integer),
                   cal.zcdp_delta(rho, e))

    def epsilon_delta(self, sensitivity: float, delta: float) -> PrivacyLoss:
        """(ε, δ): the least ε (to relative 1e-10, rounded so that it holds) with
        delta_for_epsilon(Δ, ε) <= δ."""
        d = cal.check_sensitivity(sensitivity)
        dl = cal.check_delta(delta)
        return PrivacyLoss(epsilon=_gaussian_epsilon_cached(self.sigma, self.integer, d, dl),
                           delta=dl, rho=None)

    def privacy_relation(self, sensitivity: float, epsilon: float, delta: float) -> bool:
        """True iff the mechanism is (ε, δ)-DP for L2-sensitivity Δ (by delta_for_epsilon)."""
        e = cal.check_epsilon(epsilon)
        dl = cal.check_delta(delta)
        return self.delta_for_epsilon(sensitivity, e) <= dl

    def cost(self, sensitivity: float, delta: float, epsilon: float | None = None,
             label: str = "") -> MechanismCost:
        """The ledger entry for one release at L2-sensitivity Δ: (ε, δ) and ρ. With ``epsilon``
        given it is verified by privacy_relation (InvalidParameter if not met); otherwise
        epsilon_delta's ε is charged."""
        dl = cal.check_delta(delta)
        if epsilon is None:
            eps = self.epsilon_delta(sensitivity, dl).epsilon
        elif self.privacy_relation(sensitivity, epsilon, dl):
            eps = float(epsilon)
        else:
            raise InvalidParameter("epsilon/delta: the mechanism does not satisfy them at this "
                                   "sensitivity")
        d = cal.check_sensitivity(sensitivity)
        sens = _up(Fraction(d) + Fraction(self.grid_term))
        return MechanismCost(kind="gaussian", sensitivity=sens,
                             scale=self.sigma, epsilon=float(eps), delta=dl,
                             rho=self.privacy_function(sensitivity).rho, label=label)

    # -- utility ------------------------------------------------------------------------------

    @property
    def variance(self) -> float:
        """Exact variance of the noise the kernel adds, in real units: r²·Var[N_Z(0, σ_u²)] with
        σ_u = noise_sigma_units. It is below r²σ_u² (CKS20) and equal to it to double precision for
        σ_u >= 4 (the Poisson-summation correction is below 1e-100); summed exactly otherwise.
        The rounding of the value to the grid (<= r/2, zero for Int64 with r = 1) is not
        included."""
        r = self.granularity
        su = self.noise_sigma_units
        if su >= 4.0:
            return r * r * su * su
        n = int(40.0 * su) + 2
        two = 2.0 * su * su
        w = [math.exp(-(y * y) / two) for y in range(-n, n + 1)]
        z = math.fsum(w)
        m2 = math.fsum(wi * (y * y) for wi, y in zip(w, range(-n, n + 1)))
        return r * r * m2 / z

    def ci_halfwidth(self, level: float = 0.95) -> float:
        """Half-width h with P[|released - true value| <= h] >= level for the kernel's noise:
        h = r·k + (rounding <= r/2, or 0 for Int64 with r = 1), k = max(⌈σ_u z - 1/2⌉,
        ⌈σ_u - 1/2⌉), z = Φ⁻¹((1 + level)/2). Proof: P[|K| > k] = 2S(k+1)/Z <= 2Q((k + 1/2)/σ_u)
        (midpoint rule on the convex tail, k + 1/2 >= σ_u; Z >= σ_u√(2π)). Within about a grid unit
        of the continuous ``dpch.calibration.gaussian_ci_halfwidth(σ, level)`` when
        level >= 0.69."""
        lv = cal.check_level(level)
        su = self.noise_sigma_units
        z = cal._normal_quantile_upper((1.0 - lv) / 2.0)
        k = max(math.ceil(su * z * (1.0 + 2.0 ** -48) + 1e-9 - 0.5), math.ceil(su - 0.5), 0)
        return self.granularity * k + self.grid_term / 2.0

    def accuracy(self, beta: float) -> float:
        """(α, β)-accuracy: P[|released - true value| > α] <= β (ci_halfwidth(1 - β))."""
        return self.ci_halfwidth(1.0 - cal.check_level(beta, "beta"))

    # -- SQL ----------------------------------------------------------------------------------

    def sql(self, value_sql: str) -> str:
        """``dpch_gaussian(<value_sql>, <σ>)`` with σ written by repr() (no precision lost)."""
        return f"{self.udf_name}({_check_value_sql(value_sql)}, {_float_literal(self.sigma)})"
