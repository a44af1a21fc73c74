"""Neighbouring datasets D and D′ as tables in the engine.

The audited table (or a sample of it, with its extreme rows kept) is copied once into
`<db>.base` with a row id; D is `<db>.d` (base without the id) and each candidate D′ is
`<db>.dprime`, built from base by SQL alone, so that no data value travels through Python and the
column types stay exactly those of the source.

Neighbour relations (DESIGN.md invariant 6; `dpch_paper.md` Definition 1 uses "differ in a single
sample"):

| kind | D′ |
|---|---|
| remove-row | D minus one row |
| add-row | D plus one row |
| substitute-row | D with one row replaced (same number of rows) |
| remove-unit | D minus every row of one privacy unit (user-level DP) |
| add-unit | D plus a new privacy unit (copies of an existing unit's rows under a fresh id) |
| substitute-unit | D with the rows of one privacy unit replaced by other rows of that unit |

The worst case is not known in advance for a black-box mechanism, so `candidates()` proposes
several records that tend to maximise the change of the true answer: for each numeric column the
rows (units) holding its maximum and minimum, and for additions/substitutions values at, or far
outside, the column's observed range (far outside is what exposes missing clipping). The audit
then runs a small pilot on each candidate and keeps the one whose outputs are easiest to tell
apart from D's (`dpch.audit.api`), in the spirit of DP-Sniper's and StatDP's input search. The
user can instead name the record: a WHERE predicate selecting the row (or unit) to remove or
replace, and column values for a row to add.

Descriptions name columns and roles ("the row with the largest `amount`"), never data values
(DESIGN.md invariant 5).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

KINDS = ("remove-row", "add-row", "substitute-row", "remove-unit", "add-unit", "substitute-unit")
ROW_ID = "__audit_row"
_FAR = 1000.0  # "far outside": 1000 times the observed range beyond the extreme

_INT_RANGE = {
    "Int8": (-2**7, 2**7 - 1), "Int16": (-2**15, 2**15 - 1), "Int32": (-2**31, 2**31 - 1),
    "Int64": (-2**53, 2**53), "Int128": (-2**53, 2**53), "Int256": (-2**53, 2**53),
    "UInt8": (0, 2**8 - 1), "UInt16": (0, 2**16 - 1), "UInt32": (0, 2**32 - 1),
    "UInt64": (0, 2**53), "UInt128": (0, 2**53), "UInt256": (0, 2**53),
}


def _base_type(t: str) -> str:
    while True:
        m = re.fullmatch(r"(?:Nullable|LowCardinality)\((.*)\)", t)
        if not m:
            return t
        t = m.group(1)


def _quote_ident(name: str) -> str:
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


def sql_literal(value) -> str:
    """A Python value as a ClickHouse literal (for user-chosen records)."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (int, float)):
        return repr(value) if value == value else "nan"
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


@dataclass(frozen=True)
class Column:
    name: str
    type: str

    @property
    def base(self) -> str:
        return _base_type(self.type)

    @property
    def numeric(self) -> bool:
        return bool(re.fullmatch(r"U?Int\d+|Float\d+|Decimal.*|BFloat16", self.base))

    @property
    def is_float(self) -> bool:
        return self.base.startswith(("Float", "BFloat"))

    @property
    def q(self) -> str:
        return _quote_ident(self.name)


@dataclass(frozen=True)
class Neighbour:
    kind: str
    description: str
    statements: tuple[str, ...] = field(repr=False)  # build <db>.dprime (after it is emptied)


class AuditTables:
    """The D / D′ tables of one audit, in database `database` of the engine behind `conn`."""

    def __init__(self, conn, source: str, *, database: str = "dpch_audit", max_rows: int = 10_000,
                 unit_column: str | None = None):
        self.conn = conn
        self.source = source
        self.database = database
        self.max_rows = max_rows
        self.unit_column = unit_column
        self.base = f"{database}.base"
        self.d = f"{database}.d"
        self.dprime = f"{database}.dprime"
        self.columns: list[Column] = []
        self.rows = 0
        self.sampled = False

    # -- set-up ------------------------------------------------------------------------------
    def create(self) -> None:
        db, _, table = self.source.partition(".")
        cols = self.conn.raw_query(
            f"SELECT name, type FROM system.columns WHERE database = {sql_literal(db)} "
            f"AND table = {sql_literal(table)} ORDER BY position")
        if cols.empty:
            raise ValueError(f"table {self.source} not found")
        self.columns = [Column(str(n), str(t)) for n, t in zip(cols["name"], cols["type"])]
        if self.unit_column and self.unit_column not in {c.name for c in self.columns}:
            raise ValueError(f"privacy unit column {self.unit_column!r} is not a column of {self.source}")
        self.conn.command(f"CREATE DATABASE IF NOT EXISTS {self.database}")
        for t in (self.base, self.d, self.dprime):
            self.conn.command(f"DROP TABLE IF EXISTS {t}")
        total = int(self.conn.raw_query(f"SELECT count() AS n FROM {self.source}")["n"][0])
        src = self.source
        if total > self.max_rows:
            # A sample for speed, plus the extreme rows of every numeric column (the worst-case
            # candidates). Auditing a sub-dataset is legitimate: DP holds for every pair.
            self.sampled = True
            parts = [f"(SELECT * FROM {src} ORDER BY rand() LIMIT {int(self.max_rows)})"]
            for c in self.numeric_columns():
                parts.append(f"(SELECT * FROM {src} ORDER BY {c.q} DESC LIMIT 1)")
                parts.append(f"(SELECT * FROM {src} ORDER BY {c.q} ASC LIMIT 1)")
            src = "(" + " UNION ALL ".join(f"SELECT * FROM {p}" for p in parts) + ")"
        self.conn.command(f"CREATE TABLE {self.base} ENGINE = Memory AS "
                          f"SELECT *, rowNumberInAllBlocks() AS {ROW_ID} FROM {src}")
        self.conn.command(f"CREATE TABLE {self.d} ENGINE = Memory AS "
                          f"SELECT * EXCEPT ({ROW_ID}) FROM {self.base}")
        self.rows = int(self.conn.raw_query(f"SELECT count() AS n FROM {self.d}")["n"][0])
        if self.rows == 0:
            raise ValueError(f"table {self.source} is empty: nothing to audit against")
        self.conn.command(f"CREATE TABLE {self.dprime} ENGINE = Memory AS "
                          f"SELECT * EXCEPT ({ROW_ID}) FROM {self.base} WHERE 0")

    def drop(self) -> None:
        for t in (self.base, self.d, self.dprime):
            self.conn.command(f"DROP TABLE IF EXISTS {t}")

    def numeric_columns(self) -> list[Column]:
        return [c for c in self.columns if c.numeric and c.name != self.unit_column]

    # -- building D′ ---------------------------------------------------------------------------
    def build(self, neighbour: Neighbour) -> None:
        # emptied, not dropped and made again: D′ has D's columns for the whole audit, and a
        # worst-case search builds one D′ per candidate (TRUNCATE: 8.5 ms a build instead of 19)
        self.conn.command(f"TRUNCATE TABLE {self.dprime}")
        for stmt in neighbour.statements:
            self.conn.command(stmt)

    def _copy_except(self, where: str) -> str:
        return (f"INSERT INTO {self.dprime} SELECT * EXCEPT ({ROW_ID}) FROM {self.base} "
                f"WHERE NOT ({where})")

    def _copy_all(self) -> str:
        return f"INSERT INTO {self.dprime} SELECT * EXCEPT ({ROW_ID}) FROM {self.base}"

    def _insert_modified(self, where: str, replace: dict[str, str]) -> str:
        rep = ""
        if replace:
            rep = " REPLACE (" + ", ".join(f"{e} AS {_quote_ident(c)}" for c, e in replace.items()) + ")"
        return (f"INSERT INTO {self.dprime} SELECT *{rep} FROM "
                f"(SELECT * EXCEPT ({ROW_ID}) FROM {self.base} WHERE {where})")

    def _row_of(self, col: Column, largest: bool) -> str:
        order = "DESC" if largest else "ASC"
        return (f"{ROW_ID} = (SELECT {ROW_ID} FROM {self.base} WHERE isNotNull({col.q}) "
                f"ORDER BY {col.q} {order}, {ROW_ID} LIMIT 1)")

    def _value(self, col: Column, where: str) -> str:
        """SQL for a value of `col`: 'max', 'min', 'far_above', 'far_below' (clamped to the
        column type's range, cast back to the column type)."""
        lo = f"(SELECT toFloat64(min({col.q})) FROM {self.base})"
        hi = f"(SELECT toFloat64(max({col.q})) FROM {self.base})"
        expr = {"max": hi, "min": lo,
                "far_above": f"{hi} + {_FAR} * ({hi} - {lo} + 1)",
                "far_below": f"{lo} - {_FAR} * ({hi} - {lo} + 1)"}[where]
        rng = _INT_RANGE.get(col.base)
        if rng is not None:
            expr = f"least(greatest({expr}, toFloat64({rng[0]})), toFloat64({rng[1]}))"
        elif not col.is_float:  # Decimal: stay inside the observed range
            expr = {"far_above": hi, "far_below": lo}.get(where, expr)
        return f"CAST({expr} AS {col.type})"

    def _fresh_unit(self) -> str:
        unit = next(c for c in self.columns if c.name == self.unit_column)
        if unit.numeric:
            return f"CAST((SELECT max({unit.q}) FROM {self.base}) + 1 AS {unit.type})"
        if unit.base in ("String",) or unit.base.startswith("FixedString"):
            return f"CAST(concat(toString({unit.q}), '#dpch-audit') AS {unit.type})"
        raise ValueError(f"add-unit needs a numeric or String privacy unit column, got {unit.type}")

    def candidates(self, kind: str, *, where: str | None = None,
                   values: dict[str, object] | None = None) -> list[Neighbour]:
        """Candidate D′ for a neighbour kind. With `where` (remove/substitute: which row or unit)
        or `values` (add/substitute: column values of the new record) the user chooses; otherwise
        the worst-case candidates described in the module docstring."""
        if kind not in KINDS:
            raise ValueError(f"unknown neighbour relation {kind!r}; choose from {', '.join(KINDS)}")
        if kind.endswith("-unit") and not self.unit_column:
            raise ValueError(f"{kind} needs the privacy unit column (unit_column=...)")
        if where is not None or values:
            return [self._user_candidate(kind, where, values or {})]
        nums = self.numeric_columns()
        out: list[Neighbour] = []
        if kind == "remove-row":
            for c in nums:
                for largest in (True, False):
                    role = "largest" if largest else "smallest"
                    out.append(Neighbour(kind, f"remove the row with the {role} `{c.name}`",
                                         (self._copy_except(self._row_of(c, largest)),)))
            out.append(Neighbour(kind, "remove the first row", (self._copy_except(f"{ROW_ID} = 0"),)))
        elif kind == "add-row":
            template = f"{ROW_ID} = 0"
            out.append(Neighbour(kind, "add a copy of the first row",
                                 (self._copy_all(), self._insert_modified(template, {}))))
            for where_ in ("far_above", "far_below", "max", "min"):
                label = (where_.replace("_", " ") + " its observed range" if where_.startswith("far")
                         else f"at its {where_}imum")
                for c in nums:
                    out.append(Neighbour(kind, f"add a row with `{c.name}` {label}",
                                         (self._copy_all(), self._insert_modified(
                                             template, {c.name: self._value(c, where_)}))))
                if len(nums) > 1:
                    out.append(Neighbour(kind, f"add a row with every numeric column {label}",
                                         (self._copy_all(), self._insert_modified(
                                             template, {c.name: self._value(c, where_) for c in nums}))))
        elif kind == "substitute-row":
            for c in nums:
                for largest, targets in ((True, ("far_below", "min")), (False, ("far_above", "max"))):
                    row = self._row_of(c, largest)
                    role = "largest" if largest else "smallest"
                    for tgt in targets:
                        label = (tgt.replace("_", " ") + " its observed range" if tgt.startswith("far")
                                 else f"at its {tgt}imum")
                        out.append(Neighbour(kind, f"replace the row with the {role} `{c.name}` by one "
                                             f"with `{c.name}` {label}",
                                             (self._copy_except(row),
                                              self._insert_modified(row, {c.name: self._value(c, tgt)}))))
        elif kind == "remove-unit":
            u = _quote_ident(self.unit_column)
            heaviest = (f"{u} = (SELECT {u} FROM {self.base} GROUP BY {u} ORDER BY count() DESC, "
                        f"min({ROW_ID}) LIMIT 1)")
            out.append(Neighbour(kind, "remove the privacy unit with the most rows",
                                 (self._copy_except(heaviest),)))
            for c in nums:
                for largest in (True, False):
                    role = "largest" if largest else "smallest"
                    unit_of = f"{u} IN (SELECT {u} FROM {self.base} WHERE {self._row_of(c, largest)})"
                    out.append(Neighbour(kind, f"remove the privacy unit holding the {role} `{c.name}`",
                                         (self._copy_except(unit_of),)))
            for c in nums:  # the unit contributing most in total
                top = (f"{u} = (SELECT {u} FROM {self.base} GROUP BY {u} ORDER BY "
                       f"sum(abs(toFloat64({c.q}))) DESC, min({ROW_ID}) LIMIT 1)")
                out.append(Neighbour(kind, f"remove the privacy unit with the largest total |`{c.name}`|",
                                     (self._copy_except(top),)))
        elif kind == "substitute-unit":
            u = _quote_ident(self.unit_column)
            heaviest = (f"{u} = (SELECT {u} FROM {self.base} GROUP BY {u} ORDER BY count() DESC, "
                        f"min({ROW_ID}) LIMIT 1)")
            first_of = (f"{ROW_ID} = (SELECT min({ROW_ID}) FROM {self.base} WHERE {heaviest})")
            out.append(Neighbour(kind, "replace the privacy unit with the most rows by one of its rows",
                                 (self._copy_except(heaviest), self._insert_modified(first_of, {}))))
            for c in nums:
                for largest, target in ((True, "far_below"), (False, "far_above")):
                    role = "largest" if largest else "smallest"
                    unit_of = f"{u} IN (SELECT {u} FROM {self.base} WHERE {self._row_of(c, largest)})"
                    out.append(Neighbour(
                        kind, f"replace the privacy unit holding the {role} `{c.name}` by the same rows "
                              f"with every `{c.name}` {target.replace('_', ' ')} its observed range",
                        (self._copy_except(unit_of),
                         self._insert_modified(unit_of, {c.name: self._value(c, target)}))))
        elif kind == "add-unit":
            u = _quote_ident(self.unit_column)
            heaviest = (f"{u} = (SELECT {u} FROM {self.base} GROUP BY {u} ORDER BY count() DESC, "
                        f"min({ROW_ID}) LIMIT 1)")
            fresh = {self.unit_column: self._fresh_unit()}
            out.append(Neighbour(kind, "add a new privacy unit with the rows of the unit with the most rows",
                                 (self._copy_all(), self._insert_modified(heaviest, fresh))))
            for where_ in ("far_above", "far_below", "max"):
                for c in nums:
                    label = (where_.replace("_", " ") + " its observed range" if where_.startswith("far")
                             else "at its maximum")
                    out.append(Neighbour(kind, f"add a new privacy unit like the largest one, every "
                                         f"`{c.name}` {label}",
                                         (self._copy_all(), self._insert_modified(
                                             heaviest, {**fresh, c.name: self._value(c, where_)}))))
        return out

    def _user_candidate(self, kind: str, where: str | None, values: dict[str, object]) -> Neighbour:
        known = {c.name for c in self.columns}
        unknown = [c for c in values if c not in known]
        if unknown:
            raise ValueError(f"record names unknown column(s): {', '.join(unknown)}")
        cols = {c.name: c for c in self.columns}
        replace = {name: f"CAST({sql_literal(v)} AS {cols[name].type})" for name, v in values.items()}
        if kind in ("remove-row", "substitute-row"):
            if not where:
                raise ValueError(f"{kind} with a chosen record needs a WHERE predicate for the row")
            n = int(self.conn.raw_query(f"SELECT count() AS n FROM {self.base} WHERE {where}")["n"][0])
            if n != 1:
                raise ValueError(f"the record predicate must match exactly one row (it matches {n})")
            row = f"{ROW_ID} = (SELECT {ROW_ID} FROM {self.base} WHERE {where} LIMIT 1)"
            stmts = [self._copy_except(row)]
            if kind == "substitute-row":
                if not replace:
                    raise ValueError("substitute-row with a chosen record needs the new column values")
                stmts.append(self._insert_modified(row, replace))
            return Neighbour(kind, "the chosen record" + (" (substituted)" if kind == "substitute-row"
                                                           else ""), tuple(stmts))
        if kind in ("remove-unit", "substitute-unit"):
            if not where:
                raise ValueError(f"{kind} with a chosen unit needs a WHERE predicate")
            u = _quote_ident(self.unit_column)
            sel = f"{u} IN (SELECT {u} FROM {self.base} WHERE {where})"
            if kind == "remove-unit":
                return Neighbour(kind, "every row of the chosen privacy unit(s)", (self._copy_except(sel),))
            if not replace:
                raise ValueError("substitute-unit with a chosen unit needs the new column values")
            return Neighbour(kind, "the chosen privacy unit's rows with the given values",
                             (self._copy_except(sel), self._insert_modified(sel, replace)))
        if kind == "add-row":
            template = where or f"{ROW_ID} = 0"
            row = f"{ROW_ID} = (SELECT {ROW_ID} FROM {self.base} WHERE {template} LIMIT 1)"
            return Neighbour(kind, "add the chosen record", (self._copy_all(),
                                                             self._insert_modified(row, replace)))
        # add-unit: copy the chosen unit's rows under a fresh id, with the given values
        u = _quote_ident(self.unit_column)
        sel = (f"{u} = (SELECT {u} FROM {self.base} WHERE {where} LIMIT 1)" if where else
               f"{u} = (SELECT {u} FROM {self.base} WHERE {ROW_ID} = 0)")
        replace = {self.unit_column: self._fresh_unit(), **replace}
        return Neighbour(kind, "add a new privacy unit built from the chosen one",
                         (self._copy_all(), self._insert_modified(sel, replace)))


# --------------------------------------------------------------------------------------------
# The same relations on a pandas DataFrame (for mechanisms given as Python callables)
# --------------------------------------------------------------------------------------------
def frame_candidates(df, kind: str, *, unit_column: str | None = None, where=None,
                     values: dict[str, object] | None = None) -> list[tuple[str, object]]:
    """(description, D′ DataFrame) candidates, mirroring `AuditTables.candidates`. `where` is an
    index label (the row, or a row of the unit) or a boolean mask; `values` the new record's
    column values (columns not given are copied from the first row)."""
    import numpy as np
    import pandas as pd

    if kind not in KINDS:
        raise ValueError(f"unknown neighbour relation {kind!r}; choose from {', '.join(KINDS)}")
    if kind.endswith("-unit") and not unit_column:
        raise ValueError(f"{kind} needs the privacy unit column (unit_column=...)")
    if len(df) == 0:
        raise ValueError("the dataset is empty: nothing to audit against")
    nums = [c for c in df.columns if pd.api.types.is_numeric_dtype(df[c])
            and not pd.api.types.is_bool_dtype(df[c]) and c != unit_column]

    def extreme(c, which):
        lo, hi = float(df[c].min()), float(df[c].max())
        v = {"max": hi, "min": lo, "far_above": hi + _FAR * (hi - lo + 1),
             "far_below": lo - _FAR * (hi - lo + 1)}[which]
        if pd.api.types.is_integer_dtype(df[c]):
            info = np.iinfo(df[c].dtype)
            v = int(min(max(v, max(info.min, -2**53)), min(info.max, 2**53)))
        return v

    def with_row(row):
        return pd.concat([df, row.to_frame().T.astype(df.dtypes.to_dict())], ignore_index=True)

    def fresh_unit(rows):
        ids = df[unit_column]
        new = ids.max() + 1 if pd.api.types.is_numeric_dtype(ids) else str(rows[unit_column].iloc[0]) + "#dpch-audit"
        rows = rows.copy()
        rows[unit_column] = new
        return rows

    if where is not None or values:
        values = dict(values or {})
        mask = None
        if where is not None:
            mask = where if not np.isscalar(where) else (df.index == where)
            mask = np.asarray(mask, dtype=bool)
        if kind in ("remove-row", "substitute-row"):
            if mask is None or mask.sum() != 1:
                raise ValueError("the chosen record must select exactly one row")
            rest = df[~mask]
            if kind == "remove-row":
                return [("the chosen record", rest.reset_index(drop=True))]
            row = df[mask].iloc[0].copy()
            for k, v in values.items():
                row[k] = v
            return [("the chosen record (substituted)", pd.concat(
                [rest, row.to_frame().T.astype(df.dtypes.to_dict())], ignore_index=True))]
        if kind == "add-row":
            row = (df[mask].iloc[0] if mask is not None else df.iloc[0]).copy()
            for k, v in values.items():
                row[k] = v
            return [("add the chosen record", with_row(row))]
        units = df.loc[mask, unit_column].unique() if mask is not None else df[unit_column].iloc[:1].unique()
        if kind == "substitute-unit":
            if mask is None or not values:
                raise ValueError("substitute-unit with a chosen unit needs where= and record=")
            sel = df[unit_column].isin(units)
            new = df.copy()
            for k, v in values.items():
                new.loc[sel, k] = v
            return [("the chosen privacy unit's rows with the given values", new)]
        if kind == "remove-unit":
            return [("every row of the chosen privacy unit(s)",
                     df[~df[unit_column].isin(units)].reset_index(drop=True))]
        rows = fresh_unit(df[df[unit_column] == units[0]])
        for k, v in values.items():
            rows[k] = v
        return [("add a new privacy unit built from the chosen one", pd.concat([df, rows], ignore_index=True))]

    out = []
    if kind == "remove-row":
        for c in nums:
            out.append((f"remove the row with the largest `{c}`", df.drop(index=df[c].idxmax()).reset_index(drop=True)))
            out.append((f"remove the row with the smallest `{c}`", df.drop(index=df[c].idxmin()).reset_index(drop=True)))
        out.append(("remove the first row", df.iloc[1:].reset_index(drop=True)))
    elif kind == "add-row":
        out.append(("add a copy of the first row", with_row(df.iloc[0].copy())))
        for which in ("far_above", "far_below", "max", "min"):
            for c in nums:
                row = df.iloc[0].copy()
                row[c] = extreme(c, which)
                out.append((f"add a row with `{c}` {which.replace('_', ' ')}", with_row(row)))
    elif kind == "substitute-row":
        for c in nums:
            for idx, targets, role in ((df[c].idxmax(), ("far_below", "min"), "largest"),
                                       (df[c].idxmin(), ("far_above", "max"), "smallest")):
                for which in targets:
                    new = df.copy()
                    new.loc[idx, c] = extreme(c, which)
                    out.append((f"replace the row with the {role} `{c}` by one with `{c}` "
                                f"{which.replace('_', ' ')}", new.reset_index(drop=True)))
    elif kind == "remove-unit":
        heaviest = df[unit_column].value_counts().index[0]
        out.append(("remove the privacy unit with the most rows", df[df[unit_column] != heaviest].reset_index(drop=True)))
        for c in nums:
            for idx, role in ((df[c].idxmax(), "largest"), (df[c].idxmin(), "smallest")):
                u = df.loc[idx, unit_column]
                out.append((f"remove the privacy unit holding the {role} `{c}`",
                            df[df[unit_column] != u].reset_index(drop=True)))
    elif kind == "substitute-unit":
        heaviest = df[unit_column].value_counts().index[0]
        sel = df[unit_column] == heaviest
        first = df[sel].iloc[:1]
        out.append(("replace the privacy unit with the most rows by one of its rows",
                    pd.concat([df[~sel], first], ignore_index=True)))
        for c in nums:
            for idx, which, role in ((df[c].idxmax(), "far_below", "largest"), (df[c].idxmin(), "far_above", "smallest")):
                u = df.loc[idx, unit_column]
                new = df.copy()
                new.loc[new[unit_column] == u, c] = extreme(c, which)
                out.append((f"replace the privacy unit holding the {role} `{c}` by the same rows with every "
                            f"`{c}` {which.replace('_', ' ')}", new))
    else:  # add-unit
        heaviest = df[unit_column].value_counts().index[0]
        base_rows = fresh_unit(df[df[unit_column] == heaviest])
        out.append(("add a new privacy unit with the rows of the unit with the most rows",
                    pd.concat([df, base_rows], ignore_index=True)))
        for which in ("far_above", "far_below", "max"):
            for c in nums:
                rows = base_rows.copy()
                rows[c] = extreme(c, which)
                out.append((f"add a new privacy unit like the largest one, every `{c}` "
                            f"{which.replace('_', ' ')}", pd.concat([df, rows], ignore_index=True)))
    return out
