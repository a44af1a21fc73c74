"""The storage interface behind the ledger: a linearizable store of budgets, charges and events.
`dpch/ledger/sqlite_store.py` is the single-host implementation, `dpch/ledger/postgres_store.py` the
shared one (several gateways on one PostgreSQL ledger)."""
from __future__ import annotations

from typing import Callable, Protocol, TypeVar

from .records import BudgetRow, ChargeRecord, Event, check_totals

T = TypeVar("T")

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
    def last_charge_id(self, analyst: str, dataset: str, generation: int) -> int: ...  # 0: none; O(log n)
    # the incremental accountant state (dpch/ledger/state.py): None if missing or its checksum fails
    def get_state(self, analyst: str, dataset: str, generation: int) -> str | None: ...
    def put_state(self, analyst: str, dataset: str, generation: int, state: str) -> None: ...
    def add_event(self, kind: str, analyst: str | None, dataset: str | None, charge_id: int | None,
                  detail: dict) -> int: ...
    def events(self, analyst: str | None = None, dataset: str | None = None,
               kind: str | None = None, charge_id: int | None = None) -> list[Event]: ...


class LedgerStore(Protocol):
    """A linearizable store. `transaction(fn)` runs fn(txn) as ONE serializable transaction and
    returns its result; if fn raises, nothing it wrote is kept. ``durable=False`` may return before
    the commit is on stable storage (atomic still; for records whose loss is conservative). A store may call fn more than once
    (to retry after a serialization conflict), so fn must have no other side effects. `read(fn)`
    runs fn on a consistent snapshot. `verify()` checks the stored bytes (schema, checksums, running
    totals) and raises LedgerError."""

    def transaction(self, fn: Callable[[LedgerTxn], T], *, durable: bool = True) -> T: ...
    def read(self, fn: Callable[[LedgerTxn], T]) -> T: ...
    def verify(self) -> None: ...
    def backup(self, dest: str) -> None: ...  # a consistent copy, via the store's own means
    def close(self) -> None: ...



def check_rows(txn, path) -> None:
    """The store-independent part of `LedgerStore.verify`: every row's checksum (read through the
    transaction), the event chain, and each budget's running totals against its charges."""
    charges = txn.charges()
    txn.check_event_chain()
    by_budget: dict[tuple[str, str, int], list[ChargeRecord]] = {}
    for c in charges:
        by_budget.setdefault((c.analyst, c.dataset, c.generation), []).append(c)
    for b in txn.list_budgets():
        check_totals(path, b, by_budget.get((b.analyst, b.dataset, b.generation), []))
