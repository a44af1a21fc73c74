"""Join resolution and unit propagation: the stage between parse and bind for queries that read
more than one table, read a CTE or a subquery, filter by ``IN (SELECT …)`` over public tables, or
read a table whose privacy unit is reached through references.

    split_from (at parse time, syntactic)  ─►  resolve (catalog-aware)  ─►  bind, as for one table

``resolve`` turns the FROM clause into ONE relation, a subquery that joins the tables (and, for a
table without its own unit column, the chain of referenced tables that leads to its unit, with
``ANY INNER JOIN`` so a chain never multiplies rows), and a ``JoinedEntry`` that describes it like a
catalogued table: its columns (renamed apart when two tables share a name), their bounds and public
key domains, and the unit column ``__dp_unit``. The rest of the pipeline then applies the per-unit
bounds (k groups, C rows per group, M rows) to the *joined* rows, keyed by that unit: whatever a
join fans out, one unit's contribution to any answer stays bounded (docs/CONTROLLER.md, "Joins").

What is accepted (everything else is a QueryRejected that names the rule; docs/CONTROLLER.md,
"Joins", has the list and the sensitivity argument):

- ``[INNER] JOIN`` / ``LEFT [OUTER] JOIN`` with ``ON`` (at least one key equality with an earlier
  table; other INNER conditions act as WHERE, other LEFT conditions filter the joined table) or
  ``USING``; comma joins whose WHERE equalities connect each table to an earlier one;
- protected ⋈ public on any columns; protected ⋈ protected only along the reference that carries
  the unit (e.g. ``lineitem.l_orderkey = orders.o_orderkey``) or on two unit columns, so a joined
  row never pairs rows of two units; all protected tables share one unit (one root), and each
  appears once (no self-join); the unit of a joined row comes from a table every row keeps;
- a CTE or a subquery in FROM that is row-level over ONE catalogued table (inlined, its WHERE
  joins the outer WHERE), or that pre-aggregates per unit (GROUP BY a unit-determining column; run
  grouped by (keys, unit), so each of its rows is one unit's);
- ``col [NOT] IN (SELECT …)`` over public tables; ``col [NOT] IN (SELECT key FROM t …)`` and
  ``[NOT] EXISTS`` over one protected table along the unit-carrying reference, so a row is
  filtered by its own unit's rows only. Row expressions that run inside the relation (LEFT JOIN
  conditions, subquery WHERE, aggregate arguments) get the totality stage's rules.

The package, by what each module does:

- ``syntax``: split_from and the FromSpec it returns (parse time, syntactic);
- ``model``: JoinedEntry, DerivedEntry, the resolver's instances and column markers;
- ``semijoins``: ``IN (SELECT …)`` / ``EXISTS`` filters, and the HAVING rules of per-key subqueries;
- ``per_unit``: per-unit aggregate subqueries (GROUP BY a column that determines the unit);
- ``resolver``: resolve and the resolver (tables, columns, the join graph, the relation's SQL and
  entry), and needs_unit_chain;
- ``services``: RelationServices, the engine reads and later-stage callables the controller passes in
  (the package imports no later stage: docs/ARCHITECTURE.md).

The resolver is imported as ``dpch.relation.resolver`` (the controller's import), not from here, so
that dpch.parse, which imports ``dpch.relation.syntax``, does not load it.
"""
from .model import UNIT_COLUMN, DerivedEntry, JoinedEntry
from .syntax import MAX_JOINED_TABLES, RELATION_PLACEHOLDER, FromSpec, SemiJoin, Source, needs_relation, split_from

__all__ = [
    "DerivedEntry", "FromSpec", "JoinedEntry", "MAX_JOINED_TABLES", "PUBLIC_KEY_LIMIT", "RELATION_PLACEHOLDER",
    "SemiJoin", "Source", "UNIT_COLUMN", "needs_relation", "needs_unit_chain", "resolve", "split_from",
]
