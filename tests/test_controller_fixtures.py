"""Shared data for the controller tests (database ``t_controller`` in the session-scoped engine).

Not a test module by itself: the other ``test_controller_*`` modules import ``setup_controller_data``.
Tables (all deterministic):

- ``purchases``: user-level (``user_id``), k = 1, M = 10, public keys for ``region`` (including
  AFRICA, which has no rows). 300 users with 1..30 rows each, plus user 0 with 1000 rows over every
  region and category ("heavy unit"). Some amounts exceed the declared bounds (clipping).
- ``events``: user-level, k = 3, M = 20, C = 5, no public keys (GROUP BY needs thresholding).
- ``rowlevel``: row-level privacy (no unit).
- ``subst``: substitute neighbour relation, k = 2, M = 5.
- ``onerow``: user-level, k = 2, M = 1 (COUNT(*) differs from COUNT(DISTINCT unit)).
"""
from __future__ import annotations

DB = "t_controller"
ANALYST = "tester"

_SCHEMA = ("(user_id UInt64, region LowCardinality(String), category String, amount Float64, age UInt8, "
           "qty Int32, price Nullable(Float64), day Date, flag Bool)")

# 300 users with 1 + (u*7 % 30) rows; row i of user u: region/category cycle; user 0 heavy.
_ROWS = """
SELECT u AS user_id,
       ['EU', 'US', 'ASIA'][(u + i) % 3 + 1] AS region,
       concat('c', toString((u * 3 + i) % 40)) AS category,
       toFloat64(((u * 37 + i * 11) % 700)) AS amount,
       toUInt8(18 + (u * 13 + i) % 70) AS age,
       toInt32((u + i * 3) % 13) AS qty,
       if((u + i) % 5 = 0, NULL, toFloat64((u * 7 + i) % 120)) AS price,
       toDate('2024-01-01') + ((u * 5 + i) % 365) AS day,
       (u + i) % 2 = 0 AS flag
FROM (SELECT number AS u, arrayJoin(range(if(number = 0, 1000, 1 + (number * 7) % 30))) AS i FROM numbers(300))
"""

_STATE = {"ready": False}


def create_table(db, name: str, rows_sql: str = _ROWS) -> None:
    db.command(f"DROP TABLE IF EXISTS {DB}.{name}")
    db.command(f"CREATE TABLE {DB}.{name} {_SCHEMA} ENGINE = MergeTree ORDER BY user_id")
    db.command(f"INSERT INTO {DB}.{name} {rows_sql}")


def setup_controller_data(db) -> None:
    if _STATE["ready"]:
        return
    db.command(f"CREATE DATABASE IF NOT EXISTS {DB}")
    for name in ("purchases", "events", "rowlevel", "subst", "onerow"):
        create_table(db, name)
    bounds = {"amount": (0, 500), "age": (18, 100), "qty": (0, 10), "price": (0, 100)}
    db.catalog.register(f"{DB}.purchases", privacy_unit="user_id", bounds=bounds, max_groups_contributed=1,
                        max_rows_per_unit=10, public_keys={"region": ["EU", "US", "ASIA", "AFRICA"]})
    db.catalog.register(f"{DB}.events", privacy_unit="user_id", bounds=bounds, max_groups_contributed=3,
                        max_rows_per_unit=20, max_rows_per_group=5)
    db.catalog.register(f"{DB}.rowlevel", bounds=bounds, public_keys={"region": ["EU", "US", "ASIA"]})
    db.catalog.register(f"{DB}.subst", privacy_unit="user_id", neighbour="substitute", bounds=bounds,
                        max_groups_contributed=2, max_rows_per_unit=5)
    db.catalog.register(f"{DB}.onerow", privacy_unit="user_id", bounds=bounds, max_groups_contributed=2,
                        max_rows_per_unit=1)
    for name in ("purchases", "events", "rowlevel", "subst", "onerow"):
        db.ledger.set_budget(ANALYST, f"{DB}.{name}", epsilon=1e9, delta=0.5)
    _STATE["ready"] = True
