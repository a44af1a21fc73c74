"""The Gaussian mechanism on a vector through zCDP (dpch.plan's docstring, point 5): the
multivariate discrete Gaussian is L2²/(2σ²)-zCDP (CKS20 Thm 4) and ρ-zCDP implies (ε, δ)-DP with
the δ of CKS20 Cor. 13."""
from __future__ import annotations

import functools
import math

from .. import calibration as cal
from ..errors import InvalidParameter


def _zcdp_to_delta(rho: float, eps: float) -> float:
    """δ such that ρ-zCDP implies (ε, δ)-DP (CKS20 Cor. 13):
    δ = inf_{α>1} exp((α-1)(αρ-ε)) (1-1/α)^(α-1) / α. Any α gives a valid bound; α is chosen
    near the minimiser, the root of (2α-1)ρ - ε + ln(1-1/α) = 0 (increasing in α)."""
    if rho <= 0:
        return 0.0

    def g(alpha: float) -> float:
        return (2 * alpha - 1) * rho - eps + math.log1p(-1 / alpha)

    lo, hi = 1.0 + 1e-12, max(2.0, (eps + rho) / (2 * rho) + 1.0)
    while g(hi) < 0:
        hi *= 2
    for _ in range(80):
        mid = (lo + hi) / 2
        if g(mid) < 0:
            lo = mid
        else:
            hi = mid
    alpha = hi
    log_delta = (alpha - 1) * (alpha * rho - eps) + (alpha - 1) * math.log1p(-1 / alpha) - math.log(alpha)
    return min(1.0, math.exp(log_delta))


@functools.lru_cache(maxsize=4096)
def _rho_max(eps: float, delta: float) -> float:
    """The largest ρ with δ(ρ, ε) <= δ (CKS20 Cor. 13; δ is increasing in ρ): bisection."""
    def ok(rho: float) -> bool:
        return _zcdp_to_delta(rho, eps) <= delta

    lo, hi = 0.0, eps
    while ok(hi):
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    if lo <= 0:
        raise InvalidParameter("no finite sigma reaches this privacy level")
    return lo


def vector_gaussian_sigma(l2: float, eps: float, delta: float, coords: int = 1) -> float:
    """σ for ``dpch_gaussian_int`` such that the discrete Gaussian on a vector with L2 sensitivity
    l2 (at most ``coords`` coordinates change) is (ε, δ)-DP via zCDP: ρ = d²/(2σ²) (CKS20 Thm 4),
    δ(ρ, ε) by CKS20 Cor. 13. When σ > 2^20 the kernel rounds values to the grid r = grid(σ, 20),
    which moves each changed coordinate by at most one more grid unit: d = l2 + r·sqrt(coords)."""
    rho = _rho_max(eps, delta)
    sigma = l2 / math.sqrt(2 * rho) * (1 + 1e-12)
    for _ in range(64):
        r = cal.granularity(sigma, cal.GAUSSIAN_GRID_BITS, True)
        if r == 1.0:
            return sigma
        need = (l2 + 2 * r * math.sqrt(coords)) / math.sqrt(2 * rho) * (1 + 1e-12)
        if need <= sigma and cal.granularity(need, cal.GAUSSIAN_GRID_BITS, True) <= r:
            return max(sigma, need)
        sigma = need
    raise InvalidParameter("no stable Gaussian sigma for this query")  # pragma: no cover
