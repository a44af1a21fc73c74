"""`dpch.connect()`: one object per analyst session, holding the engine, the privacy catalog and the
budget ledger.

- `raw_query(sql)` is the trusted passthrough: SQL runs as written (the `dp_*` SQL functions work,
  so do raw reads). It has no ledger and no privacy guarantee beyond what the SQL itself computes.
- `query(sql, epsilon=...)` is the budget-enforcing path (parse → bind → plan → charge → rewrite →
  execute → post-process), built by the controller.
"""
from __future__ import annotations

import getpass
from pathlib import Path
from typing import TYPE_CHECKING

from .backends import Backend, EmbeddedBackend, ServerBackend
from .config import default_data_dir

if TYPE_CHECKING:
    import pandas as pd


class Connection:
    def __init__(self, backend: Backend, *, analyst: str, data_dir: Path, ledger_path: Path | None = None):
        self.backend = backend
        self.analyst = analyst
        self.data_dir = data_dir
        self.ledger_path = ledger_path or data_dir / "ledger.sqlite"
        self._catalog = None
        self._ledger = None

    # -- trusted path -------------------------------------------------------------------------
    def raw_query(self, sql: str) -> pd.DataFrame:
        """Run trusted SQL as-is and return a DataFrame. No ledger, no rewriting: the privacy
        guarantee is exactly that of the SQL written (e.g. a `dp_sum(...)` is row-level ε-DP, a
        plain `SELECT *` is not private at all)."""
        return self.backend.query_df(sql)

    def command(self, sql: str) -> None:
        """Run a trusted statement that returns nothing (DDL, INSERT)."""
        self.backend.command(sql)

    def insert_df(self, table: str, df: pd.DataFrame) -> None:
        """Insert a DataFrame into an existing table (trusted); its columns must match the
        table's, in order. To create a table from data, use `load`."""
        self.backend.insert_df(table, df)

    def load(self, table: str, source, *, order_by=None, format: str | None = None,
             if_exists: str = "fail", progress: bool | None = None):
        """Create ``table`` from a pandas DataFrame, an Arrow table, or CSV/Parquet/JSON-lines
        file(s) (a path, a glob or a list), with the schema ClickHouse infers; ``order_by`` (e.g.
        the privacy unit column) becomes the non-Nullable sorting key. Trusted operation, charges
        nothing; then register the table in the privacy catalog. Returns a `dpch.load.LoadResult`.
        See `dpch.load.load` for ``format``, ``if_exists`` and ``progress``."""
        from .load import load

        return load(self, table, source, order_by=order_by, format=format, if_exists=if_exists,
                    progress=progress)

    def remaining(self, dataset: str, analyst: str | None = None):
        """This analyst's budget on ``dataset`` in the administrator's units: the ε still available
        at the budget's δ, for every accountant (see `dpch.budget_units`). ``str()`` of the result
        is one line, e.g. "remaining ε = 0.8 at δ = 1e-06 (zcdp: ρ left 0.01 of 0.02)"."""
        from .budget_units import report_for

        return report_for(self.ledger, analyst or self.analyst, dataset)

    # -- privacy catalog and ledger (lazy: only the controller paths need them) -----------------
    @property
    def catalog(self):
        if self._catalog is None:
            from .catalog import Catalog

            self._catalog = Catalog(self.backend)
            self._catalog.charges_on_record = self._charges_on_record
        return self._catalog

    def _charges_on_record(self, dataset: str) -> int:
        """Charges of every analyst on ``dataset`` in the current budget generations (the catalog
        refuses to change the unit of a dataset that has any)."""
        return sum(s.queries for s in self.ledger.budgets() if s.dataset == dataset)

    def accelerate(self, table: str, group_by=(), columns=None, *, materialize: bool = True,
                   method: str = "projection"):
        """Add the per-unit projection (or with ``method="table"`` the per-unit table kept by a
        materialized view) that serves user-level ``GROUP BY group_by`` queries on ``table``
        (dpch.accelerate). Same privacy guarantee and answers' distribution as without it;
        charges nothing."""
        from .accelerate import accelerate

        return accelerate(self, table, group_by, columns, materialize=materialize, method=method)

    def accelerations(self, table: str):
        """DPCH's per-unit projections and tables on ``table``, each current or stale (dpch.accelerate)."""
        from .accelerate import accelerations

        return accelerations(self, table)

    def drop_accelerations(self, table: str, *, stale_only: bool = False) -> list[str]:
        """Drop DPCH's per-unit projections and tables on ``table`` (dpch.accelerate)."""
        from .accelerate import drop_accelerations

        return drop_accelerations(self, table, stale_only=stale_only)

    @property
    def ledger(self):
        if self._ledger is None:
            from .ledger import Ledger

            self._ledger = Ledger(self.ledger_path)
        return self._ledger

    @property
    def budget(self):
        """Budget administration and read-out for this connection's analyst (see dpch.ledger)."""
        return self.ledger

    # -- budget-enforcing path ----------------------------------------------------------------
    def query(self, sql: str, *, epsilon: float, delta: float = 0.0, **options) -> pd.DataFrame:
        """Answer analyst SQL with differential privacy under the catalog's privacy unit and
        neighbour relation. The cost (ε, δ) is charged to this analyst's budget on the queried
        dataset before anything runs; rejected queries run nothing and charge nothing."""
        from .controller import run_query

        return run_query(self, sql, epsilon=epsilon, delta=delta, **options)

    def sparse_vector(self, dataset: str, threshold: float, epsilon: float, max_positives: int = 1,
                      delta: float = 0.0, split: float | None = None):
        """A sparse-vector (AboveThreshold) session on ``dataset`` (dpch.svt): ``with ... as svt:``
        charges ε once, ``svt.above(sql)`` answers ⊤/⊥ for ungrouped COUNT/SUM queries until
        ``max_positives`` ⊤'s, and the exit settles ε1 + (c′/c)·ε2 for the c′ ⊤'s released."""
        from .svt import SparseVector

        return SparseVector(self, dataset, threshold, epsilon, max_positives, delta, split)

    def robust_median(self, table: str, column: str, *, epsilon: float, delta: float, where: str | None = None,
                      bound: float | None = None, rows_hint: int | None = None, **options):
        """Propose-test-release median (dpch.ptr, docs/PTR.md): (ε, δ)-DP at the unit level; a
        ``PtrResult`` whose branch is "released" or "bottom" (⊥, value None: only the tests' ε kept)."""
        from .ptr import run_ptr

        return run_ptr(self, "median", table, column, epsilon=epsilon, delta=delta, where=where, bound=bound,
                       rows_hint=rows_hint, **options)

    def robust_iqr(self, table: str, column: str, *, epsilon: float, delta: float, where: str | None = None,
                   **options):
        """The interquartile range by M_IQR (dpch.ptr, docs/PTR.md): (ε, δ)-DP at the unit level;
        ⊥ keeps 2ε/3 (odp_privacy_accounting.md Lemma 10)."""
        from .ptr import run_ptr

        return run_ptr(self, "iqr", table, column, epsilon=epsilon, delta=delta, where=where, **options)

    def trimmed_mean(self, table: str, column: str, *, alpha: float, epsilon: float, delta: float,
                     where: str | None = None, bound: float | None = None, rows_hint: int | None = None, **options):
        """The α-trimmed mean by propose-test-release (dpch.ptr, docs/PTR.md): (ε, δ)-DP at the unit
        level; without ``bound`` its proposal comes from the (α/2, 1 − α/2) scale mechanism."""
        from .ptr import run_ptr

        return run_ptr(self, "trimmed_mean", table, column, epsilon=epsilon, delta=delta, where=where, alpha=alpha,
                       bound=bound, rows_hint=rows_hint, **options)

    def refine(self, sql: str, *, epsilon_per_step: float, max_steps: int = 10, target_halfwidth: float | None = None,
               target_relative: float | None = None, confidence: float = 0.95, on_step=None, **options):
        """Early stopping (dpch.early_stop, odp_privacy_accounting.md §5): refine an ungrouped
        COUNT/SUM by independent ε_step-DP measurements until the interval's half-width is ≤
        ``target_halfwidth`` or ≤ ``target_relative``·|estimate|, at most ``max_steps``. Reserves
        max_steps·ε_step before anything runs, settles to k·ε_step for the k steps run (Lemma 11)."""
        from .early_stop import refine

        return refine(self, sql, epsilon_per_step=epsilon_per_step, max_steps=max_steps,
                      target_halfwidth=target_halfwidth, target_relative=target_relative, confidence=confidence,
                      on_step=on_step, **options)

    def block_dp(self, dataset: str, column: str, *, epsilon: float, statistic: str = "median",
                 mechanism: str = "block_dp_2", blocks: int = 10, ci_level: float = 0.95):
        """A Block-DP I/II mean or median of ``column`` (thesis §5.4, corrected: dpch.block_dp,
        docs/NOISE.md): ε-DP under the catalog's privacy unit and neighbour relation, charged
        before it runs; returns a ``dpch.block_dp.BlockDPResult``."""
        from .block_dp import block_dp

        return block_dp(self, dataset, column, epsilon=epsilon, statistic=statistic, mechanism=mechanism,
                        blocks=blocks, ci_level=ci_level)

    def tune(self, table: str, workload, *, epsilon: float, query_epsilon: float, query_delta: float = 0.0,
             write: bool = False):
        """Choose contribution bounds for a workload (dpch.tune): spends ``epsilon`` (one charge) on
        noisy histograms of rows and groups per unit; returns a TuneReport (table of candidate k, M
        with estimated noise and bias in rows, the best, a plot); ``write`` puts the best into the
        catalog. Guarantee: ``epsilon``-DP; the rest is post-processing."""
        from .tune import tune

        return tune(self, table, workload, epsilon=epsilon, query_epsilon=query_epsilon, query_delta=query_delta,
                    write=write)

    def explain(self, sql: str, *, epsilon: float, delta: float = 0.0, **options):
        """Show the rewritten SQL, per-aggregate sensitivity, mechanism and budget split. Executes
        nothing and charges nothing."""
        from .controller import explain_query

        return explain_query(self, sql, epsilon=epsilon, delta=delta, **options)

    def close(self) -> None:
        self.backend.close()

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def connect(target: str | Path | None = None, *, user: str = "default", password: str = "",
            database: str = "default", analyst: str | None = None,
            ledger_path: str | Path | None = None, ledger: str | Path | None = None) -> Connection:
    """Open DPCH.

    - `connect()`: the embedded ClickHouse engine (chDB) in `$DPCH_DATA_DIR` or `./.dpch_data`;
    - `connect("/some/dir")`: the embedded engine in that directory (created if missing);
    - `connect("http://host:8123", user=..., password=...)`: a ClickHouse server with
      clickhouse_config deployed.

    `analyst` (default: the OS user name) is recorded on every charge. The ledger defaults to
    `<data dir>/ledger.sqlite` (for servers, `$DPCH_DATA_DIR` or `./.dpch_data`); `ledger` (or
    `ledger_path`) names another file or a shared `postgresql://…` ledger (docs/DEPLOY.md).
    """
    analyst = analyst or getpass.getuser()
    target_str = str(target) if target is not None else None
    if target_str and target_str.startswith(("http://", "https://")):
        backend: Backend = ServerBackend(target_str, user=user, password=password, database=database)
        data_dir = default_data_dir()
        data_dir.mkdir(parents=True, exist_ok=True)
    else:
        data_dir = Path(target_str).resolve() if target_str else default_data_dir()
        backend = EmbeddedBackend.open(data_dir)
    target = ledger or ledger_path
    if target and not str(target).startswith(("postgresql://", "postgres://")):
        target = Path(target)
    return Connection(backend, analyst=analyst, data_dir=data_dir, ledger_path=target or None)
