"""The incremental accountant state: one row per budget generation, updated in the transaction of
every charge, so that a charge costs the same at 100 000 prior charges as at 10 (issue 32 item 5).

The row holds the accountant's composed state over the generation's effective costs
(`dpch.accounting.ComposedState`: exact running sums and the query count), the running totals the
budget row and `BudgetStatus` report, the id of the newest charge composed, and a key of the budget
it was composed under. Privacy first: the state is a cache and is trusted only when it provably
describes the current history: its checksum holds, its key is the budget's, its newest charge id is
the generation's newest charge id, and its count and totals match the budget row's running totals.
On any mismatch or a missing row, `load` recomputes from every recorded charge (the full path,
which verifies each charge's checksum and the running totals): it never under-counts. `Ledger.verify`
(and `dpch budget verify`) compares every stored state with a full recomputation and refuses a
ledger whose state passes these checks but differs."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..accounting import ComposedState, CostNotSupported, get_accountant
from ..errors import LedgerError
from .records import BudgetRow, ChargeRecord, check_totals
from .store import LedgerTxn


def budget_key(row: BudgetRow) -> str:
    """What the composed state depends on besides the history: the accountant and its parameters."""
    return json.dumps([row.accountant, row.epsilon, row.delta, row.params], sort_keys=True)


def record_terms(rec: ChargeRecord) -> dict[str, list[float]]:
    """One charge's terms in the running totals (records.totals and records.settlement_split)."""
    settled = rec.outcome == "settled"
    return {"eps": [rec.effective_epsilon], "delta": [rec.effective_delta],
            "rho": [] if rec.effective_rho is None else [rec.effective_rho],
            "realized": [rec.effective_epsilon] if settled else [], "reserved": [] if settled else [rec.epsilon],
            "refunded": [rec.epsilon - rec.effective_epsilon] if settled else [], "settled": [1.0] if settled else []}


@dataclass(frozen=True)
class BudgetState:
    """The composed state of one budget generation (module docstring)."""

    key: str
    last_id: int
    composed: ComposedState  # the accountant's sums over the effective costs
    totals: ComposedState  # the running totals (record_terms)

    @property
    def n(self) -> int:
        return self.totals.n

    def split(self) -> tuple[float, float, float, int, int]:
        """records.settlement_split of the generation's charges."""
        settled = int(self.totals.value("settled"))
        return (self.totals.value("realized"), self.totals.value("reserved"), self.totals.value("refunded"),
                settled, self.n - settled)

    def after(self, rec: ChargeRecord, composed: ComposedState) -> "BudgetState":
        """The state once `rec` (already inserted, with its id) is charged; `composed` is the
        accountant's state after it (Accountant.decide_from)."""
        return BudgetState(self.key, rec.id, composed, self.totals.extend(record_terms(rec)))

    def to_json(self) -> str:
        return json.dumps({"key": self.key, "last_id": self.last_id, "composed": self.composed.to_json(),
                           "totals": self.totals.to_json()}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "BudgetState":
        d = json.loads(text)
        if not isinstance(d["key"], str) or not isinstance(d["last_id"], int):
            raise ValueError("malformed state")
        return cls(d["key"], d["last_id"], ComposedState.from_json(d["composed"]), ComposedState.from_json(d["totals"]))


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-12 * max(1.0, abs(a), abs(b))


def rebuild(path: Path | None, row: BudgetRow, rows: Sequence[ChargeRecord]) -> BudgetState:
    """The full recomputation over every charge of the generation (running totals checked)."""
    check_totals(path, row, rows)
    try:
        composed = get_accountant(row.accountant).fold(row.budget(), [r.effective_cost() for r in rows])
    except CostNotSupported as exc:
        raise LedgerError(f"ledger {path} is inconsistent: a recorded charge is not covered by the "
                          f"{row.accountant} accountant ({exc.args[0]})") from None
    totals = ComposedState.compose(record_terms(r) for r in rows)
    return BudgetState(budget_key(row), rows[-1].id if rows else 0, composed, totals)


def stored(txn: LedgerTxn, row: BudgetRow) -> BudgetState | None:
    """The stored state of the budget's current generation if it provably describes the current
    history (module docstring), else None. O(1) in the history's length."""
    text = txn.get_state(row.analyst, row.dataset, row.generation)
    if text is None:
        return None
    try:
        st = BudgetState.from_json(text)
    except (ValueError, TypeError, KeyError, ZeroDivisionError):
        return None
    if (st.key != budget_key(row) or st.last_id != txn.last_charge_id(row.analyst, row.dataset, row.generation)
            or st.n != row.n_charges or st.composed.n != st.n
            or not (_close(st.totals.value("eps"), row.spent_epsilon) and _close(st.totals.value("delta"), row.spent_delta)
                    and _close(st.totals.value("rho"), row.spent_rho))):
        return None
    return st


def load(txn: LedgerTxn, path: Path | None, row: BudgetRow) -> BudgetState:
    """The state of the budget's current generation: the stored one when it is trustworthy, else a
    full recomputation (fail closed: never less than the history composes to)."""
    st = stored(txn, row)
    if st is not None:
        return st
    return rebuild(path, row, txn.charges(row.analyst, row.dataset, row.generation))


def save(txn: LedgerTxn, row: BudgetRow, st: BudgetState) -> None:
    txn.put_state(row.analyst, row.dataset, row.generation, st.to_json())


def check(txn: LedgerTxn, path: Path | None, row: BudgetRow, rows: Sequence[ChargeRecord]) -> bool:
    """For verify: False if there is no trustworthy stored state (it will be rebuilt); LedgerError if
    a stored state passes the checks of `stored` but differs from the full recomputation."""
    st = stored(txn, row)
    if st is None:
        return False
    if st != rebuild(path, row, rows):
        raise LedgerError(f"ledger {path} is inconsistent: the incremental accountant state of analyst {row.analyst!r} "
                          f"on dataset {row.dataset!r} differs from a full recomputation of its charges; refusing to "
                          f"answer queries")
    return True
