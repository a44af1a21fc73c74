"""Propose-test-release statistics (dpch.ptr.sql, dpch.ptr.calibration), checked against
independent computations.

What is measured:
- the noisy test's threshold T against the discrete Laplace tail summed term by term (P(Z ≥ T − a0)
  ≤ δ_test, and T is the least such integer), for several ε, δ;
- M_IQR's log bins: they partition [0, 2^16 − 1] into intervals, {0} alone, and the log-width that
  calibrates the release is ≥ the largest ln(v′/v) over every pair v ≤ v′ in one bin (all 65 535
  integers enumerated) and ≤ ln(base) + 1e-9;
- the SQL statistics (evaluated by ClickHouse on literal histograms) against a plain-Python reading
  of their definitions (order statistics, ranks ⌈p·n⌉, window means), on random small datasets;
- the two properties the privacy proofs need (docs/PTR.md, Lemmas P1 and P2), by brute force over
  EVERY neighbour of small datasets: add or remove up to K rows (K = 1, 2, 3; added values from a set
  holding every value present, ±1, and both ends 0 and 2^16 − 1): |A(x) − A(x′)| ≤ 1, and A ≥ 2
  (gap) / D ≥ 1 (median, trimmed mean) imply that x′'s gap is in x's bin / |f(x) − f(x′)| ≤ β;
- that the gap statistic never exceeds the true distance to instability (a BFS over datasets up to
  that many add/remove steps, K = 1): the test is conservative;
- the tests' privacy relation exactly (sums of the discrete Laplace pmf): Def. 9 conditions 2 and 4
  for a PTR function, and Lemma 10's cells for M_IQR (⊥ within e^{2ε_u}, releases within e^{ε_u}
  and e^{2ε_u} in their tests, a bad discretisation releasing with probability ≤ δ/2); the same
  check fails at half the noise scale.
All checks are deterministic (no noise is drawn here).
"""
from __future__ import annotations

import itertools
import math
import random
from fractions import Fraction

import numpy as np
import pytest

from dpch.ptr import NoisyTest, dlap_tail, log_bin_width, log_bins, pass_threshold
from dpch.ptr import sql as S

TOP = (1 << 16) - 1


# ------------------------------------------------------------------------------------------------
# The noisy test's threshold, against the discrete Laplace pmf summed term by term
# ------------------------------------------------------------------------------------------------

def tail_by_sum(tau: float, m: int) -> float:
    """P(Z ≥ m), Z ~ DLap(τ): Σ_{z ≥ m} (1−q)/(1+q) q^|z|, summed to 1e-30 (independent of the
    closed form in dpch.ptr.calibration)."""
    q = math.exp(-1.0 / tau)
    c = (1 - q) / (1 + q)
    zs = np.arange(m, m + int(80 * tau) + 200)
    return float(np.sum(c * q ** np.abs(zs)))


@pytest.mark.parametrize("tau,delta,a0", [(1.0, 1e-6, 0), (1.5, 5e-10, 1), (6.0, 2.5e-7, 1), (4.0, 5e-7, 0),
                                          (0.5, 1e-3, 1), (30.0, 1e-9, 0)])
def test_threshold_is_least_with_tail_below_delta(tau, delta, a0):
    t = pass_threshold(tau, delta, a0)
    assert tail_by_sum(tau, t - a0) <= delta * (1 + 1e-9)
    assert t - a0 == 0 or tail_by_sum(tau, t - a0 - 1) > delta * (1 - 1e-9)
    assert dlap_tail(tau, t - a0) == pytest.approx(tail_by_sum(tau, t - a0), rel=1e-9)


def test_noisy_test_uses_the_kernel_scale():
    """τ is the kernel's (≥ 1/ε), the threshold is computed with it, and the cap leaves a passing
    probability ≥ 1 − 1e-9 for a statistic at the cap."""
    for eps in (0.1, 1 / 3, 1.0, 2.0):
        t = NoisyTest.make(eps, 1e-7, 1)
        assert t.tau >= 1 / eps and t.mechanism.privacy_relation(1.0, eps)
        assert t.threshold == pass_threshold(t.tau, 1e-7, 1)
        assert 1.0 - tail_by_sum(t.tau, t.threshold - t.cap) < 1e-9


# ------------------------------------------------------------------------------------------------
# Log bins
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("base", [1.05, 1.1, 2.0])
@pytest.mark.parametrize("offset", [0.0, 0.5])
def test_log_bins_and_width(base, offset):
    edges = log_bins(base, offset)
    assert edges[0] == 1 and all(a < b for a, b in zip(edges, edges[1:])) and edges[-1] <= TOP
    v = np.arange(1, TOP + 1)
    bins = np.searchsorted(np.array(edges), v, side="right")  # #edges ≤ v
    # largest ln(v′/v) within a bin: its last over its first value, by enumeration
    worst = 0.0
    for b in np.unique(bins):
        members = v[bins == b]
        worst = max(worst, math.log(members.max() / members.min()))
    w = log_bin_width(edges)
    assert worst <= w <= math.log(base) + 1e-9


# ------------------------------------------------------------------------------------------------
# Plain-Python readings of the definitions (docs/PTR.md)
# ------------------------------------------------------------------------------------------------

def xo(xs: list[int], i: int) -> int:
    """Extended order statistic."""
    if i < 1:
        return 0
    if i > len(xs):
        return TOP
    return xs[i - 1]


def rank(p: Fraction, n: int) -> int:
    return math.ceil(p * n)


def gap(xs, p1, p2) -> int:
    n = len(xs)
    return xo(xs, rank(p2, n)) - xo(xs, rank(p1, n))


def bin_index(v: int, edges) -> int:
    return sum(1 for e in edges if e <= v)


def gap_stat(xs, p1, p2, edges, step, cap) -> int:
    n = len(xs)
    r1, r2 = rank(p1, n), rank(p2, n)
    for u in range(cap):
        k = u * step
        lo = max(0, xo(xs, r2 - k) - xo(xs, r1 + k))
        hi = xo(xs, r2 + k) - xo(xs, r1 - k)
        if bin_index(lo, edges) != bin_index(hi, edges):
            return u
    return cap


def median(xs) -> int:
    return xo(xs, rank(Fraction(1, 2), len(xs)))


def median_width(xs, k) -> int:
    r = rank(Fraction(1, 2), len(xs))
    return xo(xs, r + k) - xo(xs, r - k)


def tmean(xs, alpha: Fraction, shift: int = 0, size: int | None = None) -> float:
    """(1/m) Σ_{i=a+1}^{size−a} x_(i+shift) with a = ⌊α·size/2⌋ (0 for m = 0)."""
    n = len(xs) if size is None else size
    a = math.floor(alpha * n / 2)
    m = n - 2 * a
    if m <= 0:
        return 0.0
    return float(sum(xo(xs, i + shift) for i in range(a + 1, n - a + 1))) / m


def tmean_width(xs, alpha, k) -> float:
    """Upper end: the trimmed window of the largest size n + k over x_(i+k); lower end: that of
    the smallest size max(0, n − k) over x_(i−k)."""
    n = len(xs)
    return tmean(xs, alpha, k, n + k) - tmean(xs, alpha, -k, max(0, n - k))


def bound_stat(width, xs, step, beta, cap) -> int:
    for u in range(cap):
        if width(xs, (u + 1) * step) > beta:
            return u
    return cap


# ------------------------------------------------------------------------------------------------
# The SQL, evaluated by ClickHouse on literal histograms (one query for many datasets)
# ------------------------------------------------------------------------------------------------

def hist_sql(datasets: list[list[int]]) -> str:
    """A groups-stage stand-in: one row per dataset, ``__dp_q0`` = (sorted buckets, counts)."""
    rows = []
    for xs in datasets:
        vals = sorted(set(xs))
        rows.append(f"(CAST({vals} AS Array(UInt32)), CAST({[xs.count(v) for v in vals]} AS Array(UInt64)))")
    return f"SELECT arrayJoin([{', '.join(rows)}]) AS __dp_q0"


def sql_values(db, datasets, exprs: list[str]) -> list[tuple]:
    cols = ", ".join(f"{e} AS c{i}" for i, e in enumerate(exprs))
    df = db.backend.query_df(f"SELECT {cols} FROM ({S.sorted_rows_sql(hist_sql(datasets))})")
    return [tuple(r) for r in df.itertuples(index=False)]


def clustered_datasets(seed: int, count: int, min_n: int, max_n: int) -> list[list[int]]:
    """Datasets whose statistics are often stable (so that the safety checks are not vacuous): values
    in a narrow cluster (a centre 4..40, spread 0..6), with an outlier (0 or TOP) now and then."""
    rng = random.Random(seed)
    out = []
    while len(out) < count:
        n, c, w = rng.randint(min_n, max_n), rng.randint(4, 40), rng.randint(0, 4)
        out.append(sorted(rng.choice([0, TOP]) if rng.random() < 0.08 else c + rng.randint(0, w) for _ in range(n)))
    return out


def random_datasets(seed: int, count: int, max_n: int, hi: int) -> list[list[int]]:
    rng = random.Random(seed)
    out = [[], [3], [0, TOP], [5, 5, 5, 5]]
    while len(out) < count:
        n = rng.randint(1, max_n)
        out.append(sorted(rng.choice([rng.randint(0, hi), rng.randint(0, 3), TOP]) for _ in range(n)))
    return out


def test_sql_matches_the_definitions(db):
    """Gap, gap statistic (both discretisations), median, median width, trimmed mean, trimmed width
    and bound statistics: ClickHouse = the Python reading, exactly (float means to 1e-9)."""
    data = random_datasets(1, 40, 14, 40) + clustered_datasets(1, 30, 8, 40)
    p1, p2 = Fraction(1, 4), Fraction(3, 4)
    alpha = Fraction(1, 5)
    e0, e1 = log_bins(2.0, 0.0), log_bins(2.0, 0.5)
    exprs = [S.gap_value(p1, p2), S.gap_stability(p1, p2, e0, 1, 9), S.gap_stability(p1, p2, e1, 2, 9),
             S.median_value(), S.median_width("3"), S.trimmed_value(alpha), S.trimmed_width(alpha, "2"),
             S.bound_stability(S.median_width, 2, 4.0, 7),
             S.bound_stability(lambda k: S.trimmed_width(alpha, k), 1, 1.5, 6)]
    got = sql_values(db, data, exprs)
    for xs, row in zip(data, got):
        want = (gap(xs, p1, p2), gap_stat(xs, p1, p2, e0, 1, 9), gap_stat(xs, p1, p2, e1, 2, 9), median(xs),
                median_width(xs, 3), tmean(xs, alpha), tmean_width(xs, alpha, 2),
                bound_stat(median_width, xs, 2, 4.0, 7),
                bound_stat(lambda x, k: tmean_width(x, alpha, k), xs, 1, 1.5, 6))
        assert row[:5] == pytest.approx(want[:5], abs=0) and row[7:] == want[7:], xs
        assert row[5] == pytest.approx(want[5], abs=1e-9) and row[6] == pytest.approx(want[6], abs=1e-9), xs


# ------------------------------------------------------------------------------------------------
# The privacy properties, by brute force over every neighbour
# ------------------------------------------------------------------------------------------------

def neighbours(xs: list[int], k: int):
    """Every dataset reached by removing up to k rows, or adding up to k rows whose values come
    from the candidate set (each value present, ±1, 0 and TOP): one unit of K = k rows under
    add/remove."""
    cands = sorted({0, TOP} | {v + d for v in xs for d in (-1, 0, 1) if 0 <= v + d <= TOP})
    seen = set()
    for j in range(1, k + 1):
        for drop in itertools.combinations(range(len(xs)), j):
            y = tuple(v for i, v in enumerate(xs) if i not in drop)
            if y not in seen:
                seen.add(y)
                yield list(y)
        for add in itertools.combinations_with_replacement(cands, j):
            y = tuple(sorted(xs + list(add)))
            if y not in seen:
                seen.add(y)
                yield list(y)


@pytest.mark.parametrize("step", [1, 2, 3])
def test_gap_statistic_sensitivity_and_safety(step):
    """Lemma P1: |A(x) − A(x′)| ≤ 1 for every unit neighbour (K = step rows), and A(x) ≥ 2 ⟹ the
    neighbour's gap lies in x's bin; for both discretisations and the IQR and (0.1, 0.9) pairs."""
    data = random_datasets(2 + step, 12, 9, 12) + clustered_datasets(2 + step, 30 if step < 3 else 12, 16, 40)
    cap = 12
    stable = 0
    for p1, p2 in ((Fraction(1, 4), Fraction(3, 4)), (Fraction(1, 10), Fraction(9, 10))):
        for edges in (log_bins(2.0, 0.0), log_bins(2.0, 0.5), log_bins(1.5, 0.0)):
            for xs in data:
                a = gap_stat(xs, p1, p2, edges, step, cap)
                b = bin_index(gap(xs, p1, p2), edges)
                stable += a >= 2
                for y in neighbours(xs, step):
                    assert abs(gap_stat(y, p1, p2, edges, step, cap) - a) <= 1, (xs, y)
                    if a >= 2:
                        assert bin_index(gap(y, p1, p2), edges) == b, (xs, y)
    assert stable >= 10  # the safety implication was exercised


@pytest.mark.parametrize("step", [1, 2])
def test_median_and_trimmed_statistics_sensitivity_and_safety(step):
    """Lemma P2: |D(x) − D(x′)| ≤ 1, and D(x) ≥ 1 ⟹ |f(x) − f(x′)| ≤ β (β in buckets), for the
    median and the α-trimmed mean (α = 1/5 and 1/2), for every unit neighbour."""
    data = random_datasets(7 + step, 10, 9, 12) + clustered_datasets(7 + step, 25, 20, 44)
    cap = 10
    stable = 0
    stats = [(median, median_width, 3.0), (median, median_width, 8.0)]
    for alpha in (Fraction(1, 5), Fraction(1, 2)):
        stats.append((lambda x, a=alpha: tmean(x, a), lambda x, k, a=alpha: tmean_width(x, a, k), 2.5))
    for f, width, beta in stats:
        for xs in data:
            d = bound_stat(width, xs, step, beta, cap)
            stable += d >= 1
            for y in neighbours(xs, step):
                assert abs(bound_stat(width, y, step, beta, cap) - d) <= 1, (xs, y)
                if d >= 1:
                    assert abs(f(y) - f(xs)) <= beta + 1e-12, (xs, y)
    assert stable >= 20  # the safety implication was exercised


def true_distance(xs: list[int], p1, p2, edges, limit: int) -> int:
    """min number of single-row add/remove steps to a dataset whose gap leaves x's bin (BFS over
    the candidate values; ``limit`` if none within it)."""
    b = bin_index(gap(xs, p1, p2), edges)
    frontier, seen = [tuple(xs)], {tuple(xs)}
    for depth in range(1, limit + 1):
        nxt = []
        for x in frontier:
            for y in neighbours(list(x), 1):
                t = tuple(y)
                if t in seen:
                    continue
                if bin_index(gap(y, p1, p2), edges) != b:
                    return depth
                seen.add(t)
                nxt.append(t)
        frontier = nxt
    return limit


def test_gap_statistic_is_a_lower_bound_of_the_true_distance():
    """The envelope is conservative: A (K = 1) ≤ the distance found by BFS, on small datasets."""
    p1, p2 = Fraction(1, 4), Fraction(3, 4)
    edges = log_bins(2.0, 0.0)
    for xs in random_datasets(11, 15, 6, 9) + clustered_datasets(11, 15, 4, 8):
        a = gap_stat(xs, p1, p2, edges, 1, 4)
        assert min(a, 3) <= true_distance(xs, p1, p2, edges, 3), xs


# ------------------------------------------------------------------------------------------------
# The tests' privacy relation, exactly (discrete Laplace summed term by term)
# ------------------------------------------------------------------------------------------------

def pass_prob(tau: float, a: int, t: int) -> float:
    """P(a + Z ≥ t) = P(Z ≥ t − a), Z ~ DLap(τ), by summation (P(Z ≥ m) = 1 − P(Z ≥ 1 − m))."""
    return tail_by_sum(tau, t - a) if t >= a else 1.0 - tail_by_sum(tau, a - t + 1)


def fail_prob(tau: float, a: int, t: int) -> float:
    """P(a + Z < t) = P(Z ≥ a − t + 1) by symmetry, summed directly (no 1 − p cancellation)."""
    return tail_by_sum(tau, a - t + 1) if a - t + 1 >= 0 else 1.0 - tail_by_sum(tau, t - a)


@pytest.mark.parametrize("eps,delta", [(1.0, 1e-6), (1 / 3, 5e-7), (2.0, 1e-9)])
def test_ptr_function_relation(eps, delta):
    """Def. 9 for the median/trimmed-mean test (a0 = 0): for every statistic value A ≤ cap and its
    unit neighbours A ± 1, P(pass) and P(⊥) change by at most e^ε (condition 2, so E(⊥) = ε), and
    a bad statistic (A = 0) passes with probability ≤ δ (condition 4). Summed independently."""
    t = NoisyTest.make(eps, delta, 0)
    bound = math.exp(eps) * (1 + 1e-9)
    for a in range(0, t.cap + 1):
        p, f = pass_prob(t.tau, a, t.threshold), fail_prob(t.tau, a, t.threshold)
        assert p + f == pytest.approx(1.0, abs=1e-12)
        for b in (a - 1, a + 1):
            if 0 <= b <= t.cap:
                assert p <= bound * pass_prob(t.tau, b, t.threshold), (a, b)
                assert f <= bound * fail_prob(t.tau, b, t.threshold), (a, b)
    assert pass_prob(t.tau, 0, t.threshold) <= delta * (1 + 1e-9)
    # power: at half the noise scale the same check fails (the ⊥ ratio reaches e^{2/τ} > e^ε)
    half = t.tau / 2
    assert any(fail_prob(half, a, t.threshold) > bound * fail_prob(half, a + 1, t.threshold) for a in range(t.cap))


@pytest.mark.parametrize("eps_u,delta", [(1 / 3, 1e-6), (1.0, 1e-9)])
def test_m_iqr_bottom_and_release_relation(eps_u, delta):
    """Lemma 10: M_IQR's ⊥ (both tests fail, independent noise) changes by at most e^{2ε_u} when
    each statistic moves by one; the release via discretisation 1 (test 1 passes) by e^{ε_u} in
    its test, via discretisation 2 (test 1 fails, test 2 passes) by e^{2ε_u} in its tests (with the
    ε_u of the release: 2ε_u and 3ε_u); a bad discretisation (A_d ≤ 1) releases with probability
    ≤ δ/2, so both together ≤ δ. Exact sums over the statistics' range."""
    t = NoisyTest.make(eps_u, delta / 2, 1)
    tol = 1 + 1e-9
    vals = range(1, min(t.cap, t.threshold + 12) + 1)
    for a1 in vals:
        for a2 in vals:
            p1, p2 = pass_prob(t.tau, a1, t.threshold), pass_prob(t.tau, a2, t.threshold)
            f1, f2 = fail_prob(t.tau, a1, t.threshold), fail_prob(t.tau, a2, t.threshold)
            for b1 in (a1 - 1, a1 + 1):
                for b2 in (a2 - 1, a2 + 1):
                    if not (1 <= b1 <= t.cap and 1 <= b2 <= t.cap):
                        continue
                    q1, q2 = pass_prob(t.tau, b1, t.threshold), pass_prob(t.tau, b2, t.threshold)
                    g1, g2 = fail_prob(t.tau, b1, t.threshold), fail_prob(t.tau, b2, t.threshold)
                    assert f1 * f2 <= math.exp(2 * eps_u) * tol * g1 * g2
                    assert p1 <= math.exp(eps_u) * tol * q1
                    assert f1 * p2 <= math.exp(2 * eps_u) * tol * g1 * q2
    assert pass_prob(t.tau, 1, t.threshold) <= delta / 2 * tol
