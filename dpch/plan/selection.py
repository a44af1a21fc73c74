"""Private partition selection (dpch.plan's docstring, point 7): the release threshold on a
group's noisy count of distinct units, and the probability that a group passes it."""
from __future__ import annotations

import math

from .. import calibration as cal

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
