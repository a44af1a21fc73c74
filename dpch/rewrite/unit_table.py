"""Maintained per-unit tables (dpch.accelerate_table): the per-unit stage read from an
AggregatingMergeTree that a materialized view keeps up to date, instead of from every row.

A per-unit table ``dpch_accel.<db>__<table>__units2_<digest>`` holds, per privacy unit (row
``__dp_total = 0``, the unit in ``__dp_unit``), the ``-State`` of each aggregate call of the
per-unit stage (``_Rewriter._per_unit_named(inline=True)``: the same calls a per-unit projection
stores) in columns ``a0, a1, …``, plus ``count()``; and one total row (``__dp_total = 1``) with the
same states over all of T's rows, rows without a unit included. ``ORDER BY (__dp_total,
__dp_unit)``. Both kinds of row come from one GROUP BY of the same SELECT (each row of T twice,
``ARRAY JOIN [0, 1] AS __dp_total``; the total row's key is the unit type's default): one view
writes them in the same block, so the total row counts exactly the rows whose unit rows were
written. Not ``GROUP BY GROUPING SETS``: its ``grouping()`` flag flips with the inserting session's
``force_grouping_standard_compatibility`` (checked on chdb 4.4), and the view runs with the
inserter's settings; the flag here depends on no setting. ``UnitTable.aggregates`` lists the calls
as the rewriter spells them (salt placeholders, not the salt). A plan is served when every aggregate call of its per-unit stage
is among them, its unit and salt are the table's, and it passes ``_unservable`` (the projection's
rules); the per-unit stage ``SELECT unit, aggs FROM T [WHERE unit-only] GROUP BY unit`` then becomes
``SELECT __dp_unit, aggMerge(a<i>) … FROM dpch_accel.… WHERE __dp_total = 0 GROUP BY __dp_unit``
with the same wrappers around each call (the flag, never a unit value, tells the total row apart). Every stage above is unchanged: the pre-noise values are the same numbers.

Fail-safe (``fresh``, one metadata query before each use): the table is read only if T still has
the UUID and engine definition recorded at build (lightweight updates off: their patch parts are
applied at merges, after which no metadata shows them), the materialized view is still among its
dependants, every mutation of T is one that was done before the build, and T's row count
(``total_rows``, from part metadata) equals the total row's merged ``count()`` (the rows the view
and the backfill have seen: one row per part to read, not one state per unit). Lightweight updates
off server-wide is checked at most once a minute per process. Inserts go through the view into
both; deletes, updates, TRUNCATE, partition drops and inserts that bypass the view break one of
these, and queries read T. Not detected: partition surgery that adds exactly as many rows as it
removes (``REPLACE PARTITION``, ``DROP`` + ``ATTACH PARTITION``): build again after it.

Privacy: the choice changes where the per-unit states are read from, not what they are. Which
source is read depends on the table's maintenance history (mutations, partition operations), not
on a unit's rows: adding or removing a unit by INSERT keeps both sides fresh.
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Callable

from sqlglot import exp

from ..catalog import META_DATABASE, TableEntry, is_nullable, quote_ident, quote_string
from ..errors import DPCHError
from ..sql_ast import sql_of
from .base import SALT_PLACEHOLDER, UNIT_SALT_PLACEHOLDER, Rewritten
from .projection import _unservable
from .rewriter import _Rewriter
from .shards import two_phase

ACCEL_DATABASE = "dpch_accel"
# the structure's name part: "units" (before the total row) tables are stale, never read
STRUCTURE = "units2"
TOTAL = "__dp_total"  # 1 on the total row, 0 on the unit rows
UNIT = "__dp_unit"  # the unit (the type's default on the total row)
UNIT_TABLES = f"{META_DATABASE}.unit_tables"
ROWS = "count()"
# a mutation's number (mutation_<block>.txt, or a replicated table's sequence number): increasing
MUTATION_NUMBER = "toUInt64OrZero(extract(mutation_id, '[0-9]+'))"
# the aggregate functions the per-unit stage uses (bounding.BoundingStages._per_unit_named)
_AGGREGATES = frozenset({"count", "sum", "min", "argMin", "countArgMin", "sumArgMin", "groupArraySorted",
                         "groupArraySortedArgMin", "groupArraySortedDistinct", "groupArraySortedDistinctArgMin"})
_LOOKUP_TTL_S = 10.0  # how long a process trusts its list of a table's per-unit tables


# -- the aggregate calls of an expression -----------------------------------------------------
def _skip(sql: str, i: int) -> int:
    """Index after the quoted token or comment starting at ``i`` (else i)."""
    ch = sql[i]
    if sql.startswith("/*", i):
        return sql.index("*/", i) + 2
    if ch in "'\"`":
        j = i + 1
        while sql[j] != ch:
            j += 2 if sql[j] == "\\" else 1
        return j + 1
    return i


def _close(sql: str, i: int) -> int:
    """``sql[i]`` is '(': the index after its matching ')'."""
    depth = 0
    while True:
        j = _skip(sql, i)
        if j != i:
            i = j
            continue
        depth += {"(": 1, ")": -1}.get(sql[i], 0)
        i += 1
        if depth == 0:
            return i


def aggregate_calls(expr: str) -> list[tuple[int, int, int]]:
    """The outermost calls of the per-unit aggregate functions in ``expr``: (start, end of the
    first argument list, end), the second list being a parametric function's arguments."""
    out, i, n = [], 0, len(expr)
    while i < n:
        j = _skip(expr, i)
        if j != i:
            i = j
        elif expr[i].isalpha() or expr[i] == "_":
            j = i
            while j < n and (expr[j].isalnum() or expr[j] == "_"):
                j += 1
            if expr[i:j] in _AGGREGATES and j < n and expr[j] == "(" and (i == 0 or expr[i - 1] != "."):
                first = _close(expr, j)
                end = _close(expr, first) if first < n and expr[first] == "(" else first
                out.append((i, first, end))
                i = end
            else:
                i = j
        else:
            i += 1
    return out


def _calls(expr: str) -> list[str]:
    return [expr[s:e] for s, _, e in aggregate_calls(expr)]


def state_sql(call: str) -> str:
    """``f(x)`` → ``fState(x)``; ``f(p)(x)`` → ``fState(p)(x)``."""
    name_end = call.index("(")
    return f"{call[:name_end]}State{call[name_end:]}"


def _merged(expr: str, column: dict[str, str]) -> str:
    """``expr`` with each aggregate call replaced by the -Merge of the column holding its state."""
    out, last = [], 0
    for s, first, e in aggregate_calls(expr):
        call = expr[s:e]
        name_end = expr.index("(", s)
        params = expr[name_end:first] if first < e else ""
        out += [expr[last:s], f"{expr[s:name_end]}Merge{params}({column[call]})"]
        last = e
    return "".join(out + [expr[last:]])


def stage_aggregates(rw: _Rewriter) -> list[str]:
    """Every aggregate call a per-unit table built from ``rw``'s plan holds: those of the per-unit
    stage in both of its forms (key values or the smallest hash), and ``count()``."""
    exprs = rw.per_unit_aggregates(inline=True) + [a for _, a in rw._per_unit_named(inline=True, key_hash=True)]
    calls = [c for e in exprs for c in _calls(e)] + [ROWS]
    return list(dict.fromkeys(calls))


def salt_digest(entry: TableEntry) -> str:
    return hashlib.sha256((entry.hash_key_sql() + entry.unit_salt_sql()).encode()).hexdigest()[:16]


# -- the structure ------------------------------------------------------------------------------
@dataclass(frozen=True)
class UnitTable:
    """One maintained per-unit table of catalogued table ``table`` (as recorded in UNIT_TABLES)."""

    table: str
    name: str
    unit: str
    aggregates: tuple[str, ...]  # column a<i> holds aggregates[i]'s state (salt placeholders)
    salt_digest: str
    table_uuid: str
    engine_full: str
    mutation: int  # the number of T's last mutation when the build started (all were done)
    group_by: tuple[str, ...] = ()
    columns: tuple[str, ...] = ()

    @property
    def target_sql(self) -> str:
        return f"{quote_ident(ACCEL_DATABASE)}.{quote_ident(self.name)}"

    @property
    def view_name(self) -> str:
        return self.name + "__mv"

    @property
    def current_structure(self) -> bool:
        """Built by this code (with the total row); an older structure is stale."""
        return self.name.rsplit("__", 1)[-1].startswith(STRUCTURE + "_")

    def column_of(self) -> dict[str, str]:
        return {a: f"a{i}" for i, a in enumerate(self.aggregates)}

    def serves(self, entry: TableEntry, needed: list[str]) -> bool:
        return (self.unit == entry.privacy_unit and self.salt_digest == salt_digest(entry)
                and set(needed) <= set(self.aggregates))


def per_unit_sql(ut: UnitTable, rw: _Rewriter, key_hash: bool) -> str:
    """The per-unit stage read from ``ut``: the same output columns as
    ``BoundingStages.groups_sql``'s per-unit subquery (``__dp_u`` first when ``key_hash``)."""
    p = rw.plan
    column = ut.column_of()
    named = rw._per_unit_named(inline=True, key_hash=key_hash)
    cols = ([f"{UNIT} AS __dp_u"] if key_hash else []) + [f"{_merged(a, column)} AS {n}" for n, a in named]
    conds = [f"{TOTAL} = 0"]  # the unit rows only, whatever the total row's unit value
    if p.bound.where is not None:  # on the unit only (_unservable): the per-unit table has it
        on_unit = p.bound.where.transform(
            lambda n: exp.column(UNIT) if isinstance(n, exp.Column) and n.name == p.entry.privacy_unit else n)
        conds.append(f"({sql_of(on_unit)})")
    if is_nullable(p.entry.columns.get(p.entry.privacy_unit or "", "")):
        conds.append(f"({UNIT} IS NOT NULL)")  # as the rows stage: a row without a unit is dropped
    return f"SELECT {', '.join(cols)}\nFROM {ut.target_sql}\nWHERE {' AND '.join(conds)}\nGROUP BY {UNIT}"


def freshness_sql(ut: UnitTable, entry: TableEntry) -> str:
    """One row: whether ``ut`` still holds exactly T's rows (see the module docstring): T's own row
    of system.tables (same UUID and engine, the view still among its dependants, its row count
    equal to the total row's count) and T's mutations."""
    d, t = quote_string(entry.database), quote_string(entry.name)
    rows = f"a{ut.aggregates.index(ROWS)}"
    # total_rows: T's rows from part metadata (what a trivial count() reads), in the same row
    return (
        "SELECT "
        f"(SELECT count() FROM system.tables WHERE database = {d} AND name = {t} "
        f"AND toString(uuid) = {quote_string(ut.table_uuid)} AND engine_full = {quote_string(ut.engine_full)} "
        f"AND has(arrayZip(dependencies_database, dependencies_table), "
        f"({quote_string(ACCEL_DATABASE)}, {quote_string(ut.view_name)})) "
        f"AND total_rows = (SELECT countMerge({rows}) FROM {ut.target_sql} WHERE {TOTAL} = 1)) = 1 "
        f"AND (SELECT count() FROM system.mutations WHERE database = {d} AND table = {t} "
        f"AND (NOT is_done OR {MUTATION_NUMBER} > {int(ut.mutation)})) = 0 AS fresh")


_LIGHTWEIGHT = "SELECT count() AS n FROM system.merge_tree_settings WHERE name = 'enable_block_number_column' " \
    "AND value NOT IN ('0', 'false')"
_server_checked: dict[int, float] = {}


def lightweight_updates_on(backend) -> bool:
    """Whether the server enables lightweight updates by default (checked at most once a minute
    per process: a server setting; a table's own setting is in its engine definition)."""
    return bool(backend.query_df(_LIGHTWEIGHT)["n"].iloc[0])


def fresh(backend, ut: UnitTable, entry: TableEntry) -> bool:
    """Whether ``ut`` may be read now (any error, e.g. a dropped table, means no; an older
    structure, without the total row, is never fresh: ``accelerate`` builds the current one)."""
    if not ut.current_structure:
        return False
    try:
        now = time.monotonic()
        if _server_checked.get(id(backend), 0.0) < now:
            if lightweight_updates_on(backend):
                return False
            _server_checked[id(backend)] = now + 60.0
        return bool(backend.query_df(freshness_sql(ut, entry))["fresh"].iloc[0])
    except DPCHError:
        return False


# -- the controller's choice ----------------------------------------------------------------------
_lookups: dict[tuple[int, str], tuple[float, list[UnitTable]]] = {}
_rewrites: dict[tuple[str, str], Rewritten] = {}


def forget(backend, table: str) -> None:
    """Drop this process's cached list of ``table``'s per-unit tables (after a build or a drop)."""
    _lookups.pop((id(backend), table), None)


def recorded(backend, table: str) -> list[UnitTable]:
    """The per-unit tables recorded for ``table`` (the newest record of each name), cached for
    _LOOKUP_TTL_S seconds per process (another process's build is seen after that)."""
    key, now = (id(backend), table), time.monotonic()
    hit = _lookups.get(key)
    if hit is not None and hit[0] > now:
        return hit[1]
    try:
        df = backend.query_df(
            "SELECT name, argMax(tuple(unit, aggregates, salt_digest, table_uuid, engine_full, mutation, group_by, "
            f"columns), created_at) AS r FROM {UNIT_TABLES} WHERE table_name = {quote_string(table)} "
            "GROUP BY name ORDER BY name")
        out = [UnitTable(table, str(row.name), str(r[0]), tuple(str(a) for a in r[1]), str(r[2]), str(r[3]), str(r[4]),
                         int(r[5]), tuple(str(g) for g in r[6]), tuple(str(c) for c in r[7]))
               for row in df.itertuples(index=False) for r in [row.r]]
    except DPCHError:
        out = []
    _lookups[key] = (now + _LOOKUP_TTL_S, out)
    return out


def serve(backend, plan, rewritten: Rewritten) -> tuple[Rewritten, str]:
    """(the query to run, where its per-unit stage reads from: "table" or the per-unit table's
    name). The plan's per-unit stage is read from a fresh per-unit table that holds every aggregate
    call of it, else ``rewritten`` runs as it is. Privacy guarantee: unchanged (the same pre-noise
    values; see the module docstring)."""
    entry = plan.entry
    if type(entry) is not TableEntry or entry.row_level or two_phase(plan):
        return rewritten, "table"
    candidates = recorded(backend, entry.table)  # cached: most tables have none, decided here
    if not candidates:
        return rewritten, "table"
    rw = _Rewriter(plan, noise=True, selection=True, table=None)
    if _unservable(plan, rw) is not None:
        return rewritten, "table"
    kh = rw.by_key_hash()
    needed = [c for _, a in rw._per_unit_named(inline=True, key_hash=kh) for c in _calls(a)]
    for ut in candidates:
        if ut.serves(entry, needed) and fresh(backend, ut, entry):
            return _rewritten_from(ut, plan, rewritten), ut.name
    return rewritten, "table"


def _rewritten_from(ut: UnitTable, plan, rewritten: Rewritten) -> Rewritten:
    key = (rewritten.sql, ut.name)
    if key not in _rewrites:
        if len(_rewrites) > 256:
            _rewrites.clear()
        reader: Callable[[_Rewriter, bool], str] = lambda rw, kh: per_unit_sql(ut, rw, kh)  # noqa: E731
        _rewrites[key] = _Rewriter(plan, noise=True, selection=True, table=None, units=reader).build()
    return _rewrites[key]


def salted(sql: str, entry: TableEntry) -> str:
    return sql.replace(SALT_PLACEHOLDER, entry.hash_key_sql()).replace(UNIT_SALT_PLACEHOLDER, entry.unit_salt_sql())
