"""Top-n queries: ``... GROUP BY k ORDER BY <COUNT or SUM> DESC LIMIT n`` (docs/CONTROLLER.md, "Top-k").

Two ways to answer one, both differentially private:

- **post-processing**: every group's value is noised (the usual plan) and the noisy values are
  sorted; the top n of a noisy histogram is post-processing of it.
- **peeling**: the n groups are chosen by n rounds of permute-and-flip over the true scores
  (``dpch.mechanisms.TopKMechanism``; the peeling exponential mechanisms of Durfee & Rogers 2019)
  at ε_top, and only the chosen groups' values are then noised. The selection's score moves by at
  most Δ = the most one unit adds to one group's score, however many groups the unit touches, and
  the released values belong to n groups, so one unit moves at most min(k, n) of them: their
  sensitivity is the plan's with k replaced by min(k, n). Composition: the selection is ε_top-DP;
  given the chosen groups (a public set once released) the values are a mechanism with that
  smaller sensitivity (adaptive sequential composition, Dwork & Roth Thm 3.16).

``choose`` compares the two plans by a data-independent score: the standard deviation of the
noise that decides the order (post-processing: the score quantity's noise; peeling: the round's
Gumbel-equivalent spread π/√6 · T, or the chosen values' noise if larger). Peeling wins when a
unit contributes to many more groups than n are asked for (k ≫ n), or for n = 1.

Candidates are the public key domain's groups, or the groups released by private partition
selection (their set is public once released, so the selection among them is as above).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from sqlglot import exp

from ..bind import BoundQuery, aggregate_refs
from ..errors import InvalidParameter
from ..mechanisms import TopKMechanism

#: The most rounds a peeling release runs (udf/kernel.pxi TOP_K_MAX_ROUNDS).
MAX_PEELING_ROUNDS = 1 << 12
#: The aggregates a top-n query may order by (their quantity's integer value is the score).
SCORE_FUNCS = ("count", "count_distinct_unit", "count_distinct", "sum")
#: The weight key of the selection's budget share (option weights=).
TOP_K_WEIGHT_KEY = "top_k_selection"
#: Gumbel(T)'s standard deviation is π/√6 · T: the exponential mechanism at temperature T is the
#: argmax of score + Gumbel(T) noise; permute-and-flip is never worse (McKenna & Sheldon, Thm 2).
GUMBEL_STD = math.pi / math.sqrt(6.0)


@dataclass(frozen=True)
class TopKShape:
    """What the query asks: the top ``n`` groups (LIMIT + OFFSET) by aggregate ``aggregate``."""

    aggregate: int
    descending: bool
    n: int


@dataclass
class TopK:
    """A peeling top-n selection in a plan."""

    shape: TopKShape
    quantity: int  # the score's quantity (its true per-group value is the score)
    sensitivity: int  # Δ: the most one unit moves one group's score, in score units
    epsilon: float = 0.0
    weight: float = 1.0
    release_k: int = 1  # groups per unit among the released ones: min(k, n)
    score_only: bool = False  # the ordering aggregate is not an output: its value is not released
    candidates: int | None = None  # the public domain's size (None: the privately selected groups)

    @property
    def n(self) -> int:
        return self.shape.n

    def mechanism(self) -> TopKMechanism:
        return TopKMechanism(self.epsilon, self.n, self.sensitivity)

    @property
    def temperature(self) -> float:
        return float(self.mechanism().temperature)

    def summary(self, grid: float = 1.0) -> dict:
        """What explain and the result metadata show (parameters only)."""
        return {"method": "peeling", "n": self.n, "order": "descending" if self.shape.descending else "ascending",
                "epsilon": self.epsilon, "score_sensitivity": self.sensitivity * grid,
                "temperature": self.temperature * grid, "groups_per_unit_released": self.release_k,
                "values_released": not self.score_only,
                "mechanism": "peeling permute-and-flip (Durfee & Rogers 2019; McKenna & Sheldon 2020)",
                "candidates": self.candidates if self.candidates is not None else "the selected groups",
                # with probability 0.95 every chosen group's score is within this of the best left
                "score_gap_95": (self.mechanism().rank_error(self.candidates, 0.05) * grid
                                 if self.candidates is not None else None)}


def top_k_shape(bound: BoundQuery) -> TopKShape | None:
    """The top-n shape of a grouped query, or None: LIMIT n, no HAVING (it filters before the
    LIMIT in SQL, so it would need every group's value), the first ORDER BY item one COUNT/SUM
    aggregate."""
    if not bound.grouped or bound.limit is None or not bound.order or bound.having is not None:
        return None
    first = bound.order[0].template
    while isinstance(first, exp.Paren):
        first = first.this
    refs = aggregate_refs(first) if isinstance(first, exp.Column) and not first.table else []
    if len(refs) != 1:
        return None
    i = refs[0]
    if bound.aggregates[i].func not in SCORE_FUNCS:
        return None
    n = bound.limit + (bound.offset or 0)
    if n < 1:
        return None
    return TopKShape(aggregate=i, descending=bound.order[0].desc, n=n)


def require_shape(bound: BoundQuery, method: str) -> TopKShape | None:
    """The shape, raising InvalidParameter when the analyst forced peeling on another query."""
    shape = top_k_shape(bound)
    if method == "peeling":
        if shape is None:
            raise InvalidParameter(
                "top_k='peeling' needs a grouped query whose first ORDER BY item is a COUNT or SUM "
                "aggregate, with LIMIT n and no HAVING")
        if shape.n > MAX_PEELING_ROUNDS:
            raise InvalidParameter(f"top_k='peeling' releases at most {MAX_PEELING_ROUNDS} groups (LIMIT + OFFSET)")
    return shape


def score_sensitivity(kind: str, lo_units: int, hi_units: int, rows: int, substitute: bool) -> int:
    """Δ of one group's score in its integer units: a unit keeps at most ``rows`` rows in a group
    (1 at row level, else min(C, M)); a distinct-unit count moves by 1; a sum by rows · max(|L|,
    |H|) when the unit is added or removed, rows · (max(0, H) - min(0, L)) when it is replaced."""
    if kind == "units":
        return 1
    if kind in ("rows", "distinct"):
        return rows
    b = (max(0, hi_units) - min(0, lo_units)) if substitute else max(abs(lo_units), abs(hi_units))
    return max(1, rows * b)


def noise_std(mechanism: str, scale: float) -> float:
    """The standard deviation of a quantity's noise (Laplace b: √2·b; Gaussian and the optimal
    selection rule: their σ)."""
    return math.sqrt(2.0) * scale if mechanism == "laplace" else scale


def top_k_facts(plan) -> dict | None:
    """What explain and the result metadata say about a top-n query (parameters only): the
    method, and when both were planned, each one's order noise (the ``auto`` choice's score)."""
    t = plan.top_k
    if t is None and plan.top_k_scores is None:
        return None
    if t is None:
        facts: dict = {"method": "post_processing",
                       "mechanism": "every group's value noised, the noisy values sorted (post-processing)"}
    else:
        q = plan.quantities[t.quantity]
        facts = t.summary(q.grid)
        facts["score"] = q.label
    if plan.top_k_scores:
        facts["order_noise_std"] = dict(plan.top_k_scores)
    return facts
