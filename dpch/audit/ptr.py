"""Audit of propose-test-release (dpch.ptr) on neighbouring datasets, overall and per output-DP
class (docs/AUDIT.md, docs/PTR.md "Audit").

``audit_ptr(db, D, D′, statistic, column, epsilon, delta, ...)`` runs the same one-stage PTR
statistic (the IQR, or the median / trimmed mean with a given ``bound``) many times on D and on D′,
and certifies, with the auditor's Clopper–Pearson statistics (dpch.audit.stats):

- **overall**: ε_LB over events of outputs (⊥, or a real value), against the run's (ε, δ):
  ε_LB = ln((p̲ − δ)/p̄) (an (ε, δ)-DP mechanism allows P(S | D) ≤ e^ε P(S | D′) + δ);
- **class ⊥**: the only event inside it, {⊥}, against E(⊥) with δ = 0 (Def. 9 condition 2 for a
  PTR function: the ⊥ branch is ε-DP; Lemma 10 for M_IQR: 2ε_u, δ = 0);
- **class released**: events inside the released outputs (all of them, or value > t, or value ≤ t
  for thresholds t at quantiles of the selection half), against E(released) = sup E with δ.
The claims are read from the run's declared ODP cells (``PtrRun.stages()``: what the ledger
settles), so a run class that under-declares its ⊥ cell is caught by the ⊥ class.

Events are chosen on one half of the samples (the best by ``stats.selection_epsilon``, each
direction) and certified on the other half; 3 classes × 2 directions = 6 certificates, each at
α/6, so a correct mechanism is reported as a violation with probability ≤ α = 1 − confidence.

**Samples (fast path).** ``PtrRun.fast_sql(n)``: the run's own SQL (statistics once, then the noisy
tests and releases) with its noise level over ``numbers(n)``, one query per dataset. D′ is read
through D's plan (catalog entry, secret salt), so both sides bound each unit's rows the same way:
the neighbouring pair the mechanism's guarantee is about. The run class is a parameter: the broken
fixtures (tests/fixtures_broken.py) override its noisy test.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .stats import epsilon_lower_bound, selection_epsilon

__all__ = ["PtrAudit", "PtrCertificate", "audit_ptr", "sample_ptr"]

THRESHOLDS = 64  # candidate thresholds t per released-class search


def _run_cls(run_cls):
    if run_cls is None:
        from ..ptr import PtrRun
        return PtrRun
    return run_cls


def sample_ptr(db, table: str, statistic: str, column: str, epsilon: float, delta: float, n: int, *,
               read: str | None = None, run_cls=None, **kw) -> np.ndarray:
    """n outputs of the run on ``table`` (or on ``read`` through ``table``'s plan): a float array,
    NaN for ⊥ (values in the column's units)."""
    from ..catalog import quote_ident

    run = _run_cls(run_cls)(db, statistic, table, column, epsilon, delta, **kw)
    src = None if read is None else ".".join(quote_ident(p) for p in read.split("."))
    sql, interval = run.fast_sql(int(n), read=src)
    df = db.backend.query_df(sql)
    out = np.full(len(df), np.nan)
    released = (df["branch"].to_numpy() != 0) & df["value"].notna().to_numpy()
    vals = df["value"].to_numpy(dtype=float, na_value=np.nan)
    out[released] = [run.to_value(float(v), interval) for v in vals[released]]
    return out


def _events(sel_a: np.ndarray, sel_b: np.ndarray, cls: str) -> list[tuple[str, float]]:
    if cls == "bottom":
        return [("bottom", math.nan)]
    pooled = np.concatenate([sel_a[~np.isnan(sel_a)], sel_b[~np.isnan(sel_b)]])
    out = [("released", math.nan)]
    if len(pooled):
        for t in np.unique(np.quantile(pooled, np.linspace(0.0, 1.0, THRESHOLDS))):
            out += [("gt", float(t)), ("le", float(t))]
    return out


def _hits(x: np.ndarray, event: tuple[str, float]) -> int:
    kind, t = event
    if kind == "bottom":
        return int(np.isnan(x).sum())
    rel = x[~np.isnan(x)]
    if kind == "released":
        return len(rel)
    return int((rel > t).sum() if kind == "gt" else (rel <= t).sum())


@dataclass(frozen=True)
class PtrCertificate:
    """One certified event: ``cls`` ("overall", "bottom", "released"), direction "D>D′" or
    "D′>D", the event, the certified ε_LB and the claim it is checked against."""

    cls: str
    direction: str
    event: tuple[str, float]
    epsilon_lb: float
    claim: float
    delta: float

    @property
    def violation(self) -> bool:
        return self.epsilon_lb > self.claim

    def describe(self) -> str:
        kind, t = self.event
        ev = kind if math.isnan(t) else f"released and value {'>' if kind == 'gt' else '≤'} {t:.6g}"
        return (f"{self.cls:8s} {self.direction}: ε_LB = {self.epsilon_lb:.4f} vs claim {self.claim:.4f} "
                f"(δ {self.delta:g}) on {{{ev}}}" + ("  VIOLATION" if self.violation else ""))


@dataclass(frozen=True)
class PtrAudit:
    statistic: str
    epsilon: float
    delta: float
    claims: dict  # class -> (ε, δ) claimed
    certificates: tuple[PtrCertificate, ...]
    released_fraction: tuple[float, float]  # P(released) on D, on D′ (all samples)
    samples: int
    extra: dict = field(default_factory=dict)

    @property
    def violation(self) -> bool:
        return any(c.violation for c in self.certificates)

    @property
    def epsilon_lb(self) -> float:
        return max((c.epsilon_lb for c in self.certificates if c.cls == "overall"), default=0.0)

    def summary(self) -> str:
        lines = [f"PTR audit of {self.statistic}: ε = {self.epsilon:g}, δ = {self.delta:g}, {self.samples} samples per "
                 f"dataset; released on D {self.released_fraction[0]:.4f}, on D′ {self.released_fraction[1]:.4f}"]
        lines += ["  " + c.describe() for c in self.certificates]
        lines.append("VIOLATION" if self.violation else "no violation found")
        return "\n".join(lines)


def audit_ptr(db, table_d: str, table_dprime: str, statistic: str, column: str, epsilon: float, delta: float, *,
              samples: int = 20_000, confidence: float = 1 - 1e-6, run_cls=None, **kw) -> PtrAudit:
    """Audit one PTR statistic on (D, D′) (module docstring). D′ is read through D's plan."""
    run = _run_cls(run_cls)(db, statistic, table_d, column, epsilon, delta, **kw)
    (stage,) = run.stages()
    claims = {"overall": (max(stage.cells), stage.delta), "bottom": (stage.cells[-2], 0.0),
              "released": (stage.cells[-1], stage.delta)}
    a = sample_ptr(db, table_d, statistic, column, epsilon, delta, samples, run_cls=run_cls, **kw)
    b = sample_ptr(db, table_d, statistic, column, epsilon, delta, samples, read=table_dprime, run_cls=run_cls, **kw)
    h = samples // 2
    alpha = (1.0 - confidence) / 6.0
    certs = []
    for cls in ("overall", "bottom", "released"):
        eps_claim, dlt = claims[cls]
        for direction, (x, y) in (("D>D′", (a, b)), ("D′>D", (b, a))):
            sel_x, sel_y, cert_x, cert_y = x[:h], y[:h], x[h:], y[h:]
            events = _events(sel_x, sel_y, "bottom" if cls == "bottom" else "released")
            if cls == "overall":
                events = [("bottom", math.nan)] + events
            kx = np.array([_hits(sel_x, e) for e in events])
            ky = np.array([_hits(sel_y, e) for e in events])
            score = selection_epsilon(kx, len(sel_x), ky, len(sel_y), alpha, dlt)
            best = events[int(np.argmax(score))]
            _, _, lb = epsilon_lower_bound(_hits(cert_x, best), len(cert_x), _hits(cert_y, best), len(cert_y), alpha, dlt)
            certs.append(PtrCertificate(cls, direction, best, lb, eps_claim, dlt))
    rel = (float(np.mean(~np.isnan(a))), float(np.mean(~np.isnan(b))))
    return PtrAudit(statistic, float(epsilon), float(delta), claims, tuple(certs), rel, samples)
