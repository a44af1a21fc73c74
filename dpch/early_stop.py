"""Early stopping with output-DP accounting: ``db.refine(...)``, ``dpch refine``.

    r = db.refine("SELECT COUNT(*) FROM demo.purchases WHERE region = 'north'",
                  epsilon_per_step=0.05, max_steps=10, target_relative=0.02)
    r.estimate, r.ci_low, r.ci_high, r.steps, r.epsilon_reserved, r.epsilon_charged

**Mechanism** (odp_privacy_accounting.md §5, Alg. 3 M_iter with stopping points k_i = i,
i = 1..k_n = ``max_steps``). The query is one ungrouped COUNT or SUM, planned exactly as
``db.query`` plans it (user-level contribution bounding and clipping; the shape check of the
sparse vector, dpch.svt). Step k (M_k) runs it in ClickHouse and releases y_k = q + ν_k, q the
bounded value in integer grid units (it never leaves ClickHouse), ν_k ~ DLap(τ) drawn by
``dpch_laplace_int`` with τ ≥ b = Δ/ε_step (``LaplaceMechanism.calibrated(Δ, ε_step,
integer=True)``, grid 1: pure ε_step-DP, CKS20 / the paper Thm 1). The estimate after k steps is
the inverse-variance weighted mean of y_1..y_k (equal weights: every step has the same τ), times
the grid. The stopping rule h^k looks only at released values and public parameters (Alg. 3's
assumption, Lemma 11's proof): stop after step k when the interval's half-width H_k ≤
``target_halfwidth`` or H_k ≤ ``target_relative``·|estimate_k|.

**Interval.** H_k = ``dlap_mean_halfwidth(τ, k, 1 − α/k_n)`` (the exact Laplace-sum quantile plus
the discretisation, dpch.mechanisms.block): at level 1 − α/k_n for each of the k_n possible
stopping points, so by the union bound all k_n intervals cover q·g at once with probability ≥
1 − α, and the interval at the data-dependent stopping step covers with probability ≥ 1 − α
(α = 1 − ``confidence``). It covers the bounded value (clipping and bounding bias are not in it).

**Accounting** (``early_stop_odp``). Lemma 11 (§5.1) with basic composition (Dwork & Roth
Thm 3.16, the composition of the odp/basic/pure accountants): stopping at k_i releases
(M_1..M_{k_i}), (ε^{k_i} = Σ_{k≤k_i} ε_k, δ^{k_i} = Σ_{k≤k_i} δ_k)-DP, so M_iter is (P, E, δ)-ODP
with P_i = {outputs of length k_i}, E(P_i) = ε^{k_i} and δ = Σ_i δ^{k_i}. §5.2 (Thm 15) is tighter
in δ: for the same E the optimal δ is exactly 1 − Π_{k≤k_n}(1 − δ_k) (the maximiser of Eq. (3)
puts each sequence with a δ-outcome at the first stopping point after it; sequences without one
have Pr_0 ≤ e^{E(P_i)}·Pr_1). The Laplace steps have δ_k = 0, so both give δ = 0 and
E(P_i) = i·ε_step; tests/test_early_stop.py checks both formulas against a brute force of Eq. (3)
and Eq. (4) with δ_k > 0.

**Ledger.** ONE charge before the first step: a Laplace MechanismCost of the whole worst case
(the vector of k_n releases: L1 sensitivity k_n·Δ, scale b, ε = k_n·ε_step = sup E, Lemma 4) with
``odp_epsilons`` = (E(P_1), …, E(P_{k_n})) (Def. 2, Alg. 1 line 6). After the stop at step k the
charge is settled to the cell k − 1, E(P_k) = k·ε_step (Alg. 1 lines 13-14, Thm 7), under the
accountants that allow settlement (odp, basic, pure); under the others it stays at k_n·ε_step. A
step that fails at run time marks the charge failed: it stays at the worst case. An exception in
``on_step`` (the caller's code, after a step was released) settles to the steps run, then
propagates. A process that dies holds the only settlement token: the worst case stays.
Rejected inputs (bad parameters, a refused query shape, budget) run and charge nothing.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from . import calibration as cal
from .accounting import get_accountant, odp_realized
from .controller import charge_first
from .cost import MechanismCost, PrivacyCost
from .errors import BackendError, DPCHError, InvalidParameter, QueryRejected
from .mechanisms import LaplaceMechanism
from .mechanisms.block import dlap_mean_halfwidth

__all__ = ["EarlyStopOdp", "RefineResult", "RefineStep", "early_stop_odp", "refine", "run_steps", "MAX_STEPS"]

MAX_STEPS = 1000


@dataclass(frozen=True)
class EarlyStopOdp:
    """The ODP triple of M_iter: cells E(P_i) per stopping point and δ (Lemma 11 / Thm 15)."""

    stops: tuple[int, ...]
    cells: tuple[float, ...]
    delta_lemma11: float
    delta_thm15: float

    @property
    def delta(self) -> float:
        """The smaller of the two valid δ's (§5.2 where it is tighter)."""
        return min(self.delta_lemma11, self.delta_thm15)

    @property
    def sup(self) -> float:
        return self.cells[-1]


def early_stop_odp(step_epsilons: Sequence[float], step_deltas: Sequence[float] | None = None,
                   stops: Sequence[int] | None = None) -> EarlyStopOdp:
    """ODP guarantee of Alg. 3 with (ε_k, δ_k)-DP steps and stopping points k_1 < … < k_n = k_n
    (default: every step), with E(P_i) = Σ_{k≤k_i} ε_k (basic composition, Dwork & Roth Thm 3.16):
    δ by Lemma 11 = Σ_i Σ_{k≤k_i} δ_k; δ by Thm 15 (§5.2) = 1 − Π_{k≤k_n}(1 − δ_k) (module
    docstring)."""
    eps = [float(e) for e in step_epsilons]
    if not eps or any(not (math.isfinite(e) and e >= 0) for e in eps):
        raise InvalidParameter("step_epsilons must be finite numbers >= 0, at least one")
    dels = [0.0] * len(eps) if step_deltas is None else [float(d) for d in step_deltas]
    if len(dels) != len(eps) or any(not (0.0 <= d < 1.0) for d in dels):
        raise InvalidParameter("step_deltas: one δ in [0, 1) per step")
    ks = tuple(range(1, len(eps) + 1)) if stops is None else tuple(int(k) for k in stops)
    if not ks or list(ks) != sorted(set(ks)) or ks[0] < 1 or ks[-1] != len(eps):
        raise InvalidParameter("stops must increase strictly from >= 1 and end at the last step")
    cells = tuple(math.fsum(eps[:k]) for k in ks)
    lemma11 = math.fsum(math.fsum(dels[:k]) for k in ks)
    thm15 = -math.expm1(math.fsum(math.log1p(-d) for d in dels))
    return EarlyStopOdp(ks, cells, lemma11, thm15)


@dataclass(frozen=True)
class RefineStep:
    """What step k released (post-processing of y_1..y_k only)."""

    step: int
    measurement: float
    estimate: float
    halfwidth: float


@dataclass
class RefineResult:
    """An early-stopped release: the combined estimate, its interval (level ``confidence`` at the
    stopping step, union bound over the stopping points), the steps run, the ε reserved (k_n·ε_step)
    and charged (settled: steps·ε_step, Lemma 11)."""

    sql: str
    estimate: float
    ci_low: float
    ci_high: float
    confidence: float
    steps: int
    max_steps: int
    epsilon_per_step: float
    epsilon_reserved: float
    epsilon_charged: float
    stopped_by: str  # "target" | "max_steps"
    measurements: list[float] = field(default_factory=list)
    noise_scale: float = 0.0
    receipt: Any = None

    def describe(self) -> str:
        return (f"estimate {self.estimate:.6g} [{self.ci_low:.6g}, {self.ci_high:.6g}] at {self.confidence:g} after "
                f"{self.steps} of at most {self.max_steps} steps ({self.stopped_by}); ε reserved "
                f"{self.epsilon_reserved:.6g}, charged {self.epsilon_charged:.6g} (odp_privacy_accounting.md "
                f"Lemma 11, settled per stopping point)")


def _check_params(epsilon_per_step, max_steps, target_halfwidth, target_relative, confidence) -> tuple:
    e = cal.check_epsilon(epsilon_per_step, "epsilon_per_step")
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or not 1 <= max_steps <= MAX_STEPS:
        raise InvalidParameter(f"max_steps must be an integer in [1, {MAX_STEPS}]")
    if target_halfwidth is None and target_relative is None:
        raise InvalidParameter("target_halfwidth or target_relative: give at least one stopping target")
    th = None if target_halfwidth is None else cal.check_epsilon(target_halfwidth, "target_halfwidth")
    tr = None if target_relative is None else cal.check_epsilon(target_relative, "target_relative")
    conf = cal.check_level(confidence, "confidence")
    return e, max_steps, th, tr, conf


def _prepare(conn, sql: str, eps: float, options: dict):
    """parse → bind → total → plan → shape check → type check; runs nothing on the data."""
    from .probe_db import check_before_charge, probe_tables
    from .rewrite import _Rewriter, probe_table_sql
    from .svt import prepare_single_value
    from .typecheck import check_runs

    prepared, q = prepare_single_value(conn, sql, eps, options, "refine")
    plan = prepared.plan
    if not (math.isfinite(q.grid) and q.grid > 0):
        raise QueryRejected("refine: the query's sensitivity is not a whole number of grid units")
    mech = LaplaceMechanism.calibrated(int(q.l1), eps, integer=True)
    if mech.granularity != 1.0 or not mech.privacy_relation(int(q.l1), eps):
        raise InvalidParameter("epsilon_per_step: the noise scale exceeds 2^40 grid units (sensitivity too large "
                               "for this ε); use a larger epsilon_per_step")
    check_before_charge(conn, plan)  # on probe data: the real relation of a join
    probe = _Rewriter(plan, noise=False, selection=False, table=probe_table_sql(plan, probe_tables(conn)))
    check_runs(conn.backend, plan.entry, plan.bound, _step_sql(probe, mech))
    return prepared, _Rewriter(plan, noise=False, selection=False, table=None), mech, q


def _step_sql(rw, mech: LaplaceMechanism) -> str:
    """``SELECT toString(q + ν) AS y FROM (<bounded value>)``: one noisy value, Int128 exact."""
    from .typecheck import with_settings

    groups = rw._salted(rw.groups_sql())
    nu = mech.sql("toInt64(0)")
    return with_settings(f"SELECT toString(toInt128({rw.plan.quantities[0].column}) + toInt128({nu})) AS y\n"
                         f"FROM (\n{groups}\n)")


def refine(conn, sql: str, *, epsilon_per_step: float, max_steps: int = 10, target_halfwidth: float | None = None,
           target_relative: float | None = None, confidence: float = 0.95,
           on_step: Callable[[RefineStep], None] | None = None, **options) -> RefineResult:
    """Refine a noisy ungrouped COUNT/SUM by independent ε_step-DP measurements until the interval
    is narrow enough (module docstring). Reserves k_n·ε_step before anything runs; settles to
    k·ε_step for the k steps run (Lemma 11: M_iter is (P, E(P_k) = k·ε_step, 0)-ODP, hence
    k_n·ε_step-DP in the worst case, Lemma 4)."""
    eps, kn, th, tr, conf = _check_params(epsilon_per_step, max_steps, target_halfwidth, target_relative, confidence)
    prepared, rw, mech, q = _prepare(conn, sql, eps, options)
    odp = early_stop_odp([eps] * kn)
    g = q.grid
    label = f"early stopping ({kn} steps)"
    cost = PrivacyCost((MechanismCost(kind="laplace", sensitivity=kn * q.l1 * g, scale=mech.scale * g,
                                      epsilon=odp.sup, delta=odp.delta, rho=None, label=label,
                                      odp_epsilons=odp.cells),))
    text = (f"REFINE {sql} EPSILON_PER_STEP {eps!r} MAX_STEPS {kn} TARGET_HALFWIDTH {th!r} "
            f"TARGET_RELATIVE {tr!r} CONFIDENCE {conf!r}")
    ledger, receipt = charge_first(conn, prepared.plan.entry.table, cost, text)
    step_sql = _step_sql(rw, mech)
    level = 1.0 - (1.0 - conf) / kn  # Bonferroni over the k_n stopping points
    state = {"failed": False, "ys": []}

    def measure(k: int) -> int:
        try:
            df = conn.backend.query_df(step_sql)
            if len(df) != 1 or list(df.columns) != ["y"]:
                raise BackendError("unexpected result shape")
            return int(df["y"].iloc[0])
        except Exception:  # noqa: BLE001 - after the type check; no data in the text
            state["failed"] = True
            _mark(ledger, receipt, "failed")
            raise BackendError(f"refine: step {k} failed at run time; the charge stays at the worst case "
                               f"ε = {odp.sup:g} (never settled)") from None

    try:
        est, h, stopped_by = run_steps(measure, state["ys"], kn, g, mech, level, th, tr, on_step)
    finally:
        ys = state["ys"]
        # a failed step: the charge stays failed at its worst case; no step released: it stays reserved
        charged = _settle(conn, ledger, receipt, len(ys), odp) if ys and not state["failed"] else odp.sup
    return RefineResult(sql, est, est - h, est + h, conf, len(ys), kn, eps, odp.sup, charged, stopped_by,
                        [g * y for y in ys], mech.scale * g, receipt)


def run_steps(measure: Callable[[int], int], ys: list[int], kn: int, grid: float, mech: LaplaceMechanism,
              level: float, target_halfwidth: float | None, target_relative: float | None,
              on_step: Callable[[RefineStep], None] | None = None) -> tuple[float, float, str]:
    """Alg. 3's loop: y_k = measure(k) (appended to ``ys`` as it is released), the equal-weight
    (inverse-variance) mean, the half-width at ``level``, the stopping rule h^k on released values
    only. Returns (estimate, half-width, "target" | "max_steps")."""
    est, h = 0.0, math.inf
    for k in range(1, kn + 1):
        ys.append(measure(k))
        est = grid * math.fsum(ys) / k  # equal inverse-variance weights (the same τ every step)
        h = grid * dlap_mean_halfwidth(mech, k, level)
        done = (target_halfwidth is not None and h <= target_halfwidth) or (
            target_relative is not None and h <= target_relative * abs(est))
        if on_step is not None:
            on_step(RefineStep(k, grid * ys[-1], est, h))
        if done:
            return est, h, "target"
    return est, h, "max_steps"


def _mark(ledger, receipt, outcome: str) -> None:
    try:
        ledger.mark(receipt, outcome)
    except DPCHError as exc:
        warnings.warn(f"dpch: could not mark the refine charge {outcome}: {exc}", RuntimeWarning, stacklevel=3)


def _settle(conn, ledger, receipt, steps: int, odp: EarlyStopOdp) -> float:
    """Settle the cell of the stopping point (Alg. 1 lines 13-14)."""
    realised = odp.sup
    try:
        if get_accountant(receipt.accountant).supports_settlement:
            s = ledger.settle(receipt, odp_realized(receipt.cost, [odp.stops.index(steps)]), analyst=conn.analyst)
            realised = s.realized_epsilon
        ledger.mark(receipt, "executed")
    except DPCHError as exc:  # the charge stays at its worst case: fail closed
        warnings.warn(f"dpch: the refine charge could not be settled ({exc}); it stays at ε = {odp.sup:g}",
                      RuntimeWarning, stacklevel=3)
        realised = odp.sup
    return realised
