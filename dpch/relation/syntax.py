"""The parse-time, syntactic part of join resolution: ``split_from`` takes the FROM clause, its
joins, CTEs and ``IN (SELECT …)`` / ``EXISTS`` conjuncts out of a query (what they were, as a
FromSpec) and leaves the query reading the placeholder relation ``__dp_rel``. Nothing here reads
the catalog."""
from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from ..errors import QueryRejected

RELATION_PLACEHOLDER = "__dp_rel"
MAX_JOINED_TABLES = 16


def _reject(msg: str) -> QueryRejected:
    return QueryRejected(msg)


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


def unsupported_clause(node: exp.Expression, allowed: tuple[str, ...]) -> str | None:
    """The first clause (sqlglot arg name) that ``node`` sets outside ``allowed``, or None."""
    return next((key for key, value in node.args.items()
                 if value not in (None, False, []) and key not in allowed), None)


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
            key = unsupported_clause(node, ("this", "db", "alias"))
            if key is not None:
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
