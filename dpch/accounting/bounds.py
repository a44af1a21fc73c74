"""Closed-form composition and conversion bounds (each cross-checked in tests/test_accounting.py)."""
from __future__ import annotations

import math
from functools import lru_cache

from ..errors import InvalidParameter

# --------------------------------------------------------------------------------------------
# Closed forms (each one is cross-checked in tests/test_accounting.py)
# --------------------------------------------------------------------------------------------

def zcdp_to_dp_bun_steinke(rho: float, delta: float) -> float:
    """Bun & Steinke 2016, Prop 1.3: ρ-zCDP implies (ρ + 2√(ρ ln(1/δ)), δ)-DP for every δ > 0."""
    if rho <= 0:
        return 0.0
    return rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))


def _cks_objective(rho: float, log_inv_delta: float, alpha: float) -> float:
    # Canonne, Kamath & Steinke 2020 (arXiv:2004.00010) Prop 12 for (α, αρ)-RDP:
    # ε = αρ + (ln(1/δ) + (α-1) ln(1-1/α) - ln α) / (α-1).
    am1 = alpha - 1.0
    return alpha * rho + math.log1p(-1.0 / alpha) + (log_inv_delta - math.log(alpha)) / am1


@lru_cache(maxsize=4096)
def zcdp_to_dp(rho: float, delta: float) -> float:
    """ε such that ρ-zCDP implies (ε, δ)-DP: min over orders α > 1 of the conversion of
    Canonne, Kamath & Steinke 2020, Prop 12 (also used by Google's dp_accounting
    `rdp.compute_epsilon`), applied to the RDP curve (α, αρ) of ρ-zCDP, and never worse than
    Bun & Steinke's Prop 1.3. Any α gives a valid bound, so an imperfect numerical minimum is
    still sound, only slightly loose."""
    if not (0.0 < delta < 1.0):
        raise InvalidParameter("the zCDP to (ε, δ) conversion needs 0 < δ < 1")
    if rho < 0 or math.isnan(rho):
        raise InvalidParameter("ρ must be non-negative")
    if rho == 0:
        return 0.0
    if math.isinf(rho):
        return math.inf
    L = math.log(1.0 / delta)

    def f(t: float) -> float:  # α = 1 + e^t keeps α > 1 on the whole search line
        return _cks_objective(rho, L, 1.0 + math.exp(t))

    grid = [-12.0 + 0.25 * i for i in range(145)]  # α - 1 from e^-12 to e^24
    values = [f(t) for t in grid]
    i = min(range(len(grid)), key=values.__getitem__)
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    gr = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = lo, hi
    c, d = b - gr * (b - a), a + gr * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(80):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - gr * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + gr * (b - a)
            fd = f(d)
    best = min(values[i], fc, fd)
    return max(0.0, min(best, zcdp_to_dp_bun_steinke(rho, delta)))


@lru_cache(maxsize=1024)
def zcdp_budget(epsilon: float, delta: float) -> float:
    """ρ_B: the largest ρ (to bisection precision, rounded down) with zcdp_to_dp(ρ, δ) ≤ ε."""
    if epsilon <= 0:
        return 0.0
    hi = max(epsilon, 1e-12)
    while zcdp_to_dp(hi, delta) <= epsilon:
        hi *= 2.0
        if hi > 1e12:
            raise InvalidParameter("zCDP budget diverges: δ too close to 1")
    lo = 0.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if mid <= lo or mid >= hi:
            break
        if zcdp_to_dp(mid, delta) <= epsilon:
            lo = mid
        else:
            hi = mid
    assert zcdp_to_dp(lo, delta) <= epsilon
    return lo


def dr_advanced_epsilon(k: int, eps0: float, delta_prime: float) -> float:
    """Dwork & Roth Thm 3.20: k-fold adaptive composition of (ε0, δ0)-DP mechanisms is
    (√(2k ln(1/δ')) ε0 + k ε0 (e^ε0 - 1), kδ0 + δ')-DP."""
    if k <= 0:
        return 0.0
    return math.sqrt(2.0 * k * math.log(1.0 / delta_prime)) * eps0 + k * eps0 * math.expm1(eps0)


def kov_34_epsilons(k: int, eps0: float, delta_tilde: float) -> tuple[float, float]:
    """Kairouz, Oh & Viswanath 2015, Thm 3.4 (the two non-trivial terms of "self-adaptive
    selection" in `dpsql_algorithms.md`): with δ̃ ∈ (0, 1] the k-fold composition of (ε0, δ0)-DP
    mechanisms is (ε̃, 1 - (1-δ0)^k (1-δ̃))-DP for ε̃ = kε0(e^ε0-1)/(e^ε0+1) + ε0√(2k ln(e + √(kε0²)/δ̃))
    and for ε̃ = kε0(e^ε0-1)/(e^ε0+1) + ε0√(2k ln(1/δ̃))."""
    if k <= 0:
        return 0.0, 0.0
    mean = k * eps0 * math.tanh(eps0 / 2.0)  # (e^ε-1)/(e^ε+1) = tanh(ε/2)
    a = mean + eps0 * math.sqrt(2.0 * k * math.log(math.e + math.sqrt(k * eps0 * eps0) / delta_tilde))
    b = mean + eps0 * math.sqrt(2.0 * k * math.log(1.0 / delta_tilde))
    return a, b


@lru_cache(maxsize=8192)
def kov_delta(k: int, eps0: float, delta0: float, eps_total: float) -> float:
    """The smallest δ such that every k-fold adaptive composition of (ε0, δ0)-DP mechanisms is
    (eps_total, δ)-DP: Kairouz, Oh & Viswanath 2015, Thm 3.3. The composition's privacy region is
    contained in that of k-fold randomized response (their dominance argument), so
    δ = 1 - (1-δ0)^k (1 - H), H = Σ_l C(k,l) max(0, e^{(k-l)ε0} - e^{eps_total} e^{lε0}) / (1+e^ε0)^k,
    the hockey-stick divergence of k-fold randomized response. At eps_total = (k-2i)ε0 this is the
    δ_i of `dpsql_algorithms.md` ("advanced composition 2")."""
    if k <= 0:
        return 0.0
    if eps0 < 0 or eps_total < 0:
        raise InvalidParameter("ε must be non-negative")
    hs_terms = []
    if eps0 > 0:
        log_norm = k * (eps0 + math.log1p(math.exp(-eps0)))  # k ln(1 + e^ε0)
        for l in range(k + 1):
            gap = (k - 2 * l) * eps0  # ln of the likelihood ratio of an outcome with l "flips"
            if gap <= eps_total:
                break
            log_binom = math.lgamma(k + 1) - math.lgamma(l + 1) - math.lgamma(k - l + 1)
            log_term = log_binom + (k - l) * eps0 - log_norm + math.log(-math.expm1(eps_total - gap))
            hs_terms.append(math.exp(log_term))
    hs = min(1.0, math.fsum(hs_terms))
    if hs >= 1.0:
        return 1.0
    # 1 - (1-δ0)^k (1-H), computed without cancellation
    return -math.expm1(k * math.log1p(-delta0) + math.log1p(-hs)) if delta0 < 1 else 1.0


@lru_cache(maxsize=8192)
def kov_epsilon(k: int, eps0: float, delta0: float, delta_total: float) -> float | None:
    """The smallest ε (bisection, rounded up) with kov_delta(k, ε0, δ0, ε) ≤ delta_total, or None
    if even ε = kε0 needs more δ than delta_total (then no ε works: δ ≥ 1-(1-δ0)^k)."""
    if k <= 0:
        return 0.0
    hi = k * eps0
    if kov_delta(k, eps0, delta0, hi) > delta_total:
        return None
    lo = 0.0
    if kov_delta(k, eps0, delta0, lo) <= delta_total:
        return 0.0
    for _ in range(100):
        mid = (lo + hi) / 2.0
        if mid <= lo or mid >= hi:
            break
        if kov_delta(k, eps0, delta0, mid) <= delta_total:
            hi = mid
        else:
            lo = mid
    return hi


def advanced_filter_epsilon(sum_sq: float, delta_prime: float) -> float:
    """The ε of the advanced-composition filter for Σ ε_j² = sum_sq at tail probability δ':
    ½ Σε_j² + √(2 ln(1/δ') Σε_j²). Whitehouse, Ramdas, Rogers & Wu 2023 show this is a valid
    privacy filter (adaptive ε_j, (ε_j, δ_j)-DP mechanisms, total (ε, δ' + δ'') when Σδ_j ≤ δ'').
    The same number is ρ + 2√(ρ ln(1/δ')) for ρ = Σ ε_j²/2 (pure ε-DP is ε²/2-zCDP, Bun & Steinke
    Prop 1.4, composed by a zCDP filter and converted by their Prop 1.3), a second route to it."""
    if sum_sq <= 0:
        return 0.0
    return 0.5 * sum_sq + math.sqrt(2.0 * math.log(1.0 / delta_prime) * sum_sq)


def gaussian_paper_k(gamma: float, n: int, delta: float) -> float:
    """k = γ / (2√(n ln(1/δ))) of the paper's Thm 5 (with γ = ε/2 this is Cor 2's ε/(4√(n ln(1/δ))))."""
    return gamma / (2.0 * math.sqrt(n * math.log(1.0 / delta)))




def homogeneous_bounds(k: int, eps0: float, delta0: float, delta: float) -> dict[str, float]:
    """ε of the k-fold composition of (ε0, δ0)-DP mechanisms at total δ, for each bound that is
    valid for it (missing key: the bound cannot reach δ). Used by the adaptive accountant."""
    out: dict[str, float] = {}
    if k * delta0 <= delta:
        out["basic (Dwork & Roth Thm 3.16)"] = k * eps0
    if delta - k * delta0 > 0:
        out["advanced (Dwork & Roth Thm 3.20)"] = dr_advanced_epsilon(k, eps0, delta - k * delta0)
    dt = 1.0 - (1.0 - delta) / (1.0 - delta0) ** k if delta0 < 1 else 0.0
    if dt > 0:
        a, b = kov_34_epsilons(k, eps0, min(dt, 1.0))
        out["Kairouz et al. Thm 3.4 (ln(e + √(kε²)/δ̃))"] = a
        out["Kairouz et al. Thm 3.4 (ln(1/δ̃))"] = b
    e = kov_epsilon(k, eps0, delta0, delta)
    if e is not None:
        out["optimal (Kairouz et al. Thm 3.3)"] = e
    return out
