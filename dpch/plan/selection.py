"""Private partition selection (dpch.plan's docstring, point 7; docs/CONTROLLER.md, "Partition
selection"): the three release rules, their thresholds and release probabilities, and the
data-independent choice among them.

A group's input is n, its count of distinct units after contribution bounding; one unit moves at
most c = ``coords`` counts by 1 (c = k under add_remove, 2k under substitute). Each rule releases
a group iff its noisy count is >= T, and the noisy count of a released group is part of the same
(ε_sel, δ_sel)-DP mechanism (so COUNT(DISTINCT unit) reuses it):

- ``optimal`` (Desfontaines, Voss, Gipson & Mandayam, PoPETs 2022, Theorem 1): each group is
  released with the largest probability π(n) any (ε₀, δ₀)-DP rule can give, (ε₀, δ₀) =
  (ε/c, 1 − (1 − δ)^(1/c)) (Kairouz, Oh & Viswanath 2015, Thm 3.3 with i = 0), sampled exactly by
  ``dpch_partition_select`` (dpch/partition_selection.py has the construction and the proof that
  the released count is covered too).
- ``gaussian`` (Google differential-privacy, "Delta for thresholding"; Wilson et al. 2020 with the
  Gaussian): discrete Gaussian noise σ on every count, calibrated as a vector with L2
  sensitivity √c to (ε, δ_noise) (dpch.plan.gaussian, CKS20 Thm 4 and Cor. 13), and T such that
  a count of 1 passes with probability <= δ_thr/c. The groups a unit creates or removes (count
  1 ↔ 0) are each (0, δ_thr/c)-DP, the others form the (ε, δ_noise)-DP Gaussian, and basic
  composition (Dwork & Roth Thm 3.16) gives (ε, δ_noise + δ_thr). δ_noise is chosen from a fixed
  grid of splits of δ.
- ``laplace`` (Korolova et al. 2009; Wilson et al. 2020, §3): discrete Laplace b = c/ε on every
  count and T such that a count of 1 passes with probability <= δ₁ = 1 − (1 − δ)^(1/c): each
  count is (1/b, δ₁)-DP, c of them compose to (ε, δ) (Kairouz et al. Thm 3.3, i = 0).

Choice (``selection="auto"``, the default): the rule with the smallest expected number of missed
units Σ_{n≥1} (1 − p(n)) at the query's (ε_sel, δ_sel, c), a function of the budget and the
contribution bounds only (never of the data). At c = 1 the optimal rule is never beaten (π is the
pointwise largest release probability); for larger c the Gaussian usually wins.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from fractions import Fraction

from .. import calibration as cal
from ..errors import InvalidParameter
from ..partition_selection import OPTIMAL_SOURCE, optimal_table, per_group_delta, per_group_epsilon
from .gaussian import vector_gaussian_sigma
from .options import SELECTION_RULES

LAPLACE_SOURCE = "Korolova et al. 2009; Wilson et al. 2020, PETS, §3 (Laplace threshold)"
GAUSSIAN_SOURCE = ("Gaussian threshold: CKS20 Thm 4 and Cor. 13 (noise, L2 = √c), threshold by a rigorous "
                   "discrete-Gaussian tail bound; Dwork & Roth Thm 3.16 (composition)")
#: δ_noise / δ_sel tried by the Gaussian rule (a fixed grid: the choice is data-independent).
GAUSSIAN_SPLITS = tuple(i / 10 for i in range(1, 10))


def selection_threshold(scale: float, delta_sel: float, new_groups: int) -> int:
    """T such that a group held by one unit passes ``noisy >= T`` with probability <= δ₁ for the
    kernel's discrete Laplace (dpch.plan's docstring, point 7)."""
    _r, tau = cal.kernel_noise_scale(scale, cal.LAPLACE_GRID_BITS, True)
    log_q = -1.0 / tau  # not log(exp(-1/τ)): q underflows to 0 at a large ε
    q = math.exp(log_q)
    delta1 = -math.expm1(math.log1p(-delta_sel) / new_groups)
    log_target = math.log(delta1)
    j = max(1, math.ceil(-tau * (log_target + math.log1p(q))))
    # guard against rounding: check j·ln q - ln(1+q) <= ln δ₁ with a margin
    while j * log_q - math.log1p(q) > log_target - 1e-12:
        j += 1
    return 1 + j


def selection_release_probability(scale: float, threshold: int, count: int = 1) -> float:
    """P[count + K >= threshold] for the kernel's discrete Laplace noise K (exact formula)."""
    _r, tau = cal.kernel_noise_scale(scale, cal.LAPLACE_GRID_BITS, True)
    q = math.exp(-1.0 / tau)
    j = threshold - count
    if j <= 0:
        return 1.0 - q ** (-j + 1) / (1 + q)
    return q ** j / (1 + q)


# ----------------------------------------------------------------------------------------------
# Discrete Gaussian tails
# ----------------------------------------------------------------------------------------------

def _q(z: float) -> float:
    """P[N(0, 1) > z]."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def dg_tail_upper(t: int, tau: float) -> float:
    """A rigorous upper bound of P[X >= t] for the discrete Gaussian X ~ N_Z(0, τ²) (t >= 1).
    Denominator: Σ_x e^(−x²/2τ²) >= τ√(2π) (Poisson summation: it is τ√(2π)·Σ_k e^(−2π²τ²k²)).
    Numerator: f(x) = e^(−x²/2τ²) is convex for x >= τ, so f(x) <= ∫_{x−1/2}^{x+1/2} f
    (Hermite–Hadamard) and Σ_{x>=t} f(x) <= τ√(2π)·Q((t − 1/2)/τ) when t − 1/2 >= τ; otherwise f is
    decreasing on [t, ∞) and Σ_{x>=t} f(x) <= f(t) + ∫_t^∞ f. A relative margin of 1e-9 covers
    the floating-point evaluation."""
    if t <= 0:
        return 1.0
    if t - 0.5 >= tau:
        p = _q((t - 0.5) / tau)
    else:
        p = math.exp(-t * t / (2.0 * tau * tau)) / (tau * math.sqrt(2.0 * math.pi)) + _q(t / tau)
    return min(1.0, p * (1.0 + 1e-9))


def _dg_pmf(tau: float) -> tuple[int, list[float]]:
    """(lo, pmf[lo..]) of N_Z(0, τ²) in floats (for scores only: never for a privacy bound)."""
    n = int(40.0 * tau) + 2
    w = [math.exp(-(x * x) / (2.0 * tau * tau)) for x in range(-n, n + 1)]
    z = math.fsum(w)
    return -n, [v / z for v in w]


#: Above this τ the scores use the continuous Gaussian (the discrete one differs by < 1e-100).
_EXACT_TAU = 50.0


def _dg_at_least(need: int, tau: float) -> float:
    """P[X >= need] for X ~ N_Z(0, τ²), in floats (scores and tests, not privacy bounds)."""
    if tau > _EXACT_TAU:
        return _q((need - 0.5) / tau)
    lo, pmf = _dg_pmf(tau)
    return math.fsum(p for i, p in enumerate(pmf) if lo + i >= need)


def _dg_shortfall(m: int, tau: float) -> float:
    """E[(m − X)_+] for X ~ N_Z(0, τ²), in floats: Σ_{n≥1} P[n + X < m + 1], the expected misses
    of a threshold m + 1."""
    if tau > _EXACT_TAU:
        x = (m + 0.5) / tau  # continuity correction
        return (m + 0.5) * (1.0 - _q(x)) + tau * math.exp(-x * x / 2.0) / math.sqrt(2.0 * math.pi)
    lo, pmf = _dg_pmf(tau)
    return math.fsum(p * (m - (lo + i)) for i, p in enumerate(pmf) if lo + i < m)


# ----------------------------------------------------------------------------------------------
# The optimal rule as a noise mechanism (what Quantity.mechanism_object returns for it)
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class OptimalSelectionNoise:
    """``dpch_partition_select(n, ε₀, δ₀, t)``: the released count n + Z of the optimal rule at
    (ε₀, δ₀) per group (dpch/partition_selection.py); the group is released iff it is >= t."""

    epsilon: float
    delta: float

    udf_name = "dpch_partition_select"

    @property
    def table(self):
        return optimal_table(self.epsilon, self.delta)

    def sql(self, value_sql: str) -> str:
        """The threshold t is passed too: the UDF program fails unless its own table has the same t
        (a controller and a UDF program of different versions must not release at another T)."""
        return f"{self.udf_name}({value_sql}, {self.epsilon!r}, {self.delta!r}, {self.table.offset})"

    def variance(self) -> float:
        return self.table.noise_variance()

    def ci_halfwidth(self, level: float = 0.95) -> float:
        """h with P[|released − n| <= h] >= level, from the exact law of the noise."""
        return float(self.table.noise_halfwidth(cal.check_level(level)))


# ----------------------------------------------------------------------------------------------
# Rules
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SelectionRule:
    """One rule at (epsilon, delta) for groups of which one unit moves at most ``coords``."""

    rule: str  # "optimal" | "gaussian" | "laplace"
    epsilon: float
    delta: float
    coords: int
    threshold: int  # release iff the noisy count >= threshold
    scale: float  # noise scale in counts: Laplace b, Gaussian σ, optimal: the noise's std
    group_epsilon: float  # ε₀ per group (optimal), 1/b (laplace), ε (gaussian, jointly)
    group_delta: float  # optimal: δ₀ per group; laplace/gaussian: bound on P[a count of 1 passes]
    noise_delta: float = 0.0  # gaussian: δ of the noise part
    expected_misses: float = 0.0  # Σ_{n≥1} (1 − p(n)), the score of the choice
    source: str = ""
    scores: dict = field(default_factory=dict)  # every rule considered -> its score (explain)

    @property
    def mechanism(self) -> str:
        """The noisy count's mechanism name (Quantity.mechanism): "optimal_selection" (the optimal
        rule's noise), "gaussian" or "laplace"."""
        return "optimal_selection" if self.rule == "optimal" else self.rule

    def noise(self):
        if self.rule == "optimal":
            return OptimalSelectionNoise(self.group_epsilon, self.group_delta)
        return None  # Laplace/Gaussian: the quantity's own LaplaceMechanism/GaussianMechanism

    def release_probability(self, count: int) -> float:
        """P[a group of ``count`` distinct units is released] (exact for optimal and laplace; the
        Gaussian's is summed in floating point)."""
        if count <= 0:
            return 0.0
        if self.rule == "optimal":
            return float(optimal_table(self.group_epsilon, self.group_delta).release_probability(count))
        if self.rule == "laplace":
            return selection_release_probability(self.scale, self.threshold, count)
        _r, tau = cal.kernel_noise_scale(self.scale, cal.GAUSSIAN_GRID_BITS, True)
        return _dg_at_least(self.threshold - count, tau)

    def describe(self) -> str:
        if self.rule == "optimal":
            return (f"optimal rule (Desfontaines et al. 2022, Thm 1) at ε₀={self.group_epsilon:.6g}, "
                    f"δ₀={self.group_delta:.3g} per group, noisy count n+Z (std {self.scale:.4g}) >= {self.threshold}")
        if self.rule == "gaussian":
            return (f"Gaussian threshold: σ={self.scale:.6g} (L2 √{self.coords}, δ_noise={self.noise_delta:.3g}), "
                    f"noisy count >= {self.threshold} (a count of 1 passes with p <= {self.group_delta:.3g})")
        return (f"Laplace threshold: b={self.scale:.6g}, noisy count >= {self.threshold} "
                f"(a count of 1 passes with p <= {self.group_delta:.3g})")


def optimal_rule(epsilon: float, delta: float, coords: int) -> SelectionRule:
    """The optimal rule at the per-group (ε₀, δ₀); ValueError when it cannot be offered."""
    e0 = per_group_epsilon(epsilon, coords)
    d0 = per_group_delta(delta, coords)
    table = optimal_table(e0, d0)
    return SelectionRule(rule="optimal", epsilon=epsilon, delta=delta, coords=coords, threshold=table.offset,
                         scale=math.sqrt(table.noise_variance()), group_epsilon=e0, group_delta=d0,
                         expected_misses=table.expected_misses(), source=OPTIMAL_SOURCE)


def laplace_rule(epsilon: float, delta: float, coords: int) -> SelectionRule:
    """The Laplace threshold (the rule DPCH used before issue 15; b = c/ε, δ₁ per created group)."""
    b = cal.laplace_scale(float(coords), epsilon)
    t = selection_threshold(b, delta, coords)
    _r, tau = cal.kernel_noise_scale(b, cal.LAPLACE_GRID_BITS, True)
    q = math.exp(-1.0 / tau)
    # E[(T − 1 − K)_+] for the two-sided geometric K: (T − 1) + q^T/(1 − q²)
    misses = (t - 1) + (q ** t / (1.0 - q * q) if q < 1.0 else math.inf)
    return SelectionRule(rule="laplace", epsilon=epsilon, delta=delta, coords=coords, threshold=t, scale=b,
                         group_epsilon=1.0 / b, group_delta=selection_release_probability(b, t, 1),
                         expected_misses=misses, source=LAPLACE_SOURCE)


def _gaussian_at(epsilon: float, delta: float, coords: int, frac: float) -> SelectionRule | None:
    d_noise = delta * frac
    d_thr = delta - d_noise
    while Fraction(d_noise) + Fraction(d_thr) > Fraction(delta):
        d_thr = math.nextafter(d_thr, 0.0)
    target = d_thr / coords
    while Fraction(target) * coords > Fraction(d_thr):
        target = math.nextafter(target, 0.0)
    try:
        sigma = vector_gaussian_sigma(math.sqrt(coords), epsilon, d_noise, coords)
    except InvalidParameter:
        return None
    r, tau = cal.kernel_noise_scale(sigma, cal.GAUSSIAN_GRID_BITS, True)
    if r != 1.0 or tau > 1e5:  # the threshold analysis is for the integer path without a grid
        return None
    z = cal._normal_quantile_upper(target)
    t = max(1, math.floor(tau * z) - 2)
    while dg_tail_upper(t, tau) > target:
        t += 1
    threshold = 1 + t
    misses = _dg_shortfall(threshold - 1, tau)
    return SelectionRule(rule="gaussian", epsilon=epsilon, delta=delta, coords=coords, threshold=threshold,
                         scale=sigma, group_epsilon=epsilon, group_delta=dg_tail_upper(t, tau), noise_delta=d_noise,
                         expected_misses=misses, source=GAUSSIAN_SOURCE)


def gaussian_rule(epsilon: float, delta: float, coords: int) -> SelectionRule | None:
    """The Gaussian threshold with the best δ split of GAUSSIAN_SPLITS (None if σ would need the
    kernel's coarse grid)."""
    best = None
    for frac in GAUSSIAN_SPLITS:
        rule = _gaussian_at(epsilon, delta, coords, frac)
        if rule is not None and (best is None or rule.expected_misses < best.expected_misses):
            best = rule
    return best


@functools.lru_cache(maxsize=1024)
def choose_selection(epsilon: float, delta: float, coords: int, preference: str = "auto") -> SelectionRule:
    """The rule for a query's partition selection at (ε_sel, δ_sel) with c = ``coords`` (module
    docstring). ``preference``: "auto" (the smallest expected misses) or a rule name. Raises
    InvalidParameter if a named rule cannot be used at these parameters (before any charge)."""
    if preference not in SELECTION_RULES:
        raise InvalidParameter(f"selection must be one of {', '.join(SELECTION_RULES)}")
    candidates: dict[str, SelectionRule] = {}
    if preference in ("auto", "optimal"):
        try:
            candidates["optimal"] = optimal_rule(epsilon, delta, coords)
        except ValueError as exc:
            if preference == "optimal":
                raise InvalidParameter(f"selection='optimal': {exc}") from None
    if preference == "gaussian" or (preference == "auto" and coords > 1):
        g = gaussian_rule(epsilon, delta, coords)
        if g is not None:
            candidates["gaussian"] = g
        elif preference == "gaussian":
            raise InvalidParameter("selection='gaussian': epsilon and delta are too small for the Gaussian "
                                   "threshold (sigma above 1e5)")
    if preference in ("auto", "laplace"):
        candidates["laplace"] = laplace_rule(epsilon, delta, coords)
    order = ("optimal", "laplace", "gaussian")  # tie-break
    best = min(candidates.values(), key=lambda r: (r.expected_misses, order.index(r.rule)))
    scores = {name: r.expected_misses for name, r in candidates.items()}
    return SelectionRule(**{**best.__dict__, "scores": scores})
