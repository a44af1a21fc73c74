"""The privacy-budget ledger: durable, atomic check-and-charge per (analyst, dataset).

Semantics (docs/LEDGER.md has the full note):
- **Charge, then execute.** `Ledger.charge` decides with the budget's accountant
  (`dpch/accounting/`) and records the charge in one transaction. Only after it returns may the
  query run. A refused query raises `BudgetExceeded` (or `QueryRejected` when the accountant's
  theorem does not cover its mechanisms); nothing is charged and the refusal is written to the
  event log.
- **Fail closed.** A charge whose execution failed stays charged (`mark(receipt, "failed")`). A
  missing, unreadable, corrupt or inconsistent ledger raises `LedgerError` and no query is answered;
  the ledger is never silently re-created or reset.
- **A posteriori settlement** (`settle`) refunds ε only as the ODPComposition protocol allows
  (odp_privacy_accounting.md, Alg. 1 and Thm 7; Alg. 6 with the linear ODP filter): the mechanism
  declares its ODP partition values E(P_k) before it runs (`MechanismCost.odp_epsilons`), `charge`
  reserves the worst case sup E, and after it ran the ledger charges E(P_k) of the cell its output
  fell in instead. δ is never refunded (Alg. 1 line 15). Only under simple composition (the `odp`
  accountant, and `basic` and `pure`), which is what Thm 7 proves. An unsettled charge counts at its
  worst case for good; only the process holding the `Receipt` (its settlement token) can settle it;
  settling twice the same way is a no-op, differently is refused.

The storage sits behind `LedgerStore` (a serializable transaction with a handful of reads and
writes). `SQLiteLedgerStore` is the single-host implementation: SQLite in WAL mode,
`synchronous=FULL`, `BEGIN IMMEDIATE` transactions, per-row checksums, a schema-version row.

Modules, along the ledger's own pipeline: `records` (what is stored, checksums), `store` (the
storage interface), `sqlite_txn` (schema and one transaction's reads/writes), `sqlite_store` (the
connection per file per process, file checks, the WAL-identity safety net, backups), `core` (the
`Ledger` itself).
"""
from .core import Ledger
from .records import (APPLICATION_ID, SCHEMA_VERSION, BudgetRow, BudgetStatus, ChargeRecord, Event, Receipt, Settlement,
                      cost_from_json, cost_to_json, default_ledger_path, summarize)
from .sqlite_store import SQLiteLedgerStore
from .store import LedgerStore, LedgerTxn

__all__ = ["APPLICATION_ID", "SCHEMA_VERSION", "BudgetRow", "BudgetStatus", "ChargeRecord", "Event", "Ledger",
           "LedgerStore", "LedgerTxn", "Receipt", "SQLiteLedgerStore", "Settlement", "cost_from_json", "cost_to_json",
           "default_ledger_path", "summarize"]
