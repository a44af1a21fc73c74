"""What a release costs: the typed currency between the planner, the ledger and the accountants.

A query's plan produces one `MechanismCost` per noisy value it releases (a noisy count, a noisy
sum, a partition-selection threshold test, ...). The ledger charges the whole `PrivacyCost`
atomically; each accountant reads the fields its theorem needs:
- pure-ε filters (the paper, Thm 3) need `sensitivity` and `scale` (S(f)/p) or `epsilon`;
- (ε, δ) composition needs `epsilon` and `delta`;
- the paper's Gaussian filter (Thm 5) needs `sensitivity` and `scale` (S(f)/σ);
- zCDP needs `rho`.
"""
from __future__ import annotations

from dataclasses import dataclass, field


def _cached_hash(obj, fields: tuple) -> int:
    """Hash of an immutable cost, computed once per object: the accountants' lru caches hash every
    recorded cost on every charge (same value as hashing the fields each time)."""
    h = obj.__dict__.get("_hash")
    if h is None:
        h = hash(fields)
        object.__setattr__(obj, "_hash", h)
    return h


@dataclass(frozen=True)
class MechanismCost:
    """One noisy release. `kind` is "laplace" (scale = b) or "gaussian" (scale = σ), or
    "threshold" for private partition selection (charged as (epsilon, delta)), or "exponential"
    for quantiles by the exponential mechanism (pure epsilon; scale = its temperature in rows)."""

    kind: str
    sensitivity: float  # L1 for Laplace, L2 for Gaussian, including the grid term of docs/NOISE.md
    scale: float
    epsilon: float  # the pure/approximate ε this release satisfies on its own
    delta: float = 0.0
    rho: float | None = None  # zCDP cost, Gaussian only: sensitivity² / (2 scale²)
    label: str = ""  # e.g. "SUM(amount)"; never a data value
    # Output DP (odp_privacy_accounting.md, Def. 2, Alg. 1 line 6): the values E(P_k) of the ODP
    # partition this mechanism declares *before* it runs. Empty = the trivial partition (Lemma 3):
    # no a posteriori refund is possible. Only read by `Ledger.settle`.
    odp_epsilons: tuple[float, ...] = ()

    def __hash__(self) -> int:
        return _cached_hash(self, (self.kind, self.sensitivity, self.scale, self.epsilon, self.delta, self.rho,
                                   self.label, self.odp_epsilons))


@dataclass(frozen=True)
class PrivacyCost:
    """The cost of one query: its mechanisms, composed by the accountant of the budget."""

    mechanisms: tuple[MechanismCost, ...] = field(default_factory=tuple)

    def __hash__(self) -> int:
        return _cached_hash(self, self.mechanisms)

    @property
    def epsilon(self) -> float:
        """Basic composition of the parts (Dwork & Roth Thm 3.16)."""
        return sum(m.epsilon for m in self.mechanisms)

    @property
    def delta(self) -> float:
        return sum(m.delta for m in self.mechanisms)

    @property
    def rho(self) -> float | None:
        """zCDP composes additively (Bun & Steinke 2016, Lemma 2.3); None if any part is not Gaussian."""
        if not self.mechanisms or any(m.rho is None for m in self.mechanisms):
            return None
        return sum(m.rho for m in self.mechanisms)  # type: ignore[misc]
