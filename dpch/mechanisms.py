"""The noise mechanisms DPCH emits, each with its privacy relation stated as code.

Modelled on Tumult Core's measurements (``tmlt/core/measurements/base.py``): a mechanism declares
its input metric (the sensitivity it expects: L1 for Laplace, L2 for Gaussian), its output
measure, and a ``privacy_function(d_in) -> d_out`` giving the smallest privacy loss it guarantees
for inputs at distance ``d_in`` (the sensitivity). ``privacy_relation(d_in, d_out)`` is the
boolean form. The relations describe the noise the ``dpch_*`` UDFs really draw (docs/NOISE.md),
not its continuous idealisation:

* the value is rounded to the grid ``r = 2^k`` (``dpch.calibration.release_params``), which can move
  a neighbouring pair by one more grid unit: sensitivity ``Δ + r`` (Float64, or Int64 with r > 1),
  or ``Δ`` (Int64 with r = 1, where integers are not rounded);
* the noise is the discrete Laplace / discrete Gaussian of CKS20 in grid units, with the kernel's
  parameter ``t/2^p >= b/r`` or ``S/2^q >= σ/r`` (rounding up only adds noise).

A mechanism also knows its UDF (``udf_name``), how to call it (``sql``), the variance of its noise
and a confidence-interval half-width for the released value. All of these are post-processing or
public facts: none costs privacy.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction

from dpch import calibration as cal
from dpch.cost import MechanismCost
from dpch.errors import InvalidParameter

__all__ = ["PrivacyLoss", "LaplaceMechanism", "GaussianMechanism", "ExponentialMechanism"]


@dataclass(frozen=True)
class PrivacyLoss:
    """A privacy guarantee: pure/approximate DP ``(epsilon, delta)`` and/or zCDP ``rho``.
    A field is None when the statement does not give it."""

    epsilon: float | None = None
    delta: float | None = None
    rho: float | None = None


def _up(x: Fraction) -> float:
    """The least float >= x (the rounding direction that never understates a privacy loss)."""
    f = float(x)
    if Fraction(f) < x:
        f = math.nextafter(f, math.inf)
    return f


def _check_integer_flag(integer: object) -> bool:
    if not isinstance(integer, bool):
        raise InvalidParameter("integer must be a bool")
    return integer


def _check_value_sql(value_sql: object) -> str:
    if not isinstance(value_sql, str) or not value_sql.strip():
        raise InvalidParameter("value_sql must be a non-empty SQL expression")
    return value_sql


def _float_literal(x: float) -> str:
    """repr() of a finite float: the shortest decimal that parses back to exactly x (ClickHouse
    parses Float64 literals with correct rounding)."""
    return repr(float(x))


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


@dataclass(frozen=True)
class ExponentialMechanism:
    """Choose one of several candidates with integer scores: the exponential mechanism sampled by
    permute-and-flip (McKenna & Sheldon 2020, Alg. 1) in the kernel, ``dpch._noise.permute_and_flip``.
    Candidates are visited in a uniformly random order and candidate r is accepted with probability
    ``exp(-(u* - u_r)/T)``, u* the best score, at the temperature ``T = t/s`` (an exact rational,
    s a power of two), decided by CKS20's exact Bernoulli(exp(-γ)) sampler: no floating-point
    ``log(uniform)`` anywhere.

    Privacy: scores of sensitivity Δ (each moves by at most Δ between neighbours) give an
    ε-DP choice for T >= 2Δ/ε (McKenna & Sheldon, Thm. 1); ``calibrated`` rounds T up, so the
    realised ε is at most the requested one. Its expected score is never below the exponential
    mechanism's at the same ε (their Thm. 2)."""

    t: int
    s: int

    def __post_init__(self) -> None:
        if not (isinstance(self.t, int) and isinstance(self.s, int) and 1 <= self.t < 2 ** 127
                and 1 <= self.s < 2 ** 64):
            raise InvalidParameter("temperature t/s needs integers 1 <= t < 2^127, 1 <= s < 2^64")

    @classmethod
    def calibrated(cls, sensitivity: float, epsilon: float) -> "ExponentialMechanism":
        """The least temperature t/2^p >= 2Δ/ε with t < 2^63 (p <= 63): ε-DP for scores of
        sensitivity Δ."""
        t, s = cal.em_temperature(Fraction(cal.check_sensitivity(sensitivity)), epsilon)
        return cls(t, s)

    @property
    def temperature(self) -> Fraction:
        return Fraction(self.t, self.s)

    def privacy_function(self, sensitivity: float) -> PrivacyLoss:
        """ε = 2Δ/T (rounded up to a float)."""
        return PrivacyLoss(epsilon=_up(2 * Fraction(cal.check_sensitivity(sensitivity)) / self.temperature),
                           delta=0.0)

    def privacy_relation(self, sensitivity: float, epsilon: float) -> bool:
        return self.privacy_function(sensitivity).epsilon <= epsilon

    def probabilities(self, scores) -> list[float]:
        """The exact output distribution (for checks; exponential in the number of candidates,
        so at most 16): P(r) = p_r · Σ_{A ⊆ others} |A|!(n-1-|A|)!/n! · Π_{j∈A}(1 - p_j),
        p_j = exp(-(u* - u_j)/T), A the candidates visited before r."""
        u = [int(x) for x in scores]
        n = len(u)
        if not 1 <= n <= 16:
            raise InvalidParameter("probabilities: between 1 and 16 candidates")
        best = max(u)
        p = [math.exp(-float((best - x) / self.temperature)) for x in u]
        weight = [math.factorial(k) * math.factorial(n - 1 - k) / math.factorial(n) for k in range(n)]
        out = []
        for r in range(n):
            others = [j for j in range(n) if j != r]
            # Σ over subsets by the polynomial Π_j (1 + (1 - p_j) x): coefficient k = subsets of size k
            coef = [1.0]
            for j in others:
                nxt = [0.0] * (len(coef) + 1)
                for k, c in enumerate(coef):
                    nxt[k] += c
                    nxt[k + 1] += c * (1.0 - p[j])
                coef = nxt
            out.append(p[r] * sum(w * c for w, c in zip(weight, coef)))
        return out

    def sample(self, scores, n: int = 1):
        """``n`` independent choices (indices into ``scores``)."""
        from dpch import _noise

        return _noise.permute_and_flip(scores, self.t, self.s, n)


#: The fixed grid of dp_quantile/dp_median and of the controller's quantiles: [lo, hi] is cut into
#: this many equal buckets and the released value is the chosen bucket's midpoint (docs/NOISE.md,
#: "Quantiles", says why 2^16).
QUANTILE_BUCKETS = 1 << 16
#: Quantile levels are rounded to multiples of 1/QUANTILE_SCALE so that scores are integers.
QUANTILE_SCALE = 1 << 20


@dataclass(frozen=True)
class QuantileMechanism:
    """Quantiles of a histogram over a fixed grid of buckets, chosen by permute-and-flip
    (ExponentialMechanism) with the score of OpenDP's quantile candidates, scaled to integers:
    for a bucket b, L = rows in buckets below b, G = rows above b, score -|(Q - a) L - a G| for the
    level a/Q. Three or more distinct levels are released jointly by the recursion of Kaplan,
    Schnapp & Stemmer (2022, ApproximateQuantiles): the middle level over the whole grid, then the
    lower levels over the buckets up to it with the rows below it and the upper levels likewise
    above, so a row takes part in one sub-problem per depth. Exactly two distinct levels are
    released independently, each over the whole grid with all the rows at ε/2, and the two buckets
    sorted (the recursion's depth is 2 as well, so this costs the same, and the second level does
    not inherit the first one's error). This is the reference for the kernel's
    ``_quantile_buckets`` (udf/kernel.pxi), which the tests compare it with.

    Privacy: ε-DP for histograms that differ by at most ``rows`` rows (one privacy unit's rows in
    the group): one row moves L or G by one, so a score of level a/Q moves by at most
    rows · max(a, Q - a). Recursion: each of the depth = bit_length(#levels) depths is
    (ε/depth)-DP (parallel composition over the disjoint sub-problems) and they compose
    sequentially. Two levels: two (ε/2)-DP releases on the same histogram, sequential composition;
    sorting them is post-processing."""

    epsilon: float
    rows: int = 1

    def __post_init__(self) -> None:
        cal.check_epsilon(self.epsilon)
        if not (isinstance(self.rows, int) and 1 <= self.rows <= 2 ** 20):
            raise InvalidParameter("rows per privacy unit must be an integer in [1, 2^20]")

    @staticmethod
    def level(alpha: float) -> int:
        """The integer a of the level a/Q nearest to alpha."""
        v = float(alpha)
        if not 0.0 <= v <= 1.0:
            raise InvalidParameter("quantile levels must be numbers in [0, 1]")
        return int(round(v * QUANTILE_SCALE))

    def privacy_function(self) -> PrivacyLoss:
        return PrivacyLoss(epsilon=float(self.epsilon), delta=0.0)

    def chooser(self, a: int, depth: int) -> ExponentialMechanism:
        """The permute-and-flip of one sub-problem at relative level a/Q."""
        t, s = cal.em_temperature(self.rows * max(a, QUANTILE_SCALE - a) * depth, self.epsilon)
        return ExponentialMechanism(t, s)

    @staticmethod
    def scores(counts: list[int], a: int, c0: int, c1: int, d0: int, d1: int) -> list[int]:
        """Scores of the candidate buckets c0..c1 with the rows of buckets d0..d1 (dense counts)."""
        data = [counts[i] if d0 <= i <= d1 else 0 for i in range(len(counts))]
        out = []
        for b in range(c0, c1 + 1):
            below, above = sum(data[:b]), sum(data[b + 1:])
            out.append(-abs((QUANTILE_SCALE - a) * below - a * above))
        return out

    def probabilities(self, counts: list[int], alphas: list[float]) -> dict[tuple[int, ...], float]:
        """The exact joint distribution of the chosen buckets (one per level, in the order given)
        for dense ``counts`` over a grid of at most 16 buckets (for checks)."""
        levels = [self.level(x) for x in alphas]
        uniq = sorted(set(levels))
        depth = len(uniq).bit_length()
        buckets = len(counts)
        index = {a: i for i, a in enumerate(uniq)}
        result: dict[tuple[int, ...], float] = {}
        if len(uniq) == 2:  # two independent releases at ε/2 over the whole grid, then sorted
            last = buckets - 1
            marginals = [self.chooser(a, 2).probabilities(self.scores(counts, a, 0, last, 0, last))
                         for a in uniq]
            for b0, p0 in enumerate(marginals[0]):
                for b1, p1 in enumerate(marginals[1]):
                    pair = sorted((b0, b1))
                    mapped = tuple(pair[index[a]] for a in levels)
                    result[mapped] = result.get(mapped, 0.0) + p0 * p1
            return result

        def solve(c0, c1, d0, d1, lo, hi, end_lo, end_hi) -> dict[tuple, float]:
            if lo >= hi:
                return {(): 1.0}
            j = (lo + hi) // 2
            width = end_hi - end_lo
            a = (2 * (uniq[j] - end_lo) * QUANTILE_SCALE + width) // (2 * width)
            em = self.chooser(a, depth)
            out: dict[tuple, float] = {}
            for i, p in enumerate(em.probabilities(self.scores(counts, a, c0, c1, d0, d1))):
                b = c0 + i
                for left, pl in solve(c0, b, d0, b - 1, lo, j, end_lo, uniq[j]).items():
                    for right, pr in solve(b, c1, b + 1, d1, j + 1, hi, uniq[j], end_hi).items():
                        key = left + (b,) + right
                        out[key] = out.get(key, 0.0) + p * pl * pr
            return out

        joint = solve(0, buckets - 1, 0, buckets - 1, 0, len(uniq), 0, QUANTILE_SCALE)
        for key, p in joint.items():
            mapped = tuple(key[index[a]] for a in levels)
            result[mapped] = result.get(mapped, 0.0) + p
        return result

    def sample(self, keys, counts, buckets: int, alphas: list[float], n: int = 1) -> list[list[int]]:
        """``n`` independent releases by the kernel (sparse histogram: ascending ``keys``)."""
        from dpch import _noise

        return _noise.quantile_buckets(keys, counts, buckets, alphas, self.epsilon, self.rows, n)

    def rank_halfwidth(self, levels: int, confidence: float, buckets: int = QUANTILE_BUCKETS) -> float:
        """h such that, with probability >= confidence, every released level's
        |(1-α) L - α G| (rows below/above its bucket, within its sub-problem) exceeds the best
        bucket's by at most h rows: a candidate of score gap g is accepted with probability at most
        e^(-g/T), so a gap >= T (ln B + ln(m/β)) has probability <= β/m (union bound over the B
        buckets and the m levels), T = 2 · rows · depth / ε in rows (max(α, 1-α) <= 1). Two
        levels (depth 2, each over the whole histogram): sorting the pair keeps the bound, up to
        the larger of the two best scores, since (1-α) L - α G is non-decreasing in the bucket and
        non-increasing in α. Public: a function of the parameters only."""
        m = max(1, int(levels))
        depth = m.bit_length()
        beta = 1.0 - float(confidence)
        return 2.0 * self.rows * depth / self.epsilon * (math.log(buckets) + math.log(m / beta))

    @staticmethod
    def value(bucket: int, lo: float, hi: float, buckets: int = QUANTILE_BUCKETS) -> float:
        """The released value of a bucket: its midpoint, inside [lo, hi] (post-processing)."""
        return min(max(lo + (bucket + 0.5) * ((hi - lo) / buckets), lo), hi)


@dataclass(frozen=True)
class TopKMechanism:
    """Noisy top-n by peeling: n rounds of permute-and-flip (ExponentialMechanism), round i over
    the candidates not chosen yet, at the temperature ``em_temperature(Δ·n, ε)`` = 2Δn/ε rounded
    up (Durfee & Rogers 2019 peel exponential mechanisms; permute-and-flip, McKenna & Sheldon
    2020, is never worse than the exponential mechanism at the same ε). The reference for the
    kernel's ``_top_k`` (udf/kernel.pxi) and the UDF ``dpch_top_k``.

    Privacy: when every candidate's score moves by at most Δ between neighbouring datasets (any
    number of scores may move), each round is (ε/n)-DP (McKenna & Sheldon, Thm. 1) and the ordered
    n-tuple ε-DP by sequential composition (Dwork & Roth Thm 3.16). Pure ε: no δ."""

    epsilon: float
    n: int
    sensitivity: int = 1

    def __post_init__(self) -> None:
        cal.check_epsilon(self.epsilon)
        if not (isinstance(self.n, int) and 1 <= self.n <= 1 << 12):
            raise InvalidParameter("top-k: n must be an integer in [1, 4096]")
        if not (isinstance(self.sensitivity, int) and 1 <= self.sensitivity <= 1 << 62):
            raise InvalidParameter("top-k: the score sensitivity must be an integer in [1, 2^62]")

    def round_mechanism(self) -> ExponentialMechanism:
        """One round's permute-and-flip: (ε/n)-DP for scores of sensitivity Δ."""
        t, s = cal.em_temperature(self.sensitivity * self.n, self.epsilon)
        return ExponentialMechanism(t, s)

    @property
    def temperature(self) -> Fraction:
        """One round's temperature, in score units."""
        return self.round_mechanism().temperature

    def privacy_function(self) -> PrivacyLoss:
        """ε = n · (2Δ/T) (rounded up)."""
        per_round = 2 * Fraction(self.sensitivity) / self.temperature
        return PrivacyLoss(epsilon=_up(self.n * per_round), delta=0.0)

    def privacy_relation(self, epsilon: float) -> bool:
        return self.privacy_function().epsilon <= epsilon

    def probabilities(self, scores) -> dict[tuple[int, ...], float]:
        """The exact distribution of the ordered tuple of chosen indices (for checks; at most 8
        candidates): the product over rounds of the round's permute-and-flip probability among the
        candidates left."""
        u = [int(x) for x in scores]
        if not 1 <= len(u) <= 8:
            raise InvalidParameter("probabilities: between 1 and 8 candidates")
        em = self.round_mechanism()
        rounds = min(self.n, len(u))
        out: dict[tuple[int, ...], float] = {}

        def walk(prefix: tuple[int, ...], p: float) -> None:
            if len(prefix) == rounds:
                out[prefix] = out.get(prefix, 0.0) + p
                return
            left = [i for i in range(len(u)) if i not in prefix]
            for i, q in zip(left, em.probabilities([u[j] for j in left])):
                walk(prefix + (i,), p * q)

        walk((), 1.0)
        return out

    def sample(self, scores, draws: int = 1) -> list[list[int]]:
        """``draws`` independent releases by the kernel (the UDF's code path)."""
        from dpch import _noise

        return _noise.top_k(scores, self.n, self.epsilon, self.sensitivity, draws)

    def rank_error(self, candidates: int, beta: float) -> float:
        """g such that, with probability >= 1 - β, every chosen candidate's score is within g of
        the best score left in its round: a candidate at gap >= g is accepted with probability
        <= e^(-g/T), so g = T·ln(m·n/β) bounds it for all m candidates and n rounds (union bound).
        In score units; public (parameters only)."""
        m = max(1, int(candidates))
        b = float(beta)
        if not 0.0 < b < 1.0:
            raise InvalidParameter("beta must be in (0, 1)")
        return float(self.temperature) * math.log(m * min(self.n, m) / b)
