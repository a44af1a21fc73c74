"""Shared ledger store: PostgreSQL, for several gateways on one ledger (issue 32 item 4).

The same records, checksums, event chain and incremental state as the SQLite store
(`PostgresTxn` is `SQLiteTxn` with PostgreSQL's placeholders and id sequences). What differs:
- **A charge is one SERIALIZABLE transaction.** Two gateways that charge the same budget at once
  both read its state; PostgreSQL lets at most one of them commit and aborts the other with a
  serialization failure (SQLSTATE 40001) or a deadlock (40P01). That transaction wrote nothing; it
  is retried from the start with jittered exponential back-off, a bounded number of times and
  within `timeout`. Exhausted retries raise LedgerError: the query was not charged and must not run.
- **Writers take turns first.** Every write transaction updates the event chain's head, so any two
  conflict whatever budgets they charge; left to SERIALIZABLE alone, 48 clients mostly abort each
  other (bench/RESULTS.md). A writer therefore takes a session-level advisory lock before BEGIN
  (so its snapshot is taken once the previous writer committed) and releases it after COMMIT or
  ROLLBACK; PostgreSQL releases it too when a gateway dies. The lock only avoids wasted work:
  correctness rests on SERIALIZABLE and the retries (`serialize_writers=False` runs without it,
  and the tests do). Waiting longer than `timeout` for it raises LedgerError (lock_timeout).
- **Durable or refused.** The session runs with `synchronous_commit = on`, and a server with
  `fsync = off` is refused: a charge is on stable storage before the query runs. Any other database
  error, including a lost connection during COMMIT (outcome unknown), raises LedgerError.
- **One connection per handle**, used by one thread at a time (threads serialize on its lock,
  processes and hosts on PostgreSQL's own concurrency control). A handle inherited across fork
  refuses to work.
- The schema is created on first use under a transaction-level advisory lock (several gateways may
  start at once). Use a database of its own: the tables have plain names (meta, budgets, ...).
- `backup` writes one REPEATABLE READ snapshot as an SQLite ledger file (rows and checksums copied
  verbatim), which `dpch budget verify --ledger FILE` checks and any DPCH opens; pg_dump is the
  database's own alternative.
"""
from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path
from typing import Callable, TypeVar

from ..errors import LedgerError
from .records import APP_NAME, SCHEMA_VERSION
from .sqlite_txn import COLUMNS, STATE_COLUMNS, SQLiteTxn
from .store import check_rows

T = TypeVar("T")

RETRYABLE = ("40001", "40P01")  # serialization_failure, deadlock_detected: the transaction was rolled back
MAX_ATTEMPTS = 200
_SCHEMA_LOCK = 0x44504348  # advisory lock key while creating the schema ("DPCH")
_WRITER_LOCK = 0x44504349  # advisory lock key that writers take in turn (module docstring)

_REAL = "DOUBLE PRECISION"
SCHEMA = [
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    f"""CREATE TABLE budgets (
        analyst TEXT NOT NULL, dataset TEXT NOT NULL,
        epsilon {_REAL} NOT NULL, delta {_REAL} NOT NULL, accountant TEXT NOT NULL, params TEXT NOT NULL,
        generation BIGINT NOT NULL,
        spent_epsilon {_REAL} NOT NULL, spent_delta {_REAL} NOT NULL, spent_rho {_REAL} NOT NULL,
        n_charges BIGINT NOT NULL, created_at {_REAL} NOT NULL, updated_at {_REAL} NOT NULL,
        checksum TEXT NOT NULL, PRIMARY KEY (analyst, dataset))""",
    "CREATE SEQUENCE charges_id_seq",
    f"""CREATE TABLE charges (
        id BIGINT PRIMARY KEY,
        analyst TEXT NOT NULL, dataset TEXT NOT NULL, generation BIGINT NOT NULL,
        accountant TEXT NOT NULL, mechanisms TEXT NOT NULL, summary TEXT NOT NULL,
        epsilon {_REAL} NOT NULL, delta {_REAL} NOT NULL, rho {_REAL},
        realized TEXT,
        eff_epsilon {_REAL} NOT NULL, eff_delta {_REAL} NOT NULL, eff_rho {_REAL},
        query_hash TEXT NOT NULL, query_text TEXT NOT NULL,
        outcome TEXT NOT NULL CHECK (outcome IN ('reserved', 'executed', 'failed', 'settled')),
        created_at {_REAL} NOT NULL, updated_at {_REAL} NOT NULL,
        checksum TEXT NOT NULL)""",
    "CREATE INDEX charges_by_budget ON charges (analyst, dataset, generation, id)",
    "CREATE SEQUENCE events_id_seq",
    f"""CREATE TABLE events (
        id BIGINT PRIMARY KEY, ts {_REAL} NOT NULL, kind TEXT NOT NULL,
        analyst TEXT, dataset TEXT, charge_id BIGINT, detail TEXT NOT NULL,
        checksum TEXT NOT NULL)""",
    "CREATE INDEX events_by_charge ON events (charge_id)",
    """CREATE TABLE budget_state (
        analyst TEXT NOT NULL, dataset TEXT NOT NULL, generation BIGINT NOT NULL,
        state TEXT NOT NULL, checksum TEXT NOT NULL,
        PRIMARY KEY (analyst, dataset, generation))""",
]
_ALL_COLUMNS = {**COLUMNS, "budget_state": STATE_COLUMNS}


def redact(url: str) -> str:
    """The URL without its password, for messages (errors never show credentials)."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        d = conninfo_to_dict(url)
    except Exception:  # noqa: BLE001 - a malformed URL is named generically
        return "postgresql://(unparsable URL)"
    host = d.get("host") or "localhost"
    port = f":{d['port']}" if d.get("port") else ""
    user = f"{d['user']}@" if d.get("user") else ""
    return f"postgresql://{user}{host}{port}/{d.get('dbname', '')}"


class _Dialect:
    """The connection as `SQLiteTxn` uses it: ``execute(sql, params)`` with ``?`` placeholders."""

    def __init__(self, conn):
        self.conn = conn

    def execute(self, sql: str, params=()):
        return self.conn.execute(sql.replace("?", "%s"), params)


class PostgresTxn(SQLiteTxn):
    """The `LedgerTxn` of `PostgresLedgerStore`: SQLiteTxn's rows and checks in PostgreSQL."""

    def _next_id(self, table: str) -> int:
        # a sequence: never reused, not rolled back (gaps are harmless, like SQLite's AUTOINCREMENT)
        return int(self.conn.execute(f"SELECT nextval('{table}_id_seq')").fetchone()[0])


class PostgresLedgerStore:
    """A handle on a PostgreSQL ledger (module docstring). ``url``: a libpq URL or conninfo."""

    def __init__(self, url: str, *, create: bool = True, timeout: float = 60.0, max_attempts: int = MAX_ATTEMPTS,
                 serialize_writers: bool = True):
        import psycopg

        self._psycopg = psycopg
        self.path = redact(url)  # named `path` like the SQLite store's: messages say which ledger
        self.timeout = timeout
        self.max_attempts = max_attempts
        self.serialize_writers = serialize_writers
        self.pid = os.getpid()
        self.lock = threading.RLock()
        self.row_cache: dict = {}
        self.retries = 0  # serialization failures retried so far (bench/bench_ledger.py reports it)
        try:
            self.conn = psycopg.connect(url, autocommit=True, connect_timeout=max(1, int(timeout)))
        except psycopg.Error as exc:
            raise LedgerError(f"ledger {self.path} cannot be reached ({exc.__class__.__name__}); refusing to answer "
                              f"queries") from None
        try:
            self._check_durability()
            self._ensure_schema(create)
        except psycopg.Error as exc:
            self.close()
            raise LedgerError(f"ledger {self.path} is unreadable ({exc.__class__.__name__}: {exc.sqlstate}); "
                              f"refusing to answer queries") from None
        except BaseException:
            self.close()
            raise

    # -- opening ------------------------------------------------------------------------------
    def _check_durability(self) -> None:
        self.conn.execute("SET synchronous_commit TO on")
        self.conn.execute(f"SET lock_timeout TO {max(1, int(self.timeout * 1000))}")
        fsync = self.conn.execute("SHOW fsync").fetchone()[0]
        if str(fsync).lower() != "on":
            raise LedgerError(f"ledger {self.path}: the server runs with fsync = {fsync}; a charge would not be durable "
                              f"before its query runs. Refusing to use it")

    def _tables(self) -> set[str]:
        rows = self.conn.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()")
        return {r[0] for r in rows}

    def _ensure_schema(self, create: bool) -> None:
        if "meta" not in self._tables():
            if not create:
                raise LedgerError(f"ledger not found at {self.path} (no DPCH tables); no query can be answered")
            with self.conn.transaction():
                self.conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
                if "meta" not in self._tables():  # another gateway may have created it meanwhile
                    for stmt in SCHEMA:
                        self.conn.execute(stmt)
                    self.conn.execute("INSERT INTO meta VALUES ('app', %s), ('schema_version', %s)",
                                      (APP_NAME, str(SCHEMA_VERSION)))
                    txn = PostgresTxn(_Dialect(self.conn), Path(self.path))
                    txn.init_event_chain()
                    txn.add_event("ledger_created", None, None, None, {"schema_version": SCHEMA_VERSION,
                                                                        "store": "postgresql"})
        self._check_schema()

    def _check_schema(self) -> None:
        meta = dict(self.conn.execute("SELECT key, value FROM meta").fetchall())
        if meta.get("app") != APP_NAME:
            raise LedgerError(f"ledger {self.path} has the wrong schema (not a DPCH ledger)")
        if meta.get("schema_version") != str(SCHEMA_VERSION):
            raise LedgerError(f"ledger {self.path} has schema version {meta.get('schema_version')!r}; this DPCH "
                              f"reads version {SCHEMA_VERSION}. Refusing to use it")
        for table, cols in _ALL_COLUMNS.items():
            have = [r[0] for r in self.conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() "
                "AND table_name = %s ORDER BY ordinal_position", (table,))]
            if have != cols:
                raise LedgerError(f"ledger {self.path} has the wrong schema (table {table} has columns {have})")

    # -- transactions -------------------------------------------------------------------------
    def _usable(self):
        if self.pid != os.getpid():
            raise LedgerError(f"ledger {self.path} was opened in a parent process; open a new Ledger after fork")
        if self.conn is None or self.conn.closed:
            raise LedgerError(f"ledger {self.path} is closed")
        return self.conn

    def transaction(self, fn: Callable[[PostgresTxn], T], *, durable: bool = True) -> T:
        """fn in one SERIALIZABLE transaction, retried from the start after a serialization failure
        or deadlock (module docstring). ``durable=False``: this commit does not wait for the WAL
        flush (`synchronous_commit = off` for this transaction only): atomic still, for records whose
        loss is conservative (a query's outcome mark)."""
        if not self.serialize_writers:
            return self._run(fn, "BEGIN ISOLATION LEVEL SERIALIZABLE", durable)
        with self.lock:
            conn = self._usable()
            try:
                conn.execute("SELECT pg_advisory_lock(%s)", (_WRITER_LOCK,))
            except self._psycopg.Error as exc:
                raise LedgerError(f"ledger {self.path} is busy ({exc.__class__.__name__}, SQLSTATE {exc.sqlstate}); the "
                                  f"query was not charged and must not run") from None
            try:
                return self._run(fn, "BEGIN ISOLATION LEVEL SERIALIZABLE", durable)
            finally:
                try:
                    conn.execute("SELECT pg_advisory_unlock(%s)", (_WRITER_LOCK,))
                except self._psycopg.Error:
                    self.close()  # the session (and its lock) ends: never leave the lock held

    def read(self, fn: Callable[[PostgresTxn], T]) -> T:
        """fn on one consistent snapshot (REPEATABLE READ, READ ONLY: never aborted for serialization)."""
        return self._run(fn, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", True)

    def _run(self, fn, begin: str, durable: bool):
        psycopg = self._psycopg
        deadline = time.monotonic() + self.timeout
        with self.lock:
            conn = self._usable()
            for attempt in range(self.max_attempts):
                try:
                    conn.execute(begin)
                    try:
                        if not durable:
                            conn.execute("SET LOCAL synchronous_commit TO off")
                        result = fn(PostgresTxn(_Dialect(conn), Path(self.path), self.row_cache))
                    except BaseException:
                        conn.execute("ROLLBACK")
                        raise
                    conn.execute("COMMIT")
                    return result
                except psycopg.Error as exc:
                    if not conn.closed and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                        try:
                            conn.execute("ROLLBACK")
                        except psycopg.Error:
                            pass
                    if exc.sqlstate in RETRYABLE and time.monotonic() < deadline:
                        self.retries += 1
                        # full jitter, exponential up to 50 ms: the conflicting writer commits meanwhile
                        time.sleep(random.uniform(0, min(0.05, 0.0005 * 2 ** min(attempt, 7))))
                        continue
                    raise LedgerError(f"ledger {self.path} failed during a transaction ({exc.__class__.__name__}, "
                                      f"SQLSTATE {exc.sqlstate}); nothing was recorded and the query must not run"
                                      ) from None
            raise LedgerError(f"ledger {self.path} is busy: {self.max_attempts} attempts ended in serialization "
                              f"failures; the query was not charged and must not run")

    # -- checks and copies --------------------------------------------------------------------
    def verify(self) -> None:
        """Schema, every row's checksum, the event chain, and the running totals."""
        with self.lock:
            self._usable()
            try:
                self._check_schema()
            except self._psycopg.Error as exc:
                raise LedgerError(f"ledger {self.path} is unreadable ({exc.__class__.__name__})") from None
        self.read(lambda txn: check_rows(txn, self.path))

    def backup(self, dest: str | os.PathLike) -> None:
        """One REPEATABLE READ snapshot written as an SQLite ledger file (module docstring)."""
        from .sqlite_store import create_ledger_file

        dest = Path(dest)
        if dest.exists():
            raise LedgerError(f"backup target {dest} exists; refusing to overwrite it")

        def snapshot(txn: PostgresTxn) -> dict[str, list[tuple]]:
            return {t: txn.conn.execute(f"SELECT {', '.join(cols)} FROM {t} ORDER BY 1").fetchall()
                    for t, cols in _ALL_COLUMNS.items()}

        tables = self.read(snapshot)

        def populate(conn) -> None:
            for t, cols in _ALL_COLUMNS.items():
                conn.executemany(f"INSERT INTO {t} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})", tables[t])
        if not create_ledger_file(dest, populate):
            raise LedgerError(f"backup target {dest} appeared while the copy was written; refusing to overwrite it")

    def close(self) -> None:
        conn, self.conn = getattr(self, "conn", None), None
        if conn is not None and self.pid == os.getpid():
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - closing a broken connection
                pass
