"""Public domains of GROUP BY keys (dpch.plan's docstring, point 7): the values given with the
query (``keys=``), the catalog's ``public_keys`` of a column, or the values of an integer column
with declared bounds; also mapped through a key expression of that one column."""
from __future__ import annotations

import math
from typing import Mapping

from sqlglot import exp

from ..bind import KeySpec, sql_of
from ..catalog import TableEntry, base_type, is_integer_type, literal_sql, quote_ident
from ..errors import CatalogError, InvalidParameter
from .model import KeyDomain

MAX_ENUMERATED_KEYS = 10_000


def query_keys_for(key: KeySpec, query_keys: Mapping[str, list] | None) -> list | None:
    """The distinct values the query's ``keys=`` option gives for ``key`` (by output name, SQL or
    column), or None."""
    keys = query_keys or {}
    for name in (key.name, key.sql) + (key.columns if len(key.columns) == 1 and
                                       isinstance(key.expr, exp.Column) else ()):
        if name in keys:
            vals = keys[name]
            if isinstance(vals, (str, bytes)) or not hasattr(vals, "__iter__"):
                raise InvalidParameter(f"keys[{name!r}] must be a list of values")
            vals = list(dict.fromkeys(vals))
            if not vals:
                raise InvalidParameter(f"keys[{name!r}] must not be empty")
            return vals
    return None


def key_domain(key: KeySpec, entry: TableEntry, query_keys: Mapping[str, list] | None,
               key_types: tuple[str, ...] | None) -> KeyDomain | None:
    """The public domain of ``key``, or None when it has none. ``key_types``: the engine's type of
    each GROUP BY key (query keys are cast to it and de-duplicated in it), None when unknown."""
    e = entry
    qkeys = query_keys_for(key, query_keys)
    if qkeys is not None:
        try:
            arr = f"[{', '.join(literal_sql(v) for v in qkeys)}]"
        except CatalogError:
            raise InvalidParameter(f"keys[{key.name!r}]: values must be strings, numbers, booleans or None") from None
        if key_types is not None:  # cast to the key's type, then de-duplicate in that type
            arr = _distinct(f"CAST({arr} AS Array({_array_elem_type(key_types[key.index])}))",
                            any(v is None for v in qkeys))
        return KeyDomain(array_sql=arr, filter_sql=f"has({arr}, {key.sql})", source="query keys",
                         size=len(qkeys))
    if len(key.columns) != 1:
        return None
    col = key.columns[0]
    typ = e.columns.get(col, "")
    col_q = quote_ident(col)
    if col in e.public_keys:
        vals = e.public_keys[col]
        arr = _distinct(f"CAST([{', '.join(literal_sql(v) for v in vals)}] AS Array({_array_elem_type(typ)}))",
                        any(v is None for v in vals))
        size = len(vals)
        source = "catalog public keys"
        col_filter = f"{col_q} IN {arr}"
    elif is_integer_type(typ) and col in e.bounds:
        lo, hi = e.bounds[col]
        lo_i, hi_i = math.ceil(lo), math.floor(hi)
        size = hi_i - lo_i + 1
        if size <= 0 or size > MAX_ENUMERATED_KEYS:
            return None
        arr = f"CAST(range({lo_i}, {hi_i + 1}) AS Array({_array_elem_type(typ)}))" if lo_i >= 0 else \
            f"arrayMap(__dp_x -> CAST(__dp_x + ({lo_i}) AS {base_type(typ)}), range({size}))"
        source = "bounded integer column"
        col_filter = f"{col_q} BETWEEN {lo_i} AND {hi_i}"
    else:
        return None
    if isinstance(key.expr, exp.Column):
        return KeyDomain(array_sql=arr, filter_sql=col_filter, source=source, size=size)
    # an expression of one column with a public domain: its image (keys outside it are dropped)
    lam = _substitute_column(key.expr, col, "__dp_x")
    image = _distinct(f"arrayMap(__dp_x -> {lam}, {arr})")  # the image may hold NULL (nullIf)
    return KeyDomain(array_sql=image, filter_sql=col_filter, source=source, size=size)


def _distinct(arr: str, has_null: bool = True) -> str:
    """The array's distinct values, de-duplicated in the engine in the array's type. arrayDistinct
    drops NULL, a group like any other: where a NULL may be present the values go through 1-tuples
    (a tuple holding NULL is not NULL), which still spells the array once."""
    if not has_null:
        return f"arrayDistinct({arr})"
    return f"arrayMap(__dp_t -> __dp_t.1, arrayDistinct(arrayMap(__dp_x -> tuple(__dp_x), {arr})))"


def _array_elem_type(typ: str) -> str:
    t = typ.strip()
    while t.startswith("LowCardinality(") and t.endswith(")"):
        t = t[len("LowCardinality("):-1]
    return t


def _substitute_column(node: exp.Expression, column: str, var: str) -> str:
    copy = node.copy()
    holder = exp.Paren(this=copy)
    for c in list(holder.find_all(exp.Column)):
        if c.name == column:
            c.replace(exp.column(var))
    return sql_of(holder.this)
