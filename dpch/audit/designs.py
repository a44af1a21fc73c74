"""Neighbouring datasets on which the quantile functions' privacy loss is nearly ε.

`dp_quantile`, `dp_median` and `dp_quantiles` (dpch.mechanisms.QuantileMechanism) cut [lo, hi] into
2^16 buckets and choose one by permute-and-flip (McKenna & Sheldon 2020) at temperature 2Δ/ε, with
the score of a bucket b for the level a/Q

    u(b) = −|(Q − a)·L(b) − a·G(b)|,   L, G = rows in the buckets below / above b,

of sensitivity Δ = max(a, Q − a). Measured in units of Δ, removing one row on the side of the larger
weight moves the score of every bucket by exactly one unit (the side of the smaller weight moves it
by min(a, Q − a)/Δ only): up for the buckets on one side of the level, down on the other. A random
dataset wastes most of that: its mass sits in a few buckets around the true quantile that all move
the same way. The dataset built here makes the two moves face each other:

    wall X (many rows) | E: m empty buckets | Y: 1 row | wall Z (many rows, the removed row r)

(for a level above 1/2; mirrored below it, with r at the bottom). The walls' sizes balance the level
exactly at Y, so Y's score is the best and E's is one unit lower; removing r raises E by one unit
and lowers Y by one: on D′, E is the best and Y one unit lower. Every other bucket is at least
`wall` units below the best (its chance to be chosen is below 2^16·e^(−wall·ε/2)), so the mechanism
is effectively permute-and-flip over 1 + m candidates. With g = e^(−ε/2), Y is chosen with
probability ∫₀¹ (1 − g·t)^m dt on D and g/(m + 1) on D′; their ratio tends to e^ε as m grows, and
m ≈ 2e^(ε/2) (the default) keeps both probabilities large enough to certify with 10⁴ samples:
ln(P_D(Y)/P_D′(Y)) = 0.47, 0.98, 1.91 at ε = 0.5, 1, 2 (m = 3, 3, 5), with P_D(Y) ≈ 0.3–0.55.

Two distinct levels a₁ < a₂ (`dp_quantiles`) are released independently, each over the whole grid
with all the rows at ε/2, and sorted. Both releases see r, so the design puts one gadget per level
in a row, r in the outer wall on the side where both levels weigh a row fully (below for levels up
to 1/2, mirrored for levels from 1/2 on):

    wall Z (r) | Y₁ | E₁ | wall W | Y₂ | E₂ | wall X

The walls balance a₁ at Y₁ ((Q − a₁)·z = a₁·(w + 1 + x)) and a₂ at Y₂ ((Q − a₂)·(z + 1 + w) = a₂·x),
i.e. z = a₁(w + 1)/(a₂ − a₁) and x = (Q − a₂)(z + 1 + w)/a₂; removing r moves both levels' Y down
and E up by one unit, so the event "both levels at their Y" has the loss of two single-level
designs at ε/2, near ε. W is a light-side step for a₁ (one of its rows weighs a₁ < Q − a₁), so
w ≥ wall·(Q − a₁)/a₁ keeps W's bucket `wall` units below a₁'s best. The joint event has less mass
than a single level's, so fewer E buckets certify more: m = round(e^(ε/2)) (at most 4), the
optimum at 10⁴ held-out samples for ε up to 4. Levels on both sides of 1/2 (e.g. [0.25, 0.75]):
no row weighs fully for both, and one removed row moves the other level by min(a, Q − a)/Δ of a
unit only; the design then has the gadget for a₁ only (a₂ balanced at a lone Y₂, not in the
event) and reaches ε/2.

Three or more levels are released by the recursion of Kaplan, Schnapp & Stemmer: the middle level
at ε/depth over the whole grid, then the levels below it over the buckets up to the chosen one
with the rows below it (and those above likewise). The design nests: the level's sub-problem on
r's side gets its own gadget inside the wall that holds r, so r moves one unit at every depth of
that chain, and the joint event "every chain level at its Y" has a privacy loss near
depth·(ε/depth) = ε. The joint events of several levels are events on the joint output, which
the learned distinguishers find (the threshold search sees one coordinate).

Levels 0 and 1 (MIN/MAX) are not supported: their scores have no wall on one side.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

BUCKETS = 1 << 16  # dpch.mechanisms.QUANTILE_BUCKETS (the SQL functions' grid)
SCALE = 1 << 20    # dpch.mechanisms.QUANTILE_SCALE (levels are multiples of 2^-20)


def _level(q: float) -> int:
    v = float(q)
    if not 0.0 < v < 1.0:
        raise ValueError("quantile designs need levels strictly between 0 and 1 (MIN/MAX have no wall)")
    return round(v * SCALE)


def _relative(level: int, end_lo: int, end_hi: int) -> int:
    """The level of a sub-problem relative to its ends, rounded as the kernel does."""
    width = end_hi - end_lo
    return (2 * (level - end_lo) * SCALE + width) // (2 * width)


def default_improving(stage_epsilon: float) -> int:
    """m ≈ 2·e^(ε/2): the number of E buckets that maximises the certified bound at 10⁴ held-out
    samples (computed exactly from the formulas in the module docstring)."""
    return max(1, round(2.0 * math.exp(stage_epsilon / 2.0)))


def default_improving_pair(stage_epsilon: float) -> int:
    """m for the two-level design, whose event is the product of two stages' (module docstring):
    round(e^ε_stage), at most 4 (so the design fits QuantileMechanism's exact evaluation); the
    exact optimum at 10⁴ held-out samples (confidence 0.95) for ε = 2·ε_stage from 0.25 to 4."""
    return min(4, max(1, round(math.exp(stage_epsilon))))


def default_wall(stage_epsilon: float) -> int:
    """Rows of the smallest wall: every bucket outside Y ∪ E is then at least this many units below
    the best, so together they are chosen with probability below 2^16·e^(−wall·ε/2) < 1e-12."""
    return max(8, math.ceil(2.0 * (math.log(BUCKETS) + 28.0) / stage_epsilon))


@dataclass(frozen=True)
class Stage:
    """One level of the design's event (a depth of the chain, or one of two independent levels):
    the level (as given), Y's and E's buckets (grid indices)."""

    level: float
    favoured: int                 # Y: the best bucket on D
    improving: tuple[int, ...]    # E: the best buckets on D′


@dataclass(frozen=True)
class QuantileDesign:
    """D (the rows of `counts`) and D′ (D without the row `removed_value`) for the quantile
    functions at `levels` over [lo, hi] at ε = `epsilon`."""

    levels: tuple[float, ...]
    lo: float
    hi: float
    epsilon: float
    counts: tuple[tuple[int, int], ...]  # (grid bucket, rows), ascending
    removed_bucket: int
    removed_side: str                    # "largest", "smallest" or "inner": r's place in the data
    stages: tuple[Stage, ...]            # the levels of the event (a chain: from the first depth down)

    # -- values ------------------------------------------------------------------------------
    def value(self, bucket: float) -> float:
        return self.lo + bucket * ((self.hi - self.lo) / BUCKETS)

    @property
    def removed_value(self) -> float:
        """r's value: inside its bucket but apart from the bucket's other rows (at its midpoint),
        so that `where` selects it alone and it is the unique largest (smallest) row of D when it
        sits in the top (bottom) wall."""
        return self.value(self.removed_bucket + (0.25 if self.removed_side == "smallest" else 0.75))

    def values(self) -> list[float]:
        out = []
        for bucket, rows in self.counts:
            n = rows - (bucket == self.removed_bucket)
            out += [self.value(bucket + 0.5)] * n
        out.append(self.removed_value)
        return sorted(out)

    @property
    def rows(self) -> int:
        return sum(c for _, c in self.counts)

    def midpoint(self, bucket: int) -> float:
        """The value the SQL functions release for a bucket (dpch_quantile_value)."""
        return min(max(self.lo + (bucket + 0.5) * ((self.hi - self.lo) / BUCKETS), self.lo), self.hi)

    def where(self, column: str = "x") -> str:
        """A SQL predicate selecting r (for `audit(..., where=...)` / `--where`)."""
        return f"{column} = {self.removed_value!r}"

    def create_table(self, conn, table: str, column: str = "x") -> None:
        """(Re)create `table` with one Float64 column holding D."""
        conn.command(f"DROP TABLE IF EXISTS {table}")
        conn.command(f"CREATE TABLE {table} ({column} Float64) ENGINE = MergeTree ORDER BY tuple()")
        rows = ", ".join(f"({v!r})" for v in self.values())
        conn.command(f"INSERT INTO {table} VALUES {rows}")

    def frame(self, column: str = "x"):
        import pandas as pd

        return pd.DataFrame({column: self.values()})

    # -- exact evaluation --------------------------------------------------------------------
    def event_probabilities(self) -> tuple[float, float]:
        """(P_D, P_D′) of the design event "every stage's level released at its Y", exactly, from
        dpch.mechanisms.QuantileMechanism on the design's buckets alone (a grid of at most 16
        buckets: the buckets left out are chosen with probability < 1e-12 on either side).
        Raises ValueError when the design needs more than 16 buckets."""
        from ..mechanisms import QuantileMechanism

        first, last = self.counts[0][0] - 1, self.counts[-1][0] + 1
        if last - first + 1 > 16:
            raise ValueError("the exact evaluation handles designs of at most 14 buckets")
        dense = [0] * (last - first + 1)
        for bucket, rows in self.counts:
            dense[bucket - first] = rows
        dense_p = list(dense)
        dense_p[self.removed_bucket - first] -= 1
        mech = QuantileMechanism(self.epsilon)
        order = list(self.levels)
        idx = [order.index(s.level) for s in self.stages]
        want = [s.favoured - first for s in self.stages]
        out = []
        for counts in (dense, dense_p):
            probs = mech.probabilities(counts, order)
            out.append(sum(p for key, p in probs.items() if [key[i] for i in idx] == want))
        return out[0], out[1]

    def describe(self) -> str:
        parts = []
        for s in self.stages:
            parts.append(f"level {s.level:g}: Y = bucket {s.favoured}, E = {len(s.improving)} buckets")
        return (f"{self.rows} rows in {len(self.counts)} buckets of the 2^16 grid of [{self.lo:g}, "
                f"{self.hi:g}]; D′ removes the {self.removed_side} row; " + "; ".join(parts))


def quantile_design(levels, lo: float, hi: float, epsilon: float, *, improving: int | None = None,
                    wall: int | None = None, centre: int = BUCKETS // 2) -> QuantileDesign:
    """The design of the module docstring for `dp_quantiles(x, levels, lo, hi, epsilon)` (a single
    level for dp_quantile, 0.5 for dp_median). `improving` is m (default `default_improving` at ε
    per depth), `wall` the smallest wall (default `default_wall`), `centre` the grid bucket the
    block is placed around. Extreme levels need large walls (level 0.99 at ε = 0.5: 99 × 157 rows
    on one side): pass `max_rows` ≥ `design.rows` to `audit`, which otherwise samples a table of
    more than 10 000 rows down and breaks the design."""
    if isinstance(levels, (int, float)):
        levels = [levels]
    levels = tuple(float(q) for q in levels)
    if not levels:
        raise ValueError("at least one level")
    if not (math.isfinite(lo) and math.isfinite(hi) and hi > lo):
        raise ValueError("need finite lo < hi")
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError("epsilon must be positive and finite")
    ints = [_level(q) for q in levels]
    uniq = sorted(set(ints))
    depth = len(uniq).bit_length()
    stage_eps = epsilon / depth
    level_of = {a: q for q, a in zip(levels, ints)}
    if len(uniq) == 2:
        both = uniq[1] <= SCALE // 2 or uniq[0] >= SCALE // 2  # a removed row weighs fully for both
        default = default_improving_pair if both else default_improving
        m = improving if improving is not None else default(stage_eps)
        k = wall if wall is not None else default_wall(stage_eps)
        if m < 1 or k < 1:
            raise ValueError("improving and wall must be positive")
        block, r, stages = _pair_block(uniq[0], uniq[1], m, k)
        stages = [(level_of[a], y, ee) for a, y, ee in stages]
        return _placed(levels, lo, hi, epsilon, block, r, stages, centre)
    m = improving if improving is not None else default_improving(stage_eps)
    k = wall if wall is not None else default_wall(stage_eps)
    if m < 1 or k < 1:
        raise ValueError("improving and wall must be positive")

    def build(lo_i: int, hi_i: int, end_lo: int, end_hi: int, leaf: int):
        """(counts bottom→top, index of r, stages with block-relative indices)."""
        if lo_i >= hi_i:
            return [leaf], 0, []
        j = (lo_i + hi_i) // 2
        a = _relative(uniq[j], end_lo, end_hi)
        if a <= SCALE - a:  # the weight of L is the larger: r below, in the left sub-problem
            inner, r, stages = build(lo_i, j, end_lo, uniq[j], leaf)
            z = sum(inner)
            n_x = max(k, round(z * (SCALE - a) / a))
            y = len(inner)
            block = inner + [1] + [0] * m + [n_x]
            stage = (level_of[uniq[j]], y, tuple(range(y + 1, y + 1 + m)))
            return block, r, [stage] + stages
        inner, r, stages = build(j + 1, hi_i, uniq[j], end_hi, leaf)
        z = sum(inner)
        n_x = max(k, round(z * a / (SCALE - a)))
        shift = 1 + m + 1
        block = [n_x] + [0] * m + [1] + inner
        stage = (level_of[uniq[j]], 1 + m, tuple(range(1, 1 + m)))
        return block, r + shift, [stage] + [(lv, yy + shift, tuple(e + shift for e in ee))
                                             for lv, yy, ee in stages]

    # The walls' sizes are rounded to integers; choose the leaf wall (≥ k) that balances every
    # level best (an exact balance puts Y's score exactly one unit above E's).
    best = None
    for leaf in range(k, k + 64):
        block, r, stages = build(0, len(uniq), 0, SCALE, leaf)
        err = _stage_errors(block, r, stages, uniq)
        if best is None or err < best[0] - 1e-12:
            best = (err, block, r, stages)
        if err == 0:
            break
    _, block, r, stages = best
    return _placed(levels, lo, hi, epsilon, block, r, stages, centre)


def _placed(levels, lo, hi, epsilon, block, r, stages, centre) -> QuantileDesign:
    """The design with the block (counts bottom→top, r's index, stages with block indices) placed
    around the grid bucket `centre`."""
    start = max(1, min(BUCKETS - len(block) - 1, centre - len(block) // 2))
    counts = tuple((start + i, c) for i, c in enumerate(block) if c)
    side = "smallest" if r == 0 else ("largest" if r == len(block) - 1 else "inner")
    return QuantileDesign(levels, float(lo), float(hi), float(epsilon), counts, start + r, side,
                          tuple(Stage(lv, start + y, tuple(start + e for e in ee))
                                for lv, y, ee in stages))


def _signed(block, a: int, b: int) -> int:
    """(Q − a)·L − a·G of the block's bucket b (the kernel's signed score; non-decreasing in b)."""
    return (SCALE - a) * sum(block[:b]) - a * sum(block[b + 1:])


def _pair_block(a1: int, a2: int, m: int, k: int):
    """The two-level design of the module docstring for levels a1 < a2: (counts bottom→top,
    index of r, [(level, Y, E)] with block indices: both levels when a removed row weighs fully for
    both, else a1's alone). Walls balance each level at its Y as well as integers allow (the w in
    [w_min, w_min + 64) with the smallest total error), with every bucket outside a level's Y ∪ E
    at least k units below its best (checked on the block)."""
    if a1 >= SCALE // 2:  # both levels from 1/2 on: the mirror image of the levels 1 − a2 < 1 − a1
        block, r, stages = _pair_block(SCALE - a2, SCALE - a1, m, k)
        last = len(block) - 1
        return (block[::-1], last - r,
                [(SCALE - a, last - y, tuple(sorted(last - e for e in ee))) for a, y, ee in stages[::-1]])
    both = a2 <= SCALE // 2
    m2 = m if both else 0  # on both sides of 1/2: a2 only needs a lone Y₂ (not in the event)

    def layout(z: int, w: int, x: int):
        block = [z, 1] + [0] * m + [w, 1] + [0] * m2 + [x]
        y2 = m + 3
        stages = [(a1, 1, tuple(range(2, 2 + m))), (a2, y2, tuple(range(y2 + 1, y2 + 1 + m2)))]
        return block, stages

    def quality(block, stages) -> tuple[float, float]:
        """(Σ |score at Y| in units, the smallest gap in units of a bucket outside Y ∪ E)."""
        err, gap = 0.0, math.inf
        for a, y, ee in stages:
            unit = max(a, SCALE - a)
            scores = [-abs(_signed(block, a, b)) / unit for b in range(len(block))]
            err += -scores[y]
            best = max(scores)
            gap = min([gap] + [best - v for b, v in enumerate(scores) if b != y and b not in ee])
        return err, gap

    light = [(SCALE - a1) / a1]                      # W's bucket is a light step for a1
    if not both:
        light.append(a2 / (SCALE - a2))              # and for a2 above 1/2
    w_min = max(k, math.ceil(k * max(light)), math.ceil(k * (a2 - a1) / a1))  # z ≥ k
    best = None
    w = w_min
    while best is None or w < w_min + 64:
        z_exact = a1 * (w + 1) / (a2 - a1)
        for z in {math.floor(z_exact), math.ceil(z_exact)}:
            x_exact = (SCALE - a2) * (z + 1 + w) / a2
            for x in {math.floor(x_exact), math.ceil(x_exact)}:
                if min(z, x) < k:
                    continue
                block, stages = layout(z, w, x)
                err, gap = quality(block, stages)
                if gap >= k and (best is None or err < best[0] - 1e-12):
                    best = (err, block, stages)
        if best is not None and best[0] == 0:
            break
        w += 1
    _, block, stages = best
    return block, 0, stages if both else stages[:1]


def _stage_errors(block, r, stages, uniq) -> float:
    """How far Y's score is below the best on D, in units, summed over the chain (0 = exact
    balance). The first depth sees every row; each next one the rows on r's side of the previous
    depth's Y (its sub-problem when the previous level was released at Y)."""
    lo_b, hi_b = 0, len(block) - 1
    lo_i, hi_i, end_lo, end_hi = 0, len(uniq), 0, SCALE
    total = 0.0
    for _, y, _ in stages:
        j = (lo_i + hi_i) // 2
        a = _relative(uniq[j], end_lo, end_hi)
        below = sum(block[lo_b:y])
        above = sum(block[y + 1:hi_b + 1])
        total += abs((SCALE - a) * below - a * above) / max(a, SCALE - a)
        if r < y:
            hi_b = y - 1
            hi_i, end_hi = j, uniq[j]
        else:
            lo_b = y + 1
            lo_i, end_lo = j + 1, uniq[j]
    return total


# ------------------------------------------------------------------------------------------------
# Partition selection (docs/AUDIT.md §8)
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SelectionDesign:
    """D: one group of `units` privacy units (one row each) in a table (`unit` UInt64, `key`
    String); D′: D without the unit `removed_unit`, so the group's count of distinct units goes
    from n to n − 1 (from 1 to 0, the group then absent from D′, when n = 1). Audited through the
    controller: `SELECT key, COUNT(DISTINCT unit) AS n FROM t GROUP BY key` with δ > 0 and no
    public key domain, so its whole (ε, δ) is the partition selection's, whose noisy count the
    COUNT(DISTINCT) reuses (docs/CONTROLLER.md, "Partition selection"); `rule` is the rule the
    planner uses for it (dpch.plan.selection.choose_selection at c = 1: k = 1, add_remove)."""

    selection: str          # auto | optimal | gaussian | laplace (the query's option)
    epsilon: float
    delta: float
    units: int
    rule: object            # dpch.plan.selection.SelectionRule
    unit: str = "user_id"
    key: str = "grp"

    @property
    def removed_unit(self) -> int:
        return self.units - 1  # units are 0 .. n − 1

    def where(self) -> str:
        """The SQL predicate selecting the removed unit (`audit(..., where=...)`)."""
        return f"{self.unit} = {self.removed_unit}"

    def sql(self, table: str) -> str:
        return f"SELECT {self.key}, COUNT(DISTINCT {self.unit}) AS n FROM {table} GROUP BY {self.key}"

    @property
    def options(self) -> dict:
        """The controller options of the audited query (`audit(..., options=...)`)."""
        return {"selection": self.selection}

    def create_table(self, conn, table: str, *, register: bool = True) -> None:
        """(Re)create `table` holding D and, with `register`, register it in the catalog (unit
        column, k = 1 group and 1 row per unit, add_remove)."""
        conn.command(f"DROP TABLE IF EXISTS {table}")
        conn.command(f"CREATE TABLE {table} ({self.unit} UInt64, {self.key} String) ENGINE = MergeTree "
                     f"ORDER BY {self.unit}")
        conn.command(f"INSERT INTO {table} SELECT number, 'g' FROM numbers({self.units})")
        if register:
            conn.catalog.register(table, privacy_unit=self.unit, max_groups_contributed=1,
                                  max_rows_per_unit=1)

    def release_probabilities(self) -> tuple[float, float]:
        """(P_D, P_D′) of the event "the group is released", from the rule's exact release
        probabilities (in floating point for the Gaussian)."""
        return self.rule.release_probability(self.units), self.rule.release_probability(self.units - 1)

    def event_loss(self) -> float:
        """The most an audit can certify from the release event with δ accounted for:
        max(ln((P_D − δ)/P_D′), ln((1 − P_D′ − δ)/(1 − P_D))) (its complement favours D′), 0 when
        neither is positive (a group of one unit: P_D ≤ δ, P_D′ = 0)."""
        p, q = self.release_probabilities()
        out = 0.0
        if q > 0 and p > self.delta:
            out = max(out, math.log((p - self.delta) / q))
        if p < 1 and 1 - q > self.delta:
            out = max(out, math.log((1 - q - self.delta) / (1 - p)))
        return out

    def describe(self) -> str:
        p, q = self.release_probabilities()
        return (f"one group of {self.units} units; D′ removes one; {self.rule.rule} rule (threshold "
                f"{self.rule.threshold}): released with probability {p:.4g} on D, {q:.4g} on D′")


def selection_units(rule, delta: float, samples: int = 10_000, alpha: float = 0.05 / 6) -> int:
    """The group size n whose release event (or its complement) certifies the most with `samples`
    held-out runs per side at level `alpha` (expected Clopper–Pearson bound, δ subtracted from the
    favoured side as `dpch audit` does), among n = 1 .. threshold + 60. For the optimal rule and
    the Laplace threshold that is n = T, where P_D/P_D′ = e^ε exactly up to δ; the Gaussian's best
    is a few σ below T (its release event is a tail event)."""
    from .stats import cp_lower, cp_upper

    best = (-math.inf, 1)
    for n in range(1, rule.threshold + 61):
        p, q = rule.release_probability(n), rule.release_probability(n - 1)
        score = -math.inf
        for fav, other in ((p, q), (1 - q, 1 - p)):
            lo = float(cp_lower(round(fav * samples), samples, alpha)) - delta
            hi = float(cp_upper(round(other * samples), samples, alpha))
            if lo > 0 and hi > 0:
                score = max(score, math.log(lo / hi))
        if score > best[0]:
            best = (score, n)
    return best[1]


def selection_design(selection: str, epsilon: float, delta: float, *, units: int | None = None
                     ) -> SelectionDesign:
    """The design of `SelectionDesign` for the controller's `selection` option at (ε, δ):
    `units` = n (default `selection_units`: the group at the threshold, where one unit moves the
    release probability by e^ε; n = 1 audits the lonely unit, whose group is released with
    probability at most δ on D and never on D′)."""
    from ..plan.selection import choose_selection

    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError("epsilon must be positive and finite")
    if not 0 < delta < 1:
        raise ValueError("partition selection needs 0 < delta < 1")
    rule = choose_selection(float(epsilon), float(delta), 1, selection)
    n = units if units is not None else selection_units(rule, delta)
    if not (isinstance(n, int) and n >= 1):
        raise ValueError("units must be a positive integer")
    return SelectionDesign(selection, float(epsilon), float(delta), n, rule)


# ------------------------------------------------------------------------------------------------
# Top-k (docs/AUDIT.md §9): dp_top_k and the controller's peeling top-n
# ------------------------------------------------------------------------------------------------
from .top_k import TopKDesign, top_k_design  # noqa: E402, F401  (re-exported with the other designs)
