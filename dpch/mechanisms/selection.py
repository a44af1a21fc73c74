"""Selection mechanisms: the exponential mechanism (permute-and-flip), the grid quantile release and
peeling top-n (Dwork–Roth §3.4; McKenna & Sheldon 2020; issue 15)."""
from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from fractions import Fraction

from dpch import calibration as cal
from dpch.errors import InvalidParameter
from dpch.mechanisms.base import PrivacyLoss, _up


@dataclass(frozen=True)
class ExponentialMechanism:
    """Choose one of several candidates with integer scores: the exponential mechanism sampled by
    permute-and-flip (McKenna & Sheldon 2020, Alg. 1) in the kernel, ``dpch._noise.permute_and_flip``.
    Candidates are visited in a uniformly random order and candidate r is accepted with probability
    ``exp(-(u* - u_r)/T)``, u* the best score, at the temperature ``T = t/s`` (an exact rational,
    s a power of two), decided by CKS20's exact Bernoulli(exp(-γ)) sampler: no floating-point
    ``log(uniform)`` anywhere.

    Privacy: scores of sensitivity Δ (each moves by at most Δ between neighbours) give an
    ε-DP choice for T >= 2Δ/ε (McKenna & Sheldon, Thm. 1); ``calibrated`` rounds T up, so the
    realised ε is at most the requested one. Its expected score is never below the exponential
    mechanism's at the same ε (their Thm. 2)."""

    t: int
    s: int

    def __post_init__(self) -> None:
        if not (isinstance(self.t, int) and isinstance(self.s, int) and 1 <= self.t < 2 ** 127
                and 1 <= self.s < 2 ** 64):
            raise InvalidParameter("temperature t/s needs integers 1 <= t < 2^127, 1 <= s < 2^64")

    @classmethod
    def calibrated(cls, sensitivity: float, epsilon: float) -> "ExponentialMechanism":
        """The least temperature t/2^p >= 2Δ/ε with t < 2^63 (p <= 63): ε-DP for scores of
        sensitivity Δ."""
        t, s = cal.em_temperature(Fraction(cal.check_sensitivity(sensitivity)), epsilon)
        return cls(t, s)

    @property
    def temperature(self) -> Fraction:
        return Fraction(self.t, self.s)

    def privacy_function(self, sensitivity: float) -> PrivacyLoss:
        """ε = 2Δ/T (rounded up to a float)."""
        return PrivacyLoss(epsilon=_up(2 * Fraction(cal.check_sensitivity(sensitivity)) / self.temperature),
                           delta=0.0)

    def privacy_relation(self, sensitivity: float, epsilon: float) -> bool:
        return self.privacy_function(sensitivity).epsilon <= epsilon

    def probabilities(self, scores) -> list[float]:
        """The exact output distribution (for checks; exponential in the number of candidates,
        so at most 16): P(r) = p_r · Σ_{A ⊆ others} |A|!(n-1-|A|)!/n! · Π_{j∈A}(1 - p_j),
        p_j = exp(-(u* - u_j)/T), A the candidates visited before r."""
        u = [int(x) for x in scores]
        n = len(u)
        if not 1 <= n <= 16:
            raise InvalidParameter("probabilities: between 1 and 16 candidates")
        best = max(u)
        p = [math.exp(-float((best - x) / self.temperature)) for x in u]
        weight = [math.factorial(k) * math.factorial(n - 1 - k) / math.factorial(n) for k in range(n)]
        out = []
        for r in range(n):
            others = [j for j in range(n) if j != r]
            # Σ over subsets by the polynomial Π_j (1 + (1 - p_j) x): coefficient k = subsets of size k
            coef = [1.0]
            for j in others:
                nxt = [0.0] * (len(coef) + 1)
                for k, c in enumerate(coef):
                    nxt[k] += c
                    nxt[k + 1] += c * (1.0 - p[j])
                coef = nxt
            out.append(p[r] * sum(w * c for w, c in zip(weight, coef)))
        return out

    def sample(self, scores, n: int = 1):
        """``n`` independent choices (indices into ``scores``)."""
        _noise = importlib.import_module("dpch._noise")  # not ``from dpch import``: no import of the package

        return _noise.permute_and_flip(scores, self.t, self.s, n)


#: The fixed grid of dp_quantile/dp_median and of the controller's quantiles: [lo, hi] is cut into
#: this many equal buckets and the released value is the chosen bucket's midpoint (docs/NOISE.md,
#: "Quantiles", says why 2^16).
QUANTILE_BUCKETS = 1 << 16
#: Quantile levels are rounded to multiples of 1/QUANTILE_SCALE so that scores are integers.
QUANTILE_SCALE = 1 << 20


@dataclass(frozen=True)
class QuantileMechanism:
    """Quantiles of a histogram over a fixed grid of buckets, chosen by permute-and-flip
    (ExponentialMechanism) with the score of OpenDP's quantile candidates, scaled to integers:
    for a bucket b, L = rows in buckets below b, G = rows above b, score -|(Q - a) L - a G| for the
    level a/Q. Three or more distinct levels are released jointly by the recursion of Kaplan,
    Schnapp & Stemmer (2022, ApproximateQuantiles): the middle level over the whole grid, then the
    lower levels over the buckets up to it with the rows below it and the upper levels likewise
    above, so a row takes part in one sub-problem per depth. Exactly two distinct levels are
    released independently, each over the whole grid with all the rows at ε/2, and the two buckets
    sorted (the recursion's depth is 2 as well, so this costs the same, and the second level does
    not inherit the first one's error). This is the reference for the kernel's
    ``_quantile_buckets`` (udf/kernel.pxi), which the tests compare it with.

    Privacy: ε-DP for histograms that differ by at most ``rows`` rows (one privacy unit's rows in
    the group): one row moves L or G by one, so a score of level a/Q moves by at most
    rows · max(a, Q - a). Recursion: each of the depth = bit_length(#levels) depths is
    (ε/depth)-DP (parallel composition over the disjoint sub-problems) and they compose
    sequentially. Two levels: two (ε/2)-DP releases on the same histogram, sequential composition;
    sorting them is post-processing."""

    epsilon: float
    rows: int = 1

    def __post_init__(self) -> None:
        cal.check_epsilon(self.epsilon)
        if not (isinstance(self.rows, int) and 1 <= self.rows <= 2 ** 20):
            raise InvalidParameter("rows per privacy unit must be an integer in [1, 2^20]")

    @staticmethod
    def level(alpha: float) -> int:
        """The integer a of the level a/Q nearest to alpha."""
        v = float(alpha)
        if not 0.0 <= v <= 1.0:
            raise InvalidParameter("quantile levels must be numbers in [0, 1]")
        return int(round(v * QUANTILE_SCALE))

    def privacy_function(self) -> PrivacyLoss:
        return PrivacyLoss(epsilon=float(self.epsilon), delta=0.0)

    def chooser(self, a: int, depth: int) -> ExponentialMechanism:
        """The permute-and-flip of one sub-problem at relative level a/Q."""
        t, s = cal.em_temperature(self.rows * max(a, QUANTILE_SCALE - a) * depth, self.epsilon)
        return ExponentialMechanism(t, s)

    @staticmethod
    def scores(counts: list[int], a: int, c0: int, c1: int, d0: int, d1: int) -> list[int]:
        """Scores of the candidate buckets c0..c1 with the rows of buckets d0..d1 (dense counts)."""
        data = [counts[i] if d0 <= i <= d1 else 0 for i in range(len(counts))]
        out = []
        for b in range(c0, c1 + 1):
            below, above = sum(data[:b]), sum(data[b + 1:])
            out.append(-abs((QUANTILE_SCALE - a) * below - a * above))
        return out

    def probabilities(self, counts: list[int], alphas: list[float]) -> dict[tuple[int, ...], float]:
        """The exact joint distribution of the chosen buckets (one per level, in the order given)
        for dense ``counts`` over a grid of at most 16 buckets (for checks)."""
        levels = [self.level(x) for x in alphas]
        uniq = sorted(set(levels))
        depth = len(uniq).bit_length()
        buckets = len(counts)
        index = {a: i for i, a in enumerate(uniq)}
        result: dict[tuple[int, ...], float] = {}
        if len(uniq) == 2:  # two independent releases at ε/2 over the whole grid, then sorted
            last = buckets - 1
            marginals = [self.chooser(a, 2).probabilities(self.scores(counts, a, 0, last, 0, last))
                         for a in uniq]
            for b0, p0 in enumerate(marginals[0]):
                for b1, p1 in enumerate(marginals[1]):
                    pair = sorted((b0, b1))
                    mapped = tuple(pair[index[a]] for a in levels)
                    result[mapped] = result.get(mapped, 0.0) + p0 * p1
            return result

        def solve(c0, c1, d0, d1, lo, hi, end_lo, end_hi) -> dict[tuple, float]:
            if lo >= hi:
                return {(): 1.0}
            j = (lo + hi) // 2
            width = end_hi - end_lo
            a = (2 * (uniq[j] - end_lo) * QUANTILE_SCALE + width) // (2 * width)
            em = self.chooser(a, depth)
            out: dict[tuple, float] = {}
            for i, p in enumerate(em.probabilities(self.scores(counts, a, c0, c1, d0, d1))):
                b = c0 + i
                for left, pl in solve(c0, b, d0, b - 1, lo, j, end_lo, uniq[j]).items():
                    for right, pr in solve(b, c1, b + 1, d1, j + 1, hi, uniq[j], end_hi).items():
                        key = left + (b,) + right
                        out[key] = out.get(key, 0.0) + p * pl * pr
            return out

        joint = solve(0, buckets - 1, 0, buckets - 1, 0, len(uniq), 0, QUANTILE_SCALE)
        for key, p in joint.items():
            mapped = tuple(key[index[a]] for a in levels)
            result[mapped] = result.get(mapped, 0.0) + p
        return result

    def sample(self, keys, counts, buckets: int, alphas: list[float], n: int = 1) -> list[list[int]]:
        """``n`` independent releases by the kernel (sparse histogram: ascending ``keys``)."""
        _noise = importlib.import_module("dpch._noise")  # not ``from dpch import``: no import of the package

        return _noise.quantile_buckets(keys, counts, buckets, alphas, self.epsilon, self.rows, n)

    def rank_halfwidth(self, levels: int, confidence: float, buckets: int = QUANTILE_BUCKETS) -> float:
        """h such that, with probability >= confidence, every released level's
        |(1-α) L - α G| (rows below/above its bucket, within its sub-problem) exceeds the best
        bucket's by at most h rows: a candidate of score gap g is accepted with probability at most
        e^(-g/T), so a gap >= T (ln B + ln(m/β)) has probability <= β/m (union bound over the B
        buckets and the m levels), T = 2 · rows · depth / ε in rows (max(α, 1-α) <= 1). Two
        levels (depth 2, each over the whole histogram): sorting the pair keeps the bound, up to
        the larger of the two best scores, since (1-α) L - α G is non-decreasing in the bucket and
        non-increasing in α. Public: a function of the parameters only."""
        m = max(1, int(levels))
        depth = m.bit_length()
        beta = 1.0 - float(confidence)
        return 2.0 * self.rows * depth / self.epsilon * (math.log(buckets) + math.log(m / beta))

    @staticmethod
    def value(bucket: int, lo: float, hi: float, buckets: int = QUANTILE_BUCKETS) -> float:
        """The released value of a bucket: its midpoint, inside [lo, hi] (post-processing)."""
        return min(max(lo + (bucket + 0.5) * ((hi - lo) / buckets), lo), hi)


@dataclass(frozen=True)
class TopKMechanism:
    """Noisy top-n by peeling: n rounds of permute-and-flip (ExponentialMechanism), round i over
    the candidates not chosen yet, at the temperature ``em_temperature(Δ·n, ε)`` = 2Δn/ε rounded
    up (Durfee & Rogers 2019 peel exponential mechanisms; permute-and-flip, McKenna & Sheldon
    2020, is never worse than the exponential mechanism at the same ε). The reference for the
    kernel's ``_top_k`` (udf/kernel.pxi) and the UDF ``dpch_top_k``.

    Privacy: when every candidate's score moves by at most Δ between neighbouring datasets (any
    number of scores may move), each round is (ε/n)-DP (McKenna & Sheldon, Thm. 1) and the ordered
    n-tuple ε-DP by sequential composition (Dwork & Roth Thm 3.16). Pure ε: no δ."""

    epsilon: float
    n: int
    sensitivity: int = 1

    def __post_init__(self) -> None:
        cal.check_epsilon(self.epsilon)
        if not (isinstance(self.n, int) and 1 <= self.n <= 1 << 12):
            raise InvalidParameter("top-k: n must be an integer in [1, 4096]")
        if not (isinstance(self.sensitivity, int) and 1 <= self.sensitivity <= 1 << 62):
            raise InvalidParameter("top-k: the score sensitivity must be an integer in [1, 2^62]")

    def round_mechanism(self) -> ExponentialMechanism:
        """One round's permute-and-flip: (ε/n)-DP for scores of sensitivity Δ."""
        t, s = cal.em_temperature(self.sensitivity * self.n, self.epsilon)
        return ExponentialMechanism(t, s)

    @property
    def temperature(self) -> Fraction:
        """One round's temperature, in score units."""
        return self.round_mechanism().temperature

    def privacy_function(self) -> PrivacyLoss:
        """ε = n · (2Δ/T) (rounded up)."""
        per_round = 2 * Fraction(self.sensitivity) / self.temperature
        return PrivacyLoss(epsilon=_up(self.n * per_round), delta=0.0)

    def privacy_relation(self, epsilon: float) -> bool:
        return self.privacy_function().epsilon <= epsilon

    def probabilities(self, scores) -> dict[tuple[int, ...], float]:
        """The exact distribution of the ordered tuple of chosen indices (for checks; at most 8
        candidates): the product over rounds of the round's permute-and-flip probability among the
        candidates left."""
        u = [int(x) for x in scores]
        if not 1 <= len(u) <= 8:
            raise InvalidParameter("probabilities: between 1 and 8 candidates")
        em = self.round_mechanism()
        rounds = min(self.n, len(u))
        out: dict[tuple[int, ...], float] = {}

        def walk(prefix: tuple[int, ...], p: float) -> None:
            if len(prefix) == rounds:
                out[prefix] = out.get(prefix, 0.0) + p
                return
            left = [i for i in range(len(u)) if i not in prefix]
            for i, q in zip(left, em.probabilities([u[j] for j in left])):
                walk(prefix + (i,), p * q)

        walk((), 1.0)
        return out

    def sample(self, scores, draws: int = 1) -> list[list[int]]:
        """``draws`` independent releases by the kernel (the UDF's code path)."""
        _noise = importlib.import_module("dpch._noise")  # not ``from dpch import``: no import of the package

        return _noise.top_k(scores, self.n, self.epsilon, self.sensitivity, draws)

    def rank_error(self, candidates: int, beta: float) -> float:
        """g such that, with probability >= 1 - β, every chosen candidate's score is within g of
        the best score left in its round: a candidate at gap >= g is accepted with probability
        <= e^(-g/T), so g = T·ln(m·n/β) bounds it for all m candidates and n rounds (union bound).
        In score units; public (parameters only)."""
        m = max(1, int(candidates))
        b = float(beta)
        if not 0.0 < b < 1.0:
            raise InvalidParameter("beta must be in (0, 1)")
        return float(self.temperature) * math.log(m * min(self.n, m) / b)
