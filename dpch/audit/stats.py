"""Statistics of the audit: Clopper–Pearson bounds, the certified ε lower bound of one output event,
output features, and the search over threshold and interval events.

The privacy relation under test (dpch_paper.md, Definition 1): a mechanism A is (ε, δ)-DP iff for
every pair of neighbouring datasets D, D′ and every event S

    Pr[A(D) ∈ S] ≤ e^ε · Pr[A(D′) ∈ S] + δ,

and, since the neighbour relation is symmetric, also with D and D′ swapped. For ONE fixed event S,
chosen independently of the samples used below, let p̲ be a Clopper–Pearson lower confidence bound
for p = Pr[A(D) ∈ S] and p̄′ an upper bound for p′ = Pr[A(D′) ∈ S], each at level 1 − α/2. Then

    ε_LB = ln((p̲ − δ) / p̄′)

satisfies Pr[ε_LB > ε_true] ≤ α: if both bounds hold, p̲ − δ ≤ p − δ ≤ e^ε p′ ≤ e^ε p̄′ (union
bound over the two one-sided intervals). This is the certification step; the event S itself is
chosen on a disjoint half of the samples (see `dpch.audit.api`), which is what makes "fixed event"
true. Neither the events searched nor the features they are defined on can cause a false alarm:
any measurable function of the output is post-processing, so every event obeys the inequality.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy.special import betaincinv

# A lowbit value standing for "exactly zero" (no set bit): far above any finite float's exponent.
_LOWBIT_ZERO = 4096.0


# --------------------------------------------------------------------------------------------
# Clopper–Pearson
# --------------------------------------------------------------------------------------------
def cp_lower(k, n, alpha):
    """One-sided Clopper–Pearson lower bound for a binomial proportion at level 1 − alpha: the
    alpha-quantile of Beta(k, n − k + 1), and 0 when k = 0. Accepts arrays; k may be fractional
    (used only for projections during event selection, never for certification)."""
    k = np.asarray(k, dtype=float)
    n = np.broadcast_to(np.asarray(n, dtype=float), k.shape)
    safe_k = np.where(k > 0, k, 1.0)
    out = betaincinv(safe_k, n - safe_k + 1.0, alpha)
    return np.where(k > 0, out, 0.0)


def cp_upper(k, n, alpha):
    """One-sided Clopper–Pearson upper bound at level 1 − alpha: the (1 − alpha)-quantile of
    Beta(k + 1, n − k), and 1 when k = n."""
    k = np.asarray(k, dtype=float)
    n = np.broadcast_to(np.asarray(n, dtype=float), k.shape)
    safe_k = np.where(k < n, k, n - 1.0)
    out = betaincinv(safe_k + 1.0, n - safe_k, 1.0 - alpha)
    return np.where(k < n, out, 1.0)


def epsilon_lower_bound(k_num: int, n_num: int, k_den: int, n_den: int, alpha: float,
                        delta: float = 0.0) -> tuple[float, float, float]:
    """Certified ε lower bound for one fixed event S at confidence 1 − alpha.

    `k_num` of `n_num` samples of the "numerator" side fell in S, `k_den` of `n_den` samples of the
    other side. Returns (p̲_num, p̄_den, ε_LB) with ε_LB = ln((p̲_num − δ)/p̄_den), floored at 0 (a
    lower bound on ε ≥ 0 below 0 says nothing). Each one-sided bound is at level 1 − alpha/2."""
    p_lo = float(cp_lower(k_num, n_num, alpha / 2))
    q_hi = float(cp_upper(k_den, n_den, alpha / 2))
    return p_lo, q_hi, _log_ratio(p_lo, q_hi, delta)


def _log_ratio(p_lo: float, q_hi: float, delta: float) -> float:
    num = p_lo - delta
    if num <= 0 or q_hi <= 0:
        return 0.0
    return max(0.0, math.log(num / q_hi))


def selection_epsilon(k_num, n_num, k_den, n_den, alpha: float, delta: float):
    """Selection criterion: the ε_LB that the selection samples' own counts would certify
    (Clopper–Pearson at the certification level). Vectorised over integer count arrays. It ranks
    events on the selection half only and carries no guarantee itself: the maximum over many
    candidate events is biased upwards, which is why the chosen event is certified again on fresh
    samples. Using CP bounds rather than raw frequencies keeps the search away from rare tail
    events whose ratio is mostly sampling noise."""
    k_num = np.clip(np.asarray(k_num), 0, n_num).astype(np.int64)
    k_den = np.clip(np.asarray(k_den), 0, n_den).astype(np.int64)
    p_lo = _cp_table(int(n_num), alpha / 2, "lower")[k_num]  # CP depends on k only: tabulate
    q_hi = _cp_table(int(n_den), alpha / 2, "upper")[k_den]
    num = p_lo - delta
    with np.errstate(divide="ignore", invalid="ignore"):
        eps = np.where(num > 0, np.log(np.maximum(num, 1e-300) / q_hi), 0.0)
    return np.maximum(eps, 0.0)


@lru_cache(maxsize=64)
def _cp_table(n: int, alpha: float, side: str) -> np.ndarray:
    k = np.arange(n + 1)
    return cp_lower(k, n, alpha) if side == "lower" else cp_upper(k, n, alpha)


# --------------------------------------------------------------------------------------------
# Features of the output
# --------------------------------------------------------------------------------------------
def lowbit(values: np.ndarray) -> np.ndarray:
    """2-adic valuation of a float64: the exponent e of the lowest set bit (x = m·2^e, m odd).

    This exposes floating-point artefacts: naive `f + b·ln(u)` Laplace (Mironov 2012, "On
    significance of the least significant bits for differential privacy") produces outputs whose
    lowest set bit depends on f, so {lowbit(x) ≤ t} separates D from D′. Exact grid-based noise
    (docs/NOISE.md) gives r·(m + K), where lowbit is post-processing of m + K and leaks nothing
    beyond the mechanism's ε. Zero maps to a large constant; NaN/±Inf stay NaN."""
    x = np.asarray(values, dtype=np.float64)
    out = np.full(x.shape, np.nan)
    finite = np.isfinite(x)
    nz = finite & (x != 0)
    mant, expo = np.frexp(x[nz])  # x = mant · 2^expo, 0.5 ≤ |mant| < 1
    m = np.abs(np.ldexp(mant, 53)).astype(np.int64)  # exact 53-bit integer mantissa
    tz = _trailing_zeros(m)
    out[nz] = expo.astype(np.float64) - 53 + tz
    out[finite & (x == 0)] = _LOWBIT_ZERO
    return out


def _trailing_zeros(m: np.ndarray) -> np.ndarray:
    low = m & -m  # isolate the lowest set bit (m > 0)
    return np.log2(low.astype(np.float64)).round()


@dataclass(frozen=True)
class FeatureSpec:
    """Which features are computed from an output matrix (n samples × k coordinates). Decided on the
    selection half only, then applied unchanged to the certification half."""

    names: tuple[str, ...]      # coordinate names
    with_lowbit: tuple[bool, ...]
    with_presence: tuple[bool, ...]

    @staticmethod
    def fit(outputs: list[np.ndarray], names: list[str]) -> "FeatureSpec":
        pooled = np.vstack(outputs)
        lowbits, presence = [], []
        for j in range(pooled.shape[1]):
            col = pooled[:, j]
            finite = col[np.isfinite(col)]
            # Integer-valued outputs (counts, Int64 releases): the low bits carry nothing new.
            lowbits.append(bool(finite.size) and not np.all(finite == np.round(finite)))
            presence.append(bool(np.isnan(col).any()))
        return FeatureSpec(tuple(names), tuple(lowbits), tuple(presence))

    def transform(self, outputs: np.ndarray) -> tuple[np.ndarray, list[str]]:
        cols, names = [], []
        for j, name in enumerate(self.names):
            col = outputs[:, j].astype(np.float64)
            cols.append(col)
            names.append(name)
            if self.with_lowbit[j]:
                cols.append(lowbit(col))
                names.append(f"lowbit({name})")
            if self.with_presence[j]:
                cols.append((~np.isnan(col)).astype(np.float64))
                names.append(f"present({name})")
        return np.column_stack(cols) if cols else np.empty((outputs.shape[0], 0)), names


# --------------------------------------------------------------------------------------------
# Events and the threshold/interval search
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class IntervalEvent:
    """S = {output : lo ≤ feature(output) ≤ hi} (closed; lo = −inf or hi = +inf makes it a
    threshold event). `favours` is the side whose probability is the numerator of the bound."""

    feature: str
    lo: float
    hi: float
    favours: str  # "D" or "D′"

    def contains(self, column: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            return (column >= self.lo) & (column <= self.hi)

    def describe(self) -> str:
        if self.lo == -math.inf and self.hi == math.inf:
            return f"{self.feature} is defined"
        if self.lo == -math.inf:
            return f"{self.feature} ≤ {self.hi:.10g}"
        if self.hi == math.inf:
            return f"{self.feature} ≥ {self.lo:.10g}"
        if self.lo == self.hi:
            return f"{self.feature} = {self.lo:.10g}"
        return f"{self.lo:.10g} ≤ {self.feature} ≤ {self.hi:.10g}"


@dataclass(frozen=True)
class Candidate:
    event: IntervalEvent
    score: float  # the selection criterion's value on the selection samples


def _boundaries(pooled: np.ndarray, max_boundaries: int) -> np.ndarray:
    finite = pooled[~np.isnan(pooled)]
    if finite.size == 0:
        return np.empty(0)
    uniq = np.unique(finite)
    if uniq.size <= max_boundaries:
        return uniq
    qs = np.quantile(finite, np.linspace(0, 1, max_boundaries), method="inverted_cdf")
    return np.unique(qs)


def interval_counts(x_sorted: np.ndarray, bounds: np.ndarray):
    """Counts of a sorted sample (NaN last) in all intervals [lo_i, hi_j] whose ends are drawn from
    `bounds` ∪ {−inf} (lo) and `bounds` ∪ {+inf} (hi). Returns (counts matrix, lo values, hi values);
    entries with lo > hi are −1."""
    n_finite = int(np.count_nonzero(~np.isnan(x_sorted)))
    below_lo = np.concatenate([[0], np.searchsorted(x_sorted[:n_finite], bounds, side="left")])
    upto_hi = np.concatenate([np.searchsorted(x_sorted[:n_finite], bounds, side="right"), [n_finite]])
    lo_vals = np.concatenate([[-math.inf], bounds])
    hi_vals = np.concatenate([bounds, [math.inf]])
    counts = upto_hi[None, :] - below_lo[:, None]
    valid = lo_vals[:, None] <= hi_vals[None, :]
    return np.where(valid, counts, -1), lo_vals, hi_vals


def search_intervals(feat_d: np.ndarray, feat_dp: np.ndarray, names: list[str], *, alpha: float,
                     delta: float, max_boundaries: int = 160, objective: str = "epsilon",
                     thresholds_only: bool = False) -> Candidate | None:
    """The best interval event over every feature column, both directions, on the selection
    samples. objective "epsilon": maximise `selection_epsilon` at level alpha;
    "advantage": maximise |p̂_D − p̂_D′| (membership-inference accuracy). `thresholds_only`
    restricts D-favouring events to {x ≥ t} and D′-favouring ones to {x ≤ t}: the right family for
    a score that increases with the likelihood ratio (Neyman–Pearson), and far fewer candidates
    (less selection bias) than all intervals."""
    best: Candidate | None = None
    n_d, n_dp = feat_d.shape[0], feat_dp.shape[0]
    for j, name in enumerate(names):
        a, b = feat_d[:, j], feat_dp[:, j]
        bounds = _boundaries(np.concatenate([a, b]), max_boundaries)
        if bounds.size == 0:
            continue
        c_d, lo_vals, hi_vals = interval_counts(np.sort(a), bounds)
        c_dp, _, _ = interval_counts(np.sort(b), bounds)
        valid = c_d >= 0
        for favours, k_num, n_num, k_den, n_den in (("D", c_d, n_d, c_dp, n_dp),
                                                    ("D′", c_dp, n_dp, c_d, n_d)):
            allowed = valid
            if thresholds_only:
                allowed = valid & ((hi_vals[None, :] == math.inf) if favours == "D"
                                   else (lo_vals[:, None] == -math.inf))
            if objective == "epsilon":
                score = selection_epsilon(k_num, n_num, k_den, n_den, alpha, delta)
            else:
                score = k_num / n_num - k_den / n_den
            score = np.where(allowed, score, -np.inf)
            i, jj = np.unravel_index(int(np.argmax(score)), score.shape)
            s = float(score[i, jj])
            if best is None or s > best.score:
                best = Candidate(IntervalEvent(name, float(lo_vals[i]), float(hi_vals[jj]), favours), s)
    return best


@dataclass(frozen=True)
class Certificate:
    """One event certified on the held-out half. `epsilon_lb` holds at confidence 1 − alpha."""

    method: str
    event: str
    favours: str
    n_d: int
    k_d: int
    n_dprime: int
    k_dprime: int
    p_num_lower: float
    p_den_upper: float
    epsilon_lb: float
    alpha: float
    selection_score: float

    @property
    def p_d(self) -> float:
        return self.k_d / self.n_d

    @property
    def p_dprime(self) -> float:
        return self.k_dprime / self.n_dprime


def certify(method: str, description: str, favours: str, in_d: np.ndarray, in_dp: np.ndarray, *,
            alpha: float, delta: float, selection_score: float = float("nan")) -> Certificate:
    """Certify a fixed event from its indicator on the held-out samples of D and D′."""
    k_d, n_d = int(np.count_nonzero(in_d)), int(in_d.size)
    k_dp, n_dp = int(np.count_nonzero(in_dp)), int(in_dp.size)
    if favours == "D":
        p_lo, q_hi, eps = epsilon_lower_bound(k_d, n_d, k_dp, n_dp, alpha, delta)
    else:
        p_lo, q_hi, eps = epsilon_lower_bound(k_dp, n_dp, k_d, n_d, alpha, delta)
    return Certificate(method, description, favours, n_d, k_d, n_dp, k_dp, p_lo, q_hi, eps, alpha,
                       selection_score)


# --------------------------------------------------------------------------------------------
# Membership inference
# --------------------------------------------------------------------------------------------
def mi_accuracy_bound(epsilon: float, delta: float = 0.0) -> float:
    """Best accuracy of guessing D vs D′ (prior 1/2) from one output of an (ε, δ)-DP mechanism:
    (e^ε + δ)/(1 + e^ε). From the two DP inequalities for S and its complement, both tight at
    the optimum (Kairouz, Oh & Viswanath 2015, hypothesis-testing view of DP)."""
    return (math.exp(epsilon) + delta) / (1.0 + math.exp(epsilon))


@dataclass(frozen=True)
class MembershipInference:
    method: str
    event: str
    accuracy: float        # point estimate on the held-out half
    accuracy_lower: float  # Clopper–Pearson lower bound at the audit's confidence
    bound: float           # (e^ε + δ)/(1 + e^ε)

    @property
    def advantage(self) -> float:
        return 2 * self.accuracy - 1

    @property
    def exceeds_bound(self) -> bool:
        return self.accuracy_lower > self.bound


def membership_inference(method: str, description: str, favours: str, in_d: np.ndarray,
                         in_dp: np.ndarray, *, alpha: float, epsilon: float,
                         delta: float) -> MembershipInference:
    """The guesser says "the favoured side" iff the output is in S. Accuracy = (Pr_fav[S] +
    Pr_other[S^c])/2; its lower bound combines two one-sided CP bounds at alpha/2 each."""
    if favours == "D":
        hit, miss = in_d, ~in_dp
    else:
        hit, miss = in_dp, ~in_d
    k1, n1, k2, n2 = int(hit.sum()), hit.size, int(miss.sum()), miss.size
    acc = (k1 / n1 + k2 / n2) / 2
    lower = (float(cp_lower(k1, n1, alpha / 2)) + float(cp_lower(k2, n2, alpha / 2))) / 2
    return MembershipInference(method, description, acc, lower, mi_accuracy_bound(epsilon, delta))
