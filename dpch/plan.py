"""Stage 3 of the controller: the privacy plan of a bound query.

``make_plan(bound, epsilon, delta, options) -> Plan`` decides, before anything runs:

1. **Quantities.** Every DP aggregate is built from noisy *quantities*, each computed once:
   a count of rows (optionally of rows satisfying a predicate), the count of distinct units, or a
   sum of a bounded per-row value in fixed point. COUNT → one count; SUM → one sum (centred at 0);
   AVG → a sum centred at the midpoint of its bounds and a count; VAR/STDDEV → centred sum, centred
   sum of squares and a count. Identical quantities are shared (AVG(x) and COUNT(x) share the
   count), so the budget pays for each once.

2. **Per-row bounds by interval arithmetic** (the paper, Remark 1: a Lipschitz/monotone map of a
   bounded value is bounded, in ``dpch.bounds``): the expression inside an aggregate is evaluated over intervals from
   the catalog bounds (+, -, *, / by a value whose bounds exclude 0, abs, least/greatest, if/CASE,
   pow, sqrt, exp/log, rounding, casts, comparisons -> [0, 1]). Its columns are clipped to their
   bounds and the result is clipped to the computed interval in SQL, so the per-row bound holds by
   construction even if the arithmetic were loose (looseness costs accuracy only).

3. **Fixed point.** A sum quantity is computed in integer units of the power-of-two grid
   ``g = 2^(floor(log2 hw) + 1 - 20)`` (hw = half-width of the value interval around its centre):
   per-row units are clamped to ``[L, H] = [round((lo - c)/g), round((hi - c)/g)]`` and summed as
   Int64, which is exact, so floating-point summation order cannot inflate the sensitivity
   (Casacuberta et al. 2022). Noise is added by ``dpch_laplace_int`` / ``dpch_gaussian_int``.

4. **Sensitivity** of each quantity in grid units, from the contribution bounds (docs/CONTROLLER.md,
   "Sensitivity"): one unit contributes to at most k groups (k = max_groups_contributed when the
   query groups, else 1), at most C = max_rows_per_group rows per group and M = max_rows_per_unit
   rows in total; every per-row value lies in [L, H], B = max(|L|, |H|), M' = min(M, kC):
   - add_remove: L1 = M'·B; L2 = B·sqrt(q·C² + (M' - qC)²), q = min(k, floor(M'/C));
     distinct units: L1 = k, L2 = sqrt(k);
   - substitute, no GROUP BY: the unit's contribution ranges over [min(0, M'L), max(0, M'H)], so
     L1 = L2 = M'·(max(0, H) - min(0, L)) (distinct units: 1);
   - substitute, GROUP BY: L1 = 2·L1(add_remove), L2 = sqrt(2)·L2 when L and H have the same sign
     (else 2·L2); distinct units: 2k, sqrt(2k).
   Row-level tables are the case k = C = M = 1.

5. **Mechanism** per quantity (option ``mechanism=``): "laplace", "gaussian" or "auto" (default).
   auto: Laplace when δ = 0; when δ > 0, Gaussian for a quantity iff its σ is below the standard
   deviation √2·b of the Laplace noise it would otherwise get (with the same ε share and an equal
   δ share). Laplace: ``dpch.calibration.laplace_scale(L1, ε_q)`` (the paper, Thm 1). Gaussian:
   ``gaussian_sigma(L2, ε_q, δ_q, integer=True)`` when one unit can move a single released value
   (no GROUP BY, or k = 1 under add_remove: the exact discrete-Gaussian δ, CKS20 Thm 7), else the
   zCDP route: the multivariate discrete Gaussian is L2²/(2σ²)-zCDP (CKS20 Thm 4 and its
   multivariate extension) and ρ-zCDP implies (ε, δ)-DP with
   δ = inf_{α>1} exp((α-1)(αρ-ε))·(1-1/α)^(α-1)/α (CKS20 Cor. 13).

6. **Budget split** (option ``weights=``): ε is split in proportion to weights, one weight per noisy
   quantity (default 1 each) plus one for private partition selection (default 1, key
   ``"partition_selection"``). ``weights`` may name a quantity label (shown by explain) or an
   output column (sets the weight of each of its quantities). δ is split equally among the
   mechanisms that use it (Gaussian quantities and partition selection); δ that no mechanism uses
   is not charged. Costs compose by basic composition (Dwork & Roth Thm 3.16) in the ledger.

7. **Group keys.** No GROUP BY: one row. Otherwise, per key, a public domain when one exists:
   the catalog's ``public_keys`` for a column (or ``keys=`` given with the query), also mapped
   through a key expression of that one column; or the values of an integer column with declared
   bounds (at most 10 000 values). When every key has a domain, the output is exactly their cross
   product (empty groups get noise only; rows outside it are dropped). Otherwise, with δ > 0,
   **private partition selection** (Korolova et al. 2009; Wilson et al. 2020, "Differentially
   Private SQL with Bounded User Contribution", PETS, §3): each group's number of distinct units
   gets discrete Laplace noise of scale b = laplace_scale(Δ, ε_sel) (Δ = k, or 2k under
   substitute) and the group is released iff the noisy count is >= T. One unit creates at most k
   new groups, each with count 1; the kernel's noise K (scale τ >= b) satisfies
   P[K >= j] = q^j/(1+q), q = e^(-1/τ), so T = 1 + j with j the least integer such that
   q^j/(1+q) <= δ₁ = 1 - (1 - δ_sel)^(1/k). The released groups are then (ε_sel, δ_sel)-DP, and
   their noisy distinct-unit counts too (post-processing of the same mechanism), which is why
   COUNT(DISTINCT unit) reuses the selection count under thresholding. With δ = 0 and a key
   without a public domain the query is rejected.
"""
from __future__ import annotations

import functools
import numbers
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from sqlglot import exp

from . import calibration as cal
from .bind import AggCall, BoundQuery, KeySpec, sql_of
from .catalog import TableEntry, base_type, is_integer_type, literal_sql, quote_ident
from .cost import MechanismCost, PrivacyCost
from .errors import CatalogError, InvalidParameter, QueryRejected
from .bounds import Interval, _flit, bound_expression, expr_nullable
from .mechanisms import GaussianMechanism, LaplaceMechanism

FIXED_POINT_BITS = 20
MAX_ENUMERATED_KEYS = 10_000
MAX_PUBLIC_GROUPS = 1_000_000
SELECTION_WEIGHT_KEY = "partition_selection"
MECHANISMS = ("auto", "laplace", "gaussian")

def _reject(msg: str) -> QueryRejected:
    return QueryRejected(msg)


# ------------------------------------------------------------------------------------------------
# Options
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class QueryOptions:
    """Options of db.query / db.explain (keyword arguments)."""

    mechanism: str = "auto"
    weights: Mapping[str, float] | None = None
    keys: Mapping[str, list] | None = None
    confidence: float = 0.95
    with_ci: bool = False

    FIELDS = ("mechanism", "weights", "keys", "confidence", "with_ci")

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
        return cls(mechanism=mech, weights=dict(weights) if weights else None,
                   keys=dict(keys) if keys else None, confidence=conf, with_ci=with_ci)


def check_budget_args(epsilon: Any, delta: Any) -> tuple[float, float]:
    """ε must be finite > 0; δ finite in [0, 1)."""
    eps = cal.check_epsilon(epsilon)
    if isinstance(delta, bool) or not isinstance(delta, numbers.Real):  # numbers.Real: numpy scalars too
        raise InvalidParameter("delta must be a real number in [0, 1)")
    d = float(delta)
    if d == 0.0:
        return eps, 0.0
    return eps, cal.check_delta(d)


# ------------------------------------------------------------------------------------------------
# Plan dataclasses
# ------------------------------------------------------------------------------------------------

@dataclass
class Quantity:
    """One noisy value per group, computed exactly once."""

    index: int
    key: str  # identity for sharing
    label: str
    kind: str  # "rows" (count of rows matching pred), "units" (distinct units) or "sum"
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

    @property
    def column(self) -> str:
        return f"__dp_q{self.index}"

    @property
    def noisy_column(self) -> str:
        return f"__dp_n{self.index}"

    def mechanism_object(self):
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
    quantity: int  # index of the "units" quantity used for thresholding
    threshold: int  # release iff noisy count >= threshold
    epsilon: float
    delta: float
    scale: float
    new_groups: int  # k: groups one unit can create


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

    @property
    def grouped(self) -> bool:
        return self.bound.grouped

    def key_nullable(self, j: int) -> bool:
        """Whether key j may be NULL (unknown types count as nullable: the NULL-safe form is used)."""
        return self.key_types is None or "Nullable(" in self.key_types[j]


# ------------------------------------------------------------------------------------------------
# Sensitivity
# ------------------------------------------------------------------------------------------------

def row_sensitivity(lo_u: int, hi_u: int, b: Bounding, grouped: bool) -> tuple[float, float]:
    """(L1, L2) in units of a per-group sum of per-row contributions in [lo_u, hi_u]."""
    B = max(abs(lo_u), abs(hi_u), 0)
    k = b.k if grouped else 1
    C = b.rows_per_group
    M_eff = min(b.max_rows, k * C)
    l1 = float(M_eff * B)
    q = min(k, M_eff // C)
    rem = M_eff - q * C
    l2 = B * math.sqrt(q * C * C + rem * rem)
    if b.neighbour == "substitute":
        if not grouped:
            width = float(M_eff * (max(0, hi_u) - min(0, lo_u)))
            return width, width
        same_sign = lo_u >= 0 or hi_u <= 0
        return 2.0 * l1, (math.sqrt(2.0) if same_sign else 2.0) * l2
    return l1, l2


def unit_sensitivity(b: Bounding, grouped: bool) -> tuple[float, float]:
    """(L1, L2) of the per-group count of distinct units."""
    if not grouped:
        return 1.0, 1.0
    k = b.k
    if b.neighbour == "substitute":
        return 2.0 * k, math.sqrt(2.0 * k)
    return float(k), math.sqrt(k)


def _zcdp_to_delta(rho: float, eps: float) -> float:
    """δ such that ρ-zCDP implies (ε, δ)-DP (CKS20 Cor. 13):
    δ = inf_{α>1} exp((α-1)(αρ-ε)) (1-1/α)^(α-1) / α. Any α gives a valid bound; α is chosen
    near the minimiser, the root of (2α-1)ρ - ε + ln(1-1/α) = 0 (increasing in α)."""
    if rho <= 0:
        return 0.0

    def g(alpha: float) -> float:
        return (2 * alpha - 1) * rho - eps + math.log1p(-1 / alpha)

    lo, hi = 1.0 + 1e-12, max(2.0, (eps + rho) / (2 * rho) + 1.0)
    while g(hi) < 0:
        hi *= 2
    for _ in range(80):
        mid = (lo + hi) / 2
        if g(mid) < 0:
            lo = mid
        else:
            hi = mid
    alpha = hi
    log_delta = (alpha - 1) * (alpha * rho - eps) + (alpha - 1) * math.log1p(-1 / alpha) - math.log(alpha)
    return min(1.0, math.exp(log_delta))


@functools.lru_cache(maxsize=4096)
def _rho_max(eps: float, delta: float) -> float:
    """The largest ρ with δ(ρ, ε) <= δ (CKS20 Cor. 13; δ is increasing in ρ): bisection."""
    def ok(rho: float) -> bool:
        return _zcdp_to_delta(rho, eps) <= delta

    lo, hi = 0.0, eps
    while ok(hi):
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    if lo <= 0:
        raise InvalidParameter("no finite sigma reaches this privacy level")
    return lo


def vector_gaussian_sigma(l2: float, eps: float, delta: float, coords: int = 1) -> float:
    """σ for ``dpch_gaussian_int`` such that the discrete Gaussian on a vector with L2 sensitivity
    l2 (at most ``coords`` coordinates change) is (ε, δ)-DP via zCDP: ρ = d²/(2σ²) (CKS20 Thm 4),
    δ(ρ, ε) by CKS20 Cor. 13. When σ > 2^20 the kernel rounds values to the grid r = grid(σ, 20),
    which moves each changed coordinate by at most one more grid unit: d = l2 + r·sqrt(coords)."""
    rho = _rho_max(eps, delta)
    sigma = l2 / math.sqrt(2 * rho) * (1 + 1e-12)
    for _ in range(64):
        r = cal.granularity(sigma, cal.GAUSSIAN_GRID_BITS, True)
        if r == 1.0:
            return sigma
        need = (l2 + 2 * r * math.sqrt(coords)) / math.sqrt(2 * rho) * (1 + 1e-12)
        if need <= sigma and cal.granularity(need, cal.GAUSSIAN_GRID_BITS, True) <= r:
            return max(sigma, need)
        sigma = need
    raise InvalidParameter("no stable Gaussian sigma for this query")  # pragma: no cover


def selection_threshold(scale: float, delta_sel: float, new_groups: int) -> int:
    """T such that a group held by one unit passes ``noisy >= T`` with probability <= δ₁ for the
    kernel's discrete Laplace (module docstring, point 7)."""
    _r, tau = cal.kernel_noise_scale(scale, cal.LAPLACE_GRID_BITS, True)
    q = math.exp(-1.0 / tau)
    delta1 = -math.expm1(math.log1p(-delta_sel) / new_groups)
    log_target = math.log(delta1)
    j = max(1, math.ceil(-tau * (log_target + math.log1p(q))))
    # guard against rounding: check j·ln q - ln(1+q) <= ln δ₁ with a margin
    while j * math.log(q) - math.log1p(q) > log_target - 1e-12:
        j += 1
    return 1 + j


def selection_release_probability(scale: float, threshold: int, count: int = 1) -> float:
    """P[count + K >= threshold] for the kernel's discrete Laplace noise K (exact formula)."""
    _r, tau = cal.kernel_noise_scale(scale, cal.LAPLACE_GRID_BITS, True)
    q = math.exp(-1.0 / tau)
    j = threshold - count
    if j <= 0:
        return 1.0 - q ** (-j + 1) / (1 + q)
    return q ** j / (1 + q)


# ------------------------------------------------------------------------------------------------
# Planner
# ------------------------------------------------------------------------------------------------

def _grid(halfwidth: float) -> float:
    hw = halfwidth if halfwidth > 0 else 1.0
    return math.ldexp(1.0, math.floor(math.log2(hw)) + 1 - FIXED_POINT_BITS)


class _Planner:
    def __init__(self, bound: BoundQuery, epsilon: float, delta: float, options: QueryOptions,
                 key_types: Sequence[str] | None = None):
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
        units = (f"least(greatest(toInt64(round(({value_sql} - {_flit(centre)}) * {_flit(inv)})), "
                 f"{lo_u}), {hi_u})")
        row = units if cond_sql is None else f"if({cond_sql}, {units}, 0)"
        if nullable:
            row = f"ifNull({row}, 0)"
        key = f"sum|{row}"
        return self._quantity(key, label=label, kind="sum", row_sql=row, lo_units=lo_u, hi_units=hi_u,
                              grid=g, centre=centre, value_interval=(lo, hi))

    def _clip_value(self, s: str, iv: Interval) -> str:
        lo, hi = iv
        return (f"if(isNaN(toFloat64({s})), {_flit(lo)}, "
                f"least(greatest(toFloat64({s}), {_flit(lo)}), {_flit(hi)}))")

    def _plan_aggregate(self, call: AggCall) -> AggregatePlan:
        e = self.entry
        cond_sql = sql_of(call.cond) if call.cond is not None else None
        label = call.text
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
        value = s if bare else self._clip_value(s, iv)
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
            sq = f"pow({value} - {_flit(centre)}, 2)"
            sq_iv = (0.0, hw * hw)
            roles["sumsq"] = self._sum_quantity(sq, sq_iv, hw * hw / 2.0, cond_sql, f"{label}.sum_sq", is_null)
        return AggregatePlan(call, roles, value_interval=iv, centre=centre, halfwidth=hw)

    # -- keys -------------------------------------------------------------------------------
    def _query_keys_for(self, key: KeySpec) -> list | None:
        keys = self.options.keys or {}
        for name in (key.name, key.sql) + (key.columns if len(key.columns) == 1 and
                                           isinstance(key.expr, exp.Column) else ()):
            if name in keys:
                vals = keys[name]
                if isinstance(vals, (str, bytes)) or not hasattr(vals, "__iter__"):
                    raise InvalidParameter(f"keys[{name!r}] must be a list of values")
                vals = list(dict.fromkeys(vals))
                if not vals:
                    raise InvalidParameter(f"keys[{name!r}] must not be empty")
                return vals
        return None

    def _key_domain(self, key: KeySpec) -> KeyDomain | None:
        e = self.entry
        qkeys = self._query_keys_for(key)
        if qkeys is not None:
            try:
                arr = f"[{', '.join(literal_sql(v) for v in qkeys)}]"
            except CatalogError:
                raise InvalidParameter(f"keys[{key.name!r}]: values must be strings, numbers, booleans or None") from None
            if self.key_types is not None:  # cast to the key's type, then de-duplicate in that type
                arr = _distinct(f"CAST({arr} AS Array({_array_elem_type(self.key_types[key.index])}))",
                                any(v is None for v in qkeys))
            return KeyDomain(array_sql=arr, filter_sql=f"has({arr}, {key.sql})", source="query keys",
                             size=len(qkeys))
        if len(key.columns) != 1:
            return None
        col = key.columns[0]
        typ = e.columns.get(col, "")
        col_q = quote_ident(col)
        if col in e.public_keys:
            vals = e.public_keys[col]
            arr = _distinct(f"CAST([{', '.join(literal_sql(v) for v in vals)}] AS Array({_array_elem_type(typ)}))",
                            any(v is None for v in vals))
            size = len(vals)
            source = "catalog public keys"
            col_filter = f"{col_q} IN {arr}"
        elif is_integer_type(typ) and col in e.bounds:
            lo, hi = e.bounds[col]
            lo_i, hi_i = math.ceil(lo), math.floor(hi)
            size = hi_i - lo_i + 1
            if size <= 0 or size > MAX_ENUMERATED_KEYS:
                return None
            arr = f"CAST(range({lo_i}, {hi_i + 1}) AS Array({_array_elem_type(typ)}))" if lo_i >= 0 else \
                f"arrayMap(__dp_x -> CAST(__dp_x + ({lo_i}) AS {base_type(typ)}), range({size}))"
            source = "bounded integer column"
            col_filter = f"{col_q} BETWEEN {lo_i} AND {hi_i}"
        else:
            return None
        if isinstance(key.expr, exp.Column):
            return KeyDomain(array_sql=arr, filter_sql=col_filter, source=source, size=size)
        # an expression of one column with a public domain: its image (keys outside it are dropped)
        lam = _substitute_column(key.expr, col, "__dp_x")
        image = _distinct(f"arrayMap(__dp_x -> {lam}, {arr})")  # the image may hold NULL (nullIf)
        return KeyDomain(array_sql=image, filter_sql=col_filter, source=source, size=size)

    # -- main -------------------------------------------------------------------------------
    def plan(self) -> Plan:
        bound = self.bound
        agg_plans = [self._plan_aggregate(c) for c in bound.aggregates]

        key_domains: list[KeyDomain | None] = [self._key_domain(k) for k in bound.keys]
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
                    raise _reject(f"the public key domains give {total} groups (more than {MAX_PUBLIC_GROUPS}); "
                                  "narrow them or pass delta > 0 for private partition selection")
            else:
                key_mode = "public"
        else:
            missing = [k.sql for k, d in zip(bound.keys, key_domains) if d is None]
            if self.delta <= 0:
                raise _reject(
                    f"GROUP BY {', '.join(missing)}: no public key set applies (no public_keys in the catalog, no "
                    "keys= option, not a bounded integer column) and delta = 0, so the groups cannot be released "
                    "privately. Declare public keys (db.catalog.register(..., public_keys={...}) or keys={...}) "
                    "or pass delta > 0 for private partition selection")
            key_mode = "threshold"
            selection_needed = True

        selection_q = None
        if selection_needed:
            selection_q = self._units_quantity("partition selection (distinct units per group)")
            self.quantities[selection_q].is_selection = True

        for ap in agg_plans:
            for qi in ap.roles.values():
                self.quantities[qi].aggregates.append(ap.call.index)

        self._sensitivities()
        self._split_budget(agg_plans)
        selection = None
        if selection_q is not None:
            q = self.quantities[selection_q]
            selection = Selection(quantity=selection_q,
                                  threshold=selection_threshold(q.scale, q.delta, self.bounding.k),
                                  epsilon=q.epsilon, delta=q.delta, scale=q.scale, new_groups=self.bounding.k)
        cost = PrivacyCost(mechanisms=tuple(self._cost(q) for q in self.quantities))
        return Plan(bound=bound, entry=self.entry, epsilon=self.epsilon, delta=self.delta, options=self.options,
                    bounding=self.bounding, quantities=self.quantities, aggregates=agg_plans, key_mode=key_mode,
                    key_domains=key_domains, selection=selection, cost=cost, key_types=self.key_types)

    def _sensitivities(self) -> None:
        grouped = self.bound.grouped
        b = self.bounding
        for q in self.quantities:
            if q.kind == "units":
                q.l1, q.l2 = unit_sensitivity(b, grouped)
            else:
                q.l1, q.l2 = row_sensitivity(q.lo_units, q.hi_units, b, grouped)
            if q.l1 <= 0:  # a constant quantity (e.g. SUM(0)): noise it at unit sensitivity anyway
                q.l1 = q.l2 = 1.0
            q.multi_coordinate = grouped and (b.k > 1 or b.neighbour == "substitute")

    def _weights(self, agg_plans: list[AggregatePlan]) -> None:
        weights = dict(self.options.weights or {})
        known = {SELECTION_WEIGHT_KEY}
        by_output: dict[str, list[int]] = {}
        for out in self.bound.outputs:
            refs = [int(n.name[len("__dp_a"):]) for n in out.template.walk()
                    if isinstance(n, exp.Column) and n.name.startswith("__dp_a")]
            qis = sorted({qi for r in refs for qi in agg_plans[r].roles.values()})
            by_output[out.name] = qis
        for q in self.quantities:
            known.add(q.label)
        known.update(by_output)
        unknown = sorted(set(weights) - known)
        if unknown:
            raise InvalidParameter(f"weights: unknown label(s) {', '.join(map(repr, unknown))}; use output column "
                                   f"names, quantity labels ({', '.join(repr(q.label) for q in self.quantities if not q.is_selection)}) "
                                   f"or {SELECTION_WEIGHT_KEY!r}")
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

    def _split_budget(self, agg_plans: list[AggregatePlan]) -> None:
        self._weights(agg_plans)
        total_w = sum(q.weight for q in self.quantities)
        for q in self.quantities:
            q.epsilon = self.epsilon * q.weight / total_w
        mech = self.options.mechanism
        if mech == "gaussian" and self.delta <= 0:
            raise InvalidParameter("mechanism='gaussian' needs delta > 0")
        if mech == "laplace" or self.delta <= 0:
            choice = {q.index: "laplace" for q in self.quantities}
        elif mech == "gaussian":
            choice = {q.index: ("laplace" if q.is_selection else "gaussian") for q in self.quantities}
        else:
            n_cons = len(self.quantities)
            tentative = self.delta / n_cons
            choice = {}
            for q in self.quantities:
                if q.is_selection:
                    choice[q.index] = "laplace"
                    continue
                b = cal.laplace_scale(q.l1, q.epsilon)
                # a fast estimate decides (accuracy only; the σ actually used is calibrated below)
                if q.multi_coordinate:
                    sigma = vector_gaussian_sigma(q.l2, q.epsilon, tentative, self._coords())
                else:
                    sigma = cal.analytic_gaussian_sigma(q.l2, q.epsilon, tentative)
                choice[q.index] = "gaussian" if sigma < math.sqrt(2.0) * b else "laplace"
        consumers = [q for q in self.quantities if choice[q.index] == "gaussian" or q.is_selection]
        for q in self.quantities:
            q.mechanism = choice[q.index]
            q.delta = 0.0
        if consumers and self.delta > 0:
            for q in consumers:
                q.delta = self.delta / len(consumers)
        for q in self.quantities:
            if q.mechanism == "laplace":
                q.scale = cal.laplace_scale(q.l1, q.epsilon)
            else:
                q.scale = self._gaussian_scale(q, q.epsilon, q.delta)

    def _coords(self) -> int:
        """How many released values one unit can move (per quantity)."""
        b = self.bounding
        return b.k * (2 if b.neighbour == "substitute" else 1)

    def _gaussian_scale(self, q: Quantity, eps: float, delta: float) -> float:
        if q.multi_coordinate:
            return vector_gaussian_sigma(q.l2, eps, delta, self._coords())
        # one released value moves, by an integer number of units (module docstring, point 5)
        d = float(round(q.l2))
        assert abs(d - q.l2) < 1e-9 * max(1.0, d), "single-coordinate L2 sensitivity must be an integer"
        return cal.gaussian_sigma(d, eps, delta, integer=True)

    def _cost(self, q: Quantity) -> MechanismCost:
        label = q.label
        if q.is_selection:
            return MechanismCost(kind="threshold", sensitivity=q.l1, scale=q.scale, epsilon=q.epsilon,
                                 delta=q.delta, rho=None, label=label)
        if q.mechanism == "laplace":
            return LaplaceMechanism(q.scale, True).cost(q.l1, q.epsilon, label=label)
        if q.multi_coordinate:
            r = cal.granularity(q.scale, cal.GAUSSIAN_GRID_BITS, True)
            d = q.l2 if r == 1.0 else q.l2 + r * math.sqrt(self._coords())
            return MechanismCost(kind="gaussian", sensitivity=d, scale=q.scale, epsilon=q.epsilon,
                                 delta=q.delta, rho=cal.zcdp_rho(d, q.scale), label=label)
        return GaussianMechanism(q.scale, True).cost(q.l2, q.delta, q.epsilon, label=label)


def _distinct(arr: str, has_null: bool = True) -> str:
    """The array's distinct values, de-duplicated in the engine in the array's type. arrayDistinct
    drops NULL, a group like any other: where a NULL may be present the values go through 1-tuples
    (a tuple holding NULL is not NULL), which still spells the array once."""
    if not has_null:
        return f"arrayDistinct({arr})"
    return f"arrayMap(__dp_t -> __dp_t.1, arrayDistinct(arrayMap(__dp_x -> tuple(__dp_x), {arr})))"


def _array_elem_type(typ: str) -> str:
    t = typ.strip()
    while t.startswith("LowCardinality(") and t.endswith(")"):
        t = t[len("LowCardinality("):-1]
    return t


def _substitute_column(node: exp.Expression, column: str, var: str) -> str:
    copy = node.copy()
    holder = exp.Paren(this=copy)
    for c in list(holder.find_all(exp.Column)):
        if c.name == column:
            c.replace(exp.column(var))
    return sql_of(holder.this)


def make_plan(bound: BoundQuery, epsilon: float, delta: float, options: QueryOptions | None = None,
              key_types: Sequence[str] | None = None) -> Plan:
    """Plan ``bound`` under (ε, δ). ``key_types``: the engine's type of each GROUP BY key (public
    key values are cast to it and de-duplicated in it). Raises QueryRejected / InvalidParameter;
    charges nothing."""
    eps, dlt = check_budget_args(epsilon, delta)
    return _Planner(bound, eps, dlt, options or QueryOptions(), key_types).plan()
