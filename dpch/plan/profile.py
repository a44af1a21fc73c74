"""Contribution bounds chosen from the data, privately, and the bias of bounding made visible
(issue 29; docs/CONTROLLER.md, "Bounds from the data" and "Bias of bounding").

Two releases about the units of the query's relation (after its WHERE), both by the (discrete)
Laplace mechanism inside ClickHouse (dpch.rewrite.profile builds the SQL, dpch.unit_profile runs it):

- **The auto-bounds histograms** (``max_rows_per_unit="auto"``, ``max_groups_contributed="auto"``):
  for each unit u its number of rows c_u (and of distinct groups g_u), bucketed on the public
  √2-grid ``GRID`` (1, 2, 3, 4, 6, 8, 11, 16, 23, 32, ...; 32 buckets, the last one open); one count
  of units per bucket, every bucket released (empty ones too). One unit is in one bucket of each
  histogram: L1 sensitivity 1 per histogram under add/remove, 2 under substitution (it may move
  between buckets). Each histogram is released at ε_auto / (number of histograms): ε_auto-DP in
  all (basic composition, Dwork & Roth Thm 3.16). Everything chosen from them is post-processing.
- **The bias counts** (``bias_share``): three counts of units, with the query's final bounds: all
  units, units whose rows bounding cut (c_u > M, g_u > k, or more than C rows in a group), units
  with a value outside its column's declared bounds. One unit changes each count by at most 1:
  L1 sensitivity 3 (also under substitution, where the count of all units does not move), released
  at ε_bias.

The charge is one: the query's plan at (1 - auto_share - bias_share)·ε plus these releases, which
sum to the requested ε (δ goes to the plan unchanged).

How a bound is chosen (post-processing of the histogram; utility only, never privacy): with T(x) the
number of units with more than x rows, rows bounding drops Σ_u (c_u - M)+ = ∫_M^∞ T(x) dx, while the
noise of every released count grows linearly in M. The choice minimises the estimated
``bias(M) + G·noise(M)`` over the grid (G: the released groups per quantity when the keys are public,
else 1), the rule of PipelineDP's parameter tuning and of Amin et al., "Bounding user contributions"
(ICML 2019): the optimum is where the tail count T(M) equals the noise's growth rate. T is estimated
from the noisy histogram where it stands above its own noise (two standard deviations), and above
that by a power law fitted to the last two such points (heavy tails extrapolate slowly, so the bound
errs on the side of less bias).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

#: the bucket edges: round(√2^i), i = 0..32, de-duplicated; bucket i is [GRID[i], GRID[i+1]), the
#: last one [65536, ∞)
GRID: tuple[int, ...] = tuple(sorted({round(2 ** (i / 2)) for i in range(33)}))
#: candidate bounds for k and M (a bound above 65536 rows per unit is never chosen)
CANDIDATES = GRID
#: default shares of ε (options auto_share and bias_share)
DEFAULT_AUTO_SHARE = 0.1
DEFAULT_BIAS_SHARE = 0.05
#: a bias share above this raises a warning (Python warning, CLI line, gateway header)
WARN_SHARE = 0.05
#: a unit share warns only when it exceeds WARN_SHARE by this many noise sd
WARN_Z = 4.0
#: the counts of the bias step, in release order
BIAS_COUNTS = ("units", "cut", "clipped")
#: a tail count that stops falling below this share of the units ends the trusted points
PLATEAU_SHARE = 0.5
#: a noisy tail count is trusted where it exceeds this many of its standard deviations
TRUST_Z = 2.0
#: a value histogram's side (positive or negative values) is used only when its raw noisy total
#: stands this many sd above 0: a side of pure noise passes with probability 6.0e-7 (the exact tail
#: of a sum of 82 Laplace draws, by Gil-Pelaez inversion; N(0,1) gives 2.9e-7). At TRUST_Z a noise
#: side passed 3.8 % of the time and its bound, fitted to a random walk, reached 7e5 (x10^4 noise)
SIDE_Z = 5.0
#: the power law (a heavy tail: larger bounds) is preferred over the exponential only when it fits
#: the last trusted points (three or more, spanning 4x) this much better (residual sum of squares
#: ratio): noise alone must not turn a light tail heavy
POWER_EVIDENCE = 2.0
#: no bound is chosen above REACH times the first untrusted grid point: beyond it the tail is a model
REACH = 32.0


def bucket_of(x: int) -> int:
    """The 0-based bucket of a per-unit count x >= 1 (Python mirror of the SQL in dpch.rewrite.profile)."""
    return sum(1 for e in GRID if e <= x) - 1


#: the value grid of bounds="auto" (magnitudes): 0, then 2^(j/2) for j = -20..60 (2^-10 .. 2^30);
#: bucket i is [VALUE_EDGES[i], VALUE_EDGES[i+1]), the last one open; positive and negative values
#: have a histogram each (of |x|)
VALUE_EDGES: tuple[float, ...] = (0.0,) + tuple(2.0 ** (j / 2) for j in range(-20, 61))


def value_bucket_of(x: float) -> int:
    """The 0-based VALUE_EDGES bucket of |x| (Python mirror of dpch.rewrite.profile's SQL)."""
    return sum(1 for e in VALUE_EDGES if e <= abs(x)) - 1


@dataclass(frozen=True)
class Histogram:
    """A released histogram: noisy (unit-weighted) counts per bucket of ``edges``, and the Laplace
    scale b of each count (public). ``offset``: 1 for integer counts (T_i counts units with more than
    edge - 1), 0 for real values (mass above the edge)."""

    counts: tuple[float, ...]
    scale: float
    edges: tuple[float, ...] = GRID
    offset: float = 1.0

    def tail(self) -> list[float]:
        """T_i, the number of units with at least edge_i (rows or groups), from the noisy counts:
        suffix sums, clamped at 0 and made non-increasing (the true T is). Post-processing."""
        out, run = [0.0] * len(self.counts), 0.0
        for i in range(len(self.counts) - 1, -1, -1):
            run += self.counts[i]
            out[i] = max(0.0, run)
        for i in range(len(out) - 2, -1, -1):
            out[i] = max(out[i], out[i + 1])
        return out

    def tail_sd(self, i: int) -> float:
        """The standard deviation of T_i's noise: a sum of len - i Laplace draws of variance 2b²."""
        return self.scale * math.sqrt(2.0 * (len(self.counts) - i))


def side_has_mass(h: Histogram) -> bool:
    """Whether a value histogram's side (post-processing) holds real mass: its raw noisy total stands
    SIDE_Z standard deviations above 0."""
    return sum(h.counts) > SIDE_Z * h.tail_sd(0)


@dataclass(frozen=True)
class TailModel:
    """T(x), the number of units with more than x rows (or groups), as estimated from a histogram:
    the trusted grid points, then a power law T(x) = t·(x/e)^-α from the last one."""

    points: tuple[tuple[float, float], ...]  # (x, #{c > x}) where trusted: x = edge_i - offset, T_i
    alpha: float  # the power law's exponent, or with ``scale`` the exponential's local exponent x/λ
    scale: float = 0.0  # λ > 0: beyond the last point T(x) = t·e^{-(x - e)/λ} (an exponential tail)
    floor: float = 1.0  # the smallest positive x the power law starts from (the last point may be x = 0)
    reach: float = math.inf  # REACH x the first untrusted point: no bound is chosen beyond the evidence

    def at(self, x: float) -> float:
        """T(x) by linear interpolation between trusted points, the power law beyond them."""
        pts = self.points
        if x <= pts[0][0]:
            return pts[0][1]
        for (e0, t0), (e1, t1) in zip(pts, pts[1:]):
            if x <= e1:
                return t0 + (t1 - t0) * (x - e0) / (e1 - e0)
        e, t = pts[-1]
        if self.scale > 0:
            return t * math.exp(-(x - e) / self.scale)
        e1 = max(e, self.floor)
        return t * (x / e1) ** (-self.alpha) if x > e1 else t

    def excess(self, m: float) -> float:
        """Σ_u (c_u - m)+ = ∫_m^∞ T(x) dx: what a bound m drops (trapezoids over the trusted points,
        the power law's closed form beyond the last one)."""
        pts = self.points
        total, lo = 0.0, m
        for (e0, _), (e1, _) in zip(pts, pts[1:]):
            if e1 <= lo:
                continue
            a = max(lo, e0)
            total += (e1 - a) * (self.at(a) + self.at(e1)) / 2.0
        e, t = pts[-1]
        a = max(lo, e)
        if self.scale > 0:
            return total + self.scale * t * math.exp(-(a - e) / self.scale)
        e1 = max(e, self.floor)
        if a < e1:  # flat from e to the floor (e = 0: the only point is the number of units)
            total, a = total + (e1 - a) * t, e1
        return total + t * e1 ** self.alpha * a ** (1.0 - self.alpha) / (self.alpha - 1.0)

    def total(self) -> float:
        """Σ_u c_u = ∫_0^∞ #{c > x} dx."""
        return self.excess(0.0)


def _fit(points: Sequence[tuple[float, float, float]], power: bool) -> tuple[float, float]:
    """(slope, weighted residual sum of squares) of log T against x (exponential tail) or log x (power
    law), weighted least squares over ``points`` (x, T, sd of T): log T's variance is about (sd/T)²."""
    xs = [math.log(e) if power else float(e) for e, _, _ in points]
    ys = [math.log(t) for _, t, _ in points]
    ws = [(t / sd) ** 2 if sd > 0 else 1e12 for _, t, sd in points]
    sw = sum(ws)
    mx, my = sum(w * x for w, x in zip(ws, xs)) / sw, sum(w * y for w, y in zip(ws, ys)) / sw
    sxx = sum(w * (x - mx) ** 2 for w, x in zip(ws, xs))
    slope = sum(w * (x - mx) * (y - my) for w, x, y in zip(ws, xs, ys)) / sxx
    rss = sum(w * (y - my - slope * (x - mx)) ** 2 for w, x, y in zip(ws, xs, ys))
    return slope, rss


def tail_model(h: Histogram) -> TailModel:
    """The tail estimate of a released histogram (post-processing): the grid points whose T_i stands
    TRUST_Z standard deviations above 0 (always the first: the number of units), then beyond the last
    one a tail law fitted to the last (up to four) of them in log space, weighted by their noise: a
    power law (T ∝ x^{-α}, α >= 1.5) only when it fits clearly better over three points spanning 4x
    (POWER_EVIDENCE), else the exponential (T ∝ e^{-x/λ}); in either case it decays at least as fast
    as the first untrusted point allows (T there is below TRUST_Z standard deviations)."""
    tail = h.tail()
    # integer counts: #{c > x} at x = edge_i - 1 is #{c >= edge_i} = T_i (offset 1); values: offset 0
    xs = [e - h.offset for e in h.edges]
    pts, last, sds = [(xs[0], max(tail[0], 1.0))], 0, {xs[0]: h.tail_sd(0)}
    for i in range(1, len(tail)):
        if tail[i] <= TRUST_Z * h.tail_sd(i):
            break
        if tail[i] >= pts[-1][1] and pts[-1][1] < PLATEAU_SHARE * pts[0][1]:
            # a flat stretch in the tail is the noise's random walk (summed from the empty top), not
            # units: real tails fall. Only the bulk may be flat (every unit has that many rows).
            break
        last = i
        sds[xs[i]] = h.tail_sd(i)
        if tail[i] < pts[-1][1]:
            pts.append((xs[i], tail[i]))
        else:  # a plateau of the bulk: T is flat up to here (extend the last point)
            pts[-1] = (xs[i], pts[-1][1]) if len(pts) > 1 else pts[-1]
    if len(pts) == 1 and last > 0:
        pts.append((xs[last], pts[0][1] * (1 - 1e-9)))
    # with no evidence of a heavy tail, a light one: α = 3 (finite variance), or the exponential
    alpha, lam = 3.0, 0.0
    if len(pts) >= 2:
        fit = [(x, t, sds.get(x, 0.0)) for x, t in pts[-5:] if x > 0]
        exp_slope, exp_rss = _fit(fit, power=False) if len(fit) >= 2 else (0.0, 0.0)
        pow_slope, pow_rss = _fit(fit, power=True) if len(fit) >= 2 else (0.0, 0.0)
        heavy = (len(fit) >= 3 and fit[-1][0] >= 3 * fit[0][0] and pow_slope < 0
                 and POWER_EVIDENCE * pow_rss < exp_rss)
        if heavy:  # the power law fits clearly better over a span of 4x or more
            alpha = -pow_slope
        elif exp_slope < 0:
            lam = -1.0 / exp_slope
    # the first untrusted point bounds the tail: T there is at most TRUST_Z sd (else it were trusted)
    if last + 1 < len(tail):
        e, t = pts[-1]
        x = xs[last + 1]
        upper = max(tail[last + 1], 0.0) + TRUST_Z * h.tail_sd(last + 1)
        if upper < t and x > e:
            if lam > 0:
                lam = min(lam, (x - e) / math.log(t / upper))
            elif e > 0:
                alpha = max(alpha, math.log(t / upper) / math.log(x / e))
            if len(pts) < 3 or upper < 1.0:
                # too few points to trust a law between e and x (a plateau, or a sharp edge): the
                # tail falls linearly to the bound at x, then follows the law from there
                pts.append((x, max(upper, 1e-9)))
    reach = REACH * max(xs[min(last + 1, len(xs) - 1)], min(x for x in xs if x > 0))
    return TailModel(tuple(pts), max(1.5, alpha), lam, floor=min(x for x in xs if x > 0), reach=reach)


@dataclass(frozen=True)
class BoundChoice:
    """One chosen bound and why (shown by explain and in the answer's attrs)."""

    name: str  # "max_rows_per_unit" | "max_groups_contributed" | "bounds[<column>]"
    value: int | tuple[float, float]
    estimated_bias: float  # rows it drops (estimate)
    estimated_noise: float  # G·sd of the released values at this bound, in rows
    rule: str

    def to_dict(self) -> dict:
        value = list(self.value) if isinstance(self.value, tuple) else self.value
        return {"name": self.name, "value": value, "estimated_bias": self.estimated_bias,
                "estimated_noise": self.estimated_noise, "rule": self.rule}


def choose(name: str, model: TailModel, noise_at: Callable[[float], float], *, rows_per_step: float = 1.0,
           cap: float = 1_000_000, candidates: Sequence[float] = CANDIDATES) -> BoundChoice:
    """The candidate bound b (<= cap) minimising rows_per_step·excess(b) + noise_at(b)
    (post-processing of the released histogram). ``rows_per_step``: the rows one step above the
    bound stands for (1 for rows per unit; the mean rows per group for groups per unit; the kept rows
    per unit for a column's clipping bound, whose histogram is unit-weighted)."""
    best = None
    for b in candidates:
        if b > min(cap, model.reach) and best is not None:
            break
        bias = rows_per_step * model.excess(b)
        noise = noise_at(b)
        if best is None or bias + noise < best[1] + best[2]:
            best = (b, bias, noise)
    assert best is not None
    b, bias, noise = best
    return BoundChoice(name, b, bias, noise,
                       "argmin over the √2-grid of estimated rows dropped + G·noise sd (rows)")


@dataclass(frozen=True)
class ProfileRequest:
    """What the auto-bounds step releases: histograms of rows and/or groups per unit, and of each
    ``values`` column's values (positive and negative side, unit-weighted), at ε in all."""

    rows: bool
    groups: bool
    epsilon: float
    neighbour: str
    values: tuple[str, ...] = ()

    @property
    def histograms(self) -> int:
        return int(self.rows) + int(self.groups) + len(self.values)

    @property
    def value_sensitivity(self) -> float:
        """L1 of one column's value histograms (both sides): a unit's row weights 1/c_u sum to 1 (2
        under substitution); 1e-9 more for the float sum of the weights (its rounding error is far
        below that)."""
        return self.sensitivity * (1.0 + 1e-9)

    @property
    def sensitivity(self) -> int:
        """L1 of one histogram: 1 (add/remove: one bucket ±1), 2 (substitute: a move)."""
        return 2 if self.neighbour == "substitute" else 1

    @property
    def epsilon_each(self) -> float:
        return self.epsilon / self.histograms


@dataclass(frozen=True)
class BiasEstimate:
    """The visible bias of an answer (df.attrs["bias"], gateway headers X-DPCH-Bias-*): shares are
    noisy (DP) estimates, None where not measured."""

    units_cut_share: float | None = None  # share of units whose rows bounding cut
    values_clipped_share: float | None = None  # share of units with a value outside its bounds
    rows_dropped_share: float | None = None  # share of rows dropped (from the auto-bounds step)
    shares_sd: float | None = None  # the noise sd of the two unit shares (noisy count sd / noisy units)
    epsilon: float = 0.0  # what measuring it cost (part of the query's charge)
    source: str = ""
    choices: tuple[BoundChoice, ...] = field(default_factory=tuple)

    def _above(self, share: float | None) -> bool:
        """A unit share above WARN_SHARE by more than WARN_Z noise sd: a ratio of two noisy counts,
        sd ≈ count sd·√(1 + share²)/units (delta method); at WARN_Z = 4 a share that is really 0
        warns with probability below 0.2 % (Laplace tail ½·e^{-4√2})."""
        if share is None:
            return False
        sd = (self.shares_sd or 0.0) * math.sqrt(1.0 + share * share)
        return share - WARN_Z * sd > WARN_SHARE

    @property
    def warnings(self) -> list[str]:
        """The measured shares above WARN_SHARE, as sentences (no data value: shares of noisy counts)."""
        out = []
        if self.rows_dropped_share is not None and self.rows_dropped_share > WARN_SHARE:
            out.append(f"contribution bounding dropped about {self.rows_dropped_share:.0%} of the rows: "
                       "counts and sums are biased low (raise the bounds, or use 'auto')")
        if self._above(self.units_cut_share):
            out.append(f"contribution bounding cut the rows of about {self.units_cut_share:.0%} of the units: "
                       "counts and sums may be biased low (see db.tune or bounds 'auto')")
        if self._above(self.values_clipped_share):
            out.append(f"about {self.values_clipped_share:.0%} of the units have values outside the declared "
                       "bounds, which were clipped: sums and means are biased towards the bounds")
        return out

    def to_dict(self) -> dict:
        return {"units_cut_share": self.units_cut_share, "values_clipped_share": self.values_clipped_share,
                "rows_dropped_share": self.rows_dropped_share, "shares_sd": self.shares_sd, "epsilon": self.epsilon, "source": self.source,
                "choices": [c.to_dict() for c in self.choices], "warnings": self.warnings,
                "note": "confidence intervals cover the noise only, not this bias"}


def shares_from_counts(counts: Sequence[float], count_sd: float) -> tuple[float | None, float | None, float | None]:
    """(units cut share, values clipped share, their noise sd) from the released counts (units, cut,
    clipped) and the sd of one count's noise: ratios of noisy counts clamped to [0, 1]; None when
    the noisy unit count is below 1."""
    units, cut, clipped = (float(c) for c in counts)
    if units < 1.0:
        return None, None, None
    return min(1.0, max(0.0, cut / units)), min(1.0, max(0.0, clipped / units)), count_sd / units


def check_share(value, name: str) -> float:
    """A share of ε: a real in [0, 0.5]."""
    from ..errors import InvalidParameter

    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0.0 <= float(value) <= 0.5):
        raise InvalidParameter(f"{name} must be a number in [0, 0.5] (a share of the query's epsilon)")
    return float(value)
