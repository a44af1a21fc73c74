"""Propose-test-release runs: ``db.robust_iqr``, ``db.robust_median``, ``db.trimmed_mean``.

Flow (as the sparse-vector session, dpch/svt.py): validate (data-independent) → plan the column's
bounded histogram with the controller (``SELECT quantile(0.5)(col) FROM t WHERE …``: parse, bind,
totality, contribution bounding, type check) → ONE ledger charge at the worst case of the ODP
cells → run the stages in ClickHouse (statistics, noisy tests and noisy releases all inside the
engine; Python receives the branch and the noisy value) → settle the realised cells (Alg. 1 lines
13-14) and mark the charge executed. A run-time failure marks the charge failed (it stays at the
worst case); a crash leaves it reserved at the worst case (docs/LEDGER.md).

Stages (docs/PTR.md has the theorems):
- ``iqr``: M_IQR (Dwork & Lei 2009 §3, odp_privacy_accounting.md §4.2) on the quantile pair
  (¼, ¾) with per-test ε_u = ε/3, each test at δ/2: ({ℝ, ⊥}, E, δ)-ODP with E(ℝ) = 3ε_u = ε,
  E(⊥) = 2ε_u (Lemma 10).
- ``median`` / ``trimmed_mean`` with ``bound=β``: one (ε_p, δ)-PTR function (Def. 9) with ε_p =
  ε/2: E(released) = ε, E(⊥) = ε/2.
- without ``bound``: the scale stage first (M_IQR on (¼, ¾) for the median, on (α/2, 1 − α/2) for
  the trimmed mean) with ε·split, then, only if it released a scale s, the PTR function with the
  proposal β = s·c·K·(T + 2τ)/rows_hint (public ``rows_hint``: it only steers utility) with
  ε·(1 − split). Composed by Alg. 1: cells 2ε_s | 3ε_s + ε_p | 3ε_s + 2ε_p (the second stage is
  the constant ⊥ mechanism, cost 0, when the scale is ⊥: Def. 9 condition 1). δ = δ/2 + δ/2 is
  charged whatever the branch (never refunded, Alg. 1 line 15).
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from .. import calibration as cal
from ..accounting import get_accountant, odp_realized
from ..controller import charge_first
from ..cost import MechanismCost, PrivacyCost
from ..errors import BackendError, CatalogError, DPCHError, InvalidParameter, QueryRejected
from ..mechanisms import LaplaceMechanism
from ..plan import QueryOptions
from . import sql as S
from .calibration import BUCKETS, NoisyTest, iqr_cells, log_bin_width, log_bins, ptr_cells

STATISTICS = ("median", "iqr", "trimmed_mean")
KIND = "threshold"  # an (ε, δ) mechanism for the accountants (dp_params reads epsilon, delta)
MAX_LEVEL_DENOMINATOR = 10 ** 6
MIN_BASE = 1.01  # M_IQR's bins number about ln(65536)/ln(base): ~1 100 here, unbounded as base → 1
PROPOSAL_FACTOR = 8.0  # proposal_from_scale


@dataclass(frozen=True)
class PtrResult:
    """The answer of a propose-test-release run.

    ``branch`` is "released" or "bottom" (⊥: ``value`` is None); ``value`` is in the column's
    units. ``epsilon_charged`` is what the ledger keeps after settlement (the realised ODP cell),
    ``epsilon_reserved`` the worst case charged before anything ran, ``delta`` the δ charged (never
    refunded). ``proposed_scale`` is the proposal β of the PTR function (column units) for the
    median/trimmed mean, or the bin base of M_IQR's discretisation for the IQR. ``stages`` lists
    each stage run (public facts only: names, ε, thresholds, branch)."""

    statistic: str
    branch: str
    value: float | None
    epsilon_charged: float
    epsilon_reserved: float
    delta: float
    proposed_scale: float | None
    dataset: str = ""
    receipt: Any = field(default=None, repr=False, compare=False)
    stages: tuple[dict, ...] = ()

    @property
    def released(self) -> bool:
        return self.branch == "released"


@dataclass(frozen=True)
class _Stage:
    name: str  # "scale" | "median" | "trimmed_mean"
    epsilon: float  # ε per test (ε_u for M_IQR, ε_p for a PTR function)
    delta: float  # δ of the stage
    cells: tuple[float, ...]  # declared ODP cells

    def cost(self, label: str) -> MechanismCost:
        return MechanismCost(kind=KIND, sensitivity=0.0, scale=0.0, epsilon=max(self.cells), delta=self.delta,
                             rho=None, label=label, odp_epsilons=self.cells)


def _number(v: Any, name: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise InvalidParameter(f"{name} must be a finite number")
    return float(v)


@dataclass
class PtrRun:
    """One propose-test-release run (module docstring). ``run()`` returns a PtrResult."""

    conn: Any
    statistic: str
    table: str
    column: str
    epsilon: float
    delta: float
    where: str | None = None
    alpha: float | None = None
    bound: float | None = None
    rows_hint: int | None = None
    base: float = 1.1
    split: float = 0.5
    options: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.statistic not in STATISTICS:
            raise InvalidParameter(f"statistic must be one of {', '.join(STATISTICS)}")
        self.epsilon = cal.check_epsilon(self.epsilon)
        self.delta = cal.check_delta(self.delta)
        for name in ("table", "column"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name).strip():
                raise InvalidParameter(f"{name} must be a non-empty string")
        if self.where is not None and (not isinstance(self.where, str) or not self.where.strip()):
            raise InvalidParameter("where must be a SQL condition (a non-empty string) or None")
        self.base = _number(self.base, "base")
        if not MIN_BASE <= self.base <= 16.0:
            raise InvalidParameter(f"base (the ratio of M_IQR's log bins) must lie in [{MIN_BASE:g}, 16]")
        self.split = _number(self.split, "split")
        if not 0.0 < self.split < 1.0:
            raise InvalidParameter("split (the fraction of ε for the scale stage) must lie in (0, 1)")
        if self.statistic == "trimmed_mean":
            a = _number(self.alpha if self.alpha is not None else math.nan, "alpha")
            if not 0.0 < a < 1.0:
                raise InvalidParameter("alpha (the trimmed fraction, α/2 from each end) must lie in (0, 1)")
            self.alpha = a
        elif self.alpha is not None:
            raise InvalidParameter(f"alpha applies to the trimmed mean only, not to {self.statistic}")
        if self.statistic == "iqr":
            if self.bound is not None or self.rows_hint is not None:
                raise InvalidParameter("bound and rows_hint apply to the median and the trimmed mean, not to iqr")
        elif self.bound is not None:
            self.bound = _number(self.bound, "bound")
            if self.bound <= 0:
                raise InvalidParameter("bound (the proposed local-sensitivity bound β) must be > 0")
            if self.rows_hint is not None:
                raise InvalidParameter("give bound or rows_hint, not both")
        else:
            h = self.rows_hint
            if isinstance(h, bool) or not isinstance(h, int) or h < 1:
                raise InvalidParameter(f"{self.statistic}: give bound (the proposed bound β, column units) or "
                                       f"rows_hint (a public estimate of the rows, an integer >= 1)")
        extra = sorted(set(self.options) - set(QueryOptions.CONTRIBUTION))
        if extra:
            raise InvalidParameter(f"propose-test-release: option(s) {', '.join(extra)} not allowed; only "
                                   f"{', '.join(QueryOptions.CONTRIBUTION)}")

    # -- public parameters ----------------------------------------------------------------------
    @property
    def composed(self) -> bool:
        return self.statistic != "iqr" and self.bound is None

    def quantile_pair(self) -> tuple[Fraction, Fraction]:
        if self.statistic == "trimmed_mean":
            p = Fraction(self.alpha / 2).limit_denominator(MAX_LEVEL_DENOMINATOR)  # type: ignore[operator]
            p = max(p, Fraction(1, MAX_LEVEL_DENOMINATOR))
            return p, 1 - p
        return Fraction(1, 4), Fraction(3, 4)

    def trim(self) -> Fraction:
        return Fraction(self.alpha).limit_denominator(MAX_LEVEL_DENOMINATOR)  # type: ignore[arg-type]

    def stages(self) -> list[_Stage]:
        e, d = self.epsilon, self.delta
        if self.statistic == "iqr":
            return [_Stage("scale", e / 3.0, d, iqr_cells(e / 3.0))]
        if not self.composed:
            return [_Stage(self.statistic, e / 2.0, d, ptr_cells(e / 2.0))]
        es, ep = e * self.split / 3.0, e * (1.0 - self.split) / 2.0
        return [_Stage("scale", es, d / 2.0, iqr_cells(es)), _Stage(self.statistic, ep, d / 2.0, (0.0,) + ptr_cells(ep))]

    # -- the plan (the controller's bounding) -------------------------------------------------------
    def _plan(self, precheck: bool = False):
        """The controller's plan of the statistic's query; ``precheck``: the ledger's free
        affordability check first (run, which charges, asks it; the audit and fast_sql do not)."""
        from ..controller import prepare

        sql = f"SELECT quantile(0.5)({self.column}) FROM {self.table}" + (f" WHERE {self.where}" if self.where else "")
        try:
            prepared = prepare(self.conn, sql, epsilon=self.epsilon, delta=0.0, mechanism="laplace",
                               precheck=precheck, **self.options)
        except CatalogError as exc:
            raise QueryRejected(str(exc)) from None
        plan = prepared.plan
        b = plan.bound
        if b.grouped or b.keys or len(plan.quantities) != 1 or plan.quantities[0].kind != "quantile":
            raise QueryRejected("propose-test-release reads one numeric column of one table, ungrouped; nothing ran")
        if b.having is not None or b.order or b.limit is not None or b.offset:
            raise QueryRejected("propose-test-release: where must be a row filter (no HAVING, ORDER BY, LIMIT); "
                                "nothing ran")
        try:
            named = self.conn.catalog.qualify(self.table)
        except CatalogError as exc:
            raise QueryRejected(str(exc)) from None
        if prepared.dataset != named:
            raise QueryRejected(f"propose-test-release: column/where must not read another table than {named}; "
                                f"nothing ran")
        if getattr(plan.entry, "public", False):
            raise QueryRejected(f"{prepared.dataset} is a public table: nothing to protect, nothing to charge")
        q = plan.quantities[0]
        lo, hi = q.value_interval
        if not (math.isfinite(lo) and math.isfinite(hi) and hi > lo):
            raise QueryRejected("propose-test-release needs finite catalog bounds lo < hi for the column")
        # a unit moves at most q.rows rows of the histogram: add/remove → K = M, substitute → 2M
        step = q.rows * (2 if plan.bounding.neighbour == "substitute" else 1)
        return prepared, plan, step, (lo, hi)

    # -- SQL of each stage ---------------------------------------------------------------------------
    def make_test(self, epsilon: float, delta: float, bad_at_most: int) -> NoisyTest:
        """The noisy test of a stage (module docstring; the audit's broken fixtures override it)."""
        return NoisyTest.make(epsilon, delta, bad_at_most)

    def make_release(self, sensitivity: float, epsilon: float) -> LaplaceMechanism:
        """The release's Laplace mechanism: ε-DP at L1 sensitivity Δ (the paper, Thm 1)."""
        return LaplaceMechanism.calibrated(sensitivity, epsilon)

    def _scale_sql(self, groups: str, stage: _Stage, step: int, runs: int = 1) -> tuple[str, dict]:
        p1, p2 = self.quantile_pair()
        test = self.make_test(stage.epsilon, stage.delta / 2.0, 1)
        discs = [(log_bins(self.base, 0.0), test), (log_bins(self.base, 0.5), test)]
        width = max(log_bin_width(e) for e, _ in discs)
        release = self.make_release(width, stage.epsilon)
        facts = {"stage": "scale", "quantiles": [float(p1), float(p2)], "epsilon_per_test": stage.epsilon,
                 "delta_per_test": stage.delta / 2.0, "threshold": test.threshold, "cap": test.cap, "tau": test.tau,
                 "base": self.base, "log_sensitivity": width, "unit_step_rows": step}
        return S.scale_sql(groups, p1, p2, step, discs, release, runs), facts

    def _ptr_sql(self, groups: str, stage: _Stage, step: int, beta_units: float, runs: int = 1) -> tuple[str, dict]:
        test = self.make_test(stage.epsilon, stage.delta, 0)
        # the release's sensitivity: β plus a margin for the float window means (docs/PTR.md)
        release = self.make_release(beta_units * (1.0 + 2.0 ** -40) + 2.0 ** -30, stage.epsilon)
        if self.statistic == "median":
            width, value = S.median_width, S.median_value()
        else:
            alpha = self.trim()
            width, value = (lambda k: S.trimmed_width(alpha, k)), S.trimmed_value(alpha)
        facts = {"stage": self.statistic, "epsilon_per_test": stage.epsilon, "delta": stage.delta,
                 "threshold": test.threshold, "cap": test.cap, "tau": test.tau, "unit_step_rows": step}
        return S.proposal_sql(groups, width, value, step, beta_units, test, release, runs), facts

    def proposal_from_scale(self, scale_units: float, stage: _Stage, step: int) -> float:
        """β (bucket units) from a released scale s: c·s·K·(T + 2τ)/rows_hint. c = 8 for the
        median: x_(r+k) − x_(r−k) ≈ 2k/(n·f(median)) and 1/f ≈ 1.9·IQR for a normal, so 4, times
        2 for the scale's own noise (an under-estimate by e^{-ln 2} is common at small ε); 8/(1 − α)
        for the trimmed mean (its window of (1 − α)·n order statistics each shifted by k). A
        function of public values and of the released s only: it steers utility, never privacy."""
        test = NoisyTest.make(stage.epsilon, stage.delta, 0)
        c = PROPOSAL_FACTOR if self.statistic == "median" else PROPOSAL_FACTOR / (1.0 - self.alpha)  # type: ignore[operator]
        beta = c * scale_units * step * (test.threshold + 2.0 * test.tau) / self.rows_hint  # type: ignore[operator]
        return min(max(beta, 1.0), 2.0 ** 40)  # at least one bucket; at most what the release calibrates

    def fast_sql(self, runs: int, read: str | None = None) -> tuple[str, tuple[float, float]]:
        """The SQL of ``runs`` independent runs of a one-stage statistic (the IQR, or the median /
        trimmed mean with ``bound``) in one query: the same text as ``run`` executes, with the
        noise level over ``numbers(runs)`` (dpch.ptr.sql). ``read``: quoted SQL of another table
        read through this table's plan and salt (a neighbour D′ as the mechanism sees it). For the
        audit and the statistical tests; charges nothing (the caller is trusted: it reads data)."""
        from ..rewrite import _Rewriter

        if self.composed:
            raise InvalidParameter("the fast path covers one-stage runs: the IQR, or a median/trimmed mean with bound")
        _, plan, step, (lo, hi) = self._plan()
        rw = _Rewriter(plan, noise=False, selection=False, table=read)
        groups = rw._salted(rw.groups_sql())
        st = self.stages()[0]
        if st.name == "scale":
            return self._scale_sql(groups, st, step, runs)[0], (lo, hi)
        return self._ptr_sql(groups, st, step, self.bound / ((hi - lo) / BUCKETS), runs)[0], (lo, hi)  # type: ignore[operator]

    def to_value(self, units: float | None, interval: tuple[float, float]) -> float | None:
        """A released value in bucket units → the column's units, clamped to what the statistic
        can be ([0, hi − lo] for the IQR, [lo, hi] otherwise): post-processing."""
        if units is None:
            return None
        lo, hi = interval
        width = (hi - lo) / BUCKETS
        if self.statistic == "iqr":
            return min(max(units * width, 0.0), hi - lo)
        return min(max(lo + (units + 0.5) * width, lo), hi)

    # -- the run ---------------------------------------------------------------------------------------
    def run(self) -> PtrResult:
        from ..probe_db import probe_tables
        from ..rewrite import _Rewriter, probe_table_sql
        from ..typecheck import check_runs

        prepared, plan, step, (lo, hi) = self._plan(precheck=True)
        dataset = prepared.dataset
        width = (hi - lo) / BUCKETS
        stages = self.stages()
        beta0 = self.bound / width if self.bound is not None else 1.0
        if not (math.isfinite(beta0) and beta0 <= 2.0 ** 40):
            raise InvalidParameter("bound is out of range for the column's bounds")

        def sqls(rw, beta):
            groups = rw._salted(rw.groups_sql())
            out = []
            for st in stages:
                out.append(self._scale_sql(groups, st, step) if st.name == "scale" else
                           self._ptr_sql(groups, st, step, beta))
            return out

        # the type check on probe data (the real relation of a join), before the charge (as db.query)
        probe = _Rewriter(plan, noise=False, selection=False,
                          table=probe_table_sql(plan, probe_tables(self.conn)))
        for sql, _ in sqls(probe, beta0):
            check_runs(self.conn.backend, plan.entry, plan.bound, sql)
        rw = _Rewriter(plan, noise=False, selection=False, table=None)
        cost = PrivacyCost(tuple(st.cost(f"propose-test-release {self.statistic}: {st.name}") for st in stages))
        text = (f"PTR {self.statistic.upper()} OF {self.column} ON {dataset}"
                + (f" WHERE {self.where}" if self.where else "")
                + f" EPSILON {self.epsilon!r} DELTA {self.delta!r}"
                + (f" ALPHA {self.alpha!r}" if self.alpha is not None else "")
                + (f" BOUND {self.bound!r}" if self.bound is not None else f" ROWS_HINT {self.rows_hint!r}"
                   if self.rows_hint is not None else "") + f" BASE {self.base!r}")
        ledger, receipt = charge_first(self.conn, dataset, cost, text)
        cells: list[int | None] = [None] * len(stages)
        facts: list[dict] = []
        value_units: float | None = None
        beta = beta0
        try:
            groups = rw._salted(rw.groups_sql())
            for i, st in enumerate(stages):
                if st.name == "scale":
                    sql, f = self._scale_sql(groups, st, step)
                else:
                    sql, f = self._ptr_sql(groups, st, step, beta)
                    f["proposed_bound"] = beta * width
                branch, value = self._execute(sql)
                released = branch != 0 and value is not None
                f["branch"] = "released" if released else "bottom"
                facts.append(f)
                cells[i] = len(st.cells) - 1 if released else len(st.cells) - 2
                if not released:
                    for j in range(i + 1, len(stages)):
                        cells[j] = 0  # never invoked: the constant ⊥ mechanism (Def. 9 condition 1)
                    value_units = None
                    break
                value_units = value
                if st.name == "scale" and i + 1 < len(stages):
                    beta = self.proposal_from_scale(value, stages[i + 1], step)
        except Exception:  # noqa: BLE001 - after the charge: fail closed, no data in the text
            self._mark(receipt, "failed")
            raise BackendError(f"propose-test-release: the query failed at run time; the charge stays at its worst "
                               f"case ε = {cost.epsilon:g} (never settled)") from None
        realised = self._settle(receipt, cost, cells)
        out = self.to_value(value_units, (lo, hi))
        proposed = self.base if self.statistic == "iqr" else beta * width
        return PtrResult(self.statistic, "released" if out is not None else "bottom", out, realised,
                         cost.epsilon, sum(st.delta for st in stages), proposed, dataset, receipt, tuple(facts))

    def _execute(self, sql: str) -> tuple[int, float | None]:
        df = self.conn.backend.query_df(sql)
        if len(df) != 1 or list(df.columns) != ["branch", "value"]:
            raise BackendError("unexpected result shape")
        branch = int(df["branch"].iloc[0])
        v = df["value"].iloc[0]
        value = None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)
        return branch, value

    def _mark(self, receipt, outcome: str) -> None:
        try:
            self.conn.ledger.mark(receipt, outcome)
        except DPCHError as exc:
            warnings.warn(f"dpch: could not mark the PTR charge {outcome}: {exc}", RuntimeWarning, stacklevel=3)

    def _settle(self, receipt, cost: PrivacyCost, cells: list[int | None]) -> float:
        realised = cost.epsilon
        try:
            if get_accountant(receipt.accountant).supports_settlement:
                s = self.conn.ledger.settle(receipt, odp_realized(cost, cells), analyst=self.conn.analyst)
                realised = s.realized_epsilon
            self.conn.ledger.mark(receipt, "executed")
        except DPCHError as exc:  # the charge stays at its worst case: fail closed
            warnings.warn(f"dpch: the PTR charge could not be settled ({exc}); it stays at ε = {cost.epsilon:g}",
                          RuntimeWarning, stacklevel=3)
            realised = cost.epsilon
        return realised


def run_ptr(conn, statistic: str, table: str, column: str, *, epsilon: float, delta: float, where: str | None = None,
            alpha: float | None = None, bound: float | None = None, rows_hint: int | None = None, base: float = 1.1,
            split: float = 0.5, **options) -> PtrResult:
    """Run one propose-test-release statistic (module docstring). Privacy: (ε, δ)-DP for the
    dataset's neighbour relation at the unit level (each unit's rows bounded as the controller
    bounds them), charged by output DP: the ⊥ branch keeps only the tests' ε (docs/PTR.md)."""
    return PtrRun(conn, statistic, table, column, epsilon, delta, where, alpha, bound, rows_hint, base, split,
                  dict(options)).run()
