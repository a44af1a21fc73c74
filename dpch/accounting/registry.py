"""The accountants by name, and budgets built and validated by them."""
from __future__ import annotations

from dataclasses import fields

from ..errors import InvalidParameter
from .budget import Budget
from .accountants import Accountant, AdaptiveAccountant, AdvancedAccountant, BasicAccountant, OptimalAccountant, PaperGaussianAccountant, PureAccountant, ZcdpAccountant
from .odp import OdpAccountant

ACCOUNTANTS: dict[str, Accountant] = {
    a.name: a for a in (PureAccountant(), BasicAccountant(), AdvancedAccountant(), OptimalAccountant(),
                        AdaptiveAccountant(), PaperGaussianAccountant(), ZcdpAccountant(), OdpAccountant())
}
Accountant.settlement_names = tuple(n for n, a in ACCOUNTANTS.items() if a.supports_settlement)


def get_accountant(name: str) -> Accountant:
    try:
        return ACCOUNTANTS[name]
    except KeyError:
        raise InvalidParameter(f"unknown accountant {name!r}; choose one of: {', '.join(ACCOUNTANTS)}") from None


def make_budget(epsilon: float, delta: float = 0.0, accountant: str = "basic", **params) -> Budget:
    """Build and validate a Budget. Raises InvalidParameter on an unknown parameter or a budget the
    accountant's theorem cannot honour."""
    unknown = set(params) - set(Budget.PARAM_NAMES) - {"analyst", "dataset"}
    if unknown:
        raise InvalidParameter(f"unknown budget parameter(s): {', '.join(sorted(unknown))}; "
                               f"known: {', '.join(Budget.PARAM_NAMES)}")
    clean = {k: v for k, v in params.items() if v is not None or k in ("analyst", "dataset")}
    if clean.get("per_query_delta") is None:
        clean.pop("per_query_delta", None)
    try:
        epsilon = float(epsilon)
        delta = float(delta)
    except (TypeError, ValueError):
        raise InvalidParameter("epsilon and delta must be numbers") from None
    for name in ("per_query_epsilon", "per_query_delta", "gamma", "mechanism_delta"):
        if name in clean:
            try:
                clean[name] = float(clean[name])
            except (TypeError, ValueError):
                raise InvalidParameter(f"{name} must be a number") from None
    budget = Budget(epsilon=epsilon, delta=delta, accountant=accountant, **clean)
    return get_accountant(accountant).validate(budget)


def budget_fields() -> list[str]:
    return [f.name for f in fields(Budget)]
