"""Audit of the mixed noise mechanism (biswal thesis §5.3; docs/NOISE.md "Mixed noise", docs/AUDIT.md §11).

- The sound MNM (``mechanism="mixed"``, both rules) is audited through the controller, the path
  users take (``audit(..., via="controller", options=...)``: the plan's rewritten SQL, its claimed
  (ε, δ)), on a design where each branch is taken: rule "thesis" on SUM(x) with Δ = 1e-9 <= t0
  (Gaussian) and on COUNT(*) (Laplace); rule "variance" on COUNT(*) at δ = 1e-6 (Laplace) and at
  δ = 0.1 (Gaussian: σ² = 1.24 < 2b² = 2). The branch is checked on the plan before each audit.
- The thesis's own calibration (Thm 5.3.2: σ = √2·Δ/ε for Δ <= t0) is the broken fixture
  (tests/fixtures_broken.py), audited through the SQL path with the fixture's UDF call (the
  controller never builds it) and as a Python callable on the kernel.

False alarms. Every audit of a correct mechanism runs at confidence 1 − 1e-7, so each reports a
violation with probability ≤ 1e-7 (docs/AUDIT.md §3) at any sample size; 4 such audits: < 4e-7
for the module. The "not blind" floors on the correct audits' ε_LB are far below what they reach
(measured over 5 runs each at confidence 1 − 1e-7; at 100 000 samples: Laplace branches 0.94–0.96
against the floor 0.6, Gaussian branch at δ = 1e-6 0.25–0.31 against 0.1, at δ = 0.1 0.86–0.88
against 0.5; at 50 000: Laplace 0.91–0.93 (sd 0.01), Gaussian at δ = 0.1 0.80–0.84 (sd 0.02),
Gaussian at δ = 1e-6 0.19–0.23 (sd 0.02)). The Laplace branches and the Gaussian one at δ = 0.1 run
at 50 000 samples (their floors 16 to 30 sd away); the Gaussian branch at δ = 1e-6 keeps 100 000
(at 50 000 its floor would be only ≈ 5 sd away), so every floor is more than 8 sd away.

Power. The thesis's MNM at ε = 1, Δ/σ = 1/√2 has true δ(1) = 0.0396 against the claimed 1e-6; its
tail event {output <= −2σ} has P_D′/P_D ≈ e^1.46 at probabilities 0.1/0.023, far beyond e^1. At
100 000 samples per side and confidence 1 − 1e-7 the SQL audit certified ε_LB 1.33–1.39 in 5 runs
(sd ≈ 0.03), so a miss (ε_LB <= 1) is more than 10 sd away; the callable audit (same samples,
the kernel directly) 1.32–1.42 in 5 runs.
"""
from __future__ import annotations

import math

import pandas as pd
import pytest

import fixtures_broken as fb
from dpch.audit import audit, audit_samplers

DB = "t_audit_mixed"
CONF = 1 - 1e-7
DELTA_F = 1e-9  # the SUM's sensitivity: below the thesis's t0 = √π·δ·ε/2 = 8.9e-7 at (1, 1e-6)
SAMPLES = 100_000


@pytest.fixture(scope="module")
def mdb(db):
    """Two units of one row each: unit 1 at x = 0, unit 2 at x = Δ = 1e-9 (the bound). Removing
    unit 2 moves COUNT(*) by 1 and SUM(x) by Δ, the full sensitivity of each."""
    db.command(f"CREATE DATABASE IF NOT EXISTS {DB}")
    db.command(f"DROP TABLE IF EXISTS {DB}.two")
    db.command(f"CREATE TABLE {DB}.two (uid UInt64, x Float64) ENGINE = MergeTree ORDER BY uid")
    db.command(f"INSERT INTO {DB}.two VALUES (1, 0), (2, {DELTA_F!r})")
    db.catalog.register(f"{DB}.two", privacy_unit="uid", bounds={"x": (0, DELTA_F)}, max_groups_contributed=1,
                        max_rows_per_unit=1)
    return db


CORRECT = [  # (query, δ, rule, branch taken, floor of ε_LB, samples: module docstring)
    ("SELECT SUM(x) AS s FROM {t}", 1e-6, "thesis", "gaussian", 0.1, SAMPLES),
    ("SELECT COUNT(*) AS n FROM {t}", 1e-6, "thesis", "laplace", 0.6, 50_000),
    ("SELECT COUNT(*) AS n FROM {t}", 1e-6, "variance", "laplace", 0.6, 50_000),
    ("SELECT COUNT(*) AS n FROM {t}", 0.1, "variance", "gaussian", 0.5, 50_000),
]


@pytest.mark.parametrize("sql,delta,rule,branch,floor,samples", CORRECT)
def test_sound_mnm_through_controller_is_consistent(mdb, sql, delta, rule, branch, floor, samples):
    q = sql.format(t=f"{DB}.two")
    e = mdb.explain(q, epsilon=1.0, delta=delta, mechanism="mixed", mixed_rule=rule)
    text = str(e)
    assert f"mixed noise, {branch} branch" in text, text
    assert f"mixed noise, {'laplace' if branch == 'gaussian' else 'gaussian'} branch" not in text, text
    assert e.epsilon == pytest.approx(1.0)
    r = audit(mdb, q, epsilon=1.0, delta=delta, via="controller", samples=samples, where="uid = 2",
              options={"mechanism": "mixed", "mixed_rule": rule}, confidence=CONF)
    assert not r.violation, r.text()
    assert r.epsilon_lb > floor, r.text()  # not blind: the design reaches the branch's loss


def test_thesis_mnm_fixture_is_the_thesis_mechanism():
    """The fixture is Thm 5.3.2's claim, which the privacy relation (the truth) rejects."""
    from dpch.mechanisms import MixedNoiseMechanism

    m = MixedNoiseMechanism.thesis(DELTA_F, 1.0, 1e-6)
    assert m.uses_gaussian and m.thesis_claim(1.0, 1e-6) and not m.privacy_relation(1.0, 1e-6)
    assert m.gaussian.sigma == pytest.approx(math.sqrt(2) * DELTA_F)
    assert m.delta_for_epsilon(1.0) == pytest.approx(0.0396, abs=5e-5)
    assert "dpch_gaussian(" in fb.sql_broken_thesis_mnm_sum(DELTA_F, 1.0, 1e-6)
    with pytest.raises(ValueError):
        fb.sql_broken_thesis_mnm_sum(1.0, 1.0, 1e-6)  # Δ > t0: the thesis's Laplace branch, not broken


def test_thesis_mnm_sql_is_a_violation(mdb):
    """SUM(x) clipped to [0, Δ] with the thesis's σ = √2·Δ/ε through dpch_gaussian, claimed (1, 1e-6),
    unit 2 removed (module docstring: measured 1.33–1.39)."""
    sql = fb.sql_broken_thesis_mnm_sum(DELTA_F, 1.0, 1e-6).format(table=f"{DB}.two")
    r = audit(mdb, sql, epsilon=1.0, delta=1e-6, samples=SAMPLES, where="uid = 2", confidence=CONF)
    assert r.violation, r.text()


def test_thesis_mnm_callable_is_a_violation():
    """The same broken release as a Python callable on the kernel (MixedNoiseMechanism.thesis(...).sample)."""
    d = pd.DataFrame({"x": [0.0, DELTA_F]})
    dp = d.iloc[:1]
    mech = fb.broken_thesis_mnm_sum(DELTA_F, 1.0, 1e-6)
    r = audit_samplers(lambda n: mech(d, n), lambda n: mech(dp, n), epsilon=1.0, delta=1e-6, samples=SAMPLES,
                       confidence=CONF)
    assert r.violation, r.text()
