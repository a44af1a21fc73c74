"""DPCH: differential privacy for ClickHouse.

    import dpch
    db = dpch.connect()                      # embedded ClickHouse (chDB)
    db.raw_query("SELECT dp_count(1.0) FROM t")

`connect`/`Connection` are imported lazily: the UDF program imports `dpch.calibration` in every
pool process, and must not pay for pandas and chDB at start-up.
"""
import importlib

from .errors import (BackendError, BudgetExceeded, CatalogError, DPCHError, InvalidParameter,
                     LedgerError, QueryRejected)

__version__ = "0.1.0"
__all__ = ["connect", "Connection", "DPCHError", "InvalidParameter", "QueryRejected",
           "BudgetExceeded", "LedgerError", "CatalogError", "BackendError"]


def __getattr__(name: str):
    if name in ("connect", "Connection"):
        # importlib, not ``from . import``: the facade depends on nothing statically (no import cycle)
        return getattr(importlib.import_module("dpch.connection"), name)
    raise AttributeError(f"module 'dpch' has no attribute {name!r}")
