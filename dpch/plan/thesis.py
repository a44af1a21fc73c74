"""The thesis mechanisms in the planner (option ``mechanism=``; docs/CONTROLLER.md, "Thesis
mechanisms"): which quantities get which noise, at what parameters, and what they cost.

- ``"bounded_laplace"`` (biswal_thesis_dp_foundations.md §5.5): every released COUNT/SUM value lies
  in a public output range given with the query (``output_range``) and AVG in its value bounds.
  Each group's value is released by dpch.mechanisms.BoundedLaplaceMechanism at (ε/c, δ/c) and the
  per-group sensitivity (GroupedBoundedLaplace: c groups per unit, basic composition).
- ``"mixed"`` (§5.3, Def. 5.3.1, the sound variant of dpch.mechanisms.MixedNoiseMechanism): each
  value takes the Laplace or the Gaussian branch by a public rule, and each branch is calibrated
  to the value's (ε, δ) share on its own (the planner's Laplace and Gaussian calibrations), so
  whichever branch runs, the guarantee is the branch's own.

Both need δ > 0 (the Gaussian branch; the bounded sampler's constant-work fallback). Everything
here depends on the query, the catalog and the options only, never on the data.
"""
from __future__ import annotations

import math
from dataclasses import replace

from .. import calibration as cal
from ..bind import aggregate_refs
from ..cost import MechanismCost
from ..errors import InvalidParameter, QueryRejected
from ..mechanisms import GaussianMechanism, LaplaceMechanism, MixedNoiseMechanism, thesis_mnm_threshold
from ..mechanisms.bounded_laplace import GroupedBoundedLaplace
from .model import AggregatePlan, Quantity
from .sensitivity import row_sensitivity

COUNT_FUNCS = ("count", "count_distinct_unit", "count_distinct")


def require_delta(mechanism: str, delta: float) -> None:
    """Both thesis mechanisms need δ > 0 (raised before anything is charged)."""
    if mechanism in ("bounded_laplace", "mixed") and not delta > 0:
        why = ("its constant-work sampler has a δ of (1 + e^ε)·2^-64" if mechanism == "bounded_laplace"
               else "its Gaussian branch is (ε, δ)-DP")
        raise InvalidParameter(f"mechanism={mechanism!r} needs delta > 0 ({why})")


def restructure_means(planner, agg_plans: list[AggregatePlan]) -> dict[int, tuple[int, AggregatePlan]]:
    """mechanism="bounded_laplace": each AVG releases its clamped mean directly (one noisy value
    per group in [lo, hi], GroupedBoundedLaplace with ``mean_of``) instead of a noisy sum over a
    noisy count. Its "mean" quantity is a copy of its count (N, the value the UDF call receives);
    the sum's column is read as well. Sums and counts that no other aggregate and no partition
    selection use are then not released (no noise, no budget). Returns {mean quantity: (sum
    quantity, aggregate)}."""
    means: dict[int, tuple[int, AggregatePlan]] = {}
    qs = planner.quantities
    for ap in agg_plans:
        if ap.func != "avg":
            continue
        c, s = qs[ap.roles["count"]], qs[ap.roles["sum"]]
        mi = planner._quantity(f"mean|{s.key}|{c.key}", label=f"{ap.call.text}.mean", kind=c.kind,
                               row_sql=c.row_sql, lo_units=c.lo_units, hi_units=c.hi_units, grid=1.0,
                               centre=0.0, value_interval=ap.value_interval)
        means[mi] = (s.index, ap)
        ap.roles = {"mean": mi}
    used = {qi for ap in agg_plans for qi in ap.roles.values()}
    for q in qs:
        if q.index not in used and not q.is_selection and q.index not in means:
            q.released = False
    return means


def _output_ranges(planner, agg_plans: list[AggregatePlan]) -> dict[int, tuple[float, float]]:
    """{aggregate index: (lo, hi)} from the option output_range (one pair for every COUNT/SUM, or
    {output column: pair} for the aggregates that column uses)."""
    opt = planner.options.output_range
    if opt is None:
        return {}
    if isinstance(opt, tuple):
        return {ap.call.index: opt for ap in agg_plans if ap.func in COUNT_FUNCS + ("sum",)}
    names = {o.name: o for o in planner.bound.outputs}
    unknown = sorted(set(opt) - set(names))
    if unknown:
        raise InvalidParameter(f"output_range: unknown output column(s) {', '.join(map(repr, unknown))}")
    out: dict[int, tuple[float, float]] = {}
    for name, pair in opt.items():
        if names[name].kind != "aggregate":  # a range on an expression would not be the release's range
            raise InvalidParameter(f"output_range: {name!r} is not an aggregate output column (COUNT or SUM)")
        for i in aggregate_refs(names[name].template):
            if out.get(i, pair) != pair:
                raise InvalidParameter(f"output_range: two ranges for the aggregate of {name!r}")
            out[i] = pair
    return out


def choose_bounded(planner, agg_plans: list[AggregatePlan], released: list[Quantity],
                   means: dict[int, tuple[int, AggregatePlan]]) -> dict[int, str]:
    """The mechanism of each released quantity under mechanism="bounded_laplace", and each value's
    output range in its units (stored for calibrate_bounded). Rejects aggregates with no public
    output range (VAR/STDDEV; COUNT/SUM without output_range)."""
    ranges = _output_ranges(planner, agg_plans)
    planner._bl_ranges = {}
    choice: dict[int, str] = {}
    for q in released:
        if q.is_selection:  # partition selection's count keeps its own rule (and is charged by it)
            if q.aggregates:  # an output would be that count, not a bounded release: say so
                texts = ", ".join(agg_plans[a].call.text for a in q.aggregates)
                raise QueryRejected(f"mechanism='bounded_laplace': {texts} is released by private partition "
                                    "selection's own noisy count here, not within an output range; declare "
                                    "public keys for the GROUP BY (keys=...) or drop it from the query")
            choice[q.index] = "laplace"
            continue
        if q.kind == "quantile":
            choice[q.index] = "exponential"
            continue
        if q.index in means:
            planner._bl_ranges[q.index] = tuple(means[q.index][1].value_interval)
            choice[q.index] = "bounded_laplace"
            continue
        pairs = set()
        for ai in q.aggregates:
            ap = agg_plans[ai]
            if ap.func not in COUNT_FUNCS + ("sum",):
                raise QueryRejected(f"mechanism='bounded_laplace' applies to COUNT, SUM (with output_range) and "
                                    f"AVG (within its value bounds), not to {ap.call.text}")
            if ap.call.index not in ranges:
                raise InvalidParameter(f"mechanism='bounded_laplace': {ap.call.text} needs a public output range: "
                                       "pass output_range=(lo, hi) or output_range={column: (lo, hi)}")
            pairs.add(ranges[ap.call.index])
        if len(pairs) != 1:
            raise InvalidParameter("output_range: one released value is used by outputs with different ranges")
        lo, hi = pairs.pop()
        # value = grid·units (counts: grid 1; sums: centre 0); the grid is a power of two: exact
        planner._bl_ranges[q.index] = (lo / q.grid, hi / q.grid)
        choice[q.index] = "bounded_laplace"
    return choice


def _coords(planner) -> int:
    """c: the groups one unit can move (k, 2k under substitute; 1 without GROUP BY)."""
    b = planner.release
    return b.k * (2 if b.neighbour == "substitute" else 1) if planner.bound.grouped else 1


def calibrate_bounded(planner, q: Quantity, means: dict[int, tuple[int, AggregatePlan]]) -> None:
    """Per-group sensitivity Δ_g (one group: the unit's rows there, docs/CONTROLLER.md
    "Sensitivity" with k = 1; a mean: hi − lo), the GroupedBoundedLaplace at (ε_q, δ_q) and its
    scale. Sets q.noise, q.scale, and q.l1/q.l2 to the L1/L2 over the c groups."""
    lo, hi = planner._bl_ranges[q.index]
    c = _coords(planner)
    mean_of = None
    if q.index in means:
        s = planner.quantities[means[q.index][0]]
        dg = hi - lo
        mean_of = (s.column, s.grid, s.centre)
    elif q.kind == "units":
        dg = 1.0
    else:
        dg = row_sensitivity(q.lo_units, q.hi_units, replace(planner.release, k=1), False)[0]
    dg = dg if dg > 0 else 1.0
    try:
        noise = GroupedBoundedLaplace.calibrated(dg, q.epsilon, q.delta, c, lo, hi, mean_of, q.grid)
    except InvalidParameter as exc:  # name the option the analyst can change (public parameters only)
        what = "the value bounds of " + q.label if mean_of is not None else "output_range"
        raise InvalidParameter(f"mechanism='bounded_laplace', {what}: {exc}") from None
    q.noise, q.scale = noise, noise.scale
    q.l1, q.l2 = c * dg, math.sqrt(c) * dg
    q.multi_coordinate = c > 1


def bounded_cost(q: Quantity) -> MechanismCost:
    """The ledger entry: the verified (ε_q, δ_q) (fail closed if the relation does not hold)."""
    noise = q.noise
    if not isinstance(noise, GroupedBoundedLaplace) or not noise.privacy_relation():
        raise InvalidParameter("bounded Laplace: the calibrated release does not satisfy its (ε, δ)")
    return MechanismCost(kind="threshold", sensitivity=noise.group_sensitivity, scale=noise.scale,
                         epsilon=q.epsilon, delta=q.delta, rho=None, label=q.label)


def choose_mixed(planner, released: list[Quantity]) -> dict[int, str]:
    """The branch of each released value under mechanism="mixed" (Def. 5.3.1's public switch):
    rule "thesis": Gaussian iff Δ (L1, value units) <= t0 = √π·δ_q·ε_q/2 (thesis Thm 5.3.2's
    threshold; with sound calibration it only decides accuracy); rule "variance": the branch with
    the smaller noise variance. δ_q is the tentative equal share δ/(values + selection); the
    Gaussian values then share δ (more δ never flips a Gaussian choice: t0 grows with δ, σ shrinks)."""
    rule = planner.options.mixed_rule
    cands = [q for q in released if q.kind != "quantile"]
    tentative = planner.delta / max(1, len(cands))
    planner._mixed_tentative = tentative
    choice: dict[int, str] = {}
    for q in released:
        if q.kind == "quantile":
            choice[q.index] = "exponential"
        elif q.is_selection:  # partition selection's count keeps its own rule
            choice[q.index] = "laplace"
        elif rule == "thesis":
            t0 = thesis_mnm_threshold(q.epsilon, tentative)
            choice[q.index] = "gaussian" if q.l1 * q.grid <= t0 else "laplace"
        else:
            b = cal.laplace_scale(q.l1, q.epsilon)
            sigma = planner._gaussian_scale(q, q.epsilon, tentative)
            choice[q.index] = "gaussian" if sigma * sigma < 2.0 * b * b else "laplace"
    return choice


def attach_mixed(planner, released: list[Quantity]) -> None:
    """After calibration: q.noise = the MixedNoiseMechanism of each mixed value (both branches'
    parameters in the quantity's units, the branch that runs being the one calibrated and charged),
    for explain, metadata and the SQL (MixedNoiseMechanism.sql is the branch's UDF call)."""
    rule = planner.options.mixed_rule
    for q in released:
        if q.kind == "quantile" or q.is_selection:
            continue
        lap = LaplaceMechanism(q.scale if q.mechanism == "laplace" else cal.laplace_scale(q.l1, q.epsilon), True)
        sigma = q.scale if q.mechanism == "gaussian" else planner._gaussian_scale(q, q.epsilon, planner._mixed_tentative)
        gau = GaussianMechanism(sigma, True)
        if rule == "thesis":
            thr = thesis_mnm_threshold(q.epsilon, planner._mixed_tentative) / q.grid
        else:
            thr = math.inf if q.mechanism == "gaussian" else 0.0
        m = MixedNoiseMechanism(q.l1, thr, lap, gau, rule)
        if m.uses_gaussian != (q.mechanism == "gaussian"):  # the switch must name the branch calibrated
            raise InvalidParameter("mechanism='mixed': inconsistent branch")
        q.noise = m
