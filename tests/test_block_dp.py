"""Block-DP I and II (thesis §5.4, corrected; dpch.mechanisms.block, dpch.block_dp, ``db.block_dp``).

What is measured:
- the privacy relations against independent computations: blocks touched for (M, m, neighbour);
  ε = touched·(w + r)/b recomputed in exact rationals from the kernel's grid; Block-DP II's
  Δg = c·Λ0/m (+ the stated float term); the noise variance of Example 5.4.5 (8/m·(Λ/(mε))² for
  the thesis's scale 2Λ/(mε), which is ours for two touched blocks);
- a brute force over every small dataset (≤ 3 units of ≤ M rows on an 11-point value grid, m = 2
  and 4): the L1 distance of the block-statistic vectors (Block-DP I) and of the averages (II)
  over every add/remove and substitute neighbour, computed by an independent Python reference,
  is ≤ the mechanism's sensitivity, and within one grid step per touched block of it (the bound
  is tight up to the half-open block boundary); the thesis's one-block claim fails under
  substitution (distance > w);
- the ClickHouse query (noise off, TESTS ONLY path) agrees with the Python reference on a table,
  and on D/D′ pairs built to be worst cases (one unit's M rows spread over M blocks; a unit added
  to a Block-DP II block) the distance is ≤ the sensitivity and > the per-row (thesis) value;
- the ledger: one charge of ε per release; bad parameters and refused budgets charge nothing;
- the noise interval's coverage (statistical, see the test's docstring).
The D/D′ attack cases are in tests/attacks/test_attack_block_dp.py; the audit in
tests/test_audit_block_dp.py.
"""
from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from dpch import calibration as cal
from dpch.block_dp import block_mechanism, block_sql
from dpch.errors import BudgetExceeded, InvalidParameter, QueryRejected
from dpch.mechanisms.block import (BlockDP1Mechanism, BlockDP2Mechanism, blocks_touched, dlap_mean_halfwidth,
                                   gamma_difference_tail, laplace_sum_quantile)

DB = "blockdp_t"
T = f"{DB}.t"  # user level, M = 3, x in [0, 100]
ROWS = f"{DB}.rows"  # row level
SPARSE = f"{DB}.sparse"  # user level, M = 3, one row per value block


# ------------------------------------------------------------------------------------------------
# Independent Python reference (not the SQL, not the mechanism classes)
# ------------------------------------------------------------------------------------------------
def ref_block1(values, lo, hi, m, statistic):
    """Alg. 5.4.1 with the corrections: block i = [lo + i·w, lo + (i+1)·w) (last closed), the
    statistic clamped to the block, the midpoint if empty. quantileExact(0.5) = the element at
    index ⌊n/2⌋ of the sorted values."""
    w = (hi - lo) / m
    out = []
    for i in range(m):
        a, b = lo + i * w, lo + (i + 1) * w
        xs = sorted(v for v in values if min(m - 1, math.floor((v - lo) / w)) == i)
        if not xs:
            out.append((a + b) / 2)
            continue
        s = sum(xs) / len(xs) if statistic == "mean" else xs[len(xs) // 2]
        out.append(min(max(s, a), b))
    return out


def ref_block2(units, lo, hi, m, statistic, block_of):
    """Alg. 5.4.6 with blocks by unit: the average of the m block statistics clamped to [lo, hi]."""
    per = [[] for _ in range(m)]
    for u, vals in units.items():
        per[block_of(u)].extend(vals)
    tot = 0.0
    for xs in per:
        xs = sorted(xs)
        if not xs:
            s = (lo + hi) / 2
        else:
            s = sum(xs) / len(xs) if statistic == "mean" else xs[len(xs) // 2]
        tot += min(max(s, lo), hi)
    return tot / m


# ------------------------------------------------------------------------------------------------
# Relations
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("M,m,neighbour,expected", [(1, 10, "add_remove", 1), (1, 10, "substitute", 2),
                                                    (3, 10, "add_remove", 3), (3, 10, "substitute", 6),
                                                    (20, 10, "add_remove", 10), (6, 10, "substitute", 10),
                                                    (5, 1, "add_remove", 1)])
def test_blocks_touched(M, m, neighbour, expected):
    assert blocks_touched(m, M, neighbour) == expected


@pytest.mark.parametrize("M,m,neighbour,eps", [(1, 10, "add_remove", 1.0), (3, 20, "substitute", 0.3),
                                               (10, 5, "add_remove", 2.0)])
def test_block1_relation_independent(M, m, neighbour, eps):
    mech = BlockDP1Mechanism.calibrated(0.0, 100.0, m, M, neighbour, "median", eps)
    t = min(M * (2 if neighbour == "substitute" else 1), m)
    w = Fraction(100, m)
    # the kernel's grid for this scale, recomputed: r = 2^(ceil(log2 b) − 40)
    r = Fraction(2) ** (math.ceil(math.log2(mech.scale)) - 40)
    assert mech.laplace.granularity == float(r)
    assert t * (w + r) <= Fraction(eps) * Fraction(mech.scale)  # ε-DP
    assert mech.scale <= float(t * w / Fraction(eps)) * (1 + 1e-9)  # and not much more noise than needed
    assert mech.privacy_relation(eps) and not mech.privacy_relation(eps * (1 - 1e-6))
    assert mech.sensitivity == float(t * w)
    c = mech.cost(eps, "x")
    assert c.kind == "laplace" and c.epsilon == eps and c.sensitivity / c.scale <= eps * (1 + 1e-15)


@pytest.mark.parametrize("neighbour,c", [("add_remove", 1), ("substitute", 2)])
def test_block2_relation_independent(neighbour, c):
    lo, hi, m, eps = -50.0, 150.0, 8, 0.5
    mech = BlockDP2Mechanism.calibrated(lo, hi, m, neighbour, "mean", eps)
    core = Fraction(c) * Fraction(hi - lo) / m
    term = Fraction(2 * m) * Fraction(2.0 ** -52) * Fraction(hi - lo) + 2 * Fraction(2.0 ** -52) * 150
    assert Fraction(mech.sensitivity) >= core + term and mech.sensitivity <= float(core) * (1 + 1e-12)
    r = Fraction(mech.laplace.granularity)
    assert Fraction(mech.sensitivity) + r <= Fraction(eps) * Fraction(mech.scale)
    assert mech.privacy_relation(eps) and not mech.privacy_relation(eps * (1 - 1e-6))


def test_thesis_example_545_variance():
    """Example 5.4.5: Var((1/m)ΣZ_i) = (8/m)(Λ/(mε))² for Z_i ~ Lap(2Λ/(mε)); our row-level
    substitution calibration touches two blocks, so b = 2w/ε = 2Λ/(mε) up to the grid slack."""
    lam, m, eps = 100.0, 10, 1.0
    mech = BlockDP1Mechanism.calibrated(0.0, lam, m, 1, "substitute", "median", eps)
    assert mech.scale == pytest.approx(2 * lam / (m * eps), rel=1e-9)
    assert mech.variance == pytest.approx(8 / m * (lam / (m * eps)) ** 2, rel=1e-6)


@pytest.mark.parametrize("kwargs,name", [
    (dict(blocks=0), "blocks"), (dict(blocks=2.5), "blocks"), (dict(blocks=True), "blocks"),
    (dict(statistic="mode"), "statistic"), (dict(neighbour="swap"), "neighbour"),
    (dict(lo=5.0, hi=5.0), "lo, hi"), (dict(lo=float("nan")), "lo, hi"), (dict(hi=1e300), "lo, hi"),
    (dict(epsilon=0.0), "epsilon"), (dict(epsilon=float("inf")), "epsilon"), (dict(max_rows=0), "max_rows")])
def test_bad_parameters_name_the_parameter(kwargs, name):
    args = dict(lo=0.0, hi=10.0, blocks=4, max_rows=2, neighbour="add_remove", statistic="mean", epsilon=1.0)
    args.update(kwargs)
    with pytest.raises(InvalidParameter, match=name):
        BlockDP1Mechanism.calibrated(**args)


# ------------------------------------------------------------------------------------------------
# Brute force on small data
# ------------------------------------------------------------------------------------------------
GRID = [v / 2 for v in range(21)]  # values 0, 0.5, ..., 10; lo = 0, hi = 10
STEP = 0.5


def _unit_multisets(max_rows):
    for k in range(1, max_rows + 1):
        yield from itertools.combinations_with_replacement(GRID, k)


@pytest.mark.parametrize("m,M", [(2, 1), (2, 2), (4, 2)])
@pytest.mark.parametrize("statistic", ["mean", "median"])
def test_block1_brute_force(m, M, statistic):
    """Every dataset of a base (rows of other units, from a fixed pool that includes one row at
    the lower edge of every block) plus one unit of ≤ M rows on the grid; neighbours: remove the
    unit (add/remove), replace it by any other unit of ≤ M rows (substitute). Max L1 distance ≤
    sensitivity, and for the median ≥ sensitivity − touched·(grid step): tight up to the half-open
    block edge."""
    lo, hi = 0.0, 10.0
    bases = [(), (0.0,), (10.0,), (2.0, 7.0), (4.0, 4.0, 9.0), (0.0, 5.0), (0.0, 2.5, 5.0, 7.5)]
    units = list(_unit_multisets(M))
    worst = {"add_remove": 0.0, "substitute": 0.0}
    for base in bases:
        b0 = ref_block1(list(base), lo, hi, m, statistic)
        with_u = {u: ref_block1(list(base) + list(u), lo, hi, m, statistic) for u in units}
        for u, v in with_u.items():
            worst["add_remove"] = max(worst["add_remove"], sum(abs(a - b) for a, b in zip(v, b0)))
        if len(units) <= 300:
            for u, v in with_u.items():
                for u2, v2 in with_u.items():
                    worst["substitute"] = max(worst["substitute"], sum(abs(a - b) for a, b in zip(v, v2)))
    for nb, got in worst.items():
        mech = BlockDP1Mechanism.calibrated(lo, hi, m, M, nb, statistic, 1.0)
        if nb == "substitute" and len(units) > 300:
            continue
        assert got <= mech.sensitivity + 1e-12, (nb, got, mech.sensitivity)
        if statistic == "median":  # the bound is tight up to the half-open block edge
            assert got >= mech.sensitivity - mech.touched * 1.0 - 1e-12, (nb, got, mech.sensitivity)
    # the thesis's claim (one block changes, Δ = w) is false under substitution for the median
    if statistic == "median":
        assert worst["substitute"] > (hi - lo) / m


@pytest.mark.parametrize("statistic", ["mean", "median"])
def test_block2_brute_force(statistic):
    """Units 0..2 in m = 2 blocks (block = unit mod 2); the new unit 3 (block 1) or, under
    substitution, any unit replaced by a unit with any id. Distance of the averages ≤ Δg."""
    lo, hi, m = 0.0, 10.0, 2
    unit_sets = list(_unit_multisets(2))
    base_units = [{}, {0: (3.0,)}, {0: (1.0, 9.0), 1: (5.0,)}, {1: (0.0, 0.0), 2: (10.0,)}]
    worst = {"add_remove": 0.0, "substitute": 0.0}
    for base in base_units:
        g0 = ref_block2(base, lo, hi, m, statistic, lambda u: u % m)
        for vals in unit_sets:
            d = dict(base)
            d[3] = vals
            g1 = ref_block2(d, lo, hi, m, statistic, lambda u: u % m)
            worst["add_remove"] = max(worst["add_remove"], abs(g1 - g0))
            for vals2 in unit_sets[::7]:
                d2 = dict(base)
                d2[4] = vals2  # the replacement is another unit: it may hash elsewhere
                g2 = ref_block2(d2, lo, hi, m, statistic, lambda u: u % m)
                worst["substitute"] = max(worst["substitute"], abs(g1 - g2))
    for nb, got in worst.items():
        mech = BlockDP2Mechanism.calibrated(lo, hi, m, nb, statistic, 1.0)
        assert got <= mech.sensitivity, (nb, got)
    assert worst["add_remove"] == pytest.approx((hi - lo) / m / 2 if statistic == "mean" else (hi - lo) / m)
    assert worst["substitute"] > (hi - lo) / m  # Thm 5.4.7's Λ0/m fails under substitution


# ------------------------------------------------------------------------------------------------
# ClickHouse
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bdb(db):
    db.command(f"CREATE DATABASE IF NOT EXISTS {DB}")
    for t in (T, f"{T}_minus", f"{T}_plus", ROWS, SPARSE, f"{SPARSE}_plus"):
        db.command(f"DROP TABLE IF EXISTS {t}")
        db.command(f"CREATE TABLE {t} (uid UInt64, x Nullable(Float64), s String) ENGINE = MergeTree ORDER BY uid")
    # 200 units, 1-5 rows each, values in [0, 100) spread over the blocks; one NULL and one NaN
    db.command(f"INSERT INTO {T} SELECT number % 200, if(number = 7, NULL, if(number = 11, nan, "
               f"toFloat64((number * 37) % 100) + 0.5)), 'a' FROM numbers(600)")
    db.command(f"INSERT INTO {T}_minus SELECT * FROM {T} WHERE uid != 5")
    # D+ = D plus unit 999 with 3 rows at the top of three different blocks (a worst case for I)
    db.command(f"INSERT INTO {T}_plus SELECT * FROM {T}")
    db.command(f"INSERT INTO {T}_plus VALUES (999, 99.99, 'a'), (999, 89.99, 'a'), (999, 79.99, 'a')")
    # sparse: one unit per block at its lower edge; plus: a unit with 3 rows near the top of blocks
    # 0, 1, 2 (each block median jumps by almost w: the worst case of Block-DP I, 3 blocks touched)
    db.command(f"INSERT INTO {SPARSE} SELECT number, toFloat64(number * 10), 'a' FROM numbers(10)")
    db.command(f"INSERT INTO {SPARSE}_plus SELECT * FROM {SPARSE}")
    db.command(f"INSERT INTO {SPARSE}_plus VALUES (999, 9.99, 'a'), (999, 19.99, 'a'), (999, 29.99, 'a')")
    db.command(f"INSERT INTO {ROWS} SELECT number, toFloat64(number % 100), 'a' FROM numbers(500)")
    for t in (T, f"{T}_minus", f"{T}_plus", SPARSE, f"{SPARSE}_plus"):
        db.catalog.register(t, privacy_unit="uid", bounds={"x": (0, 100)}, max_rows_per_unit=3)
        db.ledger.set_budget(db.analyst, t, epsilon=1000.0, accountant="basic")
    db.catalog.register(ROWS, bounds={"x": (0, 100)})
    db.ledger.set_budget(db.analyst, ROWS, epsilon=1000.0, accountant="basic")
    return db


def _stats(db, table, mechanism, statistic, m=10, over=None):
    """Un-noised statistics of ``table``'s rows, or of ``over``'s rows under ``table``'s catalog
    entry (its salt, so the same unit → block map: the neighbour of one dataset)."""
    e = db.catalog.get(table)
    mech = block_mechanism(e, "x", mechanism, statistic, m, 1.0)
    df = db.raw_query(block_sql(e, "x", mech, noise=False, table_sql=over))
    col = "stat" if mechanism == "block_dp_1" else "value"
    return np.asarray(df[col], dtype=float), mech


@pytest.mark.parametrize("statistic", ["mean", "median"])
def test_sql_matches_reference_row_level(bdb, statistic):
    got, _ = _stats(bdb, ROWS, "block_dp_1", statistic)
    vals = [float(v % 100) for v in range(500)]
    assert got == pytest.approx(ref_block1(vals, 0.0, 100.0, 10, statistic), abs=1e-9)


@pytest.mark.parametrize("statistic", ["mean", "median"])
def test_sql_matches_reference_block2(bdb, statistic):
    """The unit → block map is the keyed hash (read from the engine); the rest is the reference."""
    e = bdb.catalog.get(T)
    df = bdb.raw_query(f"SELECT uid, x, sipHash64Keyed({e.hash_key_sql()}, uid) % 10 AS b FROM {T} "
                       f"WHERE x IS NOT NULL")
    units, blk = {}, {}
    for u, x, b in zip(df["uid"], df["x"], df["b"]):
        v = 0.0 if math.isnan(x) else min(max(float(x), 0.0), 100.0)
        units.setdefault(int(u), []).append(v)
        blk[int(u)] = int(b)
    got, _ = _stats(bdb, T, "block_dp_2", statistic)
    assert got[0] == pytest.approx(ref_block2(units, 0.0, 100.0, 10, statistic, blk.__getitem__), abs=1e-9)


@pytest.mark.parametrize("statistic", ["mean", "median"])
@pytest.mark.parametrize("mechanism", ["block_dp_1", "block_dp_2"])
def test_sql_sensitivity_on_neighbours(bdb, mechanism, statistic):
    """D/D − unit 5, D/D + unit 999 and sparse/sparse + unit 999 (three rows near the top of
    three value blocks, each alone in its block but for one row at the lower edge): distances ≤
    the sensitivity; for Block-DP I's median the sparse pair moves 3 blocks by almost w each (3 ×
    9.99 > the one block width a per-row calibration assumes). Both sides run under D's catalog
    entry: each registration draws its own salt, and two salts would map units to blocks
    independently (not neighbours: a CI run failed on that)."""
    for a, b in ((T, f"{T}_minus"), (T, f"{T}_plus"), (SPARSE, f"{SPARSE}_plus")):
        d, mech = _stats(bdb, a, mechanism, statistic)
        o, _ = _stats(bdb, a, mechanism, statistic, over=b)
        dist = float(np.abs(d - o).sum())
        assert dist <= mech.sensitivity + 1e-9, (b, dist, mech.sensitivity)
    if mechanism == "block_dp_1" and statistic == "median":
        assert dist == pytest.approx(3 * 9.99) and dist > mech.width


def test_release_charges_once(bdb):
    before = bdb.ledger.remaining(bdb.analyst, T)
    r = bdb.block_dp(T, "x", epsilon=0.5, statistic="median", mechanism="block_dp_1", blocks=10)
    after = bdb.ledger.remaining(bdb.analyst, T)
    assert after.queries == before.queries + 1
    assert after.spent.epsilon == pytest.approx(before.spent.epsilon + 0.5)
    assert r.epsilon_spent == 0.5 and r.blocks_touched == 3 and r.ci_low < r.value < r.ci_high
    (rec,) = [c for c in bdb.ledger.history(bdb.analyst, T) if c.id == r.receipt.id]
    assert rec.outcome == "executed"


@pytest.mark.parametrize("kwargs,name,exc", [
    (dict(column="s"), "column", QueryRejected), (dict(column="nope"), "column", QueryRejected),
    (dict(column="uid"), "column", QueryRejected), (dict(blocks=0), "blocks", InvalidParameter),
    (dict(statistic="mode"), "statistic", InvalidParameter), (dict(mechanism="block_dp_3"), "mechanism", InvalidParameter),
    (dict(epsilon=-1.0), "epsilon", InvalidParameter), (dict(ci_level=1.5), "ci_level", InvalidParameter),
    (dict(dataset="nowhere.t"), "nowhere", QueryRejected), (dict(epsilon=5000.0), None, BudgetExceeded)])
def test_rejected_inputs_charge_nothing(bdb, kwargs, name, exc):
    args = dict(dataset=T, column="x", epsilon=1.0, statistic="mean", mechanism="block_dp_2", blocks=4)
    args.update(kwargs)
    before = bdb.ledger.remaining(bdb.analyst, T).queries
    with pytest.raises(exc, match=name):
        bdb.block_dp(args.pop("dataset"), args.pop("column"), **args)
    assert bdb.ledger.remaining(bdb.analyst, T).queries == before


def test_laplace_sum_quantile_closed_forms():
    """k = 1: P(|L| > s) = e^{−s}; k = 2: P(|L1 + L2| > s) = (1 + s/2)e^{−s} (the density of the sum
    of two standard Laplace variables is (1 + |x|)e^{−|x|}/4)."""
    for alpha in (0.05, 1e-3):
        assert laplace_sum_quantile(1, alpha) == pytest.approx(math.log(1 / alpha), rel=1e-12)
        s = laplace_sum_quantile(2, alpha)
        assert (1 + s / 2) * math.exp(-s) == pytest.approx(alpha, rel=1e-6)
        assert (1 + s / 2) * math.exp(-s) <= alpha
    # k = 30 against a normal approximation's ballpark (variance 2k) and a Monte Carlo check
    s30 = laplace_sum_quantile(30, 0.05)
    assert 0.9 * 1.96 * math.sqrt(60) < s30 < 1.1 * 1.96 * math.sqrt(60)


def test_gamma_difference_tail_matches_the_frozen_distribution():
    """gamma_difference_tail calls scipy.special directly; the reference here integrates
    scipy.stats.gamma(k)'s own pdf and sf (the implementation it replaced, 50x slower): the same
    tail probabilities within 1e-12 relative, from the body of the law to its far tail."""
    from scipy import integrate, stats

    for k in (2, 3, 10, 30, 200):
        g = stats.gamma(k)
        for s in (0.5, math.sqrt(k), 3 * math.sqrt(2 * k), 6 * math.sqrt(2 * k) + 20):
            ref, _ = integrate.quad(lambda y: g.pdf(y) * g.sf(s + y), g.ppf(1e-15), g.isf(1e-15), points=[float(k)],
                                    limit=200, epsabs=1e-16, epsrel=1e-10)
            assert gamma_difference_tail(s, k) == pytest.approx(min(1.0, 2.0 * (ref + 1e-15)), rel=1e-12), (k, s)


def test_noise_interval_coverage(bdb):
    """2000 replicated Block-DP I releases (one query, the same UDF): the 95% noise interval around
    the noise-free blocked statistic covers ≥ 95% of them in expectation. The test fails only if
    fewer than c covered, c chosen with P(Binomial(2000, 0.95) < c) < 1e-6 (exact binomial)."""
    e = bdb.catalog.get(T)
    mech = block_mechanism(e, "x", "block_dp_1", "median", 10, 1.0)
    truth = float(np.mean(_stats(bdb, T, "block_dp_1", "median")[0]))
    runs = np.asarray(bdb.raw_query(block_sql(e, "x", mech, replicates=2000))["value"], dtype=float)
    h = dlap_mean_halfwidth(mech.laplace, 10, 0.95)
    covered = int(np.sum(np.abs(runs - truth) <= h))
    c = int(stats.binom.ppf(1e-6, 2000, 0.95))
    assert stats.binom.cdf(c - 1, 2000, 0.95) < 1e-6
    assert covered >= c, (covered, c)
    assert len(np.unique(runs)) > 1900  # independent draws per run
    assert cal.check_level(0.95) == 0.95
