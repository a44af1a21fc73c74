"""Propose-test-release in ClickHouse: the statistics, the noisy test and the noisy release as SQL.

Input: the controller's bounded histogram (``__dp_q0``: sorted buckets of the 2^16 grid over the
column's bounds, with counts; each unit's rows bounded to M as for ``quantile()``). Everything
below runs inside ClickHouse; Python receives one row: ``branch`` (0 = ⊥, else which
discretisation/test passed) and ``value`` (NULL unless released, then already noised).

Order statistics are *extended*: x_(i) = 0 for i ≤ 0 and B − 1 for i > n (every value lies in
[0, B − 1], B = 2^16), so adding or removing one row moves x_(i) within [x_(i−1), x_(i+1)] and a
rank ⌈p·n⌉ by at most one; hence the envelope of docs/PTR.md, "Envelopes":
I_k(x′) ⊆ I_{k+1}(x) for row neighbours, and I_k(x′) ⊆ I_{k+K}(x) for unit neighbours (K rows).
All arithmetic on the statistics is exact integer arithmetic, except the trimmed mean's window
means (correctly rounded Float64 divisions of exact integer sums: monotone, which is all the
envelope argument needs; docs/PTR.md).
"""
from __future__ import annotations

from fractions import Fraction

from ..mechanisms import LaplaceMechanism
from ..typecheck import with_settings
from .calibration import BUCKETS, NoisyTest

TOP = BUCKETS - 1


def _indent(sql: str) -> str:
    return "\n".join("  " + line for line in sql.splitlines())


def sorted_rows_sql(groups_sql: str) -> str:
    """One row: the bounded histogram as ``bk`` (sorted buckets, Int64), ``cum`` (cumulative
    counts), ``cs`` (cumulative Σ bucket·count) and ``n`` (rows). Its size is the number of distinct
    buckets (≤ 2^16), whatever the number of rows: memory and time do not grow with n."""
    return ("SELECT arrayMap(__dp_b -> toInt64(__dp_b), __dp_q0.1) AS bk,\n"
            "  arrayCumSum(arrayMap(__dp_c -> toInt64(__dp_c), __dp_q0.2)) AS cum,\n"
            "  arrayCumSum(arrayMap((__dp_b, __dp_c) -> toInt64(__dp_b) * toInt64(__dp_c), __dp_q0.1, __dp_q0.2)) AS cs,\n"
            "  toInt64(arraySum(__dp_q0.2)) AS n\n"
            f"FROM (\n{_indent(groups_sql)}\n)")


def _position(j: str) -> str:
    """The histogram entry holding the j-th smallest row (1 ≤ j ≤ n; 0 otherwise)."""
    return f"toUInt64(arrayFirstIndex(__dp_c -> __dp_c >= ({j}), cum))"


def order_stat(i: str) -> str:
    """x_(i), extended (module docstring)."""
    return f"if(({i}) < 1, toInt64(0), if(({i}) > n, toInt64({TOP}), bk[{_position(i)}]))"


def rank(p: Fraction, n: str = "n") -> str:
    """⌈p·n⌉ exactly (p a fraction in (0, 1))."""
    return f"intDiv({p.numerator} * ({n}) + {p.denominator - 1}, {p.denominator})"


def first_failure(cond_of_u: str, cap: int) -> str:
    """min{u ∈ [0, cap): cond(u)}, or cap: the capped distance statistic."""
    # index x ∈ [0, cap] (0: none); (x + cap) mod (cap + 1) maps 0 ↦ cap and x ↦ x − 1
    return (f"toInt64((arrayFirstIndex(__dp_u -> {cond_of_u}, range(toInt64(0), toInt64({cap}))) + {cap}) "
            f"% {cap + 1})")


# -- M_IQR: the gap between two quantiles, two shifted log discretisations ------------------------

def gap_bounds(p1: Fraction, p2: Fraction, k: str) -> tuple[str, str]:
    """[lo_k, hi_k] ∋ x_(r2) − x_(r1) of every dataset within k rows (docs/PTR.md)."""
    r1, r2 = rank(p1), rank(p2)
    lo = f"greatest(toInt64(0), {order_stat(f'{r2} - ({k})')} - {order_stat(f'{r1} + ({k})')})"
    hi = f"({order_stat(f'{r2} + ({k})')} - {order_stat(f'{r1} - ({k})')})"
    return lo, hi


def bin_of(v: str, edges: tuple[int, ...]) -> str:
    return f"arrayCount(__dp_e -> __dp_e <= ({v}), [{', '.join(str(e) for e in edges)}])"


def gap_stability(p1: Fraction, p2: Fraction, edges: tuple[int, ...], step: int, cap: int) -> str:
    """A = min{u ≥ 0: [lo_{uK}, hi_{uK}] leaves the gap's bin} (capped): sensitivity 1 in units;
    A ≥ 2 ⟹ every unit neighbour's gap is in the same bin (docs/PTR.md, Lemma P1)."""
    lo, hi = gap_bounds(p1, p2, f"__dp_u * {step}")
    return first_failure(f"{bin_of(lo, edges)} != {bin_of(hi, edges)}", cap)


def gap_value(p1: Fraction, p2: Fraction) -> str:
    r1, r2 = rank(p1), rank(p2)
    return f"({order_stat(r2)} - {order_stat(r1)})"


def _noise_from(stats_sql: str, runs: int) -> tuple[str, str]:
    """(FROM clause, per-row term) for the noise level: one row, or ``runs`` independent runs of
    the same statistics (the audit's fast path: a per-row term keeps each UDF call per row)."""
    if runs == 1:
        return f"FROM (\n{_indent(stats_sql)}\n)", ""
    return f"FROM (\n{_indent(stats_sql)}\n) AS __dp_stats\nCROSS JOIN numbers({int(runs)}) AS __dp_runs", " + 0 * toInt64(number)"


def scale_sql(groups_sql: str, p1: Fraction, p2: Fraction, step: int, discs: list[tuple[tuple[int, ...], NoisyTest]],
              release: LaplaceMechanism, runs: int = 1) -> str:
    """M_IQR in one query: the statistics once (gap g, A_d per discretisation d), then per d the
    noisy test ``A_d + Z_d ≥ T`` and the noisy log-gap ``ln g + L_d`` (g > 0; g = 0 releases 0),
    each noisy value computed once in its own level. ``branch`` = the first d that passed, 0 if
    none; ``value`` = exp(noisy log-gap) in bucket units, NULL for ⊥."""
    stats = [f"{gap_value(p1, p2)} AS __dp_g"] + [
        f"{gap_stability(p1, p2, edges, step, test.cap)} AS __dp_a{d}" for d, (edges, test) in enumerate(discs, 1)]
    stats_sql = f"SELECT {', '.join(stats)}\nFROM (\n{_indent(sorted_rows_sql(groups_sql))}\n)"
    src, row = _noise_from(stats_sql, runs)
    cols = ["__dp_g"]
    for d, (_, test) in enumerate(discs, 1):
        cols.append(f"{test.sql(f'__dp_a{d}{row}')} AS __dp_t{d}")
        cols.append(f"{release.sql(f'if(__dp_g > 0, log(toFloat64(__dp_g)), 0.){row}')} AS __dp_v{d}")
    inner = f"SELECT {', '.join(cols)}\n{src}"
    branch, value = "toUInt8(0)", "CAST(NULL AS Nullable(Float64))"
    for d in range(len(discs), 0, -1):
        branch = f"if(__dp_t{d} = 1, toUInt8({d}), {branch})"
        value = f"if(__dp_t{d} = 1, toNullable(if(__dp_g > 0, exp(__dp_v{d}), 0.)), {value})"
    return with_settings(f"SELECT {branch} AS branch, {value} AS value\nFROM (\n{_indent(inner)}\n)")


# -- PTR functions with a proposed bound β: median, trimmed mean -----------------------------------

def median_width(k: str) -> str:
    """W_k = x_(r+k) − x_(r−k), r = ⌈n/2⌉: every dataset within k rows has its median in
    [x_(r−k), x_(r+k)] (docs/PTR.md)."""
    r = rank(Fraction(1, 2))
    return f"toFloat64({order_stat(f'{r} + ({k})')} - {order_stat(f'{r} - ({k})')})"


def median_value() -> str:
    return f"toFloat64({order_stat(rank(Fraction(1, 2)))})"


def prefix_sum(j: str) -> str:
    """Σ_{1 ≤ i ≤ j} x_(i) over the extended order statistics (0 for j ≤ 0; x_(i) = B − 1 past n):
    for 1 ≤ j ≤ n, the sum through the entry t holding x_(j), minus its (cum[t] − j) rows past j."""
    t = _position(f"least({j}, n)")
    return (f"if(({j}) <= 0, toInt64(0), if(({j}) <= n, cs[{t}] - (cum[{t}] - ({j})) * bk[{t}], "
            f"cs[-1] + (({j}) - n) * {TOP}))")


def window_mean(alpha: Fraction, size: str, shift: str) -> str:
    """(1/m) Σ_{i=a+1}^{size−a} x_(i+shift), a = ⌊α·size/2⌋, m = size − 2a (0 if m ≤ 0): the
    α-trimmed mean of a sorted sample of ``size`` rows, its order statistics shifted by ``shift``."""
    a = f"intDiv({alpha.numerator} * ({size}), {2 * alpha.denominator})"
    m = f"(({size}) - 2 * {a})"
    s = f"({prefix_sum(f'({size}) - {a} + ({shift})')} - {prefix_sum(f'{a} + ({shift})')})"
    return f"if({m} <= 0, 0., toFloat64({s}) / {m})"


def trimmed_width(alpha: Fraction, k: str) -> str:
    """U_k − L_k with U_k = the window mean of x_(i+k) for the largest size n + k and L_k = that of
    x_(i−k) for the smallest size max(0, n − k): every dataset y within k rows has its trimmed mean
    in [L_k, U_k] (y_(i) ≤ x_(i+k), and the mean of a window of a non-decreasing sequence grows
    with both ends of the window, which grow with the size; docs/PTR.md, Lemma P2). O(1) per k."""
    hi = window_mean(alpha, f"n + ({k})", k)
    lo = window_mean(alpha, f"greatest(toInt64(0), n - ({k}))", f"-({k})")
    return f"({hi} - {lo})"


def trimmed_value(alpha: Fraction) -> str:
    return window_mean(alpha, "n", "0")


def bound_stability(width_of_k, step: int, beta: float, cap: int) -> str:
    """D = min{u ≥ 0: W_{(u+1)K} > β} (capped): sensitivity 1 in units; D ≥ 1 ⟹ W_K ≤ β, so every
    unit neighbour's statistic is within β (docs/PTR.md, Lemma P2)."""
    return first_failure(f"{width_of_k(f'(__dp_u + 1) * {step}')} > {float(beta)!r}", cap)


def proposal_sql(groups_sql: str, width_of_k, value_sql: str, step: int, beta: float, test: NoisyTest,
                 release: LaplaceMechanism, runs: int = 1) -> str:
    """One PTR function: the statistics once (D, the statistic), then the noisy test and the noisy
    release; ``branch`` 1 iff D + Z ≥ T, ``value`` = statistic + Laplace noise (bucket units),
    NULL for ⊥."""
    stats_sql = (f"SELECT {bound_stability(width_of_k, step, beta, test.cap)} AS __dp_d, {value_sql} AS __dp_x\n"
                 f"FROM (\n{_indent(sorted_rows_sql(groups_sql))}\n)")
    src, row = _noise_from(stats_sql, runs)
    inner = f"SELECT {test.sql(f'__dp_d{row}')} AS __dp_t1, {release.sql(f'__dp_x{row}')} AS __dp_v1\n{src}"
    return with_settings("SELECT toUInt8(__dp_t1) AS branch, if(__dp_t1 = 1, toNullable(__dp_v1), NULL) AS value\n"
                         f"FROM (\n{_indent(inner)}\n)")
