"""The storage interface behind the ledger: a linearizable store of budgets, charges and events.
`dpch/ledger/sqlite_store.py` is the single-host implementation."""
from __future__ import annotations

from typing import Callable, Protocol, TypeVar

from .records import BudgetRow, ChargeRecord, Event

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

