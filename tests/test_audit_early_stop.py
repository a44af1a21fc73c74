"""dpch.audit.early_stop: the audit of early stopping (db.refine), overall and per output-DP class
(docs/AUDIT.md §12).

Design (``early_stop_design``): COUNT(*) = c on D, c − 1 on D′ (one row removed, Δ = 1), c ≈ 5
noise scales, ``target_relative`` = H_1/(c + 0.5): a run stops after step 1 iff |y_1| > c, so the
decision to go on depends on the released measurement; later steps stop when the running mean
is large enough against H_k. Each class k (runs of k steps) holds an event of loss exactly
k/τ ≈ k·ε_step (module docstring of dpch.audit.early_stop), against the claim k·ε_step that
refine settles.

False alarms. Each audit of the correct refinement runs at confidence 1 − 1e-7 (all k_n + 1
certificates hold together with probability ≥ 1 − 1e-7), and the fast path's χ² agreement with
real runs is asserted at p ≥ 1e-8 per side; the class-1 frequency check allows 6 standard
deviations (two-sided normal tail 2e-9, 2 checks). The settle-one-less audit asserts its overall
certificate consistent, which holds for it (its law is the correct one and sup E is unchanged)
except with probability ≤ 1e-7. With 2 correct audits the module fails by chance with probability
< 1e-6. The "not blind" floors (each class's ε_LB ≥ half its claim) sit far below the measured
values (5 runs, 100 000 runs per side, confidence 1 − 1e-7: ε_step = 0.5, k_n = 3: class 1
0.41–0.44 of 0.5, class 2 0.87–0.89 of 1, class 3 1.19–1.28 of 1.5; ε_step = 1, k_n = 2: 0.87–0.89
of 1, 1.88–1.91 of 2; run-to-run sd ≤ 0.03).

Power (5 runs each, same samples and confidence, ε_step = 0.5, k_n = 3): settling one step less
(claims 0.5, 0.5, 1.0) gives class 2 ε_LB 0.85–0.91 and class 3 1.20–1.31, far above their claims
(the overall certificate, against the unchanged reservation 1.5, stays consistent); the per-step
noise at half the scale gives class 1 ε_LB 0.94–0.95 against 0.5. The run-to-run sd is ≤ 0.04, so
a miss is more than 8 sd away for either fixture.
"""
from __future__ import annotations

import math

import pytest

import fixtures_broken as fb
from dpch.audit.early_stop import (audit_early_stop, build_early_stop_design, early_stop_design,
                                   sample_runs_fast)

CONF = 1 - 1e-7
SAMPLES = 100_000
DESIGNS = ((0.5, 3), (1.0, 2))


@pytest.fixture(scope="module")
def designs(db):
    out = {}
    for eps, kn in DESIGNS:
        des = early_stop_design(eps, kn)
        out[eps, kn] = (des, *build_early_stop_design(db, des, database=f"audit_es_{int(eps * 10)}_{kn}"))
    return out


def _audit(db, design, **kw):
    des, d, dp, sql = design
    return audit_early_stop(db, d, dp, sql, des.epsilon_per_step, des.max_steps,
                            target_relative=des.target_relative, samples=SAMPLES, confidence=CONF, **kw)


@pytest.mark.parametrize("eps,kn", DESIGNS)
def test_correct_refine_is_consistent_per_class(db, designs, eps, kn):
    r = _audit(db, designs[eps, kn], real_runs=50)
    assert not r.violation, r.summary()
    assert r.claims == pytest.approx([k * eps for k in range(1, kn + 1)], rel=1e-12)
    assert r.reserved == pytest.approx(kn * eps, rel=1e-12)
    assert r.fast_path_p_value >= 1e-8, r.summary()
    assert r.real_charged_ok, r.summary()
    # every class is taken (the stop depends on the released values) and its audit is not blind
    assert min(r.class_frequencies) > 0.01, r.summary()
    for c in r.per_class:
        assert c.epsilon_lb >= 0.5 * c.claimed, r.summary()


def test_fast_path_matches_exact_first_stop(db, designs):
    """P(stop after step 1) = P(|q + ν| > c) with ν ~ DLap(τ) (q = c on D, c − 1 on D′), against the
    fast path's frequency, within 6 standard deviations."""
    from dpch.audit.svt import _dlap_tail
    from dpch.mechanisms import LaplaceMechanism

    des, d, dp, sql = designs[0.5, 3]
    tau = LaplaceMechanism.calibrated(1, 0.5, integer=True).noise_scale_units
    for table, q in zip((d, dp), des.counts()):
        c = des.count
        p = float(_dlap_tail(c + 1 - q, tau)) + (1.0 - float(_dlap_tail(-c - q, tau)))
        _, stops = sample_runs_fast(db, table, sql, 0.5, 3, SAMPLES, target_relative=des.target_relative)
        got = int((stops == 1).sum())
        assert abs(got - SAMPLES * p) <= 6 * math.sqrt(SAMPLES * p * (1 - p)), (table, got, SAMPLES * p)


def test_settles_one_less_is_caught_per_class(db, designs):
    with fb.broken_refine_settles_one_less():
        r = _audit(db, designs[0.5, 3], real_runs=20)
    assert r.claims == pytest.approx([0.5, 0.5, 1.0], rel=1e-12)
    assert r.real_charged_ok, r.summary()  # the real runs settle what the probe read: the broken cells
    assert r.class_violation, r.summary()
    assert not r.overall_violation, r.summary()  # sup E = 1.5 still holds


def test_half_scale_is_caught(db, designs):
    with fb.broken_refine_half_scale():
        r = _audit(db, designs[0.5, 3], real_runs=20)
    assert r.claims == pytest.approx([0.5, 1.0, 1.5], rel=1e-12)
    assert r.per_class[0].violation, r.summary()
