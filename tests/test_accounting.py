"""Accountants: each accepts exactly the sequences its theorem allows and rejects the first query
that would break it. Closed forms are checked against hand computations and, where the theory
overlaps, against Google's dp_accounting package."""
from __future__ import annotations

import math

import numpy as np
import pytest

from dpch.accounting import (
    ACCOUNTANTS,
    Budget,
    advanced_filter_epsilon,
    dr_advanced_epsilon,
    gaussian_paper_k,
    get_accountant,
    homogeneous_bounds,
    kov_34_epsilons,
    kov_delta,
    kov_epsilon,
    make_budget,
    zcdp_budget,
    zcdp_to_dp,
    zcdp_to_dp_bun_steinke,
)
from dpch.cost import MechanismCost, PrivacyCost
from dpch.errors import InvalidParameter

dp_accounting = pytest.importorskip("dp_accounting")
from dp_accounting.pld import accountant as pld_accountant  # noqa: E402
from dp_accounting.pld import common as pld_common  # noqa: E402
from dp_accounting.pld import privacy_loss_distribution as pld  # noqa: E402
from dp_accounting.rdp import rdp_privacy_accountant as rdp  # noqa: E402


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------

def lap(eps: float, sensitivity: float = 1.0, label: str = "COUNT(*)") -> MechanismCost:
    """A Laplace release with S/b = eps."""
    return MechanismCost("laplace", sensitivity, sensitivity / eps, eps, 0.0, None, label)


def gauss(sigma: float, sensitivity: float = 1.0, eps: float = 1.0, delta: float = 1e-6, label: str = "SUM(x)") -> MechanismCost:
    return MechanismCost("gaussian", sensitivity, sigma, eps, delta, sensitivity ** 2 / (2 * sigma ** 2), label)


def q(*mechs: MechanismCost) -> PrivacyCost:
    return PrivacyCost(tuple(mechs))


def run(budget: Budget, costs):
    """Feed queries one by one. Returns (number accepted before the first rejection, that decision)."""
    acc = get_accountant(budget.accountant)
    accepted = []
    for c in costs:
        d = acc.decide(budget, accepted, c)
        if not d.ok:
            return len(accepted), d
        accepted.append(c)
    return len(accepted), None


def first_rejection(budget: Budget, cost: PrivacyCost, limit: int = 100_000):
    """Repeat the same query until rejected; returns (accepted count, rejecting decision)."""
    acc = get_accountant(budget.accountant)
    accepted = []
    for _ in range(limit):
        d = acc.decide(budget, accepted, cost)
        if not d.ok:
            return len(accepted), d
        accepted.append(cost)
    raise AssertionError("never rejected")


# ---------------------------------------------------------------------------------------------
# registry and budget validation
# ---------------------------------------------------------------------------------------------

def test_registry_names_and_sources():
    assert set(ACCOUNTANTS) == {"pure", "basic", "advanced", "optimal", "adaptive", "paper_gaussian", "zcdp", "odp"}
    for acc in ACCOUNTANTS.values():
        assert acc.source, acc.name


@pytest.mark.parametrize("kwargs, match", [
    (dict(epsilon=0), "epsilon"),
    (dict(epsilon=float("nan")), "epsilon"),
    (dict(epsilon=1, delta=1.0), "delta"),
    (dict(epsilon=1, accountant="nope"), "unknown accountant"),
    (dict(epsilon=1, accountant="basic", foo=3), "unknown budget parameter"),
    (dict(epsilon=1, delta=1e-6, accountant="pure"), "delta must be 0"),
    (dict(epsilon=1, accountant="basic", per_query_epsilon=0.1), "declare"),
    (dict(epsilon=1, accountant="optimal"), "max_queries"),
    (dict(epsilon=1, delta=1e-6, accountant="paper_gaussian"), "max_queries"),
    (dict(epsilon=1, accountant="zcdp"), "δ"),
    (dict(epsilon=1, accountant="advanced"), "δ > 0"),
    (dict(epsilon=1, delta=1e-6, accountant="zcdp", mechanism_delta=1e-6), "mechanism_delta"),
    (dict(epsilon=1, delta=1e-6, accountant="basic", max_queries=0), "max_queries"),
])
def test_invalid_budgets(kwargs, match):
    with pytest.raises(InvalidParameter, match=match):
        make_budget(**kwargs)


# ---------------------------------------------------------------------------------------------
# pure: the paper's Thm 3
# ---------------------------------------------------------------------------------------------

def test_pure_filter_accepts_exactly_the_sum_condition():
    b = make_budget(1.0, accountant="pure")
    # adaptive scales: S/p = 0.3, 0.25, 0.45 -> sum 1.0 exactly; then anything positive is rejected
    n, d = run(b, [q(lap(0.3)), q(lap(0.25)), q(lap(0.45)), q(lap(1e-6))])
    assert n == 3
    assert "Thm 3" in d.reason and not d.ok
    assert d.needs.epsilon == pytest.approx(1e-6)
    assert d.remaining.epsilon == pytest.approx(0.0, abs=1e-12)


def test_pure_uses_sensitivity_over_scale():
    b = make_budget(1.0, accountant="pure")
    # declared epsilon understates the real S/b = 0.5: the accountant charges 0.5 (fail closed)
    m = MechanismCost("laplace", 2.0, 4.0, 0.1, label="SUM(x)")
    n, _ = run(b, [q(m)] * 5)
    assert n == 2
    # several mechanisms in one query add up (Thm 3 counts each release)
    n, _ = run(b, [q(lap(0.2), lap(0.2)), q(lap(0.3), lap(0.3)), q(lap(0.01))])
    assert n == 2


def test_pure_decimal_budget_rounding():
    # 0.1 * 10 is not exactly 1.0 in binary; the documented slack lets the 10th query in
    b = make_budget(1.0, accountant="pure")
    n, _ = first_rejection(b, q(lap(0.1)))
    assert n == 10
    b = make_budget(0.3, accountant="pure")
    n, _ = first_rejection(b, q(lap(0.1)))
    assert n == 3


def test_pure_rejects_gaussian_with_reason():
    b = make_budget(1.0, accountant="pure")
    d = get_accountant("pure").decide(b, [], q(gauss(3.0)))
    assert not d.ok and "not pure" in d.reason and d.needs is None


# ---------------------------------------------------------------------------------------------
# basic: Dwork & Roth Thm 3.16
# ---------------------------------------------------------------------------------------------

def test_basic_epsilon_and_delta_limits():
    b = make_budget(2.0, 1e-5, "basic")
    # δ binds first: 4e-6 each, the third would make 1.2e-5
    n, d = first_rejection(b, q(gauss(5.0, eps=0.1, delta=4e-6)))
    assert n == 2 and "Σδ" in d.reason
    # ε binds first
    n, d = first_rejection(b, q(lap(0.5)))
    assert n == 4 and "Σε" in d.reason
    # mixed
    n, d = run(b, [q(lap(1.0)), q(gauss(5.0, eps=0.5, delta=5e-6)), q(lap(0.5), gauss(5, eps=0.1, delta=1e-6))])
    assert n == 2


def test_basic_rejects_gaussian_without_delta():
    b = make_budget(2.0, 1e-5, "basic")
    d = get_accountant("basic").decide(b, [], q(gauss(2.0, delta=0.0)))
    assert not d.ok and "δ = 0" in d.reason


def test_max_queries_is_a_cap_for_filters():
    b = make_budget(10.0, accountant="basic", max_queries=3)
    n, d = first_rejection(b, q(lap(0.1)))
    assert n == 3 and "at most 3" in d.reason


# ---------------------------------------------------------------------------------------------
# advanced
# ---------------------------------------------------------------------------------------------

def _advanced_filter_count(eps_budget: float, dprime: float, e: float) -> int:
    """By hand: the largest n with ½ n e² + √(2 ln(1/δ') n e²) ≤ ε, solving a x² + c x ≤ ε for x = √n."""
    a = 0.5 * e * e
    c = math.sqrt(2 * math.log(1 / dprime) * e * e)
    x = (-c + math.sqrt(c * c + 4 * a * eps_budget)) / (2 * a)
    n = math.floor(x * x)
    # guard floor against rounding at an exact boundary
    while a * (n + 1) + c * math.sqrt(n + 1) <= eps_budget:
        n += 1
    while a * n + c * math.sqrt(n) > eps_budget:
        n -= 1
    return n


@pytest.mark.parametrize("e", [0.01, 0.05, 0.1])
def test_advanced_filter_matches_hand_computation(e):
    b = make_budget(1.0, 1e-6, "advanced")  # δ'' = δ/2 by default, δ' = 5e-7
    assert b.mechanism_delta == pytest.approx(5e-7)
    n, d = first_rejection(b, q(lap(e)))
    assert n == _advanced_filter_count(1.0, 5e-7, e)
    assert "advanced-composition filter" in d.reason
    if e == 0.01:
        assert n > round(1.0 / e)  # beats basic composition for many small queries


def test_advanced_filter_equals_zcdp_route():
    # ½Σε² + √(2 ln(1/δ)Σε²) is ρ + 2√(ρ ln(1/δ)) at ρ = Σε²/2 (Bun & Steinke Prop 1.3/1.4)
    for s in (1e-4, 0.01, 0.3, 2.0):
        assert advanced_filter_epsilon(s, 1e-6) == pytest.approx(zcdp_to_dp_bun_steinke(s / 2, 1e-6))


def test_advanced_filter_mechanism_delta():
    b = make_budget(5.0, 1e-5, "advanced", mechanism_delta=3e-6)
    n, d = first_rejection(b, q(gauss(10.0, eps=0.05, delta=1e-6)))
    assert n == 3 and "mechanism_delta" in d.reason


def test_advanced_declared_dwork_roth_320():
    k, e0, delta = 100, 0.01, 1e-6
    by_hand = math.sqrt(2 * k * math.log(1 / delta)) * e0 + k * e0 * (math.exp(e0) - 1)
    assert dr_advanced_epsilon(k, e0, delta) == pytest.approx(by_hand, rel=1e-14)
    assert by_hand == pytest.approx(0.53570, abs=1e-4)
    with pytest.raises(InvalidParameter, match="Thm 3.20"):
        make_budget(0.53, delta, "advanced", max_queries=k, per_query_epsilon=e0)
    b = make_budget(0.54, delta, "advanced", max_queries=k, per_query_epsilon=e0)
    acc = get_accountant("advanced")
    # a query above the declared ε0 is rejected, smaller ones are fine
    d = acc.decide(b, [], q(lap(0.02)))
    assert not d.ok and "per-query" in d.reason
    assert acc.decide(b, [], q(lap(0.004), lap(0.006))).ok
    n, d = first_rejection(b, q(lap(0.01)))
    assert n == k and not d.ok


def test_advanced_declared_with_per_query_delta():
    k, e0, d0 = 50, 0.05, 1e-8
    b = make_budget(2.0, 1e-5, "advanced", max_queries=k, per_query_epsilon=e0, per_query_delta=d0)
    acc = get_accountant("advanced")
    assert not acc.decide(b, [], q(gauss(50, eps=0.05, delta=2e-8))).ok
    assert acc.decide(b, [], q(gauss(50, eps=0.05, delta=1e-8))).ok
    with pytest.raises(InvalidParameter):
        make_budget(2.0, 1e-5, "advanced", max_queries=k, per_query_epsilon=e0, per_query_delta=1e-6)


# ---------------------------------------------------------------------------------------------
# optimal: Kairouz, Oh & Viswanath Thm 3.3
# ---------------------------------------------------------------------------------------------

def _kov_grid_delta_by_hand(k, e, d0, i):
    """dpsql_algorithms.md "advanced composition 2", literally."""
    di = sum(math.comb(k, l) * (math.exp((k - l) * e) - math.exp((k - 2 * i + l) * e)) for l in range(i)) / (1 + math.exp(e)) ** k
    return 1 - (1 - d0) ** k * (1 - di)


@pytest.mark.parametrize("k, e, d0", [(10, 0.1, 0.0), (20, 0.5, 0.0), (30, 0.2, 1e-7), (7, 1.0, 1e-4)])
def test_kov_grid_points_match_formula(k, e, d0):
    for i in range(0, k // 2 + 1):
        assert kov_delta(k, e, d0, (k - 2 * i) * e) == pytest.approx(_kov_grid_delta_by_hand(k, e, d0, i), rel=1e-9, abs=1e-15)


@pytest.mark.parametrize("k, e, d0, total_delta", [
    (10, 0.1, 0.0, 1e-3), (50, 0.1, 0.0, 1e-5), (100, 0.05, 1e-8, 1e-5), (25, 0.5, 0.0, 1e-6), (200, 0.02, 0.0, 1e-6)])
def test_kov_against_dp_accounting_advanced_composition(k, e, d0, total_delta):
    theirs = pld_accountant.advanced_composition(pld_common.DifferentialPrivacyParameters(e, d0), k, total_delta)
    ours = kov_epsilon(k, e, d0, total_delta)
    # dp_accounting evaluates Thm 3.3 on the grid (k-2i)ε; ours is the exact curve, so never larger
    assert ours <= theirs + 1e-12
    assert theirs - ours <= 2 * e + 1e-12
    assert kov_delta(k, e, d0, theirs) <= total_delta * (1 + 1e-9)
    assert kov_delta(k, e, d0, ours) <= total_delta * (1 + 1e-9)


@pytest.mark.parametrize("k, e, eps_total", [(10, 0.1, 0.55), (40, 0.05, 0.5), (16, 0.25, 1.3)])
def test_kov_exact_curve_against_dp_accounting_pld(k, e, eps_total):
    # the PLD of the dominating pair of an (ε, 0)-DP mechanism, composed k times
    p = pld.from_privacy_parameters(pld_common.DifferentialPrivacyParameters(e, 0.0), value_discretization_interval=1e-4)
    theirs = p.self_compose(k).get_delta_for_epsilon(eps_total)
    assert kov_delta(k, e, 0.0, eps_total) == pytest.approx(theirs, rel=1e-6, abs=1e-12)


def test_optimal_enforces_declaration():
    k, e0 = 10, 0.1
    # δ = 0: only basic composition is possible
    b = make_budget(1.0, 0.0, "optimal", max_queries=k, per_query_epsilon=e0)
    with pytest.raises(InvalidParameter, match="Thm 3.3"):
        make_budget(0.99, 0.0, "optimal", max_queries=k, per_query_epsilon=e0)
    n, d = first_rejection(b, q(lap(0.1)))
    assert n == 10 and "k = 10" in d.reason
    d = get_accountant("optimal").decide(b, [], q(lap(0.11)))
    assert not d.ok and "ε0" in d.reason
    # with δ > 0 the optimal bound lets k queries fit a smaller ε
    eps_needed = kov_epsilon(k, e0, 0.0, 1e-3)
    assert eps_needed < 1.0
    make_budget(eps_needed, 1e-3, "optimal", max_queries=k, per_query_epsilon=e0)
    with pytest.raises(InvalidParameter):
        make_budget(eps_needed * 0.99, 1e-3, "optimal", max_queries=k, per_query_epsilon=e0)


# ---------------------------------------------------------------------------------------------
# adaptive: self-adaptive selection
# ---------------------------------------------------------------------------------------------

def test_adaptive_declared_picks_minimum_of_valid_bounds():
    k, e0, delta = 50, 0.1, 1e-5
    bounds = homogeneous_bounds(k, e0, 0.0, delta)
    basic = k * e0
    dr = math.sqrt(2 * k * math.log(1 / delta)) * e0 + k * e0 * (math.exp(e0) - 1)
    mean = k * e0 * (math.exp(e0) - 1) / (math.exp(e0) + 1)
    kov_a = mean + e0 * math.sqrt(2 * k * math.log(math.e + math.sqrt(k * e0 ** 2) / delta))
    kov_b = mean + e0 * math.sqrt(2 * k * math.log(1 / delta))
    assert bounds["basic (Dwork & Roth Thm 3.16)"] == pytest.approx(basic)
    assert bounds["advanced (Dwork & Roth Thm 3.20)"] == pytest.approx(dr)
    assert sorted(kov_34_epsilons(k, e0, delta)) == pytest.approx(sorted([kov_a, kov_b]))
    best = min(bounds.values())
    assert best == bounds["optimal (Kairouz et al. Thm 3.3)"]  # the optimal bound is never beaten
    assert best < min(basic, dr, kov_a, kov_b)
    make_budget(best * (1 + 1e-9), delta, "adaptive", max_queries=k, per_query_epsilon=e0)
    with pytest.raises(InvalidParameter, match="self-adaptive"):
        make_budget(best * 0.999, delta, "adaptive", max_queries=k, per_query_epsilon=e0)
    b = make_budget(best * (1 + 1e-9), delta, "adaptive", max_queries=k, per_query_epsilon=e0)
    n, _ = first_rejection(b, q(lap(e0)))
    assert n == k


def test_adaptive_filter_mode_min_of_basic_and_advanced():
    delta = 1e-6
    b = make_budget(1.0, delta, "adaptive")
    # large per-query ε: basic is better (2 queries of 0.5)
    n, _ = first_rejection(b, q(lap(0.5)))
    assert n == 2
    # small per-query ε: the advanced filter is better than basic's 100
    n, d = first_rejection(b, q(lap(0.01)))
    assert n == _advanced_filter_count(1.0, delta, 0.01) > 100
    assert "both the basic" in d.reason
    # approximate-DP mechanisms are not composed in filter mode
    d = get_accountant("adaptive").decide(b, [], q(gauss(10.0)))
    assert not d.ok and "not pure" in d.reason
    # δ = 0: basic only
    b0 = make_budget(1.0, 0.0, "adaptive")
    assert first_rejection(b0, q(lap(0.01)))[0] == 100


# ---------------------------------------------------------------------------------------------
# paper_gaussian: Thm 5 / Cor 2
# ---------------------------------------------------------------------------------------------

def test_paper_gaussian_k_and_query_limit():
    eps, delta, n_max = 1.0, 1e-5, 10
    b = make_budget(eps, delta, "paper_gaussian", max_queries=n_max)
    assert b.gamma == 0.5
    k = eps / (4 * math.sqrt(n_max * math.log(1 / delta)))  # Cor 2
    assert gaussian_paper_k(b.gamma, n_max, delta) == pytest.approx(k, rel=1e-14)
    acc = get_accountant("paper_gaussian")
    sigma_at_k = 1.0 / k
    # a ratio just above k is rejected
    d = acc.decide(b, [], q(gauss(sigma_at_k / 1.01)))
    assert not d.ok and "> k" in d.reason
    # exactly n queries at ratio k, then the (n+1)-th is rejected by the query limit
    n, d = first_rejection(b, q(gauss(sigma_at_k)))
    assert n == n_max and "at most 10" in d.reason
    # Cor 2: with γ = ε/2 the sum condition cannot bind (n k² + γ ≤ ε for ε ≤ 4, δ ≤ 0.1)
    assert n_max * k * k + b.gamma <= eps


def test_paper_gaussian_sum_condition_binds_with_large_gamma():
    eps, delta, n_max, gamma = 1.0, 1e-5, 10, 0.99
    b = make_budget(eps, delta, "paper_gaussian", max_queries=n_max, gamma=gamma)
    k = gamma / (2 * math.sqrt(n_max * math.log(1 / delta)))
    # by hand: query i is rejected when i k² + γ > ε, i.e. the first i > (ε - γ)/k²
    first_bad = math.floor((eps - gamma) / (k * k)) + 1
    n, d = first_rejection(b, q(gauss(1.0 / k)))
    assert n == first_bad - 1 == 4
    assert "Σ S²/σ² + γ" in d.reason


def test_paper_gaussian_vector_query_and_laplace():
    b = make_budget(1.0, 1e-5, "paper_gaussian", max_queries=10)
    acc = get_accountant("paper_gaussian")
    k = acc.k(b)
    # two releases at ratio k/√2 each: L2 ratio k, accepted; at ratio k each: L2 ratio √2 k, rejected
    assert acc.decide(b, [], q(gauss(math.sqrt(2) / k), gauss(math.sqrt(2) / k))).ok
    assert not acc.decide(b, [], q(gauss(1 / k), gauss(1 / k))).ok
    d = acc.decide(b, [], q(lap(0.01)))
    assert not d.ok and "Gaussian noise only" in d.reason


# ---------------------------------------------------------------------------------------------
# zcdp
# ---------------------------------------------------------------------------------------------

DENSE_ORDERS = np.concatenate([np.linspace(1.001, 3, 4000), np.linspace(3, 2000, 40000)])


@pytest.mark.parametrize("rho, delta", [(0.01, 1e-6), (0.1, 1e-6), (0.5, 1e-9), (1.0, 1e-5), (0.001, 1e-3), (5.0, 1e-8)])
def test_zcdp_conversion_against_dp_accounting(rho, delta):
    acct = rdp.RdpAccountant(orders=DENSE_ORDERS)
    acct.compose(dp_accounting.ZCDpEvent(rho))
    theirs = acct.get_epsilon(delta)
    ours = zcdp_to_dp(rho, delta)
    # same conversion (Canonne-Kamath-Steinke Prop 12); ours minimizes over continuous α
    assert ours <= theirs + 1e-9
    assert ours == pytest.approx(theirs, rel=1e-4)
    assert ours <= zcdp_to_dp_bun_steinke(rho, delta)
    assert zcdp_to_dp_bun_steinke(rho, delta) == pytest.approx(rho + 2 * math.sqrt(rho * math.log(1 / delta)))


@pytest.mark.parametrize("sigma, delta", [(1.0, 1e-5), (5.0, 1e-6), (20.0, 1e-9)])
def test_gaussian_rdp_is_zcdp(sigma, delta):
    acct = rdp.RdpAccountant(orders=DENSE_ORDERS)
    acct.compose(dp_accounting.GaussianDpEvent(noise_multiplier=sigma))
    assert zcdp_to_dp(1 / (2 * sigma ** 2), delta) == pytest.approx(acct.get_epsilon(delta), rel=1e-4)


@pytest.mark.parametrize("eps", [0.01, 0.1, 0.5, 1.0, 3.0])
def test_laplace_rdp_below_pure_to_zcdp(eps):
    # Bun & Steinke Prop 1.4 (ε-DP ⇒ ε²/2-zCDP) checked against Mironov's exact Laplace RDP curve
    for a in (1.5, 2, 4, 10, 100):
        assert rdp._laplace_rdp(eps, a) <= a * eps * eps / 2 + 1e-15


@pytest.mark.parametrize("eps, delta", [(3.0, 1e-6), (1.0, 1e-5), (0.5, 1e-9), (10.0, 1e-6)])
def test_zcdp_budget_is_largest_fitting_rho(eps, delta):
    rb = zcdp_budget(eps, delta)
    assert zcdp_to_dp(rb, delta) <= eps
    assert zcdp_to_dp(rb * (1 + 1e-6), delta) > eps
    acct = rdp.RdpAccountant(orders=DENSE_ORDERS)
    acct.compose(dp_accounting.ZCDpEvent(rb))
    assert acct.get_epsilon(delta) == pytest.approx(eps, rel=1e-4)
    # tighter than solving Bun & Steinke's Prop 1.3 for ρ
    L = math.log(1 / delta)
    rho_bs = (math.sqrt(L + eps) - math.sqrt(L)) ** 2
    assert zcdp_to_dp_bun_steinke(rho_bs, delta) == pytest.approx(eps)
    assert rb >= rho_bs


def test_zcdp_filter_gaussians_exact_count():
    eps, delta, k = 3.0, 1e-6, 25
    b = make_budget(eps, delta, "zcdp")
    rb = get_accountant("zcdp").rho_budget(b)
    sigma = math.sqrt(k / (2 * rb))  # ρ per query = rb / k
    n, d = first_rejection(b, q(gauss(sigma)))
    assert n == k and "ρ budget" in d.reason
    # heterogeneous, adaptively chosen σ: accepted while Σρ fits
    n, _ = run(b, [q(gauss(1 / math.sqrt(2 * rb * 0.5))), q(gauss(1 / math.sqrt(2 * rb * 0.5))), q(gauss(1000.0))])
    assert n == 2


def test_zcdp_laplace_and_threshold():
    b = make_budget(1.0, 1e-6, "zcdp")
    acc = get_accountant("zcdp")
    rb = acc.rho_budget(b)
    e = math.sqrt(2 * rb / 4)  # 4 Laplace releases of ε each use exactly ρ_B (ε²/2 each)
    n, _ = first_rejection(b, q(lap(e)))
    assert n == 4
    thr = MechanismCost("threshold", 1.0, 1.0, 0.1, 1e-7, label="partition selection")
    d = acc.decide(b, [], q(thr))
    assert not d.ok and "mechanism_delta" in d.reason
    b2 = make_budget(1.0, 1e-6, "zcdp", mechanism_delta=2.5e-7)
    n, d = first_rejection(b2, q(thr))
    assert n == 2 and "δ''" in d.reason
    assert get_accountant("zcdp").rho_budget(b2) < rb  # the conversion now has δ' = 7.5e-7


def test_unsupported_mechanism_kind_is_rejected_not_crashed():
    for name in ACCOUNTANTS:
        kwargs = dict(epsilon=1.0, delta=1e-6)
        if name == "pure":
            kwargs["delta"] = 0.0
        if name in ("optimal", "paper_gaussian"):
            kwargs["max_queries"] = 5
        if name == "optimal":
            kwargs["per_query_epsilon"] = 0.2
        b = make_budget(accountant=name, **kwargs)
        d = get_accountant(name).decide(b, [], q(MechanismCost("mystery", 1.0, 1.0, 0.1)))
        assert not d.ok and d.needs is None, name
        d = get_accountant(name).decide(b, [], q(MechanismCost("laplace", 1.0, 10.0, float("nan"))))
        assert not d.ok, name


def test_decision_reports_spent_and_remaining():
    b = make_budget(1.0, accountant="basic")
    acc = get_accountant("basic")
    d = acc.decide(b, [q(lap(0.25))], q(lap(0.5)))
    assert d.ok
    assert d.spent_after.epsilon == pytest.approx(0.75) and d.spent_after.queries == 2
    assert d.remaining.epsilon == pytest.approx(0.25)
    d = acc.decide(b, [q(lap(0.25))], q(lap(0.9)))
    assert not d.ok and d.spent_after.epsilon == pytest.approx(0.25) and d.needs.epsilon == pytest.approx(0.9)
