"""Private partition selection (issue 15): the optimal rule of Desfontaines et al. (PoPETs 2022,
Thm 1), the Gaussian and Laplace thresholds, the data-independent choice among them, the kernel's
exact sampler (``dpch_partition_select``) and the controller end to end (docs/CONTROLLER.md,
"Partition selection").

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
from dpch.plan.selection import choose_selection, dg_tail_upper, laplace_rule, selection_release_probability

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
    c = 0
    while binom.sf(c - 1, 4000, p_u) >= 1e-8:
        c += 1
    bigs = {f"big{i}" for i in range(5)}
    lonely_units = 0
    for _ in range(2):
        groups = set(sdb.query(sql.format("multi"), epsilon=eps, delta=delta, selection=rule)["grp"])
        assert bigs <= groups
        lonely_units += len({g.split("_")[0] for g in groups - bigs})
        assert set(sdb.query(sql.format("multi_dprime"), epsilon=eps, delta=delta, selection=rule)["grp"]) == bigs
    assert lonely_units < c, (lonely_units, c, p_u)


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
