"""The ledger's records: what is stored, how it is (de)serialized and checksummed, and the checks
on the running totals. Pure data: no storage and no I/O here."""
from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

from ..accounting import Budget, CostNotSupported, Spent, _fmt, dp_params
from ..cost import MechanismCost, PrivacyCost
from ..errors import InvalidParameter, LedgerError

SCHEMA_VERSION = 2
APPLICATION_ID = 0x44504348  # "DPCH", stored in the SQLite header (offset 68)
APP_NAME = "dpch-ledger"
OUTCOMES = ("reserved", "executed", "failed", "settled")


def is_ledger_url(target: object) -> bool:
    """A PostgreSQL ledger (``postgresql://…``) rather than an SQLite file."""
    return isinstance(target, str) and target.startswith(("postgresql://", "postgres://"))


def default_ledger_path() -> Path | str:
    """$DPCH_LEDGER (a file, or a ``postgresql://`` URL), else <data dir>/ledger.sqlite with data
    dir = $DPCH_DATA_DIR or ./.dpch_data (the embedded engine's data directory; `dpch.connect` uses
    the same default)."""
    env = os.environ.get("DPCH_LEDGER")
    if env:
        return env if is_ledger_url(env) else Path(env)
    return Path(os.environ.get("DPCH_DATA_DIR") or "./.dpch_data") / "ledger.sqlite"


# --------------------------------------------------------------------------------------------
# Public records
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Receipt:
    """Proof that a query's cost was charged (and committed) before it ran.

    `token` is the capability to settle the charge (`Ledger.settle`): a random secret that exists
    only in the memory of the process that charged; the ledger keeps its SHA-256 in the charge's
    event. A receipt rebuilt from the history, or lost in a crash, cannot settle: the charge then
    stays at its worst case for good (fail closed). It is never shown (repr) and never compared."""

    id: int
    analyst: str
    dataset: str
    accountant: str
    cost: PrivacyCost
    query_hash: str
    created_at: float
    spent_after: Spent
    remaining: Spent
    token: str = field(default="", repr=False, compare=False)


@dataclass(frozen=True)
class Settlement:
    """What `Ledger.settle` did to one charge (odp_privacy_accounting.md Alg. 1 line 14): the ε it
    reserved (sup E, Alg. 1 line 9), the realised ε it counts at now, the refund (their difference)
    and the δ it keeps (never refunded, line 15). `replayed` is True when the same settlement had
    already been recorded and nothing changed (settle is idempotent)."""

    charge_id: int
    reserved_epsilon: float
    realized_epsilon: float
    refund_epsilon: float
    delta: float
    replayed: bool = False


@dataclass(frozen=True)
class BudgetStatus:
    """A budget and what its current generation spent. `spent`/`remaining` are in the accountant's
    currency. The output-DP split (basic composition of the charges' own numbers, whatever the
    accountant): `realized_epsilon` is what the `settled` charges count at (their realised ε),
    `reserved_epsilon` what the `unsettled` ones (reserved, executed, failed) hold at their worst
    case, and `refunded_epsilon` what settlement gave back (reserved - realised of the settled)."""

    analyst: str
    dataset: str
    budget: Budget
    spent: Spent
    remaining: Spent
    queries: int
    generation: int
    realized_epsilon: float = 0.0
    reserved_epsilon: float = 0.0
    refunded_epsilon: float = 0.0
    settled: int = 0
    unsettled: int = 0

    def describe(self) -> str:
        text = (f"analyst {self.analyst!r} on dataset {self.dataset!r} ({self.budget.accountant}): "
                f"spent {self.spent.describe()}; remaining {self.remaining.describe()}")
        if self.settled or self.budget.accountant == "odp":
            text += (f"; output DP: {self.settled} settled at realised ε={_fmt(self.realized_epsilon)} "
                     f"(refunded {_fmt(self.refunded_epsilon)}), {self.unsettled} held at worst case "
                     f"ε={_fmt(self.reserved_epsilon)}")
        return text


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


def cost_numbers(cost: PrivacyCost) -> tuple[float, float, float | None]:
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


def row_checksum(values: Sequence[Any]) -> str:
    blob = json.dumps(list(values), sort_keys=True, allow_nan=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def check_name(value: str, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidParameter(f"{what} must be a non-empty string")
    value = value.strip()
    if len(value) > 256 or any(ord(c) < 32 for c in value):
        raise InvalidParameter(f"{what} must be at most 256 printable characters")
    return value


def settlement_split(rows: Sequence[ChargeRecord]) -> tuple[float, float, float, int, int]:
    """(realised ε of the settled, worst-case ε of the unsettled, refunded ε, #settled, #unsettled)."""
    settled = [r for r in rows if r.outcome == "settled"]
    held = [r for r in rows if r.outcome != "settled"]
    return (math.fsum(r.effective_epsilon for r in settled), math.fsum(r.epsilon for r in held),
            math.fsum(r.epsilon - r.effective_epsilon for r in settled), len(settled), len(held))


def totals(rows: Sequence[ChargeRecord]) -> tuple[float, float, float, int]:
    return (math.fsum(r.effective_epsilon for r in rows), math.fsum(r.effective_delta for r in rows),
            math.fsum(r.effective_rho for r in rows if r.effective_rho is not None), len(rows))


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-12 * max(1.0, abs(a), abs(b))


def check_totals(path: Path, b: BudgetRow, rows: Sequence[ChargeRecord]) -> None:
    eps, dlt, rho, n = totals(rows)
    if n != b.n_charges or not (_close(eps, b.spent_epsilon) and _close(dlt, b.spent_delta) and _close(rho, b.spent_rho)):
        raise LedgerError(f"ledger {path} is inconsistent: the running totals of analyst {b.analyst!r} on dataset "
                          f"{b.dataset!r} do not match its charges; refusing to answer queries")


def cost_to_json_checked(cost: PrivacyCost) -> str:
    try:
        return cost_to_json(cost)
    except (ValueError, TypeError):
        raise InvalidParameter("cost fields must be finite numbers") from None


def spent_dict(s: Spent | None) -> dict | None:
    return None if s is None else asdict(s)


def budget_dict(b: Budget) -> dict:
    d = asdict(b)
    d.pop("analyst", None)
    d.pop("dataset", None)
    return d
