"""Per-unit tables: ``db.accelerate(table, group_by, method="table")`` (issue 33, item 2).

The alternative to a per-unit projection (dpch.accelerate) that ClickHouse users use for this: an
``AggregatingMergeTree`` ``dpch_accel.<db>__<table>__units2_<digest>`` ``ORDER BY (__dp_total,
__dp_unit)`` holding, per privacy unit, the ``-State`` of every aggregate call of the per-unit stage
that a projection would hold (and ``count()``), and one total row of the same states over all rows
(what the freshness check reads: dpch.rewrite.unit_table), kept up to date by a ``MATERIALIZED VIEW
… TO`` it. A projection costs every
query on the table planning time (ClickHouse considers it for each); a per-unit table costs only
the queries DPCH reads it for, and they read one row per unit instead of every row.

Build order: the per-unit table, then the materialized view, then the backfill ``INSERT INTO target
SELECT … FROM T … GROUP BY __dp_total, __dp_unit``: rows inserted after the view exists are covered. On the embedded
engine nothing runs concurrently with the build. On a server, rows inserted while the backfill runs
may reach the per-unit table twice (through the view and through the backfill's read): the
per-unit table then counts more rows than T, the staleness check sees it, and queries read T until
``accelerate`` runs again (it rebuilds a stale per-unit table). Build in a quiet moment.

Fail-safe: the rewrite reads a per-unit table only while it is fresh (dpch.rewrite.unit_table:
metadata reads and its row counts, before each query); deletes, updates, TRUNCATE, partition
operations, a dropped view or a catalog change (bounds, salt, unit: a new digest) make queries read
T. Refused: engines that merge rows away (Replacing, Collapsing, …), tables with lightweight
updates (patch parts are applied at merges, after which no metadata shows the change).

Privacy: the per-unit table holds raw per-unit aggregates of private rows and its view's DDL holds
the salt. It lives in ``dpch_accel``, is never catalogued, and the gateway refuses every table
outside the catalog (and the system tables that show DDL): analysts cannot read it. On a server,
grant analysts nothing on ``dpch_accel`` (as for ``dpch_meta``).
"""
from __future__ import annotations

import hashlib
import re

from .catalog import META_DATABASE, is_nullable, quote_ident, quote_string
from .errors import CatalogError, DPCHError
from .rewrite.unit_table import (ACCEL_DATABASE, MUTATION_NUMBER, STRUCTURE, TOTAL, UNIT, UNIT_TABLES, UnitTable,
                                 forget, fresh, lightweight_updates_on, recorded, salt_digest, salted,
                                 stage_aggregates, state_sql)

# MergeTree engines that keep every inserted row (the others merge rows away: count() drifts)
_ENGINES = ("MergeTree", "ReplicatedMergeTree", "SharedMergeTree")
_LIGHTWEIGHT_ON = re.compile(r"enable_block_number_column\s*=\s*(1|true)\b", re.IGNORECASE)


def _ensure_meta(conn) -> None:
    conn.backend.command(f"CREATE DATABASE IF NOT EXISTS {META_DATABASE}")
    conn.backend.command(
        f"CREATE TABLE IF NOT EXISTS {UNIT_TABLES} (table_name String, name String, unit String, "
        "aggregates Array(String), salt_digest String, table_uuid String, engine_full String, mutation UInt64, "
        "group_by Array(String), columns Array(String), created_at DateTime64(3) DEFAULT now64(3)) "
        "ENGINE = MergeTree ORDER BY (table_name, name)")


def definition(entry, rw) -> tuple[str, tuple[str, ...], str]:
    """(name, aggregate calls, the salted SELECT of their states per unit and in total) for the
    template plan's rewriter ``rw``; the name's digest covers the salted SELECT and the salt (a
    catalog change or a salt rotation gives a new name).

    Each row of T is aggregated twice: under (0, its unit) and under (1, the unit type's default),
    the total row. One GROUP BY, so one view writes both, the total row last; the flag comes from the
    constant array (no setting changes it, unlike GROUPING SETS' ``grouping()``); the CAST keeps
    the unit's type (``if`` drops LowCardinality), so the unit rows hold the same unit values."""
    aggregates = tuple(stage_aggregates(rw))
    unit = quote_ident(entry.privacy_unit)
    states = ", ".join(f"{state_sql(a)} AS a{i}" for i, a in enumerate(aggregates))
    key = f"CAST(if({TOTAL} = 1, defaultValueOfArgumentType({unit}), {unit}), toTypeName({unit})) AS {UNIT}"
    # ORDER BY the flag: an insert whose output is written as several parts (a session with small
    # min_insert_block_size_rows/_bytes) writes the total row in the last one, so a failure
    # between parts leaves the total short (stale), never counting unit rows that are missing
    select = salted(f"SELECT {TOTAL}, {key}, {states}\nFROM {entry.table_sql}\nARRAY JOIN [0, 1] AS {TOTAL}\n"
                    f"GROUP BY {TOTAL}, {UNIT}\nORDER BY {TOTAL}", entry)
    # the salt's digest too: an ungrouped SELECT has no hash, yet a salt rotation must give a new name
    digest = hashlib.sha256(f"{entry.table}\0{entry.privacy_unit}\0{salt_digest(entry)}\0{select}".encode()
                            ).hexdigest()[:16]
    return f"{entry.database}__{entry.name}__{STRUCTURE}_{digest}", aggregates, select


def _table_facts(conn, entry) -> tuple[str, str, str]:
    df = conn.backend.query_df(
        "SELECT toString(uuid) AS u, engine, engine_full FROM system.tables "
        f"WHERE database = {quote_string(entry.database)} AND name = {quote_string(entry.name)}")
    if df.empty:
        raise CatalogError(f"{entry.table} is not a table of this ClickHouse")
    row = df.iloc[0]
    return str(row["u"]), str(row["engine"]), str(row["engine_full"])


def _drop(conn, ut_name: str) -> None:
    db = quote_ident(ACCEL_DATABASE)
    conn.backend.command(f"DROP VIEW IF EXISTS {db}.{quote_ident(ut_name + '__mv')}")  # the view first: no insert
    conn.backend.command(f"DROP TABLE IF EXISTS {db}.{quote_ident(ut_name)}")        # reaches a dropped table


def build(conn, entry, rw, group_by: tuple[str, ...], columns: tuple[str, ...]) -> UnitTable:
    """Build (or keep, if present and fresh) the per-unit table for the template plan's rewriter
    ``rw`` (dpch.accelerate.template_plan). A stale one of the same definition is rebuilt. Privacy
    guarantee: unchanged (the rewrite reads the same per-unit states from it); charges nothing."""
    name, aggregates, select = definition(entry, rw)
    existing = next((u for u in recorded(conn.backend, entry.table) if u.name == name), None)
    forget(conn.backend, entry.table)
    if existing is not None and fresh(conn.backend, existing, entry):
        return existing
    uuid, engine, engine_full = _table_facts(conn, entry)
    if engine not in _ENGINES:
        raise CatalogError(f"a per-unit table needs a plain MergeTree table (rows never merged away); "
                           f"{entry.table} is {engine}: use method='projection'")
    if lightweight_updates_on(conn.backend) or _LIGHTWEIGHT_ON.search(engine_full):
        raise CatalogError(f"{entry.table} allows lightweight updates (enable_block_number_column), which no "
                           "metadata shows once merged: a per-unit table could not tell it is stale")
    mutations = (f"FROM system.mutations WHERE database = {quote_string(entry.database)} "
                 f"AND table = {quote_string(entry.name)}")
    # the last mutation's number first: one created from now on has a higher one (stale)
    mutation = int(conn.backend.query_df(f"SELECT max({MUTATION_NUMBER}) AS m {mutations}")["m"].iloc[0])
    if conn.backend.query_df(f"SELECT count() AS n {mutations} AND NOT is_done")["n"].iloc[0]:
        raise CatalogError(f"{entry.table} has unfinished mutations; build the per-unit table once they are done")
    _drop(conn, name)
    target = f"{quote_ident(ACCEL_DATABASE)}.{quote_ident(name)}"
    nullable = " SETTINGS allow_nullable_key = 1" if is_nullable(entry.columns.get(entry.privacy_unit, "")) else ""
    try:
        conn.backend.command(f"CREATE DATABASE IF NOT EXISTS {quote_ident(ACCEL_DATABASE)}")
        conn.backend.command(f"CREATE TABLE {target} ENGINE = AggregatingMergeTree ORDER BY ({TOTAL}, {UNIT}){nullable} "
                             f"EMPTY AS {select}")
        # the view before the backfill: rows inserted from now on are covered
        conn.backend.command(f"CREATE MATERIALIZED VIEW {quote_ident(ACCEL_DATABASE)}.{quote_ident(name + '__mv')} "
                             f"TO {target} AS {select}")
        conn.backend.command(f"INSERT INTO {target} {select}")
        _ensure_meta(conn)
        arr = lambda xs: "[" + ", ".join(quote_string(x) for x in xs) + "]"  # noqa: E731
        conn.backend.command(
            f"INSERT INTO {UNIT_TABLES} (table_name, name, unit, aggregates, salt_digest, table_uuid, engine_full, "
            f"mutation, group_by, columns) VALUES ({quote_string(entry.table)}, {quote_string(name)}, "
            f"{quote_string(entry.privacy_unit)}, {arr(aggregates)}, {quote_string(salt_digest(entry))}, "
            f"{quote_string(uuid)}, {quote_string(engine_full)}, {mutation}, {arr(group_by)}, {arr(columns)})")
    except DPCHError:
        _drop(conn, name)
        raise
    finally:
        forget(conn.backend, entry.table)
    return UnitTable(entry.table, name, entry.privacy_unit, aggregates, salt_digest(entry), uuid, engine_full,
                     mutation, group_by, columns)


def existing(conn, ut: UnitTable) -> bool:
    df = conn.backend.query_df(f"SELECT count() AS n FROM system.tables WHERE database = "
                               f"{quote_string(ACCEL_DATABASE)} AND name = {quote_string(ut.name)}")
    return bool(df["n"].iloc[0])


def present(conn, table: str) -> list[UnitTable]:
    """The per-unit tables recorded for ``table`` that still exist."""
    forget(conn.backend, table)
    return [u for u in recorded(conn.backend, table) if existing(conn, u)]


def drop(conn, ut: UnitTable) -> str:
    """Drop a per-unit table (its materialized view first); returns its name."""
    _drop(conn, ut.name)
    forget(conn.backend, ut.table)
    return ut.name
