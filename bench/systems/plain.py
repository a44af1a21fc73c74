"""Plain ClickHouse: the same engine and data with no DP at all — the physical floor.

The plain query is what an analyst would run without privacy: `count()` and `sum(amount)` (or
`avg(amount)`) GROUP BY the key. Query (b)'s plain counterpart is the same SQL as (a): user-level
bounding is part of what DP costs, so the floor does not include it.
"""
from __future__ import annotations

from .base import System, align


class Plain(System):
    name = "plain"
    CONFIG = {
        "a": "SELECT region, count(), sum(amount) FROM t GROUP BY region",
        "b": "SELECT region, count(), sum(amount) FROM t GROUP BY region (no bounding: the floor)",
        "c": "SELECT avg(amount) FROM t",
        "d": "SELECT item, count(), sum(amount) FROM t GROUP BY item",
        "e": "same as (b)",
    }

    def __init__(self, db, wl, queries):
        self.db, self.wl, self.queries = db, wl, queries

    def sql(self, qid: str, eps: float) -> str:
        q = self.queries[qid]
        t = self.wl.table
        if q.group is None:
            return f"SELECT avg(amount) AS avg FROM {t}"
        return (f"SELECT {q.group} AS key, count() AS count, sum(amount) AS sum FROM {t} "
                f"GROUP BY key ORDER BY key")

    def run(self, qid: str, eps: float):
        q = self.queries[qid]
        df = self.db.raw_query(self.sql(qid, eps))
        if q.group is None:
            return {"avg": [float(df["avg"][0])]}
        return align(q.keys, df["key"], {"count": df["count"], "sum": df["sum"]})
