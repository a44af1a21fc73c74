"""The mixed noise mechanism (biswal_thesis_dp_foundations.md §5.3, Def. 5.3.1; the sound variant)
(issue 16)."""
from __future__ import annotations

import importlib
import math
from dataclasses import dataclass

from dpch import calibration as cal
from dpch.errors import InvalidParameter
from dpch.mechanisms.base import PrivacyLoss
from dpch.mechanisms.intervals import _sampling_halfwidth
from dpch.mechanisms.laplace import LaplaceMechanism
from dpch.mechanisms.gaussian import GaussianMechanism


def thesis_mnm_threshold(epsilon: float, delta: float) -> float:
    """t0 = √π·δ·ε/2, the sensitivity threshold of the thesis's Thm 5.3.2 (and Remark 5.3.4)."""
    return math.sqrt(math.pi) * cal.check_delta(delta) * cal.check_epsilon(epsilon) / 2.0


@dataclass(frozen=True)
class MixedNoiseMechanism:
    """The Mixed Noise Mechanism (MNM) of the thesis (biswal_thesis_dp_foundations.md §5.3,
    Def. 5.3.1, Alg. 5.3.6): Gaussian noise when the sensitivity is at most a threshold t0,
    Laplace noise of scale Δ/ε otherwise. The branch depends on Δ (public), not on the data.

    The thesis (Thm 5.3.2) states: with σ² = 2(Δ/ε)² and t0 = √π·δ·ε/2 the MNM is (ε, δ)-DP.
    That is NOT sound. The Gaussian mechanism's δ(ε) depends on Δ/σ only, and with σ = √2·Δ/ε
    that ratio is ε/√2 whatever Δ is: at ε = 1 its δ is 0.0396 (Balle & Wang 2018, Thm 8) for
    every Δ, however small, so for every δ < 0.0396 the thesis's mechanism with Δ <= t0 violates
    (ε, δ)-DP. The proof's error is the tail bound used in Lemma 5.3.3,
    P(N(0, σ²) > t) <= σ/√(2π)·e^(−t²/2σ²) (missing the factor 1/t; false for t < σ, and not
    scale-invariant), after which t0 follows from units that do not match. ``thesis`` builds that
    mechanism so that tests can show it (its privacy_relation, which computes the truth, says no;
    ``thesis_claim`` is what the thesis states).

    The sound variant (``calibrated``): the same public switch on Δ, with each branch calibrated
    to (ε, δ) on its own — Laplace b = laplace_scale(Δ, ε) (pure ε), Gaussian σ =
    gaussian_sigma(Δ, ε, δ) (the kernel's discrete noise, exact δ). Either branch is (ε, δ)-DP,
    so the mechanism is. Because both σ and b scale with Δ, a threshold on Δ cannot trade one
    against the other; ``rule="variance"`` instead takes the branch with the smaller variance at
    (ε, δ), which depends on (ε, δ) only."""

    sensitivity: float
    threshold: float
    laplace: LaplaceMechanism
    gaussian: GaussianMechanism
    rule: str = ""  # the branch rule that set the threshold ("thesis", "variance"; "" unstated)

    output_measure = "ApproxDP"

    def __post_init__(self) -> None:
        cal.check_sensitivity(self.sensitivity)
        t = cal._real(self.threshold, "threshold")
        if not t >= 0.0:
            raise InvalidParameter("threshold must be >= 0")

    @classmethod
    def thesis(cls, sensitivity: float, epsilon: float, delta: float) -> "MixedNoiseMechanism":
        """The thesis's parameters (Alg. 5.3.6): σ_MNM = √2·Δ/ε, Laplace scale Δ/ε,
        t0 = √π·δ·ε/2. Not (ε, δ)-DP for δ below the Gaussian branch's true δ (class docstring)."""
        d = cal.check_sensitivity(sensitivity)
        e = cal.check_epsilon(epsilon)
        return cls(d, thesis_mnm_threshold(e, delta), LaplaceMechanism(d / e),
                   GaussianMechanism(math.sqrt(2.0) * d / e))

    @classmethod
    def calibrated(cls, sensitivity: float, epsilon: float, delta: float, rule: str = "thesis"
                   ) -> "MixedNoiseMechanism":
        """The sound MNM: each branch calibrated to (ε, δ) on its own. ``rule="thesis"``: Gaussian
        iff Δ <= t0 = √π·δ·ε/2; ``rule="variance"``: the branch with the smaller noise variance
        (a function of (ε, δ) and Δ only, so public)."""
        d = cal.check_sensitivity(sensitivity)
        e = cal.check_epsilon(epsilon)
        dl = cal.check_delta(delta)
        lap = LaplaceMechanism.calibrated(d, e)
        gau = GaussianMechanism.calibrated(d, e, dl)
        if rule == "thesis":
            t0 = thesis_mnm_threshold(e, dl)
        elif rule == "variance":
            t0 = math.inf if gau.variance <= lap.variance else 0.0
        else:
            raise InvalidParameter("rule must be 'thesis' or 'variance'")
        return cls(d, t0, lap, gau, rule)

    @property
    def uses_gaussian(self) -> bool:
        """Def. 5.3.1: Gaussian iff Δ <= t0."""
        return self.sensitivity <= self.threshold

    @property
    def branch(self) -> "LaplaceMechanism | GaussianMechanism":
        return self.gaussian if self.uses_gaussian else self.laplace

    def thesis_claim(self, epsilon: float, delta: float) -> bool:
        """What Thm 5.3.2 states, as code: (ε, δ)-DP whenever the Gaussian branch is used with
        Δ <= √π·δ·ε/2 or the Laplace branch has scale >= Δ/ε. (False claims included: compare
        with privacy_relation.)"""
        if self.uses_gaussian:
            return self.sensitivity <= thesis_mnm_threshold(epsilon, delta)
        return self.laplace.scale >= self.sensitivity / cal.check_epsilon(epsilon)

    def delta_for_epsilon(self, epsilon: float) -> float:
        """The true δ(ε) of the branch used, for the kernel's noise (Gaussian:
        GaussianMechanism.delta_for_epsilon; Laplace: 0 if ε covers its pure ε, else the exact
        hockey-stick divergence of the discrete Laplace for the grid shift)."""
        e = cal._real(epsilon, "epsilon")
        if self.uses_gaussian:
            return self.gaussian.delta_for_epsilon(self.sensitivity, e)
        pure = self.laplace.privacy_function(self.sensitivity).epsilon
        if pure <= e:
            return 0.0
        # a pure ε'-DP mechanism is post-processing of randomized response at ε' (Kairouz, Oh &
        # Viswanath 2015), whose δ(ε) is (e^ε' − e^ε)/(1 + e^ε')
        return (math.exp(pure) - math.exp(e)) / (1.0 + math.exp(pure))

    def privacy_function(self, delta: float) -> PrivacyLoss:
        """(ε, δ) of the branch used: Laplace its pure ε, Gaussian its least ε at δ."""
        if self.uses_gaussian:
            return self.gaussian.epsilon_delta(self.sensitivity, delta)
        return self.laplace.privacy_function(self.sensitivity)

    def privacy_relation(self, epsilon: float, delta: float) -> bool:
        """True iff the mechanism is (ε, δ)-DP at its sensitivity (the truth, not the thesis's
        claim)."""
        e = cal.check_epsilon(epsilon)
        dl = cal.check_delta(delta)
        if self.uses_gaussian:
            return self.gaussian.privacy_relation(self.sensitivity, e, dl)
        return self.laplace.privacy_relation(self.sensitivity, e)

    @property
    def variance(self) -> float:
        return self.branch.variance

    def ci_halfwidth(self, level: float = 0.95) -> float:
        """The noise half-width of the branch used (its exact discrete-noise interval)."""
        return self.branch.ci_halfwidth(level)

    def facts(self, epsilon: float, delta: float, unit: float = 1.0) -> dict:
        """Public parameters for explain and result metadata (the controller's mechanism="mixed";
        threshold and scales in value units: ``unit`` is the value of one unit of the quantity)."""
        g = self.uses_gaussian
        u = float(unit)
        return {"mechanism": "mixed", "branch": "gaussian" if g else "laplace", "rule": self.rule,
                "source": "biswal thesis §5.3, Def. 5.3.1, sound variant (each branch calibrated to "
                          "(ε, δ) on its own; the thesis's Thm 5.3.2 is false, docs/NOISE.md)",
                "threshold": self.threshold * u, "laplace_scale": self.laplace.scale * u,
                "gaussian_sigma": self.gaussian.sigma * u,
                "guarantee": (f"({epsilon:.6g}, {delta:.3g})-DP" if g else f"{epsilon:.6g}-DP (pure)")}

    def confidence_interval(self, released: float, level: float = 0.95,
                            population_variance: float | None = None, n: int | None = None
                            ) -> "cal.ConfidenceInterval":
        """The thesis's §5.7 interval. Gaussian branch: released ± z_(α/2)·√(σ²/n + σ_Z²)
        (Cor. 5.7.1; σ_Z² the kernel noise's variance, plus the grid rounding r/2), or the noise
        interval alone without σ². Laplace branch: the noise interval, plus z_(β/4)·σ/√n at
        level 1 − β/2 each (union bound) with σ²."""
        lv = cal.check_level(level)
        beta = 1.0 - lv
        if population_variance is None:
            h = self.branch.ci_halfwidth(lv)
        elif n is None:
            raise InvalidParameter("n is needed with population_variance")
        elif self.uses_gaussian:
            _sampling_halfwidth(population_variance, n, beta)  # checks the arguments
            h = (cal._normal_quantile_upper(beta / 2.0)
                 * math.sqrt(float(population_variance) / int(n) + self.gaussian.variance)
                 + self.gaussian.grid_term / 2.0)
        else:
            h = self.laplace.ci_halfwidth(1.0 - beta / 2.0) + _sampling_halfwidth(
                population_variance, n, beta / 2.0)
        v = float(released)
        return cal.ConfidenceInterval(v, v - h, v + h, lv)

    def metadata(self, level: float = 0.95) -> dict:
        return {"mechanism": "mixed", "source": "biswal thesis §5.3, Def. 5.3.1 (sound variant)",
                "branch": "gaussian" if self.uses_gaussian else "laplace",
                "threshold": self.threshold, "variance": self.variance,
                "ci_level": level, "ci_halfwidth": self.branch.ci_halfwidth(level)}

    def sample(self, value: float, n: int = 1):
        """``n`` releases by the kernel (dpch_gaussian or dpch_laplace)."""
        _noise = importlib.import_module("dpch._noise")  # not ``from dpch import``: no import of the package

        vals = [float(value)] * int(n)
        if self.uses_gaussian:
            return _noise.gaussian_release(vals, self.gaussian.sigma)
        return _noise.laplace_release(vals, self.laplace.scale)

    def sql(self, value_sql: str) -> str:
        return self.branch.sql(value_sql)
