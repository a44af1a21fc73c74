"""The SQLite schema of the ledger and one transaction's reads and writes over it (`SQLiteTxn`,
the `LedgerTxn` of `SQLiteLedgerStore`). Every row carries a checksum of its values; the events
table is also chained: `meta` holds its row count and the hash of its last row, so that deleting
or truncating events is detected."""
from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from pathlib import Path

from ..errors import LedgerError
from .records import BudgetRow, ChargeRecord, Event, row_checksum

# the incremental accountant state (dpch/ledger/state.py): created by new ledgers and, IF NOT EXISTS,
# when an older schema-2 ledger is opened; a missing or stale row is recomputed, never trusted
STATE_TABLE = """CREATE TABLE IF NOT EXISTS budget_state (
        analyst TEXT NOT NULL, dataset TEXT NOT NULL, generation INTEGER NOT NULL,
        state TEXT NOT NULL, checksum TEXT NOT NULL,
        PRIMARY KEY (analyst, dataset, generation))"""
STATE_COLUMNS = ["analyst", "dataset", "generation", "state", "checksum"]

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
    STATE_TABLE,
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

SCHEMA = _SCHEMA
COLUMNS = _COLUMNS
# meta keys of the event chain: number of events and hash of the chain up to the last one
EVENT_COUNT, EVENT_HEAD = "event_count", "event_head"
CHAIN_START = "0" * 64


def chain_hash(head: str, event_checksum: str) -> str:
    """Next link of the event chain: sha256(previous head ‖ row checksum)."""
    return hashlib.sha256(f"{head}:{event_checksum}".encode()).hexdigest()


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


class SQLiteTxn:
    """The `LedgerTxn` of `SQLiteLedgerStore`: reads verify each row's checksum."""

    def __init__(self, conn: sqlite3.Connection, path: Path, row_cache: dict | None = None):
        self.conn = conn
        self.path = path
        # verified charge rows of this process, keyed by the full raw row (checksum included): a row
        # whose bytes are identical to an already verified one needs no new checksum or JSON parse
        self.row_cache = {} if row_cache is None else row_cache

    # -- budgets ----------------------------------------------------------------------------
    def _budget_row(self, row) -> BudgetRow:
        values, checksum = list(row[:-1]), row[-1]
        if row_checksum(values) != checksum:
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
        self._upsert("budgets", _COLUMNS["budgets"], 2, values + [row_checksum(values)])

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
        if row_checksum(values) != checksum:
            raise LedgerError(f"ledger {self.path}: charge #{values[0]} fails its checksum (corrupted); "
                              f"refusing to answer queries")
        (cid, analyst, dataset, gen, acc, mech, summary, eps, dlt, rho, realized, e_eps, e_dlt, e_rho, qh, qt,
         outcome, created, updated) = values
        return ChargeRecord(id=cid, analyst=analyst, dataset=dataset, generation=gen, accountant=acc, summary=summary,
                            epsilon=eps, delta=dlt, rho=rho, effective_epsilon=e_eps, effective_delta=e_dlt,
                            effective_rho=e_rho, query_hash=qh, query_text=qt, outcome=outcome, created_at=created,
                            updated_at=updated, cost_json=mech, realized_json=realized)

    def _select(self, table: str, **equal):
        """Rows of ``table`` (all columns, by id) whose columns equal the given non-None values."""
        given = {col: val for col, val in equal.items() if val is not None}
        sql = f"SELECT {', '.join(_COLUMNS[table])} FROM {table}"
        if given:
            sql += " WHERE " + " AND ".join(f"{col}=?" for col in given)
        return self.conn.execute(sql + " ORDER BY id", list(given.values()))

    def charges(self, analyst=None, dataset=None, generation=None):
        return [self._charge_row(r) for r in self._select("charges", analyst=analyst, dataset=dataset,
                                                          generation=generation)]

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
                          f"({', '.join('?' * len(_COLUMNS['charges']))})", values + [row_checksum(values)])
        return cid

    def update_charge(self, rec):
        values = _charge_values(rec, rec.id)
        sets = ", ".join(f"{c}=?" for c in _COLUMNS["charges"][1:-1])
        cur = self.conn.execute(f"UPDATE charges SET {sets}, checksum=? WHERE id=?",
                                values[1:] + [row_checksum(values), rec.id])
        if cur.rowcount != 1:
            raise LedgerError(f"ledger {self.path}: charge #{rec.id} vanished during an update")

    def last_charge_id(self, analyst, dataset, generation):
        # ORDER BY ... LIMIT 1, not MAX(id): PostgreSQL 15 aggregates MAX over every matching index
        # entry here, while this reads one from the end of charges_by_budget (both stores)
        row = self.conn.execute("SELECT id FROM charges WHERE analyst=? AND dataset=? AND generation=? "
                                "ORDER BY id DESC LIMIT 1", (analyst, dataset, generation)).fetchone()
        return 0 if row is None else row[0]

    # -- incremental accountant state -------------------------------------------------------
    def get_state(self, analyst, dataset, generation):
        row = self.conn.execute("SELECT state, checksum FROM budget_state WHERE analyst=? AND dataset=? AND generation=?",
                                (analyst, dataset, generation)).fetchone()
        if row is None or row_checksum([analyst, dataset, int(generation), row[0]]) != row[1]:
            return None  # missing or altered: the caller recomputes from the charges
        return row[0]

    def put_state(self, analyst, dataset, generation, state):
        values = [analyst, dataset, int(generation), state]
        self._upsert("budget_state", STATE_COLUMNS, 3, values + [row_checksum(values)])

    # -- events -----------------------------------------------------------------------------
    def add_event(self, kind, analyst, dataset, charge_id, detail):
        ts = time.time()
        detail_json = json.dumps(detail, sort_keys=True, allow_nan=True, default=str)
        eid = self._next_id("events")
        values = [eid, ts, kind, analyst, dataset, charge_id, detail_json]
        checksum = row_checksum(values)
        self.conn.execute("INSERT INTO events (id, ts, kind, analyst, dataset, charge_id, detail, checksum) "
                          "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", values + [checksum])
        count, head = self.event_chain()
        self._set_meta(EVENT_COUNT, str(count + 1))
        self._set_meta(EVENT_HEAD, chain_hash(head, checksum))
        return eid

    def _set_meta(self, key: str, value: str) -> None:
        self._upsert("meta", _COLUMNS["meta"], 1, [key, value])

    def _upsert(self, table: str, cols: list[str], n_key: int, values: list) -> None:
        """Insert or replace the row whose first ``n_key`` columns are its key (SQL that SQLite
        and PostgreSQL both read)."""
        sets = ", ".join(f"{c}=excluded.{c}" for c in cols[n_key:])
        self.conn.execute(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))}) "
                          f"ON CONFLICT ({', '.join(cols[:n_key])}) DO UPDATE SET {sets}", values)

    def event_chain(self) -> tuple[int, str]:
        """(count, head) of the event chain as recorded in meta."""
        meta = dict(self.conn.execute("SELECT key, value FROM meta WHERE key IN (?, ?)", (EVENT_COUNT, EVENT_HEAD)))
        if EVENT_COUNT not in meta or EVENT_HEAD not in meta:
            raise LedgerError(f"ledger {self.path}: the event chain's count and head are missing (tampered); "
                              f"refusing to answer queries")
        try:
            return int(meta[EVENT_COUNT]), meta[EVENT_HEAD]
        except ValueError:
            raise LedgerError(f"ledger {self.path}: the event chain's count is unreadable (tampered)") from None

    def init_event_chain(self) -> None:
        """Start the chain over the events already stored (new ledgers, and schema 1 → 2)."""
        count, head = 0, CHAIN_START
        for (checksum,) in self.conn.execute("SELECT checksum FROM events ORDER BY id"):
            count, head = count + 1, chain_hash(head, checksum)
        self._set_meta(EVENT_COUNT, str(count))
        self._set_meta(EVENT_HEAD, head)

    def check_event_chain(self) -> None:
        """Every event row's checksum, and the chain over all of them against meta's count and head:
        a deleted, inserted, reordered or truncated event raises LedgerError."""
        want_count, want_head = self.event_chain()
        count, head = 0, CHAIN_START
        for row in self._select("events"):
            self._event_row(row)
            count, head = count + 1, chain_hash(head, row[-1])
        if count != want_count or head != want_head:
            raise LedgerError(f"ledger {self.path}: the event log does not match its chain ({count} events stored, "
                              f"{want_count} recorded): events were deleted or altered; refusing to answer queries")

    def _event_row(self, row) -> Event:
        values, checksum = list(row[:-1]), row[-1]
        if row_checksum(values) != checksum:
            raise LedgerError(f"ledger {self.path}: event #{values[0]} fails its checksum (corrupted)")
        try:
            detail = json.loads(values[6])
        except ValueError:
            raise LedgerError(f"ledger {self.path}: event #{values[0]} is unreadable") from None
        return Event(values[0], values[1], values[2], values[3], values[4], values[5], detail)

    def events(self, analyst=None, dataset=None, kind=None, charge_id=None):
        return [self._event_row(r) for r in self._select("events", analyst=analyst, dataset=dataset, kind=kind,
                                                         charge_id=charge_id)]

