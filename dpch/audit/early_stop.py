"""Audit of early stopping (``db.refine``, dpch.early_stop) on neighbouring datasets, overall and per
output-DP class (docs/AUDIT.md §12).

``audit_early_stop(db, D, D′, sql, epsilon_per_step, max_steps, target_relative=…)`` runs the same
refinement (odp_privacy_accounting.md §5, Alg. 3 M_iter with stopping points k = 1..k_n) many times
on D and on D′ and certifies, with the auditor's Clopper–Pearson statistics (dpch.audit.stats):

- **overall**: ε_LB over events of released sequences, against the ε refine reserves before a
  run (read from the ledger by the probe below; sup E = k_n·ε_step, Lemma 4);
- **per class** P_k (sequences of length k: the run stopped after step k), over events inside
  P_k, against the ε that refine *settles* for k steps, read from the ledger by a settlement probe
  (a genuine refine whose ``on_step`` raises after step k: refine settles to the steps run, the
  same ``_settle`` call as after a normal stop), so the claim is what the ledger is told, not a
  formula. The ODP claim (Lemma 11, Def. 2) is P(S | D) ≤ e^{E(P_k)} P(S | D′) for S ⊆ P_k: a
  refinement that settles less than it ran is caught by its class even when sup E holds.

**Events.** A run releases y_1..y_k (integers: the bounded value plus discrete Laplace noise, in
grid units). Each run is reduced to the atom (k, c), c = #{i ≤ k : y_i ≤ t} for a cut t; events
are Neyman–Pearson unions of atoms (ranked by their empirical ratio on the selection half, best
prefix by ``stats.selection_epsilon``), and the cut is chosen from quantiles of the selection
half's measurements, per certificate; the event is certified on the other half
(``stats.epsilon_lower_bound``). The reduction is post-processing, so the bound is valid for the
released sequences. When D and D′ are one unit apart (bounded values q and q + 1, same τ) the
privacy loss of a sequence is (#{y_i ≤ q} − #{y_i > q})/τ (the stopping rule is a function of the
released values, so it cancels from the ratio): c at the cut t = q is the likelihood-ratio
statistic and {(k, k)} has loss exactly k/τ ≈ k·ε_step, the class's claim. With k_n + 1
certificates each at α/(k_n + 1), a correct refinement is reported as a violation with
probability ≤ α = 1 − confidence.

**Fast path.** A genuine refine costs a ledger charge, a plan, two type-check probes and one query
per step (≈ 50–100 ms). Most samples therefore come from one ClickHouse query per dataset that
draws the k_n measurements of N runs at once: per row, y_j = (the bounded value, by refine's own
rewriter SQL, ``early_stop._prepare``) + ``dpch_laplace_int`` noise with refine's own mechanism
(the one ``_prepare`` calibrates, so a fixture that changes it changes the fast path too); one
independent draw per row and step (the value argument differs per step and is a per-row column,
so no call is folded or merged). The stopping rule is applied afterwards in numpy with the
half-widths H_k refine uses (``dlap_mean_halfwidth`` at level 1 − α/k_n); every fast run of a
prefix of ``check_rows`` rows is replayed through ``early_stop.run_steps`` (the real loop) and must
stop at the same step, or the audit raises. Drawing all k_n measurements and stopping afterwards
has the law of a loop that stops: the measurements are independent of the rule. Then
``real_runs`` genuine refines per dataset (ledger charge and settlement included) are compared
with the fast path by a χ² test of homogeneity on the atoms (``fast_path_p_value``; the audit
flags ``fast_path_agrees`` at p ≥ 1e-4), and each real run's charged ε must equal its class's
probed claim (``real_charged_ok``).

Budget: the fast path's preparation charges nothing; real runs and settlement probes charge the
dataset's ledger (``build_early_stop_design`` gives the audit tables a large odp budget).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .stats import epsilon_lower_bound
from .svt import SvtAudit, SvtCertificate

__all__ = ["EarlyStopAudit", "EarlyStopCertificate", "EarlyStopDesign", "audit_early_stop",
           "build_early_stop_design", "early_stop_design", "sample_runs_fast", "sample_runs_real",
           "settled_epsilons", "certify_runs"]

CUT_QUANTILES = tuple(i / 20 for i in range(1, 20))


class _Probe(Exception):
    """Raised by the settlement probe's on_step after the wanted step."""


def _params(epsilon_per_step, max_steps, target_halfwidth, target_relative, confidence):
    from ..early_stop import _check_params
    return _check_params(epsilon_per_step, max_steps, target_halfwidth, target_relative, confidence)


# ------------------------------------------------------------------------------------------------
# Sampling
# ------------------------------------------------------------------------------------------------
def _stops(ys: np.ndarray, kn: int, grid: float, halfwidths: Sequence[float], target_halfwidth, target_relative
           ) -> np.ndarray:
    """The step each row stops at (run_steps' rule, vectorised): the first k with H_k ≤ target_halfwidth
    or H_k ≤ target_relative·|estimate_k|, else k_n."""
    k = np.arange(1, kn + 1)
    est = grid * np.cumsum(ys[:, :kn], axis=1) / k
    h = np.asarray(halfwidths, dtype=float)
    done = np.zeros(est.shape, dtype=bool)
    if target_halfwidth is not None:
        done |= (h <= target_halfwidth)[None, :]
    if target_relative is not None:
        done |= h[None, :] <= target_relative * np.abs(est)
    done[:, -1] = True
    return np.argmax(done, axis=1) + 1


def sample_runs_fast(db, dataset: str, sql: str, epsilon_per_step: float, max_steps: int, n: int, *,
                     target_halfwidth: float | None = None, target_relative: float | None = None,
                     confidence: float = 0.95, options: dict | None = None, chunk: int = 200_000,
                     check_rows: int = 300) -> tuple[np.ndarray, np.ndarray]:
    """n runs' measurements (grid units, an n × k_n array, columns past a run's stop unused) and
    stopping steps, by one ClickHouse query per chunk (module docstring). Raises RuntimeError if
    the real loop (early_stop.run_steps) stops any of the first ``check_rows`` runs elsewhere."""
    from .. import early_stop as es
    from ..mechanisms.block import dlap_mean_halfwidth
    from ..typecheck import with_settings

    eps, kn, th, tr, conf = _params(epsilon_per_step, max_steps, target_halfwidth, target_relative, confidence)
    _, rw, mech, q = es._prepare(db, sql.format(table=dataset), eps, dict(options or {}))
    g = q.grid
    level = 1.0 - (1.0 - conf) / kn  # refine's Bonferroni level over the k_n stopping points
    halfwidths = [g * dlap_mean_halfwidth(mech, k, level) for k in range(1, kn + 1)]
    groups = rw._salted(rw.groups_sql())
    scalar = f"(SELECT toInt128({rw.plan.quantities[0].column}) FROM ({groups}))"

    def zero(j: int) -> str:  # a per-row 0, written differently per step: one independent draw each
        return f"toInt64(number * {j + 1} - number * {j + 1})"
    cols = ", ".join(f"toInt64({scalar} + toInt128({mech.sql(zero(j))})) AS y{j}" for j in range(kn))
    parts, done = [], 0
    while done < n:
        size = min(chunk, n - done)
        df = db.backend.query_df(with_settings(f"SELECT {cols} FROM numbers({size})"))
        parts.append(df[[f"y{j}" for j in range(kn)]].to_numpy(dtype=np.int64))
        done += size
    ys = np.vstack(parts)
    stops = _stops(ys, kn, g, halfwidths, th, tr)
    for row, stop in zip(ys[:check_rows], stops[:check_rows]):
        released: list[int] = []
        it = iter(row.tolist())
        es.run_steps(lambda k: next(it), released, kn, g, mech, level, th, tr)
        if len(released) != stop:
            raise RuntimeError("early-stop audit: the fast path's stopping rule disagrees with run_steps")
    return ys, stops


def sample_runs_real(db, dataset: str, sql: str, epsilon_per_step: float, max_steps: int, n: int, *,
                     target_halfwidth: float | None = None, target_relative: float | None = None,
                     confidence: float = 0.95, options: dict | None = None
                     ) -> tuple[np.ndarray, np.ndarray, list[float]]:
    """n genuine refines (ledger charge, plan, type check, settlement): measurements in grid units
    (n × k_n, padded with 0), stopping steps, ε charged."""
    from .. import early_stop as es

    ys = np.zeros((n, max_steps), dtype=np.int64)
    stops = np.zeros(n, dtype=np.int64)
    charged = []
    grid = es._prepare(db, sql.format(table=dataset), float(epsilon_per_step), dict(options or {}))[3].grid
    for i in range(n):
        r = es.refine(db, sql.format(table=dataset), epsilon_per_step=epsilon_per_step, max_steps=max_steps,
                      target_halfwidth=target_halfwidth, target_relative=target_relative, confidence=confidence,
                      **dict(options or {}))
        ys[i, :r.steps] = [round(m / grid) for m in r.measurements]
        stops[i] = r.steps
        charged.append(float(r.epsilon_charged))
    return ys, stops, charged


def settled_epsilons(db, dataset: str, sql: str, epsilon_per_step: float, max_steps: int, *,
                     confidence: float = 0.95, options: dict | None = None) -> tuple[float, ...]:
    """The ε refine settles after k = 1..k_n steps (settlement probe: a genuine refine with a
    target it cannot reach whose on_step raises after step k; refine settles to the steps run and
    the probe reads the charge's effective ε back from the ledger)."""
    return _probe(db, dataset, sql, epsilon_per_step, max_steps, confidence, options)[0]


def _probe(db, dataset, sql, epsilon_per_step, max_steps, confidence, options) -> tuple[tuple[float, ...], float]:
    """(settled ε per k = 1..k_n, the largest ε reserved before a run): settled_epsilons."""
    from .. import early_stop as es

    out, reserved = [], 0.0
    for k in range(1, max_steps + 1):
        def stop_after(step, k=k):
            if step.step >= k:
                raise _Probe()
        try:
            es.refine(db, sql.format(table=dataset), epsilon_per_step=epsilon_per_step, max_steps=max_steps,
                      target_halfwidth=1e-300, confidence=confidence, on_step=stop_after, **dict(options or {}))
        except _Probe:
            pass
        else:
            raise RuntimeError("settlement probe: refine did not run the probe's on_step")
        last = db.ledger.history(db.analyst, db.catalog.qualify(dataset))[-1]
        out.append(float(last.effective_epsilon))
        reserved = max(reserved, float(last.epsilon))
    return tuple(out), reserved


# ------------------------------------------------------------------------------------------------
# Certification on atoms (k, c)
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EarlyStopCertificate(SvtCertificate):
    """One certified event: a union of atoms (k, c) (inside the class k = ``cls`` unless None) at
    the cut ``cut`` (c = measurements ≤ cut, grid units). The SVT audit's certificate (its fields
    and ``violation``) with atoms (k, c) as the event's elements."""

    cut: int = 0

    def describe(self) -> str:
        what = "overall" if self.cls is None else f"class k = {self.cls}"
        ev = " ∪ ".join(f"(k={k}, c={c})" for k, c in self.event[:6])
        more = f" (+{len(self.event) - 6} more)" if len(self.event) > 6 else ""
        return (f"{what}: ε_LB = {self.epsilon_lb:.3f} vs claimed {self.claimed:.3f} "
                f"{'VIOLATION' if self.violation else 'consistent'}; event {{{ev}{more}}} at cut {self.cut} "
                f"favours {self.favours} ({self.k_d}/{self.n} on D, {self.k_dprime}/{self.n} on D′)")


def _atom_counts(ys: np.ndarray, stops: np.ndarray, kn: int, cut: int) -> np.ndarray:
    """Counts of the atoms (k, c), indexed k·(k_n + 1) + c."""
    mask = np.arange(ys.shape[1])[None, :] < stops[:, None]
    c = ((ys <= cut) & mask).sum(axis=1)
    return np.bincount(stops * (kn + 1) + c, minlength=(kn + 1) ** 2)


def certify_runs(sel_d, sel_dp, cert_d, cert_dp, *, kn: int, claims: Sequence[float], epsilon: float,
                 alpha: float) -> list[EarlyStopCertificate]:
    """Overall and per-class certificates (module docstring). Each argument is (ys, stops); events
    and cuts are chosen on (sel_d, sel_dp), certified on (cert_d, cert_dp), each at α/(k_n + 1)."""
    from .svt import SELECTION_ALPHA, _choose

    m = kn + 1
    a_each = alpha / m
    a_sel = min(a_each, SELECTION_ALPHA)
    pooled = np.concatenate([sel_d[0][:, 0], sel_dp[0][:, 0]])
    cuts = sorted({int(v) for v in np.quantile(pooled, CUT_QUANTILES, method="lower")})
    n_sd, n_sdp = len(sel_d[1]), len(sel_dp[1])
    n_cd, n_cdp = len(cert_d[1]), len(cert_dp[1])
    out = []
    for cls in [None] + list(range(1, kn + 1)):
        idx = np.array([k * (kn + 1) + c for k in range(1, kn + 1) for c in range(k + 1)
                        if cls is None or k == cls], dtype=np.int64)
        claimed = epsilon if cls is None else claims[cls - 1]
        best = None
        for cut in cuts:
            sd, sdp = _atom_counts(*sel_d, kn, cut)[idx], _atom_counts(*sel_dp, kn, cut)[idx]
            for fav, ca, cb, na, nb in (("D", sd, sdp, n_sd, n_sdp), ("D′", sdp, sd, n_sdp, n_sd)):
                score, chosen = _choose(ca, cb, na, nb, a_sel)
                if best is None or score > best[0]:
                    best = (score, fav, cut, idx[chosen])
        _, fav, cut, ev = best
        kd = int(_atom_counts(*cert_d, kn, cut)[ev].sum())
        kdp = int(_atom_counts(*cert_dp, kn, cut)[ev].sum())
        if fav == "D":
            _, _, eps = epsilon_lower_bound(kd, n_cd, kdp, n_cdp, a_each)
        else:
            _, _, eps = epsilon_lower_bound(kdp, n_cdp, kd, n_cd, a_each)
        atoms = tuple((int(a) // (kn + 1), int(a) % (kn + 1)) for a in ev)
        out.append(EarlyStopCertificate(cls, claimed, atoms, fav, kd, kdp, n_cd, eps, a_each, cut=cut))
    return out


# ------------------------------------------------------------------------------------------------
# The audit
# ------------------------------------------------------------------------------------------------
@dataclass
class EarlyStopAudit:
    epsilon_per_step: float
    max_steps: int
    claims: tuple[float, ...]          # settled ε per class k = 1..k_n (settlement probe)
    reserved: float                    # ε reserved before a run (the overall claim)
    confidence: float
    samples: int
    certificates: list[EarlyStopCertificate]
    real_runs: int = 0
    fast_path_p_value: float | None = None
    real_charged_ok: bool = True       # every real run was charged its class's probed ε
    class_frequencies: tuple[float, ...] = ()  # fraction of D runs per class
    timings: dict[str, float] = field(default_factory=dict)

    # the views on the certificates are the SVT audit's (same fields: certificates[0] overall, then
    # one per class; fast_path_p_value against AGREEMENT_P)
    overall = SvtAudit.overall
    per_class = SvtAudit.per_class
    epsilon_lb = SvtAudit.epsilon_lb
    overall_violation = SvtAudit.overall_violation
    class_violation = SvtAudit.class_violation
    violation = SvtAudit.violation
    fast_path_agrees = SvtAudit.fast_path_agrees

    def summary(self) -> str:
        lines = [f"early-stopping audit: ε_step = {self.epsilon_per_step:g}, k_n = {self.max_steps}, "
                 f"{self.samples} runs per side, confidence {self.confidence}; reserved ε {self.reserved:.3f}; "
                 f"settled ε per class: "
                 + ", ".join(f"{e:.3f}" for e in self.claims)
                 + "; runs per class on D: " + ", ".join(f"{f:.3f}" for f in self.class_frequencies)]
        lines += ["  " + c.describe() for c in self.certificates]
        if self.fast_path_p_value is not None:
            lines.append(f"  fast path vs {self.real_runs} real runs per side: χ² p = {self.fast_path_p_value:.3g} "
                         f"({'agree' if self.fast_path_agrees else 'DISAGREE'}); real runs charged their "
                         f"class's ε: {self.real_charged_ok}")
        lines.append(f"  verdict: {'VIOLATION' if self.violation else 'consistent'}")
        return "\n".join(lines)


def _chi2_atoms(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray], kn: int, cut: int) -> float:
    from .svt import _chi2_p

    def atoms(ys, stops):
        mask = np.arange(ys.shape[1])[None, :] < stops[:, None]
        c = ((ys <= cut) & mask).sum(axis=1)
        return [(int(k), int(x)) for k, x in zip(stops, c)]
    return _chi2_p([atoms(*a), atoms(*b)])


def audit_early_stop(db, dataset_d: str, dataset_dprime: str, sql: str, epsilon_per_step: float,
                     max_steps: int, *, target_halfwidth: float | None = None,
                     target_relative: float | None = None, refine_confidence: float = 0.95,
                     samples: int = 100_000, real_runs: int = 30, confidence: float = 0.95,
                     options: dict | None = None, check_rows: int = 300) -> EarlyStopAudit:
    """Audit db.refine on D and D′ (module docstring). ``sql`` is a format string over {table};
    ``samples`` fast-path runs per side; ``real_runs`` genuine refines per side to check the fast
    path (0: skip). ``refine_confidence`` is refine's own ``confidence`` (its stopping rule's
    interval level), ``confidence`` the audit's."""
    if not 0 < confidence < 1:
        raise ValueError("confidence must be in (0, 1)")
    if samples < 16:
        raise ValueError("need at least 16 runs per side")
    kw = dict(target_halfwidth=target_halfwidth, target_relative=target_relative, confidence=refine_confidence,
              options=options)
    eps, kn, *_ = _params(epsilon_per_step, max_steps, target_halfwidth, target_relative, refine_confidence)
    t: dict[str, float] = {}
    t0 = time.perf_counter()
    claims, reserved = _probe(db, dataset_d, sql, eps, kn, refine_confidence, options)
    fast_d = sample_runs_fast(db, dataset_d, sql, eps, kn, samples, check_rows=check_rows, **kw)
    fast_dp = sample_runs_fast(db, dataset_dprime, sql, eps, kn, samples, check_rows=check_rows, **kw)
    t["sampling"] = time.perf_counter() - t0
    p_value, charged_ok = None, True
    if real_runs:
        t1 = time.perf_counter()
        real_d = sample_runs_real(db, dataset_d, sql, eps, kn, real_runs, **kw)
        real_dp = sample_runs_real(db, dataset_dprime, sql, eps, kn, real_runs, **kw)
        cut = int(np.median(np.concatenate([fast_d[0][:, 0], fast_dp[0][:, 0]])))
        p_value = min(_chi2_atoms(real_d[:2], fast_d, kn, cut), _chi2_atoms(real_dp[:2], fast_dp, kn, cut))
        charged_ok = all(abs(e - claims[int(k) - 1]) <= 1e-12
                         for k, e in zip(np.concatenate([real_d[1], real_dp[1]]), real_d[2] + real_dp[2]))
        t["real runs"] = time.perf_counter() - t1
    t2 = time.perf_counter()
    h_d, h_dp = samples // 2, samples // 2

    def half(x, a, b):
        return x[0][a:b], x[1][a:b]
    certs = certify_runs(half(fast_d, 0, h_d), half(fast_dp, 0, h_dp), half(fast_d, h_d, samples),
                         half(fast_dp, h_dp, samples), kn=kn, claims=claims, epsilon=reserved,
                         alpha=1.0 - confidence)
    t["analysis"] = time.perf_counter() - t2
    freq = tuple(float(np.mean(fast_d[1] == k)) for k in range(1, kn + 1))
    return EarlyStopAudit(eps, kn, claims, reserved, confidence, samples, certs, real_runs, p_value, charged_ok,
                          freq, t)


# ------------------------------------------------------------------------------------------------
# The design
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EarlyStopDesign:
    """COUNT(*) = ``count`` on D and ``count + shift`` on D′ (one row added or removed: row-level
    add/remove, Δ = 1), refined at ``epsilon_per_step`` for at most ``max_steps`` steps until the
    interval's half-width is at most ``target_relative``·|estimate| (a decision on the released
    measurements)."""

    count: int
    shift: int
    epsilon_per_step: float
    max_steps: int
    target_relative: float

    sql = "SELECT COUNT(*) FROM {table}"

    def counts(self) -> tuple[int, int]:
        return self.count, self.count + self.shift


def early_stop_design(epsilon_per_step: float = 0.5, max_steps: int = 3, confidence: float = 0.95
                      ) -> EarlyStopDesign:
    """The near-tight design (docs/AUDIT.md §12): the count sits at the step-1 stopping boundary
    H_1/target_relative, so that about half of the runs stop after one step and the decision to
    go on depends on the released y_1; D′ has one row fewer. target_relative = H_1/count with the
    count ≈ 5 noise scales, so later steps still stop with moderate probability."""
    from ..mechanisms import LaplaceMechanism
    from ..mechanisms.block import dlap_mean_halfwidth

    mech = LaplaceMechanism.calibrated(1, float(epsilon_per_step), integer=True)
    count = max(4, round(5 * mech.noise_scale_units))
    level = 1.0 - (1.0 - confidence) / max_steps
    h1 = dlap_mean_halfwidth(mech, 1, level)
    return EarlyStopDesign(count, -1, float(epsilon_per_step), int(max_steps), h1 / (count + 0.5))


def build_early_stop_design(db, design: EarlyStopDesign, database: str = "dpch_audit_early_stop",
                            budget: float = 1e9) -> tuple[str, str, str]:
    """Create D and D′ (row-level tables of ``count`` and ``count + shift`` rows), register them,
    give the analyst ``budget`` under the odp accountant on each; return (D, D′, sql)."""
    db.command(f"CREATE DATABASE IF NOT EXISTS {database}")
    tables = (f"{database}.d", f"{database}.dprime")
    for rows, table in zip(design.counts(), tables):
        if rows < 0:
            raise ValueError("design: a negative count")
        db.command(f"DROP TABLE IF EXISTS {table}")
        db.command(f"CREATE TABLE {table} (x Int64) ENGINE = MergeTree ORDER BY x")
        if rows:
            db.command(f"INSERT INTO {table} SELECT number FROM numbers({rows})")
        db.catalog.register(table, privacy_unit=None)
        db.ledger.set_budget(db.analyst, db.catalog.qualify(table), epsilon=budget, accountant="odp")
    return tables[0], tables[1], design.sql
