"""Private partition selection (issue 15): the optimal rule of Desfontaines et al. (PoPETs 2022,
Thm 1), the Gaussian and Laplace thresholds, the weighted Gaussian of Gopi et al. (ICML 2020) at
k > 1, the data-independent choice among them, the kernel's exact sampler
(``dpch_partition_select``) and the controller end to end (docs/CONTROLLER.md, "Partition
selection").

Independent references: the recursion of Thm 1 evaluated with ``decimal`` at 60 digits (not the
module's integer grid), its DP constraints checked in exact rationals with a lower bound of e^ε
from ``decimal`` (the constraints' right-hand sides grow with e^ε, so a lower bound is the
conservative side), and discrete Gaussian tails summed term by term in ``decimal``.

Non-flakiness. Every statistical check fails a correct implementation with probability below
1e-7 (each stated at the check; exact binomial or chi-square tails from scipy), and the module has
fewer than ten of them: below 1e-6 per run in total.
"""
from __future__ import annotations

import decimal
import json
import math
import struct
from fractions import Fraction

import pytest
from scipy.stats import binom, chi2

from dpch.errors import InvalidParameter
from dpch.partition_selection import (MAX_TABLE, ONE, exp_lower, optimal_table, per_group_delta,
                                      per_group_epsilon)
from dpch.plan.selection import (WEIGHT_MAX_BITS, WEIGHT_MIN_BITS, choose_selection, dg_tail_upper, laplace_rule,
                                 selection_release_probability, unit_weight, unit_weight_sql, weighted_rule)

CASES = [(1.0, 1e-6), (0.5, 1e-3), (0.1, 1e-9), (2.0, 1e-10), (5.0, 0.01), (0.05, 1e-5), (20.0, 1e-6)]
D = decimal.Context(prec=60)


def _exp_dec(x: float) -> decimal.Decimal:
    return D.exp(decimal.Decimal(x))


def _pi_reference(eps: float, delta: float, nmax: int) -> list[decimal.Decimal]:
    """Thm 1's recursion at 60 digits: π(0) = 0, π(n) = min(e^ε π(n−1) + δ, 1 − e^−ε(1 − π(n−1) − δ), 1)."""
    e = _exp_dec(eps)
    d = decimal.Decimal(delta)
    out = [decimal.Decimal(0)]
    for _ in range(nmax):
        p = out[-1]
        out.append(min(D.add(D.multiply(e, p), d), D.subtract(1, D.divide(D.subtract(D.subtract(1, p), d), e)),
                       decimal.Decimal(1)))
    return out


def _e_lower(eps: float) -> Fraction:
    """A rational lower bound of e^ε: decimal's exp is correctly rounded (half-even) at 60 digits."""
    return Fraction(_exp_dec(eps)) * (1 - Fraction(1, 10 ** 55))


# ------------------------------------------------------------------------------------------------
# The optimal rule: the table against Thm 1
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("eps,delta", CASES)
def test_optimal_table_is_theorem_1_up_to_rounding(eps, delta):
    """π̃(n) <= π(n) everywhere (never a larger release probability than Thm 1 allows) and within
    2^-29 relative of it where π(n) >= 1e-12 (the δ slack 2^-30 plus the grid): the table is Thm 1."""
    t = optimal_table(eps, delta)
    ref = _pi_reference(eps, delta, t.size + 2)
    for n in range(0, t.size + 2):
        got = Fraction(t.release_probability(n))
        want = Fraction(ref[n])
        assert got <= want * (1 + Fraction(1, 10 ** 40)) + Fraction(1, 10 ** 45), (n, float(got), float(want))
        if want >= Fraction(1, 10 ** 12):
            assert got >= want * (1 - Fraction(1, 2 ** 29)) - Fraction(1, 2 ** 100), (n, float(got), float(want))
    assert ref[t.size] == 1 and ref[t.size - 1] < 1  # certain release from the same n as Thm 1


@pytest.mark.parametrize("eps,delta", [(1.0, 1e-6), (0.5, 1e-3), (2.0, 1e-10)])
def test_optimal_table_closed_form_below_the_crossover(eps, delta):
    """Thm 1's closed form before the first crossover: π(n) = δ (e^(nε) − 1)/(e^ε − 1)."""
    t = optimal_table(eps, delta)
    for n in range(1, t.size):
        closed = delta * math.expm1(n * eps) / math.expm1(eps)
        if closed >= 0.5 * (1 - math.exp(-eps)):  # safely before the crossover
            break
        assert float(t.release_probability(n)) == pytest.approx(closed, rel=1e-8)


@pytest.mark.parametrize("eps,delta", CASES)
def test_optimal_table_satisfies_the_dp_constraints_exactly(eps, delta):
    """Brute force over the first few hundred n, in exact rationals with e^ε bounded below
    independently: π(n) <= e^ε π(n−1) + δ and 1 − π(n−1) <= e^ε (1 − π(n)) + δ, π non-decreasing
    (so the mirrored constraints hold), π(0) = 0; and each step is tight: π̃(n) is the recursion's
    value from π̃(n−1) up to the 2^-30 δ slack and the grid."""
    t = optimal_table(eps, delta)
    e = _e_lower(eps)
    dl = Fraction(delta)
    prev = Fraction(0)
    assert t.release_probability(0) == 0
    for n in range(1, min(t.size, 400) + 1):
        p = t.release_probability(n)
        assert p >= prev
        assert p <= e * prev + dl
        assert 1 - prev <= e * (1 - p) + dl
        best = min(e * prev + dl, 1 - (1 - prev - dl) / e, Fraction(1))
        assert p >= best - dl * Fraction(1, 2 ** 29) - Fraction(4, ONE), (n, float(p), float(best))
        prev = p


@pytest.mark.parametrize("eps,delta", CASES)
def test_released_count_is_eps_delta_dp(eps, delta):
    """The released count n + Z against n + 1 + Z (both directions): hockey-stick divergence <= δ,
    from the exact law of Z (so COUNT(DISTINCT unit) may reuse the selection's noisy count)."""
    t = optimal_table(eps, delta)
    pmf = t.noise_pmf()
    assert sum(pmf.values()) == 1
    e = _e_lower(eps)
    zs = range(min(pmf) - 1, max(pmf) + 2)
    div_up = sum(max(Fraction(0), pmf.get(z, 0) - e * pmf.get(z - 1, 0)) for z in zs)
    div_down = sum(max(Fraction(0), pmf.get(z - 1, 0) - e * pmf.get(z, 0)) for z in zs)
    assert div_up <= Fraction(delta) and div_down <= Fraction(delta)
    # release iff n + Z >= t: the same probabilities as the table
    for n in (0, 1, 2, t.size // 2, t.size):
        assert sum(p for z, p in pmf.items() if n + z >= t.offset) == t.release_probability(n)


def test_optimal_dominates_laplace_pointwise():
    """Thm 1 is the pointwise largest release probability among (ε₀, δ₀)-DP rules; the per-group
    Laplace threshold is one of them (b = c/ε gives ε₀ = 1/b per group), so π(n) >= its p(n)."""
    for c in (1, 2, 5, 10):
        eps, delta = 1.0, 1e-6
        opt = choose_selection(eps, delta, c, "optimal")
        lap = laplace_rule(eps, delta, c)
        for n in range(1, lap.threshold + 40):
            assert opt.release_probability(n) >= lap.release_probability(n) - 1e-12, (c, n)


def test_per_group_parameters_compose_exactly():
    for eps, delta in CASES:
        for c in (1, 2, 3, 5, 10, 64, 65, 1000):
            e0, d0 = per_group_epsilon(eps, c), per_group_delta(delta, c)
            assert Fraction(e0) * c <= Fraction(eps)
            if c <= 64:  # Kairouz, Oh & Viswanath Thm 3.3 (i = 0)
                assert 1 - (1 - Fraction(d0)) ** c <= Fraction(delta)
            else:
                assert Fraction(d0) * c <= Fraction(delta)
            assert d0 >= delta / c * (1 - 1e-12)


def test_exp_lower_is_a_tight_lower_bound():
    for x in (0.0, 1e-9, 0.1, 1.0, 3.7, 20.0, 700.0):
        r = exp_lower(Fraction(x))
        ref = Fraction(_exp_dec(x))
        assert r <= ref * (1 + Fraction(1, 10 ** 55))
        assert r >= ref * (1 - Fraction(1, 2 ** 70))


def test_optimal_table_refuses_what_it_cannot_do():
    for eps, delta in [(0.0, 1e-6), (float("nan"), 1e-6), (1.0, 0.0), (1.0, 1.0), (1.0, 1e-40)]:
        with pytest.raises(ValueError):
            optimal_table(eps, delta)
    with pytest.raises(ValueError, match="too small"):
        optimal_table(1e-5, 1e-20)  # more than MAX_TABLE counts below certain release
    assert MAX_TABLE == 1 << 20


# ------------------------------------------------------------------------------------------------
# Gaussian threshold
# ------------------------------------------------------------------------------------------------

def _dg_tail_reference(t: int, tau: float) -> Fraction:
    """P[X >= t], X ~ N_Z(0, τ²), summed in decimal at 60 digits over |x| <= 60τ + 60."""
    two = D.multiply(2, D.multiply(decimal.Decimal(tau), decimal.Decimal(tau)))
    n = int(60 * tau) + 60
    w = {x: D.exp(D.divide(-decimal.Decimal(x * x), two)) for x in range(-n, n + 1)}
    total = sum(w.values(), decimal.Decimal(0))
    return Fraction(sum((v for x, v in w.items() if x >= t), decimal.Decimal(0))) / Fraction(total)


@pytest.mark.parametrize("tau", [0.7, 1.0, 2.5, 7.3, 20.0])
def test_discrete_gaussian_tail_bound_is_rigorous_and_tight(tau):
    for z in (0.5, 1.0, 2.0, 4.0, 6.0):
        t = max(1, round(z * tau))
        exact = _dg_tail_reference(t, tau)
        bound = Fraction(dg_tail_upper(t, tau))
        assert bound >= exact, (t, tau)
        if t - 0.5 >= tau and tau >= 2:  # tight where the rule uses it (σ of a few units and up)
            assert bound <= exact * Fraction(13, 10), (t, tau, float(bound / exact))


@pytest.mark.parametrize("c", [2, 5, 10])
def test_gaussian_rule_threshold_and_budget(c):
    """A count of 1 passes with probability <= δ_thr/c (so a unit's c created groups: <= δ_thr),
    σ is calibrated to (ε, δ_noise) with L2 √c, and δ_noise + δ_thr <= δ."""
    from dpch import calibration as cal
    from dpch.plan.gaussian import _rho_max

    eps, delta = 1.0, 1e-6
    g = choose_selection(eps, delta, c, "gaussian")
    assert g.rule == "gaussian" and g.coords == c
    _r, tau = cal.kernel_noise_scale(g.scale, cal.GAUSSIAN_GRID_BITS, True)
    d_thr = delta - g.noise_delta
    assert float(_dg_tail_reference(g.threshold - 1, tau)) <= d_thr / c
    assert float(_dg_tail_reference(g.threshold - 2, tau)) > d_thr / c / 2  # and not far above the least T
    assert c / (2 * g.scale ** 2) <= _rho_max(eps, g.noise_delta) * (1 + 1e-9)  # ρ = L2²/(2σ²)


def test_auto_choice_is_data_independent_and_the_best_score():
    """c = 1: the optimal rule (Thm 1 cannot be beaten). c in {2, 5, 10}: the rule with the
    smallest expected misses, computed from (ε, δ, c) only."""
    assert choose_selection(1.0, 1e-6, 1).rule == "optimal"
    for c in (2, 5, 10):
        r = choose_selection(1.0, 1e-6, c)
        assert set(r.scores) == {"optimal", "gaussian", "laplace"}
        assert r.expected_misses == min(r.scores.values())
    assert choose_selection(1.0, 1e-6, 10).rule == "gaussian"  # many groups per unit: L2 √c wins
    with pytest.raises(InvalidParameter, match="selection must be one of"):
        choose_selection(1.0, 1e-6, 1, "magic")
    with pytest.raises(InvalidParameter, match="selection='optimal'"):
        choose_selection(1e-5, 1e-20, 1, "optimal")


# ------------------------------------------------------------------------------------------------
# The kernel's sampler, statistically
# ------------------------------------------------------------------------------------------------

def _binom_ok(x: int, n: int, p: float, alpha: float) -> bool:
    """x is inside the two-sided exact binomial acceptance region of level 1 − alpha."""
    lo = binom.ppf(alpha / 2, n, p)
    hi = binom.isf(alpha / 2, n, p)
    return lo - 1 <= x <= hi + 1


def test_kernel_release_frequencies_match_pi():
    """Through dpch._noise's copy of the kernel: for each n, M = 100 000 draws; the number released
    is Binomial(M, π̃(n)) exactly. Each check fails a correct sampler with probability < 1e-8
    (exact binomial region at α = 1e-8), 8 checks: < 1e-7."""
    noise = pytest.importorskip("dpch._noise")
    eps, delta = 0.5, 0.02
    kt = noise.selection_table(eps, delta)
    t = optimal_table(eps, delta)
    assert kt.threshold == t.offset
    m = 100_000
    for n in (1, 2, 3, 4, 6, 8, 10, 12):
        p = float(t.release_probability(n))
        released = sum(v >= t.offset for v in kt.draws(n, m))
        assert _binom_ok(released, m, p, 1e-8), (n, released, m * p)
    assert all(v < t.offset for v in kt.draws(0, 50_000))  # n = 0: never (J >= 1 > 0)
    assert all(v >= t.offset for v in kt.draws(t.size, 50_000))  # π(N) = 1: always


def test_kernel_noise_law_chi_square():
    """The released count's noise n + Z − n over 300 000 draws against the exact law of Z (bins
    merged to expectation >= 20): chi-square p-value > 1e-8 for a correct sampler."""
    noise = pytest.importorskip("dpch._noise")
    eps, delta = 1.0, 1e-4
    kt = noise.selection_table(eps, delta)
    pmf = optimal_table(eps, delta).noise_pmf()
    m, n = 300_000, 50
    counts: dict[int, int] = {}
    for v in kt.draws(n, m):
        counts[v - n] = counts.get(v - n, 0) + 1
    assert set(counts) <= set(pmf)
    bins, cur_e, cur_o = [], 0.0, 0
    for z in sorted(pmf):
        cur_e += m * float(pmf[z])
        cur_o += counts.get(z, 0)
        if cur_e >= 20:
            bins.append((cur_o, cur_e))
            cur_e, cur_o = 0.0, 0
    if cur_e > 0:
        o, e = bins.pop()
        bins.append((o + cur_o, e + cur_e))
    stat = sum((o - e) ** 2 / e for o, e in bins)
    assert stat < chi2.isf(1e-8, len(bins) - 1), (stat, len(bins))


# ------------------------------------------------------------------------------------------------
# The UDF program and the engine
# ------------------------------------------------------------------------------------------------

def _rows(rows) -> bytes:
    """Rows (n, epsilon, delta[, threshold]): the threshold defaults to the table's own t."""
    full = [r if len(r) == 4 else (*r, _t_or_zero(r[1], r[2])) for r in rows]
    return f"{len(full)}\n".encode() + b"".join(struct.pack("<qddq", *r) for r in full)


def _t_or_zero(eps, delta) -> int:
    try:
        return optimal_table(eps, delta).offset
    except ValueError:
        return 0


def test_udf_program_partition_select_protocol_and_errors():
    from test_udf_protocol import out_i64, run_udf

    t = optimal_table(1.0, 1e-6)
    rows = [(0, 1.0, 1e-6)] * 5 + [(t.size + 5, 1.0, 1e-6)] * 5 + [(3, 2.0, 0.01)] * 3
    proc = run_udf("partition_select", _rows(rows[:7]) + _rows(rows[7:]))
    assert proc.returncode == 0, proc.stderr
    out = out_i64(proc)
    assert len(out) == len(rows)
    assert all(v < t.offset for v in out[:5])  # n = 0 is never released
    assert all(v >= t.offset for v in out[5:10])  # n >= N always is
    for bad, message in [((-1, 1.0, 1e-6), b"count of units is negative"),
                         ((1, float("nan"), 1e-6), b"epsilon must be"),
                         ((1, 1.0, 1.0), b"delta must be"),
                         ((1, 1.0, 1e-40), b"delta must be at least"),
                         ((1, 1e-5, 1e-20), b"too small"),
                         ((1, 1.0, 1e-6, t.offset + 1), b"threshold does not match")]:
        proc = run_udf("partition_select", _rows([(5, 1.0, 1e-6), bad]))
        assert proc.returncode == 2 and message in proc.stderr, (bad, proc.stderr)
        assert proc.stdout == b""  # nothing of the block is written


@pytest.fixture(scope="module")
def sdb(db):
    db.command("CREATE DATABASE IF NOT EXISTS t_selection")
    # 2000 units, each the only unit of 5 groups of its own; 400 units in each of the 5 big groups
    db.command("DROP TABLE IF EXISTS t_selection.multi")
    db.command("CREATE TABLE t_selection.multi (user_id UInt64, grp String) ENGINE = MergeTree ORDER BY user_id")
    db.command("INSERT INTO t_selection.multi SELECT number, concat('u', toString(number), '_', toString(i)) "
               "FROM numbers(2000) ARRAY JOIN range(5) AS i")
    db.command("INSERT INTO t_selection.multi SELECT 10000 + number, concat('big', toString(i)) "
               "FROM numbers(400) ARRAY JOIN range(5) AS i")
    db.command("DROP TABLE IF EXISTS t_selection.multi_dprime")  # D′: without the lonely units
    db.command("CREATE TABLE t_selection.multi_dprime AS t_selection.multi")
    db.command("INSERT INTO t_selection.multi_dprime SELECT * FROM t_selection.multi WHERE user_id >= 10000")
    for name in ("multi", "multi_dprime"):
        db.catalog.register(f"t_selection.{name}", privacy_unit="user_id", max_groups_contributed=5,
                            max_rows_per_unit=5)
        db.ledger.set_budget("tester", f"t_selection.{name}", epsilon=1e9, delta=0.9)
    db.command("DROP TABLE IF EXISTS t_selection.pub")
    db.command("CREATE TABLE t_selection.pub (user_id UInt64, region String) ENGINE = MergeTree ORDER BY user_id")
    db.command("INSERT INTO t_selection.pub SELECT number, ['EU', 'US'][number % 2 + 1] FROM numbers(300)")
    db.catalog.register("t_selection.pub", privacy_unit="user_id", max_groups_contributed=1, max_rows_per_unit=1,
                        public_keys={"region": ["EU", "US", "ASIA"]})
    db.ledger.set_budget("tester", "t_selection.pub", epsilon=1e9, delta=0.9)
    return db


def test_engine_udf_release_frequencies(sdb):
    """dpch_partition_select through the embedded engine (clickhouse_config/udf XML): 4 × 50 000
    groups of n = 0..3 units at (1, 0.05); each count of releases within the exact binomial
    region at α = 1e-8 (4 checks: < 1e-7)."""
    eps, delta = 1.0, 0.05
    t = optimal_table(eps, delta)
    df = sdb.raw_query(f"SELECT toInt64(number % 4) AS n, dpch_partition_select(n, {eps!r}, {delta!r}, "
                       f"{t.offset}) >= {t.offset} AS rel FROM numbers(200000)")
    for n in range(4):
        x = int(df[df["n"] == n]["rel"].sum())
        assert _binom_ok(x, 50_000, float(t.release_probability(n)), 1e-8), (n, x)


@pytest.mark.parametrize("rule", ["auto", "optimal", "laplace"])
def test_lonely_units_groups_released_at_most_at_the_claimed_rate(sdb, rule):
    """D: 2000 units that are each alone in 5 groups (k = 5) plus 5 groups of 400 units; D′ has only
    the 400-unit groups. On D′ exactly the big groups come out. On D, a lonely unit has a group
    released with probability p_u = 1 − (1 − p₁)^5 <= δ_sel, p₁ = the rule's release probability
    at count 1 (groups are independent). Over R = 2 runs (4000 unit-trials) the number X of lonely
    units with a released group is stochastically below Binomial(4000, p_u); the test fails iff
    X >= c with P[Binomial >= c] < 1e-8. The big groups are released in every run (each misses with
    probability < 1e-30 at 400 units)."""
    sql = "SELECT grp, COUNT(DISTINCT user_id) AS n FROM t_selection.{} GROUP BY grp"
    eps, delta = 1.0, 1e-3
    from dpch.controller import prepare

    sel = prepare(sdb, sql.format("multi"), epsilon=eps, delta=delta, selection=rule).plan.selection
    assert sel.new_groups == 5 and sel.delta == pytest.approx(delta)
    if rule != "auto":
        assert sel.rule_name == rule
    p1 = sel.release_probability(1)
    p_u = 1 - (1 - p1) ** 5
    assert p_u <= delta * (1 + 1e-9)
    assert sel.release_probability(400) >= 1 - 1e-12  # (floating point; the true miss probability < 1e-30)
    c = _binom_limit(4000, p_u)
    lonely_units = _lonely_units_released(sdb, sql.format("multi"), sql.format("multi_dprime"), eps, delta, rule)
    assert lonely_units < c, (lonely_units, c, p_u)


def _binom_limit(n: int, p: float) -> int:
    """The least c with P[Binomial(n, p) >= c] < 1e-8."""
    c = 0
    while binom.sf(c - 1, n, p) >= 1e-8:
        c += 1
    return c


def _lonely_units_released(db, sql_d: str, sql_dprime: str, eps: float, delta: float, rule: str) -> int:
    """Two runs on D and on D′ (D without the lonely units, whose groups are named u<id>_<i>): the
    5 big groups come out on both, every run; returns how many lonely units had a group released
    on D in all (D′ must release exactly the big groups)."""
    bigs = {f"big{i}" for i in range(5)}
    lonely_units = 0
    for _ in range(2):
        groups = set(db.query(sql_d, epsilon=eps, delta=delta, selection=rule)["grp"])
        assert bigs <= groups
        lonely_units += len({g.split("_")[0] for g in groups - bigs})
        assert set(db.query(sql_dprime, epsilon=eps, delta=delta, selection=rule)["grp"]) == bigs
    return lonely_units


def test_budget_charge_explain_and_metadata(sdb):
    """The selection's (ε, δ) share is exactly what the ledger charges (one 'threshold' cost), the
    rule is in explain and in the result metadata, and COUNT(DISTINCT unit) reuses its noisy count."""
    sql = "SELECT grp, COUNT(DISTINCT user_id) AS n FROM t_selection.multi GROUP BY grp"
    for rule in ("optimal", "gaussian", "laplace"):
        ex = sdb.explain(sql, epsilon=0.8, delta=1e-5, selection=rule)
        assert ex.selection["rule"] == rule and f"({rule} rule" in str(ex)
        assert ex.selection["source"] and ex.selection["max_new_groups_per_unit"] == 5
        assert len(ex.quantities) == 1 and ex.quantities[0]["partition_selection"]  # count shared
        df = sdb.query(sql, epsilon=0.8, delta=1e-5, selection=rule)
        meta = df.attrs["dpch"]
        assert meta["selection"]["rule"] == rule
        mech = {"optimal": "optimal_selection"}.get(rule, rule)
        assert meta["columns"]["n"]["mechanism"] == mech and meta["columns"]["n"]["shared_with_partition_selection"]
        charge = sdb.ledger.history("tester", "t_selection.multi")[-1]
        costs = json.loads(charge.cost_json)
        assert [c["kind"] for c in costs] == ["threshold"]
        assert costs[0]["epsilon"] == pytest.approx(0.8) and costs[0]["delta"] == pytest.approx(1e-5)
        assert charge.epsilon == pytest.approx(0.8) and charge.delta == pytest.approx(1e-5)
    # a second aggregate: the budget is split, the selection keeps its own share
    prepared_sql = "SELECT grp, COUNT(DISTINCT user_id) AS n, COUNT(*) AS r FROM t_selection.multi GROUP BY grp"
    ex = sdb.explain(prepared_sql, epsilon=1.0, delta=1e-5)
    assert ex.selection["epsilon"] == pytest.approx(0.5) and ex.epsilon == pytest.approx(1.0)
    assert ex.delta <= 1e-5 * (1 + 1e-12)


def test_substitute_counts_twice_the_groups(sdb):
    """Under substitute one unit moves up to 2k counts (k down, k up): every rule is calibrated for
    c = 2k (the optimal rule at ε/2k per group, the Gaussian with L2 √(2k), the Laplace threshold
    with 2k created or removed groups)."""
    sdb.command("DROP TABLE IF EXISTS t_selection.multi_sub")
    sdb.command("CREATE TABLE t_selection.multi_sub AS t_selection.multi")
    sdb.catalog.register("t_selection.multi_sub", privacy_unit="user_id", neighbour="substitute",
                         max_groups_contributed=5, max_rows_per_unit=5)
    sql = "SELECT grp, COUNT(DISTINCT user_id) AS n FROM t_selection.multi_sub GROUP BY grp"
    for rule in ("optimal", "gaussian", "laplace"):
        ex = sdb.explain(sql, epsilon=1.0, delta=1e-6, selection=rule)
        assert ex.selection["max_new_groups_per_unit"] == 10
        assert ex.selection["scores"] and ex.selection["rule"] == rule
    opt = choose_selection(1.0, 1e-6, 10, "optimal")
    assert opt.group_epsilon * 10 <= 1.0 and 1 - (1 - Fraction(opt.group_delta)) ** 10 <= Fraction(1e-6)


def test_bad_selection_option_is_rejected_and_charges_nothing(sdb):
    before = len(sdb.ledger.history("tester", "t_selection.multi"))
    with pytest.raises(InvalidParameter, match="selection must be one of"):
        sdb.query("SELECT grp, COUNT(*) FROM t_selection.multi GROUP BY grp", epsilon=1.0, delta=1e-6,
                  selection="magic")
    with pytest.raises(InvalidParameter, match="selection='optimal'"):
        sdb.query("SELECT grp, COUNT(DISTINCT user_id) FROM t_selection.multi GROUP BY grp", epsilon=1e-5,
                  delta=1e-20, selection="optimal")
    assert len(sdb.ledger.history("tester", "t_selection.multi")) == before


def test_public_keys_are_unchanged(sdb):
    """Public key domains never select: no selection, no dpch_partition_select, every public key
    released (ASIA has no rows), the count's Laplace noise and ε as before, δ = 0."""
    from dpch.controller import prepare

    sql = "SELECT region, COUNT(*) AS n FROM t_selection.pub GROUP BY region"
    p = prepare(sdb, sql, epsilon=1.0, delta=1e-6)
    assert p.plan.key_mode == "public" and p.plan.selection is None
    assert "dpch_partition_select" not in p.rewritten.sql and "dpch_laplace_int" in p.rewritten.sql
    assert [m.kind for m in p.plan.cost.mechanisms] == ["laplace"] and p.plan.cost.delta == 0.0
    df = sdb.query(sql, epsilon=1.0, delta=1e-6, selection="optimal")  # the option has nothing to select
    assert sorted(df["region"]) == ["ASIA", "EU", "US"]
    assert df.attrs["dpch"]["selection"] is None and df.attrs["dpch"]["columns"]["n"]["mechanism"] == "laplace"


def test_selection_release_probability_laplace_unchanged():
    """The Laplace rule's release probability keeps its exact formula (tests/test_controller_keys)."""
    r = laplace_rule(1.0, 1e-3, 1)
    assert r.release_probability(1) == selection_release_probability(r.scale, r.threshold, 1) <= 1e-3


# ------------------------------------------------------------------------------------------------
# The weighted Gaussian (Gopi et al., ICML 2020): k > 1 only (dpch.plan.selection's docstring)
#
# Statistical checks below: each fails a correct implementation with probability < 1e-8 (exact
# binomial tails), 3 of them: < 3e-8 for this part, so the module stays below 1e-6 in total.
# ------------------------------------------------------------------------------------------------


def test_weighted_unit_weights_have_l2_norm_at_most_s_exactly():
    """w_j is the largest integer with j·w_j² <= S²: a unit in j groups has a weight vector of L2
    norm <= S (exact integers), and no larger integer weight would keep that."""
    for bits in range(WEIGHT_MIN_BITS, WEIGHT_MAX_BITS + 1):
        s = 1 << bits
        for j in range(1, 2001):
            w = unit_weight(j, s)
            assert j * w * w <= s * s < j * (w + 1) * (w + 1), (s, j, w)
    assert unit_weight(1, 1 << 16) == 1 << 16 and unit_weight(4, 1 << 16) == 1 << 15


def test_weighted_unit_weight_sql_is_exact(sdb):
    """The engine's weight (unit_weight_sql, Float64 square root then an integer correction) equals
    the integer square root for every j = 1..20000 at S = 2^16, 2^11 and 2^6 (and 0 is mapped to 1)."""
    for bits in (16, 11, 6):
        s = 1 << bits
        df = sdb.raw_query(f"SELECT toInt64(number) AS j, {unit_weight_sql('number', s)} AS w FROM numbers(20001)")
        got = dict(zip(df["j"].astype(int), df["w"].astype(int)))
        assert got[0] == s
        bad = [j for j in range(1, 20001) if got[j] != unit_weight(j, s)]
        assert not bad, (s, bad[:5])


WEIGHTED_CASES = [(1.0, 1e-6, 5, False), (0.1, 1e-6, 10, False), (10.0, 1e-6, 5, False), (1.0, 1e-9, 3, True),
                  (2.0, 1e-3, 20, False)]


@pytest.mark.parametrize("eps,delta,k,subst", WEIGHTED_CASES)
def test_weighted_threshold_and_budget(eps, delta, k, subst):
    """σ is calibrated for L2 S (√2·S under substitute) to (ε, δ_noise) on the kernel's integer path;
    ρ makes every t = 1..k satisfy 1 − (1 − P[w_t + X >= ρ])^t <= δ_thr (exact rationals, the
    rigorous tail bound) and ρ − 1 does not; an independent computation (scipy's normal quantile,
    the continuous tail with the same ½ correction) gives ρ within ±1."""
    from scipy.stats import norm

    from dpch import calibration as cal
    from dpch.plan.gaussian import _rho_max

    coords = 2 * k if subst else k
    r = choose_selection(eps, delta, coords, "weighted_gaussian", k)
    assert r.rule == "weighted_gaussian" and r.mechanism == "gaussian" and r.groups_per_unit == k
    s = r.weight_scale
    assert s & (s - 1) == 0 and (1 << WEIGHT_MIN_BITS) <= s <= (1 << WEIGHT_MAX_BITS)
    grid, tau = cal.kernel_noise_scale(r.scale, cal.GAUSSIAN_GRID_BITS, True)
    assert grid == 1.0 and tau >= r.scale
    assert r.sensitivity == (s * math.sqrt(2.0) if subst else s)
    assert r.sensitivity ** 2 / (2 * r.scale ** 2) <= _rho_max(eps, r.noise_delta) * (1 + 1e-9)  # ρ = L2²/(2σ²)
    d_thr = Fraction(delta) - Fraction(r.noise_delta)
    assert d_thr > 0
    rho = r.threshold
    for t in range(1, k + 1):
        p = Fraction(dg_tail_upper(rho - unit_weight(t, s), tau))
        assert 1 - (1 - p) ** t <= d_thr, t
    assert any(1 - (1 - Fraction(dg_tail_upper(rho - 1 - unit_weight(t, s), tau))) ** t > d_thr
               for t in range(1, k + 1))  # the least such ρ
    ref = max(unit_weight(t, s) + math.ceil(tau * norm.isf(-math.expm1(math.log1p(-float(d_thr)) / t)) + 0.5)
              for t in range(1, k + 1))
    assert abs(ref - rho) <= 1, (ref, rho)
    assert r.group_delta <= float(d_thr) * (1 + 1e-9)


@pytest.mark.parametrize("eps,delta,k", [(2.0, 1e-6, 3), (1.0, 1e-3, 4)])
def test_weighted_lonely_unit_release_probability_exact(eps, delta, k):
    """At S = 2^6 (σ small enough for a term-by-term sum), the exact discrete-Gaussian tail at 60
    digits: a unit alone in t groups (each of weight w_t) has one of them released with probability
    1 − (1 − P[w_t + X >= ρ])^t <= δ_thr for every t = 1..k (the privacy claim's δ_thr part, exactly)."""
    from dpch import calibration as cal

    r = weighted_rule(eps, delta, k, False, max_bits=WEIGHT_MIN_BITS)
    assert r is not None and r.weight_scale == 1 << WEIGHT_MIN_BITS
    _g, tau = cal.kernel_noise_scale(r.scale, cal.GAUSSIAN_GRID_BITS, True)
    d_thr = Fraction(delta) - Fraction(r.noise_delta)
    for t in range(1, k + 1):
        exact = _dg_tail_reference(r.threshold - r.unit_weight(t), tau)
        assert 1 - (1 - exact) ** t <= d_thr, t
        # the floating-point release probability (scores, benchmark) agrees with the exact one
        assert r.release_probability_weight(r.unit_weight(t)) == pytest.approx(float(exact), rel=1e-3)


def test_weighted_equals_gaussian_shape_when_units_fill_k_groups():
    """Every unit in k groups: the weighted rule is the Gaussian threshold scaled by w_k ≈ S/√k
    (σ_w/w_k = σ_g, ρ/w_k ≈ T), so its worst-case score is within a unit of the Gaussian's at the
    budgets where ρ's max over t is at t = k; auto's choice is the smallest score, data-independent."""
    for k in (3, 5, 10):
        g = choose_selection(1.0, 1e-6, k, "gaussian")
        w = choose_selection(1.0, 1e-6, k, "weighted_gaussian", k)
        wk = w.unit_weight(k)
        assert abs(w.expected_misses - g.expected_misses) <= 1.0
        assert abs(w.threshold / wk - g.threshold) <= 2.0
        auto = choose_selection(1.0, 1e-6, k, "auto", k)
        assert set(auto.scores) == {"optimal", "gaussian", "laplace", "weighted_gaussian"}
        assert auto.expected_misses == min(auto.scores.values())
    assert choose_selection(1.0, 1e-6, 10, "auto", 10).rule == "weighted_gaussian"
    # at a large ε the lonely unit in one group (weight S) sets ρ: auto keeps the Gaussian there
    assert choose_selection(10.0, 1e-6, 10, "auto", 10).rule == "gaussian"
    with pytest.raises(InvalidParameter, match="weighted_gaussian"):
        choose_selection(1.0, 1e-6, 1, "weighted_gaussian")
    with pytest.raises(InvalidParameter, match="too small"):
        choose_selection(1e-4, 1e-12, 5, "weighted_gaussian", 5)


@pytest.fixture(scope="module")
def wdb(sdb):
    """Skewed data for the weighted rule (k = 5): ``skew``: 100 groups, each of 35 units that are in
    that one group only plus one of 20 units that are in 5 groups each (so every group has 36
    units and the same weight sum). ``lonely``: 5 groups of 400 units in all 5 of them, and units
    alone in their groups: 1000 in 1 group, 500 in 2, 400 in 5; ``lonely_dprime``: without them."""
    sdb.command("DROP TABLE IF EXISTS t_selection.skew")
    sdb.command("CREATE TABLE t_selection.skew (user_id UInt64, grp String) ENGINE = MergeTree ORDER BY user_id")
    sdb.command("INSERT INTO t_selection.skew SELECT number, concat('g', toString(number % 100)) FROM numbers(3500)")
    sdb.command("INSERT INTO t_selection.skew SELECT 100000 + intDiv(number, 5), concat('g', toString(number)) "
                "FROM numbers(100)")
    sdb.command("DROP TABLE IF EXISTS t_selection.lonely")
    sdb.command("CREATE TABLE t_selection.lonely (user_id UInt64, grp String) ENGINE = MergeTree ORDER BY user_id")
    sdb.command("INSERT INTO t_selection.lonely SELECT 10000 + number, concat('big', toString(i)) "
                "FROM numbers(400) ARRAY JOIN range(5) AS i")
    for first, count, groups in ((20000, 1000, 1), (30000, 500, 2), (40000, 400, 5)):
        sdb.command(f"INSERT INTO t_selection.lonely SELECT {first} + number, "
                    f"concat('u', toString({first} + number), '_', toString(i)) FROM numbers({count}) "
                    f"ARRAY JOIN range({groups}) AS i")
    sdb.command("DROP TABLE IF EXISTS t_selection.lonely_dprime")
    sdb.command("CREATE TABLE t_selection.lonely_dprime AS t_selection.lonely")
    sdb.command("INSERT INTO t_selection.lonely_dprime SELECT * FROM t_selection.lonely WHERE user_id < 20000")
    for name in ("skew", "lonely", "lonely_dprime"):
        sdb.catalog.register(f"t_selection.{name}", privacy_unit="user_id", max_groups_contributed=5,
                             max_rows_per_unit=5)
        sdb.ledger.set_budget("tester", f"t_selection.{name}", epsilon=1e9, delta=0.9)
    return sdb


def test_weighted_releases_more_groups_on_skewed_data(wdb):
    """100 groups of 36 units, 35 of which are in that group only: the Gaussian threshold sees 36
    units (T ≈ 56 at k = 5, ε = 1), the weighted rule 35·S + w_5 (≈ 35.4 units of one group against
    ρ ≈ 24.7 of them). One query each; the released counts are Binomial(100, p) with p the rule's
    release probability of these groups (independent groups, one CSPRNG draw each). Each count
    must lie in its exact binomial region at α = 1e-8 (2 checks), and the regions are disjoint with
    the weighted one above: the weighted rule releasing more fails with probability < 2e-8."""
    from dpch.controller import prepare

    sql = "SELECT grp FROM t_selection.skew GROUP BY grp"
    eps, delta = 1.0, 1e-6
    w = prepare(wdb, sql, epsilon=eps, delta=delta, selection="weighted_gaussian").plan.selection
    g = prepare(wdb, sql, epsilon=eps, delta=delta, selection="gaussian").plan.selection
    assert w.rule_name == "weighted_gaussian" and g.rule_name == "gaussian"
    s = w.rule.weight_scale
    p_w = w.rule.release_probability_weight(35 * s + w.rule.unit_weight(5))
    p_g = g.release_probability(36)
    lo_w, hi_g = binom.ppf(0.5e-8, 100, p_w) - 1, binom.isf(0.5e-8, 100, p_g) + 1
    assert lo_w > hi_g, (p_w, p_g)  # the expected released groups: 100·p_w against 100·p_g
    x_w = len(wdb.query(sql, epsilon=eps, delta=delta, selection="weighted_gaussian"))
    x_g = len(wdb.query(sql, epsilon=eps, delta=delta, selection="gaussian"))
    assert _binom_ok(x_w, 100, p_w, 1e-8) and _binom_ok(x_g, 100, p_g, 1e-8), (x_w, p_w, x_g, p_g)
    assert x_w > x_g
    # auto (no output reuses the selection's count) takes the weighted rule at k = 5, ε = 1
    assert prepare(wdb, sql, epsilon=eps, delta=delta).plan.selection.rule_name == "weighted_gaussian"


def test_weighted_lonely_units_released_at_most_at_the_claimed_rate(wdb):
    """D: the 5 big groups and 1900 units alone in 1, 2 or 5 groups; D′ without them. On D′ exactly the
    big groups come out; on D a lonely unit in j groups has one released with probability
    p_j = 1 − (1 − P[w_j + X >= ρ])^j <= δ_thr, so over R = 2 runs the number X of lonely units with a
    released group is stochastically below Binomial(3800, max_j p_j): the test fails iff X >= c,
    P[Binomial >= c] < 1e-8. The big groups (400 units of weight w_5) miss with probability < 1e-12."""
    from dpch.controller import prepare

    sql = "SELECT grp FROM t_selection.{} GROUP BY grp"
    eps, delta = 1.0, 1e-3
    sel = prepare(wdb, sql.format("lonely"), epsilon=eps, delta=delta, selection="weighted_gaussian").plan.selection
    r = sel.rule
    assert sel.rule_name == "weighted_gaussian" and sel.delta == pytest.approx(delta)
    p = max(-math.expm1(j * math.log1p(-r.release_probability_weight(r.unit_weight(j)))) for j in (1, 2, 5))
    assert p <= (delta - r.noise_delta) * (1 + 1e-9)
    assert r.release_probability_weight(400 * r.unit_weight(5)) >= 1 - 1e-12
    c = _binom_limit(3800, p)
    lonely_units = _lonely_units_released(wdb, sql.format("lonely"), sql.format("lonely_dprime"), eps, delta,
                                          "weighted_gaussian")
    assert lonely_units < c, (lonely_units, c, p)


@pytest.fixture(scope="module")
def cdb(sdb):
    from test_controller_fixtures import setup_controller_data

    setup_controller_data(sdb)
    return sdb


@pytest.mark.parametrize("table", ["events", "subst"])
def test_weighted_sums_move_within_l2_s_per_unit(cdb, table):
    """Noise and selection off (rewrite_for_sensitivity_check) on D and on D′ = D without one unit
    (events: k = 3, add_remove) or with its rows replaced by 700 rows in other groups (subst: k = 2,
    substitute), for the heavy unit 0 and two others: the groups' weighted sums move by an integer
    vector with Σ diff² <= S² (2·S² under substitute), exactly; and their total is Σ_u j_u·w_(j_u)
    with j_u = min(k, the unit's distinct categories), computed independently from the table."""
    from test_controller_fixtures import DB
    from test_controller_sensitivity import UNITS, _neighbour_table

    from dpch.bind import bind
    from dpch.parse import parse
    from dpch.plan import QueryOptions, make_plan
    from dpch.rewrite import rewrite_for_sensitivity_check

    entry = cdb.catalog.get(f"{DB}.{table}")
    sql = f"SELECT category, COUNT(*) AS n FROM {DB}.{table} GROUP BY category"
    plan = make_plan(bind(parse(sql), entry), 1.0, 1e-6, QueryOptions(selection="weighted_gaussian"))
    sel = plan.selection
    q = plan.quantities[sel.quantity]
    assert q.kind == "weighted_units" and sel.rule_name == "weighted_gaussian" and not q.aggregates
    s, k = sel.rule.weight_scale, plan.bounding.k
    subst = entry.neighbour == "substitute"
    assert q.l2 == (s * math.sqrt(2.0) if subst else s) and sel.new_groups == (2 * k if subst else k)

    def sums(table_sql):
        rw = rewrite_for_sensitivity_check(plan, table=table_sql)
        df = cdb.raw_query(rw.sql)
        col = f"{q.noisy_column}_out"
        return {str(key): int(v) for key, v in zip(df["category"], df[col])}

    base = sums(None)
    js = cdb.raw_query(f"SELECT least({k}, uniqExact(category)) AS j FROM {DB}.{table} GROUP BY user_id")["j"]
    assert sum(base.values()) == sum(int(j) * unit_weight(int(j), s) for j in js)
    for unit in UNITS:
        other = sums(_neighbour_table(cdb, table, unit, entry.neighbour))
        diff2 = sum((base.get(g, 0) - other.get(g, 0)) ** 2 for g in set(base) | set(other))
        assert 0 < diff2 <= (2 if subst else 1) * s * s, (unit, diff2)


def test_weighted_statistic_is_never_an_output_and_is_charged_once(wdb):
    """The weighted sum decides the release only: COUNT(DISTINCT unit) gets its own quantity (its own
    noise and budget share), the result has the analyst's columns only, the metadata names the
    selection's statistic, and the ledger charges (ε, δ) once. Without an output count, the whole
    budget is the selection's (one threshold cost)."""
    from dpch.controller import prepare

    sql = "SELECT grp, COUNT(DISTINCT user_id) AS n FROM t_selection.skew GROUP BY grp"
    plan = prepare(wdb, sql, epsilon=1.0, delta=1e-6, selection="weighted_gaussian").plan
    sel_q = plan.quantities[plan.selection.quantity]
    count_q = plan.quantities[plan.aggregates[0].roles["count"]]
    assert sel_q.kind == "weighted_units" and count_q.kind == "units" and sel_q.index != count_q.index
    assert not count_q.is_selection and sel_q.epsilon == pytest.approx(0.5)
    df = wdb.query(sql, epsilon=1.0, delta=1e-6, selection="weighted_gaussian")
    assert list(df.columns) == ["grp", "n"]
    meta = df.attrs["dpch"]
    assert meta["selection"]["rule"] == "weighted_gaussian" and meta["selection"]["statistic"] == "weighted units"
    assert meta["selection"]["weight_scale"] == plan.selection.rule.weight_scale
    assert not meta["columns"]["n"]["shared_with_partition_selection"]
    ex = wdb.explain(sql, epsilon=1.0, delta=1e-6, selection="weighted_gaussian")
    assert "noisy weighted units >=" in str(ex) and "Gopi" in ex.selection["source"]
    charge = wdb.ledger.history("tester", "t_selection.skew")[-1]
    assert charge.epsilon == pytest.approx(1.0) and charge.delta <= 1e-6 * (1 + 1e-12)
    keys_only = "SELECT grp FROM t_selection.skew GROUP BY grp"
    wdb.query(keys_only, epsilon=0.7, delta=1e-5, selection="weighted_gaussian")
    costs = json.loads(wdb.ledger.history("tester", "t_selection.skew")[-1].cost_json)
    assert [c["kind"] for c in costs] == ["threshold"]
    assert costs[0]["epsilon"] == pytest.approx(0.7) and costs[0]["delta"] == pytest.approx(1e-5)


def test_weighted_auto_and_fallbacks(wdb, cdb):
    """auto considers the weighted rule only when no output reuses the selection's count (an output
    COUNT(DISTINCT unit) keeps the shared count rules); selection='weighted_gaussian' at k = 1 is the
    Gaussian threshold (every unit in one group: equal weights), also through the CLI's choices."""
    from test_controller_fixtures import DB

    from dpch.cli import build_parser
    from dpch.commands.query import _options

    shared = wdb.explain("SELECT grp, COUNT(DISTINCT user_id) AS n FROM t_selection.skew GROUP BY grp",
                         epsilon=1.0, delta=1e-6)
    assert "weighted_gaussian" not in shared.selection["scores"] and shared.selection["statistic"] == "distinct units"
    alone = wdb.explain("SELECT grp, COUNT(*) AS n FROM t_selection.skew GROUP BY grp", epsilon=1.0, delta=1e-6)
    assert "weighted_gaussian" in alone.selection["scores"]
    assert alone.selection["rule"] == min(alone.selection["scores"], key=alone.selection["scores"].get)
    k1 = f"SELECT category, COUNT(*) AS n FROM {DB}.purchases GROUP BY category"
    ex = cdb.explain(k1, epsilon=1.0, delta=1e-6, selection="weighted_gaussian")
    assert ex.selection["rule"] == "gaussian" and ex.selection["statistic"] == "distinct units"
    args = build_parser().parse_args(["explain", k1, "--epsilon", "1", "--delta", "1e-6",
                                      "--selection", "weighted_gaussian"])
    assert _options(args)["selection"] == "weighted_gaussian"
