"""DPCH exceptions. Messages name the construct or parameter at fault, never a data value."""


class DPCHError(Exception):
    """Base class for every error DPCH raises on purpose."""


class InvalidParameter(DPCHError, ValueError):
    """A privacy parameter (epsilon, delta, bounds, ...) is out of its valid range."""


class QueryRejected(DPCHError):
    """The controller cannot make this query private. Nothing ran and nothing was charged."""


class BudgetExceeded(DPCHError):
    """The ledger refused the charge: the query would overspend. Nothing ran."""


class LedgerError(DPCHError):
    """The ledger is missing, unreadable or inconsistent. No query is answered (fail closed)."""


class CatalogError(DPCHError):
    """The privacy catalog is missing an entry or holds an invalid one."""


class BackendError(DPCHError):
    """The ClickHouse engine (embedded or server) failed to run a statement."""


class DataDirInUse(BackendError):
    """Another process holds the embedded engine's data directory (chDB: one process per store)."""
