"""Block-DP I and II (biswal_thesis_dp_foundations.md §5.4), corrected where the thesis is unsound;
each mechanism's privacy relation as code (docs/NOISE.md, "Block-DP").

**Block-DP I** (Alg. 5.4.1, Thm 5.4.2): clip the values to [lo, hi] = [0, Λ] shifted, cut the
range into m value blocks B_i of width w = Λ/m, compute an in-block statistic f(x_{I_i}) (mean or
median of the rows whose value falls in B_i) for every block, add Laplace noise to each, release
h = the average of the m noisy values (post-processing, Lemma 4.5.4).

Corrections (each checked by tests/test_block_dp.py on D/D′ by brute force):

1. *Sensitivity of a block statistic.* Thm 5.4.2 needs a data-independent Δf_i. The statistic of
   block i is clamped into the block's own interval [e_i, e_{i+1}] (an empty block releases the
   fixed in-block default, its midpoint), so on any two datasets it moves by at most the block
   width w_i = e_{i+1} − e_i: Δf_i = w_i for the mean and the median alike. Example 5.4.4's
   Δf_i = Λ/(m·N_i) for the mean is a *local* sensitivity (it depends on N_i, the rows in the
   block); Thm 5.4.3's δ = e^{ε/2}·e^{−ε/(2β)} is not a valid bound for it: (5.21) must hold for
   every database, and a block with N_i = 1 forces β ≥ ln(n/m), so no usable β exists; the proof
   also never produces a δ (it bounds the density ratio by e^{(ε/2)e^β}). We do not implement
   Thm 5.4.3; the mean uses Δf_i = w_i (Thm 5.4.2 with the block's global sensitivity, step 6).
2. *Neighbours.* The proof of Thm 5.4.2 says one neighbouring change touches one block (parallel
   composition, Lemma 4.5.14). Under add/remove of one row that holds; under *substitution* the
   replaced row may leave block i for block j: two blocks change. With user-level privacy a unit
   keeps at most M rows (max_rows_per_unit), which may fall in up to min(M, m) different value
   blocks (min(2M, m) under substitution). The number of blocks one neighbouring change can touch
   is ``blocks_touched``; each touched block costs (w_i + r)/b (Laplace on the grid r, the paper
   Thm 1 with the grid term of docs/NOISE.md), untouched blocks cost nothing. So the release is
   ε-DP with ε = blocks_touched·(w + r)/b (w the largest block width), and the calibration is
   b = laplace_scale(w, ε/blocks_touched).

**Block-DP II** (Alg. 5.4.6 after Smith's subsample-and-aggregate, Thm 5.4.7): split the *units*
into m disjoint blocks by a keyed, salted hash of the privacy unit (every row of a unit lands in
one block: no per-unit row bound is needed), compute the statistic per block clamped to the
parameter range [lo, hi] (diam Θ = Λ0 = hi − lo; an empty block gives the midpoint), release
(1/m)·Σ_i f_i + Lap(b). Thm 5.4.7: one unit changes one block, so Δg = Λ0/m, ε = (Δg + r)/b.
Corrections: the thesis's equal block sizes |I_1| = … = |I_m| are a function of n (impossible
under add/remove: n changes); hashing makes the partition a function of each unit alone. Under
substitution the replaced unit may hash to another block: Δg = 2Λ0/m. The Float64 average in
ClickHouse adds a rounding term (``FLOAT_TERM``) to Δg.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

from dpch import calibration as cal
from dpch.cost import MechanismCost
from dpch.errors import InvalidParameter
from dpch.mechanisms.base import PrivacyLoss, _up
from dpch.mechanisms.laplace import LaplaceMechanism

STATISTICS = ("mean", "median")
NEIGHBOURS = ("add_remove", "substitute")
MAX_BLOCKS = 4096
#: relative error of one Float64 operation (unit round-off 2^-53, doubled for safety)
_U = 2.0 ** -52


def _check_common(lo, hi, blocks, neighbour, statistic) -> tuple[float, float, int]:
    lo_f, hi_f = cal._real(lo, "lo"), cal._real(hi, "hi")
    if not (math.isfinite(lo_f) and math.isfinite(hi_f) and lo_f < hi_f) or max(abs(lo_f), abs(hi_f)) > 1e298:
        raise InvalidParameter("lo, hi: the value bounds must be finite with lo < hi and |lo|, |hi| <= 1e298")
    if isinstance(blocks, bool) or not isinstance(blocks, int) or not 1 <= blocks <= MAX_BLOCKS:
        raise InvalidParameter(f"blocks must be an integer in [1, {MAX_BLOCKS}]")
    if neighbour not in NEIGHBOURS:
        raise InvalidParameter(f"neighbour must be one of {', '.join(NEIGHBOURS)}")
    if statistic not in STATISTICS:
        raise InvalidParameter(f"statistic must be one of {', '.join(STATISTICS)}")
    return lo_f, hi_f, blocks


def _check_max_rows(max_rows) -> int:
    if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
        raise InvalidParameter("max_rows (max_rows_per_unit) must be an integer >= 1")
    return max_rows


def block_edges(lo: float, hi: float, blocks: int) -> tuple[float, ...]:
    """The m + 1 block edges e_0 = lo < … < e_m = hi (Alg. 5.4.1 step 2), as the floats the SQL
    uses: block i is [e_i, e_{i+1}]."""
    w = (Fraction(hi) - Fraction(lo)) / blocks
    inner = [float(Fraction(lo) + i * w) for i in range(1, blocks)]
    return (float(lo), *inner, float(hi))


def max_block_width(edges: tuple[float, ...]) -> float:
    """max_i (e_{i+1} − e_i), rounded up: the sensitivity of one clamped block statistic."""
    return _up(max(Fraction(b) - Fraction(a) for a, b in zip(edges, edges[1:])))


def blocks_touched(blocks: int, max_rows: int, neighbour: str) -> int:
    """How many value blocks one neighbouring change can alter (correction 2 above): a unit keeps
    at most M rows, each in one block; substitution removes M rows and adds M others."""
    rows = max_rows * (2 if neighbour == "substitute" else 1)
    return min(rows, blocks)


@dataclass(frozen=True)
class BlockDP1Mechanism:
    """Block-DP I: per-value-block Laplace of scale ``scale`` on m clamped block statistics, then
    their average. Input: value bounds, m, M (max rows per unit; 1 at row level), the neighbour
    relation. Output measure: pure DP. Privacy relation (module docstring, corrections 1-2):
    ε = blocks_touched · (w + r)/b."""

    lo: float
    hi: float
    blocks: int
    max_rows: int
    neighbour: str
    statistic: str
    scale: float

    def __post_init__(self) -> None:
        _check_common(self.lo, self.hi, self.blocks, self.neighbour, self.statistic)
        _check_max_rows(self.max_rows)
        LaplaceMechanism(self.scale)  # validates the scale and its grid

    @classmethod
    def calibrated(cls, lo: float, hi: float, blocks: int, max_rows: int, neighbour: str, statistic: str,
                   epsilon: float) -> "BlockDP1Mechanism":
        """b = laplace_scale(w, ε / blocks_touched): each touched block costs ≤ ε/blocks_touched."""
        lo_f, hi_f, m = _check_common(lo, hi, blocks, neighbour, statistic)
        e = cal.check_epsilon(epsilon)
        w = max_block_width(block_edges(lo_f, hi_f, m))
        t = blocks_touched(m, _check_max_rows(max_rows), neighbour)
        return cls(lo_f, hi_f, m, max_rows, neighbour, statistic, cal.laplace_scale(w, e / t))

    @property
    def edges(self) -> tuple[float, ...]:
        return block_edges(self.lo, self.hi, self.blocks)

    @property
    def width(self) -> float:
        return max_block_width(self.edges)

    @property
    def touched(self) -> int:
        return blocks_touched(self.blocks, self.max_rows, self.neighbour)

    @property
    def laplace(self) -> LaplaceMechanism:
        return LaplaceMechanism(self.scale)

    @property
    def sensitivity(self) -> float:
        """L1 sensitivity of the vector of m block statistics: blocks_touched · w."""
        return _up(Fraction(self.touched) * Fraction(self.width))

    def privacy_function(self) -> PrivacyLoss:
        """ε = blocks_touched · (w + r)/b (rounded up)."""
        per = Fraction(self.width) + Fraction(self.laplace.grid_term)
        return PrivacyLoss(epsilon=_up(self.touched * per / Fraction(self.scale)), delta=0.0, rho=None)

    def privacy_relation(self, epsilon: float) -> bool:
        """True iff ε-DP (exact rational comparison)."""
        e = cal.check_epsilon(epsilon)
        per = Fraction(self.width) + Fraction(self.laplace.grid_term)
        return self.touched * per <= Fraction(e) * Fraction(self.scale)

    @property
    def variance(self) -> float:
        """Variance of the released average's noise: Var(Lap) / m (independent per-block draws)."""
        return self.laplace.variance / self.blocks

    def cost(self, epsilon: float, label: str) -> MechanismCost:
        """Ledger entry: one Laplace release of L1 sensitivity touched·(w + r) at scale b."""
        if not self.privacy_relation(epsilon):
            raise InvalidParameter("epsilon: the Block-DP I mechanism does not satisfy it")
        sens = _up(self.touched * (Fraction(self.width) + Fraction(self.laplace.grid_term)))
        return MechanismCost(kind="laplace", sensitivity=sens, scale=self.scale, epsilon=float(epsilon),
                             delta=0.0, rho=None, label=label)


@dataclass(frozen=True)
class BlockDP2Mechanism:
    """Block-DP II: m unit-hash blocks, statistic per block clamped to [lo, hi], average, one
    Laplace of scale ``scale``. Output measure: pure DP. Privacy relation (Thm 5.4.7 corrected):
    ε = (Δg + r)/b with Δg = c·(hi − lo)/m + FLOAT_TERM, c = 1 (add/remove) or 2 (substitution)."""

    lo: float
    hi: float
    blocks: int
    neighbour: str
    statistic: str
    scale: float

    def __post_init__(self) -> None:
        _check_common(self.lo, self.hi, self.blocks, self.neighbour, self.statistic)
        LaplaceMechanism(self.scale)

    @staticmethod
    def average_sensitivity(lo: float, hi: float, blocks: int, neighbour: str) -> float:
        """Δg = c·Λ0/m plus the Float64 rounding of the sum of m values in [0, Λ0] (at most
        (m−1)·u·m·Λ0 each side, Higham Thm 4.3 with u = 2^-53; we use 2·m·2^-52·Λ0) and of adding
        lo back (2·2^-52·max(|lo|, |hi|)), rounded up."""
        lam = Fraction(hi) - Fraction(lo)
        c = 2 if neighbour == "substitute" else 1
        term = 2 * blocks * Fraction(_U) * lam + 2 * Fraction(_U) * max(abs(Fraction(lo)), abs(Fraction(hi)))
        return _up(c * lam / blocks + term)

    @classmethod
    def calibrated(cls, lo: float, hi: float, blocks: int, neighbour: str, statistic: str, epsilon: float
                   ) -> "BlockDP2Mechanism":
        lo_f, hi_f, m = _check_common(lo, hi, blocks, neighbour, statistic)
        e = cal.check_epsilon(epsilon)
        return cls(lo_f, hi_f, m, neighbour, statistic,
                   cal.laplace_scale(cls.average_sensitivity(lo_f, hi_f, m, neighbour), e))

    @property
    def laplace(self) -> LaplaceMechanism:
        return LaplaceMechanism(self.scale)

    @property
    def sensitivity(self) -> float:
        return self.average_sensitivity(self.lo, self.hi, self.blocks, self.neighbour)

    def privacy_function(self) -> PrivacyLoss:
        return self.laplace.privacy_function(self.sensitivity)

    def privacy_relation(self, epsilon: float) -> bool:
        return self.laplace.privacy_relation(self.sensitivity, epsilon)

    @property
    def variance(self) -> float:
        return self.laplace.variance

    def cost(self, epsilon: float, label: str) -> MechanismCost:
        return self.laplace.cost(self.sensitivity, epsilon, label=label)


def gamma_difference_tail(s: float, k: int) -> float:
    """P(|G − G′| > s) for G, G′ i.i.d. Gamma(k, 1): the law of a sum of k standard Laplace
    variables (each is the difference of two Exp(1)). Numerical integration (scipy) of
    2·∫ f_k(y)·P(G > s + y) dy over the window where f_k has mass > 1e-300.

    The density and the survival function are scipy.stats.gamma's own formulas (xlogy(k − 1, y) −
    y − ln Γ(k); the regularised upper incomplete gamma) called through scipy.special: the same
    numbers (within 3e-16 relative, checked) at 1/50 of the time of the frozen distribution's
    per-point argument checks (early stopping computes this for every step's interval)."""
    from scipy import integrate, special

    if s <= 0:
        return 1.0
    lo_y, hi_y = special.gammaincinv(k, 1e-15), special.gammainccinv(k, 1e-15)  # gamma(k).ppf / .isf
    log_norm = special.gammaln(k)

    def integrand(y: float) -> float:
        return math.exp(special.xlogy(k - 1, y) - y - log_norm) * special.gammaincc(k, s + y)

    val, _ = integrate.quad(integrand, lo_y, hi_y, points=[float(k)], limit=200, epsabs=1e-16, epsrel=1e-10)
    return min(1.0, 2.0 * (val + 1e-15))  # + the mass left outside the window


@lru_cache(maxsize=4096)
def laplace_sum_quantile(k: int, alpha: float) -> float:
    """The least s (up to a 1e-9 relative margin, rounded up) with P(|Σ_{j≤k} L_j| > s) ≤ α for k
    i.i.d. standard Laplace L_j (``gamma_difference_tail``). k = 1: ln(1/α) exactly."""
    from scipy import optimize

    if k == 1:
        return math.log(1.0 / alpha)
    hi = math.log(2.0 / alpha) + 2.0 * math.sqrt(2.0 * k * math.log(2.0 / alpha)) + 10.0
    while gamma_difference_tail(hi, k) > alpha:
        hi *= 2.0
    s = optimize.brentq(lambda x: gamma_difference_tail(x, k) - alpha, 0.0, hi, xtol=1e-12)
    s *= 1.0 + 1e-9
    while gamma_difference_tail(s, k) > alpha:  # never understate the quantile
        s *= 1.0 + 1e-6
    return s


def dlap_mean_halfwidth(mech: LaplaceMechanism, k: int, level: float) -> float:
    """Half-width h with P[|mean of k releases − mean of the k true values| ≤ h] ≥ level, for k
    independent draws of ``mech`` (the kernel's discrete Laplace, scale τ grid units of r).
    A discrete Laplace of scale τ is ⌊τE⌋ − ⌊τE′⌋ for E, E′ ~ Exp(1) (P(⌊τE⌋ ≥ n) = e^{−n/τ}, a
    geometric law; the difference of two is the discrete Laplace, CKS20 §2), which is within 1 of
    τ(E − E′); so |Σ K_j| ≤ τ·|Σ L_j| + k and h = r·(τ·Q_k(1 − level) + k)/k, plus r/2 for rounding
    each value to the grid (0 for Int64 values on a grid of 1)."""
    lv = cal.check_level(level)
    q = laplace_sum_quantile(int(k), 1.0 - lv)
    r = mech.granularity
    return r * (mech.noise_scale_units * q + k) / k + mech.grid_term / 2.0
