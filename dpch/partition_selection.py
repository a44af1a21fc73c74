"""Private partition selection: the release rules for groups whose keys have no public domain
(docs/CONTROLLER.md, "Partition selection"). Standard library only: the UDF program
(``dpch-udf partition_select``) imports this module to build the same table as the planner.

Setting. A group's input is n, its number of distinct privacy units after contribution bounding
(each unit is in at most k groups). A neighbouring dataset changes the counts of at most c groups
by 1 each (c = k under add_remove, 2k under substitute); a group with n = 0 does not exist and can
never be output. Every rule here is a *product* mechanism: each group is decided (and its noisy
count drawn) independently, from its own n only.

**The optimal rule** (Desfontaines, Voss, Gipson & Mandayam, "Differentially private partition
selection", PoPETs 2022(1), Theorem 1; arXiv:2006.03684). For one group (c = 1), a mechanism that
releases a group of n units with probability π(n), π(0) = 0, is (ε, δ)-DP iff for all n ≥ 1
    π(n) ≤ e^ε π(n−1) + δ   and   1 − π(n−1) ≤ e^ε (1 − π(n)) + δ
(and the two mirrored inequalities, implied when π is non-decreasing), and the pointwise largest
such π is the recursion of Theorem 1:
    π(n) = min(e^ε π(n−1) + δ, 1 − e^(−ε) (1 − π(n−1) − δ), 1).
Its closed form: π(n) = δ (e^(nε) − 1)/(e^ε − 1) up to the first crossover n₁, then
1 − π(n) = e^(−ε)(1 − π(n−1) − δ), reaching 1 after finitely many steps N. For c > 1 each group
runs the rule at (ε₀, δ₀) = (ε/c, 1 − (1 − δ)^(1/c)); the c groups one unit moves compose to
(cε₀, 1 − (1 − δ₀)^c) = (ε, δ) (Kairouz, Oh & Viswanath 2015, Thm 3.3 with i = 0; as Google's
differential-privacy library does with its "adjusted" ε and δ).

Exact sampling (``optimal_table``). e^ε₀ is replaced by a rational lower bound r ≤ e^ε₀
(``exp_lower``) and δ₀ by D/2^127 ≤ δ₀(1 − 2^−30); the recursion is evaluated on the grid 2^−127
with every step rounded *down* (and never below the previous value), so the table A_n/2^127 is
non-decreasing and satisfies both inequalities above with (ln r, D/2^127), hence with (ε₀, δ₀)
(they are monotone in e^ε and δ) — it is a valid rule, at most 2^−30 relative δ and a 2^−80
relative e^ε below the optimum. The kernel draws U uniform in [0, 2^127) from the OS CSPRNG and
J = min{j ≥ 1 : U < A_j}, so P[J = j] = (A_j − A_(j−1))/2^127 exactly; it outputs
v = n − J + t, and the group is released iff v ≥ t, i.e. iff J ≤ n, i.e. iff U < A_n: probability
exactly A_n/2^127.

The released count. v is n plus the noise Z = t − J, whose law is the increments of π
(t = round(E[J]) centres it). Releasing v (not only the decision) is also (ε₀, δ₀)-DP: the
output for any n ≥ 0 (n = 0 included, where J ≤ 0 is impossible, so nothing is released) is a
post-processing of n + Z, and the hockey-stick divergence of n + Z against n + 1 + Z, in both
directions, is Σ_j max(0, d_j − e^ε₀ d_(j+1)) and Σ_j max(0, d_(j+1) − e^ε₀ d_j) with
d_j = A_j − A_(j−1); ``optimal_table`` computes both exactly in integers with r in place of e^ε₀
(which can only make them larger) and refuses the table unless both are ≤ δ₀. (For the exact π
both equal δ: the increments grow by e^ε, then shrink by e^−ε, with one change of direction.)
So COUNT(DISTINCT unit) of a released group can reuse v at no further cost.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction

#: The table's grid: probabilities are multiples of 2^-P_BITS (U is a P_BITS-bit integer).
P_BITS = 127
ONE = 1 << P_BITS
#: The rule is offered for δ₀ >= MIN_DELTA (the grid then resolves δ₀ to 2^-31 relative).
MIN_DELTA = 2.0 ** -96
#: Largest table (number of counts n with π(n) < 1) the kernel accepts.
MAX_TABLE = 1 << 20
#: e^ε₀ is bounded below with EXP_BITS fractional bits; ε₀ above MAX_EPSILON is lowered to it (a
#: smaller ε is a stronger guarantee; at ε₀ = 700 the table is already N = 2 or 3 long).
EXP_BITS = 96
MAX_EPSILON = 700.0
#: δ is lowered by this factor so that the rounding of the table never needs the last bit of δ.
DELTA_SLACK = Fraction((1 << 30) - 1, 1 << 30)

OPTIMAL_SOURCE = ("Desfontaines, Voss, Gipson & Mandayam, Differentially private partition selection, "
                  "PoPETs 2022(1), Theorem 1")


def exp_lower(x: Fraction, bits: int = EXP_BITS) -> Fraction:
    """A rational r <= e^x for x >= 0 (rigorous): the Taylor series of e^y at y = x/2^s <= 1/16
    truncated (all terms are positive, so the partial sum is below e^y), each term floored on the
    grid 2^-(bits+16) (a floored term is below the exact one, and so is every later term built from
    it), the sum floored to the grid 2^-bits, then squared s times with flooring (a lower bound
    squared is a lower bound of the square). Integer arithmetic only (the planner calls it once per
    (ε, δ) it plans for). Relative error below 2^(s+2-bits)."""
    if x < 0:
        raise ValueError("exp_lower needs x >= 0")
    x = Fraction(x)
    s = 0
    while x > Fraction(1 << s, 16):  # the least s with y = x/2^s <= 1/16
        s += 1
    p, q = x.numerator, x.denominator << s  # y = p/q
    extra = 16  # guard bits: the floored terms (at most ~40 of them) lose < 2^-(bits+10) in all
    g = 1 << bits
    term = total = g << extra
    j = 1
    while term:
        term = term * p // (q * j)
        total += term
        j += 1
    v = total >> extra
    for _ in range(s):
        v = v * v // g
    return Fraction(v, g)


@dataclass(frozen=True)
class OptimalTable:
    """The optimal rule at (epsilon, delta) for one group, as the kernel samples it (module
    docstring): ``cdf[j-1] = A_j`` for j = 1..N (``cdf[-1] = 2^127``), ``offset`` = t."""

    epsilon: float
    delta: float
    r: Fraction  # <= e^epsilon
    delta_grid: int  # D: the δ used, D / 2^127 <= delta
    cdf: tuple[int, ...]
    offset: int

    @property
    def size(self) -> int:
        return len(self.cdf)

    def release_probability(self, n: int) -> Fraction:
        """P[the group is released | n distinct units] = A_n / 2^127 (exact; 1 for n >= N)."""
        if n <= 0:
            return Fraction(0)
        if n >= len(self.cdf):
            return Fraction(1)
        return Fraction(self.cdf[n - 1], ONE)

    def _increments(self) -> list[int]:
        """d_j = A_j - A_(j-1), j = 1..N (P[J = j] = d_j / 2^127)."""
        return [self.cdf[0]] + [self.cdf[i] - self.cdf[i - 1] for i in range(1, len(self.cdf))]

    def noise_pmf(self) -> dict[int, Fraction]:
        """The law of the released count's noise Z = t - J (v = n + Z): {z: P[Z = z]}."""
        return {self.offset - j: Fraction(dj, ONE) for j, dj in enumerate(self._increments(), start=1) if dj}

    def noise_variance(self) -> float:
        d = self._increments()
        s1 = sum(j * dj for j, dj in enumerate(d, start=1))
        s2 = sum(j * j * dj for j, dj in enumerate(d, start=1))
        return float(Fraction(s2 * ONE - s1 * s1, ONE * ONE))

    def noise_halfwidth(self, level: float) -> int:
        """The least h with P[|Z| <= h] >= level (the released count is within ±h of n with at
        least that probability)."""
        w = {self.offset - j: dj for j, dj in enumerate(self._increments(), start=1)}
        target = Fraction(level)
        mass, h = w.get(0, 0), 0
        while mass * target.denominator < target.numerator * ONE:
            h += 1
            mass += w.get(h, 0) + w.get(-h, 0)
        return h

    def expected_misses(self) -> float:
        """Σ_{n≥1} (1 − π(n)): how many units a group 'loses' to selection on average (the
        data-independent score by which the planner compares rules)."""
        return float(sum(ONE - a for a in self.cdf)) / ONE


def _check(epsilon: float, delta: float) -> None:
    if not (isinstance(epsilon, float) and math.isfinite(epsilon) and epsilon > 0):
        raise ValueError("epsilon must be a finite number > 0")
    if not (isinstance(delta, float) and math.isfinite(delta) and 0 < delta < 1):
        raise ValueError("delta must be a number in (0, 1)")
    if delta < MIN_DELTA:
        raise ValueError("delta must be at least 2^-96 for the optimal selection rule")


@functools.lru_cache(maxsize=256)
def optimal_table(epsilon: float, delta: float) -> OptimalTable:
    """The table of the optimal rule at (ε₀, δ₀) = (epsilon, delta) (module docstring). Raises
    ValueError (naming the parameter) when the rule cannot be offered: ε not finite > 0, δ not in
    [2^-96, 1), more than MAX_TABLE counts below certain release, or (never observed) a table
    whose released count would not be (ε, δ)-DP."""
    epsilon, delta = float(epsilon), float(delta)
    _check(epsilon, delta)
    r = exp_lower(Fraction(min(epsilon, MAX_EPSILON)))
    rn, g = r.numerator, r.denominator  # g is a power of two
    d_grid = Fraction(delta) * DELTA_SLACK * ONE
    D = d_grid.numerator // d_grid.denominator
    cdf: list[int] = []
    a = 0
    while a < ONE:
        t1 = rn * a // g + D  # floor(r·a + D): D is an integer
        x = ONE - a - D
        t2 = ONE if x <= 0 else ONE - (-((-g * x) // rn))  # floor(ONE - x/r) = ONE - ceil(g·x/rn)
        a = max(a, min(t1, t2, ONE))
        cdf.append(a)
        if len(cdf) > MAX_TABLE:
            raise ValueError("epsilon and delta are too small for the optimal selection rule "
                             f"(more than {MAX_TABLE} counts below certain release)")
    # The released count n + Z must be (ε, δ)-DP too: exact hockey-stick divergences (module docstring).
    d = [0] + [cdf[0]] + [cdf[i] - cdf[i - 1] for i in range(1, len(cdf))] + [0]
    div_a = sum(max(0, g * d[j] - rn * d[j + 1]) for j in range(len(d) - 1))
    div_b = sum(max(0, g * d[j + 1] - rn * d[j]) for j in range(len(d) - 1))
    dn, dd = Fraction(delta).numerator, Fraction(delta).denominator
    if max(div_a, div_b) * dd > dn * ONE * g:
        raise ValueError("the optimal selection rule's released count would exceed delta")  # pragma: no cover
    mean_j2 = sum(j * dj for j, dj in enumerate(d[1:-1], start=1))  # Σ j·d_j = E[J]·2^127
    offset = (2 * mean_j2 + ONE) // (2 * ONE)
    return OptimalTable(epsilon=epsilon, delta=delta, r=r, delta_grid=D, cdf=tuple(cdf), offset=int(offset))


def per_group_epsilon(epsilon: float, coords: int) -> float:
    """The largest float ε₀ with coords·ε₀ <= ε (exactly)."""
    e = epsilon / coords
    while Fraction(e) * coords > Fraction(epsilon):
        e = math.nextafter(e, 0.0)
    return e


def per_group_delta(delta: float, coords: int) -> float:
    """A float δ₀ with 1 − (1 − δ₀)^coords <= δ (checked exactly; Kairouz, Oh & Viswanath 2015,
    Thm 3.3 with i = 0 gives (coords·ε₀, 1 − (1 − δ₀)^coords) for coords (ε₀, δ₀)-DP parts). For
    coords > 64 the union bound coords·δ₀ <= δ (Bernoulli's inequality) is used instead."""
    if coords == 1:
        return delta
    target = Fraction(delta)
    if coords <= 64:
        d0 = -math.expm1(math.log1p(-delta) / coords)
        for _ in range(64):
            if 1 - (1 - Fraction(d0)) ** coords <= target:
                return d0
            d0 = math.nextafter(d0, 0.0)
    d0 = delta / coords
    while Fraction(d0) * coords > target:
        d0 = math.nextafter(d0, 0.0)
    return d0
