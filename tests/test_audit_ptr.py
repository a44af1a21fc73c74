"""dpch.audit.ptr: the propose-test-release audit, overall and per output-DP class (⊥, released).

Designs (row-level tables, so a unit is a row, K = 1):
- "jump": D = 50 rows at 100 and 51 at 900 (median 900), D′ = D minus one row at 900 (median 100):
  the median is unstable, a correct run answers ⊥ on both (a release has probability ≤ δ); the IQR
  (quartiles inside the two clusters) is stable and mostly released;
- "edge": 30 rows at 0, a block of 2T + 1 rows at 500, 30 rows at 1000, where T is the median
  test's threshold (ε_p = 1, δ = 1e-6); D′ has 2T block rows. The test's statistic is exactly T on D
  and T − 1 on D′ (checked in ClickHouse), so the noisy test's ratio is as large as it gets.
False alarms: every audit of a correct run is at confidence 1 − 1e-7 (6 certificates, union bound);
3 such audits, so the module fails by chance with probability < 1e-6. The broken fixtures' miss
probabilities are stated at each test (they are far below 1e-6).
"""
from __future__ import annotations

from fractions import Fraction

import pytest

import fixtures_broken as fb
from dpch.audit.ptr import audit_ptr
from dpch.ptr import NoisyTest, PtrRun
from dpch.ptr import sql as S

CONF = 1 - 1e-7
DB = "audit_ptr"
EPS, DELTA, BOUND = 2.0, 1e-6, 1.0


@pytest.fixture(scope="module")
def pairs(db):
    t = NoisyTest.make(EPS / 2, DELTA, 0).threshold
    db.command(f"CREATE DATABASE IF NOT EXISTS {DB}")
    rows = {"jump": ([100] * 50 + [900] * 51, [100] * 50 + [900] * 50),
            "edge": ([0] * 30 + [500] * (2 * t + 1) + [1000] * 30, [0] * 30 + [500] * (2 * t) + [1000] * 30)}
    out = {}
    for name, (d, dp) in rows.items():
        names = []
        for suffix, vals in (("", d), ("_minus", dp)):
            table = f"{DB}.{name}{suffix}"
            db.command(f"DROP TABLE IF EXISTS {table}")
            db.command(f"CREATE TABLE {table} (x Float64) ENGINE = MergeTree ORDER BY tuple()")
            db.command(f"INSERT INTO {table} VALUES " + ", ".join(f"({v})" for v in vals))
            db.catalog.register(table, privacy_unit=None, bounds={"x": (0, 1000)})
            names.append(table)
        out[name] = tuple(names)
    out["threshold"] = t
    return out


def median_statistic(db, table: str, read: str | None = None) -> int:
    """D of the median test (cap 400), computed in ClickHouse (trusted test code)."""
    from dpch.rewrite import _Rewriter

    run = PtrRun(db, "median", table, "x", EPS, DELTA, bound=BOUND)
    _, plan, step, (lo, hi) = run._plan()
    rw = _Rewriter(plan, noise=False, selection=False, table=read)
    beta = BOUND * 65536 / (hi - lo)
    sql = f"SELECT {S.bound_stability(S.median_width, step, beta, 400)} FROM ({S.sorted_rows_sql(rw._salted(rw.groups_sql()))})"
    return int(db.backend.query_df(sql).iloc[0, 0])


def test_edge_design_is_at_the_threshold(db, pairs):
    d, dp = pairs["edge"]
    t = pairs["threshold"]
    assert median_statistic(db, d) == t and median_statistic(db, d, read=f"`{DB}`.`edge_minus`") == t - 1
    assert Fraction(t).denominator == 1


@pytest.mark.parametrize("design,statistic,kw", [("edge", "median", {"bound": BOUND}),
                                                  ("jump", "median", {"bound": BOUND}),
                                                  ("jump", "iqr", {})])
def test_correct_run_passes(db, pairs, design, statistic, kw):
    d, dp = pairs[design]
    r = audit_ptr(db, d, dp, statistic, "x", EPS, DELTA, samples=20_000, confidence=CONF, **kw)
    assert not r.violation, r.summary()
    st = PtrRun(db, statistic, d, "x", EPS, DELTA, **kw).stages()[0]
    assert r.claims["bottom"] == (st.cells[0], 0.0) and r.claims["released"] == (st.cells[1], DELTA)
    if design == "edge":
        # not blind: the ⊥ ratio at the threshold is e^{1/τ} ≈ e^{ε_p}; certified well above 0 here
        assert max(c.epsilon_lb for c in r.certificates if c.cls == "bottom") > 0.3, r.summary()
        assert 0.2 < r.released_fraction[0] < 0.8 and 0.05 < r.released_fraction[1] < 0.6
    elif statistic == "median":  # the unstable median: ⊥ except with probability ≤ δ per run
        assert max(r.released_fraction) < 1e-3, r.summary()


def test_release_without_test_is_caught(db, pairs):
    """Always released: on "jump" the released values sit near 900 on D and near 100 on D′ (noise of
    scale ≈ β/ε_p = 1): the event {value > 500} has P ≈ 1 vs ≈ 0, ε_LB ≈ ln(10^4/20) ≈ 6 > 2."""
    d, dp = pairs["jump"]
    r = audit_ptr(db, d, dp, "median", "x", EPS, DELTA, samples=20_000, confidence=CONF,
                  run_cls=fb.broken_ptr_release_without_test(), bound=BOUND)
    assert r.violation, r.summary()
    assert any(c.violation and c.cls == "released" for c in r.certificates)


def test_test_without_noise_is_caught(db, pairs):
    """The noiseless test passes on D (statistic T) and fails on D′ (T − 1) every time: the ⊥ event
    has P = 0 on D and 1 on D′, ε_LB ≈ 6 > E(⊥) = ε_p = 1."""
    d, dp = pairs["edge"]
    r = audit_ptr(db, d, dp, "median", "x", EPS, DELTA, samples=20_000, confidence=CONF,
                  run_cls=fb.broken_ptr_test_without_noise(), bound=BOUND)
    assert r.violation, r.summary()
    assert any(c.violation and c.cls == "bottom" for c in r.certificates)
