"""Group keys: public key domains versus private partition selection (thresholding).

Thresholding test, and how its tolerance was chosen. Table ``t_controller.lonely`` has 2000 groups
each held by exactly one unit, and one group held by 500 units. With ε = 1, δ = 1e-3 and k = 1 the
planner gives partition selection δ_sel = 1e-3, so a single-unit group is released with probability
p <= δ₁ = 1 - (1 - δ_sel)^(1/k) = 1e-3 (the rule chosen is the optimal one of dpch.plan.selection,
whose p = π(1) is exact and also checked; the Laplace threshold's formula is checked on its own).
Every group gets independent noise, so R = 3 runs give n = 6000 independent trials
and the number X of released lonely groups is stochastically below Binomial(n, δ₁). The test fails
iff X >= c with c the least integer such that P[Binomial(n, δ₁) >= c] < 1e-6 (computed with scipy),
so a correct implementation fails with probability below 1e-6. The 500-unit group must be released
in every run: it misses only if the noise is below T - 500, probability < 1e-100 here."""
from __future__ import annotations

import pytest
from scipy.stats import binom

from dpch.controller import prepare
from dpch.plan import selection_release_probability
from test_controller_fixtures import ANALYST, DB, setup_controller_data

N_LONELY = 2000
RUNS = 3


@pytest.fixture(scope="module")
def kdb(db):
    setup_controller_data(db)
    db.command(f"DROP TABLE IF EXISTS {DB}.lonely")
    db.command(f"CREATE TABLE {DB}.lonely (user_id UInt64, grp String, x Float64) ENGINE = MergeTree ORDER BY user_id")
    db.command(f"INSERT INTO {DB}.lonely SELECT number, concat('g', toString(number)), 1. "
               f"FROM numbers({N_LONELY}) ARRAY JOIN [1, 2, 3] AS rep")
    db.command(f"INSERT INTO {DB}.lonely SELECT {N_LONELY} + number, 'big', 2. FROM numbers(500)")
    db.catalog.register(f"{DB}.lonely", privacy_unit="user_id", bounds={"x": (0, 10)}, max_groups_contributed=1,
                        max_rows_per_unit=5)
    db.ledger.set_budget(ANALYST, f"{DB}.lonely", epsilon=1e9, delta=0.5)
    return db


def test_thresholding_releases_single_unit_groups_rarely(kdb):
    sql = f"SELECT grp, COUNT(*) AS n FROM {DB}.lonely GROUP BY grp"
    eps, delta = 1.0, 1e-3
    prepared = prepare(kdb, sql, epsilon=eps, delta=delta)
    sel = prepared.plan.selection
    assert prepared.plan.key_mode == "threshold" and sel is not None
    assert sel.delta == pytest.approx(delta)
    p_exact = sel.release_probability(1)  # the rule chosen (optimal here: exactly δ(1 - 2^-30))
    assert p_exact <= sel.delta * (1 + 1e-12)
    n = N_LONELY * RUNS
    c = 0
    while binom.sf(c - 1, n, sel.delta) >= 1e-6:
        c += 1
    released_lonely = 0
    for _ in range(RUNS):
        df = kdb.query(sql, epsilon=eps, delta=delta)
        groups = set(df["grp"])
        assert "big" in groups
        released_lonely += len(groups - {"big"})
    assert released_lonely < c, (released_lonely, c, p_exact)


def test_thresholding_threshold_formula(kdb):
    """Laplace rule: T is the least integer with P[1 + K >= T] <= δ₁; T - 1 would exceed it."""
    prepared = prepare(kdb, f"SELECT grp, COUNT(*) FROM {DB}.lonely GROUP BY grp", epsilon=1.0, delta=1e-3,
                       selection="laplace")
    sel = prepared.plan.selection
    assert selection_release_probability(sel.scale, sel.threshold, 1) <= 1e-3
    assert selection_release_probability(sel.scale, sel.threshold - 1, 1) > 1e-3


def test_public_keys_include_empty_groups(kdb):
    sql = f"SELECT region, COUNT(*) AS n, SUM(amount) AS s FROM {DB}.purchases GROUP BY region"
    for _ in range(3):
        df = kdb.query(sql, epsilon=1.0)
        assert sorted(df["region"]) == ["AFRICA", "ASIA", "EU", "US"]  # AFRICA has no rows
    assert df.attrs["dpch"]["key_mode"] == "public"
    assert df.attrs["dpch"]["delta"] == 0.0  # public keys cost no δ


def test_query_keys_override_and_drop_other_keys(kdb):
    sql = f"SELECT region, COUNT(*) AS n FROM {DB}.purchases GROUP BY region"
    df = kdb.query(sql, epsilon=1.0, keys={"region": ["EU", "MARS"]})
    assert sorted(df["region"]) == ["EU", "MARS"]


def test_query_keys_make_thresholding_unnecessary(kdb):
    sql = f"SELECT grp, COUNT(*) AS n FROM {DB}.lonely GROUP BY grp"
    df = kdb.query(sql, epsilon=1.0, keys={"grp": ["g1", "g2", "nothing"]})
    assert sorted(df["grp"]) == ["g1", "g2", "nothing"]


def test_bounded_integer_keys_are_enumerated(kdb):
    df = kdb.query(f"SELECT qty, COUNT(*) AS n FROM {DB}.purchases GROUP BY qty", epsilon=1.0)
    assert sorted(df["qty"]) == list(range(0, 11))  # bounds (0, 10); rows with qty 11, 12 dropped


def test_noisy_values_are_computed_once(kdb):
    """HAVING, ORDER BY and the output see the same draw (a recomputed UDF call would differ)."""
    sql = f"SELECT region, COUNT(*) AS n, AVG(age) AS a FROM {DB}.purchases GROUP BY region HAVING n > 500 ORDER BY n"
    prepared = prepare(kdb, sql, epsilon=0.01)
    for _ in range(10):
        df = kdb.raw_query(prepared.rewritten.sql)
        assert (df["n"] > 500).all()
        assert (df["n"] == df["__dp_n0_out"].clip(lower=0)).all()
        assert list(df["n"]) == sorted(df["n"])


def test_selection_threshold_at_a_very_large_epsilon():
    """ε = 10⁴ makes q = e^(-1/τ) underflow to 0; the threshold is then 2 (one unit's count 1 plus
    noise that is 0 with probability 1 - 2q/(1+q)), not a math domain error."""
    from dpch.plan import selection_threshold

    assert selection_threshold(1e-4, 1e-6, 1) == 2
    assert selection_release_probability(1e-4, 2) == 0.0
