"""Attack cases for private partition selection (issue 15): every rule of the controller's
``selection`` option, on the attack corpus's neighbouring tables (harness.py: D and D′ = D without
privacy unit 42, whose values no other unit has).

What may differ between D and D′ is only what a DP mechanism released: which groups come out (at
random), and their noisy values. What must not differ: whether the query is answered or refused,
the error text, the columns, the explain text and the result metadata (apart from the receipt,
the controller's own time and the per-row interval columns). A group that only unit 42 makes (a
lonely unit's group, a NULL key of its own, each of its k groups) may appear on D with
probability at most the rule's release probability at one unit, p₁ ≤ δ, and never on D′ (no row,
no group); it must not appear deterministically.

Statistics. Every group in these designs has exactly one unit: the names are unique per row
(harness._OTHERS: toString(1000 + number)) and only unit 42 has its name, so a unit's groups are
its own. Over R runs on D and R on D′ the number X of released groups is Binomial(N, p₁) with N
the number of group-runs, independent across groups and runs (each group's release is its own
draw from the kernel's CSPRNG). The test requires X < c with c the least count such that
P[Binomial(N, p₁) ≥ c] < 1e-8 (computed in `_limit`; p₁ from the plan's rule, exactly for the
optimal and Laplace rules, a rigorous tail bound for the Gaussian). This module makes 16 such
checks (4 rules × 4 cases): a correct implementation fails one with probability below 1.6e-7 <
1e-6. Unit 42's own groups are also counted on their own (at most 1 release in R runs on D:
P[Binomial(k·R, p₁) ≥ 2] ≤ C(k·R, 2)·p₁² < 1e-9 for k·R ≤ 9, p₁ ≤ 1e-6) and must never appear
on D′; a rule that released them deterministically would show them in all R runs.
"""
from __future__ import annotations

import math

import pandas as pd
import pytest
from scipy.stats import binom

from dpch.controller import prepare

from . import harness
from .harness import PAIRS, SECRET_NAME, run

DELTA = 1e-6
EPS = 1.0
R = 3  # runs per side per check
RULES = ("auto", "optimal", "gaussian", "laplace")
FAIL = 1e-8  # per statistical check (module docstring)


def _limit(n: int, p: float) -> int:
    """The least c with P[Binomial(n, p) ≥ c] < FAIL."""
    c = 0
    while binom.sf(c - 1, n, p) >= FAIL:
        c += 1
    return c


def _p1(adb, sql: str, table: str, rule: str) -> float:
    """The plan's release probability of a group of one unit (explain-only: nothing charged)."""
    sel = prepare(adb, sql.format(t=table), epsilon=EPS, delta=DELTA, selection=rule).plan.selection
    assert sel is not None, "the query does not select its groups privately"
    p1 = sel.release_probability(1)
    # one unit moves at most c counts; together its groups appear with probability ≤ δ_sel
    assert 1 - (1 - p1) ** sel.new_groups <= sel.delta * (1 + 1e-9), (p1, sel.new_groups, sel.delta)
    return p1


def _group_count(adb, sql: str, table: str) -> int:
    """Rows of a trusted owner's query (checks of the construction)."""
    return int(adb.raw_query(f"SELECT count() AS n FROM ({sql.format(t=table)})")["n"].iloc[0])


def _released(outcome, column: str) -> list:
    assert outcome.status == "ok" and outcome.charged, outcome.short()
    return list(outcome.df[column])


def _runs(adb, sql: str, pair: str, rule: str, **options):
    d, d_minus = PAIRS[pair].tables
    out = {d: [], d_minus: []}
    for _ in range(R):
        for table in (d, d_minus):
            out[table].append(run(adb, sql, table, epsilon=EPS, delta=DELTA, selection=rule, **options))
    for o_d, o_m in zip(out[d], out[d_minus]):
        for o in (o_d, o_m):
            assert not harness.leaked_secrets(o.raw_message), o.raw_message
        assert o_d.comparable(False) == o_m.comparable(False), f"SIDE CHANNEL\n  D : {o_d.short()}\n  D′: {o_m.short()}"
    return out[d], out[d_minus]


def _check_lonely(adb, sql: str, pair: str, rule: str, is_42, groups_42: int):
    """The statistical check of the module docstring for one query: ``is_42(value)`` tells unit
    42's groups (``groups_42`` of them on D, none on D′)."""
    d, d_minus = PAIRS[pair].tables
    on_d, on_dm = _runs(adb, sql, pair, rule)
    p1 = _p1(adb, sql, d, rule)
    assert p1 <= DELTA
    # group-runs: each of the 200 units (199 on D′) keeps at most k of its (lonely) groups; fewer
    # trials only make X smaller (stochastic order), so the limit for n holds a fortiori
    k = adb.catalog.get(d).max_groups_contributed
    n = R * (200 + 199) * k
    c = _limit(n, p1)
    released_d = [v for o in on_d for v in _released(o, "g")]
    released_dm = [v for o in on_dm for v in _released(o, "g")]
    total = len(released_d) + len(released_dm)
    assert total < c, f"{total} lonely groups released in {n} group-runs (p₁ = {p1:.3g}, limit {c})"
    mine = [v for v in released_d if is_42(v)]
    assert len(mine) <= 1, f"unit 42's groups released {len(mine)} times in {R} runs (p₁ = {p1:.3g})"
    assert math.comb(groups_42 * R, 2) * p1 ** 2 < 1e-9
    assert not any(is_42(v) for v in released_dm), "a group of unit 42 appears on D′"
    return on_d, on_dm


@pytest.mark.parametrize("rule", RULES)
def test_unit_alone_in_its_group(adb, rule):
    """GROUP BY name at k = 1: unit 42's name group has unit 42 only (so does every group here)."""
    sql = "SELECT name AS g, COUNT(*) AS n FROM {t} GROUP BY g"
    _check_lonely(adb, sql, "k1", rule, lambda v: v == SECRET_NAME, 1)


@pytest.mark.parametrize("rule", RULES)
def test_unit_spread_over_k_groups(adb, rule):
    """GROUP BY concat(name, '/', region) at k = 3: unit 42's six rows make three groups (its
    name with each region), each with unit 42 only; every rule is calibrated for c = 3 groups per
    unit (p₁ ≤ δ₀ < δ/3 for the optimal rule)."""
    sql = "SELECT concat(name, '/', region) AS g, COUNT(*) AS n FROM {t} GROUP BY g"
    d = PAIRS["k3"].tables[0]
    assert _group_count(adb, "SELECT concat(name, '/', region) AS g FROM {t} WHERE user_id = 42 GROUP BY g", d) == 3
    _check_lonely(adb, sql, "k3", rule, lambda v: str(v).startswith(SECRET_NAME), 3)


@pytest.mark.parametrize("rule", RULES)
def test_null_key_of_the_one_unit(adb, rule):
    """A key that is NULL for unit 42's rows only (its unit_s is not 'day'), k = 1: the NULL group
    exists on D only, with one unit; it is a group like any other (released with probability p₁,
    never on D′). (A key written with the unit column itself is refused before the charge.)"""
    sql = "SELECT if(unit_s = 'day', name, NULL) AS g, COUNT(*) AS n FROM {t} GROUP BY g"
    _check_lonely(adb, sql, "k1", rule, lambda v: pd.isna(v), 1)


@pytest.mark.parametrize("rule", RULES)
def test_nullable_key_at_k3(adb, rule):
    """A Nullable key from a parse that fails only on unit 42's name (toInt64OrNull), k = 3: unit
    42's rows all fall into the NULL group, which only unit 42 makes."""
    sql = "SELECT toInt64OrNull(name) AS g, COUNT(*) AS n FROM {t} GROUP BY g"
    _check_lonely(adb, sql, "k3", rule, lambda v: pd.isna(v), 1)


# ------------------------------------------------------------------------------------------------
# Errors, explain, metadata
# ------------------------------------------------------------------------------------------------

ERROR_CASES = [
    # a key expression that divides by zero on unit 42's rows only
    ("intdiv_key", "SELECT intDiv(1, toInt64(user_id) - 42) AS g, COUNT(*) AS n FROM {t} GROUP BY g", "k1", {}),
    # a parse that fails on unit 42's name only, as a key, k = 3
    ("parse_key_k3", "SELECT toInt64(name) AS g, COUNT(*) AS n FROM {t} GROUP BY g", "k3", {}),
    # unit 42's rows only, its NULL nregion as the key
    ("nregion_unit42", "SELECT nregion AS g, COUNT(*) AS n FROM {t} WHERE user_id = 42 GROUP BY g", "k1", {}),
]


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("case", ERROR_CASES, ids=[c[0] for c in ERROR_CASES])
def test_error_paths_do_not_depend_on_the_unit(adb, rule, case):
    """Queries that would fail on unit 42's rows, under every rule: the same outcome on D and D′
    (answered on both, or refused before the charge with the same message), no message with unit
    42's values; a supported query is never charged and then failed."""
    _, sql, pair, options = case
    d, d_minus = PAIRS[pair].tables
    o = run(adb, sql, d, epsilon=EPS, delta=DELTA, selection=rule, **options)
    o_minus = run(adb, sql, d_minus, epsilon=EPS, delta=DELTA, selection=rule, **options)
    desc = f"\n  D : {o.short()}\n  D′: {o_minus.short()}"
    for out in (o, o_minus):
        assert not harness.leaked_secrets(out.raw_message), out.raw_message
        assert out.status != "error", "charged, then failed at run time" + desc
    assert o.comparable(False) == o_minus.comparable(False), "SIDE CHANNEL" + desc


@pytest.mark.parametrize("rule,delta,epsilon,message", [
    ("optimal", 1e-40, 1.0, "selection='optimal'"),        # δ₀ below 2^-96: the rule cannot be offered
    ("gaussian", 1e-6, 1e-6, "too small"),                 # σ beyond the kernel's grid
    ("magic", 1e-6, 1.0, "selection must be one of"),
])
def test_bad_selection_parameters_are_refused_alike(adb, rule, delta, epsilon, message):
    """A rule the planner cannot offer at the budget, or an unknown rule: refused before the
    charge, with the same message on D and D′ (a function of the parameters only)."""
    sql = "SELECT name AS g, COUNT(*) AS n FROM {t} GROUP BY g"
    d, d_minus = PAIRS["k1"].tables
    outs = [run(adb, sql, t, epsilon=epsilon, delta=delta, selection=rule) for t in (d, d_minus)]
    for o in outs:
        assert o.status == "rejected" and not o.charged, o.short()
        assert message in o.message and not harness.leaked_secrets(o.raw_message), o.message
    assert outs[0].message == outs[1].message


def _metadata(df) -> dict:
    """The result metadata without what may differ per run: the receipt, the controller's time, the
    per-row interval columns (as many as the released groups); table names normalised."""
    meta = dict(df.attrs["dpch"])
    for key in ("receipt", "controller_ms"):
        meta.pop(key, None)
    meta["table"] = "<table>"
    meta["sql"] = harness.normalise(meta.get("sql") or "")
    meta["columns"] = {c: {k: v for k, v in m.items() if k not in ("ci_low", "ci_high")}
                       for c, m in meta["columns"].items()}
    return meta


def _explain(adb, sql: str, table: str, rule: str) -> tuple[str, dict]:
    ex = adb.explain(sql.format(t=table), epsilon=EPS, delta=DELTA, selection=rule)
    lines = [line for line in str(ex).splitlines() if not line.startswith("controller time")]
    return harness.normalise("\n".join(lines)), ex.selection


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("pair,sql", [
    ("k1", "SELECT name AS g, COUNT(*) AS n, SUM(amount) AS s FROM {t} GROUP BY g"),
    ("k3", "SELECT concat(name, '/', region) AS g, COUNT(DISTINCT user_id) AS u FROM {t} GROUP BY g"),
], ids=["k1", "k3"])
def test_explain_and_metadata_do_not_depend_on_the_unit(adb, rule, pair, sql):
    """explain (its text, but for the controller's time, and its selection facts) and the result
    metadata (the rule, threshold, scales, per-group ε/δ, sources, rewritten SQL; but for the
    receipt, the controller's time and the intervals of the released rows) are the same on D and
    D′: functions of the query, the catalog and the budget only."""
    d, d_minus = PAIRS[pair].tables
    text_d, sel_d = _explain(adb, sql, d, rule)
    text_m, sel_m = _explain(adb, sql, d_minus, rule)
    assert text_d == text_m
    assert sel_d == sel_m
    if rule == "auto" and pair == "k1":
        assert sel_d["rule"] == "optimal"  # c = 1: Thm 1's rule is never beaten
    o = run(adb, sql, d, epsilon=EPS, delta=DELTA, selection=rule)
    o_minus = run(adb, sql, d_minus, epsilon=EPS, delta=DELTA, selection=rule)
    assert o.status == o_minus.status == "ok" and o.charged and o_minus.charged, (o.short(), o_minus.short())
    assert _metadata(o.df) == _metadata(o_minus.df)
    assert o.df.attrs["dpch"]["selection"]["rule"] == sel_d["rule"]
    if rule != "auto":
        assert sel_d["rule"] == rule
