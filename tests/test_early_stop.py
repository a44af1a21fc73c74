"""Early stopping (dpch.early_stop, ``db.refine``, ``dpch refine``): odp_privacy_accounting.md §5,
Alg. 3 with the ODP bounds of Lemma 11 (§5.1) and Thm 15 (§5.2).

What is measured:
- ``early_stop_odp`` against a brute force over the randomized-response outputs of Lemma 12
  (k_n ≤ 4, stopping points every step or a subset, δ_k > 0): Eq. (4) (Lemma 11 with the optimal
  composition per stopping point), Eq. (3) (Thm 15, maximised over prefix-disjoint families by an
  explicit recursion over the output tree), and the closed forms: Lemma 11 with basic
  composition Σ_i Σ_{k≤k_i} δ_k ≥ Eq. (4) = Σ_i (1 − Π_{k≤k_i}(1 − δ_k)) ≥ Eq. (3) =
  1 − Π_{k≤k_n}(1 − δ_k); with δ_k = 0 everything is 0 and E(P_i) = Σ_{k≤k_i} ε_k;
- the ODP claim itself, exactly, on the implemented loop with a data-dependent stop: per stopping
  class k the worst log-ratio of P(y | D)/P(y | D′) over released sequences is in
  ((k − 1)·ε_step, k·ε_step];
- the ledger: one charge of k_n·ε_step before anything runs, settled to exactly i·ε_step when the
  run stops at step i (odp and basic accountants; zcdp stays at the worst case); a step failing at
  run time leaves the charge failed at the worst case; an exception in on_step settles to the
  steps run and propagates; a process killed mid-run leaves the worst case (subprocess);
- rejected inputs (parameters, query shapes, budget) run and charge nothing;
- the combined estimate's interval covers the bounded value with the stated confidence, at a
  data-dependent stopping step (statistical, see the test's docstring).
The D/D′ attack cases are in tests/attacks/test_attack_early_stop.py.
"""
from __future__ import annotations

import itertools
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from scipy import stats

from dpch.early_stop import early_stop_odp, run_steps
from dpch.errors import BackendError, BudgetExceeded, InvalidParameter, QueryRejected
from dpch.ledger import Ledger
from dpch.mechanisms import LaplaceMechanism
from dpch.mechanisms.block import dlap_mean_halfwidth

DB = "early_stop_t"
T = f"{DB}.t"  # user level, M = 2: Δ(COUNT) = 2


# ------------------------------------------------------------------------------------------------
# Brute force of Eq. (3) and Eq. (4) over Lemma 12's randomized response
# ------------------------------------------------------------------------------------------------
def _rr(eps, delta):
    """Pr(M̃(b) = o) for o = 0..3 (Lemma 12)."""
    a, c = (1 - delta) * math.exp(eps) / (1 + math.exp(eps)), (1 - delta) / (1 + math.exp(eps))
    return [delta, a, c, 0.0], [0.0, c, a, delta]


def _seq_probs(epss, dels, k):
    out = {}
    rrs = [_rr(e, d) for e, d in zip(epss[:k], dels[:k])]
    for q in itertools.product(range(4), repeat=k):
        p0 = math.prod(rrs[j][0][o] for j, o in enumerate(q))
        p1 = math.prod(rrs[j][1][o] for j, o in enumerate(q))
        out[q] = (p0, p1)
    return out


def eq4(epss, dels, stops, cells):
    """Eq. (4): Σ_i max_Q [Pr0(Q) − e^{E_i} Pr1(Q)] = Σ_i Σ_q max(0, Pr0(q) − e^{E_i} Pr1(q))."""
    return sum(sum(max(0.0, p0 - math.exp(E) * p1) for p0, p1 in _seq_probs(epss, dels, k).values())
               for k, E in zip(stops, cells))


def eq3(epss, dels, stops, cells):
    """Eq. (3): max over prefix-disjoint families. Recursion over the output tree: at a stopping
    depth a node either goes into Q_{k_i} (gain Pr0 − e^{E_i} Pr1 of the sequence) or leaves its
    subtree to later stopping points; the gain of a node is additive over its subtree's leaves."""
    rrs = [_rr(e, d) for e, d in zip(epss, dels)]
    gains = dict(zip(stops, cells))

    def value(prefix, p0, p1):
        k = len(prefix)
        here = p0 - math.exp(gains[k]) * p1 if k in gains else None
        if k == stops[-1]:
            return max(0.0, here)
        below = sum(value(prefix + (o,), p0 * rrs[k][0][o], p1 * rrs[k][1][o]) for o in range(4))
        return below if here is None else max(here, below)

    return value((), 1.0, 1.0)


@pytest.mark.parametrize("epss,dels,stops", [
    ([0.3, 0.3, 0.3], [1e-3, 1e-3, 1e-3], None),
    ([0.5, 0.2, 0.4, 0.1], [0.01, 0.0, 0.02, 0.005], None),
    ([0.5, 0.2, 0.4, 0.1], [0.01, 0.03, 0.02, 0.005], (2, 4)),
    ([1.0, 1.0], [0.1, 0.2], (1, 2)),
])
def test_odp_bounds_against_brute_force(epss, dels, stops):
    odp = early_stop_odp(epss, dels, stops)
    ks = odp.stops
    assert odp.cells == pytest.approx([sum(epss[:k]) for k in ks], rel=1e-15)
    b4, b3 = eq4(epss, dels, ks, odp.cells), eq3(epss, dels, ks, odp.cells)
    closed4 = sum(1 - math.prod(1 - d for d in dels[:k]) for k in ks)
    assert b4 == pytest.approx(closed4, rel=1e-9)
    assert b3 == pytest.approx(odp.delta_thm15, rel=1e-9)  # Thm 15's exact value, §5.2
    assert odp.delta_lemma11 == pytest.approx(sum(sum(dels[:k]) for k in ks), rel=1e-15)
    assert odp.delta_thm15 <= b4 + 1e-15 <= odp.delta_lemma11 + 2e-15
    assert odp.delta == odp.delta_thm15
    if len(ks) > 1 and sum(dels[:ks[0]]) > 0:
        assert odp.delta_thm15 < odp.delta_lemma11  # strictly tighter with δ > 0 at two stops


def test_pure_steps_cost_the_sum_of_their_epsilons():
    epss = [0.2, 0.2, 0.2, 0.2]
    odp = early_stop_odp(epss)
    assert odp.cells == pytest.approx((0.2, 0.4, 0.6, 0.8)) and odp.delta == 0.0
    assert eq3(epss, [0.0] * 4, odp.stops, odp.cells) == 0.0 == eq4(epss, [0.0] * 4, odp.stops, odp.cells)
    # a smaller E at a stopping point is not covered (δ > 0 appears): the cells are the least pure ones
    cells = list(odp.cells)
    cells[1] *= 0.9
    assert eq3(epss, [0.0] * 4, odp.stops, cells) > 0


@pytest.mark.parametrize("args,name", [(([],), "step_epsilons"), (([-1.0],), "step_epsilons"),
                                       (([0.1], [1.0]), "step_deltas"), (([0.1, 0.1], None, (1,)), "stops"),
                                       (([0.1, 0.1], None, (2, 1)), "stops")])
def test_odp_bad_arguments(args, name):
    with pytest.raises(InvalidParameter, match=name):
        early_stop_odp(*args)


# ------------------------------------------------------------------------------------------------
# Sessions on ClickHouse
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def edb(db):
    db.command(f"CREATE DATABASE IF NOT EXISTS {DB}")
    for t in (T, f"{T}_basic", f"{T}_zcdp"):
        db.command(f"DROP TABLE IF EXISTS {t}")
        db.command(f"CREATE TABLE {t} (uid UInt64, seg String, x Float64) ENGINE = MergeTree ORDER BY uid")
        # 400 units with 3 rows each; seg 'a' for units < 100 (count 200 after M = 2), x in [0, 50)
        db.command(f"INSERT INTO {t} SELECT intDiv(number, 3), if(intDiv(number, 3) < 100, 'a', 'b'), "
                   f"toFloat64(number % 50) FROM numbers(1200)")
        db.catalog.register(t, privacy_unit="uid", bounds={"x": (0, 50)}, max_rows_per_unit=2)
    db.ledger.set_budget(db.analyst, T, epsilon=50.0, accountant="odp")
    db.ledger.set_budget(db.analyst, f"{T}_basic", epsilon=50.0, accountant="basic")
    db.ledger.set_budget(db.analyst, f"{T}_zcdp", epsilon=50.0, delta=1e-6, accountant="zcdp")
    return db


def _record(db, table, receipt):
    (rec,) = [r for r in db.ledger.history(db.analyst, table) if r.id == receipt.id]
    return rec


def _target_for(steps: int, eps: float, kn: int, l1: int = 2, conf: float = 0.95) -> float:
    """An absolute target met first at ``steps`` (the half-width is data-independent)."""
    mech = LaplaceMechanism.calibrated(l1, eps, integer=True)
    level = 1 - (1 - conf) / kn
    h_at = dlap_mean_halfwidth(mech, steps, level)
    h_before = dlap_mean_halfwidth(mech, steps - 1, level) if steps > 1 else 3 * h_at
    assert h_before > h_at
    return (h_before + h_at) / 2


@pytest.mark.parametrize("table", [T, f"{T}_basic"])
@pytest.mark.parametrize("steps", [1, 3, 6])
def test_settles_lemma11_cell(edb, table, steps):
    eps, kn = 0.25, 6
    before = edb.ledger.remaining(edb.analyst, table)
    r = edb.refine(f"SELECT COUNT(*) FROM {table} WHERE seg = 'a'", epsilon_per_step=eps, max_steps=kn,
                   target_halfwidth=_target_for(steps, eps, kn))
    assert r.steps == steps and len(r.measurements) == steps
    assert r.stopped_by == "target"
    expected = early_stop_odp([eps] * kn).cells[steps - 1]
    assert expected == pytest.approx(steps * eps, rel=1e-15)
    assert r.epsilon_reserved == pytest.approx(kn * eps) and r.epsilon_charged == pytest.approx(expected, rel=1e-12)
    rec = _record(edb, table, r.receipt)
    assert rec.outcome == "settled" and rec.epsilon == pytest.approx(kn * eps)
    assert rec.effective_epsilon == pytest.approx(expected, rel=1e-12)
    after = edb.ledger.remaining(edb.analyst, table)
    assert after.spent.epsilon == pytest.approx(before.spent.epsilon + expected, rel=1e-12)
    assert r.ci_low <= r.estimate <= r.ci_high


def test_relative_target_stops_early_and_zcdp_stays(edb):
    """A count of 200 at ε_step = 2 (b = 1): the relative target 0.1 is met at step 1."""
    r = edb.refine(f"SELECT COUNT(*) FROM {T} WHERE seg = 'a'", epsilon_per_step=2.0, max_steps=5, target_relative=0.1)
    assert r.steps == 1 and r.epsilon_charged == pytest.approx(2.0) and r.stopped_by == "target"
    z = edb.refine(f"SELECT COUNT(*) FROM {T}_zcdp WHERE seg = 'a'", epsilon_per_step=2.0, max_steps=2,
                   target_relative=0.1)
    assert z.steps == 1 and z.epsilon_charged == pytest.approx(4.0)  # no settlement under zcdp
    assert _record(edb, f"{T}_zcdp", z.receipt).outcome == "executed"


def test_sum_query_and_interval(edb):
    r = edb.refine(f"SELECT SUM(x) FROM {T}", epsilon_per_step=1.0, max_steps=4, target_halfwidth=1e-9)
    assert r.steps == 4 and r.stopped_by == "max_steps" and r.epsilon_charged == pytest.approx(4.0)
    assert r.estimate == pytest.approx(np.mean(r.measurements))


def test_step_failure_keeps_worst_case(edb, monkeypatch):
    real = edb.backend.query_df
    calls = {"n": 0}

    def flaky(sql, *a, **k):
        if "AS y" in sql and "toString(toInt128" in sql and "defaultValueOfTypeName" not in sql:
            calls["n"] += 1
            if calls["n"] == 3:
                raise RuntimeError("boom")
        return real(sql, *a, **k)

    monkeypatch.setattr(edb.backend, "query_df", flaky)
    receipts = []
    with pytest.raises(BackendError, match="step 3 failed"):
        edb.refine(f"SELECT COUNT(*) FROM {T}", epsilon_per_step=0.5, max_steps=5, target_halfwidth=1e-9,
                   on_step=lambda s: receipts.append(s))
    monkeypatch.setattr(edb.backend, "query_df", real)
    assert len(receipts) == 2
    last = edb.ledger.history(edb.analyst, T)[-1]
    assert last.outcome == "failed" and last.effective_epsilon == pytest.approx(2.5)


def test_exception_in_on_step_settles_steps_run(edb):
    class Stop(Exception):
        pass

    def cb(step):
        if step.step == 2:
            raise Stop()

    with pytest.raises(Stop):
        edb.refine(f"SELECT COUNT(*) FROM {T}", epsilon_per_step=0.5, max_steps=5, target_halfwidth=1e-9, on_step=cb)
    last = edb.ledger.history(edb.analyst, T)[-1]
    assert last.outcome == "settled" and last.effective_epsilon == pytest.approx(1.0)


@pytest.mark.parametrize("sql,kwargs,name,exc", [
    ("SELECT COUNT(*) FROM {t}", dict(epsilon_per_step=0.0), "epsilon_per_step", InvalidParameter),
    ("SELECT COUNT(*) FROM {t}", dict(max_steps=0), "max_steps", InvalidParameter),
    ("SELECT COUNT(*) FROM {t}", dict(max_steps=True), "max_steps", InvalidParameter),
    ("SELECT COUNT(*) FROM {t}", dict(max_steps=1001), "max_steps", InvalidParameter),
    ("SELECT COUNT(*) FROM {t}", dict(target_halfwidth=None), "target", InvalidParameter),
    ("SELECT COUNT(*) FROM {t}", dict(target_halfwidth=-1.0), "target_halfwidth", InvalidParameter),
    ("SELECT COUNT(*) FROM {t}", dict(target_relative=float("nan")), "target_relative", InvalidParameter),
    ("SELECT COUNT(*) FROM {t}", dict(confidence=1.0), "confidence", InvalidParameter),
    ("SELECT COUNT(*) FROM {t}", dict(mechanism="gaussian"), "mechanism", InvalidParameter),
    ("SELECT seg, COUNT(*) FROM {t} GROUP BY seg", {}, "GROUP BY", QueryRejected),
    ("SELECT AVG(x) FROM {t}", {}, "COUNT or SUM", QueryRejected),
    ("SELECT COUNT(*), SUM(x) FROM {t}", {}, "one output", QueryRejected),
    ("SELECT COUNT(*) FROM nowhere.t", {}, "nowhere", QueryRejected),
    ("SELECT COUNT(*) FROM {t}", dict(epsilon_per_step=10.0, max_steps=100), "", BudgetExceeded),
])
def test_rejected_inputs_charge_nothing(edb, sql, kwargs, name, exc):
    args = dict(epsilon_per_step=0.5, max_steps=3, target_halfwidth=1.0)
    args.update(kwargs)
    before = edb.ledger.remaining(edb.analyst, T).queries
    with pytest.raises(exc, match=name or None):
        edb.refine(sql.format(t=T), **args)
    assert edb.ledger.remaining(edb.analyst, T).queries == before


def test_interval_coverage_at_data_dependent_stop(edb):
    """Coverage of the combined estimate's interval at the stopping step, with a relative target
    (the stop depends on the released values). 5000 runs of ``run_steps`` (the loop db.refine
    runs) on y_k = q + ν_k, the ν_k drawn by the kernel UDF (dpch_laplace_int, one query) at the
    calibration db.refine uses (Δ = 2, ε_step = 0.5, τ = 4), q = 40 units, k_n = 8, target 0.5:
    the stopping step varies. The interval is valid at level ≥ 0.9 (union bound), so coverage
    ~ Binomial(5000, p ≥ 0.9); the test fails if fewer than c runs cover, c the largest count with
    P(Binomial(5000, 0.9) < c) < 1e-6 (exact binomial). The draws' standard deviation is checked
    against the kernel's exact one within 5% (the sample sd of 40 000 Laplace draws has a relative
    sd of about 0.6%: the check fails by chance with probability far below 1e-6)."""
    eps, kn, q, runs, conf = 0.5, 8, 40, 5000, 0.9
    mech = LaplaceMechanism.calibrated(2, eps, integer=True)
    # the argument depends on the row (a constant argument may be evaluated once for all rows)
    df = edb.raw_query(f"SELECT {mech.sql('toInt64(number * 0)')} AS nu FROM numbers({runs * kn})")
    nu = np.asarray(df["nu"], dtype=np.int64).reshape(runs, kn)
    level = 1 - (1 - conf) / kn
    covered, steps = 0, []
    for i in range(runs):
        ys: list[int] = []
        est, h, _ = run_steps(lambda k: q + int(nu[i, k - 1]), ys, kn, 1.0, mech, level, None, 0.5)
        covered += abs(est - q) <= h
        steps.append(len(ys))
    c = int(stats.binom.ppf(1e-6, runs, conf))
    assert stats.binom.cdf(c - 1, runs, conf) < 1e-6
    assert covered >= c, (covered, c)
    assert len(set(steps)) >= 2  # the stopping step really is data-dependent
    assert np.std(nu) == pytest.approx(math.sqrt(mech.variance), rel=0.05)  # independent draws


SETUP = textwrap.dedent("""
    import os, signal, sys, dpch
    from dpch.cli import main
    db = dpch.connect(sys.argv[1], analyst=sys.argv[2])
    db.command("CREATE DATABASE IF NOT EXISTS c")
    db.command("CREATE TABLE IF NOT EXISTS c.t (uid UInt64, x Float64) ENGINE = MergeTree ORDER BY uid")
    db.command("INSERT INTO c.t SELECT number, number % 10 FROM numbers(1000)")
    db.catalog.register("c.t", privacy_unit="uid", bounds={"x": (0, 10)})
    db.ledger.set_budget(sys.argv[2], "c.t", epsilon=100, accountant="odp")
""")

CRASH = SETUP + textwrap.dedent("""
    def die(step):
        if step.step == 2:
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)
    db.refine("SELECT COUNT(*) FROM c.t", epsilon_per_step=0.5, max_steps=6, target_halfwidth=1e-9, on_step=die)
""")


def _env():
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}


def test_process_killed_mid_run_keeps_worst_case(tmp_path):
    data = tmp_path / "data"
    out = subprocess.run([sys.executable, "-c", CRASH, str(data), "crash"], capture_output=True, text=True,
                         timeout=300, env=_env())
    assert out.returncode == -9, out.stderr[-2000:]
    with Ledger(data / "ledger.sqlite", create=False) as led:
        (h,) = led.history("crash", "c.t")
        assert h.outcome == "reserved" and h.effective_epsilon == pytest.approx(3.0)
        assert led.remaining("crash", "c.t").spent.epsilon == pytest.approx(3.0)


CLI = SETUP + textwrap.dedent("""
    db.close()
    a = main(["refine", "SELECT COUNT(*) FROM c.t", "--data-dir", sys.argv[1], "--analyst", "cli",
              "--epsilon-per-step", "5", "--max-steps", "4", "--target-relative", "0.05"])
    b = main(["block", "c.t", "x", "--data-dir", sys.argv[1], "--analyst", "cli", "--epsilon", "1",
              "--mechanism", "block_dp_1", "--statistic", "mean", "--blocks", "5"])
    c = main(["refine", "SELECT COUNT(*) FROM c.t", "--data-dir", sys.argv[1], "--epsilon-per-step", "1"])
    sys.exit(a * 100 + b * 10 + c)
""")


def test_cli_refine_and_block(tmp_path):
    out = subprocess.run([sys.executable, "-c", CLI, str(tmp_path / "data"), "cli"], capture_output=True,
                         text=True, timeout=300, env=_env())
    assert out.returncode == 2, (out.stdout, out.stderr[-2000:])  # refine ok, block ok, the last refused
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("step 1\tmeasurement ")
    assert "after 1 of at most 4 steps (target); ε reserved 20, charged 5" in lines[1]
    assert lines[2].startswith("block_dp_1 mean(x) on c.t: ") and "ε spent 1" in lines[2]
    assert "give --target-halfwidth or --target-relative" in out.stderr


def test_exact_odp_per_stopping_class():
    """The ODP claim of Lemma 11 checked exactly on the implemented loop (``run_steps``, relative
    target: the stop depends on the released values): k_n = 3, Δ = 1, ε_step = 0.7, the kernel's
    τ; D has q = 10, D′ has q = 11 (and the reverse). For every released sequence y of length k
    in a window (each y_j in [−5, 27]), P(M(D) = y) = Π_j DLap_τ(y_j − q) if the loop stops at
    exactly k on y (else 0). Per class k: max ratio ≤ e^{k·ε_step} = e^{E(P_k)}, and > e^{(k−1)·ε_step}
    (so settling a cell lower would understate the loss)."""
    eps, kn = 0.7, 3
    mech = LaplaceMechanism.calibrated(1, eps, integer=True)
    tau = mech.noise_scale_units
    level = 1 - 0.05 / kn

    def pmf(k):
        return (1 - math.exp(-1 / tau)) / (1 + math.exp(-1 / tau)) * math.exp(-abs(k) / tau)

    def stops_at(seq):
        it = iter(seq)
        ys: list[int] = []
        try:
            run_steps(lambda k: next(it), ys, kn, 1.0, mech, level, None, 0.3)
        except StopIteration:
            return None  # the loop wanted more values than the sequence has: not a complete output
        return len(ys) if len(ys) == len(seq) else None

    window = range(-5, 28)
    worst = {1: 0.0, 2: 0.0, 3: 0.0}
    for k in (1, 2, 3):
        for seq in itertools.product(window, repeat=k):
            if stops_at(seq) != k:
                continue
            for qa, qb in ((10, 11), (11, 10)):
                pa = math.prod(pmf(y - qa) for y in seq)
                pb = math.prod(pmf(y - qb) for y in seq)
                worst[k] = max(worst[k], math.log(pa / pb))
    for k, loss in worst.items():
        assert loss <= k * eps + 1e-9, (k, loss)
        assert loss > (k - 1) * eps, (k, loss)
