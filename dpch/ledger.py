"""The privacy-budget ledger: durable, atomic check-and-charge per (analyst, dataset).

Semantics (docs/LEDGER.md has the full note):
- **Charge, then execute.** `Ledger.charge` decides with the budget's accountant
  (`dpch/accounting.py`) and records the charge in one transaction. Only after it returns may the
  query run. A refused query raises `BudgetExceeded` (or `QueryRejected` when the accountant's
  theorem does not cover its mechanisms); nothing is charged and the refusal is written to the
  event log.
- **Fail closed.** A charge whose execution failed stays charged (`mark(receipt, "failed")`). A
  missing, unreadable, corrupt or inconsistent ledger raises `LedgerError` and no query is answered;
  the ledger is never silently re-created or reset.
- **A posteriori settlement** (`settle`) refunds ε only as the ODPComposition protocol allows
  (odp_privacy_accounting.md, Alg. 1 and Thm 7): the mechanism declares its ODP partition values
  E(P_k) before it runs (`MechanismCost.odp_epsilons`), and after it ran the ledger charges
  E(P_k) of the cell its output fell in instead of sup E. δ is never refunded (Alg. 1 line 15). Only
  under simple composition (the `basic` and `pure` accountants), which is what Thm 7 proves.

The storage sits behind `LedgerStore` (a serializable transaction with a handful of reads and
writes). `SQLiteLedgerStore` is the single-host implementation: SQLite in WAL mode,
`synchronous=FULL`, `BEGIN IMMEDIATE` transactions, per-row checksums, a schema-version row.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import random
import sqlite3
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol, Sequence, TypeVar

from .accounting import (
    ACCOUNTANTS,
    SETTLED_KIND,
    Budget,
    CostNotSupported,
    Decision,
    Spent,
    _fmt,
    dp_params,
    get_accountant,
    make_budget,
)
from .cost import MechanismCost, PrivacyCost
from .errors import BudgetExceeded, InvalidParameter, LedgerError, QueryRejected

SCHEMA_VERSION = 1
APPLICATION_ID = 0x44504348  # "DPCH", stored in the SQLite header (offset 68)
APP_NAME = "dpch-ledger"
OUTCOMES = ("reserved", "executed", "failed", "settled")
_SQLITE_MAGIC = b"SQLite format 3\x00"
T = TypeVar("T")


def default_ledger_path() -> Path:
    """$DPCH_LEDGER, else <data dir>/ledger.sqlite with data dir = $DPCH_DATA_DIR or ./.dpch_data
    (the embedded engine's data directory; `dpch.connect` uses the same default)."""
    env = os.environ.get("DPCH_LEDGER")
    if env:
        return Path(env)
    return Path(os.environ.get("DPCH_DATA_DIR") or "./.dpch_data") / "ledger.sqlite"


# --------------------------------------------------------------------------------------------
# Public records
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Receipt:
    """Proof that a query's cost was charged (and committed) before it ran."""

    id: int
    analyst: str
    dataset: str
    accountant: str
    cost: PrivacyCost
    query_hash: str
    created_at: float
    spent_after: Spent
    remaining: Spent


@dataclass(frozen=True)
class BudgetStatus:
    analyst: str
    dataset: str
    budget: Budget
    spent: Spent
    remaining: Spent
    queries: int
    generation: int

    def describe(self) -> str:
        return (f"analyst {self.analyst!r} on dataset {self.dataset!r} ({self.budget.accountant}): "
                f"spent {self.spent.describe()}; remaining {self.remaining.describe()}")


@dataclass(frozen=True)
class ChargeRecord:
    """One row of the charge table. `epsilon/delta/rho` are what was reserved (basic composition of
    the query's mechanisms; rho only if all are Gaussian); `effective_*` what counts now (they differ
    only after a settlement)."""

    id: int
    analyst: str
    dataset: str
    generation: int
    accountant: str
    summary: str
    epsilon: float
    delta: float
    rho: float | None
    effective_epsilon: float
    effective_delta: float
    effective_rho: float | None
    query_hash: str
    query_text: str
    outcome: str
    created_at: float
    updated_at: float
    cost_json: str = field(repr=False, default="[]")
    realized_json: str | None = field(repr=False, default=None)

    @property
    def cost(self) -> PrivacyCost:
        return cost_from_json(self.cost_json)

    @property
    def realized(self) -> PrivacyCost | None:
        return None if self.realized_json is None else cost_from_json(self.realized_json)

    def effective_cost(self) -> PrivacyCost:
        """The cost the accountant composes: the reserved one, or after settlement the realized ε
        with the reserved δ (odp_privacy_accounting.md Alg. 1 lines 14-15)."""
        if self.outcome == "settled" and self.realized_json is not None:
            return self.realized  # type: ignore[return-value]
        return self.cost


@dataclass(frozen=True)
class BudgetRow:
    analyst: str
    dataset: str
    epsilon: float
    delta: float
    accountant: str
    params: dict
    generation: int
    spent_epsilon: float
    spent_delta: float
    spent_rho: float
    n_charges: int
    created_at: float
    updated_at: float

    def budget(self) -> Budget:
        return Budget(epsilon=self.epsilon, delta=self.delta, accountant=self.accountant,
                      analyst=self.analyst, dataset=self.dataset, **self.params)


@dataclass(frozen=True)
class Event:
    id: int
    ts: float
    kind: str
    analyst: str | None
    dataset: str | None
    charge_id: int | None
    detail: dict


# --------------------------------------------------------------------------------------------
# (De)serialization
# --------------------------------------------------------------------------------------------

def cost_to_json(cost: PrivacyCost) -> str:
    items = []
    for m in cost.mechanisms:
        d = asdict(m)
        d["odp_epsilons"] = list(m.odp_epsilons)
        items.append(d)
    return json.dumps(items, sort_keys=True, allow_nan=False)


@lru_cache(maxsize=65536)
def cost_from_json(text: str) -> PrivacyCost:
    """Parse a stored cost (cached: the same text always gives the same immutable PrivacyCost)."""
    try:
        items = json.loads(text)
        mechs = []
        for d in items:
            d = dict(d)
            d["odp_epsilons"] = tuple(d.get("odp_epsilons", ()))
            mechs.append(MechanismCost(**d))
        return PrivacyCost(tuple(mechs))
    except (ValueError, TypeError) as exc:
        raise LedgerError(f"ledger holds an unreadable cost record ({exc.__class__.__name__}); refusing to continue") from None


def summarize(cost: PrivacyCost) -> str:
    parts = []
    for m in cost.mechanisms:
        what = m.label or m.kind
        if m.kind == "gaussian":
            parts.append(f"{m.kind} {what} Δ={_fmt(m.sensitivity)} σ={_fmt(m.scale)}")
        elif m.kind == "laplace":
            parts.append(f"{m.kind} {what} Δ={_fmt(m.sensitivity)} b={_fmt(m.scale)}")
        else:
            parts.append(f"{m.kind} {what} ε={_fmt(m.epsilon)} δ={_fmt(m.delta)}")
    return "; ".join(parts) or "(no mechanism)"


def _cost_numbers(cost: PrivacyCost) -> tuple[float, float, float | None]:
    """(ε, δ, ρ) of a query by basic composition (ρ: None unless every part has one)."""
    eps, dels = [], []
    for m in cost.mechanisms:
        try:
            e, d = dp_params(m)
        except CostNotSupported:
            e, d = m.epsilon, m.delta
        eps.append(e)
        dels.append(d)
    return math.fsum(eps), math.fsum(dels), cost.rho


def _checksum(values: Sequence[Any]) -> str:
    blob = json.dumps(list(values), sort_keys=True, allow_nan=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def _check_name(value: str, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidParameter(f"{what} must be a non-empty string")
    value = value.strip()
    if len(value) > 256 or any(ord(c) < 32 for c in value):
        raise InvalidParameter(f"{what} must be at most 256 printable characters")
    return value


def _no_budget_message(analyst: str, dataset: str) -> str:
    return (f"no budget set for analyst {analyst!r} on dataset {dataset!r}; an administrator runs: "
            f"dpch budget set --analyst {analyst} --dataset {dataset} --epsilon EPS [--delta DELTA] [--accountant NAME]")


# --------------------------------------------------------------------------------------------
# Storage interface
# --------------------------------------------------------------------------------------------

class LedgerTxn(Protocol):
    """Reads and writes inside one serializable transaction of a `LedgerStore`."""

    def get_budget(self, analyst: str, dataset: str) -> BudgetRow | None: ...
    def list_budgets(self) -> list[BudgetRow]: ...
    def put_budget(self, row: BudgetRow) -> None: ...
    def charges(self, analyst: str | None = None, dataset: str | None = None,
                generation: int | None = None) -> list[ChargeRecord]: ...
    def get_charge(self, charge_id: int) -> ChargeRecord | None: ...
    def insert_charge(self, rec: ChargeRecord) -> int: ...  # rec.id is ignored; returns the new id
    def update_charge(self, rec: ChargeRecord) -> None: ...
    def add_event(self, kind: str, analyst: str | None, dataset: str | None, charge_id: int | None,
                  detail: dict) -> int: ...
    def events(self, analyst: str | None = None, dataset: str | None = None,
               kind: str | None = None) -> list[Event]: ...


class LedgerStore(Protocol):
    """A linearizable store. `transaction(fn)` runs fn(txn) as ONE serializable transaction and
    returns its result; if fn raises, nothing it wrote is kept. A store may call fn more than once
    (to retry after a serialization conflict), so fn must have no other side effects. `read(fn)`
    runs fn on a consistent snapshot. `verify()` checks the stored bytes (schema, checksums, running
    totals) and raises LedgerError."""

    def transaction(self, fn: Callable[[LedgerTxn], T]) -> T: ...
    def read(self, fn: Callable[[LedgerTxn], T]) -> T: ...
    def verify(self) -> None: ...
    def close(self) -> None: ...


# --------------------------------------------------------------------------------------------
# SQLite implementation
# --------------------------------------------------------------------------------------------

_SCHEMA = [
    """CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)""",
    """CREATE TABLE budgets (
        analyst TEXT NOT NULL, dataset TEXT NOT NULL,
        epsilon REAL NOT NULL, delta REAL NOT NULL, accountant TEXT NOT NULL, params TEXT NOT NULL,
        generation INTEGER NOT NULL,
        spent_epsilon REAL NOT NULL, spent_delta REAL NOT NULL, spent_rho REAL NOT NULL,
        n_charges INTEGER NOT NULL,
        created_at REAL NOT NULL, updated_at REAL NOT NULL,
        checksum TEXT NOT NULL,
        PRIMARY KEY (analyst, dataset))""",
    """CREATE TABLE charges (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        analyst TEXT NOT NULL, dataset TEXT NOT NULL, generation INTEGER NOT NULL,
        accountant TEXT NOT NULL, mechanisms TEXT NOT NULL, summary TEXT NOT NULL,
        epsilon REAL NOT NULL, delta REAL NOT NULL, rho REAL,
        realized TEXT,
        eff_epsilon REAL NOT NULL, eff_delta REAL NOT NULL, eff_rho REAL,
        query_hash TEXT NOT NULL, query_text TEXT NOT NULL,
        outcome TEXT NOT NULL CHECK (outcome IN ('reserved', 'executed', 'failed', 'settled')),
        created_at REAL NOT NULL, updated_at REAL NOT NULL,
        checksum TEXT NOT NULL)""",
    """CREATE INDEX charges_by_budget ON charges (analyst, dataset, generation, id)""",
    """CREATE TABLE events (
        id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, kind TEXT NOT NULL,
        analyst TEXT, dataset TEXT, charge_id INTEGER, detail TEXT NOT NULL,
        checksum TEXT NOT NULL)""",
]

_COLUMNS = {
    "meta": ["key", "value"],
    "budgets": ["analyst", "dataset", "epsilon", "delta", "accountant", "params", "generation", "spent_epsilon",
                "spent_delta", "spent_rho", "n_charges", "created_at", "updated_at", "checksum"],
    "charges": ["id", "analyst", "dataset", "generation", "accountant", "mechanisms", "summary", "epsilon", "delta",
                "rho", "realized", "eff_epsilon", "eff_delta", "eff_rho", "query_hash", "query_text", "outcome",
                "created_at", "updated_at", "checksum"],
    "events": ["id", "ts", "kind", "analyst", "dataset", "charge_id", "detail", "checksum"],
}

_BUDGET_SUM_COLUMNS = _COLUMNS["budgets"][:-1]
_CHARGE_SUM_COLUMNS = _COLUMNS["charges"][:-1]
_EVENT_SUM_COLUMNS = _COLUMNS["events"][:-1]


def _f(x: float | None) -> float | None:
    """REAL columns come back as float: write them as float so the checksum round-trips."""
    return None if x is None else float(x)


def _budget_values(r: BudgetRow) -> list:
    return [r.analyst, r.dataset, _f(r.epsilon), _f(r.delta), r.accountant, json.dumps(r.params, sort_keys=True),
            int(r.generation), _f(r.spent_epsilon), _f(r.spent_delta), _f(r.spent_rho), int(r.n_charges),
            _f(r.created_at), _f(r.updated_at)]


def _charge_values(c: ChargeRecord, charge_id: int) -> list:
    return [charge_id, c.analyst, c.dataset, int(c.generation), c.accountant, c.cost_json, c.summary, _f(c.epsilon),
            _f(c.delta), _f(c.rho), c.realized_json, _f(c.effective_epsilon), _f(c.effective_delta),
            _f(c.effective_rho), c.query_hash, c.query_text, c.outcome, _f(c.created_at), _f(c.updated_at)]


class _SQLiteTxn:
    def __init__(self, conn: sqlite3.Connection, path: Path, row_cache: dict | None = None):
        self.conn = conn
        self.path = path
        # verified charge rows of this process, keyed by the full raw row (checksum included): a row
        # whose bytes are identical to an already verified one needs no new checksum or JSON parse
        self.row_cache = {} if row_cache is None else row_cache

    # -- budgets ----------------------------------------------------------------------------
    def _budget_row(self, row) -> BudgetRow:
        values, checksum = list(row[:-1]), row[-1]
        if _checksum(values) != checksum:
            raise LedgerError(f"ledger {self.path}: budget row for analyst {values[0]!r} on dataset {values[1]!r} "
                              f"fails its checksum (corrupted); refusing to answer queries")
        try:
            params = json.loads(values[5])
        except ValueError:
            raise LedgerError(f"ledger {self.path}: unreadable budget parameters") from None
        return BudgetRow(values[0], values[1], values[2], values[3], values[4], params, values[6], values[7],
                         values[8], values[9], values[10], values[11], values[12])

    def get_budget(self, analyst, dataset):
        row = self.conn.execute(f"SELECT {', '.join(_COLUMNS['budgets'])} FROM budgets WHERE analyst=? AND dataset=?",
                                (analyst, dataset)).fetchone()
        return None if row is None else self._budget_row(row)

    def list_budgets(self):
        rows = self.conn.execute(f"SELECT {', '.join(_COLUMNS['budgets'])} FROM budgets ORDER BY analyst, dataset")
        return [self._budget_row(r) for r in rows]

    def put_budget(self, row):
        values = _budget_values(row)
        self.conn.execute(f"INSERT OR REPLACE INTO budgets ({', '.join(_COLUMNS['budgets'])}) "
                          f"VALUES ({', '.join('?' * len(_COLUMNS['budgets']))})", values + [_checksum(values)])

    # -- charges ----------------------------------------------------------------------------
    def _charge_row(self, row) -> ChargeRecord:
        cached = self.row_cache.get(row)
        if cached is not None:
            return cached
        rec = self._verify_charge_row(row)
        if len(self.row_cache) > 200_000:
            self.row_cache.clear()
        self.row_cache[row] = rec
        return rec

    def _verify_charge_row(self, row) -> ChargeRecord:
        values, checksum = list(row[:-1]), row[-1]
        if _checksum(values) != checksum:
            raise LedgerError(f"ledger {self.path}: charge #{values[0]} fails its checksum (corrupted); "
                              f"refusing to answer queries")
        (cid, analyst, dataset, gen, acc, mech, summary, eps, dlt, rho, realized, e_eps, e_dlt, e_rho, qh, qt,
         outcome, created, updated) = values
        return ChargeRecord(id=cid, analyst=analyst, dataset=dataset, generation=gen, accountant=acc, summary=summary,
                            epsilon=eps, delta=dlt, rho=rho, effective_epsilon=e_eps, effective_delta=e_dlt,
                            effective_rho=e_rho, query_hash=qh, query_text=qt, outcome=outcome, created_at=created,
                            updated_at=updated, cost_json=mech, realized_json=realized)

    def charges(self, analyst=None, dataset=None, generation=None):
        where, args = [], []
        for col, val in (("analyst", analyst), ("dataset", dataset), ("generation", generation)):
            if val is not None:
                where.append(f"{col}=?")
                args.append(val)
        sql = f"SELECT {', '.join(_COLUMNS['charges'])} FROM charges"
        if where:
            sql += " WHERE " + " AND ".join(where)
        return [self._charge_row(r) for r in self.conn.execute(sql + " ORDER BY id", args)]

    def get_charge(self, charge_id):
        row = self.conn.execute(f"SELECT {', '.join(_COLUMNS['charges'])} FROM charges WHERE id=?", (charge_id,)).fetchone()
        return None if row is None else self._charge_row(row)

    def _next_id(self, table: str) -> int:
        # called inside a write transaction (the write lock is held), so the id cannot be taken
        # concurrently; AUTOINCREMENT's sqlite_sequence keeps ids of deleted rows from being reused
        row = self.conn.execute("SELECT seq FROM sqlite_sequence WHERE name=?", (table,)).fetchone()
        top = self.conn.execute(f"SELECT COALESCE(MAX(id), 0) FROM {table}").fetchone()[0]
        return max(top, row[0] if row else 0) + 1

    def insert_charge(self, rec):
        cid = self._next_id("charges")
        values = _charge_values(rec, cid)
        self.conn.execute(f"INSERT INTO charges ({', '.join(_COLUMNS['charges'])}) VALUES "
                          f"({', '.join('?' * len(_COLUMNS['charges']))})", values + [_checksum(values)])
        return cid

    def update_charge(self, rec):
        values = _charge_values(rec, rec.id)
        sets = ", ".join(f"{c}=?" for c in _COLUMNS["charges"][1:-1])
        cur = self.conn.execute(f"UPDATE charges SET {sets}, checksum=? WHERE id=?",
                                values[1:] + [_checksum(values), rec.id])
        if cur.rowcount != 1:
            raise LedgerError(f"ledger {self.path}: charge #{rec.id} vanished during an update")

    # -- events -----------------------------------------------------------------------------
    def add_event(self, kind, analyst, dataset, charge_id, detail):
        ts = time.time()
        detail_json = json.dumps(detail, sort_keys=True, allow_nan=True, default=str)
        eid = self._next_id("events")
        values = [eid, ts, kind, analyst, dataset, charge_id, detail_json]
        self.conn.execute("INSERT INTO events (id, ts, kind, analyst, dataset, charge_id, detail, checksum) "
                          "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", values + [_checksum(values)])
        return eid

    def _event_row(self, row) -> Event:
        values, checksum = list(row[:-1]), row[-1]
        if _checksum(values) != checksum:
            raise LedgerError(f"ledger {self.path}: event #{values[0]} fails its checksum (corrupted)")
        try:
            detail = json.loads(values[6])
        except ValueError:
            raise LedgerError(f"ledger {self.path}: event #{values[0]} is unreadable") from None
        return Event(values[0], values[1], values[2], values[3], values[4], values[5], detail)

    def events(self, analyst=None, dataset=None, kind=None):
        where, args = [], []
        for col, val in (("analyst", analyst), ("dataset", dataset), ("kind", kind)):
            if val is not None:
                where.append(f"{col}=?")
                args.append(val)
        sql = f"SELECT {', '.join(_COLUMNS['events'])} FROM events"
        if where:
            sql += " WHERE " + " AND ".join(where)
        return [self._event_row(r) for r in self.conn.execute(sql + " ORDER BY id", args)]


class SQLiteLedgerStore:
    """Single-host ledger store: SQLite in WAL mode with synchronous=FULL (a committed charge
    survives a crash or power loss before the query runs), `BEGIN IMMEDIATE` so that the read of the
    budget and the write of the charge are serialized with every other writer (threads and
    processes), and a per-row checksum so that corrupted bytes are detected rather than trusted."""

    def __init__(self, path: str | os.PathLike, *, create: bool = True, timeout: float = 60.0):
        self.path = Path(path)
        self.timeout = timeout
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self._row_cache: dict = {}
        if not self.path.exists():
            if not create:
                raise LedgerError(f"ledger not found at {self.path}; no query can be answered. Create it with "
                                  f"`dpch budget set ... --ledger {self.path}` (or Ledger(path, create=True))")
            self._create()
        self._precheck_file()
        try:
            self._conn = self._connect()
            self._check_schema()
        except sqlite3.Error as exc:
            self.close()
            raise LedgerError(f"ledger {self.path} is unreadable ({exc}); refusing to answer queries. "
                              f"Restore it from a backup; it is never reset automatically") from None
        except LedgerError:
            self.close()
            raise

    # -- opening ----------------------------------------------------------------------------
    def _create(self) -> None:
        """Create the ledger atomically: build it in a temporary file, then link it into place
        (fails if another process won the race; then we open theirs)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
        try:
            conn = sqlite3.connect(str(tmp), isolation_level=None)
            try:
                conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
                conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("BEGIN")
                for stmt in _SCHEMA:
                    conn.execute(stmt)
                conn.execute("INSERT INTO meta VALUES ('app', ?), ('schema_version', ?)", (APP_NAME, str(SCHEMA_VERSION)))
                txn = _SQLiteTxn(conn, self.path)
                txn.add_event("ledger_created", None, None, None, {"schema_version": SCHEMA_VERSION})
                conn.execute("COMMIT")
            finally:
                conn.close()
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())
            try:
                os.link(tmp, self.path)
            except FileExistsError:
                pass
            dir_fd = os.open(str(self.path.parent), os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        finally:
            for suffix in ("", "-wal", "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(str(tmp) + suffix)

    def _precheck_file(self) -> None:
        """Header checks before SQLite sees the file: a short or foreign file is an error, never an
        empty ledger (SQLite would happily treat a 0-byte file as a new database)."""
        try:
            size = self.path.stat().st_size
            with open(self.path, "rb") as fh:
                header = fh.read(100)
        except OSError as exc:
            raise LedgerError(f"ledger {self.path} cannot be read ({exc.strerror}); refusing to answer queries") from None
        if size < 100 or len(header) < 100:
            raise LedgerError(f"ledger {self.path} is truncated ({size} bytes); refusing to answer queries. "
                              f"Restore it from a backup; it is never reset automatically")
        if header[:16] != _SQLITE_MAGIC:
            raise LedgerError(f"ledger {self.path} is not an SQLite database (bad header: corrupted or foreign file); "
                              f"refusing to answer queries")
        app_id = int.from_bytes(header[68:72], "big")
        if app_id != APPLICATION_ID:
            raise LedgerError(f"ledger {self.path} is an SQLite database but not a DPCH ledger (application id "
                              f"{app_id:#x}); wrong schema, refusing to use it")
        page_size = int.from_bytes(header[16:18], "big")
        page_size = 65536 if page_size == 1 else page_size
        change_counter = int.from_bytes(header[24:28], "big")
        n_pages = int.from_bytes(header[28:32], "big")
        valid_for = int.from_bytes(header[92:96], "big")
        wal = Path(str(self.path) + "-wal")
        wal_empty = not wal.exists() or wal.stat().st_size == 0
        if wal_empty and n_pages and change_counter == valid_for and size < n_pages * page_size:
            raise LedgerError(f"ledger {self.path} is truncated ({size} bytes, header says {n_pages * page_size}); "
                              f"refusing to answer queries. Restore it from a backup")

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(str(self.path), timeout=self.timeout, isolation_level=None, check_same_thread=False)
        conn.execute(f"PRAGMA busy_timeout={int(self.timeout * 1000)}")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA trusted_schema=OFF")
        return conn

    def _check_schema(self) -> None:
        conn = self._conn
        assert conn is not None
        problems = [r[0] for r in conn.execute("PRAGMA quick_check")]
        if problems != ["ok"]:
            raise LedgerError(f"ledger {self.path} failed its integrity check ({'; '.join(map(str, problems[:3]))}); "
                              f"refusing to answer queries. Restore it from a backup")
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        missing = set(_COLUMNS) - tables
        if missing:
            raise LedgerError(f"ledger {self.path} has the wrong schema (missing tables: {', '.join(sorted(missing))})")
        for table, cols in _COLUMNS.items():
            have = [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]
            if have != cols:
                raise LedgerError(f"ledger {self.path} has the wrong schema (table {table} has columns {have})")
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        if meta.get("app") != APP_NAME:
            raise LedgerError(f"ledger {self.path} has the wrong schema (not a DPCH ledger)")
        if meta.get("schema_version") != str(SCHEMA_VERSION):
            raise LedgerError(f"ledger {self.path} has schema version {meta.get('schema_version')!r}; this DPCH "
                              f"reads version {SCHEMA_VERSION}. Refusing to use it")
        # ledgers are created in WAL mode (persistent in the file); checked only after the schema so
        # that opening a foreign file never modifies it
        mode = str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower()
        if mode != "wal":
            raise LedgerError(f"ledger {self.path} is not in WAL mode ({mode}); it was not created by DPCH")

    # -- transactions -----------------------------------------------------------------------
    def _conn_or_fail(self) -> sqlite3.Connection:
        if self._conn is None:
            raise LedgerError(f"ledger {self.path} is closed")
        return self._conn

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
                    raise LedgerError(f"ledger {self.path} is unreadable ({exc}); refusing to answer queries") from None
        finally:
            with contextlib.suppress(sqlite3.Error):
                conn.execute(f"PRAGMA busy_timeout={int(self.timeout * 1000)}")

    def transaction(self, fn: Callable[[LedgerTxn], T]) -> T:
        with self._lock:
            conn = self._conn_or_fail()
            self._begin_immediate(conn)
            try:
                result = fn(_SQLiteTxn(conn, self.path, self._row_cache))
                conn.execute("COMMIT")
                return result
            except BaseException as exc:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    raise LedgerError(f"ledger {self.path} failed during a transaction ({exc}); nothing was "
                                      f"recorded and the query must not run") from None
                raise

    def read(self, fn: Callable[[LedgerTxn], T]) -> T:
        with self._lock:
            conn = self._conn_or_fail()
            try:
                conn.execute("BEGIN")
                try:
                    return fn(_SQLiteTxn(conn, self.path, self._row_cache))
                finally:
                    conn.execute("ROLLBACK")
            except sqlite3.Error as exc:
                raise LedgerError(f"ledger {self.path} is unreadable ({exc}); refusing to answer queries") from None

    def verify(self) -> None:
        """Checksums of every row and the running totals of every budget against its charges."""
        def check(txn: _SQLiteTxn) -> None:
            charges = txn.charges()
            txn.events()
            by_budget: dict[tuple[str, str, int], list[ChargeRecord]] = {}
            for c in charges:
                by_budget.setdefault((c.analyst, c.dataset, c.generation), []).append(c)
            for b in txn.list_budgets():
                rows = by_budget.get((b.analyst, b.dataset, b.generation), [])
                _check_totals(self.path, b, rows)
        with self._lock:
            conn = self._conn_or_fail()
            try:
                problems = [r[0] for r in conn.execute("PRAGMA quick_check")]
            except sqlite3.Error as exc:
                raise LedgerError(f"ledger {self.path} is unreadable ({exc}); refusing to answer queries") from None
            if problems != ["ok"]:
                raise LedgerError(f"ledger {self.path} failed its integrity check ({'; '.join(map(str, problems[:3]))})")
        self.read(check)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                with contextlib.suppress(sqlite3.Error):
                    self._conn.close()
                self._conn = None


def _totals(rows: Sequence[ChargeRecord]) -> tuple[float, float, float, int]:
    return (math.fsum(r.effective_epsilon for r in rows), math.fsum(r.effective_delta for r in rows),
            math.fsum(r.effective_rho for r in rows if r.effective_rho is not None), len(rows))


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-12 * max(1.0, abs(a), abs(b))


def _check_totals(path: Path, b: BudgetRow, rows: Sequence[ChargeRecord]) -> None:
    eps, dlt, rho, n = _totals(rows)
    if n != b.n_charges or not (_close(eps, b.spent_epsilon) and _close(dlt, b.spent_delta) and _close(rho, b.spent_rho)):
        raise LedgerError(f"ledger {path} is inconsistent: the running totals of analyst {b.analyst!r} on dataset "
                          f"{b.dataset!r} do not match its charges; refusing to answer queries")


# --------------------------------------------------------------------------------------------
# The ledger
# --------------------------------------------------------------------------------------------

@dataclass
class _ChargeResult:
    receipt: Receipt | None = None
    error: Exception | None = None


class Ledger:
    """The privacy-budget ledger of one deployment (see the module docstring)."""

    def __init__(self, path: str | Path | None = None, *, create: bool = True, store: LedgerStore | None = None):
        if store is None:
            store = SQLiteLedgerStore(default_ledger_path() if path is None else path, create=create)
        self.path = getattr(store, "path", None) or (Path(path) if path is not None else None)
        self.store = store
        try:
            self.verify()
        except BaseException:
            store.close()
            raise

    # -- lifecycle --------------------------------------------------------------------------
    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> "Ledger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def verify(self) -> None:
        """Full check: storage integrity, running totals, and every budget's recorded history
        within what its accountant allows. Raises LedgerError."""
        self.store.verify()

        def check(txn: LedgerTxn) -> None:
            for b in txn.list_budgets():
                rows = txn.charges(b.analyst, b.dataset, b.generation)
                self._check_history(b, rows)
        self.store.read(check)

    def _check_history(self, b: BudgetRow, rows: Sequence[ChargeRecord]) -> None:
        if b.accountant not in ACCOUNTANTS:
            raise LedgerError(f"ledger {self.path}: budget of analyst {b.analyst!r} on dataset {b.dataset!r} names an "
                              f"unknown accountant {b.accountant!r}")
        budget = b.budget()
        problem = get_accountant(b.accountant).check_history(budget, [r.effective_cost() for r in rows])
        if problem is not None:
            raise LedgerError(f"ledger {self.path} is inconsistent: the recorded charges of analyst {b.analyst!r} on "
                              f"dataset {b.dataset!r} break the budget ({problem}); refusing to answer queries")

    # -- budgets ----------------------------------------------------------------------------
    def set_budget(self, analyst: str, dataset: str, epsilon: float, delta: float = 0.0, accountant: str = "basic",
                   **params) -> Budget:
        """Set (or change) the budget of (analyst, dataset). Changing an existing budget is allowed
        only if the charges already recorded fit the new budget under the new accountant."""
        analyst = _check_name(analyst, "analyst")
        dataset = _check_name(dataset, "dataset")
        budget = make_budget(epsilon, delta, accountant, analyst=analyst, dataset=dataset, **params)
        acc = get_accountant(budget.accountant)

        def fn(txn: LedgerTxn) -> Budget:
            now = time.time()
            old = txn.get_budget(analyst, dataset)
            if old is None:
                row = BudgetRow(analyst, dataset, budget.epsilon, budget.delta, budget.accountant, budget.params(), 0,
                                0.0, 0.0, 0.0, 0, now, now)
                detail = {"budget": _budget_dict(budget)}
            else:
                rows = txn.charges(analyst, dataset, old.generation)
                _check_totals(self.path, old, rows)
                problem = acc.check_history(budget, [r.effective_cost() for r in rows])
                if problem is not None:
                    raise InvalidParameter(f"the {len(rows)} charges already recorded for analyst {analyst!r} on dataset "
                                           f"{dataset!r} do not fit the new budget ({problem}); a reset is needed first")
                row = replace(old, epsilon=budget.epsilon, delta=budget.delta, accountant=budget.accountant,
                              params=budget.params(), updated_at=now)
                detail = {"budget": _budget_dict(budget), "previous": _budget_dict(old.budget())}
            txn.put_budget(row)
            txn.add_event("budget_set", analyst, dataset, None, detail)
            return budget
        return self.store.transaction(fn)

    def get_budget(self, analyst: str, dataset: str) -> Budget:
        row = self.store.read(lambda txn: txn.get_budget(analyst, dataset))
        if row is None:
            raise LedgerError(_no_budget_message(analyst, dataset))
        return row.budget()

    def remaining(self, analyst: str, dataset: str) -> BudgetStatus:
        def fn(txn: LedgerTxn) -> BudgetStatus:
            row = txn.get_budget(analyst, dataset)
            if row is None:
                raise LedgerError(_no_budget_message(analyst, dataset))
            rows = txn.charges(analyst, dataset, row.generation)
            _check_totals(self.path, row, rows)
            return self._status(row, rows)
        return self.store.read(fn)

    def budgets(self) -> list[BudgetStatus]:
        def fn(txn: LedgerTxn) -> list[BudgetStatus]:
            out = []
            for row in txn.list_budgets():
                out.append(self._status(row, txn.charges(row.analyst, row.dataset, row.generation)))
            return out
        return self.store.read(fn)

    def _status(self, row: BudgetRow, rows: Sequence[ChargeRecord]) -> BudgetStatus:
        budget = row.budget()
        acc = get_accountant(row.accountant)
        try:
            spent = acc.spent(budget, [r.effective_cost() for r in rows])
        except CostNotSupported as exc:
            raise LedgerError(f"ledger {self.path} is inconsistent: {exc.args[0]}") from None
        return BudgetStatus(row.analyst, row.dataset, budget, spent, acc.remaining(budget, spent), len(rows), row.generation)

    # -- charging ---------------------------------------------------------------------------
    def charge(self, analyst: str, dataset: str, cost: PrivacyCost, query: str) -> Receipt:
        """Atomic check-and-charge. Returns a Receipt once the charge is durable; raises
        BudgetExceeded (over budget, or no budget set) or QueryRejected (the accountant's theorem
        does not cover the query's mechanisms). A refused query is not charged; the refusal is
        recorded in the event log."""
        analyst = _check_name(analyst, "analyst")
        dataset = _check_name(dataset, "dataset")
        if not isinstance(cost, PrivacyCost) or not all(isinstance(m, MechanismCost) for m in cost.mechanisms):
            raise InvalidParameter("cost must be a PrivacyCost of MechanismCost")
        if not isinstance(query, str):
            raise InvalidParameter("query must be the query text")
        self._check_odp_declaration(cost)
        cost_json = cost_to_json_checked(cost)
        # the canonical (cached) object for this cost: the one later charges read back from the
        # table, so the accountants' caches find it by identity
        cost = cost_from_json(cost_json)
        qhash = hashlib.sha256(query.encode("utf-8", "surrogatepass")).hexdigest()
        summary = summarize(cost)
        eps, dlt, rho = _cost_numbers(cost)

        def fn(txn: LedgerTxn) -> _ChargeResult:
            row = txn.get_budget(analyst, dataset)
            if row is None:
                txn.add_event("rejected", analyst, dataset, None,
                              {"reason": "no budget set", "query_hash": qhash, "needs": {"epsilon": eps, "delta": dlt}})
                return _ChargeResult(error=BudgetExceeded(_no_budget_message(analyst, dataset)))
            rows = txn.charges(analyst, dataset, row.generation)
            _check_totals(self.path, row, rows)
            budget = row.budget()
            acc = get_accountant(row.accountant)
            try:
                decision = acc.decide(budget, [r.effective_cost() for r in rows], cost)
            except CostNotSupported as exc:
                raise LedgerError(f"ledger {self.path} is inconsistent: a recorded charge is not covered by the "
                                  f"{row.accountant} accountant ({exc.args[0]})") from None
            if not decision.ok:
                txn.add_event("rejected", analyst, dataset, None, {
                    "reason": decision.reason, "query_hash": qhash, "accountant": row.accountant,
                    "needs": _spent_dict(decision.needs), "remaining": _spent_dict(decision.remaining)})
                return _ChargeResult(error=self._rejection(row, decision))
            now = time.time()
            rec = ChargeRecord(id=0, analyst=analyst, dataset=dataset, generation=row.generation,
                               accountant=row.accountant, summary=summary, epsilon=eps, delta=dlt, rho=rho,
                               effective_epsilon=eps, effective_delta=dlt, effective_rho=rho, query_hash=qhash,
                               query_text=query, outcome="reserved", created_at=now, updated_at=now,
                               cost_json=cost_json, realized_json=None)
            cid = txn.insert_charge(rec)
            s_eps, s_dlt, s_rho, n = _totals([*rows, rec])
            txn.put_budget(replace(row, spent_epsilon=s_eps, spent_delta=s_dlt, spent_rho=s_rho, n_charges=n,
                                   updated_at=now))
            txn.add_event("charge", analyst, dataset, cid, {
                "accountant": row.accountant, "epsilon": eps, "delta": dlt, "rho": rho, "query_hash": qhash,
                "spent_after": _spent_dict(decision.spent_after), "remaining": _spent_dict(decision.remaining),
                "total_epsilon": s_eps, "total_delta": s_dlt, "n_charges": n})
            return _ChargeResult(receipt=Receipt(cid, analyst, dataset, row.accountant, cost, qhash, now,
                                                 decision.spent_after, decision.remaining))

        result = self.store.transaction(fn)
        if result.error is not None:
            raise result.error
        assert result.receipt is not None
        return result.receipt

    @staticmethod
    def _check_odp_declaration(cost: PrivacyCost) -> None:
        for m in cost.mechanisms:
            for e in m.odp_epsilons:
                if not isinstance(e, (int, float)) or not math.isfinite(e) or e < 0 or e > m.epsilon * (1 + 1e-12):
                    raise InvalidParameter(f"mechanism {m.label or m.kind!r}: ODP partition values must lie in "
                                           f"[0, ε = {_fmt(m.epsilon)}] (odp_privacy_accounting.md Lemma 4)")

    def _rejection(self, row: BudgetRow, d: Decision) -> Exception:
        who = f"analyst {row.analyst!r} on dataset {row.dataset!r}"
        if d.needs is None:
            return QueryRejected(f"the ledger refused the query for {who}: {d.reason}. Nothing ran and nothing was charged")
        return BudgetExceeded(
            f"privacy budget exceeded for {who} (accountant {row.accountant}): {d.reason}. "
            f"The query needs {d.needs.describe()}; remaining: {d.remaining.describe()}. "
            f"Nothing ran and nothing was charged")

    def mark(self, receipt: Receipt, outcome: str) -> None:
        """Record how the execution ended: "executed" or "failed". Either way the charge stays
        (fail closed: a failed execution may still have touched or released data)."""
        if outcome not in ("executed", "failed"):
            raise InvalidParameter(f"outcome must be 'executed' or 'failed' (got {outcome!r})")

        def fn(txn: LedgerTxn) -> None:
            rec = self._charge_for(txn, receipt)
            if rec.outcome == outcome:
                return
            if rec.outcome != "reserved" and not (rec.outcome == "settled" and outcome == "executed"):
                raise InvalidParameter(f"charge #{rec.id} is {rec.outcome}; it cannot become {outcome}")
            if rec.outcome == "settled":
                return  # settled implies executed
            txn.update_charge(replace(rec, outcome=outcome, updated_at=time.time()))
            txn.add_event("mark", rec.analyst, rec.dataset, rec.id, {"outcome": outcome, "charge_kept": True})
        self.store.transaction(fn)

    def _charge_for(self, txn: LedgerTxn, receipt: Receipt) -> ChargeRecord:
        rec = txn.get_charge(receipt.id)
        if rec is None or rec.analyst != receipt.analyst or rec.dataset != receipt.dataset or rec.query_hash != receipt.query_hash:
            raise LedgerError(f"ledger {self.path} has no charge matching receipt #{receipt.id}")
        return rec

    def settle(self, receipt: Receipt, realized: PrivacyCost) -> None:
        """A posteriori settlement, odp_privacy_accounting.md Alg. 1 (ODPComposition) and Thm 7.

        Before running, each mechanism declared (P, E, δ) (Def. 2) through its ε (= sup E, checked
        against the remaining budget, Alg. 1 line 9) and `odp_epsilons` (the values E(P_k)). After it
        ran, `realized` gives for each mechanism, in the same order, the ε of the cell its output fell
        in: the ledger replaces the reserved ε by it (line 14). Rules enforced:
        - only under simple composition (accountants `basic` and `pure`): Thm 7 is proved for the
          linear filter Σε ≤ ε_t, Σδ ≤ δ_t (Appendix A: Alg. 1 as an ODP filter);
        - each realized ε must be one of the declared E(P_k) or the full reserved ε (trivial
          partition, Lemma 3); nothing else is refunded;
        - δ is never refunded (line 15 subtracts the declared δ_i whatever the output);
        - a charge settles once, and not after a failed execution (the output is unknown).
        Settling after later charges were made is conservative: those charges were checked against
        a smaller remaining budget than Alg. 1 would have used.
        """
        if not isinstance(realized, PrivacyCost):
            raise InvalidParameter("realized must be a PrivacyCost")

        def fn(txn: LedgerTxn) -> None:
            rec = self._charge_for(txn, receipt)
            row = txn.get_budget(rec.analyst, rec.dataset)
            if row is None or row.generation != rec.generation:
                raise InvalidParameter(f"charge #{rec.id} belongs to a budget that was reset; nothing to settle")
            for name in {rec.accountant, row.accountant}:
                if not get_accountant(name).supports_settlement:
                    raise InvalidParameter(
                        f"a posteriori settlement is defined for simple composition only (ODP paper Thm 7); the "
                        f"{name} accountant does not allow it")
            if rec.outcome not in ("reserved", "executed"):
                raise InvalidParameter(f"charge #{rec.id} is {rec.outcome}; only a reserved or executed charge settles")
            reserved = rec.cost
            if len(realized.mechanisms) != len(reserved.mechanisms):
                raise InvalidParameter("the realized cost must list the same mechanisms as the reserved one")
            effective = []
            for m, r in zip(reserved.mechanisms, realized.mechanisms):
                if r.kind not in (m.kind, SETTLED_KIND) or r.label != m.label:
                    raise InvalidParameter(f"realized mechanism {r.label or r.kind!r} does not match reserved "
                                           f"{m.label or m.kind!r}")
                full_eps, full_delta = dp_params(m)
                allowed = {full_eps, *m.odp_epsilons}
                if not any(abs(r.epsilon - a) <= 1e-12 * max(1.0, a) for a in allowed):
                    raise InvalidParameter(
                        f"realized ε = {_fmt(r.epsilon)} of {m.label or m.kind!r} is not one of the ODP partition values "
                        f"declared before it ran ({', '.join(_fmt(a) for a in sorted(allowed))})")
                eps = min(full_eps, max(a for a in allowed if abs(r.epsilon - a) <= 1e-12 * max(1.0, a)))
                effective.append(MechanismCost(kind=SETTLED_KIND, sensitivity=0.0, scale=0.0, epsilon=eps,
                                               delta=full_delta, rho=None, label=m.label))
            eff = PrivacyCost(tuple(effective))
            e_eps, e_dlt, _ = _cost_numbers(eff)
            now = time.time()
            new = replace(rec, outcome="settled", realized_json=cost_to_json(eff), effective_epsilon=e_eps,
                          effective_delta=e_dlt, effective_rho=None, updated_at=now)
            txn.update_charge(new)
            rows = [new if c.id == rec.id else c for c in txn.charges(rec.analyst, rec.dataset, rec.generation)]
            s_eps, s_dlt, s_rho, n = _totals(rows)
            txn.put_budget(replace(row, spent_epsilon=s_eps, spent_delta=s_dlt, spent_rho=s_rho, n_charges=n, updated_at=now))
            txn.add_event("settle", rec.analyst, rec.dataset, rec.id, {
                "reserved_epsilon": rec.epsilon, "realized_epsilon": e_eps, "refund_epsilon": rec.epsilon - e_eps,
                "delta_kept": e_dlt, "rule": "odp_privacy_accounting.md Alg. 1 line 14"})
        self.store.transaction(fn)

    # -- administration ---------------------------------------------------------------------
    def reset(self, analyst: str, dataset: str, *, confirm: bool = False) -> None:
        """Start a new generation of the budget: the spent amount goes back to zero. The old charges
        stay in the history. Refused unless confirm=True; both the refusal and the reset are recorded."""
        analyst = _check_name(analyst, "analyst")
        dataset = _check_name(dataset, "dataset")
        if confirm is not True:
            self.store.transaction(lambda txn: txn.add_event("reset_refused", analyst, dataset, None,
                                                             {"reason": "confirm=True not given"}))
            raise InvalidParameter("reset forgets the privacy already spent; it needs an explicit confirmation "
                                   "(confirm=True, or --yes-i-know on the command line)")

        def fn(txn: LedgerTxn) -> None:
            row = txn.get_budget(analyst, dataset)
            if row is None:
                raise LedgerError(_no_budget_message(analyst, dataset))
            rows = txn.charges(analyst, dataset, row.generation)
            _check_totals(self.path, row, rows)
            now = time.time()
            txn.put_budget(replace(row, generation=row.generation + 1, spent_epsilon=0.0, spent_delta=0.0, spent_rho=0.0,
                                   n_charges=0, updated_at=now))
            txn.add_event("budget_reset", analyst, dataset, None, {
                "confirm": True, "previous_generation": row.generation, "charges_forgotten": len(rows),
                "spent_epsilon_forgotten": row.spent_epsilon, "spent_delta_forgotten": row.spent_delta})
        self.store.transaction(fn)

    # -- reading ----------------------------------------------------------------------------
    def history(self, analyst: str | None = None, dataset: str | None = None) -> list[ChargeRecord]:
        return self.store.read(lambda txn: txn.charges(analyst, dataset))

    def events(self, analyst: str | None = None, dataset: str | None = None, kind: str | None = None) -> list[Event]:
        return self.store.read(lambda txn: txn.events(analyst, dataset, kind))


def cost_to_json_checked(cost: PrivacyCost) -> str:
    try:
        return cost_to_json(cost)
    except (ValueError, TypeError):
        raise InvalidParameter("cost fields must be finite numbers") from None


def _spent_dict(s: Spent | None) -> dict | None:
    return None if s is None else asdict(s)


def _budget_dict(b: Budget) -> dict:
    d = asdict(b)
    d.pop("analyst", None)
    d.pop("dataset", None)
    return d
