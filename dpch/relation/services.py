"""What the relation stage needs from the engine and from later stages, passed in by the controller
(the one place that composes the stages), so that dpch.relation imports nothing after it.

Privacy: every callable here reads the schema or public tables only (a DESCRIBE, analysed never
executed; the distinct values of a public table's column) and never a private row, as before."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import pandas as pd
from sqlglot import exp

from ..catalog_model import TableEntry

Roots = Sequence[tuple[str, exp.Expression]]


@dataclass(frozen=True)
class RelationServices:
    """``query_df``: the engine's read (the relation's DESCRIBE, a public table's key domain);
    ``expression_types(entry, sqls)``: the engine's types of expressions over one table
    (dpch.typecheck.expression_types); ``total_expressions(roots, entry)``: the totality stage's
    checked, total forms of row-level expressions (dpch.totality.make_total_expressions)."""

    query_df: Callable[[str], pd.DataFrame]
    expression_types: Callable[[TableEntry, Sequence[str]], list[str]]
    total_expressions: Callable[[Roots, TableEntry], list[exp.Expression]]
