"""The analyst's per-query options (keyword arguments of db.query / db.explain) and the check of
the requested budget (ε, δ)."""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Mapping

from .. import calibration as cal
from ..errors import InvalidParameter

MECHANISMS = ("auto", "laplace", "gaussian")
#: Partition-selection rules (dpch.plan.selection): "auto" picks by a data-independent score;
#: "weighted_gaussian" applies to the user-level k > 1 path (elsewhere it is the Gaussian threshold).
SELECTION_RULES = ("auto", "optimal", "gaussian", "laplace", "weighted_gaussian")
#: How a top-n query (ORDER BY COUNT/SUM LIMIT n) is answered (dpch.plan.top_k): "peeling" chooses
#: the n groups by peeling permute-and-flip and then noises only their values; "post_processing"
#: noises every group and sorts the noisy values; "auto" picks by a data-independent score.
TOP_K_METHODS = ("auto", "peeling", "post_processing")


@dataclass(frozen=True)
class QueryOptions:
    """Options of db.query / db.explain (keyword arguments)."""

    mechanism: str = "auto"
    weights: Mapping[str, float] | None = None
    keys: Mapping[str, list] | None = None
    confidence: float = 0.95
    with_ci: bool = False
    # Contribution bounds for this query (k, M, C), replacing the catalog's: any values keep the
    # guarantee, because the rewrite enforces them and the sensitivity is computed from them; they
    # trade bias (rows cut) against noise (docs/CONTROLLER.md, "Contribution bounding").
    max_groups_contributed: int | None = None
    max_rows_per_unit: int | None = None
    max_rows_per_group: int | None = None
    # Private partition selection rule (docs/CONTROLLER.md, "Partition selection").
    selection: str = "auto"
    # How `ORDER BY <COUNT/SUM> DESC LIMIT n` is answered (docs/CONTROLLER.md, "Top-k").
    top_k: str = "auto"

    FIELDS = ("mechanism", "weights", "keys", "confidence", "with_ci", "max_groups_contributed",
              "max_rows_per_unit", "max_rows_per_group", "selection", "top_k")
    CONTRIBUTION = ("max_groups_contributed", "max_rows_per_unit", "max_rows_per_group")

    @classmethod
    def from_kwargs(cls, options: Mapping[str, Any]) -> "QueryOptions":
        unknown = sorted(set(options) - set(cls.FIELDS))
        if unknown:
            raise InvalidParameter(f"unknown option(s) {', '.join(unknown)}; valid options: {', '.join(cls.FIELDS)}")
        mech = options.get("mechanism", "auto")
        if mech not in MECHANISMS:
            raise InvalidParameter(f"mechanism must be one of {', '.join(MECHANISMS)}")
        weights = options.get("weights")
        if weights is not None:
            if not isinstance(weights, Mapping):
                raise InvalidParameter("weights must be a mapping {label: weight}")
            for k, v in weights.items():
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
                    raise InvalidParameter(f"weight of {k!r} must be a finite number > 0")
        keys = options.get("keys")
        if keys is not None and not isinstance(keys, Mapping):
            raise InvalidParameter("keys must be a mapping {column or key: [values]}")
        conf = cal.check_level(options.get("confidence", 0.95), "confidence")
        with_ci = options.get("with_ci", False)
        if not isinstance(with_ci, bool):
            raise InvalidParameter("with_ci must be a bool")
        selection = options.get("selection", "auto")
        if selection not in SELECTION_RULES:
            raise InvalidParameter(f"selection must be one of {', '.join(SELECTION_RULES)}")
        top_k = options.get("top_k", "auto")
        if top_k not in TOP_K_METHODS:
            raise InvalidParameter(f"top_k must be one of {', '.join(TOP_K_METHODS)}")
        bounds = {}
        for name in cls.CONTRIBUTION:
            v = options.get(name)
            if v is not None:
                if isinstance(v, bool) or not isinstance(v, numbers.Integral) or not 1 <= v <= 1_000_000:
                    raise InvalidParameter(f"{name} must be an integer in [1, 1000000]")
                bounds[name] = int(v)
        return cls(mechanism=mech, weights=dict(weights) if weights else None,
                   keys=dict(keys) if keys else None, confidence=conf, with_ci=with_ci, selection=selection, top_k=top_k,
                   **bounds)

    def contribution(self) -> dict[str, int]:
        """The contribution bounds given with the query (to replace the catalog's)."""
        return {n: getattr(self, n) for n in self.CONTRIBUTION if getattr(self, n) is not None}


def check_budget_args(epsilon: Any, delta: Any) -> tuple[float, float]:
    """ε must be finite > 0; δ finite in [0, 1)."""
    eps = cal.check_epsilon(epsilon)
    if isinstance(delta, bool) or not isinstance(delta, numbers.Real):  # numbers.Real: numpy scalars too
        raise InvalidParameter("delta must be a real number in [0, 1)")
    d = float(delta)
    if d == 0.0:
        return eps, 0.0
    return eps, cal.check_delta(d)
