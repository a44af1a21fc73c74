"""The catalog-aware part of join resolution: ``resolve`` turns a FromSpec into ONE relation (its
SQL) and a JoinedEntry that describes it like a catalogued table. ``_Resolver`` resolves the
tables and columns, places comma joins, checks the join graph and ON conditions, makes the
relation's row expressions total, and builds the relation's SQL, entry and layout; the
semi-joins and per-unit subqueries are its mixins (dpch.relation.semijoins, .per_unit)."""
from __future__ import annotations

from types import MappingProxyType

from sqlglot import exp

from ..catalog import MAX_PUBLIC_KEYS, TableEntry, quote_ident
from ..engine import sanitize_error
from ..errors import CatalogError, QueryRejected
from ..units import unit_path
from .chains import Chain, unit_chain
from .keys import check_key_types
from .model import UNIT_COLUMN, DerivedEntry, JoinedEntry, _finish, _Instance, _marked, _marker
from .per_unit import _PerUnitSubqueries
from .semijoins import _SemiJoins
from .services import RelationServices
from .syntax import FromSpec, Source, _conjuncts, _reject, unsupported_clause

PUBLIC_KEY_LIMIT = min(MAX_PUBLIC_KEYS, 10_000)


class _Resolver(_SemiJoins, _PerUnitSubqueries):
    """Resolves one FromSpec against the catalog: its instances, join graph, semi-joins and
    per-unit subqueries, then the relation's SQL and entry (resolve() puts them together)."""

    def __init__(self, spec: FromSpec, catalog, services: RelationServices):
        self.spec, self.catalog, self.services = spec, catalog, services
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
        key = unsupported_clause(sub, ("expressions", "from_", "where"))
        if key is not None:
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
        for (o, oc), (i, ic) in pairs:
            check_key_types(f"JOIN {new.alias} ON", (f"{o.alias}.{oc}", o.entry.columns.get(oc)),
                            (f"{i.alias}.{ic}", i.entry.columns.get(ic)))
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
        unit_inst = self.unit_inst = self._unit_source()
        self.unit_path = unit_inst.path
        self.chains = self._chains(unit_inst)
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
        return self.services.total_expressions(roots, entry)

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
        return _marker(alias, column)

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

    # -- the relation: names, SQL, entry, layout ----------------------------------------------------
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

    def _chains(self, unit_inst: _Instance) -> dict[str, Chain]:
        """Every protected instance's own chain to its unit (dpch.relation.chains); the unit
        source's hops keep the aliases ``__dp_h<h>``, another instance's are ``__dp_h<n>_<h>``."""
        out = {}
        for n, inst in enumerate(self.instances):
            if inst.protected and inst.path is not None:
                prefix = "__dp_h" if inst is unit_inst else f"__dp_h{n}_"
                out[inst.alias] = unit_chain(inst.path, quote_ident(inst.alias), prefix, inst.entry)
        return out

    def _agreement(self, join_pairs) -> list[str]:
        """The unit-agreement rule (DESIGN.md invariant 9): a joined tuple is kept only if every
        protected instance present in it carries the agreed unit (the unit source's), which is not
        NULL. An INNER instance must agree; a LEFT instance is absent (its key is NULL: the relation
        runs with join_use_nulls = 1) or agrees. A wrong join, a duplicated key or a LEFT JOIN miss
        can then only drop tuples, never give one unit's rows to another."""
        agreed = self.chains[self.unit_inst.alias]
        conds = list(agreed.matched)
        others = [i for i in self.instances if i.alias in self.chains and i is not self.unit_inst]
        if not others:
            return conds
        conds.append(f"isNotNull({agreed.unit})")
        pairs = dict(zip((i.alias for i in self.instances[1:]), join_pairs))
        for inst in others:
            chain = self.chains[inst.alias]
            agree = " AND ".join(chain.matched + (f"{chain.unit} = {agreed.unit}",))
            if inst.side == "left":
                (_, key) = pairs[inst.alias][0][1]
                conds.append(f"(isNull({quote_ident(inst.alias)}.{quote_ident(key)}) OR ifNull({agree}, 0))")
            else:
                conds.append(f"ifNull({agree}, 0)")
        return conds

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
        for chain in self.chains.values():
            lines.extend(chain.joins)
        left = any(i.side == "left" for i in self.instances)
        if unit_inst.alias in self.chains:
            unit_sql = self.chains[unit_inst.alias].unit
            root = unit_inst.path.root
            if left and unit_inst.path.hops and not root.columns.get(unit_inst.path.column, "").startswith("Nullable"):
                # join_use_nulls makes the chain's column Nullable; the matched rows kept are not NULL
                unit_sql = f"assumeNotNull({unit_sql})"
            cols.append(f"{unit_sql} AS {UNIT_COLUMN}")
        where = (self._agreement(join_pairs) if unit_inst.alias in self.chains else []) + semis
        if where:
            lines.append("WHERE " + " AND ".join(where))
        if left:
            # a LEFT JOIN miss is NULL, not the type's default (0, ''), on every path: in later
            # joins, semi-joins, per-unit keys and the unit-agreement rule
            lines.append("SETTINGS join_use_nulls = 1")
        return f"SELECT {', '.join(cols)}\n" + "\n".join(lines), sources

    def _describe(self, relation: str) -> dict[str, str]:
        try:
            df = self.services.query_df(f"DESCRIBE TABLE (\n{relation}\n)")
        except Exception as exc:  # noqa: BLE001 - analysed only, reads no row
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
        df = self.services.query_df(f"SELECT DISTINCT {col} AS v FROM {entry.table_sql} ORDER BY v "
                                   f"LIMIT {PUBLIC_KEY_LIMIT + 1}")
        vals = [None if v != v else (v.item() if hasattr(v, "item") else v) for v in df["v"]]  # NaN/NA -> None
        return tuple(vals) if len(vals) <= PUBLIC_KEY_LIMIT else None


def resolve(spec: FromSpec, tree: exp.Select, catalog,
            services: RelationServices) -> tuple[exp.Select, JoinedEntry]:
    """The single-relation form of a query: (tree over ``__dp_rel`` with derived column names,
    the relation's entry). Raises QueryRejected; reads only public tables and the schema."""
    r = _Resolver(spec, catalog, services)
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
