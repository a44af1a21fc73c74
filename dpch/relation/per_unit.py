"""Per-unit pre-aggregation: a subquery in FROM (or a CTE) with GROUP BY over a column that
determines the privacy unit, run grouped by (its keys, the unit) so that each of its rows is ONE
unit's, and then read by the outer query as a table whose rows carry the unit."""
from __future__ import annotations

from types import MappingProxyType

from sqlglot import exp

from ..catalog import quote_ident
from ..units import UnitPath
from .model import UNIT_COLUMN, DerivedEntry, _finish, _Instance
from .semijoins import _HAVING_AGGS, _aggregate_argument, _float_decimal_extremes, _having, _no_argument, _put_total_arguments
from .syntax import Source, _reject, split_from, unsupported_clause


class _PerUnitSubqueries:
    """The per-unit subquery part of _Resolver (a mixin: it resolves the subquery's FROM with a
    resolver of its own and uses the resolver's catalog, instances, _total and _describe)."""

    def _per_unit_instance(self, src: Source) -> _Instance:
        """``(SELECT k, agg(x) AS a FROM … GROUP BY k) AS t`` where k determines the privacy unit
        (the unit column, the reference that carries it, or a key that such a reference points
        to): per-unit pre-aggregation. Its FROM is resolved as a relation of its own, and it is
        grouped by (k, unit), so each of its rows is computed from ONE unit's rows; the outer query
        then bounds those rows per unit as usual (docs/CONTROLLER.md, "Joins")."""
        sub = src.subquery
        assert sub is not None
        key = unsupported_clause(sub, ("expressions", "from_", "where", "group", "having", "joins"))
        if key is not None:
            raise _reject(f"the aggregate subquery {src.alias}: {key.upper()} is not supported there")
        spec, flat = split_from(sub)
        inner = type(self)(spec, self.catalog, self.services)  # a _Resolver
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
            elif isinstance(node, _HAVING_AGGS) and (_no_argument(node) or not any(
                    isinstance(x, (exp.AggFunc, exp.Select)) for x in node.this.walk())):
                if isinstance(node.this, exp.Distinct):
                    raise _reject(f"the aggregate subquery {src.alias}: COUNT(DISTINCT ...) is not supported there")
                if not _no_argument(node):
                    roots.append((f"{src.alias}.{name}", _aggregate_argument(node)))
            else:
                raise _reject(f"the aggregate subquery {src.alias}: each column must be a GROUP BY column or "
                              f"COUNT/SUM/AVG/MIN/MAX of a row expression (got {node.sql()[:60]})")
            selects.append((name, node))
        where = flat.args.get("where")
        where_roots = [(f"{src.alias} WHERE", where.this)] if where is not None else []
        aggs = {name: node for name, node in selects if isinstance(node, exp.AggFunc)}
        having, having_roots = _having(flat.args.get("having"), lambda n: n.copy().transform(
            lambda c: aggs[c.name].copy() if isinstance(c, exp.Column) and not c.table and c.name in aggs else c))
        total = iter(self._total(rel, where_roots + roots + having_roots))
        where_sql = f"\nWHERE {next(total).sql('clickhouse')}" if where is not None else ""
        cols = []
        for name, node in selects:
            node = node.copy()
            _put_total_arguments(node, total)
            cols.append(f"{node.sql('clickhouse')} AS {quote_ident(name)}")
        if having is not None:
            _put_total_arguments(having, total)
            _float_decimal_extremes(having, lambda sqls: self._types(rel, sqls))
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
        """Is alias.column the unit value itself (e.g. c_custkey, o_custkey) on every row? Not on
        the right of a LEFT JOIN: there a miss is NULL (the unit is the agreed __dp_unit)."""
        inst = next((i for i in self.instances if ac is not None and i.alias == ac[0]), None)
        return inst is not None and inst.protected and inst.side in ("from", "inner") and ac[1] in inst.unit_columns()

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
