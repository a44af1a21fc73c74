"""Loading one's own data into the embedded engine: ``db.load(table, source, order_by=...)`` and
``dpch load TABLE FILE...``.

A source is a pandas DataFrame, a pyarrow Table, or CSV/TSV/Parquet/JSON-lines file(s): a path, a
glob (``data/*.parquet``) or a list of them. ClickHouse infers the schema itself (``file(...)``
for files, ``Python(...)`` for in-memory tables) and the table is created as

    CREATE TABLE t ENGINE = MergeTree ORDER BY (k1, ...) AS SELECT * REPLACE (assumeNotNull(k1) AS k1, ...) ...

File schema inference makes every column Nullable, and ClickHouse refuses a Nullable sorting key,
so the ``order_by`` columns are made non-Nullable; a NULL in one of them stops the load with an
error naming the column (never a value). Without ``order_by`` the table has no sorting key
(``ORDER BY tuple()``). This is a trusted, administrator operation: it reads raw data and charges
nothing.
"""
from __future__ import annotations

import glob as _glob
import os
import re
from dataclasses import dataclass, field
from typing import Callable, Sequence

from .backends import query_records
from .errors import BackendError, DPCHError, InvalidParameter

#: file suffix -> ClickHouse input format (otherwise ClickHouse detects the format itself)
FORMATS = {
    ".csv": "CSVWithNames", ".tsv": "TSVWithNames", ".tab": "TSVWithNames",
    ".parquet": "Parquet", ".pq": "Parquet", ".jsonl": "JSONEachRow", ".ndjson": "JSONEachRow",
    ".json": "JSONEachRow", ".arrow": "Arrow", ".feather": "Arrow", ".orc": "ORC",
}
_COMPRESSION = (".gz", ".zst", ".zstd", ".xz", ".bz2", ".lz4", ".br")
IF_EXISTS = ("fail", "append", "replace")
_GLOB_CHARS = re.compile(r"[*?\[{]")
_NULL_KEY_TAG = "DPCH_NULL_IN_ORDER_BY"


class LoadError(DPCHError, ValueError):
    """The data could not be loaded (missing file, unknown column, NULL in a key, ...)."""


@dataclass(frozen=True)
class LoadResult:
    table: str
    rows: int
    columns: dict[str, str] = field(default_factory=dict)  # name -> ClickHouse type
    order_by: tuple[str, ...] = ()

    def __str__(self) -> str:
        cols = ", ".join(f"{n} {t}" for n, t in self.columns.items())
        key = ", ".join(self.order_by) or "tuple()"
        return f"loaded {self.rows:,} rows into {self.table} (ORDER BY {key}): {cols}"


def quote_ident(name: str) -> str:
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


def quote_table(table: str) -> tuple[str | None, str]:
    """Split ``db.table`` (or ``table``) and return (quoted database or None, quoted full name)."""
    if not isinstance(table, str) or not table.strip():
        raise InvalidParameter("the table name must be a non-empty string such as mydb.events")
    parts = table.strip().split(".")
    if len(parts) > 2 or not all(p.strip() for p in parts):
        raise InvalidParameter(f"table name {table!r}: use TABLE or DATABASE.TABLE")
    if len(parts) == 2:
        return quote_ident(parts[0]), f"{quote_ident(parts[0])}.{quote_ident(parts[1])}"
    return None, quote_ident(parts[0])


def _literal(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _format_for(path: str, fmt: str | None) -> str | None:
    if fmt:
        return fmt
    name = path.lower()
    for c in _COMPRESSION:
        if name.endswith(c):
            name = name[: -len(c)]
            break
    return FORMATS.get(os.path.splitext(name)[1])


def resolve_files(sources: Sequence[str | os.PathLike]) -> list[tuple[str, list[str]]]:
    """(pattern as given to ClickHouse, matching files) for each source; raises LoadError if a
    path does not exist or a glob matches nothing."""
    out = []
    for src in sources:
        text = os.path.abspath(os.path.expanduser(os.fspath(src)))
        if _GLOB_CHARS.search(os.fspath(src)):
            matches = sorted(p for p in _glob.glob(text) if os.path.isfile(p))
            if not matches:
                raise LoadError(f"no file matches {os.fspath(src)!r}")
            out.append((text, matches))
        elif os.path.isdir(text):
            raise LoadError(f"{os.fspath(src)!r} is a directory; give files or a glob such as "
                            f"{os.path.join(os.fspath(src), '*.parquet')!r}")
        elif not os.path.isfile(text):
            raise LoadError(f"file not found: {os.fspath(src)!r}")
        else:
            out.append((text, [text]))
    return out


def _is_frame(source) -> bool:
    mod = type(source).__module__
    return mod.startswith("pandas") or mod.startswith("pyarrow") or mod.startswith("polars")


def _frame_columns(source) -> list[str]:
    cols = getattr(source, "column_names", None)  # pyarrow
    if cols is None:
        cols = getattr(source, "columns", None)  # pandas, polars
    return [str(c) for c in (list(cols) if cols is not None else [])]


def _order_by(order_by) -> tuple[str, ...]:
    if order_by is None:
        return ()
    if isinstance(order_by, str):
        order_by = [order_by]
    keys = tuple(order_by)
    if not all(isinstance(k, str) and k for k in keys):
        raise InvalidParameter("order_by must be a column name or a list of column names")
    return keys


def _select(from_clause: str, keys: Sequence[str]) -> str:
    if not keys:
        return f"SELECT * FROM {from_clause}"
    replace = ", ".join(f"assumeNotNull({quote_ident(k)}) AS {quote_ident(k)}" for k in keys)
    # a NULL in a key column stops the load (message names the column, never a value)
    checks = " AND ".join(
        f"throwIf(isNull({quote_ident(k)}), {_literal(f'{_NULL_KEY_TAG}#{i}#')}) = 0" for i, k in enumerate(keys))
    # the check runs in a subquery: in the outer WHERE, the name would mean the REPLACE alias
    return f"SELECT * REPLACE ({replace}) FROM (SELECT * FROM {from_clause} WHERE {checks})"


def _translate(exc: BackendError, what: str, keys: Sequence[str]) -> DPCHError:
    msg = str(exc)
    m = re.search(_NULL_KEY_TAG + r"#(\d+)#", msg)
    if m and int(m.group(1)) < len(keys):
        return LoadError(f"column {keys[int(m.group(1))]!r} of {what} has empty (NULL) values; an order_by column "
                         "must have a value in every row (clean the data or choose another column)")
    if "CANNOT_EXTRACT_TABLE_STRUCTURE" in msg or "CANNOT_DETECT_FORMAT" in msg:
        return LoadError(f"ClickHouse could not infer the columns of {what}; name the format "
                         f"(format='CSVWithNames', 'Parquet', ...) or check the file")
    first = msg.strip().splitlines()[0] if msg.strip() else exc.__class__.__name__
    return LoadError(f"loading {what} failed: {first}")


class _Bar:
    """A tqdm byte progress bar fed by ClickHouse's cumulative read counters, one file at a time."""

    def __init__(self, total: int, enabled: bool, desc: str):
        self.bar = None
        self.done = 0
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc,
                            leave=True, dynamic_ncols=True)

    def file(self, size: int) -> Callable[[int, int], None]:
        base, seen = self.done, [0]

        def update(read_bytes: int, _total: int) -> None:
            read_bytes = min(read_bytes, size)
            if self.bar is not None and read_bytes > seen[0]:
                self.bar.update(read_bytes - seen[0])
                seen[0] = read_bytes

        def finish() -> None:
            if self.bar is not None and seen[0] < size:
                self.bar.update(size - seen[0])
            self.done = base + size

        update.finish = finish  # type: ignore[attr-defined]
        return update

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def load(db, table: str, source, *, order_by: str | Sequence[str] | None = None, format: str | None = None,
         if_exists: str = "fail", progress: bool | None = None) -> LoadResult:
    """Create ``table`` from ``source`` and fill it. See the module docstring.

    - ``order_by``: the sorting key (e.g. the privacy unit column); must be columns of the source.
    - ``format``: a ClickHouse input format, when the file suffix does not say it.
    - ``if_exists``: ``"fail"`` (default), ``"append"`` (insert into the existing table) or
      ``"replace"`` (drop and recreate it).
    - ``progress``: show a progress bar (default: when stderr is a terminal).
    """
    import sys

    backend = db.backend
    if getattr(backend, "kind", None) != "embedded" or not hasattr(backend, "command_with_progress"):
        raise DPCHError("db.load works on the embedded engine; on a ClickHouse server use "
                        "clickhouse-client (INSERT ... FROM INFILE) or clickhouse-connect's insert_df")
    if if_exists not in IF_EXISTS:
        raise InvalidParameter(f"if_exists must be one of {', '.join(IF_EXISTS)}")
    keys = _order_by(order_by)
    database, full = quote_table(table)
    if progress is None:
        progress = sys.stderr.isatty()

    frame = _is_frame(source)
    if frame:
        columns = _frame_columns(source)
        items = [("the DataFrame", "Python(dpch_source)", 0)]
    else:
        sources = [source] if isinstance(source, (str, os.PathLike)) else list(source)
        if not sources:
            raise LoadError("no file given")
        items = []
        for pattern, files in resolve_files(sources):
            fmt = _format_for(files[0], format)
            args = _literal(pattern) + (f", {_literal(fmt)}" if fmt else "")
            size = sum(os.path.getsize(f) for f in files)
            items.append((os.path.relpath(pattern) if len(pattern) > 60 else pattern, f"file({args})", size))
        columns = _describe_columns(backend, items[0][1], items[0][0], keys)
    unknown = [k for k in keys if k not in columns]
    if unknown:
        raise LoadError(f"order_by column(s) {', '.join(map(repr, unknown))} not in the data; "
                        f"its columns are: {', '.join(columns)}")

    exists = _table_exists(backend, table)
    if exists and if_exists == "fail":
        raise LoadError(f"table {table} already exists; pass if_exists='append' or 'replace' "
                        "(dpch load: --if-exists append|replace)")
    if database is not None:
        backend.command(f"CREATE DATABASE IF NOT EXISTS {database}")
    # replace: load into a staging table and swap it in only once everything loaded
    staging = exists and if_exists == "replace"
    target = quote_table(table.strip() + "__dpch_loading")[1] if staging else full
    if staging:
        backend.command(f"DROP TABLE IF EXISTS {target}")
        exists = False
    if exists and not keys:  # appending: the table's own sorting key must not receive NULLs either
        keys = tuple(k for k in _sorting_key(backend, table) if k in columns)
    before = _count(backend, full) if exists else 0

    key_sql = "(" + ", ".join(quote_ident(k) for k in keys) + ")" if keys else "tuple()"
    bar = _Bar(sum(size for *_, size in items), progress and not frame, desc=f"loading {table}")
    created = False
    try:
        for what, from_clause, size in items:
            select = _select(from_clause, keys)
            if exists:
                sql = f"INSERT INTO {target} {select}"
            else:
                sql = f"CREATE TABLE {target} ENGINE = MergeTree ORDER BY {key_sql} AS {select}"
            hook = bar.file(size)
            try:
                if frame:
                    backend.command_on_data(sql, source)
                else:
                    backend.command_with_progress(sql, hook)
            except BackendError as exc:
                if created or not exists:  # leave no half-made table behind
                    backend.command(f"DROP TABLE IF EXISTS {target}")
                raise _translate(exc, what, keys) from None
            hook.finish()  # type: ignore[attr-defined]
            created = created or not exists
            exists = True
    finally:
        bar.close()
    if staging:
        backend.command(f"DROP TABLE {full}")
        backend.command(f"RENAME TABLE {target} TO {full}")
    rows = _count(backend, full) - before
    columns = _columns(backend, table)
    return LoadResult(table=table, rows=int(rows), columns={c["name"]: c["type"] for c in columns},
                      order_by=tuple(c["name"] for c in columns if int(c["is_in_sorting_key"])))


def _columns(backend, table: str):
    parts = table.strip().split(".")
    db_sql = _literal(parts[0]) if len(parts) == 2 else "currentDatabase()"
    return query_records(backend, f"SELECT name, type, is_in_sorting_key FROM system.columns WHERE database = {db_sql} "
                                  f"AND table = {_literal(parts[-1])} ORDER BY position")


def _sorting_key(backend, table: str) -> list[str]:
    return [c["name"] for c in _columns(backend, table) if int(c["is_in_sorting_key"])]


def _describe_columns(backend, from_clause: str, what: str, keys) -> list[str]:
    try:
        rows = query_records(backend, f"DESCRIBE TABLE {from_clause}")
    except BackendError as exc:
        raise _translate(exc, what, keys) from None
    return [row["name"] for row in rows]


def _table_exists(backend, table: str) -> bool:
    parts = table.strip().split(".")
    db_sql = _literal(parts[0]) if len(parts) == 2 else "currentDatabase()"
    [row] = query_records(backend, f"SELECT count() AS n FROM system.tables WHERE database = {db_sql} "
                                   f"AND name = {_literal(parts[-1])}")
    return int(row["n"]) > 0


def _count(backend, full: str) -> int:
    return int(query_records(backend, f"SELECT count() AS n FROM {full}")[0]["n"])
