"""Where a table's privacy unit is: in its own column, or at the end of a chain of references
(foreign keys to keys of other catalogued tables). Used at registration (the chain must end at a
unit) and by ``dpch.relation`` (which joins the chain to find each row's unit).

A row of a table without its own unit belongs to the unit of the row it references (the referenced
column is a key, so there is exactly one such row); the unit's table at the end of the chain is
the *root*: its dataset is the one charged, its salt keys the bounding hashes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .catalog_model import TableEntry
from .errors import CatalogError

Lookup = Callable[[str], "TableEntry | None"]


@dataclass(frozen=True)
class Hop:
    """Join ``<current>.column = table.key`` to move one step along the chain."""

    column: str
    table: TableEntry
    key: str


@dataclass(frozen=True)
class UnitPath:
    root: TableEntry  # the table that owns the unit (its dataset is charged)
    hops: tuple[Hop, ...]  # joins from the table to the unit column (empty: a column of the table)
    column: str  # the unit column: in the table itself, or in hops[-1].table
    reference: tuple[str, str, str] | None  # (column, table, key): the reference that carries the unit


def _unit_references(entry: TableEntry, lookup: Lookup) -> list[tuple[str, TableEntry, str]]:
    out = []
    for col, (table, key) in entry.references.items():
        target = lookup(table)
        if target is None:
            raise CatalogError(f"{entry.table}.{col} references {table}, which is no longer in the privacy catalog")
        if not target.public:
            out.append((col, target, key))
    return out


def unit_path(entry: TableEntry, lookup: Lookup, _seen: tuple[str, ...] = ()) -> UnitPath | None:
    """The unit of ``entry``'s rows, or None for a row-level table (no unit, no reference to a
    protected table). Raises CatalogError for a public table, a cycle, a chain that ends at a
    row-level table, or two references that could carry the unit."""
    if entry.public:
        raise CatalogError(f"{entry.table} is public: it has no privacy unit")
    if entry.table in _seen:
        raise CatalogError(f"the references of {entry.table} form a cycle ({' -> '.join(_seen + (entry.table,))})")
    seen = _seen + (entry.table,)
    refs = _unit_references(entry, lookup)
    if entry.privacy_unit is not None:
        for col, target, key in refs:
            if col == entry.privacy_unit:  # the unit column references another table's unit: same units
                t = unit_path(target, lookup, seen)
                if t is not None and not t.hops and t.column == key:
                    return UnitPath(t.root, (), col, (col, target.table, key))
        return UnitPath(entry, (), entry.privacy_unit, None)
    if not refs:
        return None
    if len(refs) > 1:
        names = ", ".join(c for c, _, _ in refs)
        raise CatalogError(f"{entry.table} has no privacy_unit and {len(refs)} references to protected tables "
                           f"({names}): declare privacy_unit, or keep one reference that leads to the unit")
    col, target, key = refs[0]
    t = unit_path(target, lookup, seen)
    if t is None:
        raise CatalogError(f"{entry.table}.{col} references {target.table}, which has no privacy unit: a chain of "
                           "references must end at a table with a privacy_unit")
    if not t.hops and t.column == key:  # references the unit column itself
        return UnitPath(t.root, (), col, (col, target.table, key))
    return UnitPath(t.root, (Hop(col, target, key),) + t.hops, t.column, (col, target.table, key))
