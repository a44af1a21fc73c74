"""Audits of the quantile functions (issue 15): dp_median, dp_quantile and dp_quantiles through the
engine, the kernel through a Python callable, and two deliberately broken quantiles (tests/
fixtures_broken.py: the temperature halved, and the raw argmax).

D and D′ are the design of dpch/audit/designs.py: two walls of rows around one row Y and m empty
buckets E, so that removing one row of a wall lowers Y's score by one unit and raises E's by one;
permute-and-flip then chooses Y with probability 0.40 on D and 0.15 on D′ at ε = 1 (privacy loss
0.976, exact: `QuantileDesign.event_probabilities`). Two levels are two independent releases at ε/2
over all the rows (then sorted): their design has one such gadget per level, both moved by the same
removed row, and the event "both levels at their Y" has a loss near ε (0.978 at ε = 1).

False alarms (a correct mechanism reported as a VIOLATION) are bounded as in test_audit_engine.py:
every audit of a correct mechanism runs at confidence 1 − α, α = 1e-8; its m = 3 events are chosen
on the selection half and certified on the held-out half with 2m one-sided Clopper–Pearson bounds
at α/(2m), so Pr[VIOLATION] ≤ α by the union bound (dpch/audit/analysis.py). This module runs 8
such audits (9 at most, with the one retry): below 9e-8 < 1e-6 in total.

Power checks (ε_LB large enough, broken fixtures flagged) were computed, not guessed, and the
sample sizes are the smallest round sizes that keep them below 1e-7 per check: the output of a
design is one of a few buckets, whose exact joint distribution on D and D′ comes from
dpch.mechanisms.QuantileMechanism; the audit's threshold/interval selection was simulated on draws
from it (with the α split of the real three-method audit) and, for each selected event, the exact
probability (two binomials) that its certificate misses the threshold was averaged
(tests/audit_power.py, which prints the figures quoted below). Every simulated selection picked the
event {output ≤ Y's midpoint} (no mass below Y: the same event as {output = Y's midpoint}), so the
figure is that event's exact failure probability. ε_LB is the maximum over the three methods, so
the search alone bounds the failure probability from above.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import fixtures_broken as fx
import numpy as np
import pytest
from audit_retry import best_of

from dpch.audit import audit, quantile_design

ALPHA = 1e-8
CONF = 1 - ALPHA
DB = "t_audit_q"
LO, HI = 0.0, 100.0


@pytest.fixture(scope="module")
def qeng(db):
    db.command(f"CREATE DATABASE IF NOT EXISTS {DB}")
    return db


def _table(eng, name, design):
    table = f"{DB}.{name}"
    design.create_table(eng, table)
    return table


def _share_at(outputs, design, stage=0):
    """Share of the runs whose released value of the design's chain level `stage` is Y's
    midpoint."""
    col = list(design.levels).index(design.stages[stage].level)
    return float(np.mean(outputs[:, col] == design.midpoint(design.stages[stage].favoured)))


def _within(share, p, n, sds=6.5):
    """|share − p| within `sds` binomial standard deviations. For n = 500 or 1000 and every
    probability checked here the exact binomial tail beyond 6.5 s.d. is below 6e-9; the module
    makes 10 such checks. The checks also catch D and D′ run the wrong way round: the share of D′
    tested against D's probability passes with probability 0 (dp_median at ε = 2, n = 500),
    2.7e-10 (dp_quantile 0.9, n = 500), 9.5e-3 (dp_median at ε = 0.5, n = 1000: p and p′ only 0.13
    apart) and 4.3e-5 (dp_quantiles, n = 1000), exact binomials; so n = 500 only where that stays
    below 1e-9 (each run is a 9 ms release on the 2^16 grid)."""
    return abs(share - p) <= sds * math.sqrt(p * (1 - p) / n)


@pytest.mark.parametrize("levels", [0.1, 0.3, 0.5, 0.9, 0.95, [0.25, 0.5], [0.5, 0.9], [0.3, 0.45],
                                    [0.25, 0.75], [0.25, 0.5, 0.75]])
@pytest.mark.parametrize("eps", [0.5, 1.0, 2.0])
def test_design_is_permute_and_flip_over_y_and_e(levels, eps):
    """The design does what dpch/audit/designs.py claims, checked against the closed form of
    permute-and-flip over 1 + m candidates (McKenna & Sheldon 2020): at each stage (ε/depth each,
    g = e^(−ε/(2·depth)): a depth of the recursion for three levels, one of the two independent
    ε/2 releases for two), Y is chosen with probability ∫₀¹(1 − g·t)^m dt =
    (1 − (1 − g)^(m+1))/((m + 1)g) on D and g/(m + 1) on D′, independently across stages. The
    exact probabilities come from dpch.mechanisms.QuantileMechanism (not from the design's own
    arithmetic; for two levels its joint distribution of the sorted pair); the tolerance 5e-4
    covers the rounding of the levels to multiples of 2^-20 (at most 1.1e-4 measured).
    Deterministic."""
    d = quantile_design(levels, LO, HI, eps)
    depth = len(set(d.levels)).bit_length()
    g = math.exp(-eps / depth / 2)
    want_d = want_dp = 1.0
    for stage in d.stages:
        m = len(stage.improving)
        want_d *= (1 - (1 - g) ** (m + 1)) / ((m + 1) * g)
        want_dp *= g / (m + 1)
    p, p_prime = d.event_probabilities()
    assert p == pytest.approx(want_d, abs=5e-4) and p_prime == pytest.approx(want_dp, abs=5e-4)
    # two levels on one side of 1/2 (0.5 counts for both): one removed row moves both releases by a
    # full unit; on both sides of 1/2 it moves only one of them fully, and the design covers that one
    covered = 2 if levels in ([0.25, 0.5], [0.5, 0.9], [0.3, 0.45], [0.25, 0.5, 0.75]) else 1
    assert len(d.stages) == covered
    # the privacy loss of the event is close to the ε of the stages it covers (ε for a full cover)
    assert math.log(p / p_prime) >= 0.9 * eps * covered / depth
    assert d.rows == len(d.values()) and d.values().count(d.removed_value) == 1
    if len(set(d.levels)) == 2:  # two levels: both Y and every E of the lower level below the upper's
        low, high = sorted(d.stages, key=lambda s: s.level) if covered == 2 else (d.stages[0], None)
        assert d.removed_side == ("largest" if min(d.levels) >= 0.5 else "smallest")
        if high is not None:
            assert max((low.favoured,) + low.improving) < min((high.favoured,) + high.improving)


def test_median_is_consistent_and_the_bound_is_tight(qeng):
    """dp_median at ε = 1 on the median design, the neighbour left to the worst-case search.

    No false alarm: confidence 1 − 1e-8 (module docstring; best_of runs at most 2 audits).
    Search: it must pick the smallest row (the first row is the same row: the table is stored in
    ascending order); removing the largest moves Y and E together and leaves the output
    distribution as it is on D. Simulated searches (exact output distributions of the three
    candidates on the design's window, the candidates' order, `dpch.audit.api._pilot_score`)
    preferred the largest row 0 times in 20 000 with 600 pilot runs per candidate, once in 100 000
    with 300 (used here: each pilot run costs a 9 ms release, 4 × 300 fewer of them), 23 times in
    100 000 with 200.
    Power: with 1500 held-out samples per side the event {m = Y} certifies ≈ 0.44 at this
    confidence (0.51 with 2000; 0.78 with 2000 at confidence 0.95); it misses 0.2 with
    probability 3.5e-5 (`python tests/audit_power.py 0.5 1 1 1500 0.99999999 0.2
    1000`: all 1000 simulated selections chose that event). One audit thus fails either check with
    probability below ≈ 8.2e-5 (4.7e-5, the 95% upper bound of 1 in 100 000 simulated searches,
    + 3.5e-5); best of 2: below 6.8e-9. (2000 per side would miss 0.25 with probability 3.6e-7 at
    a third more releases, each 4 ms on the 2^16 grid.)"""
    d = quantile_design(0.5, LO, HI, 1.0)
    t = _table(qeng, "median", d)
    nearest = ("remove the row with the smallest `x`", "remove the first row")
    r = best_of(2, lambda: audit(qeng, f"SELECT dp_median(x, {LO}, {HI}, 1.0) AS m FROM {t}",
                                 epsilon=1.0, samples=3000, confidence=CONF, pilot=300, database=DB),
                lambda r: r.epsilon_lb >= 0.2 and r.neighbour in nearest)
    assert r.verdict == "consistent", r.text()
    assert 0.2 <= r.epsilon_lb <= 1.0, r.text()
    assert r.neighbour in nearest, r.text()
    assert r.analysis.names == ["m"]


@pytest.mark.parametrize("eps,n", [(0.5, 1000), (2.0, 500)])
def test_median_other_epsilons_no_false_alarm(qeng, eps, n):
    """dp_median at ε = 0.5 and 2 on their designs: consistent at confidence 1 − 1e-8, and the
    audit really ran the mechanism on D and D′: the share of runs at Y matches the exact
    probabilities (6.5 s.d.: see `_within`, which also sets the sample sizes n)."""
    d = quantile_design(0.5, LO, HI, eps)
    t = _table(qeng, "median", d)
    r = audit(qeng, f"SELECT dp_median(x, {LO}, {HI}, {eps}) AS m FROM {t}", epsilon=eps,
              samples=n, confidence=CONF, where=d.where(), pilot=0, database=DB)
    assert r.verdict == "consistent", r.text()
    p, p_prime = d.event_probabilities()
    assert _within(_share_at(r.outputs_d, d), p, n), (_share_at(r.outputs_d, d), p)
    assert _within(_share_at(r.outputs_dprime, d), p_prime, n), (_share_at(r.outputs_dprime, d), p_prime)


@pytest.mark.parametrize("levels,sql,n", [
    ([0.9], "SELECT dp_quantile(x, 0.9, {lo}, {hi}, 1.0) AS q FROM {t}", 500),
    ([0.25, 0.5], "SELECT dp_quantiles(x, [0.25, 0.5], {lo}, {hi}, 1.0) AS q FROM {t}", 1000),
], ids=["dp_quantile_0.9", "dp_quantiles"])
def test_quantile_functions_no_false_alarm(qeng, levels, sql, n):
    """dp_quantile(x, 0.9, …) and dp_quantiles(x, [0.25, 0.5], …) at ε = 1 on their designs, the
    design's row removed: consistent at confidence 1 − 1e-8. The array of dp_quantiles is audited
    as one coordinate per level (q[1], q[2]). The share of runs at the design's Y (for
    dp_quantiles: both levels at their Y, the joint event of the two independent ε/2 releases)
    matches the exact probabilities within 6.5 s.d. (`_within`)."""
    d = quantile_design(levels, LO, HI, 1.0)
    t = _table(qeng, "quantile", d)
    r = audit(qeng, sql.format(lo=LO, hi=HI, t=t), epsilon=1.0, samples=n, confidence=CONF,
              where=d.where(), pilot=0, database=DB)
    assert r.verdict == "consistent", r.text()
    assert r.analysis.names == (["q"] if len(levels) == 1 else ["q[1]", "q[2]"])
    assert d.removed_side == ("largest" if levels == [0.9] else "smallest")
    p, p_prime = d.event_probabilities()

    def joint(out):
        return float(np.mean(np.all([out[:, list(d.levels).index(s.level)] == d.midpoint(s.favoured)
                                     for s in d.stages], axis=0)))
    assert _within(joint(r.outputs_d), p, n), (joint(r.outputs_d), p)
    assert _within(joint(r.outputs_dprime), p_prime, n), (joint(r.outputs_dprime), p_prime)
    lo_seen = min(np.nanmin(r.outputs_d), np.nanmin(r.outputs_dprime))
    hi_seen = max(np.nanmax(r.outputs_d), np.nanmax(r.outputs_dprime))
    assert LO <= lo_seen and hi_seen <= HI


def test_broken_half_temperature_is_a_violation(qeng):
    """tests/fixtures_broken.SQL_QUANTILE_HALF_TEMPERATURE: the real UDF asked for 2ε, claiming ε = 1,
    on the design built for the claim (ε = 1). At the true 2ε the event {v = Y} has probability
    0.571 on D and 0.092 on D′ (privacy loss 1.83); with 1200 held-out samples per side at
    confidence 1 − 1e-3 its certificate misses 1 with probability 2.7e-9 (`python
    tests/audit_power.py 0.5 1 2 1200 0.999 1 2000`: all 2000 simulated selections chose that
    event; 1000 per side: 5.7e-7)."""
    d = quantile_design(0.5, LO, HI, 1.0)
    t = _table(qeng, "median", d)
    sql = fx.SQL_QUANTILE_HALF_TEMPERATURE.format(lo=LO, hi=HI, q=0.5, eps=1.0, table=t)
    r = audit(qeng, sql, epsilon=1.0, samples=2400, confidence=1 - 1e-3, where=d.where(), pilot=0,
              database=DB)
    # vectorised: the UDF called directly is threaded like dp_median (no per-sample loop)
    assert not any("once per sample" in n for n in r.notes), r.notes
    assert r.verdict == "VIOLATION", r.text()
    assert r.epsilon_lb > 1.0


# ---------------------------------------------------------------------------------------------
# Python callables: the kernel, and the raw argmax
# ---------------------------------------------------------------------------------------------
def test_kernel_quantile_callable_no_false_alarm():
    """The kernel (QuantileMechanism.sample) as a Python mechanism on the 0.9 design's DataFrame:
    consistent at confidence 1 − 1e-8, and the shares at Y on D and D′ match the exact
    probabilities within 6.5 s.d. (`_within`). On the window of the grid around the data
    (`fixtures_broken.kernel_quantile`: the law of the full grid within 1e-12, the same claim that makes
    `event_probabilities` exact): a release costs 0.06 ms there against 9 ms on the 2^16 grid. The
    full grid is audited through dp_quantile on the same design (test_quantile_functions_no_false_alarm)."""
    d = quantile_design(0.9, LO, HI, 1.0)
    frame = d.frame()
    r = audit(fx.kernel_quantile([0.9], 1.0, LO, HI), data=frame, epsilon=1.0, samples=1000,
              confidence=CONF, where=np.asarray(frame["x"] == d.removed_value), pilot=0)
    assert r.verdict == "consistent", r.text()
    p, p_prime = d.event_probabilities()
    assert _within(_share_at(r.outputs_d, d), p, 1000)
    assert _within(_share_at(r.outputs_dprime, d), p_prime, 1000)


def test_broken_argmax_is_a_violation():
    """fixtures_broken.broken_quantile_argmax: no noise. On the median design the best bucket is Y
    on D and the first bucket of E on D′ (a tie broken low), so every output differs: with 200
    held-out samples per side the certificate is ln((α/6)^(1/200) / (1 − (α/6)^(1/200))) = 2.2 at
    α = 1e-8 with certainty (no randomness at all)."""
    d = quantile_design(0.5, LO, HI, 1.0)
    frame = d.frame()
    r = audit(fx.broken_quantile_argmax(0.5, LO, HI, 1.0), data=frame, epsilon=1.0, samples=400,
              confidence=CONF, where=np.asarray(frame["x"] == d.removed_value), pilot=0)
    assert r.verdict == "VIOLATION", r.text()
    assert r.epsilon_lb > 2.0


def test_broken_two_levels_without_the_split_is_a_violation():
    """BROKEN: both levels of dp_quantiles(x, [0.25, 0.5], …) released at the full ε = 1 each (the
    ε/2 split of sequential composition forgotten: 2-DP), claimed ε = 1, on the design built for
    the claim (m = 2 E buckets per level at ε/2). At the true ε per level the event "both levels
    at their Y" has probability 0.266 on D and 0.041 on D′ (loss 1.87; one level alone: 0.94, not
    a violation, so the joint event must be found: the learned distinguishers do). With 5000
    held-out samples per side at confidence 1 − 1e-3 that event certifies ≤ 1 with probability
    9e-22 (exact, two binomials); 8 trial audits gave ε_LB 1.51–1.63; best of 2 in case the
    learned distinguishers miss it. The correct release on the same data is audited at confidence
    1 − 1e-8 (one of the module's audits of correct mechanisms)."""
    d = quantile_design([0.25, 0.5], LO, HI, 1.0)
    frame = d.frame()
    p_y = [(1 - (1 - math.exp(-0.5)) ** 3) / (3 * math.exp(-0.5)), math.exp(-0.5) / 3]
    assert [len(s.improving) for s in d.stages] == [2, 2]
    assert math.log(p_y[0] ** 2 / p_y[1] ** 2) > 1.8
    r = best_of(2, lambda: audit(fx.kernel_quantile([0.25, 0.5], 2.0, LO, HI), data=frame, epsilon=1.0,
                                 samples=10_000, confidence=1 - 1e-3, pilot=0,
                                 where=np.asarray(frame["x"] == d.removed_value)),
                lambda r: r.verdict == "VIOLATION")
    assert r.verdict == "VIOLATION", r.text()
    # and the correct release (ε/2 per level) on the same data is not one, at the same confidence
    ok = audit(fx.kernel_quantile([0.25, 0.5], 1.0, LO, HI), data=frame, epsilon=1.0, samples=10_000,
               confidence=CONF, pilot=0, where=np.asarray(frame["x"] == d.removed_value))
    assert ok.verdict == "consistent", ok.text()


# ---------------------------------------------------------------------------------------------
# CLI (own process: chDB holds one store per process)
# ---------------------------------------------------------------------------------------------
def test_cli_audits_dp_quantiles(tmp_path):
    """`dpch audit` on dp_quantiles through the CLI: an array output, exit status 0 (consistent at
    confidence 1 − 1e-8, see the module docstring: the bound holds at any sample size), the
    per-level coordinates in the JSON. 100 samples per side: the plumbing is what is tested here
    (each release costs ≈ 9 ms on the 2^16 grid)."""
    import json

    repo = Path(__file__).resolve().parents[1]
    script = textwrap.dedent(f"""
        import sys, dpch
        from dpch.cli import main
        from dpch.audit import quantile_design
        db = dpch.connect({str(tmp_path / 'data')!r})
        quantile_design([0.25, 0.5], 0, 100, 1.0).create_table(db, "default.t")
        db.close()
        sys.exit(main(sys.argv[1:]))
    """)
    env = {**os.environ, "PYTHONPATH": str(repo) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    run = subprocess.run([sys.executable, "-c", script, "audit", "--data-dir", str(tmp_path / "data"),
                          "SELECT dp_quantiles(x, [0.25, 0.5], 0, 100, 1.0) AS q FROM t",
                          "--epsilon", "1", "--samples", "100", "--pilot", "0",
                          "--confidence", str(CONF), "--no-progress", "--json",
                          "--where", "x = " + repr(quantile_design([0.25, 0.5], 0, 100, 1.0).removed_value)],
                         check=False, capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    doc = json.loads(run.stdout)
    assert doc["verdict"] == "consistent" and doc["coordinates"] == ["q[1]", "q[2]"]
