"""What a single mechanism costs in each currency (pure ε, (ε, δ), ρ)."""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Iterable

from ..cost import MechanismCost, PrivacyCost
from ..errors import InvalidParameter
from .budget import CostNotSupported, SETTLED_KIND, SPARSE_VECTOR_KIND, _fmt

# --------------------------------------------------------------------------------------------
# What a single mechanism costs in each currency
# --------------------------------------------------------------------------------------------

def _check_mechanism(m: MechanismCost) -> None:
    for name in ("sensitivity", "scale", "epsilon", "delta"):
        v = getattr(m, name)
        if not isinstance(v, (int, float)) or math.isnan(v) or math.isinf(v) or v < 0:
            raise CostNotSupported(f"mechanism {m.label or m.kind!r}: {name} must be a finite number >= 0")
    if m.rho is not None and (math.isnan(m.rho) or math.isinf(m.rho) or m.rho < 0):
        raise CostNotSupported(f"mechanism {m.label or m.kind!r}: rho must be a finite number >= 0")
    if m.delta >= 1:
        raise CostNotSupported(f"mechanism {m.label or m.kind!r}: δ must be < 1")


def _ratio(m: MechanismCost) -> float:
    """S(f)/p: sensitivity over the noise scale (b for Laplace, σ for Gaussian)."""
    if m.scale <= 0:
        if m.sensitivity == 0:
            return 0.0
        raise CostNotSupported(f"mechanism {m.label or m.kind!r}: noise scale must be > 0")
    return m.sensitivity / m.scale


@lru_cache(maxsize=65536)
def pure_epsilon(m: MechanismCost) -> float:
    """ε of a pure ε-DP mechanism: S(f)/b for Laplace (the paper, Thm 1), the declared ε for a
    δ = 0 threshold or a settled charge. The larger of S/b and the declared ε is used (fail closed
    if the two disagree)."""
    _check_mechanism(m)
    if m.delta > 0:
        raise CostNotSupported(f"mechanism {m.label or m.kind!r} is ({_fmt(m.epsilon)}, {_fmt(m.delta)})-DP, not pure ε-DP")
    if m.kind == "laplace":
        return max(m.epsilon, _ratio(m))
    if m.kind in ("threshold", "exponential", SPARSE_VECTOR_KIND, SETTLED_KIND):
        return m.epsilon
    raise CostNotSupported(f"{m.kind} mechanism {m.label!r} is not pure ε-DP")


@lru_cache(maxsize=65536)
def dp_params(m: MechanismCost) -> tuple[float, float]:
    """(ε, δ) of one mechanism for (ε, δ)-composition."""
    _check_mechanism(m)
    if m.kind == "laplace":
        return max(m.epsilon, _ratio(m)), m.delta
    if m.kind == "gaussian":
        if m.delta <= 0:
            raise CostNotSupported(f"gaussian mechanism {m.label!r} declares δ = 0; a Gaussian is not (ε, 0)-DP")
        if m.epsilon <= 0 and m.sensitivity > 0:
            raise CostNotSupported(f"gaussian mechanism {m.label!r} declares ε = 0")
        return m.epsilon, m.delta
    if m.kind in ("threshold", "exponential", SPARSE_VECTOR_KIND, SETTLED_KIND):
        return m.epsilon, m.delta
    raise CostNotSupported(f"unknown mechanism kind {m.kind!r}")


@lru_cache(maxsize=65536)
def zcdp_rho(m: MechanismCost) -> tuple[float, float]:
    """(ρ, δ_approx) of one mechanism: Gaussian ρ = Δ₂²/(2σ²) (Bun & Steinke Prop 1.6; the discrete
    Gaussian of docs/NOISE.md too, Canonne, Kamath & Steinke 2020); a pure ε-DP mechanism is ε²/2-zCDP
    (Bun & Steinke Prop 1.4); an (ε, δ)-DP threshold is δ-approximately ε²/2-zCDP."""
    _check_mechanism(m)
    if m.kind == "gaussian":
        r = _ratio(m)
        return max(m.rho or 0.0, r * r / 2.0), 0.0
    if m.kind == "laplace":
        if m.delta > 0:
            raise CostNotSupported(f"laplace mechanism {m.label!r} declares δ > 0")
        e = max(m.epsilon, _ratio(m))
        return e * e / 2.0, 0.0
    if m.kind in ("threshold", "exponential", SPARSE_VECTOR_KIND):
        return m.epsilon * m.epsilon / 2.0, m.delta
    raise CostNotSupported(f"{m.kind} mechanism {m.label!r} has no zCDP guarantee")


@lru_cache(maxsize=65536)
def query_dp(cost: PrivacyCost) -> tuple[float, float]:
    """(ε_q, δ_q) of a whole query by basic composition of its mechanisms (Dwork & Roth Thm 3.16)."""
    eps, dels = [], []
    for m in cost.mechanisms:
        e, d = dp_params(m)
        eps.append(e)
        dels.append(d)
    return math.fsum(eps), math.fsum(dels)


def _all_mechanisms(costs: Iterable[PrivacyCost]) -> list[MechanismCost]:
    return [m for c in costs for m in c.mechanisms]


# --------------------------------------------------------------------------------------------
# Accountants
# --------------------------------------------------------------------------------------------

def _require(cond: bool, message: str) -> None:
    if not cond:
        raise InvalidParameter(message)


def _finite_pos(x, name: str, *, allow_zero: bool = False) -> None:
    ok = isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and (x >= 0 if allow_zero else x > 0)
    _require(ok, f"{name} must be a finite number {'>= 0' if allow_zero else '> 0'} (got {x!r})")
