"""The planner: from a bound query and (ε, δ) to a Plan (dpch.plan's docstring, points 1 to 7):
the noisy quantities and the aggregates built from them, their sensitivities, the mechanism and
the share of the budget of each, the key policy (public domains or private partition selection)
and the PrivacyCost."""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Sequence

from sqlglot import exp

from .. import calibration as cal
from ..bind import AggCall, BoundQuery, aggregate_refs, sql_of
from ..cost import MechanismCost, PrivacyCost
from ..errors import InvalidParameter, QueryRejected
from ..mechanisms import QUANTILE_BUCKETS, GaussianMechanism, LaplaceMechanism
from .bounds import Interval, bound_expression, clamp_sql, clip_float_sql, expr_nullable, float_literal
from .gaussian import vector_gaussian_sigma
from .key_domains import key_domain
from .model import AggregatePlan, Bounding, KeyDomain, Plan, Quantity, Selection
from .options import QueryOptions, check_budget_args
from .selection import choose_selection
from .sensitivity import row_sensitivity, unit_sensitivity
from . import thesis
from .top_k import (GUMBEL_STD, MAX_PEELING_ROUNDS, TOP_K_WEIGHT_KEY, TopK, TopKShape, noise_std, require_shape,
                    score_sensitivity)

FIXED_POINT_BITS = 20
MAX_PUBLIC_GROUPS = 1_000_000
SELECTION_WEIGHT_KEY = "partition_selection"


def _grid(halfwidth: float) -> float:
    hw = halfwidth if halfwidth > 0 else 1.0
    return math.ldexp(1.0, math.floor(math.log2(hw)) + 1 - FIXED_POINT_BITS)


class _Planner:
    def __init__(self, bound: BoundQuery, epsilon: float, delta: float, options: QueryOptions,
                 key_types: Sequence[str] | None = None, peeling: TopKShape | None = None):
        self.key_types = tuple(key_types) if key_types is not None else None
        self.bound = bound
        self.entry = bound.entry
        self.epsilon = epsilon
        self.delta = delta
        self.options = options
        e = self.entry
        grouped = bound.grouped
        self.bounding = Bounding(
            k=(e.max_groups_contributed if grouped else 1) if not e.row_level else 1,
            max_rows=e.max_rows_per_unit if not e.row_level else 1,
            rows_per_group=e.rows_per_group if not e.row_level else 1,
            row_level=e.row_level, neighbour=e.neighbour)
        self.quantities: list[Quantity] = []
        self.qindex: dict[str, int] = {}
        # a peeling top-n plan releases values of n groups only: one unit moves at most min(k, n)
        # of them (dpch.plan.top_k), the bounding that the released values' sensitivity uses
        self.peeling = peeling
        self.release = (replace(self.bounding, k=min(self.bounding.k, peeling.n)) if peeling is not None
                        else self.bounding)
        self.top_k: TopK | None = None

    # -- quantities -------------------------------------------------------------------------
    @property
    def _units_equal_rows(self) -> bool:
        """In the bounded data COUNT(*) equals the number of distinct (unit, group) pairs: every
        kept (unit, group) has exactly one row (M = 1 and at most one group per unit)."""
        return self.bounding.max_rows == 1 and self.bounding.k == 1

    def _quantity(self, key: str, **kw) -> int:
        if key in self.qindex:
            return self.qindex[key]
        idx = len(self.quantities)
        q = Quantity(index=idx, key=key, **kw)
        self.quantities.append(q)
        self.qindex[key] = idx
        return idx

    def _units_quantity(self, label: str) -> int:
        return self._quantity("units", label=label, kind="units", row_sql=None, lo_units=0, hi_units=1,
                              grid=1.0, centre=0.0)

    def _count_quantity(self, pred_sql: str | None, label: str) -> int:
        if pred_sql is None:
            if self._units_equal_rows:
                return self._units_quantity(label)
            return self._quantity("rows", label=label, kind="rows", row_sql=None, lo_units=0, hi_units=1,
                                  grid=1.0, centre=0.0)
        return self._quantity(f"rows|{pred_sql}", label=label, kind="rows",
                              row_sql=f"toInt64(if({pred_sql}, 1, 0))", lo_units=0, hi_units=1, grid=1.0,
                              centre=0.0)

    def _sum_quantity(self, value_sql: str, iv: Interval, centre: float, cond_sql: str | None,
                      label: str, nullable: bool = True) -> int:
        lo, hi = iv
        hw = max(abs(lo - centre), abs(hi - centre))
        g = _grid(hw)
        lo_u = int(round((lo - centre) / g))
        hi_u = int(round((hi - centre) / g))
        inv = 1.0 / g  # exact: g is a power of two
        units = clamp_sql(f"toInt64(round(({value_sql} - {float_literal(centre)}) * {float_literal(inv)}))",
                          str(lo_u), str(hi_u))  # a NULL value stays NULL (then 0 below)
        row = units if cond_sql is None else f"if({cond_sql}, {units}, 0)"
        if nullable:
            row = f"ifNull({row}, 0)"
        key = f"sum|{row}"
        return self._quantity(key, label=label, kind="sum", row_sql=row, lo_units=lo_u, hi_units=hi_u,
                              grid=g, centre=centre, value_interval=(lo, hi))

    def _quantile_quantity(self, call: AggCall, value_sql: str, iv: Interval, cond_sql: str | None) -> int:
        """The row's bucket of the QUANTILE_BUCKETS grid over the value interval (NULL for a NULL or
        NaN value or a row failing the -If condition: it is not in the histogram)."""
        lo, hi = iv
        v = f"toFloat64({value_sql})"
        if hi > lo:
            width = float_literal(QUANTILE_BUCKETS / (hi - lo))
            bucket = (f"toUInt32(least(greatest(floor(({v} - {float_literal(lo)}) * {width}), 0.), "
                      f"{QUANTILE_BUCKETS - 1}.))")
        else:
            bucket = "toUInt32(0)"
        keep = f"isNotNull({v}) AND NOT isNaN(ifNull({v}, 0.))"
        if cond_sql is not None:
            keep = f"({cond_sql}) AND {keep}"
        row = f"if({keep}, {bucket}, NULL)"
        b = self.bounding
        return self._quantity(f"quantile|{call.levels}|{row}", label=call.text, kind="quantile", row_sql=row,
                              lo_units=0, hi_units=1, grid=1.0, centre=0.0, value_interval=iv,
                              levels=call.levels, rows=1 if b.row_level else min(b.max_rows, b.rows_per_group),
                              coords=self._coords(self.release))

    def _plan_aggregate(self, call: AggCall) -> AggregatePlan:
        e = self.entry
        cond_sql = sql_of(call.cond) if call.cond is not None else None
        label = call.text
        if call.func == "count_distinct":
            # distinct values among the kept rows: one unit's kept rows in a group (<= min(C, M),
            # <= M in all) add or remove at most that many values, the bound of a row count
            row = sql_of(call.arg)
            return AggregatePlan(call, {"count": self._quantity(
                f"distinct|{row}", label=label, kind="distinct", row_sql=row, lo_units=0, hi_units=1,
                grid=1.0, centre=0.0)})
        if call.func == "count_distinct_unit":
            qi = self._units_quantity(label)
            return AggregatePlan(call, {"count": qi})
        if call.func == "count":
            preds = []
            if cond_sql is not None:
                preds.append(f"({cond_sql})")
            if call.arg is not None and expr_nullable(call.arg, e):
                preds.append(f"isNotNull({sql_of(call.arg)})")
            pred = " AND ".join(preds) if preds else None
            return AggregatePlan(call, {"count": self._count_quantity(pred, label)})
        assert call.arg is not None
        iv, s, nullable = bound_expression(call.arg, e, call.text)
        # a bare column is already clipped to exactly its interval; anything else is clipped again
        # to the computed interval (so the per-row bound holds even if the arithmetic were loose)
        bare = isinstance(call.arg, exp.Column) or (isinstance(call.arg, exp.Paren) and isinstance(call.arg.this, exp.Column))
        value = s if bare else clip_float_sql(s, *iv)
        if call.func in ("quantile", "quantiles"):
            return AggregatePlan(call, {"quantile": self._quantile_quantity(call, value, iv, cond_sql)},
                                 value_interval=iv)
        if call.func == "sum":
            is_null = nullable or expr_nullable(call.arg, e)
            qi = self._sum_quantity(value, iv, 0.0, cond_sql, label, is_null)
            return AggregatePlan(call, {"sum": qi}, value_interval=iv)
        preds = []
        if cond_sql is not None:
            preds.append(f"({cond_sql})")
        if nullable or expr_nullable(call.arg, e):
            preds.append(f"isNotNull({value})")
        pred = " AND ".join(preds) if preds else None
        centre = (iv[0] + iv[1]) / 2.0
        hw = (iv[1] - iv[0]) / 2.0
        is_null = nullable or expr_nullable(call.arg, e)
        roles = {"sum": self._sum_quantity(value, iv, centre, cond_sql, f"{label}.sum", is_null),
                 "count": self._count_quantity(pred, f"{label}.count")}
        if call.func in ("var_samp", "var_pop", "stddev_samp", "stddev_pop"):
            sq = f"pow({value} - {float_literal(centre)}, 2)"
            sq_iv = (0.0, hw * hw)
            roles["sumsq"] = self._sum_quantity(sq, sq_iv, hw * hw / 2.0, cond_sql, f"{label}.sum_sq", is_null)
        return AggregatePlan(call, roles, value_interval=iv, centre=centre, halfwidth=hw)

    # -- main -------------------------------------------------------------------------------
    def plan(self) -> Plan:
        bound = self.bound
        agg_plans = [self._plan_aggregate(c) for c in bound.aggregates]

        key_domains: list[KeyDomain | None] = [key_domain(k, self.entry, self.options.keys, self.key_types)
                                               for k in bound.keys]
        selection_needed = False
        if not bound.grouped:
            key_mode = "none"
        elif all(d is not None for d in key_domains):
            total = 1
            for d in key_domains:
                total *= max(d.size, 1)  # type: ignore[union-attr]
            if total > MAX_PUBLIC_GROUPS:
                if self.delta > 0:
                    key_mode = "threshold"
                    selection_needed = True
                else:
                    raise QueryRejected(f"the public key domains give {total} groups (more than {MAX_PUBLIC_GROUPS}); "
                                  "narrow them or pass delta > 0 for private partition selection")
            else:
                key_mode = "public"
        else:
            missing = [k.text for k, d in zip(bound.keys, key_domains) if d is None]  # as typed (issue 31)
            if self.delta <= 0:
                raise QueryRejected(
                    f"GROUP BY {', '.join(missing)}: no public key set applies (no public_keys in the catalog, no "
                    "keys= option, not a bounded integer column) and delta = 0, so the groups cannot be released "
                    "privately. Declare public keys (db.catalog.update(table, public_keys={...}) or keys={...}) "
                    "or pass delta > 0 for private partition selection")
            key_mode = "threshold"
            selection_needed = True

        selection_q = None
        if selection_needed:
            if self.options.selection == "weighted_gaussian" and self._weighted_path:
                # its statistic is not a count: a quantity of its own (an output COUNT(DISTINCT unit)
                # keeps its own, separately noised)
                selection_q = self._quantity("weighted_units", label="partition selection (weighted units per group)",
                                             kind="weighted_units", row_sql=None, lo_units=0, hi_units=1, grid=1.0,
                                             centre=0.0)
            else:
                selection_q = self._units_quantity("partition selection (distinct units per group)")
            self.quantities[selection_q].is_selection = True

        # mechanism="bounded_laplace": AVG releases its clamped mean (dpch.plan.thesis)
        self._means = thesis.restructure_means(self, agg_plans) if self.options.mechanism == "bounded_laplace" else {}
        for ap in agg_plans:
            for qi in ap.roles.values():
                self.quantities[qi].aggregates.append(ap.call.index)
        if self.peeling is not None:
            self._plan_top_k(agg_plans, key_mode, key_domains)

        self._sensitivities()
        self._split_budget(agg_plans)
        selection = None
        if selection_q is not None:
            # the rule (optimal / Gaussian / Laplace threshold) at the selection's (ε, δ) share, chosen
            # from the budget and the contribution bounds only (dpch.plan.selection); its noisy count
            # is the units quantity's released value
            q = self.quantities[selection_q]
            coords = self._coords(self.bounding)
            preference = self.options.selection
            weighted_groups = 0
            if self._weighted_path and (q.kind == "weighted_units" or (preference == "auto" and not q.aggregates)):
                weighted_groups = self.bounding.k
            elif preference == "weighted_gaussian":
                # k = 1 or row level: every unit is in one group, all weights are equal, and the
                # weighted Gaussian is the Gaussian threshold (docs/CONTROLLER.md)
                preference = "gaussian"
            rule = choose_selection(q.epsilon, q.delta, coords, preference, weighted_groups)
            if rule.rule == "weighted_gaussian":
                self._weighted_statistic(q, rule)
            q.mechanism, q.scale, q.noise = rule.mechanism, rule.scale, rule.noise()
            selection = Selection(quantity=selection_q, threshold=rule.threshold, epsilon=q.epsilon, delta=q.delta,
                                  scale=rule.scale, new_groups=coords, rule=rule)
        costs = [self._cost(q) for q in self.quantities if q.released]
        if self.top_k is not None:
            t = self.top_k
            costs.append(MechanismCost(kind="exponential", sensitivity=float(t.sensitivity), scale=t.temperature,
                                       epsilon=t.epsilon, delta=0.0, rho=None, label="top-k selection"))
        cost = PrivacyCost(mechanisms=tuple(costs))
        return Plan(bound=bound, entry=self.entry, epsilon=self.epsilon, delta=self.delta, options=self.options,
                    bounding=self.bounding, quantities=self.quantities, aggregates=agg_plans, key_mode=key_mode,
                    key_domains=key_domains, selection=selection, cost=cost, key_types=self.key_types,
                    top_k=self.top_k)

    @property
    def _weighted_path(self) -> bool:
        """Whether partition selection may use the weighted Gaussian: the user-level k > 1 path,
        where the per-unit stage knows each unit's number of kept groups."""
        return not self.bounding.row_level and self.bounding.k > 1

    def _weighted_statistic(self, q: Quantity, rule) -> None:
        """The selection quantity becomes the weighted sum of the rule (an auto choice turns the
        standalone distinct-unit count into it): per-unit weights in [0, S], grid 1/S (one unit of
        one group = 1), L2 = S (√2·S under substitute), L1 <= √k·S."""
        if q.kind == "units":
            del self.qindex[q.key]
            q.key, q.kind, q.label = "weighted_units", "weighted_units", "partition selection (weighted units per group)"
            self.qindex[q.key] = q.index
        s = rule.weight_scale
        q.lo_units, q.hi_units, q.grid = 0, s, 1.0 / s  # exact: S is a power of two
        q.l2 = rule.sensitivity
        q.l1 = math.sqrt(self.bounding.k) * s * (2.0 if self.bounding.neighbour == "substitute" else 1.0)
        q.multi_coordinate = True

    def _plan_top_k(self, agg_plans: list[AggregatePlan], key_mode: str, key_domains: list[KeyDomain | None]) -> None:
        """The peeling selection of a top-n query (dpch.plan.top_k): its score quantity, Δ, and
        whether the ordering aggregate's value is released at all."""
        shape = self.peeling
        assert shape is not None
        candidates = None
        if key_mode == "public":
            candidates = 1
            for d in key_domains:
                candidates *= max(d.size, 1)  # type: ignore[union-attr]
            if candidates <= shape.n:  # every group is released anyway: nothing to choose
                return
        ap = agg_plans[shape.aggregate]
        qi = ap.roles["sum"] if ap.func == "sum" else ap.roles["count"]
        q = self.quantities[qi]
        b = self.bounding
        rows = 1 if b.row_level else min(b.max_rows, b.rows_per_group)
        delta_score = score_sensitivity(q.kind, q.lo_units, q.hi_units, rows, b.neighbour == "substitute")
        in_outputs = {i for out in self.bound.outputs for i in aggregate_refs(out.template)}
        score_only = not q.is_selection and not any(a in in_outputs for a in q.aggregates)
        if score_only:
            q.released = False
        self.top_k = TopK(shape=shape, quantity=qi, sensitivity=delta_score, release_k=self.release.k,
                          score_only=score_only, candidates=candidates)

    def _sensitivities(self) -> None:
        grouped = self.bound.grouped
        for q in self.quantities:
            b = self.bounding if q.is_selection else self.release
            if q.kind == "quantile":  # rows of one unit in one group's histogram (the score's unit)
                q.l1 = q.l2 = float(q.rows)
                continue
            if q.kind == "weighted_units":  # set with the rule (_weighted_statistic): S is chosen with σ
                q.l1 = q.l2 = 1.0
                q.multi_coordinate = True
                continue
            if q.kind == "units":
                q.l1, q.l2 = unit_sensitivity(b, grouped)
            else:
                q.l1, q.l2 = row_sensitivity(q.lo_units, q.hi_units, b, grouped)
            if q.l1 <= 0:  # a constant quantity (e.g. SUM(0)): noise it at unit sensitivity anyway
                q.l1 = q.l2 = 1.0
            q.multi_coordinate = grouped and (b.k > 1 or b.neighbour == "substitute")

    def _weights(self, agg_plans: list[AggregatePlan]) -> None:
        weights = dict(self.options.weights or {})
        known = {SELECTION_WEIGHT_KEY, TOP_K_WEIGHT_KEY}
        by_output: dict[str, list[int]] = {}
        for out in self.bound.outputs:
            qis = sorted({qi for r in aggregate_refs(out.template) for qi in agg_plans[r].roles.values()})
            by_output[out.name] = qis
        for q in self.quantities:
            known.add(q.label)
        known.update(by_output)
        unknown = sorted(set(weights) - known)
        if unknown:
            raise InvalidParameter(f"weights: unknown label(s) {', '.join(map(repr, unknown))}; use output column "
                                   f"names, quantity labels ({', '.join(repr(q.label) for q in self.quantities if not q.is_selection)}), "
                                   f"{SELECTION_WEIGHT_KEY!r} or {TOP_K_WEIGHT_KEY!r}")
        for q in self.quantities:
            q.weight = 1.0
        for name, qis in by_output.items():
            if name in weights:
                for qi in qis:
                    self.quantities[qi].weight = float(weights[name])
        for q in self.quantities:
            if q.is_selection and SELECTION_WEIGHT_KEY in weights:
                q.weight = float(weights[SELECTION_WEIGHT_KEY])
            elif q.label in weights:
                q.weight = float(weights[q.label])
            if not q.released:
                q.weight = 0.0
        if self.top_k is not None:
            self.top_k.weight = float(weights.get(TOP_K_WEIGHT_KEY, 1.0))

    def _split_budget(self, agg_plans: list[AggregatePlan]) -> None:
        self._weights(agg_plans)
        top_w = self.top_k.weight if self.top_k is not None else 0.0
        total_w = sum(q.weight for q in self.quantities) + top_w
        for q in self.quantities:
            q.epsilon = self.epsilon * q.weight / total_w
        if self.top_k is not None:
            self.top_k.epsilon = self.epsilon * top_w / total_w
        released = [q for q in self.quantities if q.released]
        mech = self.options.mechanism
        if mech == "gaussian" and self.delta <= 0:
            raise InvalidParameter("mechanism='gaussian' needs delta > 0")
        thesis.require_delta(mech, self.delta)
        if mech == "bounded_laplace":
            choice = thesis.choose_bounded(self, agg_plans, released, self._means)
        elif mech == "mixed":
            choice = thesis.choose_mixed(self, released)
        elif mech == "laplace" or self.delta <= 0:
            choice = {q.index: "laplace" for q in released}
        elif mech == "gaussian":
            choice = {q.index: ("laplace" if q.is_selection else "gaussian") for q in released}
        else:
            n_cons = len(released)
            tentative = self.delta / n_cons
            choice = {}
            for q in released:
                if q.is_selection:
                    choice[q.index] = "laplace"
                    continue
                b = cal.laplace_scale(q.l1, q.epsilon)
                # a fast estimate decides (accuracy only; the σ actually used is calibrated below)
                if q.multi_coordinate:
                    sigma = vector_gaussian_sigma(q.l2, q.epsilon, tentative, self._coords(self.release))
                else:
                    sigma = cal.analytic_gaussian_sigma(q.l2, q.epsilon, tentative)
                choice[q.index] = "gaussian" if sigma < math.sqrt(2.0) * b else "laplace"
        for q in released:
            if q.kind == "quantile":
                choice[q.index] = "exponential"
        consumers = [q for q in released if choice[q.index] in ("gaussian", "bounded_laplace") or q.is_selection]
        for q in self.quantities:
            q.mechanism = choice.get(q.index, "none")
            q.delta = 0.0
        if consumers and self.delta > 0:
            for q in consumers:
                q.delta = self.delta / len(consumers)
        for q in released:
            if q.mechanism == "exponential":
                q.scale = 2.0 * q.rows / q.group_epsilon  # the temperature at level 0 or 1, in rows
            elif q.mechanism == "laplace":
                q.scale = cal.laplace_scale(q.l1, q.epsilon)
            elif q.mechanism == "bounded_laplace":
                thesis.calibrate_bounded(self, q, self._means)
            else:
                q.scale = self._gaussian_scale(q, q.epsilon, q.delta)
        if mech == "mixed":
            thesis.attach_mixed(self, released)

    @staticmethod
    def _coords(b: Bounding) -> int:
        """How many values one unit can move (per quantity) under bounding ``b`` (the plan's, or
        for released values of a peeling top-n plan, min(k, n) groups)."""
        return b.k * (2 if b.neighbour == "substitute" else 1)

    def _gaussian_scale(self, q: Quantity, eps: float, delta: float) -> float:
        if q.multi_coordinate:
            return vector_gaussian_sigma(q.l2, eps, delta, self._coords(self.release))
        # one released value moves, by an integer number of units (dpch.plan's docstring, point 5)
        d = float(round(q.l2))
        assert abs(d - q.l2) < 1e-9 * max(1.0, d), "single-coordinate L2 sensitivity must be an integer"
        return cal.gaussian_sigma(d, eps, delta, integer=True)

    def _cost(self, q: Quantity) -> MechanismCost:
        label = q.label
        if q.is_selection:
            return MechanismCost(kind="threshold", sensitivity=q.l1, scale=q.scale, epsilon=q.epsilon,
                                 delta=q.delta, rho=None, label=label)
        if q.mechanism == "exponential":
            # pure ε-DP (QuantileMechanism: ε/coords per group, coords groups per unit)
            return MechanismCost(kind="exponential", sensitivity=q.l1, scale=q.scale, epsilon=q.epsilon,
                                 delta=0.0, rho=None, label=label)
        if q.mechanism == "bounded_laplace":
            return thesis.bounded_cost(q)
        if q.mechanism == "laplace":
            return LaplaceMechanism(q.scale, True).cost(q.l1, q.epsilon, label=label)
        if q.multi_coordinate:
            r = cal.granularity(q.scale, cal.GAUSSIAN_GRID_BITS, True)
            d = q.l2 if r == 1.0 else q.l2 + r * math.sqrt(self._coords(self.release))
            return MechanismCost(kind="gaussian", sensitivity=d, scale=q.scale, epsilon=q.epsilon,
                                 delta=q.delta, rho=cal.zcdp_rho(d, q.scale), label=label)
        return GaussianMechanism(q.scale, True).cost(q.l2, q.delta, q.epsilon, label=label)


def _order_noise(plan: Plan) -> float:
    """The data-independent score of a top-n plan (dpch.plan.top_k): the standard deviation of
    the noise that decides the order, in score units."""
    t = plan.top_k
    if t is None:  # post-processing: the ordering aggregate's own noise
        ap = plan.aggregates[require_shape(plan.bound, "auto").aggregate]  # type: ignore[union-attr]
        q = plan.quantities[ap.roles["sum"] if ap.func == "sum" else ap.roles["count"]]
        return noise_std(q.mechanism, q.scale)
    q = plan.quantities[t.quantity]
    # the chosen values' noise, unless the score is the partition selection's own noisy count: that
    # one is released the same way by both plans, so it decides nothing between them
    value = noise_std(q.mechanism, q.scale) if q.released and not q.is_selection else 0.0
    return max(GUMBEL_STD * t.temperature, value)


def make_plan(bound: BoundQuery, epsilon: float, delta: float, options: QueryOptions | None = None,
              key_types: Sequence[str] | None = None) -> Plan:
    """Plan ``bound`` under (ε, δ). ``key_types``: the engine's type of each GROUP BY key (public
    key values are cast to it and de-duplicated in it). A top-n query (ORDER BY COUNT/SUM LIMIT n)
    is planned both ways, post-processing and peeling (option ``top_k``), and ``auto`` keeps the
    one whose order is decided by less noise (dpch.plan.top_k). Raises QueryRejected /
    InvalidParameter; charges nothing."""
    eps, dlt = check_budget_args(epsilon, delta)
    opts = options or QueryOptions()
    shape = require_shape(bound, opts.top_k)
    base = None
    if opts.top_k != "peeling":
        base = _Planner(bound, eps, dlt, opts, key_types).plan()
        if shape is None or opts.top_k == "post_processing" or shape.n > MAX_PEELING_ROUNDS:
            if shape is not None:
                base.top_k_scores = {}  # a top-n query answered by post-processing (explain says so)
            return base
    peel = _Planner(bound, eps, dlt, opts, key_types, peeling=shape).plan()
    if base is None:
        return peel
    if peel.top_k is None:  # every candidate is released anyway
        base.top_k_scores = {}
        return base
    scores = {"post_processing": _order_noise(base), "peeling": _order_noise(peel)}
    chosen = peel if scores["peeling"] < scores["post_processing"] else base
    chosen.top_k_scores = scores
    return chosen
