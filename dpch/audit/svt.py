"""Audit of the sparse-vector session (dpch.svt) on neighbouring datasets, overall and per
output-DP class (docs/AUDIT.md §10).

``audit_svt(db, D, D′, queries, threshold, epsilon, max_positives)`` runs the same session (the
same list of test queries, stopping after c ⊤) many times on D and on D′, and certifies, with the
auditor's Clopper–Pearson statistics (dpch.audit.stats):

- **overall**: ε_LB over events of answer vectors, against sup E = ε (Lemma 4);
- **per class** S_c′ (answer vectors with exactly c′ ⊤'s): ε_LB over events *inside* S_c′, against
  the ε the session itself settles for a run with c′ ⊤'s (its ``epsilon_spent``, read by a
  settlement probe: a session opened on D, given c′ ⊤ answers and closed, so the claim is what the
  ledger is told, not a formula). The ODP claim (Lemma 8, Def. 2) is P(S | D) ≤ e^{E(S_c′)} P(S | D′)
  for every S ⊆ S_c′, so a session that under-reports its realised ε is caught by its class even
  when sup E still holds.

**Outputs and events.** An answer vector is a finite sequence of bits, so the output space is
finite (at most 2^k atoms for k queries). The event search is exact on atoms: on the selection
half, the atoms (of the class, for a class certificate) are ranked by their empirical ratio in
each direction and the best Neyman–Pearson prefix (union of the top-j atoms) by the CP-based
selection criterion (``stats.selection_epsilon``) is chosen; it is certified on the held-out half
(``stats.epsilon_lower_bound``). With c + 2 certificates (overall and c + 1 classes) each at
α/(c + 2), all hold together with probability ≥ 1 − α (union bound), so a correct session is
reported as a violation with probability ≤ α = 1 − confidence.

**Fast path (why, and why it is the same mechanism).** A real session is a ledger charge, a plan
and a type check per query (two probe queries), ρ's draw and one query per answer: about
0.1 s per session here, so 10⁵ sessions would take hours. The audit therefore draws most samples
through one ClickHouse query per dataset that evaluates N sessions at once: a row per session
(``numbers(N)``), ρ_s = ``dpch_laplace_int(·, b1)`` and ν_{s,i} = ``dpch_laplace_int(·, b2)``
drawn per row (independent draws of the same kernel; the value argument is a per-row column so the
call is not folded to a constant), the bounded values m·q_i computed by the session's own rewriter
SQL (``_Rewriter.groups_sql``, the same text ``SparseVector._test_sql`` embeds), and the same test
``m·q_i + ν_{s,i} ≥ T0 + ρ_s`` in Int128. The noise mechanisms are those of the session's own
calibration (``SvtCalibration.mechanisms()``, which ``SparseVector._start`` uses for ρ; ν's scale
is ``calibration.b2``, which ``_test_sql`` uses), obtained by opening a session of the audited
class and preparing the queries through its ``_prepare``: a session class that changes its
calibration (the broken fixtures do) changes the fast path too. Stopping after c ⊤ is applied to
the bit vector afterwards: the queries are fixed in advance, so running all of them and truncating
after the c-th ⊤ has the distribution of a session that stops. Then ``real_sessions`` genuine
sessions per dataset run through the session class (``with cls(db, D, ...) as s: s.above(q)``,
ledger charges and settlement included), and a χ² test of homogeneity compares their answer
vectors with the fast path's (``fast_path_p_value``; the audit flags ``fast_path_agrees`` at
p ≥ 1e-4). That check has limited power with a few hundred sessions; the exact answer
probabilities (``exact_answer_probabilities``) give a second, sharper check in the tests.

Budget: every session (fast-path preparation, real sessions, settlement probes) charges the
dataset's ledger; give the audit datasets a large budget under the ``odp`` accountant
(``build_svt_design`` does).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Sequence

import numpy as np

from .stats import epsilon_lower_bound, selection_epsilon

__all__ = ["SvtAudit", "SvtCertificate", "SvtDesign", "audit_svt", "build_svt_design", "svt_design",
           "exact_answer_probabilities", "sample_sessions_fast", "sample_sessions_real",
           "settled_epsilons", "certify_answers"]

SELECTION_ALPHA = 1e-3
AGREEMENT_P = 1e-4


# ------------------------------------------------------------------------------------------------
# Sampling
# ------------------------------------------------------------------------------------------------
def _session_cls(session_cls):
    if session_cls is None:
        from ..svt import SparseVector
        return SparseVector
    return session_cls


def _truncate(bits: np.ndarray, c: int) -> list[tuple[bool, ...]]:
    """Answer vectors of a session that stops after c ⊤ (Alg. 2 line 4)."""
    out = []
    for row in bits:
        seq, tops = [], 0
        for b in row:
            seq.append(bool(b))
            tops += bool(b)
            if tops >= c:
                break
        out.append(tuple(seq))
    return out


def sample_sessions_fast(db, dataset: str, queries: Sequence[str], threshold: float, epsilon: float,
                         max_positives: int, n: int, *, split: float | None = None, session_cls=None,
                         chunk: int = 200_000) -> list[tuple[bool, ...]]:
    """n sessions' answer vectors in one ClickHouse query per chunk (module docstring)."""
    from ..mechanisms import LaplaceMechanism
    from ..typecheck import with_settings

    cls = _session_cls(session_cls)
    s = cls(db, dataset, threshold, epsilon, max_positives, 0.0, split)
    with s:
        tests = []
        for q in queries:
            test, new_cal = s._prepare(q.format(table=dataset), {})
            if new_cal is not None:
                s._start(new_cal)
            tests.append(test)
        k = s.calibration
        m_rho, _ = k.mechanisms()  # ρ as SparseVector._start draws it
        m_nu = LaplaceMechanism(k.b2, True)  # ν as SparseVector._test_sql draws it
        t0 = math.ceil(Fraction(s.threshold) / Fraction(k.grid))
    # the bounded values, by the session's own rewriter SQL (never shown: used inside the query)
    scalars = []
    for t in tests:
        rw = t.rewriter
        groups = rw._salted(rw.groups_sql())
        col = rw.plan.quantities[0].column
        mult = f" * toInt128({t.multiplier})" if t.multiplier != 1 else ""
        scalars.append(f"(SELECT toInt128({col}){mult} FROM ({groups}))")
    out: list[tuple[bool, ...]] = []
    done = 0
    while done < n:
        size = min(chunk, n - done)
        # a per-row value 0, written differently for each draw: one independent draw per row and
        # per query (identical expressions would be evaluated once, common subexpressions)
        def zero(j: int) -> str:
            return f"toInt64(number * {j + 1} - number * {j + 1})"
        bits = [f"toUInt8({scalars[i]} + toInt128({m_nu.sql(zero(i + 1))}) >= toInt128('{t0}') + rho) AS a{i}"
                for i in range(len(tests))]
        sql = with_settings(f"SELECT {', '.join(bits)} FROM (SELECT number, toInt128({m_rho.sql(zero(0))}) AS rho "
                            f"FROM numbers({size}))")
        df = db.backend.query_df(sql)
        out += _truncate(df[[f"a{i}" for i in range(len(tests))]].to_numpy(), max_positives)
        done += size
    return out


def sample_sessions_real(db, dataset: str, queries: Sequence[str], threshold: float, epsilon: float,
                         max_positives: int, n: int, *, split: float | None = None, session_cls=None
                         ) -> tuple[list[tuple[bool, ...]], list[float]]:
    """n genuine sessions (ledger charge, plan, type check, settlement): answers and ε spent."""
    cls = _session_cls(session_cls)
    answers, spent = [], []
    for _ in range(n):
        with cls(db, dataset, threshold, epsilon, max_positives, 0.0, split) as s:
            for q in queries:
                if s.positives >= max_positives:
                    break
                s.above(q.format(table=dataset))
        answers.append(tuple(s.answers))
        spent.append(float(s.epsilon_spent))
    return answers, spent


def settled_epsilons(db, dataset: str, threshold: float, epsilon: float, max_positives: int, *,
                     split: float | None = None, session_cls=None) -> tuple[float, ...]:
    """The ε the session settles for c′ = 0..c ⊤ answers (settlement probe: open, record c′ ⊤,
    close; the ledger's realised ε is read back). No query runs."""
    cls = _session_cls(session_cls)
    out = []
    for c1 in range(max_positives + 1):
        s = cls(db, dataset, threshold, epsilon, max_positives, 0.0, split)
        with s:
            s.answers = [True] * c1
        out.append(float(s.epsilon_spent))
    return tuple(out)


# ------------------------------------------------------------------------------------------------
# Exact answer probabilities (discrete Laplace ρ and ν, the kernel's τ)
# ------------------------------------------------------------------------------------------------
def _dlap_pmf(z: np.ndarray, tau: float) -> np.ndarray:
    x = math.exp(-1.0 / tau)
    return (1 - x) / (1 + x) * np.exp(-np.abs(z) / tau)


def _dlap_tail(a: np.ndarray, tau: float) -> np.ndarray:
    """P(ν ≥ a) for integer a."""
    x = math.exp(-1.0 / tau)
    a = np.asarray(a, dtype=float)
    upper = np.exp(-np.maximum(a, 1) / tau) / (1 + x)
    lower = 1 - np.exp(-np.maximum(1 - a, 1) / tau) / (1 + x)
    return np.where(a >= 1, upper, lower)


def exact_answer_probabilities(values: Sequence[int], t0: int, tau1: float, tau2: float, c: int,
                               zmax: int | None = None) -> dict[tuple[bool, ...], float]:
    """P(answer vector) for fixed queries of bounded values ``values`` (grid units), threshold T0,
    ρ ~ DLap(τ1), ν ~ DLap(τ2), stopping after c ⊤: Σ_z P(ρ = z) Π_i P(bit_i | z)."""
    zmax = zmax or int(60 * max(tau1, 1.0) + 60 * max(tau2, 1.0) + max(abs(v - t0) for v in values))
    z = np.arange(-zmax, zmax + 1)
    w = _dlap_pmf(z, tau1)
    ups = [_dlap_tail(t0 + z - v, tau2) for v in values]
    out: dict[tuple[bool, ...], float] = {}

    def rec(prefix: tuple[bool, ...], acc: np.ndarray) -> None:
        i = len(prefix)
        if i == len(values) or sum(prefix) >= c:
            out[prefix] = float(acc.sum())
            return
        rec(prefix + (False,), acc * (1 - ups[i]))
        rec(prefix + (True,), acc * ups[i])
    rec((), w)
    return out


# ------------------------------------------------------------------------------------------------
# Certification on atoms
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SvtCertificate:
    """One certified event: a union of answer vectors (inside ``cls`` unless it is None)."""

    cls: int | None  # None: overall
    claimed: float
    event: tuple[tuple[bool, ...], ...]
    favours: str
    k_d: int
    k_dprime: int
    n: int
    epsilon_lb: float
    alpha: float

    @property
    def violation(self) -> bool:
        return self.epsilon_lb > self.claimed + 1e-12

    def describe(self) -> str:
        what = "overall" if self.cls is None else f"class c′ = {self.cls}"
        ev = " ∪ ".join("".join("⊤" if b else "⊥" for b in a) or "∅" for a in self.event[:6])
        more = f" (+{len(self.event) - 6} more)" if len(self.event) > 6 else ""
        return (f"{what}: ε_LB = {self.epsilon_lb:.3f} vs claimed {self.claimed:.3f} "
                f"{'VIOLATION' if self.violation else 'consistent'}; event {{{ev}{more}}} favours "
                f"{self.favours} ({self.k_d}/{self.n} on D, {self.k_dprime}/{self.n} on D′)")


def _counts(samples: list[tuple[bool, ...]], atoms: list[tuple[bool, ...]]) -> np.ndarray:
    index = {a: i for i, a in enumerate(atoms)}
    out = np.zeros(len(atoms), dtype=np.int64)
    for s in samples:
        i = index.get(s)
        if i is not None:
            out[i] += 1
    return out


def _choose(ca: np.ndarray, cb: np.ndarray, na: int, nb: int, alpha: float):
    """Best Neyman–Pearson prefix favouring side a (counts ca) against b: (score, atom indices)."""
    ratio = (ca + 0.5) / (cb + 0.5)
    order = np.argsort(-ratio, kind="stable")
    ka, kb = np.cumsum(ca[order]), np.cumsum(cb[order])
    score = selection_epsilon(ka, na, kb, nb, alpha, 0.0)
    j = int(np.argmax(score))
    return float(score[j]), order[: j + 1]


def certify_answers(sel_d, sel_dp, cert_d, cert_dp, *, claims: Sequence[float], epsilon: float,
                    alpha: float) -> list[SvtCertificate]:
    """Overall and per-class certificates (module docstring): events chosen on (sel_d, sel_dp),
    certified on (cert_d, cert_dp), each at level α/(c + 2)."""
    c = len(claims) - 1
    atoms = sorted(set(sel_d) | set(sel_dp) | set(cert_d) | set(cert_dp))
    m = c + 2
    a_each = alpha / m
    a_sel = min(a_each, SELECTION_ALPHA)
    sd, sdp = _counts(sel_d, atoms), _counts(sel_dp, atoms)
    cd, cdp = _counts(cert_d, atoms), _counts(cert_dp, atoms)
    n_sel, n_cert = min(len(sel_d), len(sel_dp)), min(len(cert_d), len(cert_dp))
    out = []
    for cls in [None] + list(range(c + 1)):
        idx = np.array([i for i, a in enumerate(atoms) if cls is None or sum(a) == cls], dtype=np.int64)
        claimed = epsilon if cls is None else claims[cls]
        if idx.size == 0:
            out.append(SvtCertificate(cls, claimed, (), "D", 0, 0, n_cert, 0.0, a_each))
            continue
        best = None
        for fav, ca, cb, na, nb in (("D", sd[idx], sdp[idx], len(sel_d), len(sel_dp)),
                                    ("D′", sdp[idx], sd[idx], len(sel_dp), len(sel_d))):
            score, chosen = _choose(ca, cb, na, nb, a_sel)
            if best is None or score > best[0]:
                best = (score, fav, idx[chosen])
        _, fav, ev = best
        kd, kdp = int(cd[ev].sum()), int(cdp[ev].sum())
        if fav == "D":
            _, _, eps = epsilon_lower_bound(kd, len(cert_d), kdp, len(cert_dp), a_each)
        else:
            _, _, eps = epsilon_lower_bound(kdp, len(cert_dp), kd, len(cert_d), a_each)
        out.append(SvtCertificate(cls, claimed, tuple(atoms[i] for i in ev), fav, kd, kdp, n_cert, eps, a_each))
    del n_sel
    return out


# ------------------------------------------------------------------------------------------------
# The audit
# ------------------------------------------------------------------------------------------------
@dataclass
class SvtAudit:
    epsilon: float
    max_positives: int
    claims: tuple[float, ...]          # settled ε per class c′ = 0..c (settlement probe)
    confidence: float
    samples: int
    certificates: list[SvtCertificate]
    real_sessions: int = 0
    fast_path_p_value: float | None = None
    real_spent_ok: bool = True         # every real session settled its class's probed ε
    timings: dict[str, float] = field(default_factory=dict)
    outputs_d: list[tuple[bool, ...]] = field(default_factory=list, repr=False)
    outputs_dprime: list[tuple[bool, ...]] = field(default_factory=list, repr=False)

    @property
    def overall(self) -> SvtCertificate:
        return self.certificates[0]

    @property
    def per_class(self) -> list[SvtCertificate]:
        return self.certificates[1:]

    @property
    def epsilon_lb(self) -> float:
        return self.overall.epsilon_lb

    @property
    def overall_violation(self) -> bool:
        return self.overall.violation

    @property
    def class_violation(self) -> bool:
        return any(c.violation for c in self.per_class)

    @property
    def violation(self) -> bool:
        return self.overall_violation or self.class_violation

    @property
    def fast_path_agrees(self) -> bool | None:
        return None if self.fast_path_p_value is None else self.fast_path_p_value >= AGREEMENT_P

    def summary(self) -> str:
        lines = [f"sparse-vector audit: ε = {self.epsilon:g}, c = {self.max_positives}, {self.samples} sessions "
                 f"per side, confidence {self.confidence}; settled ε per class: "
                 + ", ".join(f"{e:.3f}" for e in self.claims)]
        lines += ["  " + c.describe() for c in self.certificates]
        if self.fast_path_p_value is not None:
            lines.append(f"  fast path vs {self.real_sessions} real sessions per side: χ² p = "
                         f"{self.fast_path_p_value:.3g} ({'agree' if self.fast_path_agrees else 'DISAGREE'})")
        lines.append(f"  verdict: {'VIOLATION' if self.violation else 'consistent'}")
        return "\n".join(lines)


def _chi2_p(groups: list[list[tuple[bool, ...]]]) -> float:
    """χ² homogeneity p-value of answer-vector distributions (cells with expected < 5 pooled)."""
    from scipy.stats import chi2_contingency

    atoms = sorted(set().union(*map(set, groups)))
    table = np.array([_counts(g, atoms) for g in groups], dtype=float)
    total = table.sum(axis=0)
    expected_min = total * min(len(g) for g in groups) / table.sum()
    big = expected_min >= 5
    cols = [table[:, big]] + ([table[:, ~big].sum(axis=1, keepdims=True)] if (~big).any() else [])
    t = np.hstack(cols)
    t = t[:, t.sum(axis=0) > 0]
    if t.shape[1] < 2:
        return 1.0
    return float(chi2_contingency(t)[1])


def audit_svt(db, dataset_d: str, dataset_dprime: str, queries: Sequence[str], threshold: float,
              epsilon: float, max_positives: int = 1, *, samples: int = 100_000, real_sessions: int = 100,
              confidence: float = 0.95, split: float | None = None, session_cls: Any = None,
              fast: bool = True) -> SvtAudit:
    """Audit the sparse-vector session on D and D′ (module docstring). ``samples`` sessions per
    side (fast path, or real sessions if ``fast`` is False); ``real_sessions`` genuine sessions per
    side to check the fast path (0: skip). ``session_cls`` defaults to dpch.svt.SparseVector."""
    if not 0 < confidence < 1:
        raise ValueError("confidence must be in (0, 1)")
    if samples < 16:
        raise ValueError("need at least 16 sessions per side")
    t = {}
    t0 = time.perf_counter()
    claims = settled_epsilons(db, dataset_d, threshold, epsilon, max_positives, split=split, session_cls=session_cls)
    args = (queries, threshold, epsilon, max_positives)
    if fast:
        out_d = sample_sessions_fast(db, dataset_d, *args, samples, split=split, session_cls=session_cls)
        out_dp = sample_sessions_fast(db, dataset_dprime, *args, samples, split=split, session_cls=session_cls)
    else:
        out_d, _ = sample_sessions_real(db, dataset_d, *args, samples, split=split, session_cls=session_cls)
        out_dp, _ = sample_sessions_real(db, dataset_dprime, *args, samples, split=split, session_cls=session_cls)
    t["sampling"] = time.perf_counter() - t0
    p_value, spent_ok = None, True
    if fast and real_sessions:
        t1 = time.perf_counter()
        real_d, spent_d = sample_sessions_real(db, dataset_d, *args, real_sessions, split=split, session_cls=session_cls)
        real_dp, spent_dp = sample_sessions_real(db, dataset_dprime, *args, real_sessions, split=split,
                                                 session_cls=session_cls)
        p_value = min(_chi2_p([real_d, out_d]), _chi2_p([real_dp, out_dp]))
        spent_ok = all(abs(e - claims[sum(a)]) <= 1e-12 for a, e in zip(real_d + real_dp, spent_d + spent_dp))
        t["real sessions"] = time.perf_counter() - t1
    t2 = time.perf_counter()
    h_d, h_dp = len(out_d) // 2, len(out_dp) // 2
    certs = certify_answers(out_d[:h_d], out_dp[:h_dp], out_d[h_d:], out_dp[h_dp:], claims=claims,
                            epsilon=epsilon, alpha=1.0 - confidence)
    t["analysis"] = time.perf_counter() - t2
    return SvtAudit(epsilon, max_positives, claims, confidence, samples, certs, real_sessions if fast else 0,
                    p_value, spent_ok, t, out_d, out_dp)


# ------------------------------------------------------------------------------------------------
# The design
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SvtDesign:
    """k COUNT queries at bounded values ``threshold + offsets[i]`` on D; on D′ (one row moved from
    x = MOVED_FROM to x = MOVED_TO: a substitution) query i reads ``offsets[i] + shifts[i]``."""

    threshold: int
    offsets: tuple[int, ...]
    shifts: tuple[int, ...]  # −1, 0 or +1: q_i(D′) − q_i(D)

    def values(self, side: str) -> list[int]:
        return [self.threshold + o + (s if side == "D′" else 0) for o, s in zip(self.offsets, self.shifts)]


MOVED_FROM, MOVED_TO = 1_000_000, 2_000_000


def svt_design(epsilon: float, max_positives: int) -> SvtDesign:
    """The near-tight design (docs/AUDIT.md §10): queries that the moved row leaves (−1) and
    enters (+1), at offsets from the threshold of the order of the noise scale."""
    c = max_positives
    scale = max(1, round(2.0 / epsilon))
    if c == 1:
        return SvtDesign(100, (scale, scale, -scale), (1, 1, -1))
    return SvtDesign(100, (-scale, scale, -scale, scale), (-1, 1, -1, 1))


def build_svt_design(db, design: SvtDesign, database: str = "dpch_audit_svt", budget: float = 1e9
                     ) -> tuple[str, str, list[str]]:
    """Create D and D′ (row-level tables with an integer column x), register them, give the analyst
    a budget of ``budget`` under the odp accountant on each; return (D, D′, queries). Query i is
    ``SELECT COUNT(*) FROM t WHERE x IN (i[, MOVED_FROM | MOVED_TO])``."""
    db.command(f"CREATE DATABASE IF NOT EXISTS {database}")
    tables = (f"{database}.d", f"{database}.dprime")
    queries = []
    for i, s in enumerate(design.shifts):
        members = [str(i)] + ([str(MOVED_FROM)] if s == -1 else []) + ([str(MOVED_TO)] if s == 1 else [])
        queries.append(f"SELECT COUNT(*) FROM {{table}} WHERE x IN ({', '.join(members)})")
    for side, table in zip(("D", "D′"), tables):
        db.command(f"DROP TABLE IF EXISTS {table}")
        db.command(f"CREATE TABLE {table} (x Int64) ENGINE = MergeTree ORDER BY x")
        for i, (o, s) in enumerate(zip(design.offsets, design.shifts)):
            base = design.threshold + o - (1 if s == -1 else 0)  # the moved row is in query i on D iff s = −1
            if base < 0:
                raise ValueError("design: a negative count")
            if base:
                db.command(f"INSERT INTO {table} SELECT {i} FROM numbers({base})")
        db.command(f"INSERT INTO {table} VALUES ({MOVED_FROM if side == 'D' else MOVED_TO})")
        db.catalog.register(table, privacy_unit=None)
        db.ledger.set_budget(db.analyst, db.catalog.qualify(table), epsilon=budget, accountant="odp")
    return tables[0], tables[1], queries
