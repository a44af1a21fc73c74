"""The plan cache: what ``dpch.controller.prepare`` decided for a query, reused when the same analyst
sends the same query again against the same catalog state (issue 33, item 1).

A prepared query (parse → bind → total → plan → rewrite, and the engine's DESCRIBEs of its
expression types) is a function of

- the query: its text, and the tree the caller parsed (the gateway qualifies table names on it);
- the catalog as it stands: every entry's table, version and salt (a register/update writes a new
  version; a salt rotation too), and the default database names resolve in;
- the release's parameters: ε and δ exactly (float bits) and every option (QueryOptions, frozen
  with the type of each value, so 1, 1.0 and True are three keys);
- whether the caller runs the unit profile, and the analyst.

All of these are in the key, so a hit returns exactly what preparing again would return. The key
holds no data value: nothing here reads a row, so a hit or a miss (and its time) depends on the
query and the catalog only, never on a unit's rows (DESIGN.md invariant 7). Only single-table
queries are cached (``cacheable``): a joined relation may read a public table's key domain from
the engine, which a catalog version does not track. The analyst is in the key although nothing
prepared depends on them: no analyst is ever handed an object prepared for another. What is
never cached: the budget precheck and the charge (the controller runs both on every call), and a
rejected query (errors are raised before anything is stored).

Entries are immutable in use (the controller builds new objects with ``dataclasses.replace``); a
hit is returned with its own ``timings_ms``.
"""
from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import fields, is_dataclass
from typing import Any

from .catalog import TableEntry

MAX_ENTRIES = 1024

_CACHE: OrderedDict = OrderedDict()
_LOCK = threading.Lock()
# catalog fingerprints by the identity of the loaded entries dict (the catalog replaces the dict on
# every load, never mutates it); the dict is held so that its id cannot be reused while listed here
_FINGERPRINTS: OrderedDict = OrderedDict()


class Uncacheable(Exception):
    """An option value the key cannot represent exactly: the query is prepared uncached."""


def freeze(value: Any) -> Any:
    """A hashable, type-tagged copy of an option value (str, int, float by its bits, bool, None,
    sequences, mappings, frozen dataclasses of those). Raises Uncacheable for anything else."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int) and type(value) is int:
        return ("int", value)
    if type(value) is float:
        return ("float", value.hex())
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return (type(value).__name__, tuple(freeze(v) for v in value))
    if isinstance(value, Mapping):
        return ("map", tuple(sorted(((freeze(k), freeze(v)) for k, v in value.items()), key=repr)))
    if is_dataclass(value) and not isinstance(value, type):
        return (type(value).__qualname__, tuple((f.name, freeze(getattr(value, f.name))) for f in fields(value)))
    raise Uncacheable(type(value).__name__)


def catalog_fingerprint(entries: Mapping[str, Any]) -> tuple:
    """(table, version, digest of the salt) of every catalogued table, memoised per loaded dict."""
    with _LOCK:
        hit = _FINGERPRINTS.get(id(entries))
        if hit is not None and hit[0] is entries:
            return hit[1]
    fp = tuple(sorted((name, int(e.version), hashlib.sha256(e.salt.encode()).hexdigest()[:32])
                      for name, e in entries.items()))
    with _LOCK:
        _FINGERPRINTS[id(entries)] = (entries, fp)
        while len(_FINGERPRINTS) > 8:
            _FINGERPRINTS.popitem(last=False)
    return fp


def make_key(*, analyst: str, sql: str, tree_sql: str | None, default_database: str, entries: Mapping[str, Any],
             epsilon: float, delta: float, options: Any, profile: bool) -> tuple | None:
    """The cache key, or None when an option cannot be keyed exactly (then nothing is cached)."""
    try:
        opts = freeze(options)
    except Uncacheable:
        return None
    return (analyst, sql, tree_sql, default_database, catalog_fingerprint(entries), float(epsilon).hex(),
            float(delta).hex(), opts, bool(profile))


def key_for(conn, sql: str, tree, epsilon: float, delta: float, options: Any, profile: bool) -> tuple | None:
    """``make_key`` for a prepare call on ``conn`` (its analyst and catalog as loaded now). None
    (uncached) when the catalog cannot be read here or the tree cannot be printed: the uncached
    path then raises its own error."""
    try:
        catalog = conn.catalog
        entries = catalog._load()
        tree_sql = None if tree is None else tree.sql(dialect="clickhouse")
        return make_key(analyst=str(conn.analyst), sql=sql, tree_sql=tree_sql,
                        default_database=catalog.default_database, entries=entries, epsilon=epsilon, delta=delta,
                        options=options, profile=profile)
    except Exception:  # noqa: BLE001 - no key, no cache; the uncached path reports the error
        return None


def get(key: tuple | None):
    if key is None:
        return None
    with _LOCK:
        hit = _CACHE.get(key)
        if hit is not None:
            _CACHE.move_to_end(key)
        return hit


def put(key: tuple | None, value: Any) -> None:
    """Store a prepared query whose plan reads one catalogued table (see ``cacheable``)."""
    if key is None or not cacheable(value):
        return
    with _LOCK:
        _CACHE[key] = value
        while len(_CACHE) > MAX_ENTRIES:
            _CACHE.popitem(last=False)


def cacheable(prepared: Any) -> bool:
    """Only a plan over one catalogued table (a ``TableEntry``, not a joined relation): its
    preparation reads the catalog and the engine's types of expressions, both in the key."""
    return type(prepared.plan.entry) is TableEntry and prepared.parsed.sources is None


def clear() -> None:
    """Forget every cached plan (benchmarks of the cold path; tests)."""
    with _LOCK:
        _CACHE.clear()
        _FINGERPRINTS.clear()


def size() -> int:
    with _LOCK:
        return len(_CACHE)
