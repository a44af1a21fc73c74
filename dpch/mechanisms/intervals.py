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


#: What the §5.7 population-mean interval in the result metadata is (docs/CONTROLLER.md).
POPULATION_MEAN_CI = ("biswal thesis §5.7 (Cor. 5.7.1 with the variance bound σ² <= (hi − lo)²/4 of a "
                      "value in [lo, hi] instead of a known σ²): the population mean of which the bounded "
                      "rows are a sample, noise part at level 1 − β/2 (union bound over the noisy sum and "
                      "count) plus z_(β/4)·σ/√n_lo with n_lo the lower end of the noisy count's interval "
                      "(normal approximation of the sample mean, as in the thesis)")


def population_mean_interval(mean_lo, mean_hi, n_lo, lo: float, hi: float, beta: float):
    """The §5.7 interval for a population mean μ from the noise interval [mean_lo, mean_hi] of the
    sample mean (level 1 − β/2) and a lower bound n_lo on the sample size that holds on the same
    event: [mean_lo − w, mean_hi + w], w = z_(β/4)·(hi − lo)/2/√n_lo, intersected with [lo, hi].

    Why it covers μ with probability >= 1 − β (up to the normal approximation of X̄, as in the
    thesis's Cor. 5.7.1): on the event A (the noise interval holds and n >= n_lo, probability
    >= 1 − β/2) and B (|X̄ − μ| <= z_(β/4)·σ/√n, probability ≈ 1 − β/2), σ <= (hi − lo)/2
    (Popoviciu's inequality) and n >= n_lo give μ ∈ the interval; P(A ∩ B) >= 1 − β by the union
    bound. Post-processing of released values and public bounds only (no privacy cost).
    Array arguments are taken elementwise (numpy)."""
    import numpy as np

    b = float(beta)
    if not 0.0 < b < 1.0:
        raise InvalidParameter("beta must be in (0, 1)")
    a, c = cal.check_bounds(lo, hi, "lo, hi")
    z = cal._normal_quantile_upper(b / 4.0)
    n = np.maximum(np.asarray(n_lo, dtype=float), 1.0)
    w = z * (c - a) / 2.0 / np.sqrt(n)
    return (np.clip(np.asarray(mean_lo, dtype=float) - w, a, c), np.clip(np.asarray(mean_hi, dtype=float) + w, a, c))
