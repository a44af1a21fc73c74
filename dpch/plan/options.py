"""The analyst's per-query options (keyword arguments of db.query / db.explain) and the check of
the requested budget (ε, δ)."""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Mapping

from .. import calibration as cal
from ..errors import InvalidParameter
from .profile import DEFAULT_AUTO_SHARE, check_share

#: "bounded_laplace" (biswal thesis §5.5, output in a public range) and "mixed" (the sound variant of
#: the thesis's MNM, §5.3) are the thesis mechanisms (docs/CONTROLLER.md, "Thesis mechanisms").
MECHANISMS = ("auto", "laplace", "gaussian", "bounded_laplace", "mixed")
#: The branch rule of mechanism="mixed" (dpch.mechanisms.MixedNoiseMechanism.calibrated).
MIXED_RULES = ("thesis", "variance")
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
    # mechanism="bounded_laplace": the public output range of COUNT/SUM releases, one (lo, hi) for
    # all of them or {output column: (lo, hi)}; AVG uses its value bounds (docs/CONTROLLER.md).
    output_range: tuple[float, float] | Mapping[str, tuple[float, float]] | None = None
    # mechanism="mixed": which branch each value takes ("thesis": Gaussian iff Δ <= √π·δ·ε/2,
    # Def. 5.3.1; "variance": the branch with the smaller noise variance)
    mixed_rule: str = "thesis"
    # Bounds from the data (dpch.plan.profile): "auto" for max_groups_contributed/max_rows_per_unit
    # (or the catalog's) spends auto_share·ε on histograms of rows/groups per unit; bias_share·ε
    # measures the shares of units cut by bounding and of values clipped. Both are part of the charge.
    auto: tuple[str, ...] = ()
    auto_share: float = DEFAULT_AUTO_SHARE
    bias_share: float = 0.0
    # per-query clipping bounds of columns read in aggregates: {column: (lo, hi)} replace the
    # catalog's; auto_columns are chosen from the data ("*": every numeric column an aggregate reads)
    value_bounds: Mapping[str, tuple[float, float]] | None = None
    auto_columns: tuple[str, ...] = ()

    FIELDS = ("mechanism", "weights", "keys", "confidence", "with_ci", "max_groups_contributed",
              "max_rows_per_unit", "max_rows_per_group", "selection", "top_k", "output_range", "mixed_rule",
              "auto_share", "bias_share", "bounds")
    CONTRIBUTION = ("max_groups_contributed", "max_rows_per_unit", "max_rows_per_group")
    AUTO = ("max_groups_contributed", "max_rows_per_unit")

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
        output_range = _check_output_range(options.get("output_range"), mech)
        mixed_rule = options.get("mixed_rule", "thesis")
        if mixed_rule not in MIXED_RULES:
            raise InvalidParameter(f"mixed_rule must be one of {', '.join(MIXED_RULES)}")
        if "mixed_rule" in options and mech != "mixed":
            raise InvalidParameter("mixed_rule needs mechanism='mixed'")
        bounds, auto = {}, []
        for name in cls.CONTRIBUTION:
            v = options.get(name)
            if v == "auto" and name in cls.AUTO:
                auto.append(name)
            elif v is not None:
                if isinstance(v, bool) or not isinstance(v, numbers.Integral) or not 1 <= v <= 1_000_000:
                    raise InvalidParameter(f"{name} must be an integer in [1, 1000000]"
                                           + (" or 'auto'" if name in cls.AUTO else ""))
                bounds[name] = int(v)
        value_bounds, auto_columns = _check_bounds(options.get("bounds"))
        if auto_columns:
            auto.append("bounds")
        auto_share = check_share(options.get("auto_share", DEFAULT_AUTO_SHARE), "auto_share")
        bias_share = check_share(options.get("bias_share", 0.0), "bias_share")
        if auto and auto_share == 0.0:
            raise InvalidParameter("'auto' bounds need auto_share > 0 (the share of epsilon that chooses them)")
        if (auto_share if auto else 0.0) + bias_share > 0.5:
            raise InvalidParameter("auto_share + bias_share must be at most 0.5 of the query's epsilon")
        return cls(mechanism=mech, weights=dict(weights) if weights else None,
                   keys=dict(keys) if keys else None, confidence=conf, with_ci=with_ci, selection=selection, top_k=top_k,
                   output_range=output_range, mixed_rule=mixed_rule, auto=tuple(auto), auto_share=auto_share,
                   bias_share=bias_share, value_bounds=value_bounds, auto_columns=auto_columns, **bounds)

    @property
    def profile_share(self) -> float:
        """The share of ε spent on the data profile (auto bounds and bias), not on the plan."""
        return (self.auto_share if self.auto else 0.0) + self.bias_share

    def contribution(self) -> dict[str, int]:
        """The contribution bounds given with the query (to replace the catalog's)."""
        return {n: getattr(self, n) for n in self.CONTRIBUTION if getattr(self, n) is not None}


def _check_bounds(value: Any) -> tuple[dict | None, tuple[str, ...]]:
    """The option bounds: "auto" (every numeric column an aggregate reads), or {column: "auto" |
    (lo, hi)}. Returns (fixed bounds or None, auto columns; ("*",) for all)."""
    if value is None:
        return None, ()
    if value == "auto":
        return None, ("*",)
    if not isinstance(value, Mapping) or not value:
        raise InvalidParameter("bounds must be 'auto' or a mapping {column: 'auto' or (lo, hi)}")
    fixed, auto = {}, []
    for col, b in value.items():
        if not isinstance(col, str):
            raise InvalidParameter("bounds: column names must be strings")
        if b == "auto":
            auto.append(col)
        else:
            fixed[col] = _range_pair(b, f"bounds[{col!r}]")
    return (fixed or None), tuple(auto)


def _range_pair(value: Any, name: str) -> tuple[float, float]:
    """A public output range (lo, hi): two finite reals with lo < hi (analyst-given, not private)."""
    if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__len__") or len(value) != 2:
        raise InvalidParameter(f"{name} must be a pair (lo, hi)")
    out = []
    for v in value:
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(float(v)):
            raise InvalidParameter(f"{name} must be a pair of finite numbers (lo, hi)")
        out.append(float(v))
    if not out[0] < out[1]:
        raise InvalidParameter(f"{name} needs lo < hi")
    if max(abs(out[0]), abs(out[1])) > 1e15:
        raise InvalidParameter(f"{name} must lie within ±1e15")
    return out[0], out[1]


def _check_output_range(value: Any, mechanism: str):
    """output_range: None, one (lo, hi), or {output column: (lo, hi)}; only with bounded_laplace."""
    if value is None:
        return None
    if mechanism != "bounded_laplace":
        raise InvalidParameter("output_range needs mechanism='bounded_laplace'")
    if isinstance(value, Mapping):
        if not value:
            raise InvalidParameter("output_range must not be an empty mapping")
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise InvalidParameter("output_range keys must be output column names")
            out[k] = _range_pair(v, f"output_range[{k!r}]")
        return out
    return _range_pair(value, "output_range")


def check_budget_args(epsilon: Any, delta: Any) -> tuple[float, float]:
    """ε must be finite > 0; δ finite in [0, 1)."""
    eps = cal.check_epsilon(epsilon)
    if isinstance(delta, bool) or not isinstance(delta, numbers.Real):  # numbers.Real: numpy scalars too
        raise InvalidParameter("delta must be a real number in [0, 1)")
    d = float(delta)
    if d == 0.0:
        return eps, 0.0
    return eps, cal.check_delta(d)
