"""The unit of one table instance's rows, reached through its own chain of references.

Every protected instance of a joined relation gets its own chain (DESIGN.md invariant 9): the
``LEFT ANY JOIN``s from the instance's reference column to the table that holds the unit, each
with a match marker. Each hop reads only the keys that occur ONCE in the referenced table: a key
that stopped being unique (a duplicate inserted after registration) gives its rows no unit, so they
are dropped rather than attributed to whichever duplicate a join would pick (an ``ANY`` join picked
one by storage order: removing one unit then moved the rows of another; found by the generative
test, tests/attacks/test_join_generative_cases.py). The marker drops rows whose reference dangles
or is ambiguous (an orphan never takes a unit). The unit of a row is then a function of its
reference column alone, which lets a semi-join attach the unit after grouping by that column.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..catalog import quote_ident
from ..units import UnitPath
from .keys import check_key_types


@dataclass(frozen=True)
class Chain:
    """``unit``: SQL of the unit of the instance's rows; ``joins``: the chain's JOIN lines;
    ``matched``: conditions that hold iff every hop found its row."""

    unit: str
    joins: tuple[str, ...]
    matched: tuple[str, ...]


def unit_chain(path: UnitPath, start: str, prefix: str, entry) -> Chain:
    """The chain from ``start`` (a quoted alias whose table is ``entry``) along ``path``; hop h is
    aliased ``{prefix}{h}``. Key types along the chain must compare totally (dpch.relation.keys):
    refused before the charge otherwise."""
    prev, prev_entry = start, entry
    joins, matched = [], []
    for h, hop in enumerate(path.hops):
        check_key_types(f"the reference {prev_entry.table}.{hop.column} → {hop.table.table}.{hop.key}",
                        (f"{prev_entry.table}.{hop.column}", prev_entry.columns.get(hop.column)),
                        (f"{hop.table.table}.{hop.key}", hop.table.columns.get(hop.key)))
        alias = f"{prefix}{h}"
        key = quote_ident(hop.key)
        unit = quote_ident(path.column if h == len(path.hops) - 1 else path.hops[h + 1].column)
        # keys that occur once: any() is then the one row's value (an ambiguous key takes no unit)
        joins.append(f"LEFT ANY JOIN (SELECT {key}, any({unit}) AS {unit}, toUInt8(1) AS __dp_m "
                     f"FROM {hop.table.table_sql} GROUP BY {key} HAVING count() = 1) "
                     f"AS {alias} ON {prev}.{quote_ident(hop.column)} = {alias}.{key}")
        matched.append(f"{alias}.__dp_m = 1")
        prev, prev_entry = alias, hop.table
    return Chain(f"{prev}.{quote_ident(path.column)}", tuple(joins), tuple(matched))
