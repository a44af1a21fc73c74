"""The Python API of `dpch audit`.

    import dpch
    from dpch.audit import audit
    db = dpch.connect()
    report = audit(db, "SELECT dp_sum(amount, 0, 500, 1.0) FROM purchases", epsilon=1.0)
    print(report.text()); report.save("audit_report/")

What is audited:
- `audit(conn, sql, ...)`: trusted SQL (the `dp_*` SQL functions, or any SQL calling the noise
  UDFs), run on D and D′ tables built in the engine;
- `audit(conn, sql, via="controller", ...)`: an analyst query through the controller: its
  rewritten SQL (from `conn.explain`, which executes and charges nothing) is run on D and D′; the
  real ledger is never touched;
- `audit(callable, data=df, ...)`: a Python mechanism `f(df, n) -> n outputs` on a DataFrame
  (test fixtures, prototypes);
- `audit_samplers(sample_d, sample_dprime, ...)` and `audit_samples(out_d, out_dprime, ...)`:
  the statistics alone.

The audit is a trusted, administrative operation: it runs the mechanism thousands of times on
the data, which spends far more than ε. Run it on test or synthetic data, as `raw_query` would be.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd

from ..errors import BackendError, DPCHError
from .analysis import DEFAULT_METHODS, SELECTION_ALPHA, analyse
from .neighbours import AuditTables, frame_candidates
from .report import AuditReport
from .sampling import REP, classify_columns, draw_sql, referenced_tables, to_matrix
from .stats import FeatureSpec, certify, search_intervals

DEFAULT_SAMPLES = 20_000
DEFAULT_PILOT = 1_000


class _Progress:
    """A tqdm bar counting mechanism runs, plus analysis steps as the postfix."""

    def __init__(self, enabled: bool, total: int, desc: str = "audit"):
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=desc, unit="run", unit_scale=True, leave=False)

    def runs(self, n: int) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def step(self, label: str) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(label)

    def add_total(self, n: int) -> None:
        if self.bar is not None:
            self.bar.total += n
            self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _pilot_score(out_d: np.ndarray, out_dp: np.ndarray, names: list[str], delta: float
                 ) -> tuple[float, float]:
    """How distinguishable a candidate D′ is from D on pilot samples, as a sortable pair.

    First, estimated honestly: the best threshold/interval event is chosen on the first half of the
    pilot samples (selection level 1e-3) and its CP-based ε (level 0.05) is measured on the second
    half. Without the split, the maximum over thousands of events favours whichever candidate had
    the luckiest noise. Second, to rank candidates that certify nothing on a small pilot (small
    effects, e.g. Gaussian noise with a tiny δ): the largest standardised change of any output
    coordinate's location or scale, max_j |μ_D − μ_D′|/s + |ln(s_D/s_D′)| (+ the change in how
    often it is present). The pilot samples are never reused, so the choice does not affect the
    audit's confidence."""
    h_d, h_dp = len(out_d) // 2, len(out_dp) // 2
    spec = FeatureSpec.fit([out_d[:h_d], out_dp[:h_dp]], names)
    fd, fnames = spec.transform(out_d)
    fdp, _ = spec.transform(out_dp)
    cand = search_intervals(fd[:h_d], fdp[:h_dp], fnames, alpha=SELECTION_ALPHA, delta=delta,
                            max_boundaries=60)
    if cand is None:
        return (0.0, 0.0)
    col = fnames.index(cand.event.feature)
    in_d, in_dp = cand.event.contains(fd[h_d:, col]), cand.event.contains(fdp[h_dp:, col])
    cert = certify("pilot", "", cand.event.favours, in_d, in_dp, alpha=0.05, delta=delta)
    return (cert.epsilon_lb, _shift_statistic(out_d, out_dp))


def _shift_statistic(out_d: np.ndarray, out_dp: np.ndarray) -> float:
    best = 0.0
    with np.errstate(all="ignore"):
        for j in range(out_d.shape[1]):
            a, b = out_d[:, j], out_dp[:, j]
            a, b = a[np.isfinite(a)], b[np.isfinite(b)]
            presence = abs(len(a) / len(out_d) - len(b) / len(out_dp))
            if len(a) < 2 or len(b) < 2:
                best = max(best, presence)
                continue
            sa, sb = float(np.std(a)), float(np.std(b))
            pooled = float(np.sqrt((sa * sa + sb * sb) / 2))
            if pooled == 0:
                score = np.inf if a.mean() != b.mean() else 0.0
            else:
                score = abs(a.mean() - b.mean()) / pooled + (abs(np.log(sa / sb)) if sa > 0 and sb > 0 else 0.0)
            best = max(best, float(score) + presence)
    return best


def _check(epsilon, delta, confidence, samples):
    if not (isinstance(epsilon, (int, float)) and epsilon > 0 and np.isfinite(epsilon)):
        raise ValueError("epsilon must be positive and finite")
    if not 0 <= delta < 1:
        raise ValueError("delta must be in [0, 1)")
    if not 0 < confidence < 1:
        raise ValueError("confidence must be in (0, 1)")
    if samples < 16:
        raise ValueError("samples must be at least 16 per side")


# ------------------------------------------------------------------------------------------------
def audit(target, sql: str | None = None, *, epsilon: float, delta: float = 0.0,
          neighbour: str | None = None, samples: int = DEFAULT_SAMPLES, confidence: float = 0.95,
          data: pd.DataFrame | None = None, table: str | None = None, where=None,
          record: dict | None = None, unit_column: str | None = None, via: str = "sql",
          database: str = "dpch_audit", methods=DEFAULT_METHODS, pilot: int = DEFAULT_PILOT,
          max_rows: int = 10_000, rows_per_query: int = 20_000_000, vectorise: bool = True,
          report_dir=None, progress: bool = False, seed: int = 0, keep_tables: bool = False,
          options: dict | None = None) -> AuditReport:
    """Empirical privacy audit of one mechanism on neighbouring datasets.

    target: a `dpch.Connection` (then `sql` is the query) or a callable `f(df, n)` returning n
        outputs (then `data` is D).
    epsilon, delta: the claimed guarantee. For SQL functions, the ε written in the SQL. With
        via="controller", the budget requested from the controller; the claim audited is the
        cost its plan would charge.
    neighbour: remove-row | add-row | substitute-row | remove-unit | add-unit | substitute-unit.
        Default: remove-row, or under the controller the catalog's relation (remove-unit /
        substitute-unit for tables with a privacy unit; its column is taken from the catalog).
    samples: runs of the mechanism per side (half select the event, half certify it).
    confidence: 1 − α. A mechanism that is (ε, δ)-DP is reported as a VIOLATION with probability
        at most α (see dpch.audit.analysis for the argument).
    where / record: choose the neighbour yourself: `where` selects the row or unit to remove or
        replace (a SQL predicate; an index label or mask for DataFrames), `record` gives column
        values of the row to add or substitute. Without them the worst case is searched: every
        candidate of `dpch.audit.neighbours` is piloted with `pilot` runs per side and the most
        distinguishable one is audited.
    via: "sql" (run the SQL as written) or "controller" (audit the controller's rewrite;
        `options` are passed to it, e.g. {"mechanism": "gaussian"}).
    database: where the D / D′ tables are built (dropped afterwards unless keep_tables).
    """
    if callable(target) and not hasattr(target, "raw_query"):
        if data is None:
            raise ValueError("auditing a Python mechanism needs data= (the dataset D)")
        _check(epsilon, delta, confidence, samples)
        return _audit_callable(target, data, epsilon=epsilon, delta=delta,
                               neighbour=neighbour or "remove-row",
                               samples=samples, confidence=confidence, where=where, record=record,
                               unit_column=unit_column, methods=methods, pilot=pilot,
                               report_dir=report_dir, progress=progress, seed=seed)
    if sql is None:
        raise ValueError("auditing through a connection needs the SQL query")
    _check(epsilon, delta, confidence, samples)  # bad parameters fail before any work
    return _audit_sql(target, sql, epsilon=epsilon, delta=delta, neighbour=neighbour,
                      samples=samples, confidence=confidence, table=table, where=where,
                      record=record, unit_column=unit_column, via=via, database=database,
                      methods=methods, pilot=pilot, max_rows=max_rows,
                      rows_per_query=rows_per_query, vectorise=vectorise, report_dir=report_dir,
                      progress=progress, seed=seed, keep_tables=keep_tables, options=options)


def audit_samples(out_d, out_dprime, *, epsilon: float, delta: float = 0.0,
                  confidence: float = 0.95, names: list[str] | None = None,
                  methods=DEFAULT_METHODS, seed: int = 0, target: str = "given samples",
                  neighbour: str = "given", report_dir=None) -> AuditReport:
    """The statistics alone, on outputs already drawn on D and on D′ (vectors or n × k arrays)."""
    d, dp = np.asarray(out_d, dtype=float), np.asarray(out_dprime, dtype=float)
    _check(epsilon, delta, confidence, min(len(d), len(dp)))
    t0 = time.perf_counter()
    analysis = analyse(d, dp, epsilon=epsilon, delta=delta, confidence=confidence, names=names,
                       methods=methods, seed=seed)
    report = AuditReport(target, "samples", epsilon, delta, confidence, neighbour, neighbour,
                         min(len(d), len(dp)), analysis, timings={"analysis": time.perf_counter() - t0},
                         outputs_d=d, outputs_dprime=dp)
    if report_dir is not None:
        report.save(report_dir)
    return report


def audit_samplers(sample_d: Callable[[int], object], sample_dprime: Callable[[int], object], *,
                   epsilon: float, delta: float = 0.0, samples: int = DEFAULT_SAMPLES,
                   confidence: float = 0.95, methods=DEFAULT_METHODS, seed: int = 0,
                   target: str = "Python samplers", report_dir=None) -> AuditReport:
    """Audit two samplers `n -> n outputs` (the mechanism already bound to D and to D′)."""
    _check(epsilon, delta, confidence, samples)
    t0 = time.perf_counter()
    d, dp = _as_outputs(sample_d(samples)), _as_outputs(sample_dprime(samples))
    t1 = time.perf_counter()
    report = audit_samples(d, dp, epsilon=epsilon, delta=delta, confidence=confidence,
                           methods=methods, seed=seed, target=target)
    report.mode = "callable"
    report.timings = {"sampling": t1 - t0, **report.timings}
    if report_dir is not None:
        report.save(report_dir)
    return report


def _as_outputs(x) -> np.ndarray:
    if isinstance(x, pd.DataFrame):
        x = x.to_numpy(dtype=float)
    a = np.asarray(x, dtype=float)
    return a[:, None] if a.ndim == 1 else a


# ------------------------------------------------------------------------------------------------
def _audit_callable(mech, data: pd.DataFrame, *, epsilon, delta, neighbour, samples, confidence,
                    where, record, unit_column, methods, pilot, report_dir, progress, seed):
    t0 = time.perf_counter()
    cands = frame_candidates(data, neighbour, unit_column=unit_column, where=where, values=record)
    bar = _Progress(progress, 2 * samples + (len(cands) + 1) * pilot * (len(cands) > 1))
    scored: list[tuple[str, float]] = []
    chosen = cands[0]
    if len(cands) > 1:
        pd_ = _as_outputs(mech(data, pilot))
        bar.runs(pilot)
        best = (-1.0, -1.0)
        for desc, frame in cands:
            pdp = _as_outputs(mech(frame, pilot))
            bar.runs(pilot)
            names = [f"out{j}" for j in range(pd_.shape[1])]
            s = _pilot_score(pd_, pdp, names, delta) if pdp.shape == pd_.shape else (np.inf, 1.0)
            scored.append((desc, s[0]))
            if s > best:
                best, chosen = s, (desc, frame)
    t1 = time.perf_counter()
    d = _as_outputs(mech(data, samples))
    bar.runs(samples)
    dp = _as_outputs(mech(chosen[1], samples))
    bar.runs(samples)
    t2 = time.perf_counter()
    analysis = analyse(d, dp, epsilon=epsilon, delta=delta, confidence=confidence, methods=methods,
                       seed=seed, progress=bar.step)
    t3 = time.perf_counter()
    bar.close()
    name = getattr(mech, "__name__", type(mech).__name__)
    report = AuditReport(f"Python mechanism {name}", "callable", epsilon, delta, confidence,
                         neighbour, chosen[0], samples, analysis, candidates=scored,
                         timings={"worst-case search": t1 - t0, "sampling": t2 - t1,
                                  "analysis": t3 - t2},
                         outputs_d=d, outputs_dprime=dp)
    if report_dir is not None:
        report.save(report_dir)
    return report


# ------------------------------------------------------------------------------------------------
@dataclass
class ControllerQuery:
    """What the controller would run for an analyst query, and what it claims."""

    sql: str               # executable rewritten SQL (contains the table's secret salt)
    table: str             # database.table
    privacy_unit: str | None
    neighbour: str         # the catalog's relation: add_remove | substitute
    epsilon: float         # the cost the ledger would be charged
    delta: float

    @property
    def audit_neighbour(self) -> str:
        """The audit's neighbour kind for the catalog's relation."""
        if self.privacy_unit is None:
            return "remove-row" if self.neighbour == "add_remove" else "substitute-row"
        return "remove-unit" if self.neighbour == "add_remove" else "substitute-unit"


def controller_sql(conn, sql: str, *, epsilon: float, delta: float = 0.0, **options) -> ControllerQuery:
    """The controller's rewrite of an analyst query: parse → bind → plan → rewrite
    (`dpch.controller.prepare`), which runs nothing on the engine and touches no ledger. The audit
    then runs the rewritten SQL itself on D and D′, so no budget is ever charged."""
    from ..controller import prepare

    prepared = prepare(conn, sql, epsilon=epsilon, delta=delta, cache=False, **options)
    plan = prepared.plan
    return ControllerQuery(prepared.rewritten.sql, plan.entry.table, plan.entry.privacy_unit,
                           plan.entry.neighbour, float(plan.cost.epsilon), float(plan.cost.delta))


def _default_db(conn) -> str:
    return getattr(conn.backend, "database", None) or "default"


def _audit_sql(conn, sql, *, epsilon, delta, neighbour, samples, confidence, table, where, record,
               unit_column, via, database, methods, pilot, max_rows, rows_per_query, vectorise,
               report_dir, progress, seed, keep_tables, options):
    t0 = time.perf_counter()
    if via not in ("sql", "controller"):
        raise ValueError("via must be 'sql' or 'controller'")
    default_db = _default_db(conn)
    notes: list[str] = []
    claimed_eps, claimed_delta = epsilon, delta
    if via == "controller":
        cq = controller_sql(conn, sql, epsilon=epsilon, delta=delta, **(options or {}))
        run_sql = cq.sql
        claimed_eps, claimed_delta = cq.epsilon, cq.delta
        tables = [cq.table.lower()]
        if neighbour is None:
            neighbour = cq.audit_neighbour
        elif neighbour != cq.audit_neighbour:
            notes.append(f"the catalog's neighbour relation corresponds to {cq.audit_neighbour}; "
                         f"the claim is audited under {neighbour} instead")
        if unit_column is None:
            unit_column = cq.privacy_unit
        notes.append("audited the controller's rewritten SQL (prepared only: no ledger touched)")
    else:
        if options:
            raise ValueError("controller options need via='controller'")
        run_sql = sql
        tables = referenced_tables(run_sql, default_db)
        neighbour = neighbour or "remove-row"
    if table is not None:
        source = (table if "." in table else f"{default_db}.{table}").lower()
        if source not in tables:
            raise ValueError(f"the query does not read table {table}")
    elif len(tables) == 1:
        source = tables[0]
    elif not tables:
        raise ValueError("the query reads no table: an audit needs a table to build D and D′ from")
    else:
        raise ValueError(f"the query reads several tables ({', '.join(tables)}); choose one with table=")
    _check(claimed_eps, claimed_delta, confidence, samples)

    at = AuditTables(conn, source, database=database, max_rows=max_rows, unit_column=unit_column)
    bar = _Progress(progress, 2 * samples)

    def draw(target_table: str, n: int):
        try:
            return draw_sql(conn.raw_query, run_sql, {source: target_table}, n, default_db=default_db,
                            rows_per_query=rows_per_query, table_rows=at.rows, vectorise=vectorise,
                            on_batch=bar.runs)
        except DPCHError as exc:
            if via == "controller":  # the rewritten SQL holds the table's secret salt
                from ..execute import sanitize_error

                raise BackendError(f"the audited query failed: {sanitize_error(str(exc))}") from None
            raise

    try:
        at.create()
        if at.sampled:
            notes.append(f"D is a sample of {at.rows:,} rows of {source} (extreme rows included)")
        cands = at.candidates(neighbour, where=where, values=record)
        scored: list[tuple[str, float]] = []
        chosen = cands[0]
        if len(cands) > 1 and pilot > 0:
            bar.add_total((len(cands) + 1) * pilot)
            bar.step("worst-case search")
            pilot_d = draw(at.d, pilot)
            best = (-1.0, -1.0)
            for cand in cands:
                at.build(cand)
                pilot_dp = draw(at.dprime, pilot)
                s = _pilot_from_sets(run_sql, pilot_d, pilot_dp, claimed_delta)
                scored.append((cand.description, s[0]))
                if s > best:
                    best, chosen = s, cand
        at.build(chosen)
        t1 = time.perf_counter()
        bar.step("sampling D")
        set_d = draw(at.d, samples)
        bar.step("sampling D′")
        set_dp = draw(at.dprime, samples)
        t2 = time.perf_counter()
    finally:
        if not keep_tables:
            at.drop()
    cols = [c for c in set_d.frame.columns if c != REP]
    keys, outputs = classify_columns(run_sql, cols)
    (d, dp), names = to_matrix([set_d, set_dp], keys, outputs)
    analysis = analyse(d, dp, epsilon=claimed_eps, delta=claimed_delta, confidence=confidence,
                       names=names, methods=methods, seed=seed, progress=bar.step)
    t3 = time.perf_counter()
    bar.close()
    if not set_d.vectorised:
        notes.append("the query could not be vectorised: it ran once per sample")
    report = AuditReport(sql, via, claimed_eps, claimed_delta, confidence, neighbour,
                         chosen.description, samples, analysis, candidates=scored,
                         timings={"worst-case search": t1 - t0, "sampling": t2 - t1,
                                  "analysis": t3 - t2},
                         notes=notes, outputs_d=d, outputs_dprime=dp)
    if report_dir is not None:
        report.save(report_dir)
    return report


def _pilot_from_sets(sql, set_d, set_dp, delta) -> tuple[float, float]:
    cols = [c for c in set_d.frame.columns if c != REP]
    keys, outputs = classify_columns(sql, cols)
    (d, dp), names = to_matrix([set_d, set_dp], keys, outputs)
    if d.shape[1] == 0:
        return (0.0, 0.0)
    return _pilot_score(d, dp, names, delta)
