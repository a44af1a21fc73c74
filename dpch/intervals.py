"""Intervals for the columns whose interval is not one mechanism's noise quantile (issue 29 item 4):
derived columns (arithmetic over released aggregates) and quantiles. Post-processing of released
values and public parameters only: no privacy cost, no row read.

- ``derived_ci``: the interval image of a derived column's template (``dpch.bind`` OutputColumn,
  aggregates as ``__dp_a<i>`` columns) over the box of its aggregates' intervals, each at level
  1 − (1 − level)/m for m distinct aggregates (union bound: all m cover at once with probability
  >= level, whatever their dependence), by interval arithmetic with a sound rule per operation
  (outward-rounded by one ulp). A row whose box reaches a point where the expression is undefined
  or unbounded (a denominator interval containing 0, sqrt/log of an interval reaching below 0)
  gets NaN bounds and a note; an expression with no sound rule here (``if``, comparisons, ``%``,
  integer casts that wrap, group keys, quantiles) gets NaN bounds on every row and a note.
- ``quantile_ci``: the rank interval ±r of a quantile column (``Quantity.rank_ci``) and, where the
  query also releases a COUNT of exactly the rows in the quantile's histogram, the level interval
  α ± r/n_lo (n_lo the count interval's lower end; rank and count each at 1 − (1 − level)/2).
  docs/CONTROLLER.md "Intervals" states what both mean and their source.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from sqlglot import exp

from .bind import AGG_PREFIX, AggCall
from .catalog_model import base_type, is_integer_type, is_nullable
from .plan import AggregatePlan, Plan

#: df.attrs["ci_note"]: what every interval of a result covers.
NOISE_ONLY = ("intervals cover the noise only: they are for the value on the bounded data (after "
              "contribution bounding and clipping), not for the bias that bounding and clipping add")
DENOMINATOR = "no interval: the denominator's interval contains 0"
QUANTILE_IN_EXPRESSION = "no interval: a quantile has a rank interval only, no value interval"

Pair = tuple[np.ndarray, np.ndarray]


class _NoRule(Exception):
    """The expression has no sound interval rule here (the message says which part)."""


@dataclass
class ColumnCI:
    lo: np.ndarray
    hi: np.ndarray
    notes: list[str] = field(default_factory=list)

    @property
    def note(self) -> str | None:
        return "; ".join(self.notes) if self.notes else None


def _down(x: np.ndarray) -> np.ndarray:
    return np.nextafter(x, -np.inf)


def _up(x: np.ndarray) -> np.ndarray:
    return np.nextafter(x, np.inf)


class _Eval:
    """Interval arithmetic over numpy arrays (one element per result row); ``bad`` marks rows whose
    box reaches an undefined point, ``notes`` says why."""

    def __init__(self, env: dict[str, Pair], n: int):
        self.env, self.n = env, n
        self.bad = np.zeros(n, dtype=bool)
        self.notes: list[str] = []

    def _mark(self, rows: np.ndarray, note: str) -> None:
        if rows.any():
            self.bad |= rows
            if note not in self.notes:
                self.notes.append(note)

    def corners(self, cs: list[np.ndarray]) -> Pair:
        c = np.stack(cs)
        c = np.where(np.isnan(c), 0.0, c)  # 0·inf at a corner: the product's limit there is 0
        return _down(c.min(axis=0)), _up(c.max(axis=0))

    def ev(self, node: exp.Expression) -> Pair:
        n = self.n
        if isinstance(node, exp.Paren):
            return self.ev(node.this)
        if isinstance(node, exp.Literal) and not node.is_string:
            v = float(node.this)
            return np.full(n, v), np.full(n, v)
        if isinstance(node, exp.Column):
            if node.name in self.env:
                return self.env[node.name]
            raise _NoRule("no interval: the expression uses a group key")
        if isinstance(node, exp.Neg):
            lo, hi = self.ev(node.this)
            return -hi, -lo
        if isinstance(node, (exp.Add, exp.Sub, exp.Mul, exp.Div)):
            (al, ah), (bl, bh) = self.ev(node.this), self.ev(node.expression)
            if isinstance(node, exp.Add):
                return _down(al + bl), _up(ah + bh)
            if isinstance(node, exp.Sub):
                return _down(al - bh), _up(ah - bl)
            if isinstance(node, exp.Mul):
                return self.corners([al * bl, al * bh, ah * bl, ah * bh])
            self._mark((bl <= 0) & (bh >= 0), DENOMINATOR)  # a/b unbounded (or undefined) near b = 0
            with np.errstate(divide="ignore", invalid="ignore"):
                return self.corners([al / bl, al / bh, ah / bl, ah / bh])
        if isinstance(node, exp.Abs):
            lo, hi = self.ev(node.this)
            straddle = (lo <= 0) & (hi >= 0)
            return (np.where(straddle, 0.0, np.minimum(np.abs(lo), np.abs(hi))),
                    np.maximum(np.abs(lo), np.abs(hi)))
        if isinstance(node, exp.Pow):
            p = node.expression
            if not (isinstance(p, exp.Literal) and not p.is_string and p.this.isdigit()):
                raise _NoRule("no interval: pow with a non-integer or non-literal exponent")
            k = int(p.this)
            lo, hi = self.ev(node.this)
            if k % 2 == 1:  # odd power: increasing
                return _down(lo ** k), _up(hi ** k)
            a_lo, a_hi = self.ev(exp.Abs(this=node.this))
            return _down(a_lo ** k), _up(a_hi ** k)
        if isinstance(node, (exp.Greatest, exp.Least)):
            args = [self.ev(a) for a in [node.this, *node.expressions]]
            f = np.maximum if isinstance(node, exp.Greatest) else np.minimum
            lo, hi = args[0]
            for a_lo, a_hi in args[1:]:  # non-decreasing in each argument
                lo, hi = f(lo, a_lo), f(hi, a_hi)
            return lo, hi
        return self._monotone(node)

    def _monotone(self, node: exp.Expression) -> Pair:
        """Non-decreasing functions of one argument: the image of the endpoints."""
        name = node.name.lower() if isinstance(node, exp.Anonymous) else type(node).__name__.lower()
        if isinstance(node, (exp.Round, exp.Floor, exp.Ceil)):
            lo, hi = self.ev(node.this)
            extra = node.args.get("decimals")
            if isinstance(node, exp.Round):
                # any rounding rule lies between floor and ceil at 10^-d (ClickHouse's ties too)
                s = 10.0 ** (self._int_literal(extra) if extra is not None else 0)
                return _down(np.floor(lo * s) / s), _up(np.ceil(hi * s) / s)
            if extra is not None:
                raise _NoRule("no interval: floor/ceil with a precision argument")
            f = np.floor if isinstance(node, exp.Floor) else np.ceil
            return f(lo), f(hi)
        if isinstance(node, exp.Cast) and node.to.this in (exp.DataType.Type.DOUBLE, exp.DataType.Type.FLOAT):
            return self.ev(node.this)
        if isinstance(node, exp.Anonymous) and name in ("tofloat64", "tofloat32") and len(node.expressions) == 1:
            return self.ev(node.expressions[0])
        if isinstance(node, (exp.Sqrt, exp.Ln, exp.Exp)):
            lo, hi = self.ev(node.this)
            if isinstance(node, exp.Exp):
                return _down(np.exp(lo)), _up(np.exp(hi))
            self._mark(lo < 0, f"no interval: the argument of {name} has an interval reaching below 0")
            f = np.sqrt if isinstance(node, exp.Sqrt) else np.log
            with np.errstate(divide="ignore", invalid="ignore"):
                return _down(f(np.maximum(lo, 0.0))), _up(f(np.maximum(hi, 0.0)))
        raise _NoRule(f"no interval: no sound interval rule for {node.key!r} here")

    @staticmethod
    def _int_literal(node: exp.Expression) -> int:
        if isinstance(node, exp.Neg):
            return -_Eval._int_literal(node.this)
        if isinstance(node, exp.Literal) and not node.is_string and node.this.isdigit():
            return int(node.this)
        raise _NoRule("no interval: round with a non-literal precision")


def derived_ci(template: exp.Expression, plan: Plan, n: int,
               aggregate_ci: Callable[[AggregatePlan, float], Pair], level: float) -> ColumnCI:
    """The interval of a derived column (module docstring) at ``level``: ``aggregate_ci(ap, lv)``
    gives an aggregate's interval at level lv (dpch.postprocess.aggregate_ci)."""
    refs = sorted({int(c.name[len(AGG_PREFIX):]) for c in template.find_all(exp.Column)
                   if c.name.startswith(AGG_PREFIX)})
    nan = np.full(n, np.nan)
    if any(plan.aggregates[i].func in ("quantile", "quantiles") for i in refs):
        return ColumnCI(nan, nan.copy(), [QUANTILE_IN_EXPRESSION])
    lv = 1.0 - (1.0 - level) / max(len(refs), 1)
    env = {f"{AGG_PREFIX}{i}": tuple(np.asarray(x, dtype=float) for x in aggregate_ci(plan.aggregates[i], lv))
           for i in refs}
    ev = _Eval(env, n)  # type: ignore[arg-type]
    try:
        lo, hi = ev.ev(template)
    except _NoRule as e:
        return ColumnCI(nan, nan.copy(), [str(e)])
    bad = ev.bad | np.isnan(lo) | np.isnan(hi)
    return ColumnCI(np.where(bad, np.nan, lo), np.where(bad, np.nan, hi), ev.notes)


# -- quantiles ---------------------------------------------------------------------------------

def _counts_histogram_rows(count: AggCall, quantile: AggCall, plan: Plan) -> bool:
    """Whether COUNT ``count`` counts exactly the rows of ``quantile``'s histogram in every group:
    the histogram keeps the same bounded rows as COUNT(*) (a unit's first min(C, M) rows, or its
    M = 1 row when COUNT(*) is the distinct-unit count) minus those with a NULL or NaN value or
    failing the -If condition, so they agree when neither has a condition and the quantile's
    argument is a bare non-Nullable integer or Decimal column (never NULL, never NaN)."""
    if count.func != "count" or count.cond is not None or quantile.cond is not None:
        return False
    arg = quantile.arg
    while isinstance(arg, exp.Paren):
        arg = arg.this
    if not isinstance(arg, exp.Column):
        return False
    t = plan.entry.columns.get(arg.name, "")
    if is_nullable(t) or not (is_integer_type(t) or base_type(t).startswith("Decimal")):
        return False
    if count.arg is None:
        return True
    c = count.arg
    while isinstance(c, exp.Paren):
        c = c.this
    return isinstance(c, exp.Column) and c.name == arg.name


@dataclass
class QuantileCI:
    rank: float  # ±r rows, at the result's level
    level_lo: np.ndarray | None  # per row (one list per row for quantiles(...)): α − r'/n_lo
    level_hi: np.ndarray | None
    count_column: str | None  # the COUNT column used for n_lo


def quantile_ci(ap: AggregatePlan, plan: Plan, noisy: dict, level: float,
                outputs: dict[int, str]) -> QuantileCI:
    """The rank interval of a quantile aggregate and, where a COUNT of the same rows is released in
    the same query (``outputs``: aggregate index -> column name), the level interval."""
    q = plan.quantities[ap.roles["quantile"]]
    rank = q.rank_ci(level)
    for i, name in outputs.items():
        other = plan.aggregates[i]
        if not _counts_histogram_rows(other.call, ap.call, plan):
            continue
        qc = plan.quantities[other.roles["count"]]
        beta = 1.0 - level
        r2 = q.rank_ci(1.0 - beta / 2.0)
        n = np.asarray(noisy[qc.index], dtype=float)
        n_lo = n - qc.ci_halfwidth_units(1.0 - beta / 2.0) * qc.grid
        with np.errstate(divide="ignore", invalid="ignore"):
            w = np.where(n_lo > 0, r2 / np.where(n_lo > 0, n_lo, 1.0), np.inf)
        alphas = np.asarray(ap.call.levels, dtype=float)
        lo = np.clip(alphas[None, :] - w[:, None], 0.0, 1.0)
        hi = np.clip(alphas[None, :] + w[:, None], 0.0, 1.0)
        if ap.func == "quantile":
            lo, hi = lo[:, 0], hi[:, 0]
        return QuantileCI(rank, lo, hi, name)
    return QuantileCI(rank, None, None, None)
