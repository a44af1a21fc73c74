"""Semi-joins: the WHERE conjuncts ``col [NOT] IN (SELECT …)`` and ``[NOT] EXISTS (SELECT …)``
that split_from took out, each turned into a filter of the relation (SQL over base-table
columns). Over public tables any such filter is accepted; over one protected table only along the
unit-carrying reference, so that a row is filtered by its own unit's rows. Also the HAVING rules of
per-key subqueries, shared with the per-unit aggregate subqueries (dpch.relation.per_unit)."""
from __future__ import annotations

from typing import Mapping

from sqlglot import exp

from ..catalog import TableEntry, base_type, quote_ident
from ..errors import CatalogError
from ..units import unit_path
from .chains import unit_chain
from .keys import check_key_types
from .model import _Instance
from .syntax import SemiJoin, _conjuncts, _reject, unsupported_clause


class _SemiJoins:
    """The semi-join part of _Resolver (a mixin: it uses the resolver's instances, unit path,
    _entry, _join_key, _unit_edge, _derived and _total)."""

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

    def _types(self, entry: TableEntry, sqls: list[str]) -> list[str]:
        return self.services.expression_types(entry, sqls)

    def _is_inner(self, col: exp.Column, inside: Mapping[str, TableEntry]) -> bool:
        if col.table:
            return col.table in inside
        return any(col.name in e.columns for e in inside.values())

    def _decorrelate(self, sub: exp.Select, inside: Mapping[str, TableEntry]) -> tuple[exp.Column, exp.Select]:
        """``EXISTS (SELECT … FROM t WHERE t.k = outer.c AND rest)`` → ``outer.c IN (SELECT t.k FROM
        t WHERE rest)``: the same rows, as a semi-join the rules below can check."""
        key = unsupported_clause(sub, ("expressions", "from_", "where"))
        if key is not None:
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
        """IN over public tables only: a filter that reads no protected row. One table: a join or
        cross product of public tables has no size bound (13 copies of a small table kept the
        engine busy for minutes), and its cost would be charged without an answer."""
        if len(list(sub.find_all(exp.Table))) != 1:
            raise _reject("a subquery over public tables in IN (SELECT ...) must read one table (no joins or "
                          "cross products: their size has no bound); nothing ran and nothing was charged")
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
        sub_sql = sub.sql('clickhouse')
        if len(sub.expressions) != 1:
            raise _reject("a subquery in x IN (SELECT ...) must select one column")
        types = self._describe(sub_sql)
        check_key_types(f"{column.sql()} IN (SELECT ...)", (column.sql(), inst.entry.columns.get(col)),
                        ("the subquery's column", next(iter(types.values()), None)))
        self._derived(inst.alias, col)
        op = "NOT IN" if negated else "IN"
        return f"{quote_ident(inst.alias)}.{quote_ident(col)} {op} ({sub_sql})"

    def _protected_semijoin(self, column: exp.Column, sub: exp.Select, inside: Mapping[str, TableEntry],
                            negated: bool) -> str:
        """``outer.c [NOT] IN (SELECT t.r FROM t [WHERE …] [GROUP BY t.r [HAVING …]])`` over ONE
        protected table t, where outer.c = t.r follows the reference that carries the unit (in
        either direction) or equates two unit columns. Then every row of t that can match an outer
        row belongs to that row's unit, and a group of t by r is rows of one unit, so the filter
        of a row depends only on its own unit's rows (docs/CONTROLLER.md, "Joins")."""
        key = unsupported_clause(sub, ("expressions", "from_", "where", "group", "having"))
        if key is not None:
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
        having, agg_roots = _having(sub.args.get("having"), own)
        total = self._total(entry, roots + agg_roots)
        inst_type = inst.entry.columns.get(col)
        check_key_types(f"{column.sql()} IN (SELECT {inner} FROM {entry.table} ...)",
                        (column.sql(), inst_type), (f"{entry.table}.{inner}", entry.columns.get(inner)))
        cond = [f"isNotNull({quote_ident(inner)})"]  # a NULL in the set must not change NOT IN for anyone
        if where is not None:
            cond.append(f"({total[0].sql('clickhouse')})")
        if having is not None:
            _put_total_arguments(having, iter(total[len(roots):]))
            _float_decimal_extremes(having, lambda sqls: self._types(entry, sqls))
        self._derived(inst.alias, col)
        outer = f"{quote_ident(inst.alias)}.{quote_ident(col)}"
        k = quote_ident(inner)

        def keys(*select: str) -> str:
            sql = f"SELECT {', '.join(select)} FROM {entry.table_sql} WHERE {' AND '.join(cond)}"
            if group is not None:
                sql += f" GROUP BY {', '.join(select)}"
            return sql + (f" HAVING {having.sql('clickhouse')}" if having is not None else "")

        if not path.hops and inner == path.column and col in inst.unit_columns():
            # both sides hold the unit: a key in the set is its own unit (no pairing needed)
            pair, sql = outer, keys(k)
        else:
            # (key, unit) pairs: a row is filtered by its own unit's rows only, whatever the keys
            # (DESIGN.md invariant 9)
            pair = f"({outer}, {self.chains[self.unit_inst.alias].unit})"
            if not path.hops:
                sql = keys(k, quote_ident(path.column))
            elif path.hops[0].column == inner:
                # the unit of a row is a function of its first reference column
                # (dpch.relation.chains): build the set of keys, then run the chain on the keys
                chain = unit_chain(path, "__dp_s", "__dp_sh", entry)
                body = keys(k) if group is not None else keys(k).replace("SELECT ", "SELECT DISTINCT ", 1)
                sql = (f"SELECT __dp_s.{k}, {chain.unit} FROM ({body}) AS __dp_s " + " ".join(chain.joins)
                       + " WHERE " + " AND ".join(chain.matched))
            else:
                raise _reject(f"IN (SELECT {inner} FROM {entry.table} ...): over a table whose unit is reached through "
                              f"references, the selected column must be the reference that carries the unit "
                              f"({path.hops[0].column})")
        if inst.side != "left" and pair == outer:
            return f"{outer} {'NOT IN' if negated else 'IN'} ({sql})"
        # a NULL key (a LEFT JOIN miss) is in no set, explicitly (NULL NOT IN … is NULL in SQL)
        if negated:
            return f"(isNull({outer}) OR {pair} NOT IN ({sql}))"
        return f"(isNotNull({outer}) AND {pair} IN ({sql}))"


_HAVING_NODES = (exp.And, exp.Or, exp.Not, exp.Paren, exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE,
                 exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Neg, exp.Literal, exp.Boolean)
_HAVING_AGGS = (exp.Count, exp.Sum, exp.Avg, exp.Min, exp.Max)


def _having(having: exp.Having | None, own):
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
        if isinstance(node, _HAVING_AGGS):
            arg = node.this
            if isinstance(node, exp.Count) and isinstance(arg, exp.Distinct):
                raise _reject("HAVING COUNT(DISTINCT ...) is not supported in a subquery over a protected table")
            if not _no_argument(node):
                args.append(("HAVING", _aggregate_argument(node)))
        elif isinstance(node, exp.Column):
            if not any(isinstance(p, _HAVING_AGGS) for p in _ancestors(node)):
                raise _reject("HAVING in a subquery over a protected table may read columns only inside "
                              "COUNT/SUM/AVG/MIN/MAX")
        elif not isinstance(node, _HAVING_NODES) and not any(
                isinstance(p, _HAVING_AGGS) for p in _ancestors(node)):
            raise _reject(f"HAVING in a subquery over a protected table: {node.sql()[:60]} is not supported "
                          "(comparisons and + - * / of COUNT/SUM/AVG/MIN/MAX and numbers)")
        elif isinstance(node, exp.Literal) and node.is_string:
            raise _reject("HAVING in a subquery over a protected table compares numbers only")
    return cond, args


def _aggregate_argument(agg: exp.Expression) -> exp.Expression:
    """The row expression of an aggregate, as it must be made total: SUM/AVG run in Float64 (a
    Decimal sum can overflow, which throws)."""
    if isinstance(agg, (exp.Sum, exp.Avg)):
        return exp.Anonymous(this="toFloat64", expressions=[agg.this.copy()])
    return agg.this


def _float_decimal_extremes(having: exp.Expression, types) -> None:
    """In HAVING, MIN/MAX of a Decimal runs in Float64: ``MIN(price) / (COUNT(*) - 6)`` would
    throw ILLEGAL_DIVISION (Decimal division by zero) for exactly the groups where the divisor is
    0, an error that depends on one unit's rows. ``types(sqls)`` gives the engine's types of the
    (total) arguments; Decimal → Float64 never throws. The subquery's output columns keep their
    types: only the HAVING condition changes."""
    extremes = [a for a in having.find_all(exp.Min, exp.Max) if not _no_argument(a)]
    if not extremes:
        return
    for agg, typ in zip(extremes, types([a.this.sql("clickhouse") for a in extremes])):
        if base_type(typ).startswith("Decimal"):
            agg.set("this", exp.Anonymous(this="toFloat64", expressions=[agg.this]))


def _put_total_arguments(node: exp.Expression, total) -> None:
    """Give every aggregate in ``node`` (those with an argument, in walk order) the next total
    form from the iterator ``total``: the order in which _aggregate_argument's roots were made."""
    for agg in list(node.find_all(exp.AggFunc)):
        if not _no_argument(agg):
            agg.set("this", next(total))


def _no_argument(agg: exp.Expression) -> bool:
    """COUNT(*) / count(): an aggregate with no row expression to make total."""
    return agg.this is None or isinstance(agg.this, exp.Star)


def _ancestors(node: exp.Expression):
    p = node.parent
    while p is not None:
        yield p
        p = p.parent
