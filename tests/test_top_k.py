"""Noisy top-n (issue 15): the kernel's peeling permute-and-flip (dpch._noise.top_k, the UDF
`dpch_top_k`), its reference dpch.mechanisms.TopKMechanism, and the controller's top-n queries
(`GROUP BY k ORDER BY COUNT(*)/SUM(x) DESC LIMIT n`, option top_k=, dpch.plan.top_k).

Exact checks: the reference's distribution over ordered tuples is the product of the rounds'
permute-and-flip probabilities (ExponentialMechanism.probabilities, itself checked by brute force
in test_exponential_mechanism.py); the kernel is compared with it by Pearson χ², and the privacy
loss is computed exactly on neighbouring score vectors. The controller's sensitivity claims are
checked without noise on neighbouring datasets (as in test_controller_sensitivity.py).

Non-flakiness is stated at each statistical check.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from dpch import _noise
from dpch.bind import bind
from dpch.errors import BackendError, InvalidParameter
from dpch.mechanisms import TopKMechanism
from dpch.parse import parse
from dpch.plan import QueryOptions, make_plan
from dpch.rewrite import rewrite_for_sensitivity_check
from test_controller_fixtures import DB, setup_controller_data
from test_controller_sensitivity import _neighbour_table
from test_quantiles import _chi2_ok as _chi2


KERNEL_CASES = [
    # (scores, n, ε, Δ)
    ([10, 9, 8, 0, 0, 0], 3, 1.0, 1),
    ([5, 5, 5, 5], 2, 0.5, 1),            # ties: uniform over ordered pairs
    ([-3, 7, -1, 2, 7], 2, 2.0, 3),       # negative scores, two maximisers, Δ > 1
    ([100, 0, 50], 1, 0.1, 10),            # n = 1: one permute-and-flip
    ([4, 1], 3, 1.0, 1),                   # fewer candidates than n: both, in a random order
    ([0, 2, 4, 6, 8, 10, 12], 2, 1.0, 2),
]


@pytest.mark.parametrize("scores,n,eps,sens", KERNEL_CASES)
def test_kernel_matches_the_exact_distribution(scores, n, eps, sens):
    """60 000 kernel releases vs the reference's exact distribution over ordered tuples. Threshold:
    the χ² quantile at 1e-7 (six cases: < 1e-6 per run for a correct kernel). A kernel that chose
    with replacement, or ran every round at ε instead of ε/n, moves the top cells by several
    percent: χ² in the hundreds."""
    m = TopKMechanism(eps, n, sens)
    probs = m.probabilities(scores)
    assert math.isclose(sum(probs.values()), 1.0, rel_tol=1e-9)
    draws = [tuple(d) for d in m.sample(scores, 60_000)]
    stat, limit = _chi2(draws, probs, 1e-7)
    assert stat < limit, (stat, limit)


def test_reference_is_the_product_of_rounds():
    """Independent check of the reference for two rounds: P(i, j) = p1(i) · p2(j | i) with each
    round's permute-and-flip probability computed by brute force over all visiting orders."""
    scores, eps, n = [6, 3, 1], 1.0, 2
    m = TopKMechanism(eps, n, 1)
    temp = float(m.temperature)

    def pf(u):  # brute force: every visiting order equally likely, accept r w.p. exp(-(max - u_r)/T)
        acc = [math.exp(-(max(u) - x) / temp) for x in u]
        out = [0.0] * len(u)
        orders = list(itertools.permutations(range(len(u))))
        for order in orders:
            reach = 1.0
            for r in order:  # the first acceptance in this order
                out[r] += reach * acc[r] / len(orders)
                reach *= 1 - acc[r]
        # an order where nobody accepts cannot happen (a maximiser always accepts)
        return out

    p1 = pf(scores)
    expect = {}
    for i in range(3):
        rest = [j for j in range(3) if j != i]
        for j, p in zip(rest, pf([scores[r] for r in rest])):
            expect[(i, j)] = p1[i] * p
    got = m.probabilities(scores)
    assert set(got) == set(expect)
    for key in expect:
        assert math.isclose(got[key], expect[key], rel_tol=1e-12), key


@pytest.mark.parametrize("scores,moved,n,eps,sens", [
    ([10, 9, 8, 0], [9, 10, 7, 1], 2, 1.0, 1),      # every score moves by Δ, in both directions
    ([3, 3, 3], [2, 4, 3], 2, 0.5, 1),
    ([20, 14, 8, 2], [17, 17, 5, 5], 3, 2.0, 3),
    ([5, 0], [4, 1], 1, 1.0, 1),
])
def test_exact_privacy_loss_is_at_most_epsilon(scores, moved, n, eps, sens):
    """Neighbouring score vectors (each score moved by at most Δ, any number of them): the exact
    max |log P(o)/P′(o)| over ordered outcomes is <= the claimed ε (privacy_function), and above
    ε/8 (the check is not vacuous: the mechanism does use its budget)."""
    assert max(abs(a - b) for a, b in zip(scores, moved)) <= sens
    m = TopKMechanism(eps, n, sens)
    p, q = m.probabilities(scores), m.probabilities(moved)
    assert set(p) == set(q)
    loss = max(abs(math.log(p[o] / q[o])) for o in p)
    assert loss <= m.privacy_function().epsilon * (1 + 1e-12), loss
    assert m.privacy_function().epsilon <= eps * (1 + 1e-12)
    assert loss > eps / 8, loss


def test_kernel_arguments_are_checked():
    with pytest.raises(ValueError, match="epsilon"):
        _noise.top_k([1, 2], 1, 0.0, 1)
    with pytest.raises(ValueError, match="n must be"):
        _noise.top_k([1, 2], 0, 1.0, 1)
    with pytest.raises(ValueError, match="sensitivity"):
        _noise.top_k([1, 2], 1, 1.0, 0)
    with pytest.raises(ValueError, match="2\\^62"):
        _noise.top_k([1, 1 << 62], 1, 1.0, 1)
    assert _noise.top_k([], 3, 1.0, 1, 2) == [[], []]
    with pytest.raises(InvalidParameter):
        TopKMechanism(1.0, 0)


# ------------------------------------------------------------------------------------------------
# The UDF
# ------------------------------------------------------------------------------------------------

def _udf(db, scores, n, eps, sens):
    arr = "CAST([" + ", ".join(str(s) for s in scores) + "] AS Array(Int64))"
    return db.raw_query(f"SELECT dpch_top_k({arr}, toUInt32({n}), {eps!r}, toUInt64({sens})) AS t")["t"].iloc[0]


def test_udf_releases_and_checks_its_arguments(db):
    got = list(_udf(db, [10, 9, 8, 0, 0], 3, 1.0, 1))
    assert len(got) == 3 and len(set(got)) == 3 and all(0 <= i < 5 for i in got)
    assert list(_udf(db, [], 3, 1.0, 1)) == []
    assert sorted(_udf(db, [1, 2], 5, 1.0, 1)) == [0, 1]
    for args, word in [((0.0, 1), "epsilon"), ((float("nan"), 1), "epsilon"), ((1.0, 0), "sensitivity")]:
        with pytest.raises(BackendError, match=word):
            _udf(db, [1, 2, 3], 2, *args)
    with pytest.raises(BackendError, match="n must be"):
        _udf(db, [1, 2, 3], 0, 1.0, 1)


def test_udf_takes_a_large_candidate_set(db):
    """300 000 candidates (2.4 MB in one row) pass through the growing input buffer; the maximiser
    far above the rest is chosen first: every other candidate's acceptance probability is
    exp(-10^6 / T) with T = 2 (ε = 1, n = 1), i.e. 0."""
    got = db.raw_query("SELECT dpch_top_k(arrayMap(i -> if(i = 123456, toInt64(1000000), toInt64(i % 7)), "
                       "range(300000)), toUInt32(1), 1.0, toUInt64(1)) AS t")["t"].iloc[0]
    assert list(got) == [123456]


# ------------------------------------------------------------------------------------------------
# The planner
# ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tdb(db):
    setup_controller_data(db)
    return db


def _plan(db, table, sql, eps=1.0, delta=0.0, **opts):
    entry = db.catalog.get(f"{DB}.{table}")
    if opts.get("max_groups_contributed"):
        from dataclasses import replace
        entry = replace(entry, max_groups_contributed=opts.pop("max_groups_contributed"))
    return make_plan(bind(parse(sql.format(t=f"{DB}.{table}")), entry), eps, delta, QueryOptions.from_kwargs(opts))


TOP_COUNT = "SELECT category, COUNT(*) AS n FROM {t} GROUP BY category ORDER BY n DESC LIMIT {n}"


def test_auto_keeps_post_processing_when_one_unit_touches_one_group(tdb):
    """k = 1: the histogram's Laplace noise (b = C/ε) decides the order better than n rounds at
    ε/(2n) each; auto keeps post-processing and records both scores."""
    plan = _plan(tdb, "purchases", "SELECT region, COUNT(*) AS n FROM {t} GROUP BY region ORDER BY n DESC LIMIT 2")
    assert plan.top_k is None
    assert plan.top_k_scores["post_processing"] < plan.top_k_scores["peeling"]


def test_auto_peels_when_a_unit_touches_many_more_groups_than_n(tdb):
    """k = 3, C = 5 (events), n = 1: the histogram's Laplace b = 15/ε (std 21.2) against one round
    at ε/2 (T = 2·5/0.5 = 20, Gumbel std 25.7) and the chosen value's b = 5/0.5 = 10 (std 14.1):
    post-processing wins at k = 3; at k = 20 (b = 100/ε) peeling wins."""
    sql = "SELECT region, COUNT(*) AS n FROM {t} GROUP BY region ORDER BY n DESC LIMIT 1"
    keys = {"keys": {"region": ["EU", "US", "ASIA"]}}
    small = _plan(tdb, "events", sql, **keys)
    assert small.top_k is None
    assert math.isclose(small.top_k_scores["post_processing"], math.sqrt(2) * 15, rel_tol=1e-6)
    assert math.isclose(small.top_k_scores["peeling"], math.pi / math.sqrt(6) * 20, rel_tol=1e-6)
    big = _plan(tdb, "events", sql, max_groups_contributed=20, **keys)
    assert big.top_k is not None and big.top_k.n == 1
    assert big.top_k_scores["peeling"] < big.top_k_scores["post_processing"]


def test_peeling_plan_budget_and_sensitivities(tdb):
    """Forced peeling, k = 3, n = 2, C = 5, M = 20: Δ = min(C, M) = 5; the released count's L1 is
    the plan's with k replaced by min(k, n) = 2 (2·5 = 10, not 15); ε splits equally between the
    selection and the count; the cost composes to ε; an ordering aggregate that is not an output is
    neither noised nor charged."""
    sql = "SELECT region, COUNT(*) AS n FROM {t} GROUP BY region ORDER BY n DESC LIMIT 2"
    keys = {"keys": {"region": ["EU", "US", "ASIA"]}}
    plan = _plan(tdb, "events", sql, top_k="peeling", **keys)
    t = plan.top_k
    assert t.sensitivity == 5 and t.release_k == 2 and not t.score_only
    q = plan.quantities[t.quantity]
    assert q.l1 == 10 and math.isclose(q.epsilon, 0.5) and math.isclose(t.epsilon, 0.5)
    assert math.isclose(plan.cost.epsilon, 1.0)
    assert [m.kind for m in plan.cost.mechanisms] == ["laplace", "exponential"]
    assert float(t.mechanism().temperature) >= 2 * 5 * 2 / 0.5
    base = _plan(tdb, "events", sql, top_k="post_processing", **keys)
    assert base.quantities[0].l1 == 15 and base.top_k is None
    only = _plan(tdb, "events", "SELECT region FROM {t} GROUP BY region ORDER BY COUNT(*) DESC LIMIT 2",
                 top_k="peeling", **keys)
    assert only.top_k.score_only and not only.quantities[only.top_k.quantity].released
    assert [m.kind for m in only.cost.mechanisms] == ["exponential"] and math.isclose(only.top_k.epsilon, 1.0)
    weighted = _plan(tdb, "events", sql, top_k="peeling", weights={"top_k_selection": 3}, **keys)
    assert math.isclose(weighted.top_k.epsilon, 0.75)


def test_sum_score_sensitivity(tdb):
    """SUM(amount) over [0, 500]: the score is in grid units g; Δ = min(C, M) · max(|L|, |H|) units
    (add/remove), and under substitution (max(0, H) - min(0, L)) for a range that straddles 0."""
    plan = _plan(tdb, "purchases", "SELECT region, SUM(amount) AS s FROM {t} GROUP BY region ORDER BY s DESC LIMIT 1",
                 top_k="peeling")
    q = plan.quantities[plan.top_k.quantity]
    assert plan.top_k.sensitivity == 10 * max(abs(q.lo_units), abs(q.hi_units))
    sub = _plan(tdb, "subst", "SELECT category, SUM(amount - 100) AS s FROM {t} GROUP BY category "
                "ORDER BY s ASC LIMIT 1", 1.0, 1e-6, top_k="peeling")
    qs = sub.quantities[sub.top_k.quantity]
    assert qs.lo_units < 0 < qs.hi_units
    assert sub.top_k.sensitivity == 5 * (qs.hi_units - qs.lo_units)
    assert not sub.top_k.shape.descending


@pytest.mark.parametrize("sql,word", [
    ("SELECT region, COUNT(*) AS n FROM {t} GROUP BY region ORDER BY n DESC", "LIMIT"),
    ("SELECT region, COUNT(*) AS n FROM {t} GROUP BY region HAVING n > 3 ORDER BY n DESC LIMIT 2", "HAVING"),
    ("SELECT region, AVG(amount) AS a FROM {t} GROUP BY region ORDER BY a DESC LIMIT 2", "COUNT or SUM"),
    ("SELECT COUNT(*) AS n FROM {t} ORDER BY n DESC LIMIT 1", "grouped"),
])
def test_forced_peeling_on_another_query_is_refused_before_the_charge(tdb, sql, word):
    before = tdb.ledger.remaining("tester", f"{DB}.purchases").queries
    with pytest.raises(InvalidParameter, match=word):
        tdb.query(sql.format(t=f"{DB}.purchases"), epsilon=1.0, top_k="peeling")
    assert tdb.ledger.remaining("tester", f"{DB}.purchases").queries == before
    with pytest.raises(InvalidParameter, match="top_k must be one of"):
        tdb.query(sql.format(t=f"{DB}.purchases"), epsilon=1.0, top_k="fastest")


# ------------------------------------------------------------------------------------------------
# Neighbouring datasets, noise off
# ------------------------------------------------------------------------------------------------

def _all_groups(db, table, sql_all, delta, table_sql=None):
    """Every group's bounded quantities (noise off, no selection) of the query without ORDER/LIMIT."""
    plan = _plan(db, table, sql_all, 1.0, delta)
    rw = rewrite_for_sensitivity_check(plan, table=table_sql)
    df = db.raw_query(rw.sql)
    keys = [o.name for o in plan.bound.outputs if o.kind == "key"]
    return plan, {tuple(str(df[c].iloc[i]) for c in keys): np.array([int(df[c].iloc[i]) for c in rw.internal_columns])
                  for i in range(len(df))}


NEIGHBOUR_CASES = [
    # (table, query with {t} and {tail}, delta, n, score label)
    ("events", "SELECT category, COUNT(*) AS n, SUM(amount) AS s FROM {t} GROUP BY category{tail}", 1e-6, 2,
     " ORDER BY n DESC LIMIT 2"),
    ("events", "SELECT region, qty, SUM(amount) AS s, COUNT(DISTINCT user_id) AS u FROM {t} GROUP BY region, qty{tail}",
     1e-6, 1, " ORDER BY s DESC LIMIT 1"),
    ("subst", "SELECT category, COUNT(*) AS n, SUM(amount - 100) AS s FROM {t} GROUP BY category{tail}", 1e-6, 1,
     " ORDER BY s ASC LIMIT 1"),
    ("purchases", "SELECT region, SUM(amount) AS s, COUNT(*) AS n FROM {t} GROUP BY region{tail}", 0.0, 3,
     " ORDER BY n DESC LIMIT 3"),
    ("onerow", "SELECT category, COUNT(*) AS n, COUNT(DISTINCT user_id) AS u FROM {t} GROUP BY category{tail}", 1e-6, 1,
     " ORDER BY u DESC LIMIT 1"),
]


@pytest.mark.parametrize("table,template,delta,n,tail", NEIGHBOUR_CASES, ids=[c[1][:50] for c in NEIGHBOUR_CASES])
def test_neighbours_move_scores_and_released_values_within_the_plan(tdb, table, template, delta, n, tail):
    """For units 0 (1000 rows in every group), 7 and 123: every group's score moves by at most Δ,
    and for EVERY set of n groups (the worst: the n largest changes) each released quantity moves
    by at most its L1/L2 in the peeling plan (k replaced by min(k, n)). Checked on D/D′ with the
    noise off; the heavy unit makes the check bite (worst ratio > 0)."""
    peel = _plan(tdb, table, template.format(t="{t}", tail=tail), 1.0, delta, top_k="peeling")
    t = peel.top_k
    assert t is not None and t.release_k == min(peel.bounding.k, n)
    plan_all, base = _all_groups(tdb, table, template.format(t="{t}", tail=""), delta)
    labels = [q.key for q in plan_all.quantities]
    entry = tdb.catalog.get(f"{DB}.{table}")
    worst = 0.0
    for unit in (0, 7, 123):
        _, other = _all_groups(tdb, table, template.format(t="{t}", tail=""), delta,
                               _neighbour_table(tdb, table, unit, entry.neighbour))
        keys = set(base) | set(other)
        zero = np.zeros(len(labels), dtype=np.int64)
        diffs = np.array([base.get(k, zero) - other.get(k, zero) for k in keys], dtype=float)
        score_col = labels.index(peel.quantities[t.quantity].key)
        assert np.abs(diffs[:, score_col]).max() <= t.sensitivity, unit
        worst = max(worst, np.abs(diffs[:, score_col]).max() / t.sensitivity)
        for q in peel.quantities:
            if not q.released or q.is_selection:
                continue
            col = np.sort(np.abs(diffs[:, labels.index(q.key)]))[::-1][:n]
            assert col.sum() <= q.l1 + 1e-9, (q.label, unit, col.sum(), q.l1)
            assert math.sqrt((col ** 2).sum()) <= q.l2 + 1e-9, (q.label, unit)
    assert worst > 0.0


def test_noise_off_peeling_returns_the_exact_top_n(tdb):
    """The peeling stage without noise (neighbouring checks only) is the exact top n by score."""
    sql = f"SELECT category, COUNT(*) AS n FROM {DB}.events GROUP BY category ORDER BY n DESC LIMIT 3"
    entry = tdb.catalog.get(f"{DB}.events")
    plan = make_plan(bind(parse(sql), entry), 1.0, 1e-6, QueryOptions(top_k="peeling"))
    got = tdb.raw_query(rewrite_for_sensitivity_check(plan).sql)
    _, every = _all_groups(tdb, "events", "SELECT category, COUNT(*) AS n FROM {t} GROUP BY category", 1e-6)
    ranked = sorted(every.items(), key=lambda kv: -kv[1][0])
    assert sorted(int(v) for v in got["n"]) == sorted(int(v[1][0]) for v in ranked[:3])
    assert len(got) == 3


# ------------------------------------------------------------------------------------------------
# End to end through db.query / explain
# ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def zipf(tdb):
    """100 groups g0..g99, one row per unit (k = 1, M = 1): g0, g1, g2 have 3000, 2600, 2200
    units, every other group 400 + (i % 50) units."""
    t = f"{DB}.topk_zipf"
    tdb.command(f"DROP TABLE IF EXISTS {t}")
    tdb.command(f"CREATE TABLE {t} (user_id UInt64, g String, v Float64) ENGINE = MergeTree ORDER BY user_id")
    tdb.command(f"INSERT INTO {t} SELECT rowNumberInAllBlocks() AS user_id, concat('g', toString(i)) AS g, "
                f"toFloat64(i % 10) AS v FROM (SELECT arrayJoin(range(100)) AS i) "
                f"ARRAY JOIN range(multiIf(i = 0, 3000, i = 1, 2600, i = 2, 2200, 400 + i % 50)) AS r")
    keys = [f"g{i}" for i in range(100)]
    tdb.catalog.register(t, privacy_unit="user_id", max_groups_contributed=1, max_rows_per_unit=1,
                         bounds={"v": (0, 10)}, public_keys={"g": keys})
    tdb.ledger.set_budget("tester", t, epsilon=1e6, delta=0.5)
    return t


def test_peeling_finds_a_clear_top_three(tdb, zipf):
    """n = 3, ε = 1 split between the selection and the counts: T = 2·1·3/0.5 = 12. A group outside
    the true top 3 (gap >= 2200 - 449 = 1751 to the best left) is accepted in some round with
    probability <= 3 · 97 · exp(-1751/12) < 1e-60, so the released set is the true top 3 except
    with negligible probability; the counts are within their 1e-7 Laplace interval (b = 2)."""
    df = tdb.query(f"SELECT g, COUNT(*) AS n FROM {zipf} GROUP BY g ORDER BY n DESC LIMIT 3",
                   epsilon=1.0, top_k="peeling")
    assert list(df["g"]) == ["g0", "g1", "g2"]  # ordered by the noisy counts, gaps of 400 >> 2·b·ln(1e7)
    b = 1 / 0.5
    for got, true in zip(df["n"], [3000, 2600, 2200]):
        assert abs(got - true) <= b * math.log(1e7), (got, true)
    meta = df.attrs["dpch"]
    assert meta["top_k"]["method"] == "peeling" and meta["top_k"]["candidates"] == 100
    assert math.isclose(meta["epsilon"], 1.0)
    only = tdb.query(f"SELECT g FROM {zipf} GROUP BY g ORDER BY COUNT(*) DESC LIMIT 3", epsilon=1.0, top_k="peeling")
    assert list(only.columns) == ["g"] and list(only["g"]) == ["g0", "g1", "g2"]  # in the order chosen
    low = tdb.query(f"SELECT g, SUM(v) AS s FROM {zipf} GROUP BY g ORDER BY s ASC LIMIT 2 OFFSET 1",
                    epsilon=1.0, top_k="peeling")
    assert len(low) == 2 and math.isclose(low.attrs["dpch"]["epsilon"], 1.0)


def test_peeling_recall_at_a_small_epsilon(tdb, zipf):
    """ε = 0.05 (T = 2·1·3/0.025 = 240). A release misses a true top-3 group only if some round
    accepts one of the 97 others, at gap >= 1751 from the best left: probability <= 3·97·
    exp(-1751/240) ≈ 0.197 per release (union bound), independently across releases. Asserting at
    least 6 perfect releases out of 20 fails with probability P[Bin(20, 0.197) >= 15] < 1e-6
    (computed below)."""
    true = {"g0", "g1", "g2"}
    p_miss = 3 * 97 * math.exp(-1751 / 240)
    assert stats.binom.sf(14, 20, p_miss) < 1e-6
    perfect = 0
    for _ in range(20):
        df = tdb.query(f"SELECT g FROM {zipf} GROUP BY g ORDER BY COUNT(*) DESC LIMIT 3", epsilon=0.05, top_k="peeling")
        assert len(df) == 3 and len(set(df["g"])) == 3
        perfect += set(df["g"]) == true
    assert perfect >= 6, perfect


def test_explain_and_privately_selected_candidates(tdb, zipf):
    sql = f"SELECT g, COUNT(*) AS n FROM {zipf} GROUP BY g ORDER BY n DESC LIMIT 3"
    text = str(tdb.explain(sql, epsilon=1.0, top_k="peeling"))
    assert "top-n: the 3 groups with the largest COUNT(*)" in text and "among 100" in text
    assert "dpch_top_k(" in text
    auto = str(tdb.explain(sql, epsilon=1.0))  # k = 1: post-processing wins, and explain says why
    assert "top-n: every group's value noised" in auto and "auto: order noise std" in auto
    assert "dpch_top_k(" not in auto
    # v (Float64) has no public domain: the candidates are the privately selected groups
    df = tdb.query(f"SELECT v, COUNT(*) AS n FROM {zipf} GROUP BY v ORDER BY n DESC LIMIT 2", epsilon=1.0,
                   delta=1e-6, top_k="peeling")
    assert df.attrs["dpch"]["key_mode"] == "threshold" and df.attrs["dpch"]["top_k"]["method"] == "peeling"
    assert len(df) == 2 and len(set(df["v"])) == 2 and set(df["v"]) <= set(float(i) for i in range(10))


# ------------------------------------------------------------------------------------------------
# The SQL function dp_top_k(x, domain, n, eps) (row level)
# ------------------------------------------------------------------------------------------------

def test_sql_function_matches_the_exact_distribution(db):
    """20 000 releases in one query (GROUP BY rep over a cross join; one UDF row per rep) of
    dp_top_k(x, ['a','b','c','d'], 2, 1.0) on a: 3 rows, b: 2, e (outside the domain): 4, NULL: 2.
    The scores are the per-value row counts [3, 2, 0, 0] (Δ = 1: one row adds 1 to one value);
    compared with TopKMechanism(1, 2, 1) exactly by χ² at the 1e-7 quantile."""
    df = db.raw_query(
        "SELECT rep, dp_top_k(x, ['a', 'b', 'c', 'd'], 2, 1.0) AS t FROM "
        "(SELECT arrayJoin(['a', 'a', 'a', 'b', 'b', 'e', 'e', 'e', 'e', NULL]) AS x) AS d "
        "CROSS JOIN (SELECT number AS rep FROM numbers(20000)) AS r GROUP BY rep")
    index = {"a": 0, "b": 1, "c": 2, "d": 3}
    draws = [tuple(index[v] for v in t) for t in df["t"]]
    assert len(draws) == 20000
    stat, limit = _chi2(draws, TopKMechanism(1.0, 2, 1).probabilities([3, 2, 0, 0]), 1e-7)
    assert stat < limit, (stat, limit)


def test_sql_function_shapes_and_errors(db):
    db.command("CREATE TABLE IF NOT EXISTS default.topk_sql (x String, y Nullable(UInt8)) ENGINE = MergeTree ORDER BY tuple()")
    db.command("TRUNCATE TABLE default.topk_sql")
    db.command("INSERT INTO default.topk_sql SELECT if(number < 9000, 'a', 'b'), if(number % 3 = 0, NULL, 7) "
               "FROM numbers(10000)")
    one = lambda sql: db.raw_query(sql)["t"].iloc[0]  # noqa: E731
    # a far ahead of every other value (gap 8000 at T = 2·1·1/1 = 2): chosen first with certainty
    assert list(one("SELECT dp_top_k(x, ['a', 'b', 'c'], 1, 1.0) AS t FROM default.topk_sql")) == ["a"]
    # fewer domain values than n (duplicates count once): all of them
    assert sorted(one("SELECT dp_top_k(x, ['a', 'b', 'a'], 5, 1.0) AS t FROM default.topk_sql")) == ["a", "b"]
    assert list(one("SELECT dp_top_k(y, [7, 8, 9], 1, 1.0) AS t FROM default.topk_sql")) == [7]
    assert len(one("SELECT dp_top_k(x, ['a', 'b', 'c'], 2, 1.0) AS t FROM default.topk_sql WHERE 0")) == 2
    for call, word in [("dp_top_k(x, ['a'], 0, 1.0)", "argument n"), ("dp_top_k(x, ['a'], 1.5, 1.0)", "argument n"),
                       ("dp_top_k(x, ['a'], 1, 0)", "argument eps"), ("dp_top_k(x, [x], 1, 1.0)", "argument domain"),
                       ("dp_top_k(x, ['a'], y, 1.0)", "argument n")]:
        for where in ("", " WHERE 0"):  # the same error on an empty selection: checks are constants
            with pytest.raises(BackendError, match=word):
                db.raw_query(f"SELECT {call} AS t FROM default.topk_sql{where}")


def test_top_n_over_the_largest_public_domain(tdb):
    """100 000 public keys (the catalog's maximum) are inlined in the rewritten query (≈ 0.7 MB of
    SQL, above ClickHouse's default 256 KiB max_query_size, which the backends raise): both methods
    answer, with 3 rows, and peeling finds key 7 (20 000 units; every other key has at most 1)."""
    t = f"{DB}.topk_wide"
    tdb.command(f"DROP TABLE IF EXISTS {t}")
    tdb.command(f"CREATE TABLE {t} (user_id UInt64, key UInt32) ENGINE = MergeTree ORDER BY user_id")
    tdb.command(f"INSERT INTO {t} SELECT number, if(number < 20000, 7, toUInt32(number % 100000)) FROM numbers(60000)")
    tdb.catalog.register(t, privacy_unit="user_id", max_groups_contributed=1, max_rows_per_unit=1,
                         public_keys={"key": list(range(100_000))})
    tdb.ledger.set_budget("tester", t, epsilon=1e6, delta=0.5)
    sql = f"SELECT key, COUNT(*) AS n FROM {t} GROUP BY key ORDER BY n DESC LIMIT 3"
    for method in ("peeling", "post_processing"):
        df = tdb.query(sql, epsilon=1.0, top_k=method)
        assert len(df) == 3 and df.attrs["dpch"]["top_k"]["method"] == method
        assert 7 in set(df["key"])  # gap 20 000 - 1 at T = 12 (peeling) or b = 1 (post-processing)


def test_auto_scores_peeling_by_its_choice_when_the_score_is_the_selection_count(tdb):
    """COUNT(DISTINCT unit) over privately selected groups: the released count is the selection's
    own noisy count in both plans, so peeling's score is its Gumbel spread π/√6·T alone (the bench
    found the value noise counted against it: bench/RESULTS.md, "Noisy top-k recall")."""
    sql = "SELECT category, COUNT(DISTINCT user_id) AS u FROM {t} GROUP BY category ORDER BY u DESC LIMIT 1"
    plan = _plan(tdb, "events", sql, 0.1, 1e-6, top_k="peeling")
    t = plan.top_k
    assert plan.quantities[t.quantity].is_selection
    from dpch.plan.planner import _order_noise

    assert math.isclose(_order_noise(plan), math.pi / math.sqrt(6) * t.temperature, rel_tol=1e-12)
