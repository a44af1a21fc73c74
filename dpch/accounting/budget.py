"""Budgets, decisions and the shared constants of the accountants."""
from __future__ import annotations

import math
from dataclasses import dataclass


REL_TOL = 1e-12

#: The kind the ledger gives a mechanism after an a posteriori settlement (odp_privacy_accounting.md,
#: Alg. 1 line 14): only its realized ε and its reserved δ remain meaningful.
SETTLED_KIND = "settled"

#: A sparse-vector session (dpch.svt, odp_privacy_accounting.md Alg. 2): pure ε-DP with ε = ε1 + ε2
#: (Lemma 8's sup E), so ε²/2-zCDP (Bun & Steinke Prop 1.4); its ODP cells are settled at exit.
SPARSE_VECTOR_KIND = "sparse_vector"

MAX_DECLARED_QUERIES = 100_000


def _le(value: float, limit: float) -> bool:
    """value ≤ limit up to the documented floating-point slack."""
    return value <= limit + REL_TOL * max(1.0, abs(limit))


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return f"{x:.6g}"


# --------------------------------------------------------------------------------------------
# Budgets and results
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Budget:
    """A privacy budget for one (analyst, dataset), interpreted by the named accountant.

    - `epsilon`, `delta`: the total (ε, δ)-DP guarantee the accountant must keep.
    - `max_queries`: N. Required by `optimal`, `paper_gaussian` and the declared mode of
      `advanced`/`adaptive`; for the other accountants an additional cap on the number of queries.
    - `per_query_epsilon`, `per_query_delta`: the declared (ε0, δ0) of every query (declared mode).
    - `gamma`: γ of the paper's Thm 5 (`paper_gaussian`); default ε/2 as in Cor 2.
    - `mechanism_delta`: the part δ'' of δ reserved for the mechanisms' own δ_j (`advanced` filter,
      default δ/2; `zcdp`, default 0: approximate-zCDP mechanisms are then rejected). The rest,
      δ' = δ - δ'', bounds the tail of the privacy loss.
    """

    epsilon: float
    delta: float = 0.0
    accountant: str = "basic"
    max_queries: int | None = None
    per_query_epsilon: float | None = None
    per_query_delta: float = 0.0
    gamma: float | None = None
    mechanism_delta: float | None = None
    analyst: str = ""
    dataset: str = ""

    PARAM_NAMES = ("max_queries", "per_query_epsilon", "per_query_delta", "gamma", "mechanism_delta")

    def params(self) -> dict:
        """The accountant parameters (everything but ε, δ, accountant and the identity)."""
        return {name: getattr(self, name) for name in self.PARAM_NAMES}

    @property
    def declared(self) -> bool:
        return self.per_query_epsilon is not None


@dataclass(frozen=True)
class Spent:
    """An amount of privacy in an accountant's currency. Fields an accountant does not use are
    0 / None. `queries` counts queries (spent) or the queries still allowed (remaining; None when
    the accountant puts no limit on their number)."""

    epsilon: float = 0.0
    delta: float = 0.0
    rho: float | None = None
    queries: int | None = 0

    def describe(self) -> str:
        parts = [f"ε={_fmt(self.epsilon)}", f"δ={_fmt(self.delta)}"]
        if self.rho is not None:
            parts.append(f"ρ={_fmt(self.rho)}")
        if self.queries is not None:
            parts.append(f"queries={self.queries}")
        return ", ".join(parts)


@dataclass(frozen=True)
class Decision:
    ok: bool
    reason: str
    spent_after: Spent  # what is spent if the query is accepted (unchanged state if rejected)
    remaining: Spent  # what remains after the decision
    needs: Spent | None = None  # the increase the new query asks for (None if not computable)


class CostNotSupported(Exception):
    """Internal: the accountant's theorem does not cover this mechanism (reason in args[0])."""
