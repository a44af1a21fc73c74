"""Audits of private partition selection (issue 15): the controller's `selection` option
("optimal", "gaussian", "laplace", and "auto") through `dpch.audit.audit(..., via="controller")`,
and three deliberately broken selections through the SQL path.

D and D′ come from `dpch.audit.selection_design`: one group of n privacy units (one row each) and
the query `SELECT grp, COUNT(DISTINCT user_id) AS n FROM t GROUP BY grp`, whose whole (ε, δ) is
the selection's (the COUNT(DISTINCT unit) reuses its noisy count); D′ removes one unit.
- At the threshold (n = T for the optimal rule and the Laplace threshold): P_D(release) /
  P_D′(release) = e^ε up to δ, the near-tight case (0.700 vs 0.257 for the optimal rule at ε = 1,
  δ = 1e-6; 0.731 vs 0.269 for the Laplace threshold).
- The lonely unit (n = 1): the group is released with probability at most δ on D and never on D′
  (no row, no group). An (ε, δ)-DP mechanism may do exactly that, and the audit accounts for δ as
  it does for the Gaussian mechanisms: ε_LB = ln((p̲_D(S) − δ)/p̄_D′(S)) (docs/AUDIT.md §3), so
  an event of probability ≤ δ certifies nothing.

False alarms: every audit of a correct mechanism runs at confidence 1 − 1e-8 (dpch/audit/
analysis.py: Pr[VIOLATION] ≤ 1e-8 each). This module runs 7 such audits (9 at most with the
retries of `best_of`): below 9e-8 < 1e-6. Every other statistical check states its failure
probability; their sum is below 1e-8.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from audit_retry import best_of
from scipy.stats import binom

from dpch.audit import audit, selection_design
from dpch.controller import prepare

ALPHA = 1e-8
CONF = 1 - ALPHA
DB = "t_audit_sel"
DELTA = 1e-6
RULES = ("optimal", "gaussian", "laplace")

# Broken selections (trusted SQL, audited with neighbour remove-row: one row is one unit here)
SQL_NO_NOISE = ("SELECT grp, n FROM (SELECT grp, toInt64(uniqExact(user_id)) AS n FROM {table} GROUP BY grp) "
                "WHERE n >= {threshold}")
"""BROKEN: the threshold without noise. A group of T units is released on D, never on D′."""
SQL_LAPLACE_THRESHOLD = ("SELECT grp, v FROM (SELECT grp, dpch_laplace_int(toInt64(uniqExact(user_id)), {scale!r}) "
                         "AS v FROM {table} GROUP BY grp) WHERE v >= {threshold}")
"""The Laplace threshold in SQL; BROKEN with the scale divided by 4 (τ too small: 4ε-DP at the
threshold) or with the threshold 1 (no δ margin: a lonely unit's group is released with
probability 1/(1 + e^(−ε)) ≈ 0.73, not ≤ δ)."""


@pytest.fixture(scope="module")
def seng(db):
    db.command(f"CREATE DATABASE IF NOT EXISTS {DB}")
    return db


def _table(eng, design, name="t"):
    table = f"{DB}.{name}"
    design.create_table(eng, table)
    return table


def _released(outputs) -> np.ndarray:
    """Per run: was the group released (its coordinates not NaN)? A group released in no run on
    either side has no coordinate at all."""
    out = np.asarray(outputs, dtype=float)
    return ~np.isnan(out[:, 0]) if out.shape[1] else np.zeros(len(out), dtype=bool)


def _within(share, p, n, sds=6.5):
    """|share − p| within `sds` binomial standard deviations; for n = 4000 and the probabilities
    checked here (0.05 to 0.74) the exact binomial tail beyond 6.5 s.d. is below 1e-9 (six
    checks)."""
    return abs(share - p) <= sds * math.sqrt(p * (1 - p) / n)


# ---------------------------------------------------------------------------------------------
# The designs (deterministic)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("eps", [0.5, 1.0, 2.0])
def test_design_at_the_threshold(rule, eps):
    """The design's group size: for the optimal rule and the Laplace threshold n = T, where the
    release event's loss with δ accounted for is exactly ε (Thm 1's π grows by e^ε then its
    complement shrinks by e^−ε; the discrete Laplace tail ratio is e^(1/b) above the threshold);
    the Gaussian threshold's release event is a tail event of loss below ε. The lonely unit's
    group: released with probability ≤ δ on D, never on D′, so no event of it certifies anything."""
    d = selection_design(rule, eps, DELTA)
    assert d.rule.rule == rule and d.rule.coords == 1
    loss = d.event_loss()
    if rule == "gaussian":
        assert 0 < loss < eps and d.units < d.rule.threshold
    else:
        assert d.units == d.rule.threshold
        assert eps * (1 - 1e-4) <= loss <= eps * (1 + 1e-9)  # (the kernel rounds the scale up)
    lonely = selection_design(rule, eps, DELTA, units=1)
    p, q = lonely.release_probabilities()
    assert 0 < p <= DELTA and q == 0 and lonely.event_loss() == 0


def test_design_rule_is_the_planners(seng):
    """The controller plans the design's query with the design's rule, threshold and the whole
    (ε, δ) (one 'threshold' cost), for every option value; 'auto' is the optimal rule at k = 1."""
    for option in ("auto",) + RULES:
        d = selection_design(option, 1.0, DELTA)
        t = _table(seng, d)
        plan = prepare(seng, d.sql(t), epsilon=1.0, delta=DELTA, **d.options).plan
        assert plan.selection.rule_name == d.rule.rule == ("optimal" if option == "auto" else option)
        assert plan.selection.threshold == d.rule.threshold
        assert plan.cost.epsilon == pytest.approx(1.0) and plan.cost.delta == pytest.approx(DELTA)
        assert [m.kind for m in plan.cost.mechanisms] == ["threshold"]


# ---------------------------------------------------------------------------------------------
# Correct rules through the controller
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rule", RULES)
def test_selection_at_the_threshold_is_consistent(seng, rule):
    """Each rule at ε = 1, δ = 1e-6 on its threshold design (4000 runs per side, the design's unit
    removed): consistent at confidence 1 − 1e-8 (module docstring), the claim audited is the
    plan's (1, 1e-6), and the release frequencies on D and D′ match the rule's exact release
    probabilities (6.5 s.d., `_within`).

    Power (optimal, Laplace): the release event alone certifies ≥ 0.4 on 2000 held-out runs per
    side except with probability 8e-18 (optimal) and 8e-21 (Laplace) (exact, two binomials and the
    audit's Clopper–Pearson bounds at α/6); 100 simulated analyses on exact draws of the outputs
    gave ε_LB 0.58–0.77 (optimal) and 0.62–0.80 (Laplace); best of 2. The Gaussian threshold's
    release event is a tail event (0.077 vs 0.050): its loss 0.43 is out of reach at this
    confidence and sample size, so only consistency is checked."""
    d = selection_design(rule, 1.0, DELTA)
    t = _table(seng, d)

    def run():
        return audit(seng, d.sql(t), epsilon=1.0, delta=DELTA, via="controller", options=d.options,
                     where=d.where(), samples=4000, confidence=CONF, pilot=0, database=DB)
    r = best_of(2, run, lambda r: rule == "gaussian" or r.epsilon_lb >= 0.4)
    assert r.verdict == "consistent", r.text()
    assert r.epsilon == pytest.approx(1.0) and r.delta == pytest.approx(DELTA)
    assert r.neighbour_kind == "remove-unit"
    assert sorted(r.analysis.names) == ["__dp_n0_out[g]", "n[g]"], r.analysis.names
    p, q = d.release_probabilities()
    assert _within(_released(r.outputs_d).mean(), p, 4000), (_released(r.outputs_d).mean(), p)
    assert _within(_released(r.outputs_dprime).mean(), q, 4000), (_released(r.outputs_dprime).mean(), q)
    if rule != "gaussian":
        assert 0.4 <= r.epsilon_lb <= 1.0, r.text()


@pytest.mark.parametrize("rule", RULES)
def test_lonely_unit_is_consistent_and_released_at_most_at_rate_delta(seng, rule):
    """The lonely unit's group (n = 1) under each rule at ε = 1, δ = 1e-6: consistent at confidence
    1 − 1e-8, even though D and D′ differ in whether the group can exist at all: the auditor
    subtracts the claimed δ from the favoured side, as for Gaussian mechanisms. On D′ the group
    never appears (no row: deterministic); on D it appears in X of 2000 runs, X ~ Binomial(2000,
    p₁) with p₁ ≤ δ: P[X ≥ 3] ≤ C(2000, 3)·δ³ < 1.4e-9, so the test requires X ≤ 2."""
    d = selection_design(rule, 1.0, DELTA, units=1)
    t = _table(seng, d)
    r = audit(seng, d.sql(t), epsilon=1.0, delta=DELTA, via="controller", options=d.options,
              where=d.where(), samples=2000, confidence=CONF, pilot=0, database=DB)
    assert r.verdict == "consistent", r.text()
    assert not _released(r.outputs_dprime).any()
    assert binom.sf(2, 2000, DELTA) <= math.comb(2000, 3) * DELTA ** 3 < 1.4e-9
    assert _released(r.outputs_d).sum() <= 2


# ---------------------------------------------------------------------------------------------
# Broken selections are caught
# ---------------------------------------------------------------------------------------------
def test_threshold_without_noise_is_a_violation(seng):
    """SQL_NO_NOISE at the Laplace rule's T on the threshold design: the group is released in every
    run on D and in none on D′, so with 200 held-out runs per side the certificate is
    ln((α/6)^(1/200) − δ) − ln(1 − (α/6)^(1/200)) = 2.24 at α = 1e-8, with certainty."""
    d = selection_design("laplace", 1.0, DELTA)
    t = _table(seng, d)
    r = audit(seng, SQL_NO_NOISE.format(table=t, threshold=d.rule.threshold), epsilon=1.0, delta=DELTA,
              where=d.where(), samples=400, confidence=CONF, pilot=0, database=DB)
    assert r.verdict == "VIOLATION", r.text()
    assert r.epsilon_lb > 2.2


def test_noise_scale_too_small_is_a_violation(seng):
    """SQL_LAPLACE_THRESHOLD with the scale b/4 at the rule's T, claimed (1, 1e-6), on the threshold
    design: the release probabilities are 0.982 on D and 0.018 on D′ (loss 4). On 500 held-out runs
    per side at confidence 1 − 1e-8 the release event certifies ≤ 1 with probability 7e-76
    (exact, two binomials)."""
    d = selection_design("laplace", 1.0, DELTA)
    t = _table(seng, d)
    sql = SQL_LAPLACE_THRESHOLD.format(table=t, scale=d.rule.scale / 4, threshold=d.rule.threshold)
    r = audit(seng, sql, epsilon=1.0, delta=DELTA, where=d.where(), samples=1000, confidence=CONF, pilot=0,
              database=DB)
    assert r.verdict == "VIOLATION", r.text()
    assert not any("once per sample" in n for n in r.notes), r.notes


def test_threshold_without_delta_margin_is_a_violation(seng):
    """SQL_LAPLACE_THRESHOLD at the right scale but threshold 1 on the lonely design: the lonely
    unit's group is released with probability 1/(1 + e^(−1)) = 0.731 on D (the claim allows δ) and
    never on D′. On 500 held-out runs per side at confidence 1 − 1e-8 the release event certifies
    ≤ 1 with probability 4e-136 (exact; typically 2.73)."""
    d = selection_design("laplace", 1.0, DELTA, units=1)
    t = _table(seng, d)
    sql = SQL_LAPLACE_THRESHOLD.format(table=t, scale=d.rule.scale, threshold=1)
    r = audit(seng, sql, epsilon=1.0, delta=DELTA, where=d.where(), samples=1000, confidence=CONF, pilot=0,
              database=DB)
    assert r.verdict == "VIOLATION", r.text()
    assert r.epsilon_lb > 2.0


def test_no_output_coordinate_at_all_certifies_nothing():
    """A query that releases nothing in any run on either side (the lonely unit's group, which
    appears with probability ≤ δ) has no output coordinate: every method certifies the empty event
    (ε_LB = 0, consistent) instead of failing. Deterministic."""
    from dpch.audit import audit_samples

    r = audit_samples(np.empty((400, 0)), np.empty((400, 0)), epsilon=1.0, delta=DELTA, confidence=CONF)
    assert r.verdict == "consistent" and r.epsilon_lb == 0.0
    assert len(r.analysis.certificates) == 3


def test_cli_audits_selection_through_the_controller(tmp_path):
    """`dpch audit --via controller --selection …` (own process: chDB holds one store per
    process). With `laplace`: exit status 0 (consistent at confidence 1 − 1e-8, one of the
    module's audits), the claim audited is the plan's (1, 1e-6). The option reaches the planner:
    `optimal` at δ = 1e-40 is refused by it (the rule is offered for δ ≥ 2^-96), exit status 2.
    `--selection` without `--via controller` is refused (exit status 2)."""
    import json
    import os
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    d = selection_design("laplace", 1.0, DELTA)
    base = ["audit", "--data-dir", str(tmp_path / "data"), d.sql("t"), "--epsilon", "1", "--delta", str(DELTA),
            "--samples", "400", "--pilot", "0", "--confidence", str(CONF), "--no-progress", "--json",
            "--where", d.where(), "--selection", "laplace"]
    runs = [["--via", "controller"], ["--via", "controller", "--selection", "optimal", "--delta", "1e-40"], []]
    script = textwrap.dedent(f"""
        import sys, dpch
        from dpch.cli import main
        from dpch.audit import selection_design
        db = dpch.connect({str(tmp_path / 'data')!r})
        selection_design("laplace", 1.0, {DELTA!r}).create_table(db, "default.t")
        db.close()
        for extra in {runs!r}:
            for stream in (sys.stdout, sys.stderr):
                print("=== run", file=stream, flush=True)
            print("=== exit", main({base!r} + extra), flush=True)
    """)
    env = {**os.environ, "PYTHONPATH": str(repo) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    run = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True, env=env,
                         timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    outs = run.stdout.split("=== run\n")[1:]
    errs = run.stderr.split("=== run\n")[1:]
    assert len(outs) == len(errs) == 3, run.stdout + run.stderr
    body, code = outs[0].rsplit("=== exit ", 1)
    assert code.strip() == "0", run.stdout + run.stderr
    doc = json.loads(body)
    assert doc["verdict"] == "consistent" and doc["mode"] == "controller", doc
    assert doc["claimed"]["epsilon"] == pytest.approx(1.0) and doc["claimed"]["delta"] == pytest.approx(DELTA)
    assert outs[1].strip().endswith("=== exit 2") and "selection='optimal'" in errs[1], run.stdout + run.stderr
    assert outs[2].strip().endswith("=== exit 2") and "--selection needs --via controller" in errs[2], \
        run.stdout + run.stderr
