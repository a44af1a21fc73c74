"""Audits on the embedded engine: the shipped SQL functions and the controller's rewritten queries
(no false alarms at ε ∈ {0.5, 1, 2}), broken SQL fixtures (flagged), the D/D′ tables, the
vectorising rewrite, and the CLI.

False-alarm probability (the issue asks for < 1e-6 for a correct mechanism):
every audit runs at confidence 1 − α, α = 1e-8. The events are selected on one half of the
samples and certified on the other half with 2m one-sided Clopper–Pearson bounds at α/(2m)
(m = 3 methods); a certificate can exceed the true ε only if one of its two bounds fails, so
Pr[VIOLATION | the mechanism is (ε, δ)-DP] ≤ α (union bound; dpch/audit/analysis.py). The
worst-case neighbour search draws separate pilot samples and does not enter this bound. This module
runs about 35 audits of correct mechanisms, so the probability that any of them raises a false
alarm is below 35 · 1e-8 = 3.5e-7 < 1e-6.

Power checks (ε_LB large enough, broken fixtures flagged) carry no such guarantee. Their failure
probability was estimated by simulating the audit's event selection (the same noise distributions,
drawn in Python) and computing, for each selected event, the exact probability (two binomials) that
its certificate misses the threshold. `P_search` is that probability for the threshold/interval
search alone; ε_LB is the maximum over the three methods, so it bounds the failure probability of
one audit from above. It is dominated by rare unlucky selections (a narrow tail interval that wins
on the selection half by chance); where it is not below 1e-7, the check takes the best of k
independent audits (`best_of`: all k fail with probability P_search^k). Stated at each check.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import fixtures_broken as fx
from audit_retry import best_of
from dpch.audit import audit
from dpch.audit.neighbours import AuditTables
from dpch.audit.sampling import draw_sql, replace_tables

ALPHA = 1e-8
CONF = 1 - ALPHA
DB = "t_audit"
SRC = f"{DB}.purchases"
N = 2000      # samples per side for the no-false-alarm audits
PILOT = 100
DELTA = 1e-5


@pytest.fixture(scope="module")
def eng(db):
    db.command(f"CREATE DATABASE IF NOT EXISTS {DB}")
    db.command(f"DROP TABLE IF EXISTS {SRC}")
    db.command(f"CREATE TABLE {SRC} (user_id UInt64, region String, age UInt8, amount Float64) "
               "ENGINE = MergeTree ORDER BY user_id")
    # 200 rows, 50 users with 4 rows each, two regions, distinct amounts in [0, 480]
    db.command(f"INSERT INTO {SRC} SELECT number % 50, ['north', 'south'][intDiv(number % 50, 25) + 1], "
               "20 + number % 50, (number * 7919) % 481 FROM numbers(200)")
    return db


SQL_FUNCTIONS = [
    ("SELECT dp_count({e}) AS v FROM {t}", "remove-row", 0.0),
    ("SELECT dp_sum(amount, 0, 500, {e}) AS v FROM {t}", "add-row", 0.0),
    ("SELECT dp_avg(amount, 0, 500, {e}) AS v FROM {t}", "add-row", 0.0),
    ("SELECT dp_count_gaussian({e}, {d}) AS v FROM {t}", "remove-row", DELTA),
    ("SELECT dp_sum_gaussian(amount, 0, 500, {e}, {d}) AS v FROM {t}", "add-row", DELTA),
    ("SELECT dp_avg_gaussian(amount, 0, 500, {e}, {d}) AS v FROM {t}", "add-row", DELTA),
]


@pytest.mark.parametrize("eps", [0.5, 1.0, 2.0])
@pytest.mark.parametrize("template,neighbour,delta", SQL_FUNCTIONS,
                         ids=["dp_count", "dp_sum", "dp_avg", "dp_count_gaussian", "dp_sum_gaussian",
                              "dp_avg_gaussian"])
def test_sql_function_no_false_alarm(eng, template, neighbour, delta, eps):
    sql = template.format(e=eps, d=delta, t=SRC)
    r = audit(eng, sql, epsilon=eps, delta=delta, neighbour=neighbour, samples=N, confidence=CONF,
              pilot=PILOT, database=DB)
    assert r.verdict == "consistent", r.text()
    assert r.epsilon_lb <= eps


def test_grouped_sql_function_no_false_alarm(eng):
    sql = f"SELECT region, dp_count(1.0) AS n, dp_sum(amount, 0, 500, 1.0) AS s FROM {SRC} GROUP BY region"
    # Two released values per group, each ε = 1; one row touches one group: 2-DP overall.
    r = audit(eng, sql, epsilon=2.0, neighbour="remove-row", samples=N, confidence=CONF, pilot=PILOT,
              database=DB)
    assert r.verdict == "consistent", r.text()
    assert set(r.analysis.names) == {"n[north]", "n[south]", "s[north]", "s[south]"}


def test_sql_laplace_count_has_power(eng):
    """dp_count at ε = 1 on 4000 samples per side, confidence 0.95: the expected ε_LB is ≈ 0.88
    (the power target of 0.9 at 20 000 samples is measured in bench/bench_audit.py).

    Threshold 0.6: when the best event {x ≥ 200} is selected, ε_LB is ≈ 0.88 ± 0.04 (CP bounds
    on 2000 held-out samples at α/6) and misses 0.6 with probability 6e-16. The selection on 2000
    samples sometimes picks a narrow event instead ({x = 201}: ε_LB misses 0.6 with probability
    0.21), so P_search is ≈ 9e-4 (40 000 simulated selections); best of 3 audits: below
    (9e-4)^3 < 1e-9. A lower threshold alone would not help (P_search is still 1e-4 at 0.3)."""
    r = best_of(3, lambda: audit(eng, f"SELECT dp_count(1.0) AS v FROM {SRC}", epsilon=1.0,
                                 samples=4000, confidence=0.95, pilot=PILOT, database=DB),
                lambda r: r.epsilon_lb >= 0.6)
    # Only the power side: an upper check at confidence 0.95 could fail for a correct mechanism
    # with probability up to 5% (no-false-alarm checks run at confidence 1 - 1e-8).
    assert r.epsilon_lb >= 0.6, r.text()


# The half-sensitivity fixture violates only for an added row whose amount exceeds 250, so its
# row is given (a searched candidate with a typical amount would be a correct 0.8-DP neighbour);
# the one-sided clip is left to the worst-case search, which must find the row far below.
# Failure probabilities (2000 held-out samples, α = 1e-8):
# - scale_is_epsilon: true ε = 2 vs claimed 0.5: P_search < 1e-140 (20 000 simulated selections);
# - half_sensitivity: true ε = 2 vs claimed 1, expected ε_LB ≈ 1.45: typically < 1e-12 per audit
#   (150 simulated audits), but P_search ≈ 4e-5 (20 000 simulated selections; rare narrow
#   intervals), so best of 2 audits: < 2e-9;
# - one_sided_clip: the far-below row moves the sum by ≈ 4.8e5 = 960 noise scales: outputs on D
#   and D′ never overlap, the pilot separates it perfectly (ε_LB 2.6 on 50 + 50 samples, the maximum;
#   ties go to the largest shift) and the audit certifies ≈ 4.6 > 1 unless an event of
#   probability < e^-900 happens.
HALF_SENS_ROW = {"user_id": 999, "region": "north", "age": 30, "amount": 500.0}


@pytest.mark.parametrize("template,eps,neighbour,record,expect_far_below", [
    (fx.SQL_SCALE_IS_EPSILON, 0.5, "remove-row", None, False),
    (fx.SQL_HALF_SENSITIVITY, 1.0, "add-row", HALF_SENS_ROW, False),
    (fx.SQL_ONE_SIDED_CLIP, 1.0, "add-row", None, True),
], ids=["scale_is_epsilon", "half_sensitivity", "one_sided_clip"])
def test_broken_sql_fixtures_are_violations(eng, template, eps, neighbour, record, expect_far_below):
    sql = template.format(eps=eps, table=SRC)
    r = best_of(2, lambda: audit(eng, sql, epsilon=eps, neighbour=neighbour, record=record,
                                 samples=4000, confidence=CONF, pilot=PILOT, database=DB),
                lambda r: r.verdict == "VIOLATION")
    assert r.verdict == "VIOLATION", r.text()
    if expect_far_below:
        assert "far below" in r.neighbour


# ---------------------------------------------------------------------------------------------
# The controller's rewritten queries
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def catalogued(eng):
    pytest.importorskip("dpch.controller")
    eng.catalog.register(SRC, privacy_unit="user_id", bounds={"amount": (0, 500), "age": (18, 90)},
                         max_groups_contributed=1, max_rows_per_unit=4,
                         public_keys={"region": ["north", "south"]})
    rows = f"{DB}.rows"
    eng.command(f"DROP TABLE IF EXISTS {rows}")
    eng.command(f"CREATE TABLE {rows} ENGINE = MergeTree ORDER BY tuple() AS SELECT * FROM {SRC}")
    eng.catalog.register(rows, bounds={"amount": (0, 500)})
    return eng


CONTROLLER_QUERIES = [
    f"SELECT count(*) AS n FROM {SRC}",
    f"SELECT region, count(*) AS n, sum(amount) AS s FROM {SRC} GROUP BY region",
    f"SELECT avg(amount) AS a FROM {SRC}",
]


@pytest.mark.parametrize("eps", [0.5, 1.0, 2.0])
@pytest.mark.parametrize("sql", CONTROLLER_QUERIES, ids=["count", "grouped", "avg"])
def test_controller_no_false_alarm(catalogued, monkeypatch, sql, eps):
    import dpch.connection

    def no_ledger(self):
        raise AssertionError("the audit touched the ledger")

    monkeypatch.setattr(dpch.connection.Connection, "ledger", property(no_ledger))
    r = audit(catalogued, sql, epsilon=eps, via="controller", samples=N, confidence=CONF,
              pilot=PILOT, database=DB)
    assert r.neighbour_kind == "remove-unit"
    assert r.verdict == "consistent", r.text()
    assert r.epsilon == pytest.approx(eps)


def test_controller_row_level_and_gaussian(catalogued):
    rows = f"{DB}.rows"
    r = audit(catalogued, f"SELECT sum(amount) AS s FROM {rows}", epsilon=1.0, via="controller",
              samples=N, confidence=CONF, pilot=PILOT, database=DB)
    assert r.neighbour_kind == "remove-row" and r.verdict == "consistent", r.text()
    r = audit(catalogued, f"SELECT count(*) AS n FROM {rows}", epsilon=1.0, delta=1e-5,
              via="controller", options={"mechanism": "gaussian"}, samples=N, confidence=CONF,
              pilot=PILOT, database=DB)
    assert r.delta > 0 and r.verdict == "consistent", r.text()


def test_controller_errors_do_not_leak_the_salt(catalogued, monkeypatch):
    import dpch.audit.api as api

    real = catalogued.raw_query
    secret = catalogued.catalog.get(SRC).hash_key_sql()

    def failing_run(sql):  # the engine fails while running the salted SQL, quoting it
        if secret in sql:
            raise api.BackendError(f"Code: 62. DB::Exception: Syntax error in {sql} (SYNTAX_ERROR)")
        return real(sql)

    monkeypatch.setattr(catalogued, "raw_query", failing_run)
    with pytest.raises(api.BackendError) as info:
        audit(catalogued, f"SELECT region, count(*) AS n FROM {SRC} GROUP BY region", epsilon=1.0,
              via="controller", samples=100, pilot=0, database=DB, where="user_id = 3")
    entry = catalogued.catalog.get(SRC)
    assert entry.hash_key_sql() not in str(info.value)
    assert "SELECT" not in str(info.value)


# ---------------------------------------------------------------------------------------------
# D and D′
# ---------------------------------------------------------------------------------------------
def _count(db, table):
    return int(db.raw_query(f"SELECT count() AS n FROM {table}")["n"][0])


def test_neighbour_tables(eng):
    at = AuditTables(eng, SRC, database=DB, unit_column="user_id")
    at.create()
    try:
        n = _count(eng, at.d)
        assert n == 200
        types = lambda t: list(eng.raw_query(  # noqa: E731
            f"SELECT type FROM system.columns WHERE database = '{DB}' AND table = '{t}' ORDER BY position")["type"])
        for kind, delta_rows in (("remove-row", -1), ("add-row", 1), ("substitute-row", 0),
                                 ("remove-unit", -4), ("add-unit", 4), ("substitute-unit", None)):
            cands = at.candidates(kind)
            assert cands, kind
            for cand in cands:
                at.build(cand)
                if delta_rows is not None:
                    assert _count(eng, at.dprime) == n + delta_rows, (kind, cand.description)
                assert types("dprime") == types("purchases")
        # far above: 1000 × (range + 1) beyond the maximum, clamped to UInt8 for `age`
        lo, hi = eng.raw_query(f"SELECT min(amount) AS lo, max(amount) AS hi FROM {SRC}").iloc[0]
        far = next(c for c in at.candidates("add-row") if c.description == "add a row with `amount` far above its observed range")
        at.build(far)
        assert eng.raw_query(f"SELECT max(amount) AS m FROM {at.dprime}")["m"][0] == hi + 1000 * (hi - lo + 1)
        far_age = next(c for c in at.candidates("add-row") if c.description == "add a row with `age` far above its observed range")
        at.build(far_age)
        assert eng.raw_query(f"SELECT max(age) AS m FROM {at.dprime}")["m"][0] == 255
        # add-unit: a fresh id with the heaviest unit's 4 rows
        at.build(at.candidates("add-unit")[0])
        assert eng.raw_query(f"SELECT uniqExact(user_id) AS u FROM {at.dprime}")["u"][0] == 51
        # user-chosen
        at.build(at.candidates("remove-unit", where="user_id = 7")[0])
        assert eng.raw_query(f"SELECT countIf(user_id = 7) AS c FROM {at.dprime}")["c"][0] == 0
        at.build(at.candidates("add-row", values={"amount": 1e9})[0])
        assert eng.raw_query(f"SELECT max(amount) AS m FROM {at.dprime}")["m"][0] == 1e9
        with pytest.raises(ValueError, match="exactly one row"):
            at.candidates("remove-row", where="user_id = 7")
        # descriptions carry no data values
        for kind in ("remove-row", "add-row", "remove-unit"):
            for cand in at.candidates(kind):
                assert not any(ch.isdigit() for ch in cand.description), cand.description
    finally:
        at.drop()
    assert not eng.raw_query(f"SELECT name FROM system.tables WHERE database = '{DB}' "
                             "AND name IN ('base', 'd', 'dprime')").shape[0]


def test_large_table_is_sampled_with_extremes(eng):
    at = AuditTables(eng, SRC, database=DB, max_rows=50)
    at.create()
    try:
        assert at.sampled and 50 <= at.rows <= 50 + 2 * 3
        assert eng.raw_query(f"SELECT max(amount) AS m FROM {at.d}")["m"][0] == \
            eng.raw_query(f"SELECT max(amount) AS m FROM {SRC}")["m"][0]
    finally:
        at.drop()


# ---------------------------------------------------------------------------------------------
# Vectorisation
# ---------------------------------------------------------------------------------------------
def test_vectorised_runs_equal_single_runs(eng):
    """Without noise, every replica of the vectorised query returns exactly the single query's
    result (so each replica is one faithful run)."""
    sql = (f"SELECT region, count() AS n, sum(least(amount, 300)) AS s FROM {SRC} AS p "
           "WHERE p.age > 30 GROUP BY region ORDER BY region")
    single = eng.raw_query(sql)
    multi = eng.raw_query(replace_tables(sql, {SRC: SRC}, reps=(10, 15)))
    assert sorted(multi["__rep"].unique()) == [10, 11, 12, 13, 14]
    for _, part in multi.groupby("__rep"):
        part = part.drop(columns="__rep").sort_values("region").reset_index(drop=True)
        assert part.equals(single)


def test_controller_rewrite_vectorises_exactly(catalogued):
    from dpch.controller import prepare
    from dpch.rewrite import rewrite_for_sensitivity_check

    for sql in CONTROLLER_QUERIES:
        plan = prepare(catalogued, sql, epsilon=1.0).plan
        exact = rewrite_for_sensitivity_check(plan).sql  # noise off: deterministic
        single = eng_sorted(catalogued.raw_query(exact))
        multi = catalogued.raw_query(replace_tables(exact, {SRC: SRC}, reps=(0, 4)))
        for _, part in multi.groupby("__rep"):
            assert eng_sorted(part.drop(columns="__rep")).equals(single)


def eng_sorted(df):
    return df.sort_values(list(df.columns)).reset_index(drop=True)


def test_noise_is_independent_across_replicas(eng):
    s = draw_sql(eng.raw_query, f"SELECT dp_count(1.0) AS v FROM {SRC}", {SRC: SRC}, 4000,
                 table_rows=200, rows_per_query=200 * 1000)  # 4 batches
    v = s.frame.sort_values("__rep")["v"].to_numpy(dtype=float)
    assert len(v) == 4000 and s.vectorised
    # lag-1 correlation of i.i.d. draws: |r| < 6/sqrt(n) with probability > 1 − 1e-8
    r = np.corrcoef(v[:-1], v[1:])[0, 1]
    assert abs(r) < 6 / np.sqrt(len(v))


def test_loop_fallback_for_scalar_subquery(eng):
    sql = f"SELECT dp_count(1.0) AS v FROM {SRC} WHERE amount > (SELECT avg(amount) FROM {SRC})"
    r = audit(eng, sql, epsilon=1.0, samples=40, confidence=CONF, where="user_id = 3 AND amount = 188",
              database=DB, methods=("search",))
    assert any("once per sample" in n for n in r.notes)
    assert r.verdict == "consistent"


# ---------------------------------------------------------------------------------------------
# A neighbour that leaves no row after WHERE (issue 11). A global aggregate over no rows still
# releases one (noisy) row per run; threaded as GROUP BY __rep it used to return none, every D′
# run became NaN and a correct mechanism was reported at the auditor's ceiling (ε_LB 3.9 at
# N = 2000, 7.6 at 20 000). The audits below run at confidence 1 − 1e-8 like every no-false-alarm
# audit of this module (see its docstring), so each fails for a correct mechanism with probability
# at most 1e-8; with the old sampling each failed with certainty (D vs D′ perfectly separated by
# "has an output"), so N = 2000 is enough to catch a regression and keeps each audit near a second.
# ---------------------------------------------------------------------------------------------
def _largest_amount(eng) -> float:
    return float(eng.raw_query(f"SELECT max(amount) AS m FROM {SRC}")["m"][0])


@pytest.mark.parametrize("template", [
    "SELECT dp_count(1.0) AS v FROM {t} WHERE amount = {m}",
    "SELECT dp_sum(amount, 0, 500, 1.0) AS v FROM {t} WHERE amount = {m}",
    "SELECT dp_count(1.0) AS v FROM {t} WHERE amount = {m} HAVING v > 0",
], ids=["dp_count", "dp_sum", "having"])
def test_empty_neighbour_is_not_a_false_alarm(eng, template):
    m = _largest_amount(eng)  # the amounts are distinct: exactly one row has the largest
    sql = template.format(t=SRC, m=m)
    r = audit(eng, sql, epsilon=1.0, neighbour="remove-row", where=f"amount = {m}", samples=N,
              confidence=CONF, pilot=0, database=DB)
    assert r.verdict == "consistent", r.text()
    assert r.epsilon_lb <= 1.0
    assert not np.isnan(r.outputs_dprime).all()


def test_empty_input_runs_release_the_noisy_empty_aggregate(eng):
    """Every run over an empty input returns one row (the noisy count of nothing), and the runs are
    independent. n = 4000 draws of the discrete Laplace at ε = 1 (variance 2q/(1−q)² = 1.84,
    q = e^-1): |mean| < 8 standard errors (0.17) fails with probability < 1e-14 (normal
    approximation; exponential tails make the CLT accurate here), the lag-1 correlation bound
    |r| < 6/sqrt(n) fails with probability < 1e-8. With HAVING v > 0 each run keeps its row with
    probability P(K > 0) = q/(1+q) = 0.269; the observed share within 8 binomial standard errors
    (0.056) fails with probability < 1e-14."""
    empty = f"{DB}.empty_input"
    eng.command(f"DROP TABLE IF EXISTS {empty}")
    eng.command(f"CREATE TABLE {empty} AS {SRC}")
    n = 4000
    s = draw_sql(eng.raw_query, f"SELECT dp_count(1.0) AS v FROM {SRC}", {SRC: empty}, n,
                 table_rows=200, rows_per_query=200 * 1000)  # 4 batches
    f = s.frame.sort_values("__rep")
    assert f["__rep"].tolist() == list(range(n)) and s.vectorised
    v = f["v"].to_numpy(dtype=float)
    q = np.exp(-1.0)
    assert abs(v.mean()) < 8 * np.sqrt(2 * q / (1 - q) ** 2 / n)
    assert abs(np.corrcoef(v[:-1], v[1:])[0, 1]) < 6 / np.sqrt(n)
    s = draw_sql(eng.raw_query, f"SELECT dp_count(1.0) AS v FROM {SRC} HAVING v > 0", {SRC: empty}, n)
    f = s.frame
    assert f["__rep"].is_unique and (f["v"] > 0).all()
    p = q / (1 + q)
    assert abs(len(f) / n - p) < 8 * np.sqrt(p * (1 - p) / n)
    eng.command(f"DROP TABLE {empty}")


def test_controller_empty_neighbour_is_not_a_false_alarm(eng):
    """The controller wraps a global aggregate in projections (noise, then post-processing), so the
    aggregate is not the top SELECT. Auditing it on a one-unit table (D′ empty) once gave every D′
    run no output (NaN) and a VIOLATION (ε_LB 5.3 at N = 2000) for a correct release: the empty runs
    must be drawn on the empty input at the aggregate's level. Confidence 1 − 1e-8 as above."""
    one = f"{DB}.one_unit"
    eng.command(f"DROP TABLE IF EXISTS {one}")
    eng.command(f"CREATE TABLE {one} AS {SRC}")
    eng.command(f"INSERT INTO {one} SELECT * FROM {SRC} WHERE user_id = 7")
    eng.catalog.register(one, privacy_unit="user_id", max_groups_contributed=1, max_rows_per_unit=4,
                         bounds={"amount": (0, 500)})
    try:
        r = audit(eng, f"SELECT COUNT(*) AS n, SUM(amount) AS s FROM {one}", epsilon=1.0, via="controller",
                  samples=N, confidence=CONF, pilot=0, database=DB)
        assert r.verdict == "consistent", r.text()
        assert not np.isnan(r.outputs_dprime).any()
    finally:
        eng.catalog.drop(one)
        eng.command(f"DROP TABLE {one}")


# ---------------------------------------------------------------------------------------------
# CLI (own process: chDB holds one store per process)
# ---------------------------------------------------------------------------------------------
def test_cli(tmp_path):
    """`dpch audit` twice in one process (one engine start-up instead of two): a correct count is
    consistent (exit 0, report files written), a count at scale 0.5 claimed ε = 0.5 is a VIOLATION
    (exit 1): true ε = 2 vs claimed 0.5 on 1000 held-out samples; missing it: P_search < 1e-50
    (20 000 simulated selections)."""
    repo = Path(__file__).resolve().parents[1]
    data = str(tmp_path / "data")
    base = ["audit", "--data-dir", data, "--samples", "2000", "--pilot", "100", "--confidence", str(CONF),
            "--no-progress"]
    ok_args = base + ["SELECT dp_count(1.0) AS n FROM t", "--epsilon", "1", "--report-dir", str(tmp_path / "rep")]
    bad_args = base + ["SELECT dpch_laplace_int(toInt64(count()), 0.5) AS n FROM t", "--epsilon", "0.5",
                       "--neighbour", "add-row", "--record", "x=3"]
    script = textwrap.dedent(f"""
        import sys, dpch
        from dpch.cli import main
        db = dpch.connect({data!r})
        db.command("CREATE TABLE IF NOT EXISTS t (x Float64) ENGINE = MergeTree ORDER BY tuple()")
        db.command("TRUNCATE TABLE t")
        db.command("INSERT INTO t SELECT number FROM numbers(100)")
        db.close()
        ok = main({ok_args!r})
        print("=== second audit", flush=True)
        bad = main({bad_args!r})
        sys.exit(10 * ok + bad)
    """)
    env = {**os.environ, "PYTHONPATH": str(repo) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 1, run.stdout + run.stderr  # ok: 0, bad: 1
    ok_out, _, bad_out = run.stdout.partition("=== second audit")
    assert "verdict: consistent" in ok_out and "VIOLATION" not in ok_out
    assert (tmp_path / "rep" / "report.json").exists() and (tmp_path / "rep" / "histograms.png").exists()
    assert "verdict: VIOLATION" in bad_out
