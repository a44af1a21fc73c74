"""Block-DP I and II releases inside ClickHouse: ``db.block_dp(...)``, ``dpch block``.

    r = db.block_dp("demo.purchases", "amount", statistic="median", mechanism="block_dp_2",
                    blocks=20, epsilon=0.5)
    r.value, r.ci_low, r.ci_high, r.epsilon_spent, r.describe()

The mechanisms and their privacy relations are in ``dpch.mechanisms.block`` (thesis §5.4,
Alg. 5.4.1 / Thm 5.4.2 and Alg. 5.4.6 / Thm 5.4.7, with the corrections stated there and in
docs/NOISE.md, "Block-DP"). This module builds the one ClickHouse query that computes them:

- rows: the catalogued ``column`` clipped to its catalog bounds [lo, hi] (NaN → lo; NULL rows and
  rows without a privacy unit are skipped: both are functions of the row alone);
- Block-DP I: at user level each unit keeps at most M = max_rows_per_unit of its rows (the M whose
  keyed hash of the value is smallest: a function of the unit's own rows); block
  i = ⌊(v − lo)/w⌋ (capped at m − 1); per block the statistic (``avg`` or ``quantileExact(0.5)``)
  clamped to [e_i, e_{i+1}], the midpoint for an empty block; each noised by ``dpch_laplace``; the
  release is their average;
- Block-DP II: block i = sipHash64Keyed(salt, unit) mod m (the row's own values at row level);
  per block the statistic clamped to [lo, hi] (midpoint if empty); one ``dpch_laplace`` on
  lo + Σ(f_i − lo)/m.

Only the noisy value leaves ClickHouse. The ledger is charged (ε, δ = 0) after the type check on
one row of default values and before the query runs; a refusal or a bad parameter runs and
charges nothing; a run-time failure leaves the charge failed (it stays). The released interval is
the noise's (level ``ci_level``, ``dlap_mean_halfwidth``) around the *blocked* statistic: the
blocking bias (the average of block statistics is not the data's mean or median) is not in it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from . import calibration as cal
from .catalog import quote_ident
from .controller import charge_first
from .cost import PrivacyCost
from .errors import BackendError, CatalogError, InvalidParameter, QueryRejected
from .mechanisms.block import BlockDP1Mechanism, BlockDP2Mechanism, dlap_mean_halfwidth
from .typecheck import default_row_sql, with_settings

MECHANISMS = ("block_dp_1", "block_dp_2")
_STAT_SQL = {"mean": "avg(__dp_v)", "median": "quantileExact(0.5)(__dp_v)"}
_NUMERIC = ("Int", "UInt", "Float", "Decimal", "BFloat16", "Bool")

__all__ = ["BlockDPResult", "MECHANISMS", "block_mechanism", "block_sql", "block_dp"]


@dataclass(frozen=True)
class BlockDPResult:
    """One Block-DP release. ``value`` is the noisy blocked statistic; ``ci_low``/``ci_high`` the
    noise's interval at ``ci_level`` around the blocked statistic (post-processing, free)."""

    value: float
    mechanism: str
    statistic: str
    dataset: str
    column: str
    blocks: int
    epsilon_spent: float
    noise_scale: float
    noise_std: float
    ci_level: float
    ci_low: float
    ci_high: float
    blocks_touched: int
    receipt: Any = None

    def describe(self) -> str:
        return (f"{self.mechanism} {self.statistic}({self.column}) on {self.dataset}: {self.value:.6g} "
                f"[{self.ci_low:.6g}, {self.ci_high:.6g}] at {self.ci_level:g} (noise only); m = {self.blocks} "
                f"blocks, a neighbour touches at most {self.blocks_touched}; Laplace scale {self.noise_scale:.6g}; "
                f"ε spent {self.epsilon_spent:.6g} (thesis §5.4, corrected: docs/NOISE.md)")


def _entry_and_column(conn, dataset: str, column: str):
    if not isinstance(dataset, str):
        raise InvalidParameter("dataset must be a table name")
    if not isinstance(column, str):
        raise InvalidParameter("column must be a column name")
    try:
        name = conn.catalog.qualify(dataset)
        entry = conn.catalog.get(name)
    except CatalogError as exc:
        raise QueryRejected(str(exc)) from None
    if getattr(entry, "public", False):
        raise QueryRejected(f"{name} is a public table: nothing to protect, nothing to charge")
    if column not in entry.columns:
        raise QueryRejected(f"column: {column!r} is not a registered column of {name}")
    t = entry.columns[column]
    base = t.replace("Nullable(", "").replace("LowCardinality(", "")
    if not base.startswith(_NUMERIC):
        raise QueryRejected(f"column: {column!r} must be numeric (it is {t})")
    if column not in entry.bounds:
        raise QueryRejected(f"column: {column!r} has no bounds in the catalog; register bounds={{{column!r}: (lo, hi)}}")
    return entry


def block_mechanism(entry, column: str, mechanism: str, statistic: str, blocks: int, epsilon: float):
    """The calibrated mechanism for this table's privacy unit, bounds and neighbour relation."""
    if mechanism not in MECHANISMS:
        raise InvalidParameter(f"mechanism must be one of {', '.join(MECHANISMS)}")
    lo, hi = entry.bounds[column]
    if mechanism == "block_dp_1":
        m_rows = 1 if entry.row_level else entry.max_rows_per_unit
        return BlockDP1Mechanism.calibrated(lo, hi, blocks, m_rows, entry.neighbour, statistic, epsilon)
    return BlockDP2Mechanism.calibrated(lo, hi, blocks, entry.neighbour, statistic, epsilon)


def _rows_sql(entry, column: str, mech, table_sql: str) -> str:
    """One row per kept value: ``__dp_u`` (the unit, or the row's hash at row level) and ``__dp_v``."""
    x = quote_ident(column)
    lo, hi = repr(float(mech.lo)), repr(float(mech.hi))
    fx = f"toFloat64(assumeNotNull({x}))"
    v = f"if(isNaN({fx}), {lo}, least(greatest({fx}, {lo}), {hi}))"
    where = f"{x} IS NOT NULL"
    if entry.row_level:
        unit = "sipHash64Keyed(__DP_KEY__, tuple(*))"  # a function of the row alone
    else:
        u = quote_ident(entry.privacy_unit)
        unit, where = u, f"{where} AND {u} IS NOT NULL"
    rows = f"SELECT {unit} AS __dp_u, {v} AS __dp_v FROM {table_sql} WHERE {where}"
    if isinstance(mech, BlockDP1Mechanism) and not entry.row_level:
        # at most M rows per unit: the M with the smallest keyed hash of the value (own rows only)
        rows = (f"SELECT arrayJoin(arraySlice(arraySort(__dp_t -> sipHash64Keyed(__DP_KEY__, __dp_t), "
                f"groupArray(__dp_v)), 1, {mech.max_rows})) AS __dp_v FROM ({rows}) GROUP BY __dp_u")
    return rows


def block_sql(entry, column: str, mech, *, replicates: int | None = None, table_sql: str | None = None,
              noise: bool = True) -> str:
    """The release query (module docstring). ``replicates=n`` (audits, benchmarks: trusted only)
    returns n independent releases of the same blocked statistic, column ``value``, one row per run;
    the noise is drawn per run by the same UDF call. ``noise=False`` is for TESTS ONLY (not
    private): the m clamped block statistics (Block-DP I, column ``stat``, by block) or the
    un-noised average (Block-DP II, column ``value``)."""
    table = table_sql or entry.table_sql
    m = mech.blocks
    rows = _rows_sql(entry, column, mech, table)
    stat = _STAT_SQL[mech.statistic]
    blocks = f"(SELECT toUInt64(arrayJoin(range({m}))) AS i) AS __dp_b"
    runs = "" if replicates is None else f" CROSS JOIN (SELECT number AS __dp_run FROM numbers({int(replicates)})) AS __dp_n"
    run_col = "" if replicates is None else "__dp_run, "
    if isinstance(mech, BlockDP1Mechanism):
        edges = "[" + ", ".join(repr(e) for e in mech.edges) + "]"
        lo, w = repr(mech.lo), repr((mech.hi - mech.lo) / m)
        per_block = (f"SELECT toUInt64(least({m - 1}, floor((__dp_v - {lo}) / {w}))) AS i, count() AS n, {stat} AS stat "
                     f"FROM ({rows}) GROUP BY i")
        e_lo, e_hi = f"{edges}[__dp_b.i + 1]", f"{edges}[__dp_b.i + 2]"
        clamped = f"if(__dp_c.n > 0, least(greatest(__dp_c.stat, {e_lo}), {e_hi}), ({e_lo} + {e_hi}) / 2)"
        stats = f"SELECT {clamped} AS __dp_s FROM {blocks} LEFT JOIN ({per_block}) AS __dp_c ON __dp_b.i = __dp_c.i"
        if not noise:
            stats = stats.replace(" AS __dp_s FROM", " AS stat FROM") + " ORDER BY __dp_b.i"
            return with_settings(stats.replace("__DP_KEY__", entry.hash_key_sql()), {"join_use_nulls": "0"})
        noisy = f"SELECT {run_col}{mech.laplace.sql('__dp_s')} AS __dp_z FROM ({stats}) AS __dp_st{runs}"
        group = "" if replicates is None else " GROUP BY __dp_run ORDER BY __dp_run"
        sql = f"SELECT avg(__dp_z) AS value FROM ({noisy}){group}"
    else:
        lo, hi = repr(mech.lo), repr(mech.hi)
        per_block = (f"SELECT sipHash64Keyed(__DP_KEY__, __dp_u) % {m} AS i, count() AS n, {stat} AS stat "
                     f"FROM ({rows}) GROUP BY i")
        clamped = f"if(__dp_c.n > 0, least(greatest(__dp_c.stat, {lo}), {hi}), ({lo} + {hi}) / 2) - {lo}"
        stats = f"SELECT {clamped} AS __dp_s FROM {blocks} LEFT JOIN ({per_block}) AS __dp_c ON __dp_b.i = __dp_c.i"
        avg = f"SELECT {lo} + sum(__dp_s) / {m} AS __dp_a FROM ({stats})"
        order = "" if replicates is None else " ORDER BY __dp_run"
        if not noise:
            return with_settings(f"SELECT __dp_a AS value FROM ({avg})".replace("__DP_KEY__", entry.hash_key_sql()),
                                 {"join_use_nulls": "0"})
        sql = f"SELECT {mech.laplace.sql('__dp_a')} AS value FROM ({avg}) AS __dp_av{runs}{order}"
    return with_settings(sql.replace("__DP_KEY__", entry.hash_key_sql()), {"join_use_nulls": "0"})


def block_dp(conn, dataset: str, column: str, *, epsilon: float, statistic: str = "median",
             mechanism: str = "block_dp_2", blocks: int = 10, ci_level: float = 0.95) -> BlockDPResult:
    """Release a Block-DP mean or median of ``column``: ε-DP under the catalog's privacy unit and
    neighbour relation (dpch.mechanisms.block). Charged (ε, 0) before it runs; rejected inputs
    run and charge nothing."""
    entry = _entry_and_column(conn, dataset, column)
    mech = block_mechanism(entry, column, mechanism, statistic, blocks, epsilon)
    level = cal.check_level(ci_level, "ci_level")
    eps = cal.check_epsilon(epsilon)
    label = f"{mechanism} {statistic}({column}) m={mech.blocks}"
    cost = PrivacyCost((mech.cost(eps, label),))
    sql = block_sql(entry, column, mech)
    try:  # the type check: the same query over one row of default values (reads no data)
        conn.backend.query_df(block_sql(entry, column, mech, table_sql=default_row_sql(entry)))
    except Exception:  # noqa: BLE001 - depends on the schema only
        raise QueryRejected(f"column: {column!r} does not type-check for {mechanism}; nothing ran, nothing "
                            f"charged") from None
    text = (f"BLOCK_DP {mechanism} {statistic}({column}) ON {entry.table} BLOCKS {mech.blocks} "
            f"EPSILON {eps!r}")
    ledger, receipt = charge_first(conn, entry.table, cost, text)
    try:
        df = conn.backend.query_df(sql)
        value = float(df["value"].iloc[0])
        if len(df) != 1 or not math.isfinite(value):
            raise BackendError("unexpected result")
    except Exception:  # noqa: BLE001 - fail closed, no data in the text
        try:
            ledger.mark(receipt, "failed")
        finally:
            raise BackendError(f"{mechanism}: the release failed at run time; its charge of ε = {eps:g} "
                               f"stays") from None
    ledger.mark(receipt, "executed")
    k = mech.blocks if isinstance(mech, BlockDP1Mechanism) else 1
    h = dlap_mean_halfwidth(mech.laplace, k, level)
    touched = mech.touched if isinstance(mech, BlockDP1Mechanism) else (2 if entry.neighbour == "substitute" else 1)
    return BlockDPResult(value, mechanism, statistic, entry.table, column, mech.blocks, eps, mech.scale,
                         math.sqrt(mech.variance), level, value - h, value + h, touched, receipt)
