"""DPCH: differential privacy for ClickHouse.

    import dpch
    db = dpch.connect()                      # embedded ClickHouse (chDB)
    db.raw_query("SELECT dp_count(1.0) FROM t")
"""
from .connection import Connection, connect
from .errors import (BackendError, BudgetExceeded, CatalogError, DPCHError, InvalidParameter,
                     LedgerError, QueryRejected)

__version__ = "0.1.0"
__all__ = ["connect", "Connection", "DPCHError", "InvalidParameter", "QueryRejected",
           "BudgetExceeded", "LedgerError", "CatalogError", "BackendError"]
