"""The probe query's table swap (pure SQL, on the sqlglot tree): every catalogued table of a
relation replaced by its one-row probe table in ``dpch_probe`` (dpch.probe_db creates those tables
and passes ``probe_of``). Here, in the rewrite stage, so rewrite_probe needs nothing later."""
from __future__ import annotations

from functools import lru_cache
from typing import Callable

from sqlglot import exp, parse_one

from ..errors import QueryRejected

PROBE_DATABASE = "dpch_probe"


def swap_tables(table_sql: str, probe_of: Callable[[str], str]) -> str:
    """``table_sql`` (a FROM item: ``db.t`` or ``(subquery) AS alias``) with every table node
    replaced by ``dpch_probe.<probe_of("db.t")>``, on the sqlglot tree. A table that keeps no
    alias is given its old name as alias, so ``t.col`` still resolves. A table node that is not a
    plain ``db.t`` (a table function, an unqualified name) is refused: a probe never reads a table
    that is not a probe table. Parsing is cached by text (a repeated relation costs no parse)."""
    names = tuple(probe_of(t) for t in _tables_of(table_sql))
    return _swapped(table_sql, names)


def _parse(table_sql: str) -> exp.Expression:
    tree = parse_one(f"SELECT * FROM {table_sql}", read="clickhouse")
    for t in tree.find_all(exp.Table):
        if not isinstance(t.this, exp.Identifier) or not t.args.get("db") or t.args.get("catalog"):
            raise QueryRejected("the type check found a table it cannot replace by a probe table "
                                "(not a catalogued database.table); nothing ran and nothing was charged")
    return tree


@lru_cache(maxsize=1024)
def _tables_of(table_sql: str) -> tuple[str, ...]:
    """The ``db.t`` of every table node, in tree order."""
    return tuple(f"{t.db}.{t.name}" for t in _parse(table_sql).find_all(exp.Table))


@lru_cache(maxsize=1024)
def _swapped(table_sql: str, names: tuple[str, ...]) -> str:
    tree = _parse(table_sql)
    tables = list(tree.find_all(exp.Table))
    if len(tables) != len(names):  # cannot happen: the same text parses to the same tree
        raise QueryRejected("the type check could not build its probe; nothing ran and nothing was charged")
    for t, name in zip(tables, names):
        alias = t.alias or t.name
        t.set("this", exp.to_identifier(name, quoted=True))
        t.set("db", exp.to_identifier(PROBE_DATABASE, quoted=True))
        if not t.alias:
            t.set("alias", exp.TableAlias(this=exp.to_identifier(alias, quoted=True)))
    return tree.args["from_"].this.sql("clickhouse")
