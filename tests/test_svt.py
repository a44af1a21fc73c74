"""Sparse vector sessions (dpch.svt, ``db.sparse_vector``, ``dpch svt``): odp_privacy_accounting.md
Alg. 2 with the output-DP settlement of Lemma 8.

What is measured:
- the noise scales against an independent computation (Δ/τ1 ≤ ε1, 2Δ/τ2 ≤ ε2/c in exact
  rationals, with τ recomputed from the kernel's rule t/2^p ≥ b), and the default split ε1/ε2 =
  1/(2c)^(2/3);
- privacy of the mechanism itself, exactly: for 3-query sessions, P(answers | D) and P(answers | D′)
  as sums over ρ's discrete distribution with the kernel's τ1, τ2, for every answer sequence and
  every shift of the queries by at most Δ, ratio ≤ e^{E(S_c′)} (Lemma 8; the worst case is within
  0.02–0.03 of the bound); the same check fails for answer noise at half the scale (it has power);
- the ledger: one charge at ε, settled at exactly ε1 + (c′/c)·ε2 for c′ = 0..c (history, status,
  the settle event); early break and an exception inside the block settle too; max_positives stops
  (nothing runs); a failure at run time leaves the charge failed at ε; under zcdp the session works
  and stays at ε; a refused budget charges nothing;
- rejected queries (GROUP BY, two outputs, expressions, AVG, another table, a larger sensitivity, a
  finer grid, bad SQL) charge nothing more, run nothing, consume nothing;
- only the bit leaves ClickHouse (every result the engine returns during a session is a one-row
  ``above`` column, or the ρ draw), and no error carries a bounded value;
- correctness with clear gaps: counts 200 above / below the threshold come out ⊤ / ⊥; the
  probability of a wrong answer is computed exactly per query (< 1e-8; 9 such answers, so the test
  fails by chance with probability < 1e-7); with ε = 400 the noise is 0 except with probability
  < 1e-20 and the boundary (count = ⌈T⌉ is ⊤, one less is ⊥) is checked exactly;
- the CLI.
The D/D′ attack cases are in tests/attacks/test_svt_attacks.py.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from fractions import Fraction

import numpy as np
import pytest

from dpch.cli import main
from dpch.connection import Connection
from dpch.errors import BackendError, BudgetExceeded, InvalidParameter, QueryRejected
from dpch.svt import SvtCalibration, default_split, svt_epsilons

DB = "svt_t"
ROWS = f"{DB}.rows"  # row level: Δ(COUNT) = 1
UNITS = f"{DB}.units"  # user level, M = 10: Δ(COUNT) = 10, Δ(SUM(amount)) = 10·100
OTHER = f"{DB}.other"
COUNTS = {"big": 1200, "small": 800, "small2": 790, "c9": 9, "c10": 10, "c11": 11, "c3": 3}


@pytest.fixture(scope="module")
def sdb(db):
    db.command(f"CREATE DATABASE IF NOT EXISTS {DB}")
    for t in (ROWS, UNITS, OTHER):
        db.command(f"DROP TABLE IF EXISTS {t}")
    db.command(f"CREATE TABLE {ROWS} (seg String, amount Float64) ENGINE = MergeTree ORDER BY seg")
    for seg, n in COUNTS.items():
        db.command(f"INSERT INTO {ROWS} SELECT '{seg}', toFloat64(number % 50) FROM numbers({n})")
    db.command(f"CREATE TABLE {UNITS} (user_id UInt64, seg String, amount Float64) ENGINE = MergeTree ORDER BY user_id")
    db.command(f"INSERT INTO {UNITS} SELECT number % 500, ['a', 'b'][1 + number % 2], number % 100 FROM numbers(5000)")
    db.command(f"CREATE TABLE {OTHER} (seg String) ENGINE = MergeTree ORDER BY seg")
    db.command(f"INSERT INTO {OTHER} SELECT 'big' FROM numbers(10)")
    db.catalog.register(ROWS, privacy_unit=None, bounds={"amount": (0, 50)})
    db.catalog.register(UNITS, privacy_unit="user_id", bounds={"amount": (0, 100)}, max_groups_contributed=1,
                        max_rows_per_unit=10)
    db.catalog.register(OTHER, privacy_unit=None)
    return db


def conn_as(db, analyst: str, dataset: str, epsilon: float = 1e6, accountant: str = "odp") -> Connection:
    """A connection of another analyst on the same engine (own budgets), with a fresh budget."""
    c = Connection(db.backend, analyst=analyst, data_dir=db.data_dir, ledger_path=db.ledger_path)
    c._ledger = db.ledger
    c.ledger.set_budget(analyst, dataset, epsilon=epsilon, accountant=accountant)
    return c


def q(seg: str, table: str = ROWS) -> str:
    return f"SELECT COUNT(*) FROM {table} WHERE seg = '{seg}'"


def charges(conn, dataset):
    return conn.ledger.history(conn.analyst, dataset)


# ------------------------------------------------------------------------------------------------
# Discrete Laplace, independently (P(k) ∝ x^|k|, x = e^{-1/τ})
# ------------------------------------------------------------------------------------------------

def kernel_tau(b: float) -> float:
    """The kernel's τ for an Int64 release with grid 1 (docs/NOISE.md): t/2^p with p = 40 − ⌈log2 b⌉
    and t = ⌈b·2^p⌉, recomputed here with integers."""
    e = math.frexp(b)[1]
    ceil_log2 = e - 1 if b == math.ldexp(0.5, e) else e
    p = max(0, 40 - ceil_log2)
    t = math.ceil(Fraction(b) * 2 ** p)
    return float(Fraction(t, 2 ** p))


def pmf(z: np.ndarray, tau: float) -> np.ndarray:
    x = math.exp(-1.0 / tau)
    return (1 - x) / (1 + x) * np.exp(-np.abs(z) / tau)


def tail(a: np.ndarray, tau: float) -> np.ndarray:
    """P(ν ≥ a) for integer a."""
    x = math.exp(-1.0 / tau)
    a = np.asarray(a, dtype=float)
    upper = np.exp(-np.maximum(a, 1) / tau) / (1 + x)  # a ≥ 1
    lower = 1 - np.exp(-np.maximum(1 - a, 1) / tau) / (1 + x)  # a ≤ 0: 1 − P(ν ≥ 1 − a)
    return np.where(a >= 1, upper, lower)


def p_answers(answers, qs, t0: int, tau1: float, tau2: float, zmax: int = 2000) -> float:
    """P(the session answers ``answers`` to queries of bounded values ``qs``): Σ_z P(ρ = z) Π_i
    P(q_i + ν_i ≥ t0 + z) or its complement (Alg. 2, line 7, in integer units)."""
    z = np.arange(-zmax, zmax + 1)
    acc = pmf(z, tau1)
    for a, qv in zip(answers, qs):
        g = tail(t0 + z - qv, tau2)
        acc = acc * (g if a else 1 - g)
    return float(acc.sum())


# ------------------------------------------------------------------------------------------------
# Scales
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("c", [1, 2, 3, 10, 100])
def test_default_split_is_lyu_ratio(c):
    s = default_split(c)
    assert s / (1 - s) == pytest.approx((2 * c) ** (-2 / 3), rel=1e-12)
    if c == 1:
        assert (1 - s) / s == pytest.approx(2 ** (2 / 3), rel=1e-12)  # ε2 = 1.587·ε1


@pytest.mark.parametrize("delta_units,eps,c", [(1, 1.0, 1), (1, 0.1, 3), (10, 1.0, 2), (8192000, 1.0, 2),
                                               (3, 5.0, 20), (1, 400.0, 3)])
def test_scales_against_independent_computation(delta_units, eps, c):
    e1 = eps * default_split(c)
    e2c = (eps - e1) / c
    k = SvtCalibration.make(delta_units, 1.0, e1, e2c)
    # the kernel's τ ≥ b, recomputed independently, and the two inequalities of the proof
    assert k.tau1 == kernel_tau(k.b1) and k.tau2 == kernel_tau(k.b2)
    assert Fraction(delta_units) / Fraction(k.tau1) <= Fraction(e1)
    assert Fraction(2 * delta_units) / Fraction(k.tau2) <= Fraction(e2c)
    # and not wastefully larger than the continuous b = Δ/ε1, b = 2cΔ/ε2 (within the grid slack)
    assert k.b1 == pytest.approx(delta_units / e1, rel=1e-9)
    assert k.b2 == pytest.approx(2 * c * delta_units / (eps - e1), rel=1e-9)


def test_scale_beyond_the_integer_grid_is_refused():
    with pytest.raises(InvalidParameter, match="2\\^40"):
        SvtCalibration.make(2 ** 30, 1.0, 1e-4, 1e-4)


def test_cells_are_lemma8():
    cells = svt_epsilons(0.3, 0.7, 4)
    assert cells == pytest.approx([0.3 + k / 4 * 0.7 for k in range(5)], rel=1e-15)
    assert cells[-1] == 0.3 + 0.7


# ------------------------------------------------------------------------------------------------
# Privacy of the mechanism, exactly (Lemma 8 with the kernel's discrete noise)
# ------------------------------------------------------------------------------------------------

def _sequences(n: int, c: int):
    """Every answer sequence of length 1..n that Alg. 2 can output (it stops after c ⊤)."""
    out = []

    def rec(prefix):
        if prefix:
            out.append(tuple(prefix))
        if len(prefix) == n or sum(prefix) >= c:
            return
        for a in (False, True):
            rec(prefix + [a])
    rec([])
    return out


def _worst_excess(c: int, eps: float, delta_units: int, tau2_factor: float = 1.0) -> float:
    """max over sequences, values and shifts of ln P(a|D) − ln P(a|D′) − E(S_c′)."""
    e1 = eps * default_split(c)
    e2 = eps - e1
    k = SvtCalibration.make(delta_units, 1.0, e1, e2 / c)
    tau1, tau2 = k.tau1, k.tau2 * tau2_factor
    t0 = 20
    n = 3
    worst = -math.inf
    values = [t0 - 2 * delta_units, t0, t0 + delta_units]
    shifts = [-delta_units, 0, delta_units]
    for seq in _sequences(n, c):
        m = len(seq)
        e_cell = e1 + sum(seq) / c * e2
        for qs in np.array(np.meshgrid(*[values] * m)).T.reshape(-1, m):
            p = p_answers(seq, qs, t0, tau1, tau2)
            for d in np.array(np.meshgrid(*[shifts] * m)).T.reshape(-1, m):
                p2 = p_answers(seq, qs + d, t0, tau1, tau2)
                worst = max(worst, math.log(p) - math.log(p2) - e_cell)
    return worst


@pytest.mark.parametrize("c,eps,delta_units", [(1, 1.0, 1), (2, 1.0, 1), (2, 0.5, 2)])
def test_exact_privacy_ratio_within_lemma8(c, eps, delta_units):
    assert _worst_excess(c, eps, delta_units) <= 1e-9


def test_exact_privacy_check_has_power():
    # answer noise at half its scale (Lap(cΔ/ε2), i.e. sensitivity Δ instead of 2Δ): some answer
    # sequence exceeds E(S_c') (by about 0.5 at c = 1, ε = 1; the correct scale stays 0.018 below)
    assert _worst_excess(1, 1.0, 1, tau2_factor=0.5) > 0.1


# ------------------------------------------------------------------------------------------------
# Sessions: answers, boundaries, the ledger
# ------------------------------------------------------------------------------------------------

def test_exact_boundary_with_negligible_noise(sdb):
    # ε = 400, c = 3: τ1 < 0.011, τ2 < 0.02; P(ρ ≠ 0 or some ν ≠ 0) < 1e-20
    conn = conn_as(sdb, "svt_boundary", ROWS)
    with conn.sparse_vector(ROWS, threshold=10, epsilon=400.0, max_positives=3) as svt:
        got = [svt.above(q(s)) for s in ("c9", "c10", "c11", "c3")]
    assert got == [False, True, True, False]
    with conn.sparse_vector(ROWS, threshold=9.5, epsilon=400.0, max_positives=3) as svt:
        assert [svt.above(q(s)) for s in ("c9", "c10")] == [False, True]  # q ≥ 9.5 ⇔ q ≥ 10
    with conn.sparse_vector(ROWS, threshold=-0.5, epsilon=400.0, max_positives=1) as svt:
        assert svt.above(q("nothing")) is True  # 0 ≥ -0.5


@pytest.mark.parametrize("c", [1, 2, 3])
def test_settles_exactly_lemma8_for_each_cprime(sdb, c):
    eps = 400.0
    e1 = eps * (1 / (2 * c) ** (2 / 3)) / (1 + 1 / (2 * c) ** (2 / 3))
    e2 = eps - e1
    for cp in range(c + 1):
        conn = conn_as(sdb, f"svt_settle_{c}_{cp}", ROWS, epsilon=1000.0)
        segs = ["c9"] * 2 + ["c11"] * cp + ["c3"]
        with conn.sparse_vector(ROWS, threshold=10, epsilon=eps, max_positives=c) as svt:
            for s in segs:
                if svt.positives >= c:
                    break
                svt.above(q(s))
        assert svt.positives == cp
        expect = e1 + cp / c * e2
        assert svt.epsilon_spent == pytest.approx(expect, rel=1e-12)
        (rec,) = charges(conn, ROWS)
        assert rec.id == svt.receipt.id and rec.outcome == "settled"
        assert rec.epsilon == pytest.approx(eps, rel=1e-15)
        assert rec.effective_epsilon == pytest.approx(expect, rel=1e-12)
        st = conn.ledger.remaining(conn.analyst, ROWS)
        assert st.realized_epsilon == pytest.approx(expect, rel=1e-12) and st.unsettled == 0
        assert st.refunded_epsilon == pytest.approx(eps - expect, rel=1e-9, abs=1e-9)
        ev = conn.ledger.events(conn.analyst, ROWS, kind="settle")
        assert len(ev) == 1 and ev[0].detail["realized_epsilon"] == pytest.approx(expect, rel=1e-12)


def test_early_break_and_exception_settle(sdb):
    conn = conn_as(sdb, "svt_exit", ROWS)
    with conn.sparse_vector(ROWS, threshold=10, epsilon=400.0, max_positives=3) as svt:
        for s in ("c11", "c9", "c10"):
            if svt.above(q(s)):
                break
    assert svt.answers == [True] and svt.state == "closed"
    with pytest.raises(RuntimeError, match="analyst's own"):
        with conn.sparse_vector(ROWS, threshold=10, epsilon=400.0, max_positives=3) as svt2:
            svt2.above(q("c9"))
            raise RuntimeError("the analyst's own bug")
    assert svt2.answers == [False]
    recs = charges(conn, ROWS)
    assert [r.outcome for r in recs] == ["settled", "settled"]
    e1 = 400.0 * default_split(3)
    assert recs[0].effective_epsilon == pytest.approx(e1 + (400.0 - e1) / 3, rel=1e-12)
    assert recs[1].effective_epsilon == pytest.approx(e1, rel=1e-12)
    # an empty session settles at E(S_0) = ε1
    with conn.sparse_vector(ROWS, threshold=10, epsilon=2.0, max_positives=2) as svt3:
        pass
    assert svt3.epsilon_spent == pytest.approx(2.0 * default_split(2), rel=1e-12)


def test_max_positives_stops(sdb):
    conn = conn_as(sdb, "svt_stop", ROWS)
    with conn.sparse_vector(ROWS, threshold=10, epsilon=400.0, max_positives=2) as svt:
        assert svt.above(q("c11")) and svt.above(q("big"))
        for _ in range(2):
            with pytest.raises(QueryRejected, match="max_positives = 2"):
                svt.above(q("c3"))
        assert svt.queries_run == 2
    assert svt.epsilon_spent == pytest.approx(400.0, rel=1e-12)
    with pytest.raises(QueryRejected, match="closed"):
        svt.above(q("c3"))


def test_budget_refused_at_open_charges_nothing(sdb):
    conn = conn_as(sdb, "svt_poor", ROWS, epsilon=0.5)
    with pytest.raises(BudgetExceeded):
        with conn.sparse_vector(ROWS, threshold=10, epsilon=1.0, max_positives=1):
            pytest.fail("the block must not run")  # pragma: no cover
    assert charges(conn, ROWS) == []


def test_zcdp_accountant_stays_at_the_worst_case(sdb):
    c = Connection(sdb.backend, analyst="svt_zcdp", data_dir=sdb.data_dir, ledger_path=sdb.ledger_path)
    c._ledger = sdb.ledger
    c.ledger.set_budget("svt_zcdp", ROWS, epsilon=1e6, delta=1e-6, accountant="zcdp", mechanism_delta=1e-7)
    with c.sparse_vector(ROWS, threshold=10, epsilon=400.0, max_positives=2) as svt:
        assert svt.above(q("c3")) is False
    assert svt.epsilon_spent == 400.0
    (rec,) = charges(c, ROWS)
    assert rec.outcome == "executed" and rec.effective_epsilon == 400.0
    assert c.ledger.remaining("svt_zcdp", ROWS).spent.rho == pytest.approx(400.0 ** 2 / 2)  # ε²/2
    assert c.ledger.events("svt_zcdp", ROWS, kind="settle_refused") == []


def test_basic_accountant_refunds(sdb):
    conn = conn_as(sdb, "svt_basic", ROWS, accountant="basic")
    with conn.sparse_vector(ROWS, threshold=10, epsilon=400.0, max_positives=2) as svt:
        svt.above(q("c3"))
    assert svt.epsilon_spent == pytest.approx(400.0 * default_split(2), rel=1e-12)
    assert conn.ledger.remaining(conn.analyst, ROWS).spent.epsilon == pytest.approx(svt.epsilon_spent, rel=1e-12)


def test_parameters_are_validated(sdb):
    for kw, msg in [({"epsilon": 0.0}, "epsilon"), ({"max_positives": 0}, "max_positives"),
                    ({"delta": 1e-6}, "delta must be 0"), ({"split": 1.0}, "split"),
                    ({"threshold": math.nan}, "threshold")]:
        args = {"threshold": 10, "epsilon": 1.0, "max_positives": 1, **kw}
        with pytest.raises(InvalidParameter, match=msg):
            sdb.sparse_vector(ROWS, **args)
    with pytest.raises(QueryRejected, match="does not exist"):
        sdb.sparse_vector(f"{DB}.nope", threshold=1, epsilon=1.0)
    svt = sdb.sparse_vector(ROWS, threshold=1, epsilon=1.0)
    with pytest.raises(InvalidParameter, match="open the session"):
        svt.above(q("c3"))
    assert "Δ: fixed by the first accepted query" in svt.describe()


# ------------------------------------------------------------------------------------------------
# Rejections: nothing runs, nothing is charged, nothing is consumed
# ------------------------------------------------------------------------------------------------

def test_rejected_queries_consume_nothing(sdb, monkeypatch):
    conn = conn_as(sdb, "svt_reject", UNITS)
    ran = []
    real = conn.backend.query_df

    def spy(sql, *a, **kw):
        if "AS above" in sql and "defaultValueOfTypeName" not in sql:
            ran.append(sql)
        return real(sql, *a, **kw)
    monkeypatch.setattr(conn.backend, "query_df", spy)
    with conn.sparse_vector(UNITS, threshold=100, epsilon=1.0, max_positives=3) as svt:
        with pytest.raises(QueryRejected, match="GROUP BY"):  # rejected before Δ is fixed
            svt.above(f"SELECT seg, COUNT(*) FROM {UNITS} GROUP BY seg")
        assert svt.calibration is None
        assert svt.above(f"SELECT COUNT(*) FROM {UNITS} WHERE seg = 'a'") in (True, False)
        k = svt.calibration
        assert k.sensitivity == 10.0 and k.grid == 1.0
        bad = [
            (f"SELECT seg, COUNT(*) FROM {UNITS} GROUP BY seg", "GROUP BY"),
            (f"SELECT COUNT(*), COUNT(*) FROM {UNITS}", "one output"),
            (f"SELECT COUNT(*) + 1 FROM {UNITS}", "not an expression"),
            (f"SELECT AVG(amount) FROM {UNITS}", "AVG is not a COUNT or SUM"),
            (f"SELECT COUNT(*) FROM {UNITS} HAVING COUNT(*) > 3", "HAVING"),
            (q("big", OTHER), "this sparse-vector session is on"),
            (f"SELECT SUM(amount) FROM {UNITS}", "finer than the session's"),  # grid 2^-13 < 1
            (f"SELECT COUNT(*) FROM {UNITS}", "exceeds the session's Δ"),  # with max_rows_per_unit=20
            (f"SELEC COUNT(*) FROM {UNITS}", ""),
        ]
        for i, (sql, msg) in enumerate(bad):
            opts = {"max_rows_per_unit": 20} if i == 7 else {}
            with pytest.raises((QueryRejected, InvalidParameter), match=msg or None):
                svt.above(sql, **opts)
        with pytest.raises(InvalidParameter, match="not allowed"):
            svt.above(f"SELECT COUNT(*) FROM {UNITS}", mechanism="gaussian")
        assert svt.calibration is k and len(svt.answers) == 1 and svt.queries_run == 1 and len(ran) == 1
        # a smaller sensitivity is fine
        svt.above(f"SELECT COUNT(*) FROM {UNITS} WHERE seg = 'b'", max_rows_per_unit=5)
    assert len(ran) == 2 and len(svt.answers) == 2
    assert len(charges(conn, UNITS)) == 1
    assert conn.ledger.events(conn.analyst, UNITS, kind="rejected") == []


def test_sum_session_accepts_coarser_grid(sdb):
    conn = conn_as(sdb, "svt_sum", UNITS)
    with conn.sparse_vector(UNITS, threshold=1e9, epsilon=1.0, max_positives=1) as svt:
        assert svt.above(f"SELECT SUM(amount) FROM {UNITS}") is False  # Δ = 1000, far below 1e9
        k = svt.calibration
        assert k.sensitivity == pytest.approx(1000.0) and k.grid < 1
        assert svt.above(f"SELECT COUNT(*) FROM {UNITS}") is False  # grid 1 = m·g0: Δ = 10 ≤ 1000
        text = svt.describe()
    assert "b1 = " in text and "Δ = 1000" in text and "ρ" not in text.split("\n")[-1]


# ------------------------------------------------------------------------------------------------
# Only the bit leaves ClickHouse
# ------------------------------------------------------------------------------------------------

def test_only_the_bit_leaves_clickhouse(sdb, monkeypatch):
    conn = conn_as(sdb, "svt_bit", ROWS)
    seen = []
    real = conn.backend.query_df

    def spy(sql, *a, **kw):
        df = real(sql, *a, **kw)
        seen.append((sql, df))
        return df
    monkeypatch.setattr(conn.backend, "query_df", spy)
    with conn.sparse_vector(ROWS, threshold=1000, epsilon=1.0, max_positives=3) as svt:
        for s in ("big", "small", "c11"):
            svt.above(f"SELECT SUM(amount) FROM {ROWS} WHERE seg = '{s}'")
    reads = [(s, df) for s, df in seen if "svt_t" in s and "defaultValueOfTypeName" not in s]
    assert len(reads) == 3  # the three test queries; nothing else read the table
    for sql, df in reads:
        assert list(df.columns) == ["above"] and len(df) == 1 and int(df["above"].iloc[0]) in (0, 1)
        assert "dpch_laplace_int(toInt64(0)" in sql and "__dp_q0" in sql
    rho = [df for s, df in seen if "AS rho" in s]
    assert len(rho) == 1 and list(rho[0].columns) == ["rho"]
    assert "rho" not in repr(svt) and "ρ =" not in svt.describe()


def test_run_time_failure_marks_failed_and_leaks_nothing(sdb, monkeypatch):
    conn = conn_as(sdb, "svt_fail", ROWS)
    real = conn.backend.query_df
    secret = str(COUNTS["big"])

    def broken(sql, *a, **kw):
        if "AS above" in sql and "defaultValueOfTypeName" not in sql and "'big'" in sql:
            raise RuntimeError(f"Code: 999. value {secret} of __dp_q0 overflowed")
        return real(sql, *a, **kw)
    monkeypatch.setattr(conn.backend, "query_df", broken)
    with conn.sparse_vector(ROWS, threshold=1000, epsilon=1.0, max_positives=2) as svt:
        svt.above(q("c3"))
        with pytest.raises(BackendError) as info:
            svt.above(q("big"))
        msg = str(info.value)
        assert secret not in msg and "__dp_q0" not in msg
        assert "marked failed" in msg and "never settled" in msg
        with pytest.raises(QueryRejected, match="failed"):
            svt.above(q("c3"))
    assert svt.epsilon_spent == 1.0 and svt.state == "closed"
    (rec,) = charges(conn, ROWS)
    assert rec.outcome == "failed" and rec.effective_epsilon == 1.0


# ------------------------------------------------------------------------------------------------
# Correctness with clear gaps
# ------------------------------------------------------------------------------------------------

def test_far_above_and_far_below(sdb):
    eps, c = 1.0, 1
    e1 = eps * default_split(c)
    k = SvtCalibration.make(1, 1.0, e1, (eps - e1) / c)
    t0 = 1000
    # exact per-answer error probabilities at the gaps used (count 1200 ⇒ +200, counts ≤ 800 ⇒ ≤ −200)
    p_false_bottom = p_answers([False], [t0 + 200], t0, k.tau1, k.tau2)
    p_false_top = p_answers([True], [t0 - 200], t0, k.tau1, k.tau2)
    assert p_false_bottom < 1e-8 and p_false_top < 1e-8
    conn = conn_as(sdb, "svt_gap", ROWS)
    for _ in range(3):
        with conn.sparse_vector(ROWS, threshold=t0, epsilon=eps, max_positives=c) as svt:
            got = [svt.above(q(s)) for s in ("small", "small2", "big")]
        assert got == [False, False, True]


# ------------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------------

def _run_cli(argv) -> int:
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code)


def test_cli_bad_arguments(tmp_path, capsys):
    f = tmp_path / "q.sql"
    f.write_text("SELECT COUNT(*) FROM t\n")
    empty = tmp_path / "empty.sql"
    empty.write_text("\n-- nothing\n")
    base = ["svt", "--dataset", "t", "--threshold", "1", "--data-dir", str(tmp_path / "nodb")]
    cases = [
        (["--epsilon", "-1", "--file", str(f)], "--epsilon must be"),
        (["--epsilon", "1", "--max-positives", "0", "--file", str(f)], "--max-positives must be"),
        (["--epsilon", "1", "--split", "1.5", "--file", str(f)], "--split"),
        (["--epsilon", "1", "--file", str(tmp_path / "missing.sql")], "cannot read --file"),
        (["--epsilon", "1", "--file", str(empty)], "holds no query"),
        (["--epsilon", "abc", "--file", str(f)], "not a number"),
    ]
    for extra, msg in cases:
        assert _run_cli(base + extra) == 2
        assert msg in capsys.readouterr().err
    assert not (tmp_path / "nodb").exists()  # refused before connecting


def test_cli_session(tmp_path):
    data = tmp_path / "data"
    qfile = tmp_path / "queries.sql"
    qfile.write_text(textwrap.dedent("""\
        -- which segments have at least 10 rows?
        SELECT COUNT(*) FROM c.t WHERE seg = 'c9'
        SELECT seg, COUNT(*) FROM c.t GROUP BY seg

        SELECT COUNT(*) FROM c.t WHERE seg = 'c10'
        SELECT COUNT(*) FROM c.t WHERE seg = 'c11'
        """))
    bad = tmp_path / "refused.sql"
    bad.write_text("SELECT seg, COUNT(*) FROM c.t GROUP BY seg\nSELECT nosuchcolumn FROM c.t\n")
    script = textwrap.dedent(f"""\
        import sys, dpch
        from dpch.cli import main
        db = dpch.connect({str(data)!r}, analyst="cli")
        db.command("CREATE DATABASE IF NOT EXISTS c")
        db.command("CREATE TABLE c.t (seg String) ENGINE = MergeTree ORDER BY seg")
        db.command("INSERT INTO c.t SELECT 'c9' FROM numbers(9)")
        db.command("INSERT INTO c.t SELECT 'c10' FROM numbers(10)")
        db.command("INSERT INTO c.t SELECT 'c11' FROM numbers(11)")
        db.catalog.register("c.t", privacy_unit=None)
        db.ledger.set_budget("cli", "c.t", epsilon=1000, accountant="odp")
        db.close()
        # a list with no acceptable query first: refused whole (exit 2), nothing charged
        refused = main(["svt", "--data-dir", {str(data)!r}, "--analyst", "cli", "--dataset", "c.t",
                        "--threshold", "10", "--epsilon", "400", "--file", {str(bad)!r}])
        from dpch.ledger import Ledger
        led = Ledger({str(data / "ledger.sqlite")!r})
        print("refused", refused, len(led.history()), file=sys.stderr)
        led.close()
        sys.exit(main(["svt", "--data-dir", {str(data)!r}, "--analyst", "cli", "--dataset", "c.t",
                       "--threshold", "10", "--epsilon", "400", "--max-positives", "1", "--file", {str(qfile)!r}]))
        """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    lines = r.stdout.strip().splitlines()
    assert r.returncode == 1, (r.stdout, r.stderr)  # one query was rejected
    assert lines[0] == "below\tSELECT COUNT(*) FROM c.t WHERE seg = 'c9'"
    assert lines[1].startswith("REJECTED\tSELECT seg, COUNT(*) FROM c.t GROUP BY seg\t")
    assert lines[2] == "ABOVE\tSELECT COUNT(*) FROM c.t WHERE seg = 'c10'"
    assert lines[3] == "stopped: 1 ⊤ answer(s) reached; 1 query(ies) not run"
    assert lines[4].startswith("ε spent: 400 of the 400 reserved (1 ⊤ of at most 1")
    assert "budget of cli on c.t" in r.stderr
    assert "refused 2 0" in r.stderr  # the all-refused list: exit 2, no charge on record
    assert "so it was not opened: nothing ran and nothing was charged" in r.stderr


def test_a_session_that_could_answer_nothing_is_not_opened(sdb):
    """SparseVector.refuse_if_none_answerable (the gateway's /dpch/svt and `dpch svt` call it before
    the session's charge): every query refused on its own → refused whole, nothing charged; one
    acceptable query → the session opens as before. A poor analyst gets the budget error first
    (the precheck), before anything the analyst wrote is analysed."""
    from dpch.errors import NoBudget
    c = conn_as(sdb, "svt_nothing", ROWS, epsilon=10)
    refused = [f"SELECT seg, COUNT(*) FROM {ROWS} GROUP BY seg", f"SELECT COUNT(*) FROM {OTHER}",
               f"SELECT COUNT(*) FROM {ROWS} WHERE nosuchcolumn = 1"]
    before = len(c.ledger.history())
    with pytest.raises(QueryRejected, match="not opened: nothing ran and nothing was charged"):
        c.sparse_vector(ROWS, threshold=100, epsilon=1.0).refuse_if_none_answerable(refused)
    assert len(c.ledger.history()) == before
    svt = c.sparse_vector(ROWS, threshold=100, epsilon=1.0)
    svt.refuse_if_none_answerable(refused + [q("big")])  # one acceptable query: no error
    with svt:  # and the session itself charges as before
        svt.above(q("big"))
    assert len(c.ledger.history()) == before + 1
    poor = Connection(sdb.backend, analyst="svt_no_budget", data_dir=sdb.data_dir, ledger_path=sdb.ledger_path)
    poor._ledger = sdb.ledger
    with pytest.raises(NoBudget):
        poor.sparse_vector(ROWS, threshold=100, epsilon=1.0).refuse_if_none_answerable(refused)
