"""Propose-test-release runs (dpch.ptr, ``db.robust_iqr``/``robust_median``/``trimmed_mean``,
``dpch ptr``) end to end: the ledger's ODP settlement, the branches, rejected inputs, the release
distribution, the CLI.

What is measured:
- the declared ODP cells of each statistic against the theorems (PTR function: ⊥ ε, released 2ε;
  M_IQR: ⊥ 2ε, released 3ε, Lemma 10; composed by Alg. 1), and the amounts the ledger keeps after
  each branch (history: reserved ε, effective ε, outcome "settled"; δ never refunded);
- branches on datasets whose statistic is certain: a constant column (every statistic stable for
  far more than cap·K rows: the test fails only if the noise is below −(cap − T), probability
  ≤ e^{−21}/(1+q) < 1e-9 per test), three units (every statistic unstable at the first unit step:
  a pass has probability ≤ δ_test ≤ 1e-9), and two clusters (IQR stable, median unstable). About
  twenty such tests run in this file, so a wrong branch by chance has probability < 1e-7;
- the released value of the IQR of a constant column is exactly 0 (the zero bin);
- rejected inputs (bad ε, δ, α, bound, rows_hint, base, split, option, column, table, WHERE with an
  aggregate, public table): an error naming the parameter, and nothing charged; a refused budget
  charges nothing; a run-time failure leaves the charge failed at its worst case and its message
  carries no value;
- only (branch, value) leaves ClickHouse: every result read from the engine during a run is a
  one-row (branch, value) frame;
- the release distribution (median with a bound, constant column): 20 000 runs of the same SQL
  (fast path) against Laplace(b) around the bucket's value, Kolmogorov–Smirnov at level 1e-6
  (critical distance 0.0137 for n = 20 000: a scale off by 5% moves the KS distance by ≈ 0.017,
  so the test has power); and the mean of 40 real runs within 6 standard errors (P < 2e-9);
- the CLI, in a subprocess with its own data directory.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from scipy import stats

from dpch.connection import Connection
from dpch.errors import BackendError, BudgetExceeded, InvalidParameter, QueryRejected
from dpch.ptr import PtrRun, iqr_cells, ptr_cells

DB = "ptr_t"
FLAT = f"{DB}.flat"  # 3000 units × 2 rows, all 50: every statistic stable
TINY = f"{DB}.tiny"  # 3 units: every statistic unstable
TWO = f"{DB}.two"  # 2000 units × 1 row, half 20 half 80: IQR stable, median not
PUB = f"{DB}.pub"
DELTA = 1e-9


@pytest.fixture(scope="module")
def pdb(db):
    db.command(f"CREATE DATABASE IF NOT EXISTS {DB}")
    for t in (FLAT, TINY, TWO, PUB):
        db.command(f"DROP TABLE IF EXISTS {t}")
    db.command(f"CREATE TABLE {FLAT} (user_id UInt64, x Float64, secret Float64) ENGINE = MergeTree ORDER BY user_id")
    db.command(f"INSERT INTO {FLAT} SELECT number % 3000, 50, 1234.5 FROM numbers(6000)")
    db.command(f"CREATE TABLE {TINY} (user_id UInt64, x Float64) ENGINE = MergeTree ORDER BY user_id")
    db.command(f"INSERT INTO {TINY} VALUES (1, 10), (2, 50), (3, 90)")
    db.command(f"CREATE TABLE {TWO} (user_id UInt64, x Float64) ENGINE = MergeTree ORDER BY user_id")
    db.command(f"INSERT INTO {TWO} SELECT number, if(number % 2 = 0, 20, 80) FROM numbers(2000)")
    db.command(f"CREATE TABLE {PUB} (x Float64) ENGINE = MergeTree ORDER BY x")
    db.command(f"INSERT INTO {PUB} VALUES (1)")
    for t in (FLAT, TINY, TWO):
        bounds = {"x": (0, 100), "secret": (0, 2000)} if t == FLAT else {"x": (0, 100)}
        db.catalog.register(t, privacy_unit="user_id", bounds=bounds,
                            max_groups_contributed=1, max_rows_per_unit=2 if t == FLAT else 1)
    db.catalog.register(PUB, public=True)
    return db


def conn_as(db, analyst: str, datasets=(FLAT, TINY, TWO), epsilon: float = 1e6, delta: float = 1e-3,
            accountant: str = "odp") -> Connection:
    c = Connection(db.backend, analyst=analyst, data_dir=db.data_dir, ledger_path=db.ledger_path)
    c._ledger = db.ledger
    for d in datasets:
        c.ledger.set_budget(analyst, d, epsilon=epsilon, delta=delta, accountant=accountant)
    return c


def history(conn, dataset):
    return conn.ledger.history(conn.analyst, dataset)


# ------------------------------------------------------------------------------------------------
# Declared cells
# ------------------------------------------------------------------------------------------------

def test_declared_cells(pdb):
    eps, d = 3.0, 1e-6
    iqr = PtrRun(pdb, "iqr", FLAT, "x", eps, d).stages()
    assert [s.cells for s in iqr] == [(2.0, 3.0)] and iqr[0].delta == d and iqr_cells(1.0) == (2.0, 3.0)
    med = PtrRun(pdb, "median", FLAT, "x", eps, d, bound=1.0).stages()
    assert [s.cells for s in med] == [(1.5, 3.0)] and ptr_cells(1.5) == (1.5, 3.0)
    comp = PtrRun(pdb, "trimmed_mean", FLAT, "x", eps, d, alpha=0.2, rows_hint=10, split=0.4).stages()
    es, ep = 3.0 * 0.4 / 3, 3.0 * 0.6 / 2
    assert comp[0].cells == pytest.approx((2 * es, 3 * es)) and comp[1].cells == pytest.approx((0.0, ep, 2 * ep))
    assert sum(max(s.cells) for s in comp) == pytest.approx(eps) and sum(s.delta for s in comp) == pytest.approx(d)


# ------------------------------------------------------------------------------------------------
# Branches and settlement
# ------------------------------------------------------------------------------------------------

CASES = [
    # (name, table, statistic, kwargs, branch, charged as a fraction of ε)
    ("iqr-flat", FLAT, "iqr", {}, "released", 1.0),
    ("iqr-tiny", TINY, "iqr", {}, "bottom", 2 / 3),
    ("iqr-two", TWO, "iqr", {}, "released", 1.0),
    ("median-flat", FLAT, "median", {"bound": 1.0}, "released", 1.0),
    ("median-tiny", TINY, "median", {"bound": 1.0}, "bottom", 0.5),
    ("median-two", TWO, "median", {"bound": 1.0}, "bottom", 0.5),
    ("median-two-composed", TWO, "median", {"rows_hint": 2000}, "bottom", 0.5 + 0.5 / 2),
    ("median-tiny-composed", TINY, "median", {"rows_hint": 3}, "bottom", 2 * 0.5 / 3),
    ("trimmed-flat-composed", FLAT, "trimmed_mean", {"alpha": 0.2, "rows_hint": 6000}, "released", 1.0),
    ("trimmed-flat", FLAT, "trimmed_mean", {"alpha": 0.5, "bound": 2.0}, "released", 1.0),
    ("trimmed-tiny", TINY, "trimmed_mean", {"alpha": 0.2, "bound": 2.0}, "bottom", 0.5),
]


@pytest.mark.parametrize("name,table,statistic,kw,branch,fraction", CASES, ids=[c[0] for c in CASES])
def test_branch_and_settlement(pdb, name, table, statistic, kw, branch, fraction):
    conn = conn_as(pdb, f"ptr_{name}", (table,))
    eps = 3.0
    r = {"iqr": conn.robust_iqr, "median": conn.robust_median, "trimmed_mean": conn.trimmed_mean}[statistic](
        table, "x", epsilon=eps, delta=DELTA, **kw)
    assert r.branch == branch and r.released == (branch == "released")
    assert (r.value is None) == (branch == "bottom")
    assert r.epsilon_reserved == pytest.approx(eps, rel=1e-12)
    assert r.epsilon_charged == pytest.approx(fraction * eps, rel=1e-12)
    assert r.delta == pytest.approx(DELTA, rel=1e-12)
    (rec,) = history(conn, table)
    assert rec.outcome == "settled" and rec.epsilon == pytest.approx(eps, rel=1e-12)
    assert rec.effective_epsilon == pytest.approx(fraction * eps, rel=1e-12)
    st = conn.ledger.remaining(conn.analyst, table)
    assert st.realized_epsilon == pytest.approx(fraction * eps, rel=1e-12) and st.unsettled == 0
    if statistic == "iqr" and table == FLAT:
        assert r.value == 0.0  # the zero bin releases 0 exactly
    if statistic == "iqr" and table == TWO:
        assert 60.0 / 10 < r.value < 60.0 * 10  # ln-noise of scale ln(1.1)/1: |L| > ln 10 has P < 1e-10
    if statistic != "iqr" and r.released:
        assert abs(r.value - 50.0) < 40.0  # noise scale ≤ 2/1.5 units: P(|L| > 40) < 1e-13


def test_no_settlement_accountant_stays_at_worst_case(pdb):
    conn = conn_as(pdb, "ptr_zcdp", (TINY,), epsilon=100.0, delta=1e-3, accountant="zcdp")
    conn.ledger.set_budget(conn.analyst, TINY, epsilon=100.0, delta=1e-3, accountant="zcdp", mechanism_delta=1e-4)
    r = conn.robust_iqr(TINY, "x", epsilon=3.0, delta=DELTA)
    assert r.branch == "bottom" and r.epsilon_charged == 3.0  # no settlement under zCDP
    (rec,) = history(conn, TINY)
    assert rec.outcome == "executed"


# ------------------------------------------------------------------------------------------------
# Rejected inputs charge nothing
# ------------------------------------------------------------------------------------------------

BAD = [
    ("robust_iqr", {"epsilon": 0.0}, "epsilon"),
    ("robust_iqr", {"epsilon": float("nan")}, "epsilon"),
    ("robust_iqr", {"delta": 0.0}, "delta"),
    ("robust_iqr", {"delta": 1.5}, "delta"),
    ("robust_iqr", {"base": 1.0}, "base"),
    ("robust_iqr", {"split": 1.0}, "split"),
    ("robust_iqr", {"keys": ["a"]}, "keys"),
    ("robust_iqr", {"column": "nosuch"}, "nosuch"),
    ("robust_iqr", {"table": f"{DB}.nosuch"}, "nosuch"),
    ("robust_iqr", {"table": PUB}, "public"),
    ("robust_iqr", {"where": "count() > 1"}, ""),
    ("robust_iqr", {"where": "   "}, "where"),
    ("robust_iqr", {"where": "x > 1 ORDER BY x LIMIT 3"}, ""),
    ("robust_iqr", {"column": f"x) FROM {TINY} --"}, "another table"),
    ("robust_iqr", {"where": "x > 1 GROUP BY user_id"}, ""),
    ("robust_median", {}, "bound"),
    ("robust_median", {"bound": -1.0}, "bound"),
    ("robust_median", {"bound": 1.0, "rows_hint": 10}, "not both"),
    ("robust_median", {"rows_hint": 0}, "rows_hint"),
    ("robust_median", {"rows_hint": 2.5}, "rows_hint"),
    ("trimmed_mean", {"alpha": 1.0, "bound": 1.0}, "alpha"),
    ("trimmed_mean", {"alpha": 0.0, "bound": 1.0}, "alpha"),
    ("trimmed_mean", {"alpha": "0.2", "bound": 1.0}, "alpha"),
]


@pytest.mark.parametrize("method,kw,needle", BAD, ids=[f"{m}-{i}" for i, (m, _, _) in enumerate(BAD)])
def test_rejected_inputs_charge_nothing(pdb, method, kw, needle):
    conn = conn_as(pdb, f"ptr_bad_{method}", (FLAT, TINY))  # TINY: the injected-column case reaches the table check
    args = {"table": FLAT, "column": "x", "epsilon": 1.0, "delta": 1e-6}
    if method == "trimmed_mean":
        args["alpha"] = 0.2
    args.update(kw)
    table, column = args.pop("table"), args.pop("column")
    before = len(history(conn, FLAT))
    with pytest.raises((InvalidParameter, QueryRejected)) as info:
        getattr(conn, method)(table, column, **args)
    assert needle.lower() in str(info.value).lower()
    assert "1234.5" not in str(info.value) and "50.0" not in str(info.value)
    assert len(history(conn, FLAT)) == before


def test_alpha_only_for_the_trimmed_mean(pdb):
    with pytest.raises(InvalidParameter, match="alpha applies"):
        PtrRun(pdb, "median", FLAT, "x", 1.0, 1e-6, alpha=0.2, bound=1.0)
    with pytest.raises(InvalidParameter, match="bound and rows_hint"):
        PtrRun(pdb, "iqr", FLAT, "x", 1.0, 1e-6, bound=1.0)


def test_budget_refused_charges_nothing(pdb):
    conn = conn_as(pdb, "ptr_poor", (FLAT,), epsilon=0.5)
    with pytest.raises(BudgetExceeded):
        conn.robust_iqr(FLAT, "x", epsilon=1.0, delta=1e-6)
    assert history(conn, FLAT) == []


def test_run_time_failure_stays_at_worst_case_and_leaks_nothing(pdb, monkeypatch):
    conn = conn_as(pdb, "ptr_fail", (FLAT,))
    real = conn.backend.query_df

    def broken(sql, *a, **kw):
        if "AS branch" in sql and "defaultValueOfTypeName" not in sql:
            raise RuntimeError("Code: 999. value 1234.5 of __dp_q0 overflowed")
        return real(sql, *a, **kw)
    monkeypatch.setattr(conn.backend, "query_df", broken)
    with pytest.raises(BackendError) as info:
        conn.robust_median(FLAT, "secret", epsilon=2.0, delta=1e-6, bound=1.0)
    msg = str(info.value)
    assert "1234.5" not in msg and "__dp_q0" not in msg and "never settled" in msg
    (rec,) = history(conn, FLAT)
    assert rec.outcome == "failed" and rec.effective_epsilon == 2.0


def test_only_branch_and_value_leave_clickhouse(pdb, monkeypatch):
    conn = conn_as(pdb, "ptr_spy", (FLAT,))
    seen = []
    real = conn.backend.query_df

    def spy(sql, *a, **kw):
        seen.append((sql, real(sql, *a, **kw)))
        return seen[-1][1]
    monkeypatch.setattr(conn.backend, "query_df", spy)
    conn.trimmed_mean(FLAT, "secret", alpha=0.2, epsilon=2.0, delta=1e-6, rows_hint=6000)
    reads = [(s, df) for s, df in seen if DB in s and "defaultValueOfTypeName" not in s]
    assert len(reads) == 2  # the scale stage and the trimmed-mean stage
    for sql, df in reads:
        assert list(df.columns) == ["branch", "value"] and len(df) == 1
        assert "dpch_laplace_int(" in sql and "dpch_laplace(" in sql


# ------------------------------------------------------------------------------------------------
# The release distribution
# ------------------------------------------------------------------------------------------------

def test_release_distribution_is_the_calibrated_laplace(pdb):
    """Median of a constant column (bucket of 50 over [0, 100], value 50 + w/2 after rounding to
    the bucket's midpoint, w = 100/2^16) with β = 1.0: 20 000 runs of the run's SQL (fast path),
    all released (D = cap; a ⊥ has P < 1e-9 per run, checked: none), KS against the Laplace the run
    calibrates (b = its release mechanism's scale in buckets, times w), level 1e-6."""
    run = PtrRun(pdb, "median", FLAT, "x", 2.0, 1e-6, bound=1.0)
    sql, interval = run.fast_sql(20000)
    df = pdb.backend.query_df(sql)
    assert len(df) == 20000 and (df["branch"] == 1).all()
    w = 100.0 / 2 ** 16
    vals = np.array([run.to_value(float(v), interval) for v in df["value"]])
    centre = math.floor(50 / w) * w + w / 2
    st = run.stages()[0]
    b = run.make_release(1.0 / w * (1 + 2.0 ** -40) + 2.0 ** -30, st.epsilon).scale * w
    assert b == pytest.approx(1.0 / st.epsilon, rel=1e-6)
    res = stats.kstest(vals - centre, stats.laplace(scale=b).cdf)
    assert res.pvalue > 1e-6, res
    # and real runs: the mean within 6 standard errors (sd = b·√2)
    conn = conn_as(pdb, "ptr_dist", (FLAT,))
    real = [conn.robust_median(FLAT, "x", epsilon=2.0, delta=1e-6, bound=1.0).value for _ in range(40)]
    assert abs(np.mean(real) - centre) < 6 * b * math.sqrt(2) / math.sqrt(40)


# ------------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------------

def test_cli(tmp_path):
    data = tmp_path / "data"
    script = textwrap.dedent(f"""\
        import sys, dpch
        from dpch.cli import main
        db = dpch.connect({str(data)!r}, analyst="cli")
        db.command("CREATE DATABASE IF NOT EXISTS c")
        db.command("CREATE TABLE c.t (user_id UInt64, x Float64) ENGINE = MergeTree ORDER BY user_id")
        db.command("INSERT INTO c.t SELECT number, 40 FROM numbers(3000)")
        db.catalog.register("c.t", privacy_unit="user_id", bounds={{"x": (0, 100)}}, max_groups_contributed=1,
                            max_rows_per_unit=1)
        db.ledger.set_budget("cli", "c.t", epsilon=100, delta=1e-3, accountant="odp")
        db.close()
        a = main(["ptr", "iqr", "c.t", "x", "--epsilon", "3", "--delta", "1e-9", "--data-dir", {str(data)!r},
                  "--analyst", "cli"])
        b = main(["ptr", "median", "c.t", "x", "--epsilon", "3", "--delta", "1e-9", "--bound", "1", "--json",
                  "--data-dir", {str(data)!r}, "--analyst", "cli"])
        c = main(["ptr", "median", "c.t", "x", "--epsilon", "3", "--delta", "1e-9", "--data-dir", {str(data)!r},
                  "--analyst", "cli"])
        print("codes", a, b, c)
        """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    lines = r.stdout.strip().splitlines()
    assert lines[0] == "iqr of x on c.t: released 0", (r.stdout, r.stderr)
    assert lines[1].startswith("ε charged 3 of 3 reserved")
    j = json.loads(lines[2])
    assert j["branch"] == "released" and j["epsilon_charged"] == 3.0 and abs(j["value"] - 40) < 30
    assert lines[3] == "codes 0 0 2"
    assert "give bound" in r.stderr


def test_unit_step_follows_the_neighbour_relation(pdb):
    """K = M rows under add_remove, 2M under substitute (a replaced unit removes M rows and adds
    M): the stage facts state it, and the substitute run's test statistic counts steps of 2M."""
    t = f"{DB}.subst"
    pdb.command(f"DROP TABLE IF EXISTS {t}")
    pdb.command(f"CREATE TABLE {t} (user_id UInt64, x Float64) ENGINE = MergeTree ORDER BY user_id")
    pdb.command(f"INSERT INTO {t} SELECT number % 3000, 50 FROM numbers(6000)")
    conn = conn_as(pdb, "ptr_subst", (FLAT,))
    pdb.catalog.register(t, privacy_unit="user_id", neighbour="substitute", bounds={"x": (0, 100)},
                         max_groups_contributed=1, max_rows_per_unit=2)
    conn.ledger.set_budget(conn.analyst, t, epsilon=100.0, delta=1e-3, accountant="odp")
    a = conn.robust_iqr(FLAT, "x", epsilon=3.0, delta=DELTA)
    b = conn.robust_iqr(t, "x", epsilon=3.0, delta=DELTA)
    assert a.stages[0]["unit_step_rows"] == 2 and b.stages[0]["unit_step_rows"] == 4
    assert a.released and b.released  # constant columns: stable at either step
