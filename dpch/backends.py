"""Execution backends: the embedded ClickHouse engine (chDB) and ClickHouse servers
(clickhouse-connect). Both take SQL text and return pandas DataFrames, or the engine's own rendering
of the result in a ClickHouse output format; nothing in this module adds or removes privacy, it only
runs what the caller built."""
from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from .config import prepare_embedded_udf_dir, sql_function_definitions
from .errors import BackendError

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class Formatted:
    """A result rendered by ClickHouse in an output format; ``rows`` is the number of result rows
    when the engine reports it (None otherwise)."""

    body: bytes
    rows: int | None


class Backend(Protocol):
    kind: str  # "embedded" or "server"

    def query_df(self, sql: str) -> pd.DataFrame: ...

    def query_formatted(self, sql: str, fmt: str) -> Formatted: ...

    def command(self, sql: str) -> None: ...

    def insert_df(self, table: str, df: pd.DataFrame) -> None: ...

    def close(self) -> None: ...


def query_records(backend, sql: str) -> list[dict]:
    """The rows of ``sql`` as dicts, read through ClickHouse's JSONEachRow rendering. For metadata
    reads (the catalog, probe tables): unlike ``query_df`` it needs no pandas, so commands that only
    read metadata start without importing it. 64-bit integers come back as strings (ClickHouse
    quotes them in JSON): callers convert with ``int()``. ClickHouse writes String bytes as they
    are; bytes that are not UTF-8 (a CSV header in Latin-1) come back as U+FFFD."""
    body = backend.query_formatted(sql, "JSONEachRow").body.decode("utf-8", errors="replace")
    return [json.loads(line) for line in body.splitlines() if line.strip()]


def _install_sql_functions(run, definitions: list[tuple[str, str]]) -> None:
    for name, statement in definitions:
        run(statement.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1))


#: Written into an embedded store's user_defined/ after the dp_* functions were (re)created there.
FUNCTIONS_MARKER = ".dpch_functions.sha256"


def _functions_digest(store: Path, definitions: list[tuple[str, str]]) -> str | None:
    """sha256 over this installation's definitions and the files ClickHouse keeps for them in the
    store (store/user_defined/function_<name>.sql); None if one of those files is missing."""
    h = hashlib.sha256()
    for name, statement in definitions:
        try:
            stored = (store / "user_defined" / f"function_{name}.sql").read_bytes()
        except OSError:
            return None
        h.update(f"{name}\0{statement}\0".encode() + stored + b"\0")
    return h.hexdigest()


def install_store_functions(run, store: Path, definitions: list[tuple[str, str]] | None = None) -> None:
    """Create the dp_* SQL functions in an embedded store unless the store already holds exactly
    what this installation created there last time (FUNCTIONS_MARKER: the digest of our
    definitions and of ClickHouse's stored files, so a changed definition, a dropped function or
    an edited stored file re-creates them all). Saves ~30 statements (about 0.2 s) per open."""
    definitions = definitions or sql_function_definitions()
    marker = store / "user_defined" / FUNCTIONS_MARKER
    digest = _functions_digest(store, definitions)
    try:
        if digest is not None and marker.read_text() == digest:
            return
    except OSError:
        pass
    _install_sql_functions(run, definitions)
    digest = _functions_digest(store, definitions)
    if digest is not None:
        marker.write_text(digest)


class EmbeddedBackend:
    """chDB in a data directory. One process can hold one chDB store at a time (see DESIGN.md), so
    sessions are shared per path and refcounted; statements are serialised with a lock."""

    kind = "embedded"
    _open: dict[Path, "EmbeddedBackend"] = {}
    _registry_lock = threading.Lock()

    def __init__(self, data_dir: Path):
        from chdb import session as chdb_session

        from .datadir import check_store_free

        self.data_dir = data_dir
        check_store_free(data_dir)  # before chDB, which prints a raw "Cannot lock file" line to stderr
        data_dir.mkdir(parents=True, exist_ok=True)
        udf_dir = prepare_embedded_udf_dir(data_dir)
        self._lock = threading.RLock()
        self._refs = 0
        try:
            self._session = chdb_session.Session(f"{data_dir / 'store'}?udf_path={udf_dir}")
        except Exception as exc:  # e.g. another process holds this store
            from .datadir import store_in_use_error

            in_use = store_in_use_error(data_dir)
            if in_use is not None:
                raise in_use from None
            raise BackendError(f"cannot open the embedded engine at {data_dir}: {exc}") from exc
        install_store_functions(self.command, data_dir / "store")
        # public key domains are inlined as array literals (up to MAX_PUBLIC_KEYS values): the
        # default 256 KiB query size would refuse a rewritten query over a large domain
        self.command(f"SET max_query_size = {MAX_QUERY_SIZE}")

    @classmethod
    def open(cls, data_dir: Path) -> "EmbeddedBackend":
        data_dir = data_dir.resolve()
        with cls._registry_lock:
            backend = cls._open.get(data_dir)
            if backend is None:
                if cls._open:
                    other = next(iter(cls._open))
                    raise BackendError(
                        f"this process already has the embedded engine open at {other}; "
                        "close that connection first (chDB holds one store per process)")
                backend = cls(data_dir)
                cls._open[data_dir] = backend
            backend._refs += 1
            return backend

    def _run(self, sql: str, fmt: str):
        with self._lock:
            try:
                return self._session.query(sql, fmt)
            except Exception as exc:
                raise BackendError(str(exc)) from exc

    def query_df(self, sql: str) -> pd.DataFrame:
        return self._run(sql, "DataFrame")

    def query_formatted(self, sql: str, fmt: str) -> Formatted:
        res = self._run(sql, fmt)
        return Formatted(res.bytes(), int(res.rows_read()))  # chDB's rows_read: rows of the result

    def command(self, sql: str) -> None:
        self._run(sql, "CSV")

    def insert_df(self, table: str, df: pd.DataFrame) -> None:
        self.command_on_data(f"INSERT INTO {table} SELECT * FROM Python(dpch_source)", df)

    def command_on_data(self, sql: str, data, progress=None) -> None:
        """Run ``sql`` that reads ``Python(dpch_source)``: a pandas DataFrame or Arrow table.
        chDB resolves ``Python(name)`` from the calling frame's variables, so the frame variable is
        bound here (no leading double underscore: inside a class that name would be mangled)."""
        dpch_source = data  # noqa: F841
        self._run_with_progress(sql, progress)

    def render_data(self, sql: str, data, fmt: str) -> bytes:
        """Run ``sql`` that reads ``Python(dpch_source)`` (a DataFrame of released values) and return
        ClickHouse's own rendering of the result in ``fmt`` (the gateway's output formats)."""
        dpch_source = data  # noqa: F841  (chDB walks up the stack from _run to this frame)
        return self._run(sql, fmt).bytes()

    def command_with_progress(self, sql: str, progress=None) -> None:
        """Run a statement; ``progress(read_bytes, total_bytes)`` is called as ClickHouse reads."""
        self._run_with_progress(sql, progress)

    def _run_with_progress(self, sql: str, progress) -> None:
        with self._lock:
            conn = getattr(self._session, "_conn", None)
            hook = progress is not None and hasattr(conn, "set_progress_callback")
            if hook:
                conn.set_progress_callback(
                    lambda p: progress(int(p.get("read_bytes", 0)), int(p.get("total_bytes_to_read", 0))))
            try:
                # the frame variable of command_on_data must be visible from here: chDB walks up
                # the stack to find it
                self._session.query(sql, "CSV")
            except Exception as exc:
                raise BackendError(str(exc)) from exc
            finally:
                if hook:
                    conn.set_progress_callback(None)

    def close(self) -> None:
        with self._registry_lock:
            self._refs -= 1
            if self._refs > 0:
                return
            self._open.pop(self.data_dir, None)
            with self._lock:
                self._session.close()


#: The largest query text (bytes) the engines accept from DPCH (ClickHouse's max_query_size).
MAX_QUERY_SIZE = 64 << 20


@dataclass
class ServerBackend:
    """A ClickHouse server through clickhouse-connect (HTTP). The server must have
    clickhouse_config deployed (see README, "Server deployment")."""

    url: str
    user: str = "default"
    password: str = ""
    database: str = "default"
    kind: str = "server"

    def __post_init__(self):
        import clickhouse_connect

        try:
            self._client = clickhouse_connect.get_client(
                dsn=self.url, username=self.user, password=self.password, database=self.database,
                settings={"max_query_size": MAX_QUERY_SIZE})  # as the embedded engine's
        except Exception as exc:
            raise BackendError(f"cannot connect to ClickHouse server {self.url}: {exc}") from exc

    def query_df(self, sql: str) -> pd.DataFrame:
        try:
            return self._client.query_df(sql)
        except Exception as exc:
            raise BackendError(str(exc)) from exc

    def query_formatted(self, sql: str, fmt: str) -> Formatted:
        try:
            return Formatted(self._client.raw_query(sql, fmt=fmt), None)
        except Exception as exc:
            raise BackendError(str(exc)) from exc

    def command(self, sql: str) -> None:
        try:
            self._client.command(sql)
        except Exception as exc:
            raise BackendError(str(exc)) from exc

    def insert_df(self, table: str, df: pd.DataFrame) -> None:
        try:
            self._client.insert_df(table, df)
        except Exception as exc:
            raise BackendError(str(exc)) from exc

    def install_sql_functions(self) -> None:
        """Create (or replace) the dp_* SQL functions on the server. Admin only."""
        _install_sql_functions(self.command, sql_function_definitions())

    def close(self) -> None:
        self._client.close()
