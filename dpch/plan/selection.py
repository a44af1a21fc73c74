"""Private partition selection (dpch.plan's docstring, point 7; docs/CONTROLLER.md, "Partition
selection"): the four release rules, their thresholds and release probabilities, and the
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

The fourth rule does not threshold a count:

- ``weighted_gaussian`` (Gopi, Gulhane, Kulkarni, Shen, Shokouhi & Yekhanin, "Differentially
  Private Set Union", ICML 2020, the weighted Gaussian; only on the user-level k > 1 path, where
  each unit's kept groups are known). A unit that keeps j <= k groups (which ones and how many is
  a function of its own rows only) gives each of them the weight w_j = the largest integer with
  j·w_j² <= S² (``unit_weight``; S = 2^s fixed point, s <= 16 the largest keeping σ on the kernel's
  integer path), so its weight vector has L2 norm <= S exactly. A group's statistic is the Int64
  sum of its units' weights; it gets discrete Gaussian noise σ (``dpch_gaussian_int``) calibrated
  as a vector with L2 sensitivity S under add_remove, √2·S under substitute
  (‖w_u − w_u′‖² <= ‖w_u‖² + ‖w_u′‖² for non-negative vectors), to (ε, δ_noise) (CKS20 Thm 4 and
  Cor. 13, dpch.plan.gaussian), and the group is released iff the noisy sum is >= ρ, where
  ρ = max_{t=1..k} (w_t + m_t) and m_t is the least m with P[X >= m] <= δ_t for the kernel's
  X ~ N_Z(0, τ²) (rigorous bound ``dg_tail_upper``), δ_t the largest float with
  1 − (1 − δ_t)^t <= δ_thr (``per_group_delta``, checked exactly).
  Proof. Let D, D′ be neighbours and u the unit added or removed (u and u′ under substitute). The
  groups present in both datasets (common) and those present in one only (new: held by u alone,
  at most t <= j_u of them, each of weight w_(j_u); under substitute also u′'s) get independent
  noise. (i) Common groups: their noisy sums are the discrete Gaussian vector shifted by u's
  weights there, an integer vector of L2 norm <= S (√2·S), so they are (ε, δ_noise)-DP (CKS20) and
  the thresholding is post-processing. No other unit's weights change: they depend on its own rows
  only (the non-adaptive policy of Gopi et al.). (ii) New groups: where they exist, one of them
  passes with probability 1 − (1 − P[w_j + X >= ρ])^t <= 1 − (1 − δ_j)^j <= δ_thr (j = j_u, since
  ρ >= w_j + m_j); on the other side they do not exist. So this part outputs nothing with
  probability >= 1 − δ_thr on both sides, which makes it (0, δ_thr)-indistinguishable (for an
  event containing "nothing" the other side has probability >= 1 − δ_thr; for one that does not,
  this side has <= δ_thr); under substitute each side holds one unit's new groups, still
  <= δ_thr. (iii) Basic composition of the two independent parts (Dwork & Roth Thm 3.16) gives
  (ε, δ_noise + δ_thr) with δ_noise + δ_thr <= δ_sel (δ split from the same grid as the Gaussian).
  The noisy weighted sum is not a count: it decides the release only and is never an aggregate's
  value (COUNT(DISTINCT unit) then has its own quantity). When every unit holds exactly k groups
  it is the Gaussian threshold scaled by w_k ≈ S/√k, except that ρ is the max over t (t = k unless
  σ is small against S, i.e. at large ε) and δ_thr is accounted per unit instead of per group;
  units with fewer groups weigh more (up to √k times), so on skewed data more groups pass.

Choice (``selection="auto"``, the default): the rule with the smallest expected number of missed
units Σ_{n≥1} (1 − p(n)) at the query's (ε_sel, δ_sel, c), a function of the budget and the
contribution bounds only (never of the data). At c = 1 the optimal rule is never beaten (π is the
pointwise largest release probability); for larger c the Gaussian usually wins. The weighted
Gaussian's release probability depends on the units' j_u, which is data: its score is taken at
the worst case for it, every unit holding k groups (p(n) = P[n·w_k + X >= ρ]), where it is the
Gaussian threshold up to ρ's max over t. That score bounds its expected misses on any data (a
group of n units has a statistic >= n·w_k, w_j decreasing in j), while the other rules' release
probabilities do not depend on j_u: auto picks it when it is at least as good as every other rule
even where every unit fills its k groups, and it only gains where units hold fewer. It is a candidate only on the
k > 1 user-level path when no output reuses the selection's count (``weighted_groups`` > 0): an
output COUNT(DISTINCT unit) would otherwise need a budget share of its own.
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
WEIGHTED_SOURCE = ("Weighted Gaussian: Gopi, Gulhane, Kulkarni, Shen, Shokouhi & Yekhanin, Differentially Private "
                   "Set Union, ICML 2020; CKS20 Thm 4 and Cor. 13 (noise, L2 = S per unit), threshold by a rigorous "
                   "discrete-Gaussian tail bound per unit; Dwork & Roth Thm 3.16 (composition)")
#: The weights' fixed point S = 2^s: the largest s in [WEIGHT_MIN_BITS, WEIGHT_MAX_BITS] whose σ
#: (S·σ₁) stays on the kernel's integer path (σ <= 2^20, no grid); below WEIGHT_MIN_BITS the rule
#: is not offered.
WEIGHT_MAX_BITS = 16
WEIGHT_MIN_BITS = 6
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

    rule: str  # "optimal" | "gaussian" | "laplace" | "weighted_gaussian"
    epsilon: float
    delta: float
    coords: int
    threshold: int  # release iff the noisy count (weighted_gaussian: noisy weight sum, units) >= threshold
    scale: float  # noise scale in counts: Laplace b, Gaussian σ, optimal: the noise's std (weighted: σ in units)
    group_epsilon: float  # ε₀ per group (optimal), 1/b (laplace), ε (gaussian, jointly)
    group_delta: float  # optimal: δ₀ per group; laplace/gaussian: bound on P[a count of 1 passes];
    # weighted_gaussian: bound on P[one of a lonely unit's groups passes], the worst t = 1..k
    noise_delta: float = 0.0  # gaussian: δ of the noise part
    expected_misses: float = 0.0  # Σ_{n≥1} (1 − p(n)), the score of the choice
    source: str = ""
    scores: dict = field(default_factory=dict)  # every rule considered -> its score (explain)
    # weighted_gaussian: S (a unit in j groups adds unit_weight(j, S) to each), k, and the L2
    # sensitivity of the weight sums in units (S, or √2·S under substitute)
    weight_scale: int = 0
    groups_per_unit: int = 0
    sensitivity: float = 0.0

    @property
    def mechanism(self) -> str:
        """The noisy count's mechanism name (Quantity.mechanism): "optimal_selection" (the optimal
        rule's noise), "gaussian" (also the weighted rule's noise) or "laplace"."""
        if self.rule == "weighted_gaussian":
            return "gaussian"
        return "optimal_selection" if self.rule == "optimal" else self.rule

    @property
    def statistic(self) -> str:
        """What the noisy value that is thresholded is (explain, metadata)."""
        return "weighted units" if self.rule == "weighted_gaussian" else "distinct units"

    def unit_weight(self, groups: int) -> int:
        """weighted_gaussian: the weight a unit in ``groups`` groups adds to each of them."""
        return unit_weight(groups, self.weight_scale)

    def release_probability_weight(self, weight: int) -> float:
        """weighted_gaussian: P[a group whose units' weights sum to ``weight`` is released] (summed
        in floating point)."""
        if weight <= 0:
            return 0.0
        _r, tau = cal.kernel_noise_scale(self.scale, cal.GAUSSIAN_GRID_BITS, True)
        return _dg_at_least(self.threshold - weight, tau)

    def noise(self):
        if self.rule == "optimal":
            return OptimalSelectionNoise(self.group_epsilon, self.group_delta)
        return None  # Laplace/Gaussian: the quantity's own LaplaceMechanism/GaussianMechanism

    def release_probability(self, count: int) -> float:
        """P[a group of ``count`` distinct units is released] (exact for optimal and laplace; the
        Gaussian's is summed in floating point). weighted_gaussian: when each of them holds k groups
        (weight w_k each; fewer groups weigh more: ``release_probability_weight``)."""
        if count <= 0:
            return 0.0
        if self.rule == "weighted_gaussian":
            # a data-independent proxy: each of the units holds k groups (its worst case, the score's)
            return self.release_probability_weight(count * self.unit_weight(self.groups_per_unit))
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
        if self.rule == "weighted_gaussian":
            s = self.weight_scale
            return (f"weighted Gaussian (Gopi et al. 2020): a unit in j <= {self.groups_per_unit} groups adds "
                    f"floor({s}/√j) to each (S={s}), σ={self.scale:.6g} (L2 {self.sensitivity:.6g}, "
                    f"δ_noise={self.noise_delta:.3g}), noisy weight sum >= {self.threshold} (≈ {self.threshold / s:.4g} "
                    f"units that are in one group each; a unit alone in its groups has one released with "
                    f"p <= {self.group_delta:.3g})")
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


# ----------------------------------------------------------------------------------------------
# The weighted Gaussian (Gopi et al. 2020; module docstring)
# ----------------------------------------------------------------------------------------------

def unit_weight(groups: int, scale: int) -> int:
    """w_j: the largest integer m with j·m² <= S² (j = ``groups`` >= 1, S = ``scale``), exactly."""
    return math.isqrt(scale * scale // groups)


def unit_weight_sql(groups_sql: str, scale: int) -> str:
    """``unit_weight`` in ClickHouse SQL, exactly: m₀ = ⌊√(S²/j)⌋ in Float64 is within 1 of the
    integer square root (S² <= 2^32, relative error ~1e-16), and the first of m₀ + 1, m₀, m₀ − 1
    with j·m² <= S² (Int64 arithmetic) is the largest such m. ``groups_sql`` is an integer >= 1
    (0 is mapped to 1: the expression is total)."""
    s2 = scale * scale
    j = f"toInt64(greatest({groups_sql}, 1))"
    m0 = f"toInt64(floor(sqrt({s2} / {j})))"
    return (f"arrayFirst(__dp_m -> {j} * __dp_m * __dp_m <= {s2}, "
            f"arrayMap(__dp_d -> {m0} + __dp_d, [1, 0, -1]))")


def _least_tail(target: float, tau: float) -> int:
    """The least m >= 1 with dg_tail_upper(m, τ) <= target (dg_tail_upper is non-increasing in m)."""
    z = cal._normal_quantile_upper(target)
    m = max(1, math.floor(tau * z) - 2)
    while m > 1 and dg_tail_upper(m - 1, tau) <= target:
        m -= 1
    while dg_tail_upper(m, tau) > target:
        m += 1
    return m


def weighted_threshold(scale: int, k: int, tau: float, d_thr: float) -> tuple[int, float]:
    """(ρ, p): ρ = max_{t=1..k} (w_t + m_t) with m_t the least m such that
    P[X >= m] <= δ_t, δ_t = per_group_delta(δ_thr, t) (so 1 − (1 − P[w_t + X >= ρ])^t <= δ_thr for
    every t, X ~ N_Z(0, τ²), by the rigorous bound dg_tail_upper); p: the largest of those
    probabilities' bounds over t (<= δ_thr; δ_thr itself when k > 4096). m_t is non-decreasing and
    w_t non-increasing in t, so on a range lo..hi every w_t + m_t <= w_lo + m_hi: ranges whose bound
    is already <= ρ are skipped (a dyadic search, O(log k) evaluations of m_t in practice)."""
    m_memo: dict[int, int] = {}

    def m(t: int) -> int:
        if t not in m_memo:
            m_memo[t] = _least_tail(per_group_delta(d_thr, t), tau)
        return m_memo[t]

    rho = unit_weight(k, scale) + m(k)
    stack = [(1, k)]
    while stack:
        lo, hi = stack.pop()
        bound = unit_weight(lo, scale) + m(hi)
        if bound <= rho:
            continue
        if lo == hi:  # the bound is w_t + m_t itself
            rho = bound
            continue
        mid = (lo + hi) // 2
        stack += [(mid + 1, hi), (lo, mid)]  # small t first: the heaviest weights raise ρ early
    if k > 4096:  # (reporting only) the bound the construction guarantees
        return rho, d_thr
    worst = 0.0
    for t in range(1, k + 1):
        p = dg_tail_upper(rho - unit_weight(t, scale), tau)
        worst = max(worst, -math.expm1(t * math.log1p(-p)) if p < 1 else 1.0)
    return rho, worst


def _weighted_misses(rho: int, w: int, tau: float) -> float:
    """Σ_{n≥1} P[n·w + X < ρ] (floating point; a score): summed term by term, or when that is long,
    by the midpoint rule (τ/w)·(yΦ(y) + φ(y)) at y = (ρ − ½ − w/2)/τ (error O((w/τ)²) per unit)."""
    if w <= 0:
        return math.inf
    n_max = math.ceil((rho + 12.0 * tau) / w)
    if n_max > 20_000 and w < tau:
        y = (rho - 0.5 - w / 2.0) / tau
        return (tau / w) * (y * (1.0 - _q(y)) + math.exp(-y * y / 2.0) / math.sqrt(2.0 * math.pi))
    return math.fsum(1.0 - _dg_at_least(rho - n * w, tau) for n in range(1, n_max + 1))


def _weighted_at(epsilon: float, delta: float, k: int, substitute: bool, frac: float,
                 max_bits: int) -> SelectionRule | None:
    d_noise = delta * frac
    d_thr = delta - d_noise
    while Fraction(d_noise) + Fraction(d_thr) > Fraction(delta):
        d_thr = math.nextafter(d_thr, 0.0)
    coords = 2 * k if substitute else k
    for bits in range(max_bits, WEIGHT_MIN_BITS - 1, -1):
        scale = 1 << bits
        l2 = scale * math.sqrt(2.0) if substitute else float(scale)
        try:
            sigma = vector_gaussian_sigma(l2, epsilon, d_noise, coords)
        except InvalidParameter:
            return None
        r, tau = cal.kernel_noise_scale(sigma, cal.GAUSSIAN_GRID_BITS, True)
        if r == 1.0:
            break
    else:
        return None
    rho, worst = weighted_threshold(scale, k, tau, d_thr)
    misses = _weighted_misses(rho, unit_weight(k, scale), tau)
    return SelectionRule(rule="weighted_gaussian", epsilon=epsilon, delta=delta, coords=coords, threshold=rho,
                         scale=sigma, group_epsilon=epsilon, group_delta=worst, noise_delta=d_noise,
                         expected_misses=misses, source=WEIGHTED_SOURCE, weight_scale=scale, groups_per_unit=k,
                         sensitivity=l2)


def weighted_rule(epsilon: float, delta: float, k: int, substitute: bool = False,
                  max_bits: int = WEIGHT_MAX_BITS) -> SelectionRule | None:
    """The weighted Gaussian for units in at most k groups, with the best δ split of
    GAUSSIAN_SPLITS by the worst-case score (every unit in k groups); None when σ would need the
    kernel's coarse grid even at S = 2^WEIGHT_MIN_BITS. ``max_bits`` (tests): the largest S."""
    best = None
    for frac in GAUSSIAN_SPLITS:
        rule = _weighted_at(epsilon, delta, k, substitute, frac, max_bits)
        if rule is not None and (best is None or rule.expected_misses < best.expected_misses):
            best = rule
    return best


@functools.lru_cache(maxsize=1024)
def choose_selection(epsilon: float, delta: float, coords: int, preference: str = "auto",
                     weighted_groups: int = 0) -> SelectionRule:
    """The rule for a query's partition selection at (ε_sel, δ_sel) with c = ``coords`` (module
    docstring). ``preference``: "auto" (the smallest expected misses) or a rule name.
    ``weighted_groups``: k when the weighted Gaussian may be used (the user-level k > 1 path, its
    statistic not reused by an output; c = k, or 2k under substitute), else 0. Raises
    InvalidParameter if a named rule cannot be used at these parameters (before any charge)."""
    if preference not in SELECTION_RULES:
        raise InvalidParameter(f"selection must be one of {', '.join(SELECTION_RULES)}")
    if preference == "weighted_gaussian" and weighted_groups < 2:
        raise InvalidParameter("selection='weighted_gaussian' needs units in up to k > 1 groups (a user-level "
                               "table with max_groups_contributed > 1)")
    candidates: dict[str, SelectionRule] = {}
    if weighted_groups > 1 and preference in ("auto", "weighted_gaussian"):
        if coords not in (weighted_groups, 2 * weighted_groups):
            raise ValueError("coords must be k or 2k for the weighted Gaussian")
        wg = weighted_rule(epsilon, delta, weighted_groups, coords == 2 * weighted_groups)
        if wg is not None:
            candidates["weighted_gaussian"] = wg
        elif preference == "weighted_gaussian":
            raise InvalidParameter("selection='weighted_gaussian': epsilon and delta are too small for the weighted "
                                   "Gaussian threshold (sigma above 2^20 even with weights in units of 2^-6)")
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
    order = ("optimal", "weighted_gaussian", "laplace", "gaussian")  # tie-break
    best = min(candidates.values(), key=lambda r: (r.expected_misses, order.index(r.rule)))
    scores = {name: r.expected_misses for name, r in candidates.items()}
    return SelectionRule(**{**best.__dict__, "scores": scores})
