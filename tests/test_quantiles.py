"""Quantiles (issue 15): the kernel's permute-and-flip over a sparse histogram
(dpch._noise.quantile_buckets, the UDF `dpch-udf quantiles`), its reference
dpch.mechanisms.QuantileMechanism, and the SQL functions dp_quantile / dp_quantiles / dp_median.

Exact checks: the reference's joint distribution is built from ExponentialMechanism.probabilities
(itself checked against brute force over all visiting orders in test_exponential_mechanism.py); the
kernel's draws are compared with it by Pearson χ² and the privacy loss is computed exactly on
neighbouring histograms.

Non-flakiness is stated at each statistical check.
"""
from __future__ import annotations

import math
import re
import struct
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

from dpch import _noise
from dpch.errors import BackendError, InvalidParameter
from dpch.mechanisms import QUANTILE_BUCKETS, QuantileMechanism


def _sparse(counts):
    keys = [i for i, c in enumerate(counts) if c]
    return keys, [counts[i] for i in keys]


def _chi2_ok(draws: list[tuple], probs: dict[tuple, float], quantile: float) -> tuple[float, float]:
    n = len(draws)
    observed: dict[tuple, int] = {}
    for d in draws:
        observed[d] = observed.get(d, 0) + 1
    assert set(observed) <= set(probs), "the kernel drew an outcome of probability 0"
    cells = sorted(probs, key=probs.get, reverse=True)
    obs, exp_ = [], []
    pooled_o = pooled_e = 0.0
    for c in cells:
        e = probs[c] * n
        if e >= 20:
            obs.append(observed.get(c, 0))
            exp_.append(e)
        else:
            pooled_o += observed.get(c, 0)
            pooled_e += e
    if pooled_e > 0:
        obs.append(pooled_o)
        exp_.append(pooled_e)
    o, e = np.array(obs), np.array(exp_)
    return float(((o - e) ** 2 / e).sum()), float(stats.chi2.isf(quantile, len(o) - 1))


CASES = [
    ([0, 5, 0, 10, 0, 0, 5, 0], [0.5], 1.0, 1),
    ([3, 1, 0, 0, 2, 4, 0, 1], [0.9], 0.5, 1),
    ([0, 2, 2, 0, 1, 3, 0, 0], [0.25, 0.75], 1.0, 1),
    ([1, 0, 4, 0, 0, 2, 2, 1], [0.1, 0.5, 0.9], 2.0, 2),
    ([0, 0, 0, 0, 0, 0], [0.5], 1.0, 1),   # empty histogram: uniform over the grid
    ([0, 7, 0, 0, 0, 0], [0.0, 1.0], 1.0, 1),  # MIN/MAX levels
    # two distinct levels (independent releases, then sorted), given out of order and repeated;
    # close levels at a small ε, so the unsorted pair would be out of order often
    ([1, 1, 0, 2, 1, 0, 1, 1], [0.6, 0.4, 0.6], 0.5, 1),
]


@pytest.mark.parametrize("counts,alphas,eps,rows", CASES)
def test_kernel_matches_the_exact_joint_distribution(counts, alphas, eps, rows):
    """60 000 kernel releases (20 000 for one level) vs the reference's exact joint distribution,
    cells with expectation < 20 pooled. Threshold: the χ² quantile at 1e-7 (seven cases: < 1e-6 per
    run for a correct kernel). A kernel that ignored the sub-problems' data ranges or the joint ε
    split moves the top cells by several percent: χ² in the hundreds. One level has no
    sub-problems; there a calibration error (ε doubled or halved, rows per unit off by one) gives a
    noncentral χ² with λ ≥ 213 at 20 000 draws and passes the threshold with probability < 1e-17
    (computed from the two exact laws; the empty histogram is uniform whatever the calibration, and
    a non-uniform draw there is a gross error)."""
    m = QuantileMechanism(eps, rows)
    probs = m.probabilities(counts, alphas)
    assert math.isclose(sum(probs.values()), 1.0, rel_tol=1e-9)
    keys, vals = _sparse(counts)
    n = 20_000 if len(set(alphas)) == 1 else 60_000  # a release costs ≈ 0.05 ms
    draws = [tuple(d) for d in m.sample(keys, vals, len(counts), alphas, n)]
    chi2, limit = _chi2_ok(draws, probs, 1e-7)
    assert chi2 < limit, (chi2, limit)


def _neighbours(counts, rows):
    """Histograms with up to `rows` rows added to or removed from one bucket."""
    for i in range(len(counts)):
        for d in range(1, rows + 1):
            up = list(counts)
            up[i] += d
            yield up
            if counts[i] >= d:
                down = list(counts)
                down[i] -= d
                yield down


@pytest.mark.parametrize("alphas,eps,rows", [([0.5], 1.0, 1), ([0.3], 0.7, 1), ([0.2, 0.8], 1.0, 1),
                                             ([0.1, 0.5, 0.9], 1.5, 1), ([0.5], 1.0, 3),
                                             ([0.0], 1.0, 1)])
def test_privacy_loss_is_at_most_epsilon_exactly(alphas, eps, rows):
    """Every joint outcome's probability ratio between neighbouring histograms (one privacy unit's
    ≤ rows rows added or removed; all rows of a unit in one bucket is the worst case for the
    score's sensitivity) is at most e^ε, computed exactly; and the worst one is above e^(ε/8), so
    the check is not vacuous."""
    rng = np.random.default_rng(11)  # test inputs only
    m = QuantileMechanism(eps, rows)
    worst = 0.0
    hists = [[0, 3, 0, 0, 1, 0], [0, 0, 0, 0, 0, 0]] + [list(rng.integers(0, 4, size=6)) for _ in range(6)]
    for counts in hists:
        p = m.probabilities(counts, alphas)
        for other in _neighbours(counts, rows):
            q = m.probabilities(other, alphas)
            for key in set(p) | set(q):
                a, b = p.get(key, 0.0), q.get(key, 0.0)
                assert a > 0 and b > 0
                worst = max(worst, abs(math.log(a / b)))
    assert worst <= eps * (1 + 1e-9), worst
    assert worst > eps / 8, worst


def test_levels_rounding_and_bad_arguments():
    assert QuantileMechanism.level(0.5) == 2 ** 19
    assert QuantileMechanism.level(1.0) == 2 ** 20
    with pytest.raises(InvalidParameter):
        QuantileMechanism.level(1.5)
    with pytest.raises(InvalidParameter):
        QuantileMechanism(0.0)
    with pytest.raises(InvalidParameter):
        QuantileMechanism(1.0, rows=0)
    for args, problem in [(([2, 1], [1, 1], 8, [0.5], 1.0), "strictly ascending"),
                          (([9], [1], 8, [0.5], 1.0), "outside the grid"),
                          (([1], [1], 8, [1.5], 1.0), "in [0, 1]"),
                          (([1], [1], 8, [], 1.0), "at least one"),
                          (([1], [1], 8, [0.5], 0.0), "epsilon"),
                          (([1], [2 ** 43], 8, [0.5], 1.0), "2^42"),
                          (([1], [1, 2], 8, [0.5], 1.0), "same length")]:
        with pytest.raises(ValueError, match=re.escape(problem)):
            _noise.quantile_buckets(*args)


#: A chosen candidate's score gap exceeds T (ln B + t) with probability at most B e^-(ln B + t)
#: = e^-t (union bound: permute-and-flip returns r only if r's coin, of probability e^-gap/T,
#: comes up). With t = ln 1e8 every such bound below fails with probability <= 1e-8 per draw.
TAIL = math.log(QUANTILE_BUCKETS) + math.log(1e8)


def rank_bound(alpha: float, eps: float) -> float:
    """|(1-α) L - α G| of the released bucket minus the best one's, in rows, at the tail above:
    the score is Q·|(1-α) L - α G| and T = 2 Q max(α, 1-α) / ε."""
    return 2 * max(alpha, 1 - alpha) / eps * TAIL


def test_large_grid_accuracy_of_the_kernel():
    """98 304 rows, three in every other bucket of the 2^16 grid, median at ε = 1: the best bucket
    has |L - G| <= 3, so a release has |L - G| <= 3 + 2 · rank_bound(0.5, 1) ≈ 62 (score
    Q/2 · |L - G|), failing with probability <= 1e-8 per draw (20 draws)."""
    counts = np.zeros(QUANTILE_BUCKETS, dtype=np.int64)
    counts[::2] = 3
    keys = np.nonzero(counts)[0]
    for (b,) in QuantileMechanism(1.0).sample(keys, counts[keys], QUANTILE_BUCKETS, [0.5], 20):
        below, above = int(counts[:b].sum()), int(counts[b + 1:].sum())
        assert abs(below - above) <= 3 + 2 * rank_bound(0.5, 1.0), (b, below, above)


# ------------------------------------------------------------------------------------------------
# the UDF program
# ------------------------------------------------------------------------------------------------

def _leb(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _row(keys, counts, buckets, levels, eps, rows) -> bytes:
    return (_leb(len(keys)) + b"".join(struct.pack("<I", k) for k in keys)
            + _leb(len(counts)) + b"".join(struct.pack("<Q", c) for c in counts)
            + struct.pack("<I", buckets) + _leb(len(levels))
            + b"".join(struct.pack("<d", x) for x in levels) + struct.pack("<dQ", eps, rows))


def _run(payload: bytes):
    return subprocess.run([sys.executable, "-m", "dpch.udf_entry", "quantiles"], input=payload,
                          capture_output=True, timeout=60)


def test_udf_program_answers_rows_in_order():
    """Row 1 has 1 000 rows in bucket 5 at ε = 50: another bucket has score gap >= Q/2 · 1000 at
    T = Q/50, accepted with probability <= 7 e^-25 000; row 2 is empty (any of 16 buckets); row 3
    asks the levels 0 and 1 of 500 + 500 rows in buckets 0 and 7 at ε = 50 (gaps >= 500 Q / 2 at
    T = 2 Q · 2 / 50: e^-6 250 for any other bucket)."""
    payload = b"3\n" + _row([5], [1000], 8, [0.5], 50.0, 1) + _row([], [], 16, [0.5], 1.0, 1) \
        + _row([0, 7], [500, 500], 8, [0.0, 1.0], 50.0, 1)
    p = _run(payload)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert out[:5] == b"\x01" + struct.pack("<I", 5)
    assert out[5] == 1 and struct.unpack("<I", out[6:10])[0] < 16
    assert out[10] == 2
    lo, hi = struct.unpack("<II", out[11:19])
    assert lo == 0 and hi == 7
    assert len(out) == 19


@pytest.mark.parametrize("row,problem", [
    (_row([3, 1], [1, 1], 8, [0.5], 1.0, 1), b"strictly ascending"),
    (_row([1], [1], 8, [float("nan")], 1.0, 1), b"in [0, 1]"),
    (_row([1], [1], 8, [0.5], float("inf"), 1), b"epsilon"),
    (_row([1], [1], 8, [0.5], 1.0, 0), b"rows per unit"),
    (_row([1], [1], 0, [0.5], 1.0, 1), b"buckets"),
])
def test_udf_program_bad_rows_exit_2_without_output(row, problem):
    p = _run(b"1\n" + row)
    assert p.returncode == 2 and p.stdout == b""
    assert problem in p.stderr and b"row 0 of block" in p.stderr


def test_udf_program_truncated_row_exits_3():
    p = _run(b"1\n" + _row([1, 2], [1, 1], 8, [0.5], 1.0, 1)[:-3])
    assert p.returncode == 3 and p.stdout == b""


# ------------------------------------------------------------------------------------------------
# the SQL functions
# ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def qdb(db):
    db.command("CREATE DATABASE IF NOT EXISTS t_quant")
    db.command("DROP TABLE IF EXISTS t_quant.v")
    db.command("CREATE TABLE t_quant.v (g UInt8, x Nullable(Float64)) ENGINE = MergeTree ORDER BY g")
    # g = 0: 0 .. 99 999; g = 1: values 0 .. 9 999 plus NULLs and NaNs (ignored)
    db.command("INSERT INTO t_quant.v SELECT 0, number FROM numbers(100000)")
    db.command("INSERT INTO t_quant.v SELECT 1, number FROM numbers(10000)")
    db.command("INSERT INTO t_quant.v SELECT 1, if(number % 2 = 0, NULL, nan) FROM numbers(5000)")
    return db


def test_dp_median_and_quantiles_are_accurate_at_scale(qdb):
    """Group 0: the 100 000 values 0..99 999 on [0, 100 000] (one value per row, 1 or 2 rows per
    bucket of width 1.53); group 1: 10 000 values plus 5 000 NULL/NaN rows, which are ignored
    (counted, they would move its median by 2 500). With n rows, (1-α) L - α G = L - α n + O(1),
    so the rank error is at most rank_bound + 2 rows, i.e. that many values plus a bucket width
    (each bound fails with probability <= 1e-8). dp_quantiles spends ε/2 per depth (3 levels,
    depth 2); a lower level's error adds its relative level times the middle level's: bounded
    here by the sum of both levels' bounds at ε/2."""
    df = qdb.raw_query(
        "SELECT g, dp_median(x, 0, 100000, 1.0) AS m, dp_quantile(x, 0.9, 0, 100000, 1.0) AS p90, "
        "dp_quantiles(x, [0.1, 0.5, 0.99], 0, 100000, 1.0) AS qs FROM t_quant.v GROUP BY g ORDER BY g")
    slack = 2 + 1.53
    m0, m1 = df["m"]
    assert abs(m0 - 50_000) <= rank_bound(0.5, 1.0) + slack
    assert abs(m1 - 5_000) <= rank_bound(0.5, 1.0) + slack
    assert abs(df["p90"][0] - 90_000) <= rank_bound(0.9, 1.0) + slack
    qs = list(df["qs"][0])
    middle = rank_bound(0.5, 0.5)
    for got, want, rel in zip(qs, [10_000, 50_000, 99_000], [0.2, 0.5, 0.98]):
        bound = middle + (rank_bound(rel, 0.5) if rel != 0.5 else 0) + 2 * slack
        assert abs(got - want) <= bound, (qs, bound)


def test_output_always_in_bounds_and_edge_cases(qdb):
    df = qdb.raw_query(
        "SELECT dp_median(x, 200000, 300000, 1.0) AS above, dp_median(x, -10, -5, 1.0) AS below, "
        "dp_median(x, 7, 7, 1.0) AS point, dp_quantiles(x, [0, 1], 0, 100000, 1.0) AS ends "
        "FROM t_quant.v")
    assert 200_000 <= df["above"][0] <= 300_000 and -10 <= df["below"][0] <= -5
    assert df["point"][0] == 7
    lo, hi = df["ends"][0]
    assert 0 <= lo <= hi <= 100_000
    empty = qdb.raw_query("SELECT dp_median(x, 0, 10, 1.0) AS m FROM t_quant.v WHERE g = 7")
    assert 0 <= empty["m"][0] <= 10


@pytest.mark.parametrize("call,message", [
    ("dp_median(x, 0, 10, 0)", "dp_median: argument eps"),
    ("dp_quantile(x, 1.5, 0, 10, 1)", "dp_quantile: argument q"),
    ("dp_quantile(x, toFloat64(g) / 2, 0, 10, 1)", "dp_quantile: argument q must be a constant"),
    ("dp_quantiles(x, [0.2, nan], 0, 10, 1)", "dp_quantiles: argument q"),
    ("dp_quantiles(x, [], 0, 10, 1)", "dp_quantiles: argument q"),
    ("dp_median(x, 10, 0, 1)", "dp_median: arguments lo, hi"),
    ("dp_median(toString(x), 0, 10, 1)", "dp_median: argument x must be numeric"),
    ("dp_quantile(x, 0.5, 0, 1e299, 1)", "dp_quantile: argument hi is out of range"),
])
def test_bad_arguments_name_the_parameter_before_any_row_is_read(qdb, call, message):
    """The checks are constants, so the query fails the same way on an empty selection."""
    for where in ("", " WHERE 0"):
        with pytest.raises(BackendError, match=message):
            qdb.raw_query(f"SELECT {call} FROM t_quant.v{where}")
