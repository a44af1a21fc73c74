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

One module per family: ``base`` (PrivacyLoss, shared checks), ``laplace``, ``gaussian``,
``selection`` (exponential mechanism, quantiles, top-n), ``bounded_laplace``, ``mixed`` and
``block`` (the thesis mechanisms), ``intervals`` (§5.7 confidence intervals). Import from ``dpch.mechanisms``.
"""
from __future__ import annotations

from dpch.mechanisms.base import PrivacyLoss
from dpch.mechanisms.block import BlockDP1Mechanism, BlockDP2Mechanism
from dpch.mechanisms.bounded_laplace import (BL_FALLBACK_LOG2, BL_MAX_CANDIDATES, BL_MAX_UNITS,
                                             BoundedLaplaceMechanism, bl_candidates,
                                             bounded_grid_epsilon, bounded_laplace_candidates)
from dpch.mechanisms.gaussian import GaussianMechanism
from dpch.mechanisms.laplace import LaplaceMechanism
from dpch.mechanisms.mixed import MixedNoiseMechanism, thesis_mnm_threshold
from dpch.mechanisms.selection import (QUANTILE_BUCKETS, QUANTILE_SCALE, ExponentialMechanism,
                                       QuantileMechanism, TopKMechanism)

__all__ = ["PrivacyLoss", "LaplaceMechanism", "GaussianMechanism", "ExponentialMechanism",
           "QuantileMechanism", "TopKMechanism", "BoundedLaplaceMechanism", "MixedNoiseMechanism",
           "QUANTILE_BUCKETS", "QUANTILE_SCALE", "BL_FALLBACK_LOG2", "BL_MAX_CANDIDATES",
           "BL_MAX_UNITS", "bl_candidates", "bounded_grid_epsilon", "bounded_laplace_candidates",
           "thesis_mnm_threshold", "BlockDP1Mechanism", "BlockDP2Mechanism"]
