"""Stage 1 of the controller: parse analyst SQL (sqlglot, ClickHouse dialect) and check its shape.

``parse(sql) -> ParsedQuery``. Accepted: one ``SELECT`` with ``FROM`` one plain table (optionally
aliased), or joins, CTEs, subqueries in FROM and ``IN (SELECT …)`` filters (taken out here and
resolved against the catalog by ``dpch.relation``), ``WHERE``, ``GROUP BY``, ``HAVING``,
``ORDER BY``, ``LIMIT``/``OFFSET``. Everything else is rejected here with a ``QueryRejected`` that
names the construct and, where there is one, the fix: multiple statements, non-SELECT statements,
UNION/INTERSECT/EXCEPT, subqueries elsewhere, ARRAY JOIN, window functions, SETTINGS/FORMAT/INTO OUTFILE, PREWHERE, SAMPLE, FINAL, DISTINCT,
LIMIT BY, WITH TIES, WITH TOTALS/ROLLUP/CUBE/GROUPING SETS, WITH FILL, QUALIFY, lambdas, query
parameters, table functions and system tables. What the expressions may contain (columns,
functions, aggregates) is checked by ``dpch.bind``.
"""
from __future__ import annotations

from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from .errors import QueryRejected
from .function_rules import check_functions
from .relation.syntax import FromSpec, needs_relation, split_from
from .sql_ast import DIALECT, sql_of

MAX_QUERY_LENGTH = 100_000

# Select arguments we understand; anything else set on the Select node is rejected.
_ALLOWED_SELECT_ARGS = {"expressions", "from_", "where", "group", "having", "order", "limit", "offset", "kind"}
_SELECT_ARG_MESSAGES = {
    "with_": "a CTE (WITH ... AS) is not supported; inline the expression instead",
    "joins": "JOIN is not supported: a query reads exactly one catalogued table",
    "settings": "a SETTINGS clause is not allowed: DPCH chooses the engine settings",
    "format": "a FORMAT clause is not allowed: results are returned as a DataFrame",
    "prewhere": "PREWHERE is not supported; use WHERE",
    "distinct": "SELECT DISTINCT is not supported; use GROUP BY with the columns (released by partition "
                "selection or public keys)",
    "qualify": "QUALIFY is not supported (window functions are not supported)",
    "windows": "a WINDOW clause is not supported (window functions are not supported)",
    "into": "SELECT ... INTO is not supported",
    "laterals": "LATERAL is not supported",
    "match": "MATCH_RECOGNIZE is not supported",
    "connect": "CONNECT BY is not supported",
    "sample": "SAMPLE is not supported",
    "locks": "locking clauses are not supported",
    "hint": "query hints are not supported",
    "cluster": "CLUSTER BY is not supported",
    "distribute": "DISTRIBUTE BY is not supported",
    "sort": "SORT BY is not supported; use ORDER BY",
    "operation_modifiers": "query modifiers are not supported",
}


@dataclass(frozen=True)
class ParsedQuery:
    """A syntactically acceptable SELECT over one table, or (``sources`` set) over the placeholder
    relation ``__dp_rel`` that dpch.relation builds from its joins, CTEs and subqueries."""

    sql: str
    select: exp.Select
    database: str | None  # as written (None: the connection's default database)
    table: str
    alias: str | None
    sources: FromSpec | None = None

    @property
    def table_ref(self) -> str:
        return f"{self.database}.{self.table}" if self.database else self.table


def _reject(msg: str) -> QueryRejected:
    return QueryRejected(msg)


_MAX_EXTRA_TOKENS = 8  # how far a span may grow past its positioned tokens (closing parens, strings, ...)


def as_typed(node: exp.Expression, sql: str | None) -> str:
    """``node`` as the analyst typed it, for messages (issue 31): its span in ``sql``, else its
    ClickHouse-dialect rendering. sqlglot records positions on identifiers, numbers and function
    names only, so the span of those tokens is grown token by token until it parses back to the
    same expression; a text that does not is never quoted. Only query text is quoted, never data."""
    rendered = sql_of(node)
    spans = [(n.meta["start"], n.meta["end"]) for n in node.walk() if "start" in n.meta and "end" in n.meta]
    if not sql or not spans:
        return rendered
    start, end = min(a for a, _ in spans), max(b for _, b in spans)
    try:
        tokens = sqlglot.Dialect.get_or_raise(DIALECT).tokenize(sql)
        first = next(i for i, t in enumerate(tokens) if t.start <= start <= t.end)
        last = next(i for i, t in enumerate(tokens) if t.start <= end <= t.end)
    except Exception:  # the text is not the one the tree came from: render instead
        return rendered
    for extra in range(_MAX_EXTRA_TOKENS + 1):
        for left in range(extra + 1):
            i, j = first - left, last + extra - left
            if i < 0 or j >= len(tokens):
                continue
            text = sql[tokens[i].start: tokens[j].end + 1]
            if _balanced(tokens[i: j + 1]) and _renders_as(text, rendered):
                return text
    return rendered


def _balanced(tokens) -> bool:
    """Brackets balanced (sqlglot's parser forgives a missing closing one)."""
    depth = 0
    for t in tokens:
        depth += {"L_PAREN": 1, "L_BRACKET": 1, "R_PAREN": -1, "R_BRACKET": -1}.get(t.token_type.name, 0)
        if depth < 0:
            return False
    return depth == 0


def _renders_as(text: str, rendered: str) -> bool:
    try:
        return sql_of(sqlglot.parse_one(text, read=DIALECT)) == rendered
    except Exception:  # not an expression on its own
        return False


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0][:200] if text.strip() else "syntax error"


def parse(sql: str, tree: exp.Expression | None = None) -> ParsedQuery:
    """Parse and shape-check ``sql``. Raises QueryRejected (nothing runs, nothing is charged).

    ``tree``: the statement already parsed from ``sql`` by the caller (the gateway parses once to
    route); it gets exactly the same shape checks, only sqlglot's parse is skipped. The caller must
    not use the tree afterwards (later stages may annotate it)."""
    if not isinstance(sql, str) or not sql.strip():
        raise _reject("empty query: write one SELECT statement")
    if len(sql) > MAX_QUERY_LENGTH:
        raise _reject(f"query is longer than {MAX_QUERY_LENGTH} characters")
    upper = sql.upper()
    if "INTO OUTFILE" in upper:
        raise _reject("INTO OUTFILE is not allowed: results are returned as a DataFrame")
    if tree is not None:
        _check_statement(tree)
        return _checked(sql, tree)
    try:
        statements = [s for s in sqlglot.parse(sql, read=DIALECT) if s is not None]
    except (ParseError, TokenError) as exc:
        raise _reject(f"could not parse the query as ClickHouse SQL: {_first_line(str(exc))}") from None
    except Exception as exc:  # sqlglot raises a few other types on odd input
        raise _reject(f"could not parse the query as ClickHouse SQL ({type(exc).__name__})") from None
    if len(statements) != 1:
        raise _reject(f"multiple statements ({len(statements)}) are not allowed: send one SELECT per query"
                      if statements else "empty query: write one SELECT statement")
    tree = statements[0]
    _check_statement(tree)
    return _checked(sql, tree)


def _checked(sql: str, tree: exp.Expression) -> ParsedQuery:
    """The shape checks (their messages name the construct), then one function rule set over the
    WHOLE statement, every subquery included (DESIGN.md invariant 10; split_from leaves ``tree``
    as it was)."""
    parsed = _shaped(sql, _split(tree))
    check_functions(tree)
    return parsed


def _split(tree: exp.Expression) -> tuple[exp.Expression, FromSpec | None]:
    """Joins, CTEs, subqueries in FROM and IN (SELECT ...) filters are taken out (dpch.relation
    resolves them against the catalog); the rest of the query then gets the one-table checks."""
    if not isinstance(tree, exp.Select) or not needs_relation(tree):
        return tree, None
    spec, flat = split_from(tree)
    for src in spec.sources:
        if src.subquery is not None:  # (an aggregate subquery may join tables of its own)
            _check_nodes(split_from(src.subquery)[1] if needs_relation(src.subquery) else src.subquery)
    return flat, spec


def _shaped(sql: str, split: tuple[exp.Expression, FromSpec | None]) -> ParsedQuery:
    tree, spec = split
    assert isinstance(tree, exp.Select)
    database, table, alias = _check_from(tree)
    _check_clauses(tree)
    _check_nodes(tree)
    return ParsedQuery(sql=sql, select=tree, database=database, table=table, alias=alias, sources=spec)


def _check_statement(tree: exp.Expression) -> None:
    if isinstance(tree, exp.Union):
        raise _reject("UNION is not supported: send one SELECT per query")
    if isinstance(tree, exp.Intersect):
        raise _reject("INTERSECT is not supported")
    if isinstance(tree, exp.Except):
        raise _reject("EXCEPT is not supported")
    if isinstance(tree, exp.Subquery) or isinstance(tree, exp.Paren):
        raise _reject("a parenthesised (sub)query is not supported: write a plain SELECT")
    if not isinstance(tree, exp.Select):
        kind = type(tree).__name__.upper()
        if isinstance(tree, exp.Command):
            kind = str(tree.this).upper()
        raise _reject(f"only SELECT statements are allowed (got {kind})")


def _check_from(tree: exp.Select) -> tuple[str | None, str, str | None]:
    from_ = tree.args.get("from_")
    if from_ is None:
        raise _reject("the query has no FROM clause: DP aggregates read one catalogued table")
    source = from_.this
    if isinstance(source, exp.Final):
        raise _reject("FINAL is not supported")
    if isinstance(source, (exp.Subquery, exp.Select, exp.Union)):
        raise _reject("a subquery in FROM is not supported: query the catalogued table directly")
    if isinstance(source, exp.Table) and isinstance(source.this, exp.Func):
        source = source.this
    if not isinstance(source, exp.Table):
        name = source.name if isinstance(source, exp.Anonymous) else (
            source.sql_name() if isinstance(source, exp.Func) else type(source).__name__)
        raise _reject(f"table function {name}(...) is not allowed: query a catalogued table")
    for key, value in source.args.items():
        if value in (None, False, []) or key in ("this", "db", "alias"):
            continue
        if key == "sample":
            raise _reject("SAMPLE is not supported")
        if key == "catalog":
            raise _reject("three-part table names are not supported: use database.table")
        if key == "final":
            raise _reject("FINAL is not supported")
        raise _reject(f"this table modifier ({key}) is not supported")
    if not isinstance(source.this, exp.Identifier):
        raise _reject("the table must be named by a plain identifier")
    table = source.name
    db = source.text("db") or None
    if db is not None and db.lower() in ("system", "information_schema"):
        raise _reject(f"system tables ({db}.{table}) are not allowed")
    alias = source.alias or None
    alias_node = source.args.get("alias")
    if alias_node is not None and alias_node.args.get("columns"):
        raise _reject("column aliases on the table are not supported")
    return db, table, alias


def _check_clauses(tree: exp.Select) -> None:
    for key, value in tree.args.items():
        if value in (None, False, []):
            continue
        if key in _ALLOWED_SELECT_ARGS:
            continue
        if key == "joins":
            for join in value:
                if (join.args.get("kind") or "").upper() == "ARRAY" or "ARRAY" in (join.text("side") or "").upper():
                    raise _reject("ARRAY JOIN is not supported")
            raise _reject(_SELECT_ARG_MESSAGES["joins"])
        raise _reject(_SELECT_ARG_MESSAGES.get(key, f"the {key.upper()} clause is not supported"))
    if tree.args.get("kind"):
        raise _reject(f"SELECT {str(tree.args['kind']).upper()} is not supported")

    group = tree.args.get("group")
    if group is not None:
        for key, value in group.args.items():
            if value in (None, False, []) or key == "expressions":
                continue
            name = {"totals": "WITH TOTALS", "rollup": "ROLLUP", "cube": "CUBE",
                    "grouping_sets": "GROUPING SETS"}.get(key, key.upper())
            raise _reject(f"GROUP BY ... {name} is not supported: group by plain columns or expressions")
        if not group.expressions:
            raise _reject("empty GROUP BY")

    limit = tree.args.get("limit")
    if limit is not None:
        if limit.args.get("expressions"):
            raise _reject("LIMIT ... BY is not supported")
        opts = limit.args.get("limit_options")
        if opts is not None and any(opts.args.get(k) for k in ("with_ties", "percent", "rows")):
            raise _reject("LIMIT ... WITH TIES / PERCENT is not supported")
        if isinstance(limit, exp.Fetch):
            raise _reject("FETCH is not supported; use LIMIT")
        _check_int_literal(limit.args.get("expression"), "LIMIT")
    offset = tree.args.get("offset")
    if offset is not None:
        _check_int_literal(offset.args.get("expression"), "OFFSET")

    order = tree.args.get("order")
    if order is not None:
        for item in order.expressions:
            if isinstance(item, exp.Ordered) and item.args.get("with_fill"):
                raise _reject("ORDER BY ... WITH FILL is not supported")


def _check_int_literal(node, what: str) -> None:
    if not (isinstance(node, exp.Literal) and not node.is_string and node.this.isdigit()):
        raise _reject(f"{what} must be a non-negative integer literal")


def _check_nodes(tree: exp.Select) -> None:
    """Constructs that are rejected wherever they appear in the statement."""
    for node in tree.walk():
        if node is tree:
            continue
        if isinstance(node, (exp.Select, exp.Subquery, exp.Union, exp.Exists)):
            raise _reject("subqueries are not supported (in SELECT, WHERE, IN or elsewhere): "
                          "use a literal list, e.g. x IN (1, 2, 3)")
        if isinstance(node, exp.Window):
            raise _reject("window functions (... OVER (...)) are not supported")
        if isinstance(node, exp.Lambda):
            raise _reject("lambda expressions (x -> ...) are not supported")
        if isinstance(node, (exp.Placeholder, exp.Parameter)):
            raise _reject("query parameters/placeholders are not supported: write literal values")
        if isinstance(node, exp.Star) and not isinstance(node.parent, exp.Count):
            raise _reject("SELECT * is not supported: select group keys and DP aggregates")
        if isinstance(node, exp.Join):
            raise _reject("JOIN is not supported: a query reads exactly one catalogued table")
        if isinstance(node, (exp.Anonymous, exp.AnonymousAggFunc, exp.CombinedAggFunc)):
            name = node.this if isinstance(node.this, str) else node.name
            if name.lower().startswith(("dp_", "dpch_")):
                raise _reject(f"the query calls {name}(...): DPCH adds the noise itself (with the calibrated "
                              "scale and the budget charged); write the plain aggregate (COUNT, SUM, AVG, ...) "
                              "instead of dp_*/dpch_* functions")
        if isinstance(node, (exp.Explode,)) or (isinstance(node, exp.Anonymous) and node.name.lower() == "arrayjoin"):
            raise _reject("arrayJoin() is not supported (it changes the rows a unit contributes)")
