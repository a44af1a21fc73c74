"""Calibration: from (sensitivity, ε[, δ]) to the scale/σ handed to the ``dpch_*`` noise UDFs.

Every formula names its source. ``../shared/reference/`` files are cited by name:
"the paper" is ``dpch_paper.md``; "DPSQL" is ``dpsql_algorithms.md``; "the thesis" is
``biswal_thesis_dp_foundations.md``. External sources: Balle & Wang 2018 ("Improving the Gaussian
mechanism for differential privacy: analytical calibration and optimal denoising", ICML), Dwork &
Roth 2014 (The Algorithmic Foundations of DP), Bun & Steinke 2016 ("Concentrated differential
privacy: simplifications, extensions, and lower bounds"), Canonne, Kamath & Steinke 2020 ("The
Discrete Gaussian for Differential Privacy", NeurIPS; "CKS20").

This module is imported by the UDF program (``dpch_gaussian_sigma``), so it uses the standard
library only and imports nothing heavy at import time.

Grid rounding (binding spec: docs/NOISE.md)
-------------------------------------------
The UDFs round the true value to a power-of-two grid ``r`` and add integer noise in grid units.
``laplace_scale`` and ``gaussian_sigma`` absorb the rounding so that the requested ε (and δ) hold
for the noise the kernel actually draws, not only for its continuous idealisation:

* Laplace: ``b = Δ/ε + 2·grid(Δ/ε, 40)/ε``; then ``(Δ + grid(b, 40))/b <= ε`` is checked in exact
  rational arithmetic and ``b`` is raised by one ulp at a time if rounding broke it (it never
  needs more than a couple of ulps).
* Gaussian: ``σ = σ_method(Δ + 2·grid(σ_method(Δ, ε, δ), 20), ε, δ)`` as in docs/NOISE.md, iterated
  to a fixed point ``σ >= σ_method(Δ + 2·grid(σ, 20))`` in the rare case where σ crossed a power of
  two (then ``grid(σ) = 2·grid(σ_method(Δ))`` and the plain formula leaves no room, see below).

The discrete Gaussian is not the continuous one (conclusion of the numerical check)
------------------------------------------------------------------------------------
docs/NOISE.md states that ``dpch_gaussian*`` satisfies every (ε, δ) of the *continuous* Gaussian
mechanism with sensitivity ``Δ + r``. For zCDP this is a theorem (CKS20 Thm 4: the discrete
Gaussian with integer sensitivity d is ``d²/(2σ²)``-zCDP, exactly as the continuous one). For
(ε, δ) it is only approximately true: the exact δ of the discrete Gaussian (CKS20 Thm 7,
``discrete_gaussian_delta``) can exceed the continuous analytic δ (Balle & Wang Thm 8) by a
*lattice* term. Measured with exact sums (tests/test_calibration.py): d = 1, ε = 1, σ = 3.73
gives δ = 1.0366e-5 (discrete) against 1.0028e-5 (continuous), +3.4 %; d = 1, ε = 3 up to +20 %.
The term is O(φ(T/σ)·T/σ³) in absolute value (T = εσ²/d - d/2), so it vanishes for the Float64
UDFs (σ/r in (2^19, 2^20]: below 1e-15 absolute, covered by the 2·grid slack; the exact check in
the tests confirms δ_discrete <= δ for calibrated σ), but not for ``dpch_gaussian_int`` with r = 1
(counts, integer sums), where σ is small. So this module never relies on the continuous formula
alone; ``gaussian_udf_delta`` (used by ``gaussian_sigma`` and by dpch.mechanisms) bounds the δ of
the kernel's actual noise by the exact sum (when at most 40 000 terms) or by these bounds:

Let Y ~ N_Z(0, σ²), f(x) = exp(-x²/2σ²), d >= 1 an integer shift, T = εσ²/d - d/2, k the least
integer > T, S(m) = Σ_{y>=m} f(y), I(m) = ∫_m^∞ f, Z = Σ_y f(y). By CKS20 Thm 7,
δ = (S(k) - e^ε S(k+d))/Z. Always Z = σ√(2π)·Σ_j exp(-2π²σ²j²) >= σ√(2π) (Poisson summation), and
for any t, Q(t/σ) - e^ε Q((t + D)/σ) <= δ_cont(ε; D, σ), the continuous δ at sensitivity D (Balle &
Wang Thm 8: the optimal half-line attains the supremum over all sets).

*(a) Midpoint bound.* f(y) = ∫_{y-1/2}^{y+1/2} f - f''(ξ)/24, and -f'' <= 1/σ² (only on (-σ, σ)),
so S(k) <= I(k - 1/2) + N_c/(24σ²) with N_c = 0 if T >= σ + 1/2, else <= σ + 3/2 - T; and
k + d > 0 with f decreasing gives S(k + d) >= I(k + d). Hence
δ <= δ_cont(ε; d + 1/2, σ) + N_c/(24σ³√(2π)).
*(b) Trapezoid bound* (T >= 0). S(m) = I(m) + f(m)/2 + Σ_{y>=m} f''(ξ_y)/12. On [0, ∞), f''⁺ is
unimodal with maximum 2e^{-3/2}/σ² at √3σ, so Σ_{y>=k} f''⁺(ξ_y) <= ∫_{k-1}^∞ f''⁺ + 3·max
= x₀f(x₀)/σ² + 6e^{-3/2}/σ² (x₀ = max(k - 1, σ); the 3·max term, for the <= 3 intervals near
the mode, vanishes when k >= √3σ + 1); Σ_{y>=k+d} f''⁻ <= (⌈σ⌉ + 1 - (k + d))⁺/σ²;
f(k) - e^ε f(k + d) = f(k)(1 - e^{-(k - T)d/σ²}) <= f(k)·min(1, d/σ²). Hence
δ <= δ_cont(ε; d, σ) + [f(k)min(1, d/σ²)/2 + (x₀f(x₀) + 6e^{-3/2})/(12σ²)
+ e^ε(⌈σ⌉ + 1 - k - d)⁺/(12σ²)] / (σ√(2π)).
Both bounds only grow with d (for every shift j <= d: T_j >= T_d, k_j + j >= k_d + d - 1), so they
cover every neighbouring pair; CKS20 Thm 7 is stated for |q(x) - q(x')| <= Δ (the tests also check
numerically that the exact δ is monotone in the shift).

What the σ functions therefore guarantee:

* Float64 UDFs: σ is the docs/NOISE.md value (iterated to a fixed point when σ crossed a power of
  two), checked with ``gaussian_udf_delta`` at the shift floor(Δ/r) + 1 and the kernel's S/2^q,
  and raised only if that check fails (it has not failed on any tested parameters).
* Int64 UDFs with r = 1 (``gaussian_sigma(..., integer=True)``): the least σ >= σ_m(floor Δ) (to
  2^-26) whose kernel noise passes the same check. The SQL functions (``dp_count_gaussian``, ...)
  feed ``dpch_gaussian_int`` and must use this: ``gaussian_sigma(1, 1, 1e-5)`` = 3.73066 gives the
  integer kernel δ = 1.0345e-5 > 1e-5, ``gaussian_sigma(1, 1, 1e-5, integer=True)`` = 3.74048 gives
  δ = 0.99999e-5.
"""
from __future__ import annotations

import fractions
import functools
import math
import numbers
from dataclasses import dataclass

from dpch.errors import InvalidParameter

__all__ = [
    "LAPLACE_GRID_BITS",
    "GAUSSIAN_GRID_BITS",
    "GAUSSIAN_METHODS",
    "grid",
    "granularity",
    "release_params",
    "kernel_noise_scale",
    "check_epsilon",
    "check_delta",
    "check_sensitivity",
    "check_bounds",
    "check_level",
    "laplace_scale",
    "paper_gaussian_sigma",
    "classical_gaussian_sigma",
    "analytic_gaussian_sigma",
    "gaussian_sigma",
    "gaussian_delta",
    "gaussian_epsilon",
    "discrete_gaussian_delta",
    "discrete_gaussian_delta_bound",
    "discrete_gaussian_delta_upper",
    "gaussian_udf_delta",
    "zcdp_rho",
    "zcdp_delta",
    "laplace_ci_halfwidth",
    "gaussian_ci_halfwidth",
    "laplace_accuracy",
    "gaussian_accuracy",
    "noisy_mean_ci_halfwidth",
    "ConfidenceInterval",
]

LAPLACE_GRID_BITS = 40
GAUSSIAN_GRID_BITS = 20
GAUSSIAN_METHODS = ("analytic", "paper", "classical")

_INF = math.inf
_SQRT2 = math.sqrt(2.0)
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
_SQRT_2PI = math.sqrt(2.0 * math.pi)
# r = max(1, grid(σ, 20)) is 1 exactly when σ <= 2^20 (docs/NOISE.md, Int64 UDFs).
_INT_GRID_LIMIT = math.ldexp(1.0, GAUSSIAN_GRID_BITS)
# Exact discrete-Gaussian sums longer than this use the lattice bounds (module docstring).
_MAX_UNITS = 2.0 ** 53  # grid-unit sensitivities and sigmas handled by the discrete analysis
_DISCRETE_SUM_LIMIT = 40_000


# ----------------------------------------------------------------------------------------------
# Validation (messages name the parameter, never a value)
# ----------------------------------------------------------------------------------------------

def _real(x: object, name: str) -> float:
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise InvalidParameter(f"{name} must be a real number")
    try:
        return float(x)
    except (OverflowError, ValueError, TypeError):
        raise InvalidParameter(f"{name} must be a finite real number") from None


def _positive_finite(x: object, name: str) -> float:
    v = _real(x, name)
    if not (v > 0.0 and math.isfinite(v)):
        raise InvalidParameter(f"{name} must be a finite number > 0")
    return v


def check_epsilon(epsilon: object, name: str = "epsilon") -> float:
    """ε must be a finite real > 0. Returns it as float; raises InvalidParameter otherwise."""
    return _positive_finite(epsilon, name)


def check_delta(delta: object, name: str = "delta") -> float:
    """δ must lie in the open interval (0, 1). Returns it as float."""
    v = _real(delta, name)
    if not (0.0 < v < 1.0):
        raise InvalidParameter(f"{name} must be in the open interval (0, 1)")
    return v


def check_sensitivity(sensitivity: object, name: str = "sensitivity") -> float:
    """A sensitivity must be a finite real > 0. Returns it as float."""
    return _positive_finite(sensitivity, name)


def em_temperature(sensitivity: "int | fractions.Fraction", epsilon: float) -> tuple[int, int]:
    """The temperature (t, s) = t/2^p of the exponential mechanism for scores of sensitivity Δ at
    ε: the least t/2^p >= 2Δ/ε with t < 2^63 (p <= 63), an exact rational (McKenna & Sheldon
    2020, Thm. 1: permute-and-flip at T >= 2Δ/ε is ε-DP). Rounding is upward, so the realised ε
    2Δ/T never exceeds the requested one. Δ is an exact int or Fraction (the integer scores of
    dpch.mechanisms.ExponentialMechanism and of the quantile kernel)."""
    eps = check_epsilon(epsilon)
    sens = fractions.Fraction(sensitivity)
    if not sens > 0:
        raise InvalidParameter("sensitivity must be a finite number > 0")
    temp = 2 * sens / fractions.Fraction(eps)
    p = max(0, min(63, 62 - math.ceil(math.log2(temp))))
    t = -((-temp.numerator * 2 ** p) // temp.denominator)  # ceil(temp * 2^p)
    if t >= 2 ** 127:
        raise InvalidParameter("the exponential mechanism's temperature 2Δ/ε is too large")
    return t, 2 ** p


def check_bounds(lo: object, hi: object, name: str = "bounds") -> tuple[float, float]:
    """Clipping bounds: both finite reals with lo <= hi. Returns (lo, hi) as floats."""
    a = _real(lo, f"{name} (lower)")
    b = _real(hi, f"{name} (upper)")
    if not (math.isfinite(a) and math.isfinite(b)):
        raise InvalidParameter(f"{name} must be finite")
    if not a <= b:
        raise InvalidParameter(f"{name}: the lower bound must not exceed the upper bound")
    return a, b


def check_level(level: object, name: str = "level") -> float:
    """A confidence level (or a failure probability β) must lie in the open interval (0, 1)."""
    v = _real(level, name)
    if not (0.0 < v < 1.0):
        raise InvalidParameter(f"{name} must be in the open interval (0, 1)")
    return v


def _check_method(method: str) -> str:
    if method not in GAUSSIAN_METHODS:
        raise InvalidParameter(f"method must be one of {', '.join(GAUSSIAN_METHODS)}")
    return method


# ----------------------------------------------------------------------------------------------
# Grids (docs/NOISE.md; the same arithmetic as dpch_ceil_log2 / dpch_params_compute in udf/)
# ----------------------------------------------------------------------------------------------

def _ceil_log2(x: float) -> int:
    """ceil(log2 x) for finite x > 0, exactly: x = m·2^e with m in [0.5, 1) (frexp)."""
    m, e = math.frexp(x)
    return e - 1 if m == 0.5 else e


def grid(x: float, bits: int) -> float:
    """``2 ** (ceil(log2 x) - bits)``, computed exactly with frexp (docs/NOISE.md, "Grids").

    Raises InvalidParameter if x is not a finite positive number or the grid underflows."""
    v = _positive_finite(x, "scale")
    r = math.ldexp(1.0, _ceil_log2(v) - int(bits))
    if r == 0.0:
        raise InvalidParameter("scale is too small for its noise grid")
    return r


def granularity(scale: float, bits: int, integer: bool) -> float:
    """The grid r the UDF uses: ``grid(scale, bits)``, or ``max(1, grid(scale, bits))`` for the
    Int64 UDFs (docs/NOISE.md table)."""
    r = grid(scale, bits)
    return max(1.0, r) if integer else r


def release_params(scale: float, bits: int, integer: bool) -> tuple[int, int, int]:
    """``(k, num, den_log2)`` exactly as the kernel computes them (docs/NOISE.md): the grid is
    ``r = 2^k`` and the noise parameter in grid units is ``num / 2^den_log2 >= scale / r``
    (Laplace scale ``t/s`` with ``bits = 40``; Gaussian σ ``S/2^q`` with ``bits = 20``)."""
    v = _positive_finite(scale, "scale")
    k = _ceil_log2(v) - int(bits)
    if integer and k < 0:
        k = 0
    u = math.ldexp(v, -k)  # exact: division by a power of two
    p = max(0, int(bits) - _ceil_log2(u))
    num = math.ceil(math.ldexp(u, p))  # exact: u·2^p <= 2^bits
    return k, int(num), p


def kernel_noise_scale(scale: float, bits: int, integer: bool) -> tuple[float, float]:
    """``(r, τ)``: the grid and the noise parameter in grid units that the kernel really uses,
    ``τ = num/2^den_log2 >= scale/r`` (rounding only adds noise)."""
    k, num, p = release_params(scale, bits, integer)
    return math.ldexp(1.0, k), math.ldexp(float(num), -p)


# ----------------------------------------------------------------------------------------------
# Exact rational helpers (float.as_integer_ratio; no fractions import needed)
# ----------------------------------------------------------------------------------------------

def _sum_le_product(a: float, b: float, c: float, d: float) -> bool:
    """Exactly: a + b <= c·d (all finite floats)."""
    an, ad = a.as_integer_ratio()
    bn, bd = b.as_integer_ratio()
    cn, cd = c.as_integer_ratio()
    dn, dd = d.as_integer_ratio()
    return (an * bd + bn * ad) * (cd * dd) <= (cn * dn) * (ad * bd)


def _round_up(x: float) -> float:
    return math.nextafter(x, _INF)


# ----------------------------------------------------------------------------------------------
# Laplace
# ----------------------------------------------------------------------------------------------

def laplace_scale(sensitivity: float, epsilon: float) -> float:
    """Laplace scale b for L1-sensitivity Δ and ε, including the grid slack of docs/NOISE.md.

    The paper, Thm 1 (Laplace mechanism, b = Δ/ε is ε-DP); docs/NOISE.md: the UDF is
    ``(Δ + r)/b``-DP with ``r = grid(b, 40)``, and ``b = Δ/ε + 2·grid(Δ/ε, 40)/ε`` gives
    ``grid(b, 40) <= 2·grid(Δ/ε, 40)`` hence ``(Δ + r)/b <= ε``. The inequality is verified in
    exact rational arithmetic on the returned float (b is raised by an ulp if rounding broke it),
    so it holds for the Int64 UDF too (its grid term is 0 or the same r)."""
    delta_f = check_sensitivity(sensitivity)
    eps = check_epsilon(epsilon)
    base = delta_f / eps
    if not (math.isfinite(base) and base > 0.0):
        raise InvalidParameter("sensitivity / epsilon is out of the floating-point range")
    b = base + 2.0 * grid(base, LAPLACE_GRID_BITS) / eps
    for _ in range(64):
        if not math.isfinite(b):
            break
        if _sum_le_product(delta_f, grid(b, LAPLACE_GRID_BITS), eps, b):
            return b
        b = _round_up(b)
    raise InvalidParameter("sensitivity / epsilon is out of the floating-point range")


# ----------------------------------------------------------------------------------------------
# Normal distribution helpers (stdlib only)
# ----------------------------------------------------------------------------------------------

def _log_ndtr(x: float) -> float:
    """log Φ(x), accurate in relative terms down to x ≈ -1e150 (erfc, then the asymptotic series
    Φ(x) = φ(x)/|x| · Σ_n (-1)^n (2n-1)!!/x^{2n} for x < -30, truncated far below 1e-17)."""
    if x > 0.0:
        return math.log1p(-0.5 * math.erfc(x / _SQRT2))
    if x > -30.0:
        return math.log(0.5 * math.erfc(-x / _SQRT2))
    x2 = x * x
    inv = 1.0 / x2
    term = 1.0
    s = 1.0
    for n in range(1, 12):
        term *= -(2 * n - 1) * inv
        s += term
    return -0.5 * x2 - math.log(-x) - _LOG_SQRT_2PI + math.log(s)


def _log_sub_exp(la: float, lb: float) -> float:
    """log(e^la - e^lb), -inf when la <= lb."""
    if not la > lb:
        return -_INF
    return la + math.log(-math.expm1(lb - la))


def _normal_quantile_upper(beta: float) -> float:
    """z with P[N(0,1) > z] = beta, via statistics.NormalDist (imported lazily: not needed by the
    UDF program). Uses the lower tail for beta < 1/2 so tiny beta keeps full precision."""
    from statistics import NormalDist

    nd = NormalDist()
    if beta < 0.5:
        return -nd.inv_cdf(beta)
    return nd.inv_cdf(1.0 - beta)


# ----------------------------------------------------------------------------------------------
# Continuous Gaussian mechanism: exact privacy profile (Balle & Wang 2018, Thm 8)
# ----------------------------------------------------------------------------------------------

def _log_gaussian_delta(sensitivity: float, sigma: float, epsilon: float) -> float:
    """log δ(ε) of the Gaussian mechanism, Balle & Wang 2018 Thm 8:
    δ = Φ(Δ/(2σ) - εσ/Δ) - e^ε Φ(-Δ/(2σ) - εσ/Δ), evaluated in log space."""
    a = sensitivity / (2.0 * sigma)
    b = epsilon * sigma / sensitivity
    return _log_sub_exp(_log_ndtr(a - b), epsilon + _log_ndtr(-a - b))


def gaussian_delta(sensitivity: float, sigma: float, epsilon: float) -> float:
    """Exact δ(ε) of the (continuous) Gaussian mechanism with L2-sensitivity Δ and std σ:
    Balle & Wang 2018, Thm 8 (the analytic Gaussian mechanism). ε >= 0."""
    d = check_sensitivity(sensitivity)
    s = _positive_finite(sigma, "sigma")
    e = _real(epsilon, "epsilon")
    if not (e >= 0.0 and math.isfinite(e)):
        raise InvalidParameter("epsilon must be a finite number >= 0")
    return math.exp(_log_gaussian_delta(d, s, e))


def _bisect_increasing_ok(ok, lo: float, hi: float, rel: float) -> float:
    """Given ok(lo) False, ok(hi) True and ok monotone, return an hi with ok(hi) True and
    (hi - lo) <= rel·hi."""
    while hi - lo > rel * hi:
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi


def gaussian_epsilon(sensitivity: float, sigma: float, delta: float) -> float:
    """Smallest ε >= 0 with gaussian_delta(Δ, σ, ε) <= δ (inversion of Balle & Wang Thm 8 by
    bisection to relative precision 1e-13; the returned ε satisfies the inequality)."""
    d = check_sensitivity(sensitivity)
    s = _positive_finite(sigma, "sigma")
    dl = check_delta(delta)
    log_target = math.log(dl)

    def ok(e: float) -> bool:
        return _log_gaussian_delta(d, s, e) <= log_target

    if ok(0.0):
        return 0.0
    hi = 1.0
    while not ok(hi):
        hi *= 2.0
        if hi > 1e300:
            raise InvalidParameter("no finite epsilon reaches this delta")
    lo = 0.0 if hi == 1.0 else hi / 2.0
    return _bisect_increasing_ok(ok, lo, hi, 1e-13)


# ----------------------------------------------------------------------------------------------
# Gaussian σ: three named calibrations (continuous Gaussian, no grid)
# ----------------------------------------------------------------------------------------------

def _gaussian_args(sensitivity, epsilon, delta) -> tuple[float, float, float]:
    return check_sensitivity(sensitivity), check_epsilon(epsilon), check_delta(delta)


def paper_gaussian_sigma(sensitivity: float, epsilon: float, delta: float) -> float:
    """The paper, Corollary 1: σ = 2αΔ/ε with α = √(2 ln(1/δ)), valid for δ <= 0.1 and ε <= 4
    (rejected outside)."""
    d, e, dl = _gaussian_args(sensitivity, epsilon, delta)
    if dl > 0.1:
        raise InvalidParameter("delta must be <= 0.1 for the paper's Gaussian calibration (Cor 1)")
    if e > 4.0:
        raise InvalidParameter("epsilon must be <= 4 for the paper's Gaussian calibration (Cor 1)")
    alpha = math.sqrt(2.0 * math.log(1.0 / dl))
    return 2.0 * alpha * d / e


def classical_gaussian_sigma(sensitivity: float, epsilon: float, delta: float) -> float:
    """Classical Gaussian mechanism: σ = Δ√(2 ln(1.25/δ))/ε (DPSQL mechanism table; Dwork & Roth
    2014 Thm A.1), valid for ε < 1 only (rejected otherwise). Thm A.1 asks for c² > 2 ln(1.25/δ);
    the exact profile (Balle & Wang Thm 8) is continuous in σ, so equality is also (ε, δ)-DP."""
    d, e, dl = _gaussian_args(sensitivity, epsilon, delta)
    if not e < 1.0:
        raise InvalidParameter("epsilon must be < 1 for the classical Gaussian calibration")
    return d * math.sqrt(2.0 * math.log(1.25 / dl)) / e


@functools.lru_cache(maxsize=4096)
def _analytic_sigma(d: float, e: float, dl: float) -> float:
    log_target = math.log(dl)

    def ok(s: float) -> bool:
        return _log_gaussian_delta(d, s, e) <= log_target

    hi = d * (math.sqrt(2.0 * math.log(1.25 / dl)) + 1.0) / e
    while not ok(hi):
        hi *= 2.0
    lo = hi
    while ok(lo):
        hi = lo
        lo *= 0.5
    return _bisect_increasing_ok(ok, lo, hi, 1e-12)


def analytic_gaussian_sigma(sensitivity: float, epsilon: float, delta: float) -> float:
    """Analytic Gaussian mechanism, Balle & Wang 2018 (Thm 8 and Alg. 1): the smallest σ with
    Φ(Δ/(2σ) - εσ/Δ) - e^ε Φ(-Δ/(2σ) - εσ/Δ) <= δ, by bisection to relative precision 1e-12,
    returning the upper end (so the inequality holds for the returned σ). Valid for every ε > 0,
    0 < δ < 1. Examples (Δ = 1, δ = 1e-5): ε = 1 gives 3.7305, ε = 0.1 gives 30.749."""
    d, e, dl = _gaussian_args(sensitivity, epsilon, delta)
    return _analytic_sigma(d, e, dl)


_METHOD_FUNCS = {
    "analytic": analytic_gaussian_sigma,
    "paper": paper_gaussian_sigma,
    "classical": classical_gaussian_sigma,
}


# ----------------------------------------------------------------------------------------------
# Discrete Gaussian (CKS20): exact δ and two rigorous upper bounds (module docstring)
# ----------------------------------------------------------------------------------------------

def _check_dg_args(sensitivity, sigma, epsilon) -> tuple[int, float, float]:
    if (isinstance(sensitivity, bool) or not isinstance(sensitivity, numbers.Real)
            or not math.isfinite(sensitivity) or int(sensitivity) != sensitivity
            or not 1 <= sensitivity <= _MAX_UNITS):
        raise InvalidParameter("sensitivity must be an integer in [1, 2^53] (grid units)")
    s = _positive_finite(sigma, "sigma")
    if s > _MAX_UNITS:
        raise InvalidParameter("sigma must be <= 2^53 (grid units)")
    e = _real(epsilon, "epsilon")
    if not (e >= 0.0 and math.isfinite(e)):
        raise InvalidParameter("epsilon must be a finite number >= 0")
    return int(sensitivity), s, e


def _dg_log_normaliser(sigma: float) -> float:
    """log Σ_y exp(-y²/(2σ²)). For σ >= 2, Poisson summation gives σ√(2π)(1 + 2Σ e^{-2π²σ²j²}),
    whose correction is below 1e-34: log(σ√(2π)). Otherwise a direct (fsum) sum."""
    if sigma >= 2.0:
        return math.log(sigma) + _LOG_SQRT_2PI
    n = int(40.0 * sigma) + 2
    two_s2 = 2.0 * sigma * sigma
    return math.log(math.fsum(math.exp(-(y * y) / two_s2) for y in range(-n, n + 1)))


def _dg_threshold(d: int, sigma: float, epsilon: float) -> float:
    """T = εσ²/d - d/2: y is in the worst-case set of CKS20 Thm 7 iff y > T."""
    return epsilon * sigma * sigma / d - d / 2.0


def _dg_terms(d: int, sigma: float, epsilon: float) -> int:
    """Terms the exact sum of discrete_gaussian_delta will take (about min(45d/ε, 10σ))."""
    t = _dg_threshold(d, sigma, epsilon)
    if t >= 1.0:
        k0 = math.floor(t)
        span = 90.0 * sigma * sigma / (k0 + math.sqrt(k0 * k0 + 90.0 * sigma * sigma))
    else:
        span = -t + 10.0 * sigma
    if not span < 1e15:
        return 10 ** 15
    return int(span) + 2


def discrete_gaussian_delta(sensitivity: int, sigma: float, epsilon: float,
                            max_terms: int | None = None) -> float:
    """Exact δ(ε) of the discrete Gaussian mechanism N_Z(0, σ²) with integer sensitivity d
    (CKS20 Thm 7): δ = P[Y > εσ²/d - d/2] - e^ε P[Y > εσ²/d + d/2], Y ~ N_Z(0, σ²).

    Computed as Σ_{y>T} f(y)·(1 - e^{ε - (2y + d)d/(2σ²)}) / Z with f(y) = e^{-y²/(2σ²)}: every
    term is >= 0 (no cancellation), terms are scaled by f(floor T), summed with math.fsum, and the
    truncated tail is added as an upper bound. Relative error ~1e-14. Cost about min(45d/ε, 10σ)
    terms; raises InvalidParameter if that exceeds ``max_terms``."""
    d, s, e = _check_dg_args(sensitivity, sigma, epsilon)
    if max_terms is not None and _dg_terms(d, s, e) > max_terms:
        raise InvalidParameter("sigma is too large for an exact discrete-Gaussian sum")
    two_s2 = 2.0 * s * s
    k0 = math.floor(_dg_threshold(d, s, e))  # terms with y <= T clamp to 0 (covers rounding of T)
    base = k0 if k0 > 0 else 0  # f(y)/f(base) <= 1 for every y >= k0
    ed = math.exp(-2.0 * d / two_s2)
    terms = []
    total = 0.0
    y = k0
    n = 0
    while True:
        w = math.exp(-((y - base) * (y + base)) / two_s2)  # f(y)/f(base); y² - base² exact
        if (n & 255) == 0:  # exact restart of the recurrence for E (drift < 3e-14)
            x = e - ((2 * y + d) * d) / two_s2
            big_e = math.exp(x) if x < 700.0 else math.inf  # e^ε f(y+d)/f(y)
        if big_e < 0.5:
            c = 1.0 - big_e
        else:
            c = -math.expm1(e - ((2 * y + d) * d) / two_s2)  # full precision near the threshold
        if c > 0.0:
            t = w * c
            terms.append(t)
            total += t
        n += 1
        if y > 0 and (n & 63) == 0:
            q = math.exp(-(2 * y + 1) / two_s2)  # f(y+1)/f(y); later ratios are smaller
            rest = w * q / -math.expm1(-(2 * y + 1) / two_s2)  # >= Σ_{i>y} f(i)/f(base)
            if rest <= 1e-17 * total or (total == 0.0 and w == 0.0):
                terms.append(rest)  # conservative: the tail with weight 1 >= its true weight
                break
        big_e *= ed
        y += 1
    acc = math.fsum(terms)
    if acc <= 0.0:
        return 0.0
    log_delta = math.log(acc) - (base * base) / two_s2 - _dg_log_normaliser(s)
    return min(1.0, math.exp(log_delta))


_TWO_EXP_M15 = 2.0 * math.exp(-1.5)  # max_{x>=σ} f''(x)·σ² (at x = √3 σ)
_SQRT3 = math.sqrt(3.0)


def _dg_bound_midpoint(d: int, s: float, e: float) -> float:
    """Lattice bound (a): δ_cont(ε; d + 1/2, σ) + η, η = N_c/(24σ²·σ√(2π)), N_c = 0 if T >= σ + 1/2
    else σ + 3/2 - T. Proof in the module docstring (midpoint rule with the second-derivative
    remainder |f''| <= 1/σ² on (-σ, σ), f convex outside)."""
    t = _dg_threshold(d, s, e)
    n_c = 0.0 if t >= s + 0.5 else s + 1.5 - t
    eta = n_c / (24.0 * s * s * s * _SQRT_2PI)
    return math.exp(_log_gaussian_delta(d + 0.5, s, e)) + eta


def _dg_bound_trapezoid(d: int, s: float, e: float) -> float:
    """Lattice bound (b), for T >= 0: δ_cont(ε; d, σ) + [f(k)·min(1, d/σ²)/2
    + (x₀f(x₀) + 3·0.4463)/(12σ²) + e^ε·max(0, ⌈σ⌉ + 1 - (k + d))/(12σ²)] / (σ√(2π)), k the least
    integer > T, x₀ = max(k - 1, σ) (trapezoid rule with remainder f''(ξ)/12; module docstring)."""
    t = _dg_threshold(d, s, e)
    if not 0.0 <= t < 1e300:
        return 1.0
    s2 = s * s
    k = float(math.floor(t) + 1)
    fk = math.exp(-(k * k) / (2.0 * s2))
    x0 = max(k - 1.0, s)
    first = fk * min(1.0, d / s2) / 2.0
    # intervals around the mode √3σ of f''⁺ (at most 3) only exist if k < √3σ + 1
    mode = 0.0 if k >= _SQRT3 * s + 1.0 else 3.0 * _TWO_EXP_M15
    second = (x0 * math.exp(-(x0 * x0) / (2.0 * s2)) + mode) / (12.0 * s2)
    n_neg = max(0.0, math.ceil(s) + 1.0 - (k + d))
    third = math.exp(e) * n_neg / (12.0 * s2) if n_neg > 0.0 else 0.0
    extra = (first + second + third) / (s * _SQRT_2PI)
    return math.exp(_log_gaussian_delta(float(d), s, e)) + extra


def discrete_gaussian_delta_bound(sensitivity: int, sigma: float, epsilon: float) -> float:
    """Rigorous upper bound on the δ(ε) of the discrete Gaussian N_Z(0, σ²) for every integer shift
    <= d, cheap for any σ: the smaller of the midpoint bound δ_cont(ε; d + 1/2, σ) + η and the
    trapezoid bound δ_cont(ε; d, σ) + O(φ/σ²) of the module docstring (capped at 1)."""
    d, s, e = _check_dg_args(sensitivity, sigma, epsilon)
    return min(1.0, _dg_bound_midpoint(d, s, e), _dg_bound_trapezoid(d, s, e))


def discrete_gaussian_delta_upper(sensitivity: int, sigma: float, epsilon: float) -> float:
    """δ(ε) of the discrete Gaussian with integer sensitivity d, never underestimated: the exact
    sum (CKS20 Thm 7) when it takes at most 40 000 terms, else discrete_gaussian_delta_bound."""
    d, s, e = _check_dg_args(sensitivity, sigma, epsilon)
    if _dg_terms(d, s, e) <= _DISCRETE_SUM_LIMIT:
        return discrete_gaussian_delta(d, s, e)
    return min(1.0, _dg_bound_midpoint(d, s, e), _dg_bound_trapezoid(d, s, e))


def gaussian_udf_delta(sensitivity: float, sigma: float, epsilon: float, integer: bool) -> float:
    """An upper bound on δ(ε) of ``dpch_gaussian`` / ``dpch_gaussian_int`` called with this σ on a
    value of L2-sensitivity Δ: the kernel's grid r and σ_u = S/2^q (docs/NOISE.md), the grid-unit
    shift d = floor(Δ/r) + 1 (or floor(Δ) for Int64 with r = 1, exact integers) and
    discrete_gaussian_delta_upper(d, σ_u, ε)."""
    dl = check_sensitivity(sensitivity)
    r, s_u = kernel_noise_scale(sigma, GAUSSIAN_GRID_BITS, bool(integer))
    units = dl / r
    if not units < _MAX_UNITS - 1:  # Δ/σ > 2^32: nothing is protected; δ <= 1 trivially
        return 1.0
    if integer and r == 1.0:
        d = max(1, math.floor(dl))
    else:
        d = math.floor(units) + 1
    return discrete_gaussian_delta_upper(d, s_u, epsilon)


# ----------------------------------------------------------------------------------------------
# σ for the dpch_gaussian UDFs (grid slack of docs/NOISE.md + discrete-Gaussian check)
# ----------------------------------------------------------------------------------------------

_GRID_TOO_COARSE = ("epsilon and delta are too small for the Gaussian noise grid (noise above "
                    "about 2^17 times the sensitivity): use a larger epsilon or delta, or Laplace noise")


def _search_up(ok, start: float) -> float:
    """Least σ >= start (to relative 2^-26) with ok(σ) True, searching up to 16·start; the
    returned value always passed ok (no monotonicity is assumed for correctness)."""
    if ok(start):
        return start
    lo = start
    step = start * 2.0 ** -20
    hi = start + step
    while not ok(hi):
        lo = hi
        step *= 2.0
        hi = start + step
        if step > 16.0 * start:
            raise InvalidParameter(_GRID_TOO_COARSE)
    return _bisect_increasing_ok(ok, lo, hi, 2.0 ** -26)


def _noise_md_sigma(d: float, e: float, dl: float, method: str) -> float:
    """docs/NOISE.md: σ = σ_m(Δ + 2·grid(σ_m(Δ), 20)), iterated while σ crosses a power of two so
    that finally σ >= σ_m(Δ + 2·grid(σ, 20)). No such σ exists when σ_m(Δ)/Δ exceeds about
    2^18 (the rounding grows with σ faster than σ protects it): InvalidParameter."""
    sigma_m = _METHOD_FUNCS[method]
    g = grid(sigma_m(d, e, dl), GAUSSIAN_GRID_BITS)
    for _ in range(64):
        sigma = sigma_m(_round_up(d + 2.0 * g), e, dl)  # Δ + 2g rounded up
        r = grid(sigma, GAUSSIAN_GRID_BITS)
        if r <= g:
            return sigma
        g = r
    raise InvalidParameter(_GRID_TOO_COARSE)


@functools.lru_cache(maxsize=4096)
def _gaussian_sigma_cached(d: float, e: float, dl: float, method: str, integer: bool) -> float:
    if integer:
        # r = 1 (σ <= 2^20): no rounding, the shift is the integer floor(Δ); start from the
        # continuous σ_m at that shift and let the exact discrete δ decide.
        start = _METHOD_FUNCS[method](float(max(1, math.floor(d))), e, dl)
        if start > _INT_GRID_LIMIT:
            start = _noise_md_sigma(d, e, dl, method)
    else:
        start = _noise_md_sigma(d, e, dl, method)

    def ok(sigma: float) -> bool:
        return gaussian_udf_delta(d, sigma, e, integer) <= dl

    return _search_up(ok, start)


def gaussian_sigma(sensitivity: float, epsilon: float, delta: float, method: str = "analytic",
                   *, integer: bool = False) -> float:
    """σ to pass to ``dpch_gaussian`` (``integer=False``) or ``dpch_gaussian_int``
    (``integer=True``) so that the release is (ε, δ)-DP for L2-sensitivity Δ.

    ``method`` selects the continuous calibration σ_m: "analytic" (Balle & Wang 2018, default),
    "paper" (the paper, Cor 1) or "classical" (Dwork & Roth Thm A.1; ε < 1).

    Float64: docs/NOISE.md, σ = σ_m(Δ + 2·grid(σ_m(Δ, ε, δ), 20), ε, δ) (iterated to a fixed
    point if σ crossed a power of two). The result is then checked against the discrete Gaussian
    the kernel draws (``gaussian_udf_delta``: shift floor(Δ/r) + 1 grid units, σ_u = S/2^q, the
    lattice bounds of the module docstring) and raised only if that check fails (never observed
    for practical parameters: the 2·grid slack covers the lattice term).

    Int64: r = max(1, grid(σ, 20)). For σ <= 2^20, r = 1 and the value is not rounded: the least
    σ >= σ_m(floor Δ) (to 2^-26) whose exact discrete δ (CKS20 Thm 7 at the kernel's S/2^q, or the
    lattice bounds when that sum is long) is <= δ. Above 2^20 the Float64 analysis applies.

    Cached (functools.lru_cache); stdlib only: the UDF program calls it for dpch_gaussian_sigma."""
    d, e, dl = _gaussian_args(sensitivity, epsilon, delta)
    return _gaussian_sigma_cached(d, e, dl, _check_method(method), bool(integer))


def udf_gaussian_sigma(sensitivity: float, epsilon: float, delta: float) -> float:
    """σ returned by the SQL-callable UDF ``dpch_gaussian_sigma(Δ, ε, δ)``: valid for both noise
    kernels, ``dpch_gaussian`` and ``dpch_gaussian_int`` (the larger of the two calibrations; the
    SQL functions feed integer fixed-point sums and counts to ``dpch_gaussian_int``, whose discrete
    noise needs the exact-δ calibration, see the module docstring)."""
    return max(gaussian_sigma(sensitivity, epsilon, delta),
               gaussian_sigma(sensitivity, epsilon, delta, integer=True))


# ----------------------------------------------------------------------------------------------
# zCDP
# ----------------------------------------------------------------------------------------------

def zcdp_rho(sensitivity: float, sigma: float) -> float:
    """ρ = Δ²/(2σ²): the Gaussian mechanism is ρ-zCDP (Bun & Steinke 2016, Prop. 1.6); the
    discrete Gaussian with integer sensitivity satisfies the same (CKS20 Thm 4)."""
    d = check_sensitivity(sensitivity)
    s = _positive_finite(sigma, "sigma")
    return d * d / (2.0 * s * s)


def zcdp_delta(rho: float, epsilon: float) -> float:
    """δ such that ρ-zCDP implies (ε, δ)-DP: exp(-(ε - ρ)²/(4ρ)) for ε >= ρ, else 1
    (Bun & Steinke 2016, Prop. 1.3: (ρ + 2√(ρ ln(1/δ)), δ)-DP)."""
    p = _positive_finite(rho, "rho")
    e = _real(epsilon, "epsilon")
    if not e > p:
        return 1.0
    return math.exp(-((e - p) ** 2) / (4.0 * p))


# ----------------------------------------------------------------------------------------------
# Accuracy and confidence intervals of the noise (continuous distributions)
# ----------------------------------------------------------------------------------------------

def laplace_ci_halfwidth(scale: float, level: float = 0.95) -> float:
    """h with P[|Lap(b)| <= h] = level: h = b·ln(1/(1 - level)) (DPSQL mechanism table: the
    Laplace tail P[|N_L| >= t·b] = e^{-t}; the thesis section 5.7 for noisy-statistic CIs)."""
    b = _positive_finite(scale, "scale")
    lv = check_level(level)
    return b * -math.log1p(-lv)


def gaussian_ci_halfwidth(sigma: float, level: float = 0.95) -> float:
    """h with P[|N(0, σ²)| <= h] = level: h = σ·Φ⁻¹((1 + level)/2) (the thesis section 5.7,
    z_{α/2} with α = 1 - level; DPSQL mechanism table)."""
    s = _positive_finite(sigma, "sigma")
    lv = check_level(level)
    return s * _normal_quantile_upper((1.0 - lv) / 2.0)


def laplace_accuracy(scale: float, beta: float) -> float:
    """(α, β)-accuracy of the Laplace mechanism: α = b·ln(1/β), P[|noise| >= α] = β (DPSQL
    mechanism table, (α, β) row)."""
    b = _positive_finite(scale, "scale")
    bt = check_level(beta, "beta")
    return b * -math.log(bt)


def gaussian_accuracy(sigma: float, beta: float) -> float:
    """(α, β)-accuracy of the Gaussian mechanism: α = σ·Φ⁻¹(1 - β/2) = σ√2·erf⁻¹(1 - β)
    (DPSQL mechanism table, (α, β) row, with σ factored out)."""
    s = _positive_finite(sigma, "sigma")
    bt = check_level(beta, "beta")
    return s * _normal_quantile_upper(bt / 2.0)


def noisy_mean_ci_halfwidth(noise_sigma: float, population_variance: float, n: int,
                            level: float = 0.95) -> float:
    """Half-width of the (level)-CI for a population mean from a Gaussian-noised sample mean:
    z_{α/2}·√(σ²/n + σ_Z²) (the thesis, Corollary 5.7.1 and Theorem 5.7.2, where σ² may be a
    noisy sample variance). Pure post-processing of released values."""
    s = _positive_finite(noise_sigma, "noise_sigma")
    var = _real(population_variance, "population_variance")
    if not (var >= 0.0 and math.isfinite(var)):
        raise InvalidParameter("population_variance must be a finite number >= 0")
    if isinstance(n, bool) or int(n) != n or n < 1:
        raise InvalidParameter("n must be an integer >= 1")
    lv = check_level(level)
    return _normal_quantile_upper((1.0 - lv) / 2.0) * math.sqrt(var / int(n) + s * s)


@dataclass(frozen=True)
class ConfidenceInterval:
    """A released estimate with a symmetric confidence interval (post-processing, no privacy
    cost): ``lower = estimate - halfwidth``, ``upper = estimate + halfwidth``."""

    estimate: float
    lower: float
    upper: float
    level: float

    @classmethod
    def around(cls, estimate: float, halfwidth: float, level: float) -> "ConfidenceInterval":
        if not (halfwidth >= 0.0):
            raise InvalidParameter("halfwidth must be >= 0")
        return cls(estimate, estimate - halfwidth, estimate + halfwidth, check_level(level))

    @property
    def halfwidth(self) -> float:
        return (self.upper - self.lower) / 2.0
