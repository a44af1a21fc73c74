"""Propose-test-release: the public numbers of one run (thresholds, caps, bins, ODP cells).

Everything here is a function of public parameters only (ε, δ, the unit step K, the base of the
bins), never of data. The theorems are in docs/PTR.md; the sources are:

- the test: a statistic A of sensitivity 1 (in units of the dataset's neighbour relation) plus
  discrete Laplace noise Z ~ DLap(τ), P(Z = z) = (1-q)/(1+q)·q^|z|, q = e^{-1/τ}, τ ≥ 1/ε (the
  kernel's ``dpch_laplace_int``, CKS20). P(Z ≥ m) = q^m/(1+q) for m ≥ 0, and P(A(x)+Z ≥ T) ≤
  e^{1/τ}·P(A(x′)+Z ≥ T) when |A(x)−A(x′)| ≤ 1 (both branches of the test are ε-DP: Def. 9
  condition 2 of odp_privacy_accounting.md §4.2);
- the threshold T = a0 + m*, m* the least m ≥ 0 with q^m/(1+q) ≤ δ_test: a dataset whose
  statistic is "bad" (A ≤ a0: a neighbour may leave the proposed bin / exceed the proposed bound)
  passes with probability ≤ δ_test (Def. 9 condition 4; Dwork & Lei 2009 use the continuous
  analogue 1 + ln(1/δ)/ε);
- the ODP cells: a PTR function is ({C′, ⊥}, E, δ)-ODP with E(C′) = 2ε, E(⊥) = ε (§4.2, after
  Def. 9); M_IQR (two shifted discretisations) is with E(ℝ) = 3ε, E(⊥) = 2ε (Lemma 10).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import InvalidParameter
from ..mechanisms import LaplaceMechanism

# the cap margin: a statistic at its cap fails the test with probability ≤ e^{-CAP_MARGIN}/(1+q)
CAP_MARGIN = 21.0
BUCKETS = 1 << 16  # dpch.mechanisms.QUANTILE_BUCKETS: the histogram grid the controller builds


def dlap_tail(tau: float, m: int) -> float:
    """P(Z ≥ m) for Z ~ DLap(τ) and an integer m ≥ 0: q^m/(1+q), q = e^{-1/τ}."""
    q = math.exp(-1.0 / tau)
    return q ** m / (1.0 + q)


def pass_threshold(tau: float, delta_test: float, bad_at_most: int) -> int:
    """T = a0 + m*, m* the least integer m ≥ 0 with P(Z ≥ m) ≤ δ_test (module docstring): a
    statistic A ≤ a0 passes ``A + Z ≥ T`` with probability ≤ δ_test."""
    q = math.exp(-1.0 / tau)
    m = max(0, math.ceil(tau * math.log(1.0 / (delta_test * (1.0 + q)))))
    # float safety: step until the tail is really below δ_test, and back while the one before is
    while dlap_tail(tau, m) > delta_test:
        m += 1
    while m > 0 and dlap_tail(tau, m - 1) <= delta_test:
        m -= 1
    return bad_at_most + m


@dataclass(frozen=True)
class NoisyTest:
    """One noisy test ``A + DLap(τ) ≥ T`` at ε_test, δ_test; ``cap`` bounds the statistic that
    ClickHouse computes (min(A, cap) has sensitivity 1 too and the same bad set when cap > a0)."""

    epsilon: float
    delta: float
    bad_at_most: int
    mechanism: LaplaceMechanism
    tau: float
    threshold: int
    cap: int

    @classmethod
    def make(cls, epsilon: float, delta: float, bad_at_most: int) -> "NoisyTest":
        mech = LaplaceMechanism.calibrated(1.0, epsilon, integer=True)
        if mech.granularity != 1.0 or not mech.privacy_relation(1.0, epsilon):
            raise InvalidParameter("epsilon is too small for the noisy test (its noise scale exceeds 2^40)")
        tau = mech.noise_scale_units
        t = pass_threshold(tau, delta, bad_at_most)
        cap = t + math.ceil(CAP_MARGIN * tau) + 1
        return cls(float(epsilon), float(delta), int(bad_at_most), mech, tau, t, cap)

    def sql(self, statistic_sql: str) -> str:
        """``toInt64(A) + noise ≥ T`` (UInt8), the noise drawn inside ClickHouse."""
        return f"toUInt8({self.mechanism.sql(f'toInt64({statistic_sql})')} >= {self.threshold})"


def log_bins(base: float, offset: float, top: int = BUCKETS - 1) -> tuple[int, ...]:
    """The left edges of the log-scale bins of a non-negative integer gap (bucket units):
    {0} is a bin of its own (edge 1 always present), then [e_j, e_{j+1}) with
    e_j = ⌈base^{j+offset}⌉ (Dwork & Lei's discretisation of the scale; ``offset`` = 0 or 1/2 for
    M_IQR's two shifted discretisations). The bins of a value are ``#edges ≤ v``."""
    edges = [1]
    j = 0
    while True:
        e = math.ceil(base ** (j + offset))
        if e > top:
            break
        if e > edges[-1]:
            edges.append(e)
        j += 1
    return tuple(edges)


def log_bin_width(edges: tuple[int, ...], top: int = BUCKETS - 1) -> float:
    """max over bins [e_j, e_{j+1} − 1] (the last up to ``top``) of ln((e_{j+1} − 1)/e_j): the
    sensitivity of ln(gap) between two gaps in one bin (< ln base since e_{j+1} − 1 < base·e_j);
    1e-9 added for the float logs computed in ClickHouse (a few ulps of ln 65535)."""
    ends = list(edges[1:]) + [top + 1]
    w = max(math.log((hi - 1) / lo) for lo, hi in zip(edges, ends))
    return w + 1e-9


def ptr_cells(epsilon: float) -> tuple[float, float]:
    """(E(⊥), E(released)) = (ε, 2ε) of one (ε, δ)-PTR function (§4.2 after Def. 9)."""
    return (epsilon, 2.0 * epsilon)


def iqr_cells(epsilon: float) -> tuple[float, float]:
    """(E(⊥), E(released)) = (2ε, 3ε) of M_IQR (odp_privacy_accounting.md Lemma 10)."""
    return (2.0 * epsilon, 3.0 * epsilon)
