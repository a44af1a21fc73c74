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
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from sqlglot import exp

from .catalog import MAX_PUBLIC_KEYS, TableEntry, quote_ident
from .errors import CatalogError, QueryRejected
from .units import UnitPath, unit_path

RELATION_PLACEHOLDER = "__dp_rel"
UNIT_COLUMN = "__dp_unit"
MAX_JOINED_TABLES = 16
PUBLIC_KEY_LIMIT = min(MAX_PUBLIC_KEYS, 10_000)


def _reject(msg: str) -> QueryRejected:
    return QueryRejected(msg)


# ------------------------------------------------------------------------------------------------
# Syntax (parse time)
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Source:
    """One FROM/JOIN item as written: a table (maybe a CTE name) or a subquery."""

    alias: str
    table: exp.Table | None
    subquery: exp.Select | None
    side: str  # "from" | "inner" | "left" | "comma" (FROM a, b: joined by equalities of WHERE)
    on: exp.Expression | None = None
    using: tuple[str, ...] = ()


@dataclass(frozen=True)
class SemiJoin:
    """A WHERE conjunct ``col [NOT] IN (SELECT …)`` or ``[NOT] EXISTS (SELECT …)`` (column None)."""

    column: exp.Column | None
    subquery: exp.Select
    negated: bool


@dataclass(frozen=True)
class FromSpec:
    sources: tuple[Source, ...]
    semijoins: tuple[SemiJoin, ...] = ()


def needs_relation(tree: exp.Select) -> bool:
    from_ = tree.args.get("from_")
    src = from_.this if from_ is not None else None
    return bool(tree.args.get("joins") or tree.args.get("with_") or isinstance(src, exp.Subquery)
                or _in_subquery_conjuncts(tree))


def _conjuncts(node: exp.Expression | None) -> list[exp.Expression]:
    if node is None:
        return []
    node = node.unnest() if isinstance(node, exp.Paren) else node
    if isinstance(node, exp.And):
        return _conjuncts(node.this) + _conjuncts(node.expression)
    return [node]


def _in_subquery(node: exp.Expression) -> tuple[exp.Expression | None, exp.Select, bool] | None:
    negated = False
    if isinstance(node, exp.Not):
        negated, node = True, node.this
        node = node.unnest() if isinstance(node, exp.Paren) else node
    if isinstance(node, exp.In) and node.args.get("query") is not None:
        q = node.args["query"]
        q = q.this if isinstance(q, exp.Subquery) else q
        if isinstance(q, exp.Select):
            return node.this, q, negated
    if isinstance(node, exp.Exists) and isinstance(node.this, exp.Select):
        return None, node.this, negated
    return None


def _in_subquery_conjuncts(tree: exp.Select) -> list[exp.Expression]:
    where = tree.args.get("where")
    return [c for c in _conjuncts(where.this if where is not None else None) if _in_subquery(c) is not None]


def split_from(tree: exp.Select) -> tuple[FromSpec, exp.Select]:
    """Take the FROM clause, joins, CTEs and IN-subquery conjuncts out of ``tree``: (what they
    were, the tree reading the placeholder relation ``__dp_rel``). Syntactic only."""
    tree = tree.copy()
    ctes: dict[str, exp.Expression] = {}
    with_ = tree.args.get("with_")
    if with_ is not None:
        if with_.args.get("recursive"):
            raise _reject("recursive CTEs are not supported")
        for cte in with_.expressions:
            if not isinstance(cte, exp.CTE) or not isinstance(cte.this, exp.Select):
                raise _reject("a CTE must be WITH name AS (SELECT ...)")
            name = cte.alias_or_name
            if not name or name.lower() in ctes:
                raise _reject("every CTE needs a distinct name")
            ctes[name.lower()] = cte.this
        tree.set("with_", None)

    def source(node: exp.Expression, side: str, on=None, using=()) -> Source:
        if isinstance(node, exp.Subquery):
            inner = node.this
            if not isinstance(inner, exp.Select):
                raise _reject("a subquery in FROM must be one SELECT (no UNION)")
            alias = node.alias
            if not alias:
                raise _reject("a subquery in FROM or JOIN needs an alias: (SELECT ...) AS name")
            return Source(alias, None, inner, side, on, using)
        if isinstance(node, exp.Table) and isinstance(node.this, exp.Identifier):
            if node.args.get("alias") is not None and node.args["alias"].args.get("columns"):
                raise _reject("column aliases on a table are not supported")
            for key, value in node.args.items():
                if value not in (None, False, []) and key not in ("this", "db", "alias"):
                    raise _reject(f"this table modifier ({key}) is not supported in a join")
            if not node.db and node.name.lower() in ctes:
                return Source(node.alias or node.name, None, ctes[node.name.lower()], side, on, using)
            return Source(node.alias or node.name, node, None, side, on, using)
        raise _reject("each FROM/JOIN item must be a catalogued table, a CTE or a subquery (no table functions)")

    from_ = tree.args.get("from_")
    if from_ is None:
        raise _reject("the query has no FROM clause: DP aggregates read catalogued tables")
    used = {t.name.lower() for t in tree.find_all(exp.Table) if not t.db}
    unused = [n for n in ctes if n not in used]
    if unused:
        raise _reject(f"the CTE {unused[0]} is not used: remove it")
    sources = [source(from_.this, "from")]
    for join in tree.args.get("joins") or []:
        side = (join.text("side") or "").upper()
        kind = (join.text("kind") or "").upper()
        if kind == "ARRAY" or "ARRAY" in side:
            raise _reject("ARRAY JOIN is not supported")
        if kind == "CROSS" and not side and join.args.get("on") is None and not join.args.get("using") \
                and not join.args.get("global_") and not join.args.get("strictness"):
            # FROM a, b (or CROSS JOIN b): an inner join if WHERE connects it (resolved later)
            sources.append(source(join.this, "comma"))
            continue
        if join.args.get("global_") or join.args.get("strictness") or kind not in ("", "INNER", "OUTER") \
                or side not in ("", "LEFT"):
            what = " ".join(x for x in (side, kind, join.text("strictness")) if x) or "this"
            raise _reject(f"{what} JOIN is not supported: use [INNER] JOIN or LEFT JOIN ... ON equal keys")
        if kind == "OUTER" and side != "LEFT":
            raise _reject("only LEFT OUTER JOIN is supported among outer joins")
        on = join.args.get("on")
        using = tuple(u.name for u in (join.args.get("using") or []))
        if on is None and not using:
            raise _reject("a JOIN needs ON <equal keys> or USING (...); cross joins are not supported")
        sources.append(source(join.this, "left" if side == "LEFT" else "inner", on, using))
    if len(sources) > MAX_JOINED_TABLES:
        raise _reject(f"at most {MAX_JOINED_TABLES} tables per query")
    tree.set("joins", None)
    tree.set("from_", exp.From(this=exp.to_table(RELATION_PLACEHOLDER)))

    semis = []
    where = tree.args.get("where")
    if where is not None:
        keep = []
        for c in _conjuncts(where.this):
            found = _in_subquery(c)
            if found is None:
                keep.append(c)
                continue
            col, sub, negated = found
            if col is not None and not isinstance(col, exp.Column):
                raise _reject("x IN (SELECT ...) needs a column on the left")
            semis.append(SemiJoin(col, sub, negated))
        tree.set("where", exp.Where(this=exp.and_(*keep)) if keep else None)
    return FromSpec(tuple(sources), tuple(semis)), tree


# ------------------------------------------------------------------------------------------------
# Resolution (catalog-aware)
# ------------------------------------------------------------------------------------------------

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


class _Resolver:
    def __init__(self, spec: FromSpec, catalog, backend):
        self.spec, self.catalog, self.backend = spec, catalog, backend
        self.instances: list[_Instance] = []
        self.extra_where: list[exp.Expression] = []
        self.used: dict[tuple[str, str], None] = {}  # (alias, column) the query reads, in order (a set)
        self.names: dict[tuple[str, str], str] = {}  # (alias, column) -> derived name, once all are known
        self.semi_sql: list[str] = []

    # -- tables ---------------------------------------------------------------------------------
    def _entry(self, table: exp.Table) -> TableEntry:
        name = f"{table.db}.{table.name}" if table.db else table.name
        if (table.db or "").lower() in ("system", "information_schema"):
            raise _reject(f"system tables ({name}) are not allowed")
        try:
            return self.catalog.get(self.catalog.qualify(name))
        except CatalogError as exc:
            raise _reject(str(exc)) from None

    def _instance(self, src: Source) -> _Instance:
        if src.table is not None:
            return _Instance(src.alias, self._entry(src.table), src.side)
        sub = src.subquery
        assert sub is not None
        if src.side == "left":
            raise _reject(f"the subquery {src.alias} is on the right of a LEFT JOIN: join the table itself and "
                          "put its conditions in ON or WHERE")
        if sub.args.get("group") is not None or any(isinstance(n, exp.AggFunc) for e in sub.expressions
                                                    for n in e.walk()):
            return self._per_unit_instance(src)
        for key, value in sub.args.items():
            if value not in (None, False, []) and key not in ("expressions", "from_", "where"):
                raise _reject(f"the subquery {src.alias} must be row-level (columns and WHERE over one table); "
                              f"{key.upper()} is not supported there")
        inner_from = sub.args.get("from_")
        t = inner_from.this if inner_from is not None else None
        if not isinstance(t, exp.Table) or not isinstance(t.this, exp.Identifier):
            raise _reject(f"the subquery {src.alias} must read one catalogued table")
        entry = self._entry(t)
        inner_alias = t.alias or t.name
        outputs: dict[str, exp.Expression] = {}
        for e in sub.expressions:
            if isinstance(e, exp.Star) or any(isinstance(n, (exp.Star, exp.Select, exp.AggFunc)) for n in e.walk()):
                raise _reject(f"the subquery {src.alias} must list its columns (row expressions, no * or aggregates)")
            name = e.alias_or_name
            if not name or name in outputs:
                raise _reject(f"every column of the subquery {src.alias} needs a distinct name (expr AS name)")
            outputs[name] = self._qualify_inner(e.unalias() if isinstance(e, exp.Alias) else e,
                                                entry, inner_alias, src.alias)
        where = sub.args.get("where")
        if where is not None:
            self.extra_where.append(self._qualify_inner(where.this, entry, inner_alias, src.alias))
        return _Instance(src.alias, entry, src.side, outputs=outputs)

    def _per_unit_instance(self, src: Source) -> _Instance:
        """``(SELECT k, agg(x) AS a FROM … GROUP BY k) AS t`` where k determines the privacy unit
        (the unit column, the reference that carries it, or a key that such a reference points
        to): per-unit pre-aggregation. Its FROM is resolved as a relation of its own, and it is
        grouped by (k, unit), so each of its rows is computed from ONE unit's rows; the outer query
        then bounds those rows per unit as usual (docs/CONTROLLER.md, "Joins")."""
        sub = src.subquery
        assert sub is not None
        for key, value in sub.args.items():
            if value not in (None, False, []) and key not in ("expressions", "from_", "where", "group", "having",
                                                              "joins"):
                raise _reject(f"the aggregate subquery {src.alias}: {key.upper()} is not supported there")
        spec, flat = split_from(sub)
        inner = _Resolver(spec, self.catalog, self.backend)
        flat, rel = inner.resolve(flat)
        flat = _finish(flat, inner.names)
        if rel.privacy_unit is None:
            raise _reject(f"the aggregate subquery {src.alias} reads a row-level table: per-unit aggregation needs "
                          "a privacy unit")
        group = flat.args.get("group")
        keys = list(group.expressions) if group is not None else []
        if not keys or not all(isinstance(k, exp.Column) for k in keys):
            raise _reject(f"the aggregate subquery {src.alias} must GROUP BY columns, one of which determines the "
                          "privacy unit (e.g. GROUP BY c_custkey), so that each of its rows is one unit's")
        origin = {name: ac for ac, name in inner.names.items()}
        unit_keys = [k.name for k in keys if inner.holds_unit(origin.get(k.name))]
        if not any(inner.determines_unit(origin.get(k.name)) for k in keys):
            raise _reject(f"the aggregate subquery {src.alias} must GROUP BY a column that determines the privacy "
                          "unit (its column, the reference that carries it, or a key such a reference points to), "
                          "so that each of its rows is computed from one unit's rows")
        key_names = {k.name for k in keys}
        selects, roots, unit_outputs = [], [], set()
        for e in flat.expressions:
            node, name = e.unalias(), e.alias_or_name
            if not name or name.startswith("__dp") or any(name == x for x, _ in selects):
                raise _reject(f"every column of the aggregate subquery {src.alias} needs a distinct name (expr AS name)")
            if isinstance(node, exp.Column) and node.name in key_names:
                if node.name in unit_keys:
                    unit_outputs.add(name)
            elif isinstance(node, self._HAVING_AGGS) and (_no_argument(node) or not any(
                    isinstance(x, (exp.AggFunc, exp.Select)) for x in node.this.walk())):
                if isinstance(node.this, exp.Distinct):
                    raise _reject(f"the aggregate subquery {src.alias}: COUNT(DISTINCT ...) is not supported there")
                if not _no_argument(node):
                    arg = node.this
                    if isinstance(node, (exp.Sum, exp.Avg)):
                        arg = exp.Anonymous(this="toFloat64", expressions=[arg.copy()])
                    roots.append((f"{src.alias}.{name}", arg))
            else:
                raise _reject(f"the aggregate subquery {src.alias}: each column must be a GROUP BY column or "
                              f"COUNT/SUM/AVG/MIN/MAX of a row expression (got {node.sql()[:60]})")
            selects.append((name, node))
        where = flat.args.get("where")
        where_roots = [(f"{src.alias} WHERE", where.this)] if where is not None else []
        aggs = {name: node for name, node in selects if isinstance(node, exp.AggFunc)}
        having, having_roots = self._having(flat.args.get("having"), lambda n: n.copy().transform(
            lambda c: aggs[c.name].copy() if isinstance(c, exp.Column) and not c.table and c.name in aggs else c), rel)
        total = iter(self._total(rel, where_roots + roots + having_roots))
        where_sql = f"\nWHERE {next(total).sql('clickhouse')}" if where is not None else ""
        cols = []
        for name, node in selects:
            node = node.copy()
            if isinstance(node, self._HAVING_AGGS) and not _no_argument(node):
                node.set("this", next(total))
            cols.append(f"{node.sql('clickhouse')} AS {quote_ident(name)}")
        if having is not None:
            for agg in having.find_all(exp.AggFunc):
                if not _no_argument(agg):
                    agg.set("this", next(total))
        group_sql = ", ".join([quote_ident(k.name) for k in keys] + [UNIT_COLUMN])
        sql = (f"SELECT {', '.join(cols)}, {UNIT_COLUMN}\nFROM {rel.table_sql}{where_sql}\nGROUP BY {group_sql}"
               + (f"\nHAVING {having.sql('clickhouse')}" if having is not None else ""))
        types = self._describe(sql)
        types.pop(UNIT_COLUMN, None)
        one = bool(unit_outputs) and len(keys) == 1  # grouped by the unit alone: one row per unit
        entry = DerivedEntry(
            table=f"(subquery {src.alias})", privacy_unit=UNIT_COLUMN, neighbour=rel.neighbour,
            bounds=MappingProxyType({n: rel.bounds[n] for n, _ in selects if n in rel.bounds}),
            max_groups_contributed=1 if one else rel.max_groups_contributed,
            max_rows_per_unit=1 if one else rel.max_rows_per_unit,
            max_rows_per_group=1 if one else rel.max_rows_per_group,
            public_keys=MappingProxyType({n: rel.public_keys[n] for n, _ in selects if n in rel.public_keys}),
            columns=MappingProxyType(types), salt=rel.salt, version=rel.version, sql=sql)
        root = self.catalog.lookup(rel.table)
        path = UnitPath(root, (), UNIT_COLUMN, None)
        return _Instance(src.alias, entry, src.side, path=path,
                         derived_unit_columns=frozenset(unit_outputs | {UNIT_COLUMN}))

    def holds_unit(self, ac: tuple[str, str] | None) -> bool:
        """Is alias.column the unit value itself (e.g. c_custkey, o_custkey)?"""
        inst = next((i for i in self.instances if ac is not None and i.alias == ac[0]), None)
        return inst is not None and inst.protected and ac[1] in inst.unit_columns()

    def determines_unit(self, ac: tuple[str, str] | None) -> bool:
        """Does alias.column determine its row's unit: the unit value, the reference that carries
        the unit (l_orderkey), or a key that a unit-carrying reference points to (o_orderkey,
        unique by the check at registration)?"""
        if self.holds_unit(ac):
            return True
        inst = next((i for i in self.instances if ac is not None and i.alias == ac[0]), None)
        if inst is None or not inst.protected or inst.path is None or inst.outputs is not None:
            return False
        if inst.path.reference is not None and inst.path.reference[0] == ac[1]:
            return True
        return any(not e.public and (inst.entry.table, ac[1]) in e.references.values() for e in self.catalog.list())

    def _qualify_inner(self, node: exp.Expression, entry: TableEntry, inner_alias: str, alias: str) -> exp.Expression:
        def requalify(col: exp.Expression) -> exp.Expression:
            if not isinstance(col, exp.Column):
                return col
            if col.table and col.table not in (inner_alias, entry.name):
                raise _reject(f"the subquery {alias} refers to {col.table}.{col.name}, outside it")
            if col.name not in entry.columns:
                raise _reject(f"column {col.name!r} is not a registered column of {entry.table}")
            return exp.column(col.name, table=alias)
        return node.copy().transform(requalify)

    # -- columns ----------------------------------------------------------------------------------
    def _find(self, col: exp.Column, upto: int) -> _Instance:
        insts = self.instances[:upto]
        if col.table:
            hits = [i for i in insts if i.alias == col.table]
            if not hits:
                hits = [i for i in insts if i.outputs is None and i.entry.name == col.table and
                        sum(1 for j in insts if j.entry.name == col.table) == 1]
            if not hits:
                raise _reject(f"unknown table or alias {col.table!r} in {col.sql()}")
            inst = hits[0]
            if col.name not in inst.visible():
                raise _reject(f"column {col.name!r} is not a registered column of {inst.alias} ({inst.entry.table})")
            return inst
        hits = [i for i in insts if col.name in i.visible()]
        if not hits:
            raise _reject(f"column {col.name!r} is not a registered column of any table in the query")
        if len(hits) > 1:
            raise _reject(f"column {col.name!r} is ambiguous ({', '.join(i.alias for i in hits)}): qualify it")
        return hits[0]

    def _expand(self, col: exp.Column, upto: int) -> exp.Expression:
        """The column as an expression over base-table columns (qualified by instance alias)."""
        inst = self._find(col, upto)
        if inst.outputs is not None:
            return inst.outputs[col.name].copy()
        return exp.column(col.name, table=inst.alias)

    def _join_key(self, col: exp.Column, upto: int) -> tuple[_Instance, str]:
        e = self._expand(col, upto)
        if not isinstance(e, exp.Column):
            raise _reject(f"join key {col.sql()} must be a column (not an expression)")
        return next(i for i in self.instances if i.alias == e.table), e.name

    # -- the join graph -----------------------------------------------------------------------------
    def _check_join(self, n: int, src: Source) -> list[tuple[tuple[_Instance, str], tuple[_Instance, str]]]:
        new = self.instances[n]
        if src.using:
            pairs = []
            for name in src.using:
                left = [i for i in self.instances[:n] if name in i.visible()]
                if len(left) != 1 or name not in new.visible():
                    raise _reject(f"USING ({name}): the column must be in {new.alias} and in exactly one earlier table")
                pairs.append((self._join_key(exp.column(name, table=left[0].alias), n),
                              self._join_key(exp.column(name, table=new.alias), n + 1)))
        else:
            pairs = []
            for c in _conjuncts(src.on):
                pair = self._key_pair(c, n)
                if pair is not None:
                    pairs.append(pair)
                else:
                    self._on_condition(c, n)
            if not pairs:
                raise _reject(f"JOIN {new.alias} ON needs at least one equality of a column of {new.alias} with a "
                              "column of an earlier table; cross joins are not supported")
        earlier_protected = [i for i in self.instances[:n] if i.protected]
        if new.protected and earlier_protected:
            if not any(self._unit_edge(old, new, oc, nc) for (old, oc), (_, nc) in pairs):
                raise _reject(
                    f"{new.entry.table} is joined to a protected table without following the reference that "
                    f"carries the privacy unit: join protected tables only along declared references (e.g. "
                    f"child.fk = parent.key), so that a joined row never mixes the rows of two units")
        return pairs

    def _key_pair(self, c: exp.Expression, n: int):
        """((earlier instance, column), (joined instance, column)) if ``c`` is an equality of a
        column of the joined table (index n) with a column of an earlier one, else None."""
        if not (isinstance(c, exp.EQ) and isinstance(c.this, exp.Column) and isinstance(c.expression, exp.Column)):
            return None
        a, b = self._expand(c.this, n + 1), self._expand(c.expression, n + 1)
        if not (isinstance(a, exp.Column) and isinstance(b, exp.Column)):
            return None
        new = self.instances[n].alias
        if (a.table == new) == (b.table == new):
            return None
        by_alias = {i.alias: i for i in self.instances}
        ka, kb = (by_alias[a.table], a.name), (by_alias[b.table], b.name)
        return (kb, ka) if a.table == new else (ka, kb)

    def _on_condition(self, c: exp.Expression, n: int) -> None:
        """A condition of ON that is not a key equality. INNER JOIN: the same as in WHERE. LEFT
        JOIN: it may read only the joined table, and filters that table before the join (made
        total in _total_filters, like every row-level expression)."""
        new = self.instances[n]
        if any(isinstance(x, (exp.Select, exp.AggFunc)) for x in c.walk()):
            raise _reject(f"JOIN {new.alias} ON: subqueries and aggregates are not allowed in ON")
        qualified = c.copy().transform(lambda x: self._expand(x, n + 1) if isinstance(x, exp.Column) else x)
        if new.side != "left":
            self.extra_where.append(qualified)
            return
        if any(col.table != new.alias for col in qualified.find_all(exp.Column)):
            raise _reject(f"LEFT JOIN {new.alias} ON: a condition other than an equality of keys may read only "
                          f"{new.alias}'s columns (got {c.sql()[:80]}); put conditions on earlier tables in WHERE")
        new.filters.append(qualified.transform(lambda x: exp.column(x.name) if isinstance(x, exp.Column) else x))

    def _place_commas(self, tree: exp.Select) -> exp.Select:
        """``FROM a, b, c WHERE a.x = b.y AND …`` (or CROSS JOIN): each such table becomes an INNER
        JOIN on the column equalities of WHERE that connect it to the tables placed before it
        (taken in the order written; a table not yet connected waits for one that connects it).
        Those equalities leave WHERE. A table that nothing connects is a cross join: refused."""
        if not any(src.side == "comma" for src in self.spec.sources):
            return tree
        where = tree.args.get("where")
        conjs = _conjuncts(where.this) if where is not None else []
        edges: list[tuple[int, str, str]] = []
        for idx, c in enumerate(conjs):
            if isinstance(c, exp.EQ) and isinstance(c.this, exp.Column) and isinstance(c.expression, exp.Column):
                try:
                    a = self._expand(c.this, len(self.instances))
                    b = self._expand(c.expression, len(self.instances))
                except QueryRejected:
                    continue  # a select alias or an ambiguous name: stays in WHERE (bind judges it)
                if isinstance(a, exp.Column) and isinstance(b, exp.Column) and a.table != b.table:
                    edges.append((idx, a.table, b.table))
        placed: list[tuple[Source, _Instance]] = []
        pending: list[tuple[Source, _Instance]] = []
        used: set[int] = set()

        def place_pending() -> None:
            aliases = {inst.alias for _, inst in placed}
            for k, (src, inst) in enumerate(pending):
                mine = [i for i, a, b in edges if i not in used and
                        ((a == inst.alias and b in aliases) or (b == inst.alias and a in aliases))]
                if mine:
                    used.update(mine)
                    on = exp.and_(*(conjs[i].copy() for i in mine))
                    inst.side = "inner"
                    placed.append((Source(src.alias, src.table, src.subquery, "inner", on), inst))
                    del pending[k]
                    return place_pending()

        for src, inst in zip(self.spec.sources, self.instances):
            (pending if src.side == "comma" else placed).append((src, inst))
            place_pending()
        if pending:
            raise _reject(f"{pending[0][1].alias} is not connected to the other tables by an equality of columns in "
                          "WHERE (or ON): cross joins are not supported")
        self.spec = FromSpec(tuple(src for src, _ in placed), self.spec.semijoins)
        self.instances = [inst for _, inst in placed]
        tree = tree.copy()
        rest = [c for i, c in enumerate(conjs) if i not in used]
        tree.set("where", exp.Where(this=exp.and_(*rest)) if rest else None)
        return tree

    def _unit_edge(self, a: _Instance, b: _Instance, a_col: str, b_col: str) -> bool:
        if not (a.protected and b.protected):
            return False
        for x, y, xc, yc in ((a, b, a_col, b_col), (b, a, b_col, a_col)):
            if x.path is not None and x.path.reference == (xc, y.entry.table, yc):
                return True
        return a_col in a.unit_columns() and b_col in b.unit_columns()  # both sides hold the unit itself

    # -- main ---------------------------------------------------------------------------------------
    def resolve(self, tree: exp.Select) -> tuple[exp.Select, JoinedEntry]:
        for src in self.spec.sources:
            inst = self._instance(src)
            if any(i.alias == inst.alias for i in self.instances):
                raise _reject(f"the name {inst.alias!r} is used twice in FROM/JOIN: give each table its own alias")
            self.instances.append(inst)
        tree = self._place_commas(tree)
        protected = [i for i in self.instances if i.protected]
        if not protected:
            raise _reject("the query reads only public tables: there is nothing to protect, so DPCH does not "
                          "answer it (query the tables directly)")
        seen_tables = set()
        for i in protected:
            if i.entry.table in seen_tables:
                raise _reject(f"{i.entry.table} appears twice: self-joins of a protected table are not supported "
                              "(they can multiply one unit's rows)")
            seen_tables.add(i.entry.table)
            try:
                if i.path is None:  # (a per-unit subquery's is set already)
                    i.path = unit_path(i.entry, self.catalog.lookup)
            except CatalogError as exc:
                raise _reject(str(exc)) from None
            if i.path is None and len(self.instances) > 1:
                raise _reject(f"{i.entry.table} has no privacy unit (row level): it cannot be joined; register a "
                              "privacy_unit or a reference that leads to one")
        roots = {i.path.root.table for i in protected if i.path is not None}
        if len(roots) > 1:
            raise _reject(f"the protected tables belong to different privacy units ({', '.join(sorted(roots))}); "
                          "a query can combine only tables whose references lead to the same unit")
        join_pairs = [self._check_join(n, src) for n, src in enumerate(self.spec.sources) if n > 0]
        unit_inst = self._unit_source()
        self.unit_path = unit_inst.path
        self._total_filters()

        outer = tree.copy()
        self._rename_outer(outer)
        semis = self.semi_sql = [self._semijoin(s) for s in self.spec.semijoins]
        extra = [self._rename(e) for e in self.extra_where]
        if extra:
            where = outer.args.get("where")
            outer.set("where", exp.Where(this=exp.and_(*extra, *([where.this] if where is not None else []))))
        root = unit_inst.path.root if unit_inst.path is not None else unit_inst.entry
        self.names = self._final_names()
        relation, sources = self._relation_sql(join_pairs, unit_inst, semis)
        types = self._describe(relation)
        entry = self._entry_for(root, relation, sources, types, outer)
        return outer, entry

    def _total_filters(self) -> None:
        """Row-level expressions that run inside the relation get the totality stage's check and
        total forms too (dpch.totality), with the engine's types over their one table."""
        for inst in self.instances:
            if inst.filters:
                inst.filters = self._total(inst.entry, [(f"LEFT JOIN {inst.alias} ON", f) for f in inst.filters])

    def _total(self, entry: TableEntry, roots: list[tuple[str, exp.Expression]]) -> list[exp.Expression]:
        from .totality import make_total_expressions
        from .typecheck import expression_types

        return make_total_expressions(roots, entry, lambda sqls: expression_types(self.backend, entry, sqls))

    def _unit_source(self) -> _Instance:
        kept = [i for i in self.instances if i.protected and i.side in ("from", "inner")]
        if not kept:
            raise _reject("every protected table is on the right of a LEFT JOIN: the unit of a row that has no "
                          "match would be unknown; use INNER JOIN, or start FROM the protected table")
        direct = [i for i in kept if i.path is not None and not i.path.hops]
        return (direct or kept)[0]

    def _derived(self, alias: str, column: str) -> str:
        """Record that the query reads alias.column; its marker, replaced by the final name in _finish."""
        self.used.setdefault((alias, column), None)
        return f"\0{alias}\0{column}"

    def _rename(self, node: exp.Expression) -> exp.Expression:
        return node.copy().transform(
            lambda c: exp.column(self._derived(c.table, c.name)) if isinstance(c, exp.Column) and c.table else c)

    def _rename_outer(self, outer: exp.Select) -> None:
        aliases = {e.alias for e in outer.expressions if isinstance(e, exp.Alias)}
        n = len(self.instances)

        def fix(node: exp.Expression, own_alias: str | None) -> None:
            for col in list(node.find_all(exp.Column)):
                if not col.table and col.name in aliases and col.name != own_alias:
                    continue  # a select alias (bind resolves it); ClickHouse: an alias wins over a column
                col.replace(self._rename(self._expand(col, n)))  # base columns, qualified -> markers

        for e in outer.expressions:
            fix(e, e.alias if isinstance(e, exp.Alias) else None)
        for key in ("where", "group", "having", "order"):
            node = outer.args.get(key)
            if node is not None:
                fix(node, None)

    def _semijoin(self, s: SemiJoin) -> str:
        sub = s.subquery.copy()
        if any(isinstance(x, exp.Select) for x in sub.walk() if x is not sub):
            raise _reject("a subquery in IN (SELECT ...) or EXISTS cannot contain another subquery")
        if sub.args.get("with_") is not None:
            raise _reject("a subquery in IN (SELECT ...) or EXISTS cannot have its own WITH")
        inside: dict[str, TableEntry] = {}
        for t in sub.find_all(exp.Table):
            if not isinstance(t.this, exp.Identifier):
                raise _reject("table functions are not allowed in IN (SELECT ...) or EXISTS")
            inside[t.alias or t.name] = self._entry(t)
            if t.alias:
                inside.setdefault(t.name, inside[t.alias])
        column = s.column
        if column is None:
            column, sub = self._decorrelate(sub, inside)
        if all(e.public for e in inside.values()):
            return self._public_semijoin(column, sub, inside, s.negated)
        return self._protected_semijoin(column, sub, inside, s.negated)

    def _is_inner(self, col: exp.Column, inside: Mapping[str, TableEntry]) -> bool:
        if col.table:
            return col.table in inside
        return any(col.name in e.columns for e in inside.values())

    def _decorrelate(self, sub: exp.Select, inside: Mapping[str, TableEntry]) -> tuple[exp.Column, exp.Select]:
        """``EXISTS (SELECT … FROM t WHERE t.k = outer.c AND rest)`` → ``outer.c IN (SELECT t.k FROM
        t WHERE rest)``: the same rows, as a semi-join the rules below can check."""
        for key, value in sub.args.items():
            if value not in (None, False, []) and key not in ("expressions", "from_", "where"):
                raise _reject(f"EXISTS (SELECT ...) may have only FROM and WHERE ({key.upper()} is not supported)")
        where = sub.args.get("where")
        links, rest = [], []
        for c in _conjuncts(where.this if where is not None else None):
            outer = [x for x in c.find_all(exp.Column) if not self._is_inner(x, inside)]
            if not outer:
                rest.append(c)
                continue
            if not (isinstance(c, exp.EQ) and isinstance(c.this, exp.Column) and isinstance(c.expression, exp.Column)
                    and len(outer) == 1):
                raise _reject("EXISTS (SELECT ...) may refer to the outer query only in one equality of columns "
                              f"(inner.key = outer.column); got {c.sql()[:80]}")
            links.append((c.expression, c.this) if outer[0] is c.this else (c.this, c.expression))
        if len(links) != 1:
            raise _reject("EXISTS (SELECT ...) must be correlated with the outer query by exactly one equality of "
                          "columns (inner.key = outer.column)")
        inner_col, outer_col = links[0]
        sub.set("expressions", [inner_col.copy()])
        sub.set("where", exp.Where(this=exp.and_(*rest)) if rest else None)
        return outer_col, sub

    def _public_semijoin(self, column: exp.Column, sub: exp.Select, inside: Mapping[str, TableEntry],
                         negated: bool) -> str:
        """IN over public tables only: a filter that reads no protected row."""
        inst, col = self._join_key(column, len(self.instances))
        for t in sub.find_all(exp.Table):
            db, _ = inside[t.alias or t.name].table.split(".", 1)
            t.set("db", exp.to_identifier(db))
        for c in sub.find_all(exp.Column):
            if c.table and c.table not in inside:
                raise _reject("a subquery in IN (SELECT ...) cannot refer to the outer query (correlated subquery)")
            if not c.table and not any(c.name in e.columns for e in inside.values()) \
                    and c.name not in {x.alias for x in sub.expressions if isinstance(x, exp.Alias)}:
                raise _reject(f"column {c.name!r} in IN (SELECT ...) is not a column of its tables")
        self._derived(inst.alias, col)
        op = "NOT IN" if negated else "IN"
        return f"{quote_ident(inst.alias)}.{quote_ident(col)} {op} ({sub.sql('clickhouse')})"

    def _protected_semijoin(self, column: exp.Column, sub: exp.Select, inside: Mapping[str, TableEntry],
                            negated: bool) -> str:
        """``outer.c [NOT] IN (SELECT t.r FROM t [WHERE …] [GROUP BY t.r [HAVING …]])`` over ONE
        protected table t, where outer.c = t.r follows the reference that carries the unit (in
        either direction) or equates two unit columns. Then every row of t that can match an outer
        row belongs to that row's unit, and a group of t by r is rows of one unit, so the filter
        of a row depends only on its own unit's rows (docs/CONTROLLER.md, "Joins")."""
        for key, value in sub.args.items():
            if value not in (None, False, []) and key not in ("expressions", "from_", "where", "group", "having"):
                raise _reject(f"a subquery over a protected table in IN (SELECT ...) may have only FROM, WHERE, GROUP "
                              f"BY and HAVING ({key.upper()} is not supported)")
        tables = list(sub.find_all(exp.Table))
        if len(tables) != 1:
            raise _reject("a subquery over a protected table in IN (SELECT ...) or EXISTS must read one table (no joins)")
        t = tables[0]
        entry = inside[t.alias or t.name]
        names = {t.name, t.alias or t.name}
        try:
            path = unit_path(entry, self.catalog.lookup)
        except CatalogError as exc:
            raise _reject(str(exc)) from None
        if path is None or self.unit_path is None or path.root.table != self.unit_path.root.table:
            raise _reject(f"the subquery over {entry.table} in IN (SELECT ...) or EXISTS must read a table of the same "
                          "privacy unit as the outer query's protected tables")

        def own(node: exp.Expression) -> exp.Expression:
            def unqualify(c: exp.Expression) -> exp.Expression:
                if not isinstance(c, exp.Column):
                    return c
                if (c.table and c.table not in names) or c.name not in entry.columns:
                    raise _reject(f"{c.sql()[:60]} in the subquery over {entry.table} is not a registered column of "
                                  "it (a correlated subquery must be written as EXISTS with one key equality)")
                return exp.column(c.name)
            return node.copy().transform(unqualify)

        if len(sub.expressions) != 1 or not isinstance(sub.expressions[0].unalias(), exp.Column):
            raise _reject("a subquery over a protected table in IN (SELECT ...) must select one column")
        inner = own(sub.expressions[0].unalias()).name
        inst, col = self._join_key(column, len(self.instances))
        probe = _Instance(t.alias or t.name, entry, "semi", path)
        if not self._unit_edge(inst, probe, col, inner):
            raise _reject(f"{column.sql()} IN (SELECT {inner} FROM {entry.table} ...): over a protected table, the "
                          "columns must follow the declared reference that carries the privacy unit (e.g. "
                          "o_orderkey IN (SELECT l_orderkey FROM lineitem ...)), so that a row is filtered by its "
                          "own unit's rows only")
        group = sub.args.get("group")
        if group is not None and [own(g).sql() for g in group.expressions] != [exp.column(inner).sql()]:
            raise _reject(f"a subquery over a protected table in IN (SELECT ...) may GROUP BY only its selected "
                          f"column {inner} (one group = the rows of one key, hence of one unit)")
        if sub.args.get("having") is not None and group is None:
            raise _reject("HAVING needs GROUP BY in a subquery over a protected table")
        where = sub.args.get("where")
        roots = [("IN (SELECT ...) WHERE", own(where.this))] if where is not None else []
        having, agg_roots = self._having(sub.args.get("having"), own, entry)
        total = self._total(entry, roots + agg_roots)
        cond = [f"isNotNull({quote_ident(inner)})"]  # a NULL in the set must not change NOT IN for anyone
        if where is not None:
            cond.append(f"({total[0].sql('clickhouse')})")
        sql = f"SELECT {quote_ident(inner)} FROM {entry.table_sql} WHERE {' AND '.join(cond)}"
        if group is not None:
            sql += f" GROUP BY {quote_ident(inner)}"
        if having is not None:
            args = iter(total[len(roots):])
            for agg in having.find_all(exp.AggFunc):
                if not _no_argument(agg):
                    agg.set("this", next(args))
            sql += f" HAVING {having.sql('clickhouse')}"
        self._derived(inst.alias, col)
        op = "NOT IN" if negated else "IN"
        return f"{quote_ident(inst.alias)}.{quote_ident(col)} {op} ({sql})"

    _HAVING_NODES = (exp.And, exp.Or, exp.Not, exp.Paren, exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE,
                     exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Neg, exp.Literal, exp.Boolean)
    _HAVING_AGGS = (exp.Count, exp.Sum, exp.Avg, exp.Min, exp.Max)

    def _having(self, having: exp.Having | None, own, entry: TableEntry):
        """HAVING of a per-key subquery: comparisons and arithmetic of COUNT/SUM/AVG/MIN/MAX over
        row expressions and numbers. Returns (the condition, the aggregates' arguments to make
        total). Sums and averages run in Float64 (a Decimal sum can overflow, which throws)."""
        if having is None:
            return None, []
        cond = own(having.this)
        args = []
        for node in cond.walk():
            if isinstance(node, exp.AggFunc) and any(isinstance(p, exp.AggFunc) for p in _ancestors(node)):
                raise _reject("HAVING in a subquery over a protected table: nested aggregates are not supported")
            if isinstance(node, self._HAVING_AGGS):
                arg = node.this
                if isinstance(node, exp.Count) and isinstance(arg, exp.Distinct):
                    raise _reject("HAVING COUNT(DISTINCT ...) is not supported in a subquery over a protected table")
                if _no_argument(node):
                    continue
                if isinstance(node, (exp.Sum, exp.Avg)):
                    arg = exp.Anonymous(this="toFloat64", expressions=[arg.copy()])
                args.append(("HAVING", arg))
            elif isinstance(node, exp.Column):
                if not any(isinstance(p, self._HAVING_AGGS) for p in _ancestors(node)):
                    raise _reject("HAVING in a subquery over a protected table may read columns only inside "
                                  "COUNT/SUM/AVG/MIN/MAX")
            elif not isinstance(node, self._HAVING_NODES) and not any(
                    isinstance(p, self._HAVING_AGGS) for p in _ancestors(node)):
                raise _reject(f"HAVING in a subquery over a protected table: {node.sql()[:60]} is not supported "
                              "(comparisons and + - * / of COUNT/SUM/AVG/MIN/MAX and numbers)")
            elif isinstance(node, exp.Literal) and node.is_string:
                raise _reject("HAVING in a subquery over a protected table compares numbers only")
        return cond, args

    def _final_names(self) -> dict[tuple[str, str], str]:
        by_col: dict[str, int] = {}
        for _, c in self.used:
            by_col[c] = by_col.get(c, 0) + 1
        names, taken = {}, set()
        for (a, c) in self.used:
            name = c if by_col[c] == 1 else f"{a}_{c}"
            if name in taken or name == UNIT_COLUMN:
                raise _reject(f"cannot name column {a}.{c} apart in the joined relation: rename a table alias")
            taken.add(name)
            names[(a, c)] = name
        return names

    def _relation_sql(self, join_pairs, unit_inst: _Instance, semis: list[str]) -> tuple[str, dict]:
        names = self.names
        by_alias = {i.alias: i for i in self.instances}
        cols = [f"{quote_ident(a)}.{quote_ident(c)} AS {quote_ident(n)}" for (a, c), n in names.items()]
        sources = {n: (by_alias[a].entry.table, c) for (a, c), n in names.items()}
        first = self.instances[0]
        lines = [f"FROM {first.entry.table_sql} AS {quote_ident(first.alias)}"]
        for inst, pairs in zip(self.instances[1:], join_pairs):
            on = " AND ".join(f"{quote_ident(o.alias)}.{quote_ident(oc)} = {quote_ident(n.alias)}.{quote_ident(nc)}"
                              for (o, oc), (n, nc) in pairs)
            kind = "LEFT JOIN" if inst.side == "left" else "INNER JOIN"
            table = inst.entry.table_sql
            if inst.filters:
                table = f"(SELECT * FROM {table} WHERE {' AND '.join(f.sql('clickhouse') for f in inst.filters)})"
            lines.append(f"{kind} {table} AS {quote_ident(inst.alias)} ON {on}")
        path = unit_inst.path
        unit_sql = None
        matched: list[str] = []
        if path is not None:
            prev = quote_ident(unit_inst.alias)
            for h, hop in enumerate(path.hops):
                # LEFT ANY: at most one referenced row per row (a chain never multiplies rows, even
                # if a key stopped being unique); the marker drops rows whose reference dangles
                # (ClickHouse's INNER ANY would also keep only one row per key on the left).
                alias = f"__dp_h{h}"
                key, unit = quote_ident(hop.key), quote_ident(path.column if h == len(path.hops) - 1 else
                                                               path.hops[h + 1].column)
                lines.append(f"LEFT ANY JOIN (SELECT {key}, {unit}, toUInt8(1) AS __dp_m FROM {hop.table.table_sql}) "
                             f"AS {alias} ON {prev}.{quote_ident(hop.column)} = {alias}.{key}")
                matched.append(f"{alias}.__dp_m = 1")
                prev = alias
            unit_sql = f"{prev}.{quote_ident(path.column)}"
            cols.append(f"{unit_sql} AS {UNIT_COLUMN}")
        if semis or matched:
            lines.append("WHERE " + " AND ".join(matched + semis))
        return f"SELECT {', '.join(cols)}\n" + "\n".join(lines), sources

    def _describe(self, relation: str) -> dict[str, str]:
        try:
            df = self.backend.query_df(f"DESCRIBE TABLE (\n{relation}\n)")
        except Exception as exc:  # noqa: BLE001 - analysed only, reads no row
            from .execute import sanitize_error

            raise _reject(f"the joined tables do not fit together: {sanitize_error(str(exc))}; nothing ran and "
                          "nothing was charged") from None
        return {str(r.name): str(r.type) for r in df.itertuples(index=False)}

    def _entry_for(self, root: TableEntry, relation: str, sources: dict, types: dict, outer: exp.Select) -> JoinedEntry:
        by_alias = {i.alias: i for i in self.instances}
        bounds, public_keys = {}, {}
        aliased = {e.alias: e.this for e in outer.expressions if isinstance(e, exp.Alias)}
        keys = set()
        for g in outer.args["group"].expressions if outer.args.get("group") else []:
            if isinstance(g, exp.Column) and _marked(g.name) is None:
                g = aliased.get(g.name, g)  # GROUP BY <select alias>
            marked = _marked(g.name) if isinstance(g, exp.Column) else None
            if marked is not None:
                keys.add(self.names[marked])
        for (a, c), n in self.names.items():
            e = by_alias[a].entry
            if c in e.bounds:
                bounds[n] = e.bounds[c]
            if c in e.public_keys:
                public_keys[n] = e.public_keys[c]
            elif e.public and n in keys:
                vals = self._public_domain(e, c)
                if vals is not None:
                    public_keys[n] = vals
        protected = [i.entry for i in self.instances if i.protected]
        groups = max(e.max_groups_contributed for e in protected)
        rows = max(e.max_rows_per_unit for e in protected)
        per_group = [e.max_rows_per_group for e in protected]
        unit = UNIT_COLUMN if UNIT_COLUMN in types else None  # None: one row-level table, no join
        return JoinedEntry(
            table=root.table, privacy_unit=unit, neighbour=root.neighbour,
            bounds=MappingProxyType(bounds), max_groups_contributed=groups, max_rows_per_unit=rows,
            max_rows_per_group=None if any(c is None for c in per_group) else max(per_group),
            public_keys=MappingProxyType(public_keys), columns=MappingProxyType(types), salt=root.salt,
            version=root.version, relation_sql=relation, sources=MappingProxyType(sources),
            tables=tuple(dict.fromkeys(i.entry.table for i in self.instances)),
            unit_name=f"{root.table}.{root.privacy_unit}" if root.privacy_unit else "",
            unit_aliases=frozenset(n for (a, c), n in self.names.items()
                                   if by_alias[a].protected and by_alias[a].side in ("from", "inner")
                                   and c in by_alias[a].unit_columns()),
            layout=tuple(self._layout()))

    def _layout(self):
        for inst in self.instances:
            how = {"from": "FROM", "inner": "INNER JOIN", "left": "LEFT JOIN"}.get(inst.side, inst.side)
            head = f"{inst.alias}: {how} {inst.entry.table}"
            if inst.entry.public:
                yield f"{head}, public"
            elif isinstance(inst.entry, DerivedEntry):
                yield f"{head}: per-unit pre-aggregation, grouped by its keys and the unit"
            elif inst.path is None:
                yield f"{head}, row level"
            elif not inst.path.hops:
                yield f"{head}, unit column {inst.path.column}"
            else:
                chain = " → ".join(f"{h.column} = {h.table.table}.{h.key}" for h in inst.path.hops)
                yield f"{head}, unit through {chain} → {inst.path.column}"
            for f in inst.filters:
                yield f"  filtered before the join: {f.sql('clickhouse')[:100]}"
        for semi in self.semi_sql:
            yield f"semi-join: {semi[:160]}"

    def _public_domain(self, entry: TableEntry, column: str) -> tuple | None:
        """The distinct values of a public table's column (public data), or None if too many."""
        col = quote_ident(column)
        df = self.backend.query_df(f"SELECT DISTINCT {col} AS v FROM {entry.table_sql} ORDER BY v "
                                   f"LIMIT {PUBLIC_KEY_LIMIT + 1}")
        vals = [None if v != v else (v.item() if hasattr(v, "item") else v) for v in df["v"]]  # NaN/NA -> None
        return tuple(vals) if len(vals) <= PUBLIC_KEY_LIMIT else None


def _no_argument(agg: exp.Expression) -> bool:
    """COUNT(*) / count(): an aggregate with no row expression to make total."""
    return agg.this is None or isinstance(agg.this, exp.Star)


def _ancestors(node: exp.Expression):
    p = node.parent
    while p is not None:
        yield p
        p = p.parent


def _marked(name: str) -> tuple[str, str] | None:
    """(alias, column) of a column marker made by _Resolver._derived, or None."""
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


def resolve(spec: FromSpec, tree: exp.Select, catalog, backend) -> tuple[exp.Select, JoinedEntry]:
    """The single-relation form of a query: (tree over ``__dp_rel`` with derived column names,
    the relation's entry). Raises QueryRejected; reads only public tables and the schema."""
    r = _Resolver(spec, catalog, backend)
    outer, entry = r.resolve(tree)
    return _finish(outer, r.names), entry


def needs_unit_chain(entry: TableEntry, catalog) -> bool:
    """True when a single-table query on ``entry`` must go through the relation (its unit is
    reached through references, or belongs to another table's dataset)."""
    if entry.public:
        return True  # resolve refuses it with the public-only message
    if not entry.references:
        return False
    try:
        path = unit_path(entry, catalog.lookup)
    except CatalogError as exc:
        raise _reject(str(exc)) from None
    return path is not None and (bool(path.hops) or path.root.table != entry.table)


