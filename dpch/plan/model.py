"""What a plan is: the noisy quantities, the aggregates built from them, the key domains, the
partition selection, the contribution bounds and the whole Plan (dpch.plan's docstring says how
each is decided)."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..bind import AggCall, BoundQuery
from ..catalog import TableEntry
from ..cost import PrivacyCost
from ..mechanisms import QUANTILE_BUCKETS, GaussianMechanism, LaplaceMechanism, QuantileMechanism
from .bounds import Interval
from .top_k import TopK
from .options import QueryOptions


@dataclass
class Quantity:
    """One noisy value per group, computed exactly once."""

    index: int
    key: str  # identity for sharing
    label: str
    kind: str  # "rows" (count of rows matching pred), "units" (distinct units), "sum", "quantile",
    # "distinct" (distinct values of row_sql among the kept rows) or "weighted_units" (the weighted
    # Gaussian selection's Σ unit_weight(j_u, S) per group; selection only, never an aggregate's)
    row_sql: str | None  # per-row Int64 contribution (units); None for plain row counts / units
    lo_units: int  # per-row contribution range in units
    hi_units: int
    grid: float  # value of one unit
    centre: float  # value = centre * count + grid * units
    value_interval: Interval | None = None  # per-row value interval (sums)
    l1: float = 0.0
    l2: float = 0.0
    multi_coordinate: bool = False
    weight: float = 1.0
    mechanism: str = "laplace"
    epsilon: float = 0.0
    delta: float = 0.0
    scale: float = 0.0  # b or σ in units
    is_selection: bool = False
    aggregates: list[int] = field(default_factory=list)  # aggregate indices using it
    # quantile quantities: row_sql is the row's bucket of the 2^16 grid over value_interval (NULL
    # for NULL/NaN), released per group by dpch_quantiles at the levels; rows = the most rows one
    # unit keeps in one group (the histogram's sensitivity), coords = groups one unit can move
    levels: tuple[float, ...] = ()
    rows: int = 1
    coords: int = 1
    # False: a peeling top-n plan's score that no output uses; it orders the groups and is never
    # released (no noise, no budget)
    released: bool = True
    # a noise mechanism object set by the planner (the optimal partition-selection rule's
    # dpch.plan.selection.OptimalSelectionNoise); None: the one named by `mechanism`
    noise: object | None = None

    @property
    def group_epsilon(self) -> float:
        """A quantile's ε per group: one unit moves at most ``coords`` groups' histograms, so each
        group's release gets ε/coords (sequential composition over the groups it touches)."""
        return self.epsilon / self.coords

    @property
    def column(self) -> str:
        return f"__dp_q{self.index}"

    @property
    def noisy_column(self) -> str:
        return f"__dp_n{self.index}"

    def quantile_facts(self, confidence: float) -> dict:
        """What explain and the result metadata say about a quantile quantity (public facts)."""
        return {"levels": list(self.levels), "grid_buckets": QUANTILE_BUCKETS,
                "rows_per_unit_per_group": self.rows, "groups_per_unit": self.coords,
                "epsilon_per_group": self.group_epsilon,
                "rank_halfwidth": self.mechanism_object().rank_halfwidth(len(self.levels), confidence),
                "rank_ci": self.rank_ci(confidence)}

    def rank_ci(self, confidence: float) -> float:
        """±r rows: with probability >= confidence every released level α's bucket has at most
        αn + r rows below it and at least αn − r rows at or below it, besides ties at the grid's
        resolution (docs/CONTROLLER.md "Intervals"). r = rank_halfwidth h for one or two levels (each
        over the whole histogram); for three or more, the recursion's levels inherit their parents'
        errors (a sub-problem's target rank is a convex combination of its ends'), so r = depth · h.
        Public: a function of the parameters only."""
        m = max(1, len(self.levels))
        h = self.mechanism_object().rank_halfwidth(m, confidence)
        return h if len(set(self.levels)) <= 2 else m.bit_length() * h

    def mechanism_object(self):
        if self.noise is not None:
            return self.noise
        if self.mechanism == "exponential":
            return QuantileMechanism(self.group_epsilon, self.rows)
        if self.mechanism == "laplace":
            return LaplaceMechanism(self.scale, True)
        return GaussianMechanism(self.scale, True)

    def noise_sql(self, value_sql: str) -> str:
        return self.mechanism_object().sql(value_sql)

    def ci_halfwidth_units(self, level: float) -> float:
        return self.mechanism_object().ci_halfwidth(level)


@dataclass
class AggregatePlan:
    call: AggCall
    roles: dict[str, int]  # role -> quantity index: "count", "sum", "sumsq"
    value_interval: Interval | None = None  # per-row value bounds (avg/var)
    centre: float = 0.0
    halfwidth: float = 0.0

    @property
    def func(self) -> str:
        return self.call.func


@dataclass
class KeyDomain:
    """A public domain for one GROUP BY key: SQL for an Array of key values, and the row filter."""

    array_sql: str
    filter_sql: str | None
    source: str  # "catalog public keys", "query keys", "bounded integer column"
    size: int


@dataclass
class Selection:
    quantity: int  # index of the "units" (or "weighted_units") quantity used for thresholding
    threshold: int  # release iff noisy count >= threshold
    epsilon: float
    delta: float
    scale: float  # the noisy count's noise: Laplace b, Gaussian σ, or the optimal rule's noise std
    new_groups: int  # c: counts one unit can move (k, or 2k under substitute)
    rule: object = None  # dpch.plan.selection.SelectionRule: which rule, its parameters and source

    @property
    def rule_name(self) -> str:
        return getattr(self.rule, "rule", "laplace")

    def release_probability(self, count: int) -> float:
        """P[a group of ``count`` distinct units is released] under the rule used."""
        return self.rule.release_probability(count)  # type: ignore[union-attr]

    def summary(self) -> dict:
        """What explain and the result metadata show (public: parameters only, no data)."""
        r = self.rule
        return {"rule": self.rule_name, "threshold": self.threshold, "epsilon": self.epsilon, "delta": self.delta,
                "noise_scale": self.scale, "max_new_groups_per_unit": self.new_groups,
                "group_epsilon": getattr(r, "group_epsilon", None), "group_delta": getattr(r, "group_delta", None),
                "noise_delta": getattr(r, "noise_delta", 0.0), "source": getattr(r, "source", ""),
                "description": r.describe() if r is not None else "",
                "scores": dict(getattr(r, "scores", {}) or {}),
                # what is thresholded: "distinct units", or the weighted Gaussian's "weighted units"
                # (threshold and noise_scale then in units of 1/weight_scale of one unit's weight)
                "statistic": getattr(r, "statistic", "distinct units"),
                "weight_scale": getattr(r, "weight_scale", 0)}


@dataclass
class Bounding:
    k: int  # groups per unit (1 if not grouped)
    max_rows: int  # M
    rows_per_group: int  # C
    row_level: bool
    neighbour: str


@dataclass
class Plan:
    bound: BoundQuery
    entry: TableEntry
    epsilon: float
    delta: float
    options: QueryOptions
    bounding: Bounding
    quantities: list[Quantity]
    aggregates: list[AggregatePlan]
    key_mode: str  # "none", "public", "threshold"
    key_domains: list[KeyDomain | None]
    selection: Selection | None
    cost: PrivacyCost
    key_types: tuple[str, ...] | None = None  # the engine's type of each GROUP BY key (None: unknown)
    top_k: "TopK | None" = None  # a peeling top-n selection (dpch.plan.top_k)
    # a top-n query: each way's order noise (std, score units) when both were planned ({}: one was)
    top_k_scores: dict[str, float] | None = None

    @property
    def grouped(self) -> bool:
        return self.bound.grouped

    def key_nullable(self, j: int) -> bool:
        """Whether key j may be NULL (unknown types count as nullable: the NULL-safe form is used)."""
        return self.key_types is None or "Nullable(" in self.key_types[j]

