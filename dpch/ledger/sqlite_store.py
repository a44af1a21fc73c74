"""Single-host ledger store: SQLite in WAL mode, `synchronous=FULL`, `BEGIN IMMEDIATE` writes.

Concurrency model (docs/LEDGER.md, "Concurrency"):
- **One connection per ledger file per process.** Every `SQLiteLedgerStore` (every `Ledger`
  handle) on the same file in one process shares one `_SharedConnection`, found by the file's
  (device, inode). Threads serialize on its lock; processes serialize on SQLite's own locks.
- **No foreign descriptors.** POSIX advisory locks belong to the (process, file) pair: closing ANY
  descriptor of the ledger file drops every lock SQLite holds on it in this process, after which
  another process may think it is the last user and delete the WAL under us (issue 18). So this
  module never opens the ledger, its -wal or its -shm with anything but SQLite: the file checks use
  `os.stat` and SQLite pragmas, copies use SQLite's backup API.
- **Fail closed on a lost WAL.** The connection records the identity of the -wal file it writes to
  and re-checks it around every write. If the file was unlinked or replaced, the commit may have
  gone to an orphaned file: the store refuses to continue (LedgerError), so no query runs on a
  charge that may not be durable.
- **fork.** A child process never uses its parent's connection: the registry is emptied in the
  child, and a handle inherited from the parent raises LedgerError.
"""
from __future__ import annotations

import contextlib
import os
import random
import sqlite3
import threading
import time
import uuid
from pathlib import Path
from typing import Callable, TypeVar

from ..errors import Advice, LedgerError
from .records import APP_NAME, APPLICATION_ID, SCHEMA_VERSION
from .sqlite_txn import COLUMNS, SCHEMA, STATE_COLUMNS, STATE_TABLE, SQLiteTxn
from .store import check_rows

T = TypeVar("T")

_REGISTRY: dict[tuple[int, int], "_SharedConnection"] = {}
_REGISTRY_LOCK = threading.RLock()  # re-entrant: a handle's __del__ may run while this thread holds it


def _reset_registry_in_child() -> None:
    global _REGISTRY_LOCK
    _REGISTRY.clear()
    _REGISTRY_LOCK = threading.RLock()


os.register_at_fork(after_in_child=_reset_registry_in_child)


def _wal_path(path: Path) -> Path:
    return Path(str(path) + "-wal")


def _file_id(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def _unreadable(path: Path, exc: BaseException) -> LedgerError:
    return LedgerError(f"ledger {path} is unreadable ({exc}); refusing to answer queries. "
                       f"Restore it from a backup; it is never reset automatically")


def create_ledger_file(path: Path, populate: Callable[[sqlite3.Connection], None] | None = None) -> bool:
    """Create an empty ledger atomically: build it under a temporary name, then hard-link it into
    place (fails if another process won the race; the caller then opens theirs). The new file is
    never opened by anything but SQLite, and its contents are synced by SQLite's own checkpoint.
    ``populate`` (a copy from another store) fills the new tables instead of starting an empty
    event chain. Returns False if the name was taken meanwhile."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        conn = sqlite3.connect(str(tmp), isolation_level=None)
        try:
            conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
            conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("BEGIN")
            for stmt in SCHEMA:
                conn.execute(stmt)
            if populate is not None:
                populate(conn)
            else:
                conn.execute("INSERT INTO meta VALUES ('app', ?), ('schema_version', ?)", (APP_NAME, str(SCHEMA_VERSION)))
                txn = SQLiteTxn(conn, path)
                txn.init_event_chain()
                txn.add_event("ledger_created", None, None, None, {"schema_version": SCHEMA_VERSION})
            conn.execute("COMMIT")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # pages into the main file, fsynced (FULL)
        finally:
            conn.close()
        linked = True
        try:
            os.link(tmp, path)
        except FileExistsError:
            linked = False
        dir_fd = os.open(str(path.parent), os.O_RDONLY)  # the directory, not the ledger: makes the link durable
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    finally:
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(str(tmp) + suffix)
    return linked


class _SharedConnection:
    """This process's one SQLite connection to one ledger file, shared by every handle on it."""

    def __init__(self, path: Path, key: tuple[int, int], timeout: float):
        self.path = path
        self.key = key
        self.timeout = timeout
        self.pid = os.getpid()
        self.lock = threading.RLock()
        self.refs = 0
        self.row_cache: dict = {}  # verified charge rows, keyed by their raw bytes (SQLiteTxn)
        self.broken: str | None = None
        self.wal_id: tuple[int, int] | None = None
        self.conn: sqlite3.Connection | None = None
        try:
            self.conn = sqlite3.connect(str(path), timeout=timeout, isolation_level=None, check_same_thread=False)
            self.conn.execute(f"PRAGMA busy_timeout={int(timeout * 1000)}")
            self.conn.execute("PRAGMA synchronous=FULL")
            self.conn.execute("PRAGMA trusted_schema=OFF")
            self._check_file()
            self._check_schema()
            self._upgrade()
        except sqlite3.DatabaseError as exc:
            self.close()
            if "not a database" in str(exc):
                raise LedgerError(f"ledger {path} is not an SQLite database (bad header: corrupted or foreign "
                                  f"file); refusing to answer queries") from None
            raise _unreadable(path, exc) from None
        except sqlite3.Error as exc:
            self.close()
            raise _unreadable(path, exc) from None
        except BaseException:
            self.close()
            raise

    # -- opening checks (through SQLite only) ---------------------------------------------------
    def _check_file(self) -> None:
        """The header and size, read through SQLite: a foreign file or a truncated ledger is an
        error, never an empty ledger. Records the WAL's identity."""
        conn = self.conn
        assert conn is not None
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        if app_id != APPLICATION_ID:
            raise LedgerError(f"ledger {self.path} is an SQLite database but not a DPCH ledger (application id "
                              f"{app_id:#x}); wrong schema, refusing to use it")
        conn.execute("BEGIN")
        try:
            # inside one read snapshot: the WAL (opened by this read) cannot shrink to empty while
            # we read, so "WAL empty" below means the snapshot's size came from the file's header
            page_count = conn.execute("PRAGMA page_count").fetchone()[0]
            page_size = conn.execute("PRAGMA page_size").fetchone()[0]
            wal = _wal_path(self.path)
            wal_size = wal.stat().st_size if wal.exists() else 0
            size = os.stat(self.path).st_size
            if wal_size == 0 and size < page_count * page_size:
                raise LedgerError(f"ledger {self.path} is truncated ({size} bytes, header says "
                                  f"{page_count * page_size}); refusing to answer queries. Restore it from a backup")
            mode = str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower()
            if mode == "wal":
                self.wal_id = _file_id(wal)
        finally:
            conn.execute("ROLLBACK")

    def _check_schema(self) -> None:
        conn = self.conn
        assert conn is not None
        problems = [r[0] for r in conn.execute("PRAGMA quick_check")]
        if problems != ["ok"]:
            raise LedgerError(f"ledger {self.path} failed its integrity check ({'; '.join(map(str, problems[:3]))}); "
                              f"refusing to answer queries. Restore it from a backup")
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        missing = set(COLUMNS) - tables
        if missing:
            raise LedgerError(f"ledger {self.path} has the wrong schema (missing tables: {', '.join(sorted(missing))})")
        for table, cols in COLUMNS.items():
            have = [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]
            if have != cols:
                raise LedgerError(f"ledger {self.path} has the wrong schema (table {table} has columns {have})")
        if "budget_state" in tables and [r[1] for r in conn.execute("PRAGMA table_info(budget_state)")] != STATE_COLUMNS:
            raise LedgerError(f"ledger {self.path} has the wrong schema (table budget_state)")
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        if meta.get("app") != APP_NAME:
            raise LedgerError(f"ledger {self.path} has the wrong schema (not a DPCH ledger)")
        if meta.get("schema_version") not in ("1", str(SCHEMA_VERSION)):
            raise LedgerError(f"ledger {self.path} has schema version {meta.get('schema_version')!r}; this DPCH "
                              f"reads versions 1 and {SCHEMA_VERSION}. Refusing to use it")
        # created in WAL mode (persistent in the file); checked after the schema so that opening a
        # foreign file never modifies it
        mode = str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower()
        if mode != "wal" or self.wal_id is None:
            raise LedgerError(f"ledger {self.path} is not in WAL mode ({mode}); it was not created by DPCH")

    def _upgrade(self) -> None:
        """Schema 1 → 2: start the event chain over the events stored so far (logged). Any schema:
        add the incremental-state table if it is missing (its rows are recomputed when absent)."""
        if self.conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='budget_state'").fetchone() is None:
            self.transaction(lambda txn: txn.conn.execute(STATE_TABLE))
        def fn(txn: SQLiteTxn) -> None:
            version = txn.conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0]
            if version == "1":
                txn.init_event_chain()
                txn.conn.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION),))
                txn.add_event("schema_upgraded", None, None, None, {"from": 1, "to": SCHEMA_VERSION})
        if self.conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == "1":
            self.transaction(fn)

    # -- the WAL's identity -------------------------------------------------------------------
    def _check_wal(self) -> None:
        if self.broken is None and _file_id(_wal_path(self.path)) != self.wal_id:
            self.broken = (f"ledger {self.path}: its write-ahead log was removed or replaced while this process "
                           f"had it open (another program closed a descriptor of the ledger file, or deleted "
                           f"files beside it); a charge may not be durable, so nothing more is answered through "
                           f"this handle. Close every handle and reopen the ledger")
        if self.broken is not None:
            raise LedgerError(self.broken)

    def _usable(self) -> sqlite3.Connection:
        if self.pid != os.getpid():
            raise LedgerError(f"ledger {self.path} was opened in a parent process; open a new Ledger after fork")
        if self.conn is None:
            raise LedgerError(f"ledger {self.path} is closed")
        return self.conn

    # -- transactions -------------------------------------------------------------------------
    def _begin_immediate(self, conn: sqlite3.Connection) -> None:
        """Take the write lock. SQLite's own busy handler backs off up to 100 ms per sleep, which
        leaves the lock idle under contention; retry here with sub-millisecond jittered sleeps."""
        deadline = time.monotonic() + self.timeout
        conn.execute("PRAGMA busy_timeout=0")
        try:
            while True:
                try:
                    conn.execute("BEGIN IMMEDIATE")
                    return
                except sqlite3.OperationalError as exc:
                    msg = str(exc).lower()
                    if ("locked" in msg or "busy" in msg) and time.monotonic() < deadline:
                        time.sleep(random.uniform(0.0001, 0.001))
                        continue
                    raise LedgerError(f"ledger {self.path} is busy or unreadable ({exc}); the query was not "
                                      f"charged and must not run") from None
                except sqlite3.Error as exc:
                    raise _unreadable(self.path, exc) from None
        finally:
            with contextlib.suppress(sqlite3.Error):
                conn.execute(f"PRAGMA busy_timeout={int(self.timeout * 1000)}")

    def transaction(self, fn: Callable[[SQLiteTxn], T], *, durable: bool = True) -> T:
        with self.lock:
            conn = self._usable()
            if durable:
                return self._transaction(conn, fn)
            conn.execute("PRAGMA synchronous=NORMAL")  # this commit does not wait for its fsync
            try:
                return self._transaction(conn, fn)
            finally:
                try:
                    conn.execute("PRAGMA synchronous=FULL")
                except sqlite3.Error as exc:  # later charges must never commit without an fsync
                    self.broken = f"ledger {self.path}: could not restore synchronous=FULL ({exc})"

    def _transaction(self, conn: sqlite3.Connection, fn: Callable[[SQLiteTxn], T]) -> T:
        self._check_wal()
        self._begin_immediate(conn)
        try:
            result = fn(SQLiteTxn(conn, self.path, self.row_cache))
            self._check_wal()  # the write lock is held: the WAL we are about to commit to is live
            conn.execute("COMMIT")
        except BaseException as exc:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise LedgerError(f"ledger {self.path} failed during a transaction ({exc}); nothing was "
                                  f"recorded and the query must not run") from None
            raise
        self._check_wal()  # after the commit: a WAL unlinked meanwhile means it may be lost
        return result

    def read(self, fn: Callable[[SQLiteTxn], T]) -> T:
        with self.lock:
            conn = self._usable()
            self._check_wal()
            try:
                conn.execute("BEGIN")
                try:
                    return fn(SQLiteTxn(conn, self.path, self.row_cache))
                finally:
                    conn.execute("ROLLBACK")
            except sqlite3.Error as exc:
                raise _unreadable(self.path, exc) from None

    def verify(self) -> None:
        """Page integrity, every row's checksum, the event chain, and the running totals."""
        with self.lock:
            conn = self._usable()
            try:
                problems = [r[0] for r in conn.execute("PRAGMA quick_check")]
            except sqlite3.Error as exc:
                raise _unreadable(self.path, exc) from None
            if problems != ["ok"]:
                raise LedgerError(f"ledger {self.path} failed its integrity check ({'; '.join(map(str, problems[:3]))})")
        self.read(lambda txn: check_rows(txn, self.path))

    def backup(self, dest: Path) -> None:
        """A consistent copy through SQLite's online backup API (never a file copy of a live ledger)."""
        if dest.exists():
            raise LedgerError(f"backup target {dest} exists; refusing to overwrite it")
        with self.lock:
            conn = self._usable()
            self._check_wal()
            target = sqlite3.connect(str(dest), isolation_level=None)
            try:
                conn.backup(target)
                target.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error as exc:
                raise LedgerError(f"backup of ledger {self.path} to {dest} failed ({exc})") from None
            finally:
                target.close()

    def close(self) -> None:
        with self.lock:
            if self.conn is not None:
                if self.pid == os.getpid():
                    with contextlib.suppress(sqlite3.Error):
                        self.conn.close()
                self.conn = None


def _acquire(path: Path, create: bool, timeout: float) -> _SharedConnection:
    with _REGISTRY_LOCK:
        key = _file_id(path)
        if key is None:
            if not create:
                raise LedgerError(f"ledger not found at {path}; no query can be answered.", advice=Advice(
                    python=f"Create it with Ledger({str(path)!r}, create=True).",
                    cli=f"Create it with `dpch budget set ... --ledger {path}`.",
                    gateway="Ask the gateway's administrator to create the ledger (dpch budget set)."))
            create_ledger_file(path)
            key = _file_id(path)
            if key is None:
                raise LedgerError(f"ledger {path} vanished right after it was created")
        _check_single_name(path)
        shared = _REGISTRY.get(key)
        if shared is not None and _file_id(_wal_path(path)) != shared.wal_id:
            # not the file that connection has open (a deleted ledger's inode reused by a new file,
            # or a lost WAL): leave that connection to its handles, open the file anew
            shared.broken = shared.broken or f"ledger {shared.path}: the file was replaced while open"
        if shared is None or shared.conn is None or shared.broken is not None:
            try:
                size = os.stat(path).st_size
            except OSError as exc:
                raise LedgerError(f"ledger {path} cannot be read ({exc.strerror}); refusing to answer queries") from None
            if size < 100:  # SQLite would take a short file for a new, empty database
                raise LedgerError(f"ledger {path} is truncated ({size} bytes); refusing to answer queries. "
                                  f"Restore it from a backup; it is never reset automatically")
            shared = _SharedConnection(path, key, timeout)
            _REGISTRY[key] = shared
        shared.refs += 1
        return shared


def _check_single_name(path: Path) -> None:
    """SQLite names the WAL after the path it was given: one ledger reached under two hard-linked
    names would have two WALs and be corrupted. (A hard link exists for an instant while a new
    ledger is linked into place: retry briefly before refusing.)"""
    for _ in range(20):
        if os.stat(path).st_nlink <= 1:
            return
        time.sleep(0.005)
    raise LedgerError(f"ledger {path} has {os.stat(path).st_nlink} hard links; SQLite keeps the write-ahead log by "
                      f"file name, so a ledger must be opened under one name only. Remove the other links")


def _release(shared: _SharedConnection) -> None:
    with _REGISTRY_LOCK:
        shared.refs -= 1
        if shared.refs <= 0:
            shared.close()
            if _REGISTRY.get(shared.key) is shared:
                del _REGISTRY[shared.key]


class SQLiteLedgerStore:
    """A handle on the single-host ledger store (module docstring): SQLite in WAL mode with
    synchronous=FULL (a committed charge survives a crash or power loss before the query runs),
    `BEGIN IMMEDIATE` so that the read of the budget and the write of the charge are serialized with
    every other writer (threads and processes), per-row checksums and an event chain so that
    corrupted or deleted bytes are detected rather than trusted. Handles on the same file in one
    process share one connection."""

    def __init__(self, path: str | os.PathLike, *, create: bool = True, timeout: float = 60.0):
        self.path = Path(path)
        # symlinks resolved: SQLite derives the -wal name from the path, so use the real one
        self._shared: _SharedConnection | None = _acquire(Path(os.path.realpath(self.path)), create, timeout)

    def _live(self) -> _SharedConnection:
        if self._shared is None:
            raise LedgerError(f"ledger {self.path} is closed")
        return self._shared

    def transaction(self, fn: Callable[[SQLiteTxn], T], *, durable: bool = True) -> T:
        """``durable=False``: the commit does not wait for its fsync (WAL, synchronous=NORMAL). It
        stays atomic and is made durable by the next durable commit or checkpoint; a power loss
        may undo it. Only for records whose loss is conservative (a query's outcome mark)."""
        return self._live().transaction(fn, durable=durable)

    def read(self, fn: Callable[[SQLiteTxn], T]) -> T:
        return self._live().read(fn)

    def verify(self) -> None:
        self._live().verify()

    def backup(self, dest: str | os.PathLike) -> None:
        self._live().backup(Path(dest))

    def close(self) -> None:
        shared, self._shared = self._shared, None
        if shared is not None:
            _release(shared)

    def __del__(self) -> None:  # a handle dropped without close() still gives its reference back
        with contextlib.suppress(Exception):
            self.close()
