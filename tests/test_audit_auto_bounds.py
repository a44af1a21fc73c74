"""Audit of the auto-bounds step (issue 29; dpch/plan/profile.py, dpch/unit_profile.py).

What runs: a Python mirror of the released histogram of rows per unit (one count of units per
√2-grid bucket, dpch.plan.profile.bucket_of) with the noise of the SQL path itself: the compiled
kernel ``dpch._noise.laplace_release_int`` is the implementation of the ``dpch_laplace_int`` UDF
that histograms_sql calls, at the scale of ``ProfileSpec.histogram_mechanism()``
(``LaplaceMechanism.calibrated``, integer). The engine is not used: one audit needs thousands of
runs per side, and the SQL's counts are checked against the same definition, noise off, in
tests/attacks/test_auto_bounds_dd.py. The chosen bound M is the real post-processing
(``tail_model`` and ``choose``) of each noisy histogram.

Audited, at the declared ε of the histogram, on D (40 units of 1-6 rows and one of 60 rows) and D′:
- (a) the released histogram, add/remove (D′ without the heavy unit; L1 1) and substitution (the
  heavy unit's rows replaced by one row; calibrated at L1 2);
- (b) the chosen bound M, add/remove: must pass (post-processing of (a));
- the broken fixture tests/fixtures_broken.py::broken_auto_bound_from_true_max (M from the
  un-noised counts) must be flagged.

Sample sizes. Correct mechanisms: each audit runs at confidence 1 − α, α = 1e-8, so a correct
(ε-DP) mechanism is flagged with probability at most α (dpch/audit/analysis.py: held-out
Clopper–Pearson certificates, union bound over the methods); three such audits here: < 3e-8 < 1e-6,
whatever the sample size, which then sets the power only (6 000 per side as in
tests/test_audit_python.py). Broken fixture: its output is deterministic, M = 64 on D and M = 6 on
D′, so every selected event separates the sides perfectly; with 1 000 held-out samples per side the
certificate's lower bound is about ln(1000 / ln(6/α)) ≈ 3.9 > 1 (one-sided CP bound at α/6: p_D′ ≤
1 − (α/6)^(1/1000) ≈ 0.021, p_D = 1), with no randomness left to fail: 2 000 samples per side.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

import fixtures_broken as fx
from dpch.audit import audit, audit_samplers
from dpch.mechanisms import LaplaceMechanism
from dpch.plan.profile import GRID, Histogram, bucket_of, choose, tail_model

_noise = pytest.importorskip("dpch._noise")

ALPHA = 1e-8
CONF = 1 - ALPHA
EPS = 1.0  # the histogram's ε (auto_share·ε of a query at ε = 10 with the default share 0.1)
HEAVY = 40  # the heavy unit's id


@pytest.fixture(scope="module")
def data() -> pd.DataFrame:
    rng = np.random.default_rng(29)
    sizes = list(rng.integers(1, 7, HEAVY)) + [60]
    users = np.repeat(np.arange(HEAVY + 1), sizes)
    return pd.DataFrame({"user": users, "x": rng.uniform(0, 100, len(users)).round(2)})


def _counts(df: pd.DataFrame) -> np.ndarray:
    out = np.zeros(len(GRID), dtype=np.int64)
    for c in df.groupby("user").size():
        out[bucket_of(int(c))] += 1
    return out


def released_histogram(eps: float, sensitivity: int):
    """The auto-bounds histogram of rows per unit as released: every bucket, discrete Laplace of the
    calibrated scale from the UDF's kernel."""
    scale = LaplaceMechanism.calibrated(sensitivity, eps, integer=True).scale

    def mechanism(df, n):
        return _noise.laplace_release_int(np.tile(_counts(df), n), scale).reshape(n, len(GRID))
    mechanism.__name__ = f"auto_bounds_histogram(eps={eps}, L1={sensitivity})"
    mechanism.scale = scale
    return mechanism


def chosen_bound(eps: float, plan_eps: float = 9.0):
    """M as the controller chooses it from each released histogram (post-processing); the noise
    term is the sd of a count of sensitivity M at the plan's ε (public)."""
    hist = released_histogram(eps, 1)

    def mechanism(df, n):
        return np.array([choose("max_rows_per_unit", tail_model(Histogram(tuple(map(float, row)), hist.scale)),
                                lambda m: math.sqrt(2.0) * m / plan_eps).value for row in hist(df, n)], dtype=float)
    mechanism.__name__ = f"auto_bounds_chosen_M(eps={eps})"
    return mechanism


def _heavy_row(df) -> int:
    return int(df.index[df["user"] == HEAVY][0])


def test_histogram_add_remove_passes(data):
    r = audit(released_histogram(EPS, 1), data=data, epsilon=EPS, neighbour="remove-unit", unit_column="user",
              where=_heavy_row(data), samples=6000, confidence=CONF)
    assert r.verdict == "consistent", r.text()


def test_histogram_substitution_passes(data):
    """Substitution moves the unit between buckets (L1 2): the release is calibrated at 2."""
    mech = released_histogram(EPS, 2)
    other = data[data["user"] != HEAVY]
    other = pd.concat([other, pd.DataFrame({"user": [HEAVY], "x": [1.0]})], ignore_index=True)
    r = audit_samplers(lambda n: mech(data, n), lambda n: mech(other, n), epsilon=EPS, samples=6000,
                       confidence=CONF)
    assert r.verdict == "consistent", r.text()


def test_chosen_bound_passes(data):
    mech = chosen_bound(EPS)
    r = audit(mech, data=data, epsilon=EPS, neighbour="remove-unit", unit_column="user", where=_heavy_row(data),
              samples=6000, confidence=CONF)
    assert r.verdict == "consistent", r.text()


def test_bound_from_the_true_counts_is_flagged(data):
    mech = fx.broken_auto_bound_from_true_max(EPS)
    assert mech(data, 1)[0] == 64 and mech(data[data["user"] != HEAVY], 1)[0] == 6  # the docstring's numbers
    r = audit(mech, data=data, epsilon=EPS, neighbour="remove-unit", unit_column="user", where=_heavy_row(data),
              samples=2000, confidence=CONF)
    assert r.verdict == "VIOLATION", r.text()
    assert r.epsilon_lb > 3 * EPS, r.text()
