"""Confidence intervals for a released mean: the sampling part of biswal_thesis_dp_foundations.md
§5.7 and the clamp to the release range. Public parameters only (post-processing)."""
from __future__ import annotations

import math

from dpch import calibration as cal
from dpch.errors import InvalidParameter


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
