"""Sparse vector (AboveThreshold) as a session: ``db.sparse_vector(...)``, ``dpch svt``.

    with db.sparse_vector("demo.purchases", threshold=1000, epsilon=1.0, max_positives=3) as svt:
        for seg in segments:
            if svt.above(f"SELECT COUNT(*) FROM demo.purchases WHERE segment = '{seg}'"):
                ...
    svt.answers, svt.positives, svt.epsilon_spent, svt.receipt, svt.describe()

The mechanism is Alg. 2 of ``odp_privacy_accounting.md`` (§4.1, M_SVT: the variant of Lyu, Su &
Li 2017, Alg. 1), with its output-DP accounting (Lemma 8) settled by the ledger (Alg. 1 / Thm 7,
docs/LEDGER.md "Output-DP accounting").

**Algorithm.** ε = ε1 + ε2; by default ε1/ε2 = 1/(2c)^(2/3) (Lyu et al.'s ratio, quoted in §4.1),
or ``split`` = ε1/ε. Each test query q_i is a single-output, ungrouped COUNT or SUM over the
session's dataset, planned exactly as ``db.query`` plans it (parse → bind → total → plan → type
check). The value compared is the plan's bounded quantity ``__dp_q0`` (integer grid units of its
grid g, contribution bounding and clipping included), which never leaves ClickHouse. The session's
unit g0 and sensitivity Δ (an integer number of g0 units) are fixed by its first accepted query; a
later query of grid g = m·g0 (m a power of two ≥ 1) is compared as m·q_i with sensitivity m·L1_i,
which must be ≤ Δ (a finer grid, or a larger sensitivity, is rejected: a data-independent decision).
With T0 = ⌈T/g0⌉ (exact), the session

1. draws ρ ~ DLap(τ1) once, inside ClickHouse (``SELECT dpch_laplace_int(toInt64(0), b1)``), when
   Δ becomes known (the first accepted query), and keeps it in this object (never shown);
2. for each query, in ONE ClickHouse query, draws ν_i ~ DLap(τ2) and returns only the bit
   ``m·q_i + ν_i ≥ T0 + ρ`` (⊤ / ⊥); q_i + ν_i ≥ T/g0 + ρ and q_i + ν_i ≥ T0 + ρ are the same test
   for integers;
3. after c ⊤ answers, refuses further queries (Alg. 2 line 4; nothing runs).

DLap(τ) is the discrete Laplace P(k) ∝ e^{-|k|/τ} on the integers that ``dpch_laplace_int`` draws
with the CKS20 sampler; the kernel's τ is ``t/2^p ≥ b`` (``LaplaceMechanism.noise_scale_units``).
b1 = ``LaplaceMechanism.calibrated(Δ, ε1, integer=True)`` and b2 =
``LaplaceMechanism.calibrated(2Δ, ε2/c, integer=True)``; the session checks that both mechanisms'
grid is r = 1 (b ≤ 2^40: the Int64 value is not rounded, so ρ and ν are exactly integer DLap noise,
grid term 0) and that ``privacy_function(Δ) ≤ ε1`` and ``privacy_function(2Δ) ≤ ε2/c`` (exact
rational check). Otherwise the session is refused (InvalidParameter; a function of ε, c and the
plan only).

**Privacy (Lemma 8 with discrete noise).** Let x, x′ be neighbours (the dataset's neighbour
relation), so |m·q_i(x) − m·q_i(x′)| ≤ Δ for every accepted query. The proof of Lemma 8 uses two
facts about the noise, and both hold for DLap on the integers with Δ an integer:
(a) P(ρ = z − Δ) ≤ e^{Δ/τ1} P(ρ = z) ≤ e^{ε1} P(ρ = z) for every integer z;
(b) P(ν ≥ a − 2Δ) ≤ e^{2Δ/τ2} P(ν ≥ a) ≤ e^{ε2/c} P(ν ≥ a) for every integer a (sum the pointwise
    ratio p(k − 2Δ)/p(k) ≤ e^{2Δ/τ2} over k ≥ a), which is inequality (1) of the proof.
The integral over ρ becomes a sum over z ∈ ℤ, and the substitution z ↦ z − Δ is a bijection of ℤ.
The ⊥ factors f_i(x, z − Δ) ≤ f_i(x′, z) are deterministic (q(x) − Δ ≤ q(x′)). So for every
answer sequence a with c′ ⊤'s, P(a | x) ≤ e^{ε1 + (c′/c)ε2} P(a | x′), for adaptively chosen
queries and stopping (the STOP query of Alg. 2): M_SVT is (P, E, 0)-ODP with P = {S_c′}, E(S_c′) =
ε1 + (c′/c)·ε2 (Lemma 8), and sup E = ε1 + ε2 = ε (Lemma 4). tests/test_svt.py checks the ratio
exactly for small sessions (sums over ρ's distribution with the kernel's τ1, τ2).

**Ledger.** ``__enter__`` makes ONE charge on the dataset: a ``MechanismCost`` of kind
"sparse_vector" reserving sup E = ε (Alg. 1 line 9) with ``odp_epsilons`` = (E(S_0), …, E(S_c))
(Def. 2). ``__exit__`` (normal end, ``break``, max_positives reached, or an exception inside the
block) settles the cell c′ = the number of ⊤ answers released (Alg. 1 lines 13-14) with
``ledger.settle(receipt, odp_realized(cost, [c′]))`` and marks the charge executed. Settlement is
a refund only under the accountants with simple composition (``pure``, ``basic``, ``odp``: Thm 7);
under the others the session works the same and stays charged at ε (``Ledger.settle`` would refuse,
so it is not called). A run-time failure of a test query (after the type check, so not a function
of the data) marks the charge failed: it is never settled and stays at ε, and the session refuses
further queries. A process that dies holds the only settlement token (docs/LEDGER.md): the charge
stays at ε for good. Budget refusal at open: ``BudgetExceeded``, nothing charged.

The embedded engine is not a security boundary against its own Python caller (DESIGN.md, fact
sheet): ρ lives in this process's memory, like the ledger's settlement token. A gateway request
carrying the list of queries would keep it server side (not built yet).
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from sqlglot import exp

from . import calibration as cal
from .accounting import SPARSE_VECTOR_KIND, get_accountant, odp_realized
from .controller import charge_first
from .cost import MechanismCost, PrivacyCost
from .errors import BackendError, CatalogError, DPCHError, InvalidParameter, QueryRejected
from .mechanisms import LaplaceMechanism
from .plan import QueryOptions

__all__ = ["SparseVector", "SvtCalibration", "default_split", "svt_epsilons", "KIND"]

KIND = SPARSE_VECTOR_KIND
COUNT_FUNCS = ("count", "count_distinct_unit", "count_distinct")
SUM_FUNCS = ("sum",)
QUANTITY_KINDS = ("rows", "units", "sum", "distinct")
MAX_MULTIPLIER = 2 ** 62  # m·q stays within Int128 (|q| < 2^63)
MAX_THRESHOLD_UNITS = 2 ** 100  # T0 + ρ stays within Int128
MAX_POSITIVES = 10_000  # c + 1 ODP cells are reserved in the ledger (Lemma 8)


def default_split(max_positives: int) -> float:
    """ε1/ε for Lyu et al.'s ratio ε1/ε2 = 1/(2c)^(2/3) (odp_privacy_accounting.md §4.1)."""
    r = 1.0 / (2.0 * max_positives) ** (2.0 / 3.0)
    return r / (1.0 + r)


def svt_epsilons(epsilon1: float, epsilon2: float, c: int) -> tuple[float, ...]:
    """E(S_c′) = ε1 + (c′/c)·ε2 for c′ = 0..c (Lemma 8); the last value is ε1 + ε2 = sup E."""
    top = epsilon1 + epsilon2
    return tuple(min(top, epsilon1 + k * (epsilon2 / c)) for k in range(c)) + (top,)


@dataclass(frozen=True)
class SvtCalibration:
    """The noise of a session once Δ is known (public parameters only).

    ``sensitivity_units`` = Δ in grid units of ``grid`` (g0); ``b1``/``b2`` are the Laplace scales
    in grid units (ρ: Δ at ε1; ν: 2Δ at ε2/c); ``tau1``/``tau2`` the discrete Laplace scales the
    kernel really uses (≥ b)."""

    sensitivity_units: int
    grid: float
    epsilon1: float
    per_positive_epsilon: float
    b1: float
    b2: float
    tau1: float
    tau2: float

    @property
    def sensitivity(self) -> float:
        """Δ in value units."""
        return self.sensitivity_units * self.grid

    @classmethod
    def make(cls, sensitivity_units: int, grid: float, epsilon1: float, per_positive_epsilon: float
             ) -> "SvtCalibration":
        d = int(sensitivity_units)
        m1 = LaplaceMechanism.calibrated(d, epsilon1, integer=True)
        m2 = LaplaceMechanism.calibrated(2 * d, per_positive_epsilon, integer=True)
        for mech, what in ((m1, "threshold noise ρ"), (m2, "answer noise ν")):
            if mech.granularity != 1.0:
                raise InvalidParameter(f"sparse vector: the {what} scale exceeds 2^40 grid units (sensitivity too "
                                       f"large for ε and max_positives); use a larger epsilon or fewer max_positives")
        # the relations the proof needs (module docstring (a), (b)), exact rational checks
        if not (m1.privacy_relation(d, epsilon1) and m2.privacy_relation(2 * d, per_positive_epsilon)):
            raise InvalidParameter("sparse vector: calibration failed its privacy check")  # pragma: no cover
        return cls(d, float(grid), float(epsilon1), float(per_positive_epsilon), m1.scale, m2.scale,
                   m1.noise_scale_units, m2.noise_scale_units)

    def mechanisms(self) -> tuple[LaplaceMechanism, LaplaceMechanism]:
        return LaplaceMechanism(self.b1, True), LaplaceMechanism(self.b2, True)


@dataclass(frozen=True)
class _Test:
    """One accepted test query, ready to run (private to the session)."""

    rewriter: Any  # dpch.rewrite._Rewriter(plan, noise=False, selection=False, table=None)
    multiplier: int
    sensitivity_units: int  # the query's L1 in its own grid units
    grid: float


def prepare_single_value(conn, sql: str, epsilon: float, options: dict, who: str, *, dataset: str | None = None):
    """parse → bind → total → plan of a session's query (sparse vector, refine): one ungrouped
    COUNT or SUM (``SparseVector._check_shape``) with only contribution options, Laplace noise,
    and an L1 sensitivity of a whole number of grid units. ``dataset``: the table it must read.
    Runs nothing on the data; returns (prepared, the quantity). ``who`` prefixes the errors."""
    from .controller import prepare

    extra = sorted(set(options) - set(QueryOptions.CONTRIBUTION))
    if extra:
        raise InvalidParameter(f"{who}: option(s) {', '.join(extra)} not allowed; only "
                               f"{', '.join(QueryOptions.CONTRIBUTION)}")
    if not isinstance(sql, str):
        raise InvalidParameter(f"{who}: the query must be SQL text")
    prepared = prepare(conn, sql, epsilon=epsilon, delta=0.0, mechanism="laplace", **options)
    if dataset is not None and prepared.dataset != dataset:
        raise QueryRejected(f"the test query reads {prepared.dataset}; this {who.replace(' ', '-')} session is on "
                            f"{dataset}; nothing ran")
    q = SparseVector._check_shape(prepared.plan)
    if q.l1 != math.floor(q.l1) or q.l1 < 1:
        raise QueryRejected(f"{who}: the query's sensitivity is not a whole number of grid units")
    return prepared, q


@dataclass(repr=False)
class SparseVector:
    """A sparse-vector session on one dataset (module docstring). Open it with ``with``."""

    conn: Any
    dataset: str
    threshold: float
    epsilon: float
    max_positives: int = 1
    delta: float = 0.0
    split: float | None = None
    answers: list[bool] = field(default_factory=list)
    receipt: Any = None
    epsilon_spent: float | None = None
    state: str = "new"  # new | open | failed | closed
    calibration: SvtCalibration | None = None
    queries_run: int = 0
    _rho: int | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        e = cal.check_epsilon(self.epsilon)
        self.epsilon = e
        c = self.max_positives
        if isinstance(c, bool) or not isinstance(c, int) or not 1 <= c <= MAX_POSITIVES:
            # the reservation holds one ODP cell per possible count of ⊤ answers (svt_epsilons)
            raise InvalidParameter(f"max_positives must be an integer from 1 to {MAX_POSITIVES}")
        if isinstance(self.delta, bool) or not isinstance(self.delta, (int, float)) or self.delta != 0:
            raise InvalidParameter("delta must be 0: the Laplace sparse vector is pure ε-DP (Lemma 8, δ = 0)")
        self.delta = 0.0
        t = self.threshold
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
            raise InvalidParameter("threshold must be a finite number")
        self.threshold = t
        s = default_split(c) if self.split is None else self.split
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not (0.0 < s < 1.0):
            raise InvalidParameter("split (the fraction ε1/ε of ε for the threshold noise) must lie in (0, 1)")
        self.split = float(s)
        if not isinstance(self.dataset, str):
            raise InvalidParameter("dataset must be a table name")
        try:
            self.dataset = self.conn.catalog.qualify(self.dataset)
            entry = self.conn.catalog.get(self.dataset)
        except CatalogError as exc:
            raise QueryRejected(str(exc)) from None
        if getattr(entry, "public", False):
            raise QueryRejected(f"{self.dataset} is a public table: nothing to protect, nothing to charge")

    # -- parameters -----------------------------------------------------------------------------
    @property
    def epsilon1(self) -> float:
        return self.epsilon * self.split  # type: ignore[operator]

    @property
    def epsilon2(self) -> float:
        return self.epsilon - self.epsilon1

    @property
    def per_positive_epsilon(self) -> float:
        """ε2/c: what each ⊤ answer costs (Lemma 8)."""
        return self.epsilon2 / self.max_positives

    @property
    def positives(self) -> int:
        return sum(1 for a in self.answers if a)

    @property
    def cost(self) -> PrivacyCost:
        """The reservation: sup E = ε, cells E(S_c′) for c′ = 0..c (Def. 2, Lemma 8)."""
        cells = svt_epsilons(self.epsilon1, self.epsilon2, self.max_positives)
        return PrivacyCost((MechanismCost(kind=KIND, sensitivity=0.0, scale=0.0, epsilon=self.epsilon, delta=0.0,
                                          rho=None, label=f"sparse vector (c={self.max_positives})",
                                          odp_epsilons=cells),))

    def describe(self) -> str:
        """The session's parameters (no data, no ρ)."""
        lines = [f"sparse vector on {self.dataset}: threshold {self.threshold:g}, ε = {self.epsilon:.6g} "
                 f"(ε1 = {self.epsilon1:.6g} threshold noise, ε2 = {self.epsilon2:.6g} answer noise, "
                 f"ε2/c = {self.per_positive_epsilon:.6g} per ⊤), max_positives c = {self.max_positives}",
                 "cost: ε1 + (c′/c)·ε2 for c′ ⊤ answers (odp_privacy_accounting.md Lemma 8), settled at exit"]
        k = self.calibration
        if k is None:
            lines.append("Δ: fixed by the first accepted query")
        else:
            lines.append(f"Δ = {k.sensitivity:.6g} ({k.sensitivity_units} units of {k.grid:.6g}); threshold noise "
                         f"b1 = {k.b1 * k.grid:.6g} (discrete Laplace, {k.tau1:.6g} units), answer noise "
                         f"b2 = {k.b2 * k.grid:.6g} ({k.tau2:.6g} units)")
        lines.append(f"state: {self.state}; {len(self.answers)} answer(s), {self.positives} ⊤"
                     + ("" if self.epsilon_spent is None else f"; ε spent {self.epsilon_spent:.6g}"))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"SparseVector(dataset={self.dataset!r}, threshold={self.threshold!r}, epsilon={self.epsilon!r}, "
                f"max_positives={self.max_positives}, state={self.state!r}, answers={self.answers!r})")

    # -- session ----------------------------------------------------------------------------------
    def __enter__(self) -> "SparseVector":
        if self.state != "new":
            raise InvalidParameter("a sparse-vector session opens once; start a new one with db.sparse_vector(...)")
        text = (f"SPARSE VECTOR ON {self.dataset} THRESHOLD {self.threshold!r} EPSILON {self.epsilon!r} "
                f"MAX_POSITIVES {self.max_positives} SPLIT {self.split!r}")
        _, self.receipt = charge_first(self.conn, self.dataset, self.cost, text)
        self.state = "open"
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.close()
        return False

    def close(self) -> None:
        """Settle the charge at the realised cell (idempotent; ``__exit__`` calls it)."""
        if self.state == "open":
            self.state = "closed"
            self.epsilon_spent = self._settle()
        elif self.state == "failed":
            self.state = "closed"
            self.epsilon_spent = self.epsilon

    def _settle(self) -> float:
        ledger = self.conn.ledger
        r = self.receipt
        c1 = self.positives
        realised = self.epsilon
        try:
            if get_accountant(r.accountant).supports_settlement:
                s = ledger.settle(r, odp_realized(r.cost, [c1]), analyst=self.conn.analyst)
                realised = s.realized_epsilon
            ledger.mark(r, "executed")
        except DPCHError as exc:  # the charge stays at its worst case: fail closed
            warnings.warn(f"dpch: the sparse-vector charge could not be settled ({exc}); it stays at ε = "
                          f"{self.epsilon:g}", RuntimeWarning, stacklevel=3)
            realised = self.epsilon
        return realised

    # -- test queries --------------------------------------------------------------------------------
    def refuse_if_none_answerable(self, queries: list[str]) -> None:
        """Before the session opens (and is charged its ε), for callers that know its whole list
        of queries (`dpch svt`, the gateway's /dpch/svt): raise if the controller accepts none of
        them, so that a session that could answer nothing costs nothing. First the ledger's free
        affordability check of ε on the session's dataset (an analyst without the budget learns
        nothing of how the engine reads the queries), then each query on its own as ``above``
        prepares it (parse → plan; runs nothing on the data): the outcome depends on the queries,
        the catalog and the budget only, never on the data. With one acceptable query the session
        opens as before, and its other queries are refused one by one inside it."""
        from .controller import charging_ledger

        if self.state != "new":
            raise InvalidParameter("refuse_if_none_answerable is a check before the session opens")
        charging_ledger(self.conn).precheck(self.conn.analyst, self.dataset, self.epsilon, 0.0)
        first = None
        for sql in queries:
            try:
                prepare_single_value(self.conn, sql, self.epsilon, {}, "sparse vector", dataset=self.dataset)
                return
            except (QueryRejected, InvalidParameter) as exc:
                first = first or exc
        if first is not None:
            raise type(first)(f"no query of this sparse-vector session can be answered, so it was not opened: "
                              f"nothing ran and nothing was charged (the first query: {first})")

    def above(self, sql: str, **options) -> bool:
        """⊤ (True) iff the query's noisy bounded value is above the noisy threshold. A rejected
        query (QueryRejected / InvalidParameter) runs nothing and consumes nothing."""
        if self.state == "new":
            raise InvalidParameter("open the session first: with db.sparse_vector(...) as svt: svt.above(...)")
        if self.state == "failed":
            raise QueryRejected("this sparse-vector session failed (a query failed at run time); its charge stays "
                                "at the full ε and it answers nothing more; nothing ran")
        if self.state != "open":
            raise QueryRejected("this sparse-vector session is closed; nothing ran")
        if self.positives >= self.max_positives:
            raise QueryRejected(f"max_positives = {self.max_positives} ⊤ answers reached: the sparse vector stops "
                                f"(Alg. 2 line 4); nothing ran")
        test, new_cal = self._prepare(sql, options)
        if new_cal is not None:
            self._start(new_cal)
        return self._run(test)

    def _prepare(self, sql: str, options: dict) -> tuple[_Test, SvtCalibration | None]:
        """parse → bind → total → plan → checks → type check; runs nothing on the data."""
        from .probe_db import check_before_charge, probe_tables
        from .rewrite import _Rewriter, probe_table_sql
        from .typecheck import check_runs

        prepared, q = prepare_single_value(self.conn, sql, self.epsilon, options, "sparse vector",
                                           dataset=self.dataset)
        plan = prepared.plan
        l1 = int(q.l1)
        k = self.calibration
        new_cal = None
        if k is None:
            if not (math.isfinite(q.grid) and q.grid > 0):
                raise QueryRejected("sparse vector: the query has no usable grid")  # pragma: no cover
            new_cal = SvtCalibration.make(l1, q.grid, self.epsilon1, self.per_positive_epsilon)
            k = new_cal
            mult = 1
        else:
            ratio = Fraction(q.grid) / Fraction(k.grid)
            if ratio.denominator != 1:
                raise QueryRejected(f"sparse vector: the query's grid ({q.grid:g}) is finer than the session's "
                                    f"({k.grid:g}, fixed by its first query); nothing ran")
            mult = int(ratio)
            if mult > MAX_MULTIPLIER or l1 * mult > k.sensitivity_units:
                raise QueryRejected(
                    f"sparse vector: the query's sensitivity ({l1 * q.grid:.6g}) exceeds the session's Δ = "
                    f"{k.sensitivity:.6g} (fixed by its first query); nothing ran and nothing was consumed")
        t_units = math.ceil(Fraction(self.threshold) / Fraction(k.grid))
        if abs(t_units) > MAX_THRESHOLD_UNITS:
            raise InvalidParameter("sparse vector: the threshold is too large for the query's grid")
        # the type check db.query makes before charging, on probe data (the real relation of a join)
        check_before_charge(self.conn, plan)
        probe_rw = _Rewriter(plan, noise=False, selection=False,
                             table=probe_table_sql(plan, probe_tables(self.conn)))
        check_runs(self.conn.backend, plan.entry, plan.bound, self._test_sql(probe_rw, mult, k, 0))
        rw = _Rewriter(plan, noise=False, selection=False, table=None)
        return _Test(rw, mult, l1, q.grid), new_cal

    @staticmethod
    def _check_shape(plan):
        """The test query's plan must be one bare COUNT or SUM, ungrouped (data-independent)."""
        b = plan.bound
        what = "a sparse-vector test query must be one ungrouped COUNT or SUM, e.g. SELECT COUNT(*) FROM t WHERE ..."
        if b.grouped or b.keys:
            raise QueryRejected(f"{what}: GROUP BY is not allowed; nothing ran")
        if len(b.outputs) != 1 or len(b.aggregates) != 1 or len(plan.aggregates) != 1:
            raise QueryRejected(f"{what}: exactly one output column, one aggregate; nothing ran")
        out = b.outputs[0]
        t = out.template
        if out.kind != "aggregate" or not (isinstance(t, exp.Column) and t.name == b.aggregates[0].placeholder):
            raise QueryRejected(f"{what}: the output must be the aggregate itself, not an expression of it; "
                                f"nothing ran")
        if b.having is not None or b.order or b.limit is not None or b.offset:
            raise QueryRejected(f"{what}: HAVING, ORDER BY, LIMIT and OFFSET are not allowed; nothing ran")
        ap = plan.aggregates[0]
        if ap.func not in COUNT_FUNCS + SUM_FUNCS:
            raise QueryRejected(f"{what}: {ap.func.upper()} is not a COUNT or SUM; nothing ran")
        if plan.top_k is not None or plan.selection is not None or len(plan.quantities) != 1:
            raise QueryRejected(f"{what}; nothing ran")  # pragma: no cover - ungrouped plans have neither
        q = plan.quantities[0]
        if q.kind not in QUANTITY_KINDS or q.centre != 0.0:
            raise QueryRejected(f"{what}; nothing ran")  # pragma: no cover
        return q

    def _test_sql(self, rw, mult: int, k: SvtCalibration, rho: int) -> str:
        """``SELECT toUInt8(m·q + ν >= T0 + ρ) AS above FROM (<bounded value>)``: the bounded value
        never leaves ClickHouse; ν is drawn once (one row); T0 + ρ is an exact integer literal."""
        from .typecheck import with_settings

        groups = "\n".join("  " + line for line in rw._salted(rw.groups_sql()).splitlines())
        nu = LaplaceMechanism(k.b2, True).sql("toInt64(0)")
        lhs = f"toInt128({rw.plan.quantities[0].column})" + (f" * toInt128({mult})" if mult != 1 else "")
        t0 = math.ceil(Fraction(self.threshold) / Fraction(k.grid))
        return with_settings(f"SELECT toUInt8({lhs} + toInt128({nu}) >= toInt128('{t0 + rho}')) AS above\n"
                             f"FROM (\n{groups}\n)")

    def _start(self, k: SvtCalibration) -> None:
        """Fix Δ and draw ρ inside ClickHouse (Alg. 2 line 1), once."""
        m1, _ = k.mechanisms()
        try:
            df = self.conn.backend.query_df(f"SELECT {m1.sql('toInt64(0)')} AS rho")
            rho = int(df["rho"].iloc[0])
        except Exception as exc:  # noqa: BLE001 - no data was read; the session cannot continue
            self._fail()
            raise BackendError(f"sparse vector: drawing the threshold noise failed ({type(exc).__name__}); the "
                               f"session is marked failed and its charge stays at ε = {self.epsilon:g} "
                               f"(never settled)") from None
        self.calibration = k
        self._rho = rho

    def _run(self, test: _Test) -> bool:
        assert self._rho is not None and self.calibration is not None
        sql = self._test_sql(test.rewriter, test.multiplier, self.calibration, self._rho)
        self.queries_run += 1
        try:
            df = self.conn.backend.query_df(sql)
            if len(df) != 1 or list(df.columns) != ["above"]:
                raise BackendError("unexpected result shape")
            answer = bool(int(df["above"].iloc[0]))
        except Exception:  # noqa: BLE001 - any failure after the type check: fail closed, no data in the text
            self._fail()
            raise BackendError(f"sparse vector: the test query failed at run time; the session is marked failed, "
                               f"its charge stays at the full ε = {self.epsilon:g} (never settled) and it answers "
                               f"nothing more") from None
        self.answers.append(answer)
        return answer

    def _fail(self) -> None:
        self.state = "failed"
        try:
            self.conn.ledger.mark(self.receipt, "failed")
        except DPCHError as exc:
            warnings.warn(f"dpch: could not mark the sparse-vector charge failed: {exc}", RuntimeWarning, stacklevel=3)
