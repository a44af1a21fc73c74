"""DPCH through its SQL functions (`dp_count`, `dp_sum`, `dp_avg`): row-level DP, one SQL
statement, clipping + aggregation + noise all inside ClickHouse. No ledger.

Each released value gets the stated ε (so a COUNT + SUM query spends 2ε in total, exactly like
SmartNoise's per-statistic ε). `dp_avg(x, lo, hi, ε)` spends ε in total (ε/2 on the centred sum,
ε/2 on the count). Query (b) is user-level, which the SQL functions do not do (they are row-level
by definition): that is the controller's job.

Query (d) groups by `item`. All 10 000 public keys occur in the benchmark data at every size
(checked by the harness), so the GROUP BY output equals the public-key output; the SQL functions
have no way to emit a key that has no rows.
"""
from __future__ import annotations

from .base import EngineSqlSystem


class DpchSql(EngineSqlSystem):
    name = "dpch_sql"
    CONFIG = {
        "a": "SELECT region, dp_count(ε), dp_sum(amount, 0, 500, ε) FROM t GROUP BY region",
        "c": "SELECT dp_avg(amount, 0, 500, ε) FROM t",
        "d": "SELECT item, dp_count(ε), dp_sum(amount, 0, 500, ε) FROM t GROUP BY item",
    }
    UNSUPPORTED = {"b": "the SQL functions are row-level by definition (user-level is the controller)",
                   "e": "the SQL functions are row-level by definition (user-level is the controller)"}

    def sql(self, qid: str, eps: float) -> str:
        q = self.queries[qid]
        t = self.wl.table
        e = repr(float(eps))
        if q.group is None:
            return f"SELECT dp_avg(amount, 0, 500, {e}) AS avg FROM {t}"
        return (f"SELECT {q.group} AS key, dp_count({e}) AS count, dp_sum(amount, 0, 500, {e}) AS sum "
                f"FROM {t} GROUP BY key ORDER BY key")
