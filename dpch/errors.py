"""DPCH exceptions. Messages name the construct or parameter at fault, never a data value.

An error may carry `Advice`: what to do next, written once per interface (issue 31). A Python API
user is told a Python call, a CLI user a `dpch` command, and a gateway analyst what to ask the
gateway's administrator. The interface is a context variable: the CLI entry (`dpch.cli.main`) and the
gateway's error mapping set it; the default is the Python API. Advice is rendered when the error is
turned into text, so the interface that reports the error is the one whose advice is shown.
"""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterable, Iterator  # not typing/dataclasses: `import dpch` stays light

PYTHON, CLI, GATEWAY = "python", "cli", "gateway"
_INTERFACE: contextvars.ContextVar[str | None] = contextvars.ContextVar("dpch_interface", default=None)
_PROCESS = [PYTHON]  # the default of this process's threads (a thread starts with an empty context)


def current_interface() -> str:
    """The interface whose advice errors show here: "python" (default), "cli" or "gateway"."""
    return _INTERFACE.get() or _PROCESS[0]


def set_process_interface(name: str) -> None:
    """The default interface of every thread of this process (`dpch serve`: the gateway's worker
    threads, where no context was set)."""
    _check_interface(name)
    _PROCESS[0] = name


def _check_interface(name: str) -> None:
    if name not in (PYTHON, CLI, GATEWAY):
        raise ValueError(f"unknown interface {name!r}")


@contextlib.contextmanager
def interface(name: str) -> Iterator[None]:
    """Errors rendered inside this block advise in the words of interface `name`."""
    _check_interface(name)
    token = _INTERFACE.set(name)
    try:
        yield
    finally:
        _INTERFACE.reset(token)


class Advice:
    """What to do next, per interface. Holds names (tables, analysts, datasets), never data values."""

    __slots__ = ("python", "cli", "gateway")

    def __init__(self, python: str, cli: str, gateway: str):
        self.python, self.cli, self.gateway = python, cli, gateway

    def render(self, name: str | None = None) -> str:
        return getattr(self, name or current_interface())


class DPCHError(Exception):
    """Base class for every error DPCH raises on purpose. `advice` (optional) is appended to the
    message in the words of the current interface."""

    def __init__(self, *args, advice: Advice | None = None):
        super().__init__(*args)
        self.advice = advice

    @property
    def message(self) -> str:
        """The message without advice."""
        return super().__str__()

    def __str__(self) -> str:
        return f"{self.message} {self.advice.render()}" if self.advice is not None else self.message


class InvalidParameter(DPCHError, ValueError):
    """A privacy parameter (epsilon, delta, bounds, ...) is out of its valid range."""


class QueryRejected(DPCHError):
    """The controller cannot make this query private. Nothing ran and nothing was charged."""


class BudgetExceeded(DPCHError):
    """The ledger refused the charge: the query would overspend. Nothing ran."""


class LedgerError(DPCHError):
    """The ledger is missing, unreadable or inconsistent. No query is answered (fail closed)."""


class NoBudget(BudgetExceeded, LedgerError):
    """No budget is set for this analyst on this dataset. Nothing ran and nothing was charged.
    A BudgetExceeded (the charge is refused) and a LedgerError (the ledger has no row for it), so
    handlers written for either keep working."""

    def __init__(self, analyst: str, dataset: str):
        super().__init__(f"no budget set for analyst {analyst!r} on dataset {dataset!r}.",
                         advice=Advice(
                             python=f"Set one with db.ledger.set_budget({analyst!r}, {dataset!r}, epsilon=EPS, "
                                    "delta=DELTA) (an administrator's call).",
                             cli=f"An administrator runs: dpch budget set --analyst {analyst} --dataset {dataset} "
                                 "--epsilon EPS [--delta DELTA] [--accountant NAME]",
                             gateway=f"Ask the gateway's administrator to run `dpch budget set --analyst {analyst} "
                                     f"--dataset {dataset} --epsilon EPS` on the gateway's data directory."))
        self.analyst, self.dataset = analyst, dataset

    def __reduce__(self):  # rebuilt from its names (the engine worker pickles errors)
        return (NoBudget, (self.analyst, self.dataset))


class CatalogError(DPCHError):
    """The privacy catalog is missing an entry or holds an invalid one."""


def unknown_table(qualified: str, exists: bool | None, known: Iterable[str]) -> CatalogError:
    """The error for a table that is not in the privacy catalog. `exists`: whether the engine has
    it (None: not known or not to be told, e.g. to a gateway analyst); `known`: the catalog's and the
    engine's table names, for "did you mean". Names only: no data value is read."""
    import difflib  # only on this error path: `import dpch` stays light

    candidates = sorted(set(known) - {qualified})
    by_short: dict[str, list[str]] = {}
    for name in candidates:
        by_short.setdefault(name.split(".")[-1], []).append(name)
    # the table name first (a misspelled name in the right or the default database), then db.name
    close = [name for short in difflib.get_close_matches(qualified.split(".")[-1], list(by_short), n=3, cutoff=0.7)
             for name in by_short[short]]
    close += [name for name in difflib.get_close_matches(qualified, candidates, n=3, cutoff=0.8) if name not in close]
    close = close[:3]
    mean = f" Did you mean {' or '.join(close)}?" if close else ""
    if exists is False:
        return CatalogError(f"table {qualified} does not exist.{mean}")
    state = "exists but is" if exists else "does not exist or is"
    return CatalogError(
        f"table {qualified} {state} not in the privacy catalog.{mean}",
        advice=Advice(
            python=f"Register it first: db.catalog.register({qualified!r}, privacy_unit=..., bounds={{...}})",
            cli=f"Register it first: dpch catalog register {qualified} --privacy-unit COLUMN --bounds COL=LO:HI",
            gateway="Ask the gateway's administrator to register it in the privacy catalog."))


class BackendError(DPCHError):
    """The ClickHouse engine (embedded or server) failed to run a statement."""


class DataDirInUse(BackendError):
    """Another process holds the embedded engine's data directory (chDB: one process per store)."""
