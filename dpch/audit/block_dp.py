"""Audit of a Block-DP release on two neighbouring tables (docs/AUDIT.md; dpch.block_dp).

    r = audit_block_dp(db, "t.d", "t.d_prime", "x", mech, samples=100_000)
    r.verdict, r.epsilon_lb

The release query (``dpch.block_dp.block_sql``, the same SQL and UDF as ``db.block_dp``) is run
with ``replicates=samples`` on D and on D′, with D's catalog entry (its bounds, unit, salt and
neighbour relation) for both, so that D′ differs from D only in its rows. The claim audited is
the mechanism's own ``privacy_function`` (its ε). A trusted, administrative operation: it spends
far more than ε; run it on test data.
"""
from __future__ import annotations

import numpy as np

from .api import audit_samples


def sample_block_dp(conn, table: str, column: str, mech, samples: int, entry=None) -> np.ndarray:
    """``samples`` independent releases of ``mech`` on ``table`` (one ClickHouse query)."""
    from ..block_dp import block_sql

    entry = entry or conn.catalog.get(table)
    table_sql = conn.catalog.get(table).table_sql
    df = conn.raw_query(block_sql(entry, column, mech, replicates=int(samples), table_sql=table_sql))
    return np.asarray(df["value"], dtype=float)


def audit_block_dp(conn, table_d: str, table_dprime: str, column: str, mech, *, samples: int = 100_000,
                   confidence: float = 0.95, entry=None, seed: int = 0):
    """Empirical ε lower bound of the Block-DP release ``mech`` on D = ``table_d`` and its
    neighbour D′ = ``table_dprime`` (``entry``: the catalog entry to use for both; default D's)."""
    entry = entry or conn.catalog.get(table_d)
    out_d = sample_block_dp(conn, table_d, column, mech, samples, entry)
    out_dp = sample_block_dp(conn, table_dprime, column, mech, samples, entry)
    eps = mech.privacy_function().epsilon
    return audit_samples(out_d, out_dp, epsilon=eps, confidence=confidence, seed=seed,
                         target=f"{type(mech).__name__} {mech.statistic}({column}), m = {mech.blocks}",
                         neighbour=f"{table_d} / {table_dprime}")
