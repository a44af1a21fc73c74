"""Per-unit projections: user-level queries served from per-unit partial aggregates.

A user-level query spends most of its time in the per-unit stage (one ``GROUP BY unit`` over every
row: bench/RESULTS.md, "User-level speed"). ``accelerate(conn, table, group_by=[...])`` adds a
ClickHouse *aggregate projection* to the table holding exactly that stage's aggregate states, one
row per privacy unit and part::

    PROJECTION dpch_unit_<digest> (SELECT unit, argMin(key, h), countArgMin(h), sumArgMin(x, h), …
                                   GROUP BY unit)

ClickHouse keeps it up to date on every INSERT and merge, and uses it by itself whenever a query's
aggregation matches (same expressions; no WHERE except on the unit column). The controller emits
the same expressions (``_Rewriter.per_unit_aggregates``), so accelerated queries need no special
path, and a query the projection cannot serve reads the table as before.

Privacy: the projection changes where the per-unit states are read from, not what they are: the
released values have the same distribution with or without it (tests check equality with noise
off). The states are raw data (the salted hash and per-unit sums), as private as the table itself,
and the table's DDL now contains the salt: on a server, grant analysts neither the table nor
``system.projections``/``system.tables`` (the same rule as for ``dpch_meta``).

Limits: k = 1 (``max_groups_contributed=1``) or no GROUP BY; keys released from catalog public
keys, bounded integer columns or private partition selection (a domain of more than
MAX_PUBLIC_GROUPS keys filters rows first and cannot be served); a query WHERE on a non-unit column, a
``keys=`` option or an aggregate the projection does not hold reads the table. A projection
becomes *stale* when the catalog entry changes (bounds, salt, unit): queries stop matching it;
``accelerations()`` reports it and ``accelerate()`` again builds the current one. On tables with
projections ClickHouse refuses lightweight DELETE unless ``lightweight_mutation_projection_mode``
allows it (use ``ALTER TABLE … DELETE``, which rebuilds the projection).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

from .backends import query_records
from .catalog import META_DATABASE, quote_ident, quote_string
from .errors import CatalogError, DPCHError, QueryRejected
from . import accelerate_table
from .rewrite.projection import _unservable, projection_hint  # noqa: F401 - re-exported
from .rewrite.unit_table import fresh

ACCEL_TABLE = f"{META_DATABASE}.accelerations"
PREFIX = "dpch_unit_"


@dataclass(frozen=True)
class Acceleration:
    """One per-unit projection DPCH built on ``table``."""

    table: str
    name: str
    group_by: tuple[str, ...]
    columns: tuple[str, ...]
    current: bool  # False: the catalog entry changed since (or a per-unit table is stale); not read
    method: str = "projection"  # or "table": dpch_accel.<name>, an AggregatingMergeTree (accelerate_table)


def _ensure_meta(conn) -> None:
    conn.backend.command(f"CREATE DATABASE IF NOT EXISTS {META_DATABASE}")
    conn.backend.command(
        f"CREATE TABLE IF NOT EXISTS {ACCEL_TABLE} (table_name String, name String, group_by Array(String), "
        "columns Array(String), created_at DateTime64(3) DEFAULT now64(3)) ENGINE = MergeTree "
        "ORDER BY (table_name, name)")


def _template_sql(table: str, group_by: tuple[str, ...], columns: tuple[str, ...]) -> str:
    """The query whose per-unit stage the projection stores: COUNT(*), and SUM and AVG of each
    column (AVG's centred sum is a different per-row expression from SUM's)."""
    aggs = ["COUNT(*)"] + [f"{f}({quote_ident(c)})" for c in columns for f in ("SUM", "AVG")]
    keys = ", ".join(group_by)
    select = ", ".join(([keys] if keys else []) + aggs)
    return f"SELECT {select} FROM {table}" + (f" GROUP BY {keys}" if keys else "")


def template_plan(conn, table: str, group_by: tuple[str, ...], columns: tuple[str, ...]):
    """(plan, rewriter) of the template query whose per-unit stage an acceleration holds; raises
    CatalogError if no per-unit structure could serve it (``_unservable``)."""
    from .controller import prepare
    from .rewrite import _Rewriter

    what = f"GROUP BY {', '.join(group_by)}" if group_by else "ungrouped queries"
    try:
        # δ > 0 so that keys without a public domain plan as private partition selection (the
        # per-unit stage depends on neither ε nor δ)
        prepared = prepare(conn, _template_sql(table, group_by, columns), epsilon=1.0, delta=1e-6)
    except QueryRejected as exc:
        raise CatalogError(f"cannot accelerate {what} on {table}: {exc}") from None
    plan = prepared.plan
    rw = _Rewriter(plan, noise=True, selection=True, table=None)
    reason = _unservable(plan, rw)
    if reason is not None:
        raise CatalogError(f"cannot accelerate {what} on {table}: {reason}")
    return plan, rw


def _definition(conn, table: str, group_by: tuple[str, ...], columns: tuple[str, ...]) -> str:
    """The projection's SELECT, generated by the controller's own rewriter (salt included)."""
    from .rewrite import SALT_PLACEHOLDER, UNIT_SALT_PLACEHOLDER

    plan, rw = template_plan(conn, table, group_by, columns)
    entry = plan.entry
    unit = quote_ident(entry.privacy_unit)  # type: ignore[arg-type]
    sql = f"SELECT {unit}, {', '.join(rw.per_unit_aggregates(inline=True))} GROUP BY {unit}"
    return sql.replace(SALT_PLACEHOLDER, entry.hash_key_sql()).replace(UNIT_SALT_PLACEHOLDER, entry.unit_salt_sql())


def _name(definition: str) -> str:
    return PREFIX + hashlib.sha256(definition.encode()).hexdigest()[:16]


def _existing(conn, qualified: str) -> set[str]:
    db, name = qualified.split(".")
    try:
        rows = query_records(conn.backend, f"SELECT name FROM system.projections WHERE database = "
                                           f"{quote_string(db)} AND table = {quote_string(name)}")
    except DPCHError:
        raise CatalogError("this ClickHouse has no system.projections (needs ClickHouse ≥ 24.10)") from None
    return {row["name"] for row in rows}


def resolve(conn, table: str, group_by, columns):
    """(qualified table, its catalog entry, group_by tuple, columns tuple), columns checked."""
    group_by = tuple(str(k) for k in ([group_by] if isinstance(group_by, str) else group_by))
    qualified = conn.catalog.qualify(table)
    entry = conn.catalog.get(qualified)
    if columns is None:
        columns = tuple(c for c in entry.columns if c in entry.bounds)
    columns = tuple(str(c) for c in columns)
    missing = [c for c in columns if c not in entry.bounds]
    if missing:
        raise CatalogError(f"columns without bounds (or not registered) cannot be summed: {', '.join(missing)}; "
                           f"bounded columns of {qualified}: {', '.join(sorted(entry.bounds)) or '(none)'}")
    return qualified, entry, group_by, columns


def accelerate(conn, table: str, group_by=(), columns=None, *, materialize: bool = True,
               method: str = "projection") -> Acceleration:
    """Add (or keep) the per-unit structure serving ``GROUP BY group_by`` queries on ``table``:
    ``method="projection"`` (default) a per-unit projection of the table; ``method="table"`` a
    per-unit AggregatingMergeTree kept by a materialized view (dpch.accelerate_table).

    ``columns``: the bounded numeric columns whose SUM/AVG it holds (default: every column with
    bounds). ``materialize`` builds a projection for existing parts now (synchronously); otherwise
    only new parts get it. Privacy guarantee: unchanged — released values are distributed exactly as
    without the structure. Charges no budget and releases nothing."""
    if method not in ("projection", "table"):
        raise CatalogError(f"unknown acceleration method {method!r}: 'projection' or 'table'")
    qualified, entry, group_by, columns = resolve(conn, table, group_by, columns)
    if method == "table":
        plan, rw = template_plan(conn, qualified, group_by, columns)
        ut = accelerate_table.build(conn, plan.entry, rw, group_by, columns)
        return Acceleration(qualified, ut.name, group_by, columns, True, "table")
    definition = _definition(conn, qualified, group_by, columns)
    name = _name(definition)
    target = entry.table_sql
    if name not in _existing(conn, qualified):
        conn.backend.command(f"ALTER TABLE {target} ADD PROJECTION IF NOT EXISTS {quote_ident(name)} ({definition})")
        if materialize:
            conn.backend.command(f"ALTER TABLE {target} MATERIALIZE PROJECTION {quote_ident(name)} "
                                 "SETTINGS mutations_sync = 2")
    _ensure_meta(conn)
    arr = lambda xs: "[" + ", ".join(quote_string(x) for x in xs) + "]"  # noqa: E731
    conn.backend.command(f"INSERT INTO {ACCEL_TABLE} (table_name, name, group_by, columns) VALUES "
                         f"({quote_string(qualified)}, {quote_string(name)}, {arr(group_by)}, {arr(columns)})")
    return Acceleration(qualified, name, group_by, columns, True)


def accelerations(conn, table: str) -> list[Acceleration]:
    """The per-unit projections and per-unit tables DPCH built on ``table`` that still exist, each
    marked current (matches what the controller generates for the catalog entry now, and for a
    per-unit table, fresh) or stale."""
    qualified = conn.catalog.qualify(table)
    return _listed(conn, qualified, _existing(conn, qualified)) + _listed_tables(conn, qualified)


def _listed_tables(conn, qualified: str) -> list[Acceleration]:
    """The per-unit tables of ``qualified``: current = built for the catalog entry as it is now,
    and fresh (what the rewrite requires to read one)."""
    return [Acceleration(qualified, ut.name, ut.group_by, ut.columns, _current(conn, qualified, ut), "table")
            for ut in accelerate_table.present(conn, qualified)]


def _current(conn, qualified: str, ut) -> bool:
    """Whether per-unit table ``ut`` is built for the catalog entry as it is now, and fresh."""
    try:
        plan, rw = template_plan(conn, qualified, ut.group_by, ut.columns)
        return accelerate_table.definition(plan.entry, rw)[0] == ut.name and fresh(conn.backend, ut, plan.entry)
    except CatalogError:
        return False


def _listed(conn, qualified: str, existing: set[str]) -> list[Acceleration]:
    _ensure_meta(conn)
    rows = query_records(conn.backend, f"SELECT name, any(group_by) AS gb, any(columns) AS cols FROM {ACCEL_TABLE} "
                                       f"WHERE table_name = {quote_string(qualified)} GROUP BY name ORDER BY name")
    out = []
    for row in rows:
        if row["name"] not in existing:
            continue
        gb, cols = tuple(row["gb"]), tuple(row["cols"])
        try:
            current = _name(_definition(conn, qualified, gb, cols)) == row["name"]
        except CatalogError:
            current = False
        out.append(Acceleration(qualified, row["name"], gb, cols, current))
    return out


def drop_accelerations(conn, table: str, *, stale_only: bool = False) -> list[str]:
    """Drop DPCH's per-unit projections and per-unit tables on ``table`` (only the stale ones if
    ``stale_only``; a per-unit table's materialized view first). Returns the names dropped."""
    qualified = conn.catalog.qualify(table)
    entry = conn.catalog.get(qualified)
    existing = _existing(conn, qualified)
    names = sorted(n for n in existing if n.startswith(PREFIX))
    if stale_only:
        stale = {a.name for a in _listed(conn, qualified, existing) if not a.current}
        names = [n for n in names if n in stale]
    for n in names:
        conn.backend.command(f"ALTER TABLE {entry.table_sql} DROP PROJECTION IF EXISTS {quote_ident(n)}")
    return names + [accelerate_table.drop(conn, ut) for ut in accelerate_table.present(conn, qualified)
                     if not (stale_only and _current(conn, qualified, ut))]
