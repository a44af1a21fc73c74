"""The (discrete) Laplace mechanism on the release grid: ε-DP for L1 sensitivity Δ (CKS20;
docs/NOISE.md)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from dpch import calibration as cal
from dpch.cost import MechanismCost
from dpch.errors import InvalidParameter
from dpch.mechanisms.base import (PrivacyLoss, _check_integer_flag, _check_value_sql,
                                  _float_literal, _up)


@dataclass(frozen=True)
class LaplaceMechanism:
    """``dpch_laplace(value, b)`` / ``dpch_laplace_int(value, b)``: the discrete Laplace of CKS20
    on the grid ``r = grid(b, 40)`` (``max(1, ·)`` for Int64). Input metric: L1 sensitivity Δ.
    Output measure: pure DP. Privacy relation (the paper, Thm 1, with the grid term of
    docs/NOISE.md): ``ε = (Δ + r)/b``, with r replaced by 0 for Int64 values when r = 1."""

    scale: float
    integer: bool = False

    input_metric = "L1"
    output_measure = "PureDP"
    grid_bits = cal.LAPLACE_GRID_BITS

    def __post_init__(self) -> None:
        b = cal._positive_finite(self.scale, "scale")
        object.__setattr__(self, "scale", b)
        _check_integer_flag(self.integer)
        cal.grid(b, self.grid_bits)  # raises if the grid underflows

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def calibrated(cls, sensitivity: float, epsilon: float, integer: bool = False
                   ) -> "LaplaceMechanism":
        """The mechanism with ``b = dpch.calibration.laplace_scale(Δ, ε)``, which is ε-DP for
        L1-sensitivity Δ including the grid term (verified exactly there)."""
        return cls(cal.laplace_scale(sensitivity, epsilon), _check_integer_flag(integer))

    # -- the kernel's parameters --------------------------------------------------------------

    @property
    def granularity(self) -> float:
        """The grid r of the UDF (docs/NOISE.md table)."""
        return cal.granularity(self.scale, self.grid_bits, self.integer)

    @property
    def grid_term(self) -> float:
        """What rounding to the grid adds to the sensitivity: r, or 0 for Int64 values when
        r = 1 (integers are on the grid)."""
        r = self.granularity
        return 0.0 if (self.integer and r == 1.0) else r

    @property
    def noise_scale_units(self) -> float:
        """The discrete Laplace scale in grid units the kernel uses, ``t/2^p >= b/r``."""
        return cal.kernel_noise_scale(self.scale, self.grid_bits, self.integer)[1]

    @property
    def udf_name(self) -> str:
        return "dpch_laplace_int" if self.integer else "dpch_laplace"

    # -- privacy relation ---------------------------------------------------------------------

    def privacy_function(self, sensitivity: float) -> PrivacyLoss:
        """Smallest ε (rounded up to a float) for L1-sensitivity Δ: ``(Δ + r)/b`` (the paper,
        Thm 1: a shift of d grid units costs d/τ <= (Δ/r + 1)/(b/r) for the discrete Laplace of
        scale τ >= b/r, CKS20 Alg. 2)."""
        d = cal.check_sensitivity(sensitivity)
        eps = (Fraction(d) + Fraction(self.grid_term)) / Fraction(self.scale)
        return PrivacyLoss(epsilon=_up(eps), delta=0.0, rho=None)

    def privacy_relation(self, sensitivity: float, epsilon: float) -> bool:
        """True iff the mechanism is ε-DP for L1-sensitivity Δ (exact rational comparison)."""
        d = cal.check_sensitivity(sensitivity)
        e = cal.check_epsilon(epsilon)
        return Fraction(d) + Fraction(self.grid_term) <= Fraction(e) * Fraction(self.scale)

    def cost(self, sensitivity: float, epsilon: float | None = None, label: str = ""
             ) -> MechanismCost:
        """The ledger entry for one release at L1-sensitivity Δ. With ``epsilon`` given it is
        verified by privacy_relation (raises InvalidParameter if the mechanism does not meet it);
        otherwise privacy_function's ε is charged."""
        if epsilon is None:
            eps = self.privacy_function(sensitivity).epsilon
        elif self.privacy_relation(sensitivity, epsilon):
            eps = float(epsilon)
        else:
            raise InvalidParameter("epsilon: the mechanism does not satisfy it at this sensitivity")
        d = cal.check_sensitivity(sensitivity)
        sens = _up(Fraction(d) + Fraction(self.grid_term))
        return MechanismCost(kind="laplace", sensitivity=sens,
                             scale=self.scale, epsilon=float(eps), delta=0.0, rho=None,
                             label=label)

    # -- utility ------------------------------------------------------------------------------

    @property
    def variance(self) -> float:
        """Exact variance of the noise the kernel adds, in real units: r²·2p/(1 - p)² with
        p = e^{-1/τ} (discrete Laplace of scale τ = noise_scale_units). It is at most the
        continuous 2b²·(1 + 2^-39)² and within r² of it. The rounding of the value to the grid
        (a deterministic error <= r/2, zero for Int64 with r = 1) is not included."""
        r = self.granularity
        tau = self.noise_scale_units
        one_minus_p = -math.expm1(-1.0 / tau)
        p = 1.0 - one_minus_p
        return r * r * 2.0 * p / (one_minus_p * one_minus_p)

    def ci_halfwidth(self, level: float = 0.95) -> float:
        """Half-width h with P[|released - true value| <= h] >= level, for the kernel's actual
        noise: h = r·k + (rounding <= r/2, or 0 for Int64 with r = 1), k the least integer with
        P[|K| > k] = 2e^{-(k+1)/τ}/(1 + e^{-1/τ}) <= 1 - level (discrete Laplace tail). Within a
        grid unit of the continuous ``dpch.calibration.laplace_ci_halfwidth(b, level)``."""
        lv = cal.check_level(level)
        beta = 1.0 - lv
        tau = self.noise_scale_units
        need = tau * (math.log(2.0 / beta) - math.log1p(math.exp(-1.0 / tau)))
        k = max(0, math.ceil(need * (1.0 + 2.0 ** -48) + 1e-9) - 1)  # margin for float rounding
        r = self.granularity
        return r * k + (self.grid_term / 2.0)

    def accuracy(self, beta: float) -> float:
        """(α, β)-accuracy: P[|released - true value| > α] <= β (ci_halfwidth(1 - β))."""
        return self.ci_halfwidth(1.0 - cal.check_level(beta, "beta"))

    # -- SQL ----------------------------------------------------------------------------------

    def sql(self, value_sql: str) -> str:
        """``dpch_laplace(<value_sql>, <b>)`` with b written by repr() (no precision lost)."""
        return f"{self.udf_name}({_check_value_sql(value_sql)}, {_float_literal(self.scale)})"
