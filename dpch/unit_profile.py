"""The unit-profile stage (dpch.plan.profile): bounds chosen from the data and the visible bias.

``profile_spec(plan_options, entry, epsilon)`` decides before the charge what the profile releases
and what it costs; after the charge, ``run_histograms`` releases the auto-bounds histograms and
``choose_bounds`` turns them into (k, M) (post-processing), ``run_bias_counts`` releases the bias
counts with the final plan's bounds. Every release is the discrete Laplace mechanism of
dpch.mechanisms, drawn inside ClickHouse; the engine returns noisy counts only.

Privacy (DESIGN.md invariants 1-2): each release is ε_part-DP (L1 sensitivities in
dpch.plan.profile), all of them are part of the query's one charge, made before any of them runs.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable

from .cost import MechanismCost
from .engine import Engine, with_settings
from .errors import InvalidParameter
from .execute import _sanitized
from .mechanisms import LaplaceMechanism
from .plan import Plan
from .plan.profile import (BIAS_COUNTS, GRID, VALUE_EDGES, BiasEstimate, BoundChoice, Histogram,
                           ProfileRequest, choose, shares_from_counts, side_has_mass, tail_model)
from .catalog import quote_ident
from .rewrite.profile import bias_counts_sql, histograms_sql, value_histogram_sql

#: L1 sensitivity of the three bias counts (each moves by at most 1 per unit)
BIAS_SENSITIVITY = 3


class BiasWarning(UserWarning):
    """Contribution bounding or clipping biased the answer by more than dpch.plan.profile.WARN_SHARE."""


@dataclass(frozen=True)
class ProfileSpec:
    """What the profile of one query releases, decided before the charge."""

    request: ProfileRequest | None  # the auto-bounds histograms (None: no 'auto')
    bias_epsilon: float  # 0: the bias counts are not released
    auto: tuple[str, ...]  # the bounds chosen from the data

    def histogram_mechanism(self) -> LaplaceMechanism:
        r = self.request
        assert r is not None
        return LaplaceMechanism.calibrated(r.sensitivity, r.epsilon_each, integer=True)

    def value_mechanism(self) -> LaplaceMechanism:
        """The real-valued Laplace of the value histograms (dpch_laplace: the grid term included)."""
        r = self.request
        assert r is not None
        return LaplaceMechanism.calibrated(r.value_sensitivity, r.epsilon_each, integer=False)

    def bias_mechanism(self) -> LaplaceMechanism:
        return LaplaceMechanism.calibrated(BIAS_SENSITIVITY, self.bias_epsilon, integer=True)

    def costs(self) -> tuple[MechanismCost, ...]:
        """The ledger entries of the profile's releases (pure ε, Laplace; dpch.mechanisms.laplace)."""
        out = []
        if self.request is not None:
            m, r = self.histogram_mechanism(), self.request
            for name, on in (("rows per unit", r.rows), ("groups per unit", r.groups)):
                if on:
                    out.append(m.cost(r.sensitivity, r.epsilon_each, label=f"auto bounds: histogram of {name}"))
            for col in r.values:
                out.append(self.value_mechanism().cost(r.value_sensitivity, r.epsilon_each,
                                                       label=f"auto bounds: histogram of {col} values"))
        if self.bias_epsilon > 0:
            out.append(self.bias_mechanism().cost(BIAS_SENSITIVITY, self.bias_epsilon,
                                                  label="bias: units cut, values clipped"))
        return tuple(out)

    def summary(self) -> dict:
        """What explain shows: the ε split and the rule."""
        r = self.request
        return {"auto": list(self.auto),
                "auto_epsilon": r.epsilon if r else 0.0,
                "histograms": ([h for h, on in (("rows per unit", r.rows), ("groups per unit", r.groups)) if on]
                               + [f"{c} values (unit-weighted)" for c in r.values] if r else []),
                "grid": f"√2 grid {GRID[0]}..{GRID[-1]} ({len(GRID)} buckets)",
                "rule": ("bounds = argmin over the grid of estimated rows dropped + G·noise sd "
                         "(dpch.plan.profile)") if r else "",
                "bias_epsilon": self.bias_epsilon}


def groups_cost_noise(plan: Plan, noise_rows_at: Callable[[int, int], float]) -> bool:
    """Whether the number of groups per unit k changes the noise of the plan's releases (it does not
    for COUNT/SUM when C = M: their sensitivity is M whatever k; it does for distinct-unit counts,
    partition selection, quantiles)."""
    m = plan.entry.max_rows_per_unit
    return plan.grouped and noise_rows_at(1, m) != noise_rows_at(2, m)


def profile_spec(plan: Plan, epsilon: float, noise_rows_at: Callable[[int, int], float],
                 value_columns: tuple[str, ...] = ()) -> ProfileSpec | None:
    """The profile of a plan made at (1 - share)·ε: None when the options ask for none. 'auto' on
    a row-level table is refused (its bounds are k = M = 1 by definition). The histogram of groups
    per unit is released only when k costs noise (groups_cost_noise)."""
    o = plan.options
    if not o.auto and o.bias_share == 0.0:
        return None
    counts = tuple(a for a in o.auto if a != "bounds")
    if counts and plan.entry.row_level:
        raise InvalidParameter(f"{', '.join(counts)}='auto': {plan.entry.table} is row level (every row is a "
                               "unit, k = M = C = 1); contribution bounds apply to tables with a privacy unit")
    request = None
    if o.auto:
        # the value bounds' choice weighs a unit's clipped mass by its kept rows: the rows histogram
        rows = "max_rows_per_unit" in o.auto or (bool(value_columns) and not plan.entry.row_level)
        groups = "max_groups_contributed" in o.auto and groups_cost_noise(plan, noise_rows_at)
        if rows or groups or value_columns:
            request = ProfileRequest(rows=rows, groups=groups, epsilon=o.auto_share * epsilon,
                                     neighbour=plan.entry.neighbour, values=value_columns)
    if request is None and o.bias_share == 0.0:
        return None
    return ProfileSpec(request, o.bias_share * epsilon, tuple(o.auto) if request is not None else ())


def run_histograms(backend: Engine, plan: Plan, spec: ProfileSpec) -> dict[str, Histogram]:
    """Release the auto-bounds histograms ({"rows": ..., "groups": ..., "+<column>": positive values,
    "-<column>": negative values (of |x|)}); after the charge only."""
    r = spec.request
    assert r is not None
    out = {}
    if r.rows or r.groups:
        mech = spec.histogram_mechanism()
        sql = histograms_sql(plan, mech.sql, rows=r.rows, groups=r.groups)
        df = _sanitized(lambda: backend.query_df(with_settings(sql)))
        for hk, name in ((0, "rows"), (1, "groups")):
            part = df[df["__dp_hk"] == hk].sort_values("__dp_b")
            if len(part):
                out[name] = Histogram(tuple(float(v) for v in part["__dp_v"]), mech.scale)
    for col in r.values:
        vm = spec.value_mechanism()
        sql = value_histogram_sql(plan, quote_ident(col), vm.sql)
        df = _sanitized(lambda: backend.query_df(with_settings(sql)))
        for side, sign in ((0, "+"), (1, "-")):
            part = df[df["__dp_s"] == side].sort_values("__dp_b")
            out[sign + col] = Histogram(tuple(float(v) for v in part["__dp_v"]), vm.scale, VALUE_EDGES, 0.0)
    return out


#: how much the rows bounding drops bias an aggregate, relative to a COUNT or SUM (which lose them
#: outright): a mean, variance or quantile of the kept rows moves only as far as the dropped rows
#: differ from the kept ones (exchangeable rows: not at all), so their noise dominates the choice
BIAS_WEIGHT = {"count": 1.0, "sum": 1.0, "count_distinct": 1.0, "count_distinct_unit": 0.0}
SECOND_ORDER_BIAS = 0.1


def bias_weight(plan: Plan) -> float:
    """The mean weight of the plan's aggregates (BIAS_WEIGHT, else SECOND_ORDER_BIAS): what a
    dropped row costs in the choice of M (utility only)."""
    ws = [BIAS_WEIGHT.get(ap.func, SECOND_ORDER_BIAS) for ap in plan.aggregates]
    return sum(ws) / len(ws) if ws else 1.0


def choose_value_bounds(hists: dict[str, Histogram], columns: tuple[str, ...], kept_rows_per_unit: float,
                        noise_value_at: Callable[[str, tuple[float, float]], float]
                        ) -> tuple[dict[str, tuple[float, float]], list[BoundChoice]]:
    """Each column's clipping bounds from its released value histograms (post-processing): a side
    whose raw noisy total does not stand SIDE_Z sd above 0 is cut at 0 (a false side is rare: its
    bound would fit noise); the other side's
    magnitude C minimises kept_rows_per_unit·(mass above C) + noise_value_at(column, bounds)."""
    chosen, choices = {}, []
    for col in columns:
        pos, neg = hists["+" + col], hists["-" + col]
        sides = {}
        for sign, h in (("+", pos), ("-", neg)):
            model = tail_model(h)
            if not side_has_mass(h):
                continue

            def noise(c, sign=sign):
                return noise_value_at(col, (0.0, c) if sign == "+" else (-c, 0.0))
            sides[sign] = choose(f"bounds[{col}]{sign}", model, noise, rows_per_step=kept_rows_per_unit,
                                 candidates=VALUE_EDGES[1:])
        if not sides:  # no mass anywhere (an empty relation, or all NULL): any bounds; (0, 1)
            lo, hi = 0.0, 1.0
        else:
            hi = float(sides["+"].value) if "+" in sides else 0.0
            lo = -float(sides["-"].value) if "-" in sides else 0.0
        chosen[col] = (lo, hi)
        bias = sum(c.estimated_bias for c in sides.values())
        noise_ = noise_value_at(col, (lo, hi))
        choices.append(BoundChoice(f"bounds[{col}]", (lo, hi), bias, noise_,
                                   "per side: argmin over the √2 value grid of estimated clipped mass "
                                   "(kept rows per unit x unit-weighted mass above C) + G·noise sd; a side "
                                   "without significant mass is cut at 0"))
    return chosen, choices


def choose_bounds(plan: Plan, hists: dict[str, Histogram], noise_rows: Callable[[int, int], float],
                  noise_value_at: Callable[[dict, str, tuple[float, float]], float] | None = None
                  ) -> tuple[dict, tuple[BoundChoice, ...], float | None]:
    """({bound: value}, the choices, estimated share of rows dropped) from the released histograms
    (post-processing). ``noise_rows(k, M)``: G·noise sd of the plan at those bounds, in rows."""
    o, e = plan.options, plan.entry
    k0, m0 = e.max_groups_contributed, e.max_rows_per_unit
    choices, chosen = [], {}
    rows_model = tail_model(hists["rows"]) if "rows" in hists else None
    if "groups" in hists:
        gm = tail_model(hists["groups"])
        per_group = rows_model.total() / max(gm.total(), 1.0) if rows_model else 1.0
        c = choose("max_groups_contributed", gm, lambda k: noise_rows(k, m0), rows_per_step=per_group, cap=m0)
        choices.append(c)
        k0 = chosen["max_groups_contributed"] = c.value
    if rows_model is not None and "max_rows_per_unit" in o.auto:
        c = choose("max_rows_per_unit", rows_model, lambda m: noise_rows(k0, m), rows_per_step=bias_weight(plan))
        choices.append(c)
        m0 = chosen["max_rows_per_unit"] = c.value
    if "max_groups_contributed" in o.auto and "max_groups_contributed" not in chosen:
        # k costs no noise here (COUNT/SUM with C = M: the sensitivity is M either way): keep every
        # group a unit's M rows can reach; ungrouped queries have one group
        chosen["max_groups_contributed"] = min(m0, 1000) if plan.grouped else 1
        choices.append(BoundChoice("max_groups_contributed", chosen["max_groups_contributed"], 0.0, 0.0,
                                   "free: the released values' sensitivity does not depend on k (k = M)"
                                   if plan.grouped else "no GROUP BY: k = 1"))
    dropped = None
    if rows_model is not None:
        dropped = min(1.0, rows_model.excess(m0) / max(rows_model.total(), 1.0))
    columns = tuple(k[1:] for k in hists if k.startswith("+"))
    if columns and noise_value_at is not None:
        units = rows_model.at(0.0) if rows_model else 1.0
        kept = (rows_model.total() - rows_model.excess(m0)) / max(units, 1.0) if rows_model else 1.0
        fixed = dict(chosen)
        cache: dict[str, Callable[[float], float]] = {}

        def at(col: str, bounds: tuple[float, float]) -> float:
            # each side's magnitude is planned through an affine fit (the noise grows with the bound)
            side = "+" if bounds[1] > 0 else "-"
            key = col + side
            if key not in cache:
                cache[key] = affine(lambda c: noise_value_at(fixed, col, (0.0, c) if side == "+" else (-c, 0.0)))
            if bounds[0] < 0 < bounds[1]:
                return noise_value_at(fixed, col, bounds)
            return cache[key](max(abs(bounds[0]), abs(bounds[1])))
        values, vchoices = choose_value_bounds(hists, columns, kept, at)
        chosen["bounds"] = values
        choices.extend(vchoices)
    return chosen, tuple(choices), dropped


def run_bias_counts(backend: Engine, plan: Plan, spec: ProfileSpec
                    ) -> tuple[float | None, float | None, float | None]:
    """Release the bias counts with the plan's final bounds; (units cut share, values clipped share,
    their noise sd)."""
    mech = spec.bias_mechanism()
    df = _sanitized(lambda: backend.query_df(with_settings(bias_counts_sql(plan, mech.sql))))
    counts = [float(v) for v in df.sort_values("__dp_i")["__dp_v"]]
    if len(counts) != len(BIAS_COUNTS):
        raise InvalidParameter("the bias counts came back malformed")
    return shares_from_counts(counts, mech.variance ** 0.5)


def attach(df, bias: BiasEstimate, epsilon: float, delta: float, *, warn: bool = True):
    """Put the bias estimate and the whole charge into the answer's attrs; warn (BiasWarning) when a
    share is above the threshold."""
    meta = df.attrs.get("dpch")
    if meta is not None:
        meta["epsilon"], meta["delta"] = epsilon, delta
        meta["bias"] = bias.to_dict()
    df.attrs["epsilon_spent"], df.attrs["delta_spent"] = epsilon, delta
    df.attrs["bias"] = bias.to_dict()
    if warn:
        for w in bias.warnings:
            warnings.warn(f"dpch: {w}", BiasWarning, stacklevel=4)
    return df


def noise_rows(plan: Plan) -> float:
    """G·(mean noise sd of the plan's released counts and sums, in rows): a sum's sd is divided by
    its per-row bound, so that it counts in rows like a count's. G: the groups each quantity is
    released for when the keys are public (their domain sizes' product), else 1. Quantiles and
    distinct counts are left out (their noise does not grow with the row bounds)."""
    return _groups_times_mean(plan, [q.ci_halfwidth_units(0.6827) / max(abs(q.lo_units), abs(q.hi_units), 1)
                                     for q in plan.quantities
                                     if q.released and q.kind not in ("quantile", "distinct")])


def noise_value(plan: Plan) -> float:
    """G·(mean noise sd of the plan's released sums, in value units): what a column's clipping bound
    trades against the mass it clips (G as in noise_rows)."""
    return _groups_times_mean(plan, [q.ci_halfwidth_units(0.6827) * q.grid for q in plan.quantities
                                     if q.released and q.kind == "sum"])


def _groups_times_mean(plan: Plan, sds: list[float]) -> float:
    """G·mean(sds), G = the groups each quantity is released for when the keys are public (the
    product of their domain sizes), else 1; 0 without any sd."""
    if not sds:
        return 0.0
    groups = 1
    if plan.key_mode == "public":
        for d in plan.key_domains:
            groups *= max(1, getattr(d, "size", None) or 1)
    return groups * sum(sds) / len(sds)


def affine(f: Callable[[float], float], a: float = 1.0, b: float = 2.0, check: float = 1024.0
           ) -> Callable[[float], float]:
    """f itself, or the line through (a, f(a)) and (b, f(b)) when it predicts f(check) within 1 %:
    the noise of a plan is affine in a bound (its sensitivities are), and planning every candidate is
    slow. Utility only: privacy never depends on it."""
    fa, fb, fc = f(a), f(b), f(check)
    slope = (fb - fa) / (b - a)
    icpt = fa - slope * a
    if abs(icpt + slope * check - fc) <= 0.01 * abs(fc) + 1e-12:
        return lambda x: icpt + slope * x
    return f
