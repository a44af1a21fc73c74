"""The probe database: one row of default values per catalogued table, so the pre-charge type
check runs the REAL relation (its joins, semi-joins, reference-chain joins and their key
conversions) without reading a private row (DESIGN.md invariants 2 and 7; issue 26, item 3).

For every catalogued table T that a joined relation reads (protected or public), ``dpch_probe``
holds a table with T's registered columns at T's registered types and ONE row: each column's
type default, Nullable columns at the default of the inner type (so equal keys match and rows
flow through the joins; the relation's own default row, NULLs included, is added by the probe).
Its name carries a digest of T's name and columns, so a table whose registered columns or types
change gets a new probe table (and the passed-check cache, keyed by the probe's text, a new key).
Tables are created lazily with ``CREATE TABLE IF NOT EXISTS ... AS SELECT`` (Memory engine: the
cheapest to read, bench/bench_probe.py). A server restart empties a Memory table, so each one is
checked again (one ``count()``, refilled if empty) when its last check is older than
``RECHECK_SECONDS``; a probe that fails is retried once after all are checked again.

Privacy: the probe tables hold only type defaults, never a value from a row. The probe query is
the rewritten query with every catalogued table replaced by its probe table on the SQL tree
(sqlglot; never by text), so whether it fails depends on the query and the schemas only: the
same on D and D′. A table that is not catalogued (or not a plain ``db.table``) is refused, so no
probe ever reads a real table before the charge.

A server deployment needs ``CREATE DATABASE, CREATE TABLE, INSERT, SELECT ON dpch_probe.*`` for
the engine user (clickhouse_config/users.d/dpch_gateway.xml grants it); without it a query over
joined tables is refused, nothing charged.
"""
from __future__ import annotations

import hashlib
import json
import time
from typing import Callable

from .backends import query_records
from .catalog import TableEntry, _backend_lock, quote_ident, quote_string
from .engine import sanitize_error
from .errors import CatalogError, QueryRejected
from .rewrite.probe import PROBE_DATABASE, swap_tables  # noqa: F401 - re-exported

_ENGINE = "Memory"
RECHECK_SECONDS = 30.0


def probe_table_name(entry: TableEntry) -> str:
    """The probe table of ``entry`` in ``dpch_probe``: readable prefix + digest of the table's name
    and (column, type) list. Different schemas never share a name."""
    digest = hashlib.sha256(json.dumps([entry.table, list(entry.columns.items())]).encode()).hexdigest()[:16]
    return f"{entry.database}__{entry.name}"[:120] + f"__{digest}"


def _non_null(ch_type: str) -> str:
    """The type whose default fills a column of ``ch_type``: Nullable(X) → X (also inside
    LowCardinality), so a probe key is a value that equal keys of other tables match."""
    t = ch_type.strip()
    if t.startswith("Nullable(") and t.endswith(")"):
        return t[len("Nullable("):-1]
    if t.startswith("LowCardinality(Nullable(") and t.endswith("))"):
        return f"LowCardinality({t[len('LowCardinality(Nullable('):-2]})"
    return t


def _create_sql(entry: TableEntry, name: str) -> tuple[str, str]:
    """(CREATE … AS SELECT <defaults>, INSERT … SELECT <defaults>). The types are the catalog's
    (read from the engine's DESCRIBE at registration), so they are valid type names."""
    cols = ", ".join(f"{quote_ident(c)} {t}" for c, t in entry.columns.items())
    vals = ", ".join(f"CAST(defaultValueOfTypeName({quote_string(_non_null(t))}), {quote_string(t)}) AS {quote_ident(c)}"
                     for c, t in entry.columns.items())
    return (f"CREATE TABLE IF NOT EXISTS {PROBE_DATABASE}.{quote_ident(name)} ({cols}) ENGINE = {_ENGINE} "
            f"AS SELECT {vals}"), f"INSERT INTO {PROBE_DATABASE}.{quote_ident(name)} SELECT {vals}"


def _ready(backend) -> dict:
    """Probe table name -> time.monotonic() of its last check, per backend."""
    ready = getattr(backend, "_dpch_probe_tables", None)
    if ready is None:
        ready = {}
        try:
            backend._dpch_probe_tables = ready
        except AttributeError:  # pragma: no cover - backends are plain objects
            pass
    return ready


def forget(backend) -> None:
    """Forget which probe tables exist (they are checked and made again on next use)."""
    _ready(backend).clear()


def _fresh(ready: dict, name: str) -> bool:
    checked = ready.get(name)
    return checked is not None and time.monotonic() - checked < RECHECK_SECONDS


def ensure_probe_table(backend, entry: TableEntry) -> str:
    """The name of ``entry``'s table in ``dpch_probe``, created with its one row if missing (or
    refilled if empty). Raises QueryRejected (names the table only) if the engine refuses."""
    name = probe_table_name(entry)
    ready = _ready(backend)
    if _fresh(ready, name):
        return name
    # the engine's lock, shared by every analyst's view of it: one thread at a time creates or fills a probe table
    with _backend_lock(backend):
        if _fresh(ready, name):
            return name
        qualified = f"{PROBE_DATABASE}.{quote_ident(name)}"
        create, insert = _create_sql(entry, name)
        try:
            backend.command(f"CREATE DATABASE IF NOT EXISTS {PROBE_DATABASE}")
            backend.command(create)
            # a table left empty (a server restart, a crash between CREATE and its insert) gets
            # its row again; two racing processes may both add one: harmless, the probe's output
            # is discarded and a second row of the same defaults changes no type
            if int(query_records(backend, f"SELECT count() AS n FROM {qualified}")[0]["n"]) == 0:
                backend.command(insert)
        except Exception as exc:
            raise QueryRejected(f"the type check could not prepare its probe table for {entry.table} "
                                f"({sanitize_error(str(exc))}); the engine user needs CREATE TABLE, INSERT and "
                                f"SELECT on {PROBE_DATABASE}.*. Nothing ran on the data and nothing was charged") from None
        ready[name] = time.monotonic()
    return name


def probe_tables(conn) -> Callable[[str], str]:
    """``probe_of(db.table)`` for ``swap_tables``: the probe table of a catalogued table (created
    on first use). Raises QueryRejected for a table outside the catalog."""
    def probe_of(table: str) -> str:
        try:
            entry = conn.catalog.get(table)
        except CatalogError:
            raise QueryRejected("the type check found a table outside the privacy catalog; nothing ran and "
                                "nothing was charged") from None
        return ensure_probe_table(conn.backend, entry)
    return probe_of


def check_before_charge(conn, plan, rendering=None) -> None:
    """The pre-charge type check of ``plan`` (dpch.typecheck.check_runs) on probe data: the real
    relation over the probe tables. ``rendering`` = (format, settings) when the engine renders the
    result (the probe is rendered alike). Raises QueryRejected; charges nothing. A failure is
    retried once after the probe tables are checked again (one may have been dropped)."""
    from .rewrite import rewrite_probe
    from .typecheck import check_runs

    def run() -> None:
        probe = rewrite_probe(plan, probe_tables(conn))
        if rendering is None:
            probe_sql, fmt = probe.sql, None
        else:
            probe_sql, fmt = probe.formatted_sql(rendering[1]), rendering[0]
        check_runs(conn.backend, plan.entry, plan.bound, probe_sql, fmt)

    try:
        run()
    except QueryRejected:
        if type(plan.entry) is TableEntry or not _ready(conn.backend):
            raise
        forget(conn.backend)
        run()
