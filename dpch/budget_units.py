"""Budgets in the administrator's units: for every accountant, the ε still available at the δ
the administrator set, whatever the accountant's own currency (Σε, Σε², ρ, S²/σ², declared k).

"Remaining ε" here is the largest ε that **one further release** can still use at the budget's δ:

- `basic`, `pure`: ε − Σε_j (and δ − Σδ_j) — basic composition (Dwork & Roth Thm 3.16).
- `zcdp`: the ρ left, ρ_B − Σρ_j, converted to (ε, δ') with the accountant's own conversion
  `dpch.accounting.zcdp_to_dp` (Canonne, Kamath & Steinke 2020 Prop 12, never worse than
  Bun & Steinke 2016 Prop 1.3, ε = ρ + 2√(ρ ln(1/δ'))), δ' = δ − mechanism_delta.
- `advanced` (filter): the largest ε_q with ½(Σε_j² + ε_q²) + √(2 ln(1/δ')(Σε_j² + ε_q²)) ≤ ε
  (`dpch.accounting.advanced_filter_epsilon`, Whitehouse et al. 2023), found by bisection.
- `adaptive` (filter): the larger of the basic and the advanced-filter headroom (it continues while
  either bound holds).
- declared modes (`optimal`, declared `advanced`/`adaptive`): the declared per-query ε0 while
  queries are left, else 0.
- `paper_gaussian`: ε − γ − Σ S²/σ² (the paper, Thm 5: a query fits while Σ S²/σ² + γ ≤ ε; each
  query also needs S/σ ≤ k).

The numbers are read-outs for people; the ledger's accountant alone decides what is charged.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .accounting import (_fmt, advanced_filter_epsilon, get_accountant, zcdp_to_dp)

_BISECT_STEPS = 100


@dataclass(frozen=True)
class BudgetReport:
    analyst: str
    dataset: str
    accountant: str
    epsilon: float  # the budget's ε
    delta: float  # the budget's δ
    epsilon_left: float  # ε one further release can still use at delta_at
    delta_at: float  # the δ that ε is stated at
    epsilon_spent: float  # the (ε, δ) guarantee of what is spent so far, at the budget's δ
    queries: int
    queries_left: int | None = None
    rho: float | None = None  # zCDP: ρ budget
    rho_left: float | None = None
    detail: str = ""

    def __str__(self) -> str:
        out = f"remaining ε = {_fmt(self.epsilon_left)}"
        if self.delta_at > 0:
            out += f" at δ = {_fmt(self.delta_at)}"
        out += f" of ε = {_fmt(self.epsilon)}"
        if self.detail:
            out += f" ({self.detail})"
        out += f"; {self.queries} quer{'y' if self.queries == 1 else 'ies'} charged"
        if self.queries_left is not None:
            out += f", {self.queries_left} left"
        return out


def _largest(fits, hi: float) -> float:
    """The largest x in [0, hi] with fits(x), for a monotone predicate (0 if none)."""
    if hi <= 0 or not fits(0.0):
        return 0.0
    if fits(hi):
        return hi
    lo = 0.0
    for _ in range(_BISECT_STEPS):
        mid = (lo + hi) / 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def _advanced_left(sum_sq: float, delta_prime: float, epsilon: float) -> float:
    return _largest(lambda e: advanced_filter_epsilon(sum_sq + e * e, delta_prime) <= epsilon, epsilon)


def budget_report(status, costs=None) -> BudgetReport:
    """The `BudgetReport` of a `dpch.ledger.BudgetStatus` (from `Ledger.remaining` or `budgets`).
    ``costs``: the counted charges' costs (`ChargeRecord.effective_cost()` of the current generation);
    the advanced/adaptive filters need them (`report_for` fetches them)."""
    b, spent, rem = status.budget, status.spent, status.remaining
    acc = get_accountant(b.accountant)
    name = b.accountant
    common = dict(analyst=status.analyst, dataset=status.dataset, accountant=name, epsilon=b.epsilon,
                  delta=b.delta, epsilon_spent=spent.epsilon, queries=status.queries,
                  queries_left=rem.queries)
    declared = b.per_query_epsilon is not None and name in ("optimal", "advanced", "adaptive")
    if rem.queries == 0:
        return BudgetReport(epsilon_left=0.0, delta_at=b.delta, detail=f"{name}: no queries left", **common)
    if name == "zcdp":
        delta_prime = b.delta - (b.mechanism_delta or 0.0)
        rho_b = acc.limits(b).rho
        rho_left = max(0.0, rho_b - (spent.rho or 0.0))
        eps_left = zcdp_to_dp(rho_left, delta_prime)
        return BudgetReport(epsilon_left=eps_left, delta_at=delta_prime, rho=rho_b, rho_left=rho_left,
                            detail=f"zCDP ρ = {_fmt(rho_left)} left of {_fmt(rho_b)}", **common)
    if declared:
        eps_left = float(b.per_query_epsilon)
        return BudgetReport(epsilon_left=eps_left, delta_at=b.delta,
                            detail=f"{name}, declared: each query ε ≤ ε0 = {_fmt(b.per_query_epsilon)}, "
                                   f"δ ≤ δ0 = {_fmt(b.per_query_delta)}", **common)
    if name == "advanced":
        delta_prime = b.delta - (b.mechanism_delta or 0.0)
        if costs is not None:
            sum_sq = math.fsum(e * e for e in _epsilons(costs))
        else:  # invert the filter bound ε_spent = ½S + √(2 ln(1/δ') S) for S = Σε_j²
            root = -math.sqrt(2 * math.log(1 / delta_prime)) + math.sqrt(
                2 * math.log(1 / delta_prime) + 2 * spent.epsilon) if status.queries else 0.0
            sum_sq = root * root
        left = _advanced_left(sum_sq, delta_prime, b.epsilon)
        return BudgetReport(epsilon_left=left, delta_at=b.delta,
                            detail=f"advanced filter: one further ε-DP release; Σε² = {_fmt(sum_sq)}", **common)
    if name == "adaptive":
        if costs is None:
            raise ValueError("budget_report needs the charges' costs for the adaptive accountant (use report_for)")
        eps = _epsilons(costs)
        basic_left = max(0.0, b.epsilon - math.fsum(eps))
        adv_left = _advanced_left(math.fsum(e * e for e in eps), b.delta, b.epsilon) if b.delta > 0 else 0.0
        return BudgetReport(epsilon_left=max(basic_left, adv_left), delta_at=b.delta if adv_left > basic_left else 0.0,
                            detail="adaptive: the larger of the basic and the advanced-filter headroom", **common)
    if name == "paper_gaussian":
        gamma = b.gamma if b.gamma is not None else b.epsilon / 2
        used = spent.epsilon if status.queries else gamma
        return BudgetReport(epsilon_left=max(0.0, b.epsilon - used), delta_at=b.delta,
                            detail=f"paper Thm 5: Σ S²/σ² + γ ≤ ε with γ = {_fmt(gamma)}", **common)
    # basic, pure
    return BudgetReport(epsilon_left=rem.epsilon, delta_at=rem.delta,
                        detail=f"{name} composition" + ("" if b.delta == 0 else f"; δ left {_fmt(rem.delta)}"),
                        **common)


def _epsilons(costs) -> list[float]:
    """ε_j of every mechanism of every charge (the filters' inputs)."""
    from .accounting import dp_params

    return [dp_params(m)[0] for c in costs for m in c.mechanisms]


def report_for(ledger, analyst: str, dataset: str) -> BudgetReport:
    """The `BudgetReport` of one budget, read from the ledger (status plus the counted charges)."""
    status = ledger.remaining(analyst, dataset)
    costs = [r.effective_cost() for r in ledger.history(analyst, dataset) if r.generation == status.generation]
    return budget_report(status, costs)


def describe_query_cost(epsilon: float, delta: float, rho: float | None, status=None) -> str:
    """What one query spent, in the same units as `BudgetReport`: its ε and δ (basic composition of
    its releases) and, under a zCDP budget, its ρ with the ε it amounts to at the budget's δ'."""
    out = f"spent ε = {_fmt(epsilon)}" + (f", δ = {_fmt(delta)}" if delta else "")
    if status is not None and status.budget.accountant == "zcdp" and rho is not None:
        b = status.budget
        delta_prime = b.delta - (b.mechanism_delta or 0.0)
        out += f" (charged as zCDP ρ = {_fmt(rho)}, i.e. ε = {_fmt(zcdp_to_dp(rho, delta_prime))} at δ = {_fmt(delta_prime)})"
    return out
