"""db.query / db.explain behaviour: metadata and CIs, options, the charge-before-execute order with
the ledger, fail-closed paths, sanitised errors, and the CLI."""
from __future__ import annotations

import io
import json
from contextlib import redirect_stdout

import numpy as np
import pytest

from dpch.controller import Explanation, prepare, run_query
from dpch.errors import BackendError, BudgetExceeded, InvalidParameter, QueryRejected
from dpch.execute import sanitize_error
from test_controller_fixtures import ANALYST, DB, setup_controller_data


@pytest.fixture(scope="module")
def adb(db):
    setup_controller_data(db)
    return db


def test_metadata_and_confidence_intervals(adb):
    sql = (f"SELECT region, COUNT(*) AS n, SUM(amount) AS s, AVG(age) AS a, STDDEV_POP(qty) AS sd, "
           f"COUNT(*) * 2 AS twice FROM {DB}.purchases GROUP BY region")
    df = adb.query(sql, epsilon=2.0, with_ci=True, confidence=0.9)
    assert list(df.columns) == ["region", "n", "n_lo", "n_hi", "s", "s_lo", "s_hi", "a",
                                "a_lo", "a_hi", "sd", "sd_lo", "sd_hi", "twice", "twice_lo", "twice_hi"]
    meta = df.attrs["dpch"]
    assert meta["epsilon"] == pytest.approx(2.0) and meta["delta"] == 0.0
    assert meta["confidence"] == 0.9 and meta["key_mode"] == "public"
    cols = meta["columns"]
    assert cols["region"]["kind"] == "key" and cols["twice"]["kind"] == "derived"
    n = cols["n"]
    assert n["mechanism"] == "laplace" and n["sensitivity"] == 10.0  # M = 10 rows per unit
    assert n["noise_scale"] == pytest.approx(10.0 / n["epsilon"], rel=1e-6)
    assert cols["a"]["value_bounds"] == [18.0, 100.0]
    assert (df["a_lo"] >= 18).all() and (df["a_hi"] <= 100).all()
    assert (df["n_lo"] >= 0).all() and (df["n"] >= 0).all()
    assert (df["twice"] == 2 * df["n"]).all()
    # a derived column's interval: the image of its one aggregate's interval (issue 29)
    assert np.allclose(df["twice_lo"], 2 * df["n_lo"], rtol=1e-12) and np.allclose(df["twice_hi"], 2 * df["n_hi"], rtol=1e-12)
    assert "<secret salt>" in meta["sql"]
    entry = adb.catalog.get(f"{DB}.purchases")
    assert entry.hash_key_sql() not in meta["sql"]


def test_ci_covers_true_bounded_value_with_little_noise(adb):
    """With a huge ε the CI must contain the noiseless (bounded) value. A level-L interval misses
    with probability 1 - L whatever ε is (a CI failure at L = 0.95 showed it), so the level is
    1 - 1e-8 per interval: three intervals miss with probability below 3e-8."""
    from dpch.rewrite import rewrite_for_sensitivity_check

    sql = f"SELECT COUNT(*) AS n, AVG(age) AS a, SUM(amount) AS s FROM {DB}.purchases"
    prepared = prepare(adb, sql, epsilon=1e4)
    truth = adb.raw_query(rewrite_for_sensitivity_check(prepared.plan).sql)
    df = adb.query(sql, epsilon=1e4, confidence=1 - 1e-8)
    cols = df.attrs["dpch"]["columns"]
    for c in ("n", "a", "s"):
        assert cols[c]["ci_low"][0] <= float(truth[c].iloc[0]) <= cols[c]["ci_high"][0]


def test_mechanism_and_weights_options(adb):
    sql = f"SELECT COUNT(*) AS n, SUM(amount) AS s FROM {DB}.purchases"
    ex = adb.explain(sql, epsilon=1.0, delta=1e-5, mechanism="gaussian", weights={"n": 3, "s": 1})
    assert {q["mechanism"] for q in ex.quantities} == {"gaussian"}
    eps = {q["label"]: q["epsilon"] for q in ex.quantities}
    assert eps["COUNT(*)"] == pytest.approx(0.75) and eps["SUM(amount)"] == pytest.approx(0.25)
    assert ex.delta == pytest.approx(1e-5)
    df = adb.query(sql, epsilon=1.0, delta=1e-5, mechanism="gaussian")
    assert df.attrs["dpch"]["columns"]["n"]["mechanism"] == "gaussian"
    ex = adb.explain(sql, epsilon=1.0, delta=1e-5)  # auto: Laplace is better at k = 1
    assert {q["mechanism"] for q in ex.quantities} == {"laplace"} and ex.delta == 0.0
    # k = 3: distinct-unit counts have L2 = sqrt(3) < L1 = 3, auto picks Gaussian for them at larger δ
    ex = adb.explain(f"SELECT category, COUNT(DISTINCT user_id) AS u, SUM(amount) AS s FROM {DB}.events "
                     "GROUP BY category", epsilon=1.0, delta=1e-2)
    mechs = {q["label"]: q["mechanism"] for q in ex.quantities}
    assert "gaussian" in mechs.values()


def test_explain_charges_and_runs_nothing(adb, monkeypatch):
    before = len(adb.ledger.history(ANALYST))
    calls = []
    orig = adb.backend.query_df
    monkeypatch.setattr(adb.backend, "query_df", lambda sql: calls.append(sql) or orig(sql))
    adb.catalog.list()
    calls.clear()
    ex = adb.explain(f"SELECT region, AVG(amount) AS a FROM {DB}.purchases GROUP BY region", epsilon=1.0)
    assert isinstance(ex, Explanation)
    text = str(ex)
    assert "rewritten SQL" in text and "AVG(amount).sum" in text and "<secret salt>" in text
    assert adb.catalog.get(f"{DB}.purchases").hash_key_sql() not in text
    json.dumps(ex.to_dict(), default=str)
    assert calls == []
    assert len(adb.ledger.history(ANALYST)) == before


class FakeLedger:
    def __init__(self, *, refuse=False):
        self.events = []
        self.refuse = refuse

    def precheck(self, analyst, dataset, epsilon, delta):
        self.events.append(("precheck", analyst, dataset))

    def charge(self, analyst, dataset, cost, query):
        self.events.append(("charge", analyst, dataset, cost.epsilon, cost.delta))
        if self.refuse:
            raise BudgetExceeded("over budget")
        return type("Receipt", (), {"id": 42})()

    def mark(self, receipt, outcome):
        self.events.append(("mark", outcome))


def test_charge_happens_before_execution(adb, monkeypatch):
    from dpch import typecheck

    monkeypatch.setattr(typecheck, "_PASSED", type(typecheck._PASSED)())  # a query seen before skips the probe
    ledger = FakeLedger()
    monkeypatch.setattr(adb, "_ledger", ledger)
    orig = adb.backend.query_df

    def query_df(sql):
        # the type check runs on a row of default values (no table read) before the charge
        probe = "defaultValueOfTypeName" in sql
        if "dpch_meta.unit_tables" not in sql:  # the per-unit table lookup (metadata, cached 10 s)
            ledger.events.append(("probe" if probe else "execute",))
        return orig(sql)

    monkeypatch.setattr(adb.backend, "query_df", query_df)
    df = run_query(adb, f"SELECT COUNT(*) AS n FROM {DB}.purchases", epsilon=0.5)
    kinds = [e[0] for e in ledger.events]
    # the free budget precheck comes before anything the analyst wrote reaches the engine
    assert kinds == ["precheck", "probe", "charge", "execute", "mark"] and ledger.events[-1] == ("mark", "executed")
    assert ledger.events[2][1:] == (ANALYST, f"{DB}.purchases", pytest.approx(0.5), 0.0)
    assert df.attrs["dpch"]["receipt"] == 42


def test_refused_charge_runs_nothing(adb, monkeypatch):
    ledger = FakeLedger(refuse=True)
    monkeypatch.setattr(adb, "_ledger", ledger)
    adb.catalog.list()
    ran = []
    orig = adb.backend.query_df
    monkeypatch.setattr(adb.backend, "query_df", lambda sql: ran.append(sql) or orig(sql))
    with pytest.raises(BudgetExceeded):
        adb.query(f"SELECT COUNT(*) FROM {DB}.purchases", epsilon=0.5)
    assert all("defaultValueOfTypeName" in sql for sql in ran)  # only the type check on a default row ran


def test_failed_execution_stays_charged_and_error_is_sanitised(adb, monkeypatch):
    ledger = FakeLedger()
    monkeypatch.setattr(adb, "_ledger", ledger)
    adb.catalog.list()
    salt_sql = adb.catalog.get(f"{DB}.purchases").hash_key_sql()

    orig = adb.backend.query_df

    def failing(sql):
        if "defaultValueOfTypeName" in sql:  # the type check on a default row passes
            return orig(sql)
        raise BackendError(f"Code: 6. DB::Exception: Cannot parse string 'alice@example.com' as Int64 in {sql}. "
                           "(CANNOT_PARSE_TEXT)")

    monkeypatch.setattr(adb.backend, "query_df", failing)
    with pytest.raises(BackendError) as info:
        adb.query(f"SELECT region, COUNT(*) FROM {DB}.purchases GROUP BY region", epsilon=0.5)
    msg = str(info.value)
    assert "alice" not in msg and salt_sql not in msg and "CANNOT_PARSE_TEXT" in msg
    assert [e[0] for e in ledger.events] == ["precheck", "charge", "mark"] and ledger.events[-1] == ("mark", "failed")


def test_sanitize_error():
    assert sanitize_error("Code: 46. DB::Exception: Function with name `dpch_laplace_int` does not exist. "
                          "(UNKNOWN_FUNCTION)").startswith("ClickHouse error code 46 (UNKNOWN_FUNCTION)")
    assert "secret" not in sanitize_error("weird failure with secret 123")


def test_real_ledger_charges_the_plan_cost(adb):
    status = adb.ledger.remaining(ANALYST, f"{DB}.purchases")
    adb.query(f"SELECT COUNT(*) FROM {DB}.purchases", epsilon=0.25)
    after = adb.ledger.remaining(ANALYST, f"{DB}.purchases")
    assert after.spent.epsilon - status.spent.epsilon == pytest.approx(0.25)


def test_budget_exceeded_with_real_ledger(adb):
    adb.command(f"CREATE TABLE IF NOT EXISTS {DB}.budget_tbl (u UInt64, v Float64) ENGINE = Memory")
    adb.catalog.register(f"{DB}.budget_tbl", privacy_unit="u", bounds={"v": (0, 1)})
    adb.ledger.set_budget(ANALYST, f"{DB}.budget_tbl", epsilon=0.5)
    adb.query(f"SELECT COUNT(*) FROM {DB}.budget_tbl", epsilon=0.4)
    with pytest.raises(BudgetExceeded):
        adb.query(f"SELECT COUNT(*) FROM {DB}.budget_tbl", epsilon=0.2)
    assert adb.ledger.remaining(ANALYST, f"{DB}.budget_tbl").spent.epsilon == pytest.approx(0.4)


def test_unknown_option_and_gaussian_without_delta(adb):
    with pytest.raises(InvalidParameter):
        adb.explain(f"SELECT COUNT(*) FROM {DB}.purchases", epsilon=1, nosuch=1)
    with pytest.raises(QueryRejected):
        adb.explain(f"SELECT COUNT(*) FROM {DB}.nosuch", epsilon=1)


def test_controller_time_is_small(adb):
    """Generous bound (the bench measures the real number): parse+bind+plan+rewrite of a typical
    query takes a few ms, not hundreds."""
    sql = f"SELECT region, COUNT(*) AS n, SUM(amount) AS s, AVG(age) AS a FROM {DB}.purchases GROUP BY region"
    prepare(adb, sql, epsilon=1.0)
    times = sorted(prepare(adb, sql, epsilon=1.0).controller_ms for _ in range(15))
    assert times[len(times) // 2] < 50.0


def _cli(*argv) -> str:
    from dpch.cli import main

    buf = io.StringIO()
    with redirect_stdout(buf):
        code = main(list(argv))
    assert code == 0, buf.getvalue()
    return buf.getvalue()


def test_cli_query_explain_catalog(adb):
    common = ["--data-dir", str(adb.data_dir), "--analyst", ANALYST, "--ledger", str(adb.ledger_path)]
    out = _cli("catalog", "show", f"{DB}.purchases", *common)
    assert "privacy unit: user_id" in out and "public keys (4)" in out
    out = _cli("catalog", "list", *common)
    assert f"{DB}.purchases" in out
    out = _cli("explain", f"SELECT region, COUNT(*) FROM {DB}.purchases GROUP BY region", "--epsilon", "1", *common)
    assert "rewritten SQL" in out and "<secret salt>" in out
    out = _cli("query", f"SELECT region, COUNT(*) AS n FROM {DB}.purchases GROUP BY region", "--epsilon", "1",
               "--format", "json", "--keys", "region=EU,US", *common)
    rows = json.loads(out)
    assert sorted(r["region"] for r in rows) == ["EU", "US"]
    adb.command(f"CREATE TABLE IF NOT EXISTS {DB}.cli_tbl (u UInt64, v Float64, g String) ENGINE = Memory")
    out = _cli("catalog", "register", f"{DB}.cli_tbl", "--privacy-unit", "u", "--bounds", "v=0:10",
               "--max-rows", "3", "--public-keys", "g=a,b", *common)
    assert "bounds [0.0, 10.0]" in out
    out = _cli("catalog", "drop", f"{DB}.cli_tbl", *common)
    assert f"{DB}.cli_tbl" not in adb.catalog


def test_cli_selection_flag_picks_the_rule(adb):
    """`--selection` reaches the planner: explain names the forced rule (issue 15)."""
    common = ["--data-dir", str(adb.data_dir), "--analyst", ANALYST, "--ledger", str(adb.ledger_path)]
    sql = f"SELECT category, COUNT(*) FROM {DB}.events GROUP BY category"
    for rule in ("laplace", "optimal"):
        out = _cli("explain", sql, "--epsilon", "1", "--delta", "1e-6", "--selection", rule, *common)
        assert f"partition selection ({rule} rule" in out, out


def test_cli_top_k_flag_picks_the_method(adb):
    """`--top-k` reaches the planner: explain names peeling, or post-processing (issue 15)."""
    common = ["--data-dir", str(adb.data_dir), "--analyst", ANALYST, "--ledger", str(adb.ledger_path)]
    sql = f"SELECT region, COUNT(*) AS n FROM {DB}.purchases GROUP BY region ORDER BY n DESC LIMIT 2"
    out = _cli("explain", sql, "--epsilon", "1", "--top-k", "peeling", *common)
    assert "top-n: the 2 groups with the largest COUNT(*)" in out and "dpch_top_k(" in out, out
    out = _cli("explain", sql, "--epsilon", "1", "--top-k", "post_processing", *common)
    assert "top-n: every group's value noised" in out and "dpch_top_k(" not in out, out
