"""The bounded Laplace mechanism (biswal_thesis_dp_foundations.md §5.5), with the corrected scale
that makes the truncated release really ε-DP (issue 16)."""
from __future__ import annotations

import functools
import importlib
import math
from dataclasses import dataclass
from fractions import Fraction

from dpch import calibration as cal
from dpch.cost import MechanismCost
from dpch.errors import InvalidParameter
from dpch.mechanisms.base import PrivacyLoss, _check_value_sql, _float_literal, _up
from dpch.mechanisms.intervals import _interval, _sampling_halfwidth


#: The bounded Laplace sampler draws K discrete Laplace candidates every time and releases the first
#: one inside the range; K is chosen so that all K miss with probability at most 2^-BL_FALLBACK_LOG2
#: (udf/dpch_kernel.h, dpch_bounded_dlap).
BL_FALLBACK_LOG2 = 64
#: The largest K the kernel accepts (a release costs K discrete Laplace draws).
BL_MAX_CANDIDATES = 1 << 16
#: |lo|/r and |hi|/r must stay below this (the kernel works in 128-bit grid units).
BL_MAX_UNITS = 2.0 ** 100


def _bl_log_f(j: int, n: int, tau: float) -> float:
    """log f(j) with f(j) = 1 + λ − λ^(j+1) − λ^(n−j+1), λ = e^(−1/τ), 0 <= j <= n: (1 − λ) times the
    normaliser Σ_{v=0..n} λ^|v−j| of the two-sided geometric centred at grid index j and cut to
    {0..n}. Written as (1 − λ^(j+1)) + λ(1 − λ^(n−j)), two non-negative terms: no cancellation."""
    a = -math.expm1(-(j + 1) / tau)
    b = math.exp(-1.0 / tau) * -math.expm1(-(n - j) / tau) if n > j else 0.0
    return math.log(a + b)


def bounded_grid_epsilon(d: int, n: int, t: int, s: int) -> float:
    """The exact pure-DP privacy loss of the bounded discrete Laplace on the grid {0..n}: the
    output v has P(v | j) ∝ λ^|v − j| on {0..n} (λ = e^(−s/t), scale t/s grid units), and the
    centres j, j' of neighbouring datasets differ by at most d grid units. Returns
    ``min(d, n)·s/t + log(f(min(d, n))/f(0))`` (f as in _bl_log_f), rounded up.

    Derivation (docs/NOISE.md, "Bounded Laplace"): the log ratio at output v is
    (|v − j'| − |v − j|)·s/t + log(f(j')/f(j)); its maximum over v is |j − j'|·s/t (v on j's far
    side; v = j is in the grid). f(j + 1) >= λ f(j) [f(j+1) − λf(j) = (1 − λ²)(1 − λ^(n−j)) >= 0],
    so the total is non-decreasing in |j − j'|: the worst pair is at distance min(d, n). f is
    concave (λ^j + λ^(n−j) is convex) and positive, so log f is concave and
    log f(j + d) − log f(j) is largest at j = 0. This is the grid version of the thesis's
    Thm 5.5.5 (ε >= Δ/b + log ΔC, ΔC = C_(l+Δ)/C_l): sums instead of integrals, and d counts the
    rounding of the value to the grid. tests/test_thesis_mechanisms.py checks it by brute force."""
    if n < 0 or d < 0:
        raise InvalidParameter("bounded Laplace: the grid needs n >= 0 and d >= 0")
    dd = min(int(d), int(n))
    if dd == 0:
        return 0.0
    tau = t / s
    shift = Fraction(dd * s, t)
    log_ratio = _bl_log_f(dd, n, tau) - _bl_log_f(0, n, tau)
    # float error of the two logs is below 1e-15 in absolute terms; the margin keeps it an upper bound
    return _up(shift) + max(log_ratio, 0.0) * (1.0 + 1e-12) + 1e-14


def _bl_acceptance(n: int, tau: float) -> float:
    """P(0 <= Z <= n) for Z discrete Laplace of scale τ: (1 − λ^(n+1))/(1 + λ), the least chance
    that one candidate lands in the range (the centre at an end of the grid)."""
    return -math.expm1(-(n + 1) / tau) / (1.0 + math.exp(-1.0 / tau))


def bl_candidates(n: int, tau: float) -> int:
    """K: the number of discrete Laplace candidates per release so that all K miss the range
    {0..n} with probability at most 2^-BL_FALLBACK_LOG2 whatever the centre:
    (1 − p_min)^K <= 2^-64, p_min = _bl_acceptance (lowered by 1e-12 relative for float error).
    Raises InvalidParameter when K would exceed BL_MAX_CANDIDATES (the range is too narrow for the
    scale)."""
    p = _bl_acceptance(n, tau) * (1.0 - 1e-12)
    if not p > 0.0:
        raise InvalidParameter("bounded Laplace: the output range is too narrow for the noise scale")
    if p >= 1.0:
        return 1
    k = math.ceil(BL_FALLBACK_LOG2 * math.log(2.0) / -math.log1p(-p) * (1.0 + 1e-12))
    if k > BL_MAX_CANDIDATES:
        raise InvalidParameter("bounded Laplace: the output range is too narrow for the noise scale "
                               "(hi - lo must be at least about 1.4e-3 times the scale)")
    return max(1, k)


def _bl_grid(scale: float, lo: float, hi: float) -> tuple[int, int, int, int, int]:
    """(k, t, p, Lo, Hi): the kernel's grid r = 2^k and scale t/2^p in grid units (the Laplace
    parameters of docs/NOISE.md for ``scale``), and the grid indices Lo = ceil(lo/r),
    Hi = floor(hi/r) of the output range (exact: lo, hi are floats, r a power of two)."""
    k, t, p = cal.release_params(scale, cal.LAPLACE_GRID_BITS, False)
    r = Fraction(2) ** k
    lo_u = Fraction(lo) / r
    hi_u = Fraction(hi) / r
    if abs(lo_u) >= BL_MAX_UNITS or abs(hi_u) >= BL_MAX_UNITS:
        raise InvalidParameter("bounded Laplace: lo and hi must be below 2^60 times the scale")
    Lo = math.ceil(lo_u)
    Hi = math.floor(hi_u)
    if Hi < Lo:
        raise InvalidParameter("bounded Laplace: hi - lo is smaller than the noise grid")
    return k, t, p, Lo, Hi


def bounded_laplace_candidates(scale: float, lo: float, hi: float) -> int:
    """K for ``dpch_bounded_laplace(value, scale, lo, hi)`` (the UDF program calls this): see
    bl_candidates. Raises InvalidParameter naming the problem."""
    b = cal._positive_finite(scale, "scale")
    a, c = cal.check_bounds(lo, hi, "lo, hi")
    k, t, p, Lo, Hi = _bl_grid(b, a, c)
    return bl_candidates(Hi - Lo, t / 2 ** p)


@dataclass(frozen=True)
class BoundedLaplaceMechanism:
    """``dpch_bounded_laplace(value, b, lo, hi)``: the bounded Laplace mechanism of the thesis
    (biswal_thesis_dp_foundations.md §5.5, Def. 5.5.3) on the kernel's grid. The value q is
    clamped to [lo, hi] and rounded to the grid r = grid(b, 40) (round half to even; then clamped
    to the grid indices Lo = ceil(lo/r) .. Hi = floor(hi/r)), and the output is r·v with
    P(v | centre c) ∝ e^(−|v − c|·s/t) on {Lo..Hi}: the discrete Laplace of docs/NOISE.md
    (scale t/s >= b/r grid units) conditioned on the range, renormalised on the finite grid.

    Input metric: the absolute difference of the (unclamped) value, Δ. Output measure: pure DP
    for the ideal conditioned sampler, ``privacy_function`` (exact on the grid, see
    bounded_grid_epsilon; the grid version of Thm 5.5.5), plus the δ of the constant-work
    sampler: it draws K candidates and releases the first in range, else the clamp of the last
    one; that happens with probability η <= 2^-64 (``fallback_probability``), which moves the
    output law by at most η in total variation and adds (1 + e^ε)·η to δ.

    Thm 5.5.5 with δ > 0 (b >= Δ/(ε − log ΔC − log(1 − δ))) is sound: a pure ε' = ε − log(1 − δ)
    mechanism is (ε, δ)-DP [if e^ε p' >= 1 − δ the bound e^ε p' + δ >= 1 is trivial, else
    e^ε' p' = e^ε p'/(1 − δ) <= e^ε p' + δ], so ``privacy_relation`` accepts the δ given beyond
    the sampler's own as that relaxation. With δ = 0 the calibration is the pure one,
    b >= Δ/(ε − log ΔC)."""

    scale: float
    lo: float
    hi: float

    input_metric = "AbsoluteDifference"
    output_measure = "ApproxDP"
    grid_bits = cal.LAPLACE_GRID_BITS

    def __post_init__(self) -> None:
        b = cal._positive_finite(self.scale, "scale")
        a, c = cal.check_bounds(self.lo, self.hi, "lo, hi")
        object.__setattr__(self, "scale", b)
        object.__setattr__(self, "lo", a)
        object.__setattr__(self, "hi", c)
        cal.grid(b, self.grid_bits)
        _bl_grid(b, a, c)  # raises for a range too narrow or too far out
        self.candidates  # raises for a range too narrow for K

    # -- the kernel's parameters --------------------------------------------------------------

    @functools.cached_property
    def _grid(self) -> tuple[int, int, int, int, int]:
        return _bl_grid(self.scale, self.lo, self.hi)

    @property
    def granularity(self) -> float:
        """The grid r = grid(b, 40)."""
        return math.ldexp(1.0, self._grid[0])

    @property
    def noise_scale_units(self) -> Fraction:
        """The discrete Laplace scale t/s >= b/r in grid units."""
        _, t, p, _, _ = self._grid
        return Fraction(t, 2 ** p)

    @property
    def grid_points(self) -> int:
        """n = Hi − Lo: the outputs are r·(Lo + i), i = 0..n."""
        _, _, _, Lo, Hi = self._grid
        return Hi - Lo

    @functools.cached_property
    def candidates(self) -> int:
        """K, the candidates drawn per release (bl_candidates)."""
        return bl_candidates(self.grid_points, float(self.noise_scale_units))

    def grid_distance(self, sensitivity: float) -> int:
        """The most grid units the centre can move for values Δ apart: clamping to [lo, hi] is
        1-Lipschitz and |rhe(x) − rhe(y)| <= |x − y| + 1 for round half to even, so
        floor(Δ/r) + 1, and at most n."""
        d = cal.check_sensitivity(sensitivity)
        return min(math.floor(Fraction(d) / Fraction(self.granularity)) + 1, self.grid_points)

    def fallback_probability(self) -> float:
        """η: an upper bound on the probability that all K candidates miss the range, for every
        centre: (1 − p_min)^K <= 2^-64."""
        p = _bl_acceptance(self.grid_points, float(self.noise_scale_units)) * (1.0 - 1e-12)
        if p >= 1.0:
            return 0.0
        return min(1.0, math.exp(self.candidates * math.log1p(-p)) * (1.0 + 1e-9))

    # -- privacy relation ---------------------------------------------------------------------

    def privacy_function(self, sensitivity: float) -> PrivacyLoss:
        """The pure ε of the ideal (conditioned) sampler at sensitivity Δ, exact on the grid and
        rounded up (bounded_grid_epsilon); δ = (1 + e^ε)·η for the K-candidate sampler."""
        _, t, p, _, _ = self._grid
        eps = bounded_grid_epsilon(self.grid_distance(sensitivity), self.grid_points, t, 2 ** p)
        eta = self.fallback_probability()
        return PrivacyLoss(epsilon=eps, delta=_up(Fraction((1.0 + math.exp(eps)) * eta) * (1 + Fraction(1, 10 ** 9))), rho=None)

    def privacy_relation(self, sensitivity: float, epsilon: float, delta: float = 0.0) -> bool:
        """True iff the release is (ε, δ)-DP at sensitivity Δ: δ covers the sampler's
        (1 + e^ε)·η and the rest δ₁ relaxes the pure loss to ε − log(1 − δ₁) (Thm 5.5.5's
        −log(1 − δ) term; proof in the class docstring)."""
        e = cal.check_epsilon(epsilon)
        dl = cal._real(delta, "delta")
        if not (0.0 <= dl < 1.0):
            raise InvalidParameter("delta must be in [0, 1)")
        eps = self.privacy_function(sensitivity).epsilon
        d1 = dl - (1.0 + math.exp(e)) * self.fallback_probability() * (1.0 + 1e-9)
        if d1 < 0.0:
            return False
        return eps <= e + (-math.log1p(-d1)) * (1.0 - 1e-12)

    @classmethod
    def calibrated(cls, sensitivity: float, epsilon: float, delta: float, lo: float, hi: float
                   ) -> "BoundedLaplaceMechanism":
        """The least scale b (to relative 1e-9, rounded up) with privacy_relation(Δ, ε, δ) on
        [lo, hi]: the grid version of the thesis's Thm 5.5.5, b >= Δ/(ε − log ΔC(b) −
        log(1 − δ₁)), whose right side depends on b. It is solved by bisection on b over the
        relation itself (checked at the returned b, so it holds whatever the rounding); a b
        below min(Δ, hi − lo)/(ε − log(1 − δ₁)) never works (ΔC >= 1). δ must cover the sampler's own
        (1 + e^ε)·2^-64."""
        d = cal.check_sensitivity(sensitivity)
        e = cal.check_epsilon(epsilon)
        dl = cal._real(delta, "delta")
        if not (0.0 <= dl < 1.0):
            raise InvalidParameter("delta must be in [0, 1)")
        a, c = cal.check_bounds(lo, hi, "lo, hi")
        if not c > a:
            raise InvalidParameter("bounded Laplace: hi must be greater than lo")
        if d == 0.0:
            raise InvalidParameter("bounded Laplace: the sensitivity must be > 0")
        floor_delta = (1.0 + math.exp(e)) * 2.0 ** -BL_FALLBACK_LOG2 * 1.001
        if dl < floor_delta:
            raise InvalidParameter(f"bounded Laplace: delta must be at least (1 + e^eps)·2^-64 "
                                   f"= {floor_delta:.3g} (the constant-work sampler's fallback)")

        def ok(b: float) -> bool:
            try:
                return cls(b, a, c).privacy_relation(d, e, dl)
            except InvalidParameter:
                return False

        reach = min(d, c - a)  # clamped values are at most hi − lo apart
        b_lo = reach / (e - math.log1p(-dl)) * (1.0 - 1e-9)
        b_hi = reach / e
        for _ in range(200):
            if ok(b_hi):
                break
            b_lo, b_hi = b_hi, b_hi * 2.0
        else:
            raise InvalidParameter("bounded Laplace: no scale satisfies the relation")
        while b_hi - b_lo > b_hi * 1e-9:
            mid = 0.5 * (b_lo + b_hi)
            if ok(mid):
                b_hi = mid
            else:
                b_lo = mid
        return cls(b_hi, a, c)

    def cost(self, sensitivity: float, epsilon: float, delta: float, label: str = ""
             ) -> MechanismCost:
        """The ledger entry for one release: verified (ε, δ), charged as an (ε, δ) guarantee
        (kind "threshold": the accountants' kind for a mechanism charged as its stated (ε, δ))."""
        if not self.privacy_relation(sensitivity, epsilon, delta):
            raise InvalidParameter("epsilon/delta: the mechanism does not satisfy them at this sensitivity")
        sens = _up(Fraction(cal.check_sensitivity(sensitivity)) + Fraction(self.granularity))
        return MechanismCost(kind="threshold", sensitivity=sens, scale=self.scale,
                             epsilon=float(epsilon), delta=float(delta), rho=None, label=label)

    # -- the released law, utility ------------------------------------------------------------

    def centre(self, value: float) -> int:
        """The grid index c the kernel centres the noise on (value clamped to [lo, hi], rounded
        half to even to the grid, clamped to [Lo, Hi]); r·c is the centre in real units."""
        v = cal._real(value, "value")
        if not math.isfinite(v):
            raise InvalidParameter("value must be finite")
        k, _, _, Lo, Hi = self._grid
        x = Fraction(min(max(v, self.lo), self.hi)) / Fraction(2) ** k
        m = round(x)  # Python rounds half to even
        return min(max(m, Lo), Hi)

    def _moments(self, value: float) -> tuple[float, float]:
        """(E[V − c], E[(V − c)²]) in grid units for the ideal conditioned law (the fallback,
        probability <= 2^-64, is ignored): the continuous truncated Laplace of scale τ on
        [−j − 1/2, n − j + 1/2] approximates the discrete sums to relative O(1/τ²) <= 2^-78 at the
        kernel's τ >= 2^39; for small τ (tests) the sums are taken exactly."""
        c = self.centre(value)
        _, _, _, Lo, _ = self._grid
        j, n = c - Lo, self.grid_points
        tau = float(self.noise_scale_units)
        if n <= 200_000:
            lam = math.exp(-1.0 / tau)
            w = [lam ** abs(i - j) for i in range(n + 1)]
            z = math.fsum(w)
            m1 = math.fsum(wi * (i - j) for i, wi in enumerate(w)) / z
            m2 = math.fsum(wi * (i - j) ** 2 for i, wi in enumerate(w)) / z
            return m1, m2

        def parts(a: float) -> tuple[float, float, float]:  # ∫_0^a x^k e^(−x/τ) dx, k = 0, 1, 2
            u = a / tau
            e = math.exp(-u)
            return (tau * -math.expm1(-u), tau ** 2 * (1.0 - e * (1.0 + u)),
                    tau ** 3 * (2.0 - e * (u * u + 2.0 * u + 2.0)))
        left, right = parts(j + 0.5), parts(n - j + 0.5)
        z = left[0] + right[0]
        return (right[1] - left[1]) / z, (right[2] + left[2]) / z

    def bias(self, value: float) -> float:
        """E[released] − clamp(value, lo, hi) up to the rounding to the grid (<= r/2)."""
        return self.granularity * self._moments(value)[0]

    def mse(self, value: float) -> float:
        """E[(released − r·c)²], c the centre (the value's clamp on the grid): truncation makes
        the noise biased near the ends, so this is the MSE, not a variance."""
        return self.granularity ** 2 * self._moments(value)[1]

    @property
    def variance(self) -> float:
        """The MSE at the midpoint of [lo, hi] (≈ 2b² for a range wide against b; the same at
        the ends, where the one-sided law has the same second moment, and smaller in between)."""
        return self.mse(0.5 * (self.lo + self.hi))

    def tail_probability(self, k: int) -> float:
        """max over centres j of P(|V − j| > k) for the ideal law P(v | j) ∝ λ^|v − j| on {0..n}
        (in grid units), in closed form. With u = λ^j + λ^(n−j), a centre with both tails beyond
        k (k < j < n − k) has P = λ^(k+1)(2 − λ^(−k)u)/(1 + λ − λu), decreasing in u (its
        derivative has the sign of 2λ − λ^(−k)(1 + λ) < 0), so the middle centre is the worst of
        them; a centre with one tail (j <= k) has P = λ^(k+1)(1 − λ^(n−j−k))/f(j), decreasing in j
        (numerator down, f up), so j = 0 is the worst of those. Returns the larger of the two,
        computed with expm1 (λ is within 2^-39 of 1 at the kernel's scales)."""
        n = self.grid_points
        tau = float(self.noise_scale_units)
        if k >= n:
            return 0.0

        def one_minus_pow(m: int) -> float:  # 1 − λ^m
            return -math.expm1(-m / tau) if m > 0 else 0.0

        lk = math.exp(-(k + 1) / tau)
        ends = lk * one_minus_pow(n - k) / one_minus_pow(n + 1)
        j = n // 2
        num = lk * (max(one_minus_pow(j - k), 0.0) + max(one_minus_pow(n - j - k), 0.0))
        middle = num / (one_minus_pow(j + 1) + math.exp(-1.0 / tau) * one_minus_pow(n - j))
        return max(ends, middle)

    def ci_halfwidth(self, level: float = 0.95) -> float:
        """h with P[|released − clamp(value)| <= h] >= level for every value (§5.7, the noise
        part): k = the least integer with tail_probability(k)·(1 + 1e-9) <= 1 − level (bisection;
        the margin covers float error), h = r·k + r/2 (the rounding of the value to the grid). The
        fallback (probability <= 2^-64) is ignored."""
        beta = 1.0 - cal.check_level(level)
        lo_k, hi_k = -1, self.grid_points  # tail(n) = 0 <= β; tail(−1) = 1 > β
        while hi_k - lo_k > 1:
            mid = (lo_k + hi_k) // 2
            if self.tail_probability(mid) * (1.0 + 1e-9) <= beta:
                hi_k = mid
            else:
                lo_k = mid
        r = self.granularity
        return r * hi_k + r / 2.0

    def confidence_interval(self, released: float, level: float = 0.95,
                            population_variance: float | None = None, n: int | None = None
                            ) -> "cal.ConfidenceInterval":
        """The §5.7 interval (post-processing): for the clamped value, released ± ci_halfwidth,
        intersected with [lo, hi]. With a population variance σ² and a sample size n (the value a
        sample mean), for the population mean: the noise at level 1 − β/2 plus
        z_(β/4)·σ/√n (union bound; the thesis's Cor. 5.7.1 combines them exactly for Gaussian
        noise only)."""
        lv = cal.check_level(level)
        h = self.ci_halfwidth(lv)
        if population_variance is not None:
            if n is None:
                raise InvalidParameter("n is needed with population_variance")
            beta = 1.0 - lv
            h = self.ci_halfwidth(1.0 - beta / 2.0) + _sampling_halfwidth(population_variance, n, beta / 2.0)
        return _interval(released, h, self.lo, self.hi, lv)

    def metadata(self, sensitivity: float, level: float = 0.95) -> dict:
        """Public facts for result metadata (parameters only)."""
        loss = self.privacy_function(sensitivity)
        return {"mechanism": "bounded_laplace", "source": "biswal thesis §5.5, Def. 5.5.3, Thm 5.5.5",
                "scale": self.scale, "lo": self.lo, "hi": self.hi, "granularity": self.granularity,
                "candidates": self.candidates, "epsilon": loss.epsilon, "delta": loss.delta,
                "ci_level": level, "ci_halfwidth": self.ci_halfwidth(level)}

    # -- sampling -----------------------------------------------------------------------------

    def sample(self, value: float, n: int = 1):
        """``n`` releases for the value by the kernel (the UDF's code path)."""
        _noise = importlib.import_module("dpch._noise")  # not ``from dpch import``: no import of the package

        return _noise.bounded_laplace_release([float(value)] * int(n), self.scale, self.lo, self.hi)

    def sql(self, value_sql: str) -> str:
        return (f"dpch_bounded_laplace({_check_value_sql(value_sql)}, {_float_literal(self.scale)}, "
                f"{_float_literal(self.lo)}, {_float_literal(self.hi)})")


@dataclass(frozen=True)
class GroupedBoundedLaplace:
    """The controller's bounded Laplace release of one noisy quantity (``mechanism="bounded_laplace"``,
    docs/CONTROLLER.md "Thesis mechanisms"): every group's value is released by
    ``mechanism`` (BoundedLaplaceMechanism on the public range [lo, hi], in the quantity's units)
    calibrated to (ε/c, δ/c) at the per-group sensitivity Δ_g, where c is the number of groups one
    privacy unit can move.

    Privacy guarantee: (ε, δ)-DP for the whole quantity. A unit changes at most c groups' values,
    each by at most Δ_g; each group's release is (ε/c, δ/c)-DP at Δ_g (the grid version of the
    thesis's Thm 5.5.5, BoundedLaplaceMechanism.privacy_relation), the other groups' laws do not
    change, and basic composition (dwork_roth_ch3_basic_techniques.md Thm 3.16) adds the c losses.
    (The per-group split is needed: the bounded mechanism's loss ε_grid(d) is subadditive in d, so
    one L1 budget over several groups would understate it.)

    ``mean_of`` = (sum column, sum grid, centre): the value is not the quantity itself (a row or unit
    count N) but the group's mean centre + grid·S/N of the bounded data (S the centred fixed-point
    sum column), or the centre for N = 0, clamped to [lo, hi] by the mechanism: AVG within its
    value bounds. Any two values in [lo, hi] differ by at most hi − lo, so Δ_g = hi − lo whatever
    the neighbour does to N (no public lower bound on N is needed, and none is assumed)."""

    mechanism: BoundedLaplaceMechanism
    group_sensitivity: float
    coords: int
    epsilon: float
    delta: float
    mean_of: tuple[str, float, float] | None = None
    unit: float = 1.0  # the value of one unit of the released quantity (a sum's fixed-point grid)

    @classmethod
    def calibrated(cls, group_sensitivity: float, epsilon: float, delta: float, coords: int,
                   lo: float, hi: float, mean_of: tuple[str, float, float] | None = None,
                   unit: float = 1.0) -> "GroupedBoundedLaplace":
        """Per group: BoundedLaplaceMechanism.calibrated(Δ_g, ε/c, δ/c, lo, hi). Raises
        InvalidParameter (δ/c below the sampler's floor, a range too narrow for the scale)."""
        if isinstance(coords, bool) or int(coords) != coords or coords < 1:
            raise InvalidParameter("coords must be an integer >= 1")
        c = int(coords)
        e = cal.check_epsilon(epsilon)
        dl = cal._real(delta, "delta")
        mech = BoundedLaplaceMechanism.calibrated(group_sensitivity, e / c, dl / c, lo, hi)
        return cls(mech, float(group_sensitivity), c, e, dl, mean_of, float(unit))

    def privacy_relation(self) -> bool:
        """True iff every group's release is (ε/c, δ/c)-DP at Δ_g (hence the whole (ε, δ)-DP)."""
        return self.mechanism.privacy_relation(self.group_sensitivity, self.epsilon / self.coords,
                                               self.delta / self.coords)

    @property
    def scale(self) -> float:
        return self.mechanism.scale

    def ci_halfwidth(self, level: float = 0.95) -> float:
        """The per-group noise half-width (BoundedLaplaceMechanism.ci_halfwidth, §5.7)."""
        return self.mechanism.ci_halfwidth(level)

    def value_sql(self, value_sql: str) -> str:
        """The Float64 value the mechanism is centred on (before its own clamp to [lo, hi])."""
        v = _check_value_sql(value_sql)
        if self.mean_of is None:
            return f"toFloat64({v})"
        col, grid, centre = self.mean_of
        # N = 0 (a public key group with no row) releases around the centre: no division by zero
        return (f"if({v} > 0, {_float_literal(centre)} + {_float_literal(grid)} * toFloat64({col}) / "
                f"toFloat64({v}), {_float_literal(centre)})")

    def sql(self, value_sql: str) -> str:
        return self.mechanism.sql(self.value_sql(value_sql))

    def facts(self) -> dict:
        """Public parameters for explain and result metadata (in value units)."""
        m, u = self.mechanism, self.unit
        return {"mechanism": "bounded_laplace", "source": "biswal thesis §5.5, Def. 5.5.3, Thm 5.5.5 "
                "(grid version, docs/NOISE.md); per group (ε/c, δ/c), Dwork & Roth Thm 3.16 over c groups",
                "guarantee": f"({self.epsilon:.6g}, {self.delta:.3g})-DP",
                "output_range": [m.lo * u, m.hi * u], "scale": m.scale * u,
                "group_sensitivity": self.group_sensitivity * u,
                "groups_per_unit": self.coords, "group_epsilon": self.epsilon / self.coords,
                "group_delta": self.delta / self.coords, "candidates": m.candidates,
                "released": "clamped mean of the bounded data" if self.mean_of is not None else "value"}
