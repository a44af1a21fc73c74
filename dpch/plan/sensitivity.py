"""Sensitivity of a quantity in grid units from the contribution bounds (dpch.plan's docstring,
point 4; docs/CONTROLLER.md, "Sensitivity")."""
from __future__ import annotations

import math

from .model import Bounding


def row_sensitivity(lo_u: int, hi_u: int, b: Bounding, grouped: bool) -> tuple[float, float]:
    """(L1, L2) in units of a per-group sum of per-row contributions in [lo_u, hi_u]."""
    B = max(abs(lo_u), abs(hi_u), 0)
    k = b.k if grouped else 1
    C = b.rows_per_group
    M_eff = min(b.max_rows, k * C)
    l1 = float(M_eff * B)
    q = min(k, M_eff // C)
    rem = M_eff - q * C
    l2 = B * math.sqrt(q * C * C + rem * rem)
    if b.neighbour == "substitute":
        if not grouped:
            width = float(M_eff * (max(0, hi_u) - min(0, lo_u)))
            return width, width
        same_sign = lo_u >= 0 or hi_u <= 0
        return 2.0 * l1, (math.sqrt(2.0) if same_sign else 2.0) * l2
    return l1, l2


def unit_sensitivity(b: Bounding, grouped: bool) -> tuple[float, float]:
    """(L1, L2) of the per-group count of distinct units."""
    if not grouped:
        return 1.0, 1.0
    k = b.k
    if b.neighbour == "substitute":
        return 2.0 * k, math.sqrt(2.0 * k)
    return float(k), math.sqrt(k)
