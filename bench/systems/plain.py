"""Plain ClickHouse: the same engine and data with no DP at all — the physical floor.

The plain query is what an analyst would run without privacy: `count()` and `sum(amount)` (or
`avg(amount)`) GROUP BY the key. Query (b)'s plain counterpart is the same SQL as (a): user-level
bounding is part of what DP costs, so the floor does not include it.
"""
from __future__ import annotations

from .base import EngineSqlSystem


class Plain(EngineSqlSystem):
    name = "plain"
    CONFIG = {
        "a": "SELECT region, count(), sum(amount) FROM t GROUP BY region",
        "b": "SELECT region, count(), sum(amount) FROM t GROUP BY region (no bounding: the floor)",
        "c": "SELECT avg(amount) FROM t",
        "d": "SELECT item, count(), sum(amount) FROM t GROUP BY item",
        "e": "same as (b)",
    }

    def sql(self, qid: str, eps: float) -> str:
        q = self.queries[qid]
        t = self.wl.table
        if q.group is None:
            return f"SELECT avg(amount) AS avg FROM {t}"
        return (f"SELECT {q.group} AS key, count() AS count, sum(amount) AS sum FROM {t} "
                f"GROUP BY key ORDER BY key")
