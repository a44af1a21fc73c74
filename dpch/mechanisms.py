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

__all__ = ["PrivacyLoss", "LaplaceMechanism", "GaussianMechanism", "ExponentialMechanism",
           "BoundedLaplaceMechanism", "MixedNoiseMechanism"]


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


# ------------------------------------------------------------------------------------------------
# Thesis mechanisms (issue 16): the bounded Laplace mechanism (biswal_thesis_dp_foundations.md
# §5.5) and the mixed noise mechanism (§5.3), with the confidence intervals of §5.7.
# ------------------------------------------------------------------------------------------------

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

    def ci_halfwidth(self, level: float = 0.95) -> float:
        """h with P[|released − clamp(value)| <= h] >= level for every value: P[|V − c| > k] <=
        2λ^(k+1)/f(0) (each tail's mass is at most λ^(k+1)/(1 − λ) and the normaliser at least
        f(0)/(1 − λ)), so k = the least integer with that <= 1 − level; h = r·k + r/2
        (rounding)."""
        beta = 1.0 - cal.check_level(level)
        tau = float(self.noise_scale_units)
        f0 = math.exp(_bl_log_f(0, self.grid_points, tau))
        need = tau * math.log(2.0 / (beta * f0))
        k = max(0, math.ceil(need * (1.0 + 2.0 ** -40) + 1e-9) - 1)
        k = min(k, self.grid_points)
        r = self.granularity
        return r * k + r / 2.0

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
        from dpch import _noise

        return _noise.bounded_laplace_release([float(value)] * int(n), self.scale, self.lo, self.hi)

    def sql(self, value_sql: str) -> str:
        return (f"dpch_bounded_laplace({_check_value_sql(value_sql)}, {_float_literal(self.scale)}, "
                f"{_float_literal(self.lo)}, {_float_literal(self.hi)})")


def _sampling_halfwidth(population_variance: float, n: int, beta: float) -> float:
    """z_(β/2)·σ/√n: the sampling part of the thesis's §5.7 interval for a population mean."""
    var = cal._real(population_variance, "population_variance")
    if not (var >= 0.0 and math.isfinite(var)):
        raise InvalidParameter("population_variance must be a finite number >= 0")
    if isinstance(n, bool) or int(n) != n or n < 1:
        raise InvalidParameter("n must be an integer >= 1")
    return cal._normal_quantile_upper(beta / 2.0) * math.sqrt(var / int(n))


def _interval(released: float, h: float, lo: float, hi: float, level: float
              ) -> "cal.ConfidenceInterval":
    """released ± h intersected with [lo, hi] (the clamped value lies there)."""
    v = float(released)
    return cal.ConfidenceInterval(v, max(lo, v - h), min(hi, v + h), cal.check_level(level))


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
        return cls(d, t0, lap, gau)

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
        from dpch import _noise

        vals = [float(value)] * int(n)
        if self.uses_gaussian:
            return _noise.gaussian_release(vals, self.gaussian.sigma)
        return _noise.laplace_release(vals, self.laplace.scale)

    def sql(self, value_sql: str) -> str:
        return self.branch.sql(value_sql)
