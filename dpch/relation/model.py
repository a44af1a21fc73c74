"""What the resolver works with and produces: ``JoinedEntry`` (the joined relation seen as a
catalogued table), ``DerivedEntry`` (a per-unit aggregate subquery seen as a table), ``_Instance``
(one FROM/JOIN item as resolved) and the column markers that stand for alias.column until the
relation's column names are final."""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from sqlglot import exp

from ..catalog import TableEntry
from ..units import UnitPath
from .syntax import RELATION_PLACEHOLDER

UNIT_COLUMN = "__dp_unit"


@dataclass(frozen=True, eq=False)
class JoinedEntry(TableEntry):
    """A catalogued-table view of the joined relation (``table`` is the root's dataset, charged)."""

    relation_sql: str = ""
    sources: Mapping[str, tuple[str, str]] = field(default_factory=lambda: MappingProxyType({}))
    tables: tuple[str, ...] = ()
    unit_name: str = ""  # the unit as the analyst knows it: root table.column
    unit_aliases: frozenset[str] = frozenset()  # relation columns equal to __dp_unit on every row
    layout: tuple[str, ...] = ()  # one line per table / filter, for explain

    @property
    def table_sql(self) -> str:
        return f"(\n{self.relation_sql}\n) AS {RELATION_PLACEHOLDER}"

    def column_origin(self, column: str) -> tuple[str, str]:
        return self.sources.get(column, (self.table, column))


@dataclass(frozen=True, eq=False)
class DerivedEntry(TableEntry):
    """A per-unit aggregate subquery seen as a table: one row per (GROUP BY keys, unit)."""

    sql: str = ""

    @property
    def table_sql(self) -> str:
        return f"(\n{self.sql}\n)"


@dataclass
class _Instance:
    alias: str
    entry: TableEntry
    side: str
    path: UnitPath | None = None
    outputs: dict[str, exp.Expression] | None = None  # an inlined subquery's columns
    filters: list[exp.Expression] = field(default_factory=list)  # a LEFT JOIN's ON conditions on this table
    derived_unit_columns: frozenset[str] | None = None  # a per-unit subquery's columns that hold the unit

    @property
    def protected(self) -> bool:
        return not self.entry.public

    def visible(self) -> set[str]:
        return set(self.outputs) if self.outputs is not None else set(self.entry.columns)

    def unit_columns(self) -> frozenset[str]:
        """Columns whose value IS the row's unit (equating two of them joins rows of one unit)."""
        if self.derived_unit_columns is not None:
            return self.derived_unit_columns
        return frozenset({self.path.column}) if self.path is not None and not self.path.hops else frozenset()


def _marker(alias: str, column: str) -> str:
    """The name that stands for alias.column in a tree until the relation's column names are
    known (_Resolver._derived records the column; _finish puts the final name in its place)."""
    return f"\0{alias}\0{column}"


def _marked(name: str) -> tuple[str, str] | None:
    """(alias, column) of a column marker made by _marker, or None."""
    if not name.startswith("\0"):
        return None
    _, alias, column = name.split("\0")
    return alias, column


def _finish(tree: exp.Select, names: dict[tuple[str, str], str]) -> exp.Select:
    for col in list(tree.find_all(exp.Column)):
        marked = _marked(col.name)
        if marked is not None:
            col.replace(exp.column(names[marked]))
    return tree
