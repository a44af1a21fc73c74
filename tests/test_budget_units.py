"""Budgets in the administrator's units (dpch.budget_units): for every accountant, the ε still
available at the budget's δ, checked against numbers computed independently of the module
(closed forms, the accountants' own decisions), and `dpch budget show/set` printing them."""
from __future__ import annotations

import io
import math
from contextlib import redirect_stdout

import pytest

from dpch.accounting import advanced_filter_epsilon, zcdp_budget, zcdp_to_dp, zcdp_to_dp_bun_steinke
from dpch.budget_units import budget_report, describe_query_cost, report_for
from dpch.cost import MechanismCost, PrivacyCost
from dpch.errors import BudgetExceeded
from dpch.ledger import Ledger


def lap(eps: float) -> PrivacyCost:
    return PrivacyCost((MechanismCost("laplace", 1.0, 1.0 / eps, eps, 0.0, None, "COUNT(*)"),))


def gauss(sigma: float) -> PrivacyCost:
    return PrivacyCost((MechanismCost("gaussian", 1.0, sigma, 0.5, 1e-7, 1.0 / (2 * sigma * sigma), "SUM(x)"),))


@pytest.fixture
def ledger(tmp_path):
    with Ledger(tmp_path / "ledger.sqlite") as led:
        yield led


def test_zcdp_reports_epsilon_at_delta(ledger):
    ledger.set_budget("alice", "d", 1.0, 1e-6, "zcdp")
    rep = report_for(ledger, "alice", "d")
    rho_b = zcdp_budget(1.0, 1e-6)
    assert rep.rho == pytest.approx(rho_b) and rep.rho_left == pytest.approx(rho_b)
    # nothing spent: all of ρ_B converts back to (at most) the ε the administrator set
    assert rep.epsilon_left == pytest.approx(1.0, rel=1e-6) and rep.delta_at == 1e-6
    assert str(rep).startswith("remaining ε = 1 at δ = 1e-06 of ε = 1 (zCDP ρ = ")
    ledger.charge("alice", "d", gauss(10.0), "q")  # ρ = 1/200
    rep = report_for(ledger, "alice", "d")
    rho_left = rho_b - 0.005
    assert rep.rho_left == pytest.approx(rho_left)
    # the accountant's own conversion (CKS20 Prop 12), never worse than Bun & Steinke Prop 1.3
    assert rep.epsilon_left == pytest.approx(zcdp_to_dp(rho_left, 1e-6))
    assert rep.epsilon_left <= rho_left + 2 * math.sqrt(rho_left * math.log(1e6)) + 1e-12
    assert rep.epsilon_left <= zcdp_to_dp_bun_steinke(rho_left, 1e-6) + 1e-12
    assert 0 < rep.epsilon_left < 1.0
    assert rep.queries == 1
    line = describe_query_cost(0.5, 1e-7, 0.005, ledger.remaining("alice", "d"))
    assert "charged as zCDP ρ = 0.005" in line and f"ε = {zcdp_to_dp(0.005, 1e-6):.6g} at δ = 1e-06" in line


def test_basic_and_pure(ledger):
    ledger.set_budget("a", "d", 3.0, 1e-6, "basic")
    ledger.charge("a", "d", lap(1.0), "q")
    rep = report_for(ledger, "a", "d")
    assert rep.epsilon_left == pytest.approx(2.0) and rep.delta_at == pytest.approx(1e-6)
    ledger.set_budget("a", "p", 2.0, 0.0, "pure")
    ledger.charge("a", "p", lap(0.5), "q")
    rep = report_for(ledger, "a", "p")
    assert rep.epsilon_left == pytest.approx(1.5) and "at δ" not in str(rep)


def test_advanced_filter_headroom_is_what_the_accountant_accepts(ledger):
    ledger.set_budget("a", "d", 1.0, 1e-6, "advanced")
    for _ in range(3):
        ledger.charge("a", "d", lap(0.1), "q")
    rep = report_for(ledger, "a", "d")
    dprime = 0.5e-6  # mechanism_delta defaults to δ/2
    e = rep.epsilon_left
    assert advanced_filter_epsilon(0.03 + e * e, dprime) == pytest.approx(1.0, rel=1e-9)
    # the same number without the charges' costs (inverting the filter bound from the totals)
    assert budget_report(ledger.remaining("a", "d")).epsilon_left == pytest.approx(e, rel=1e-9)
    # the accountant accepts a release just below it and refuses one just above it
    with pytest.raises(BudgetExceeded):
        ledger.charge("a", "d", lap(e * 1.001), "q")
    ledger.charge("a", "d", lap(e * 0.999), "q")
    assert report_for(ledger, "a", "d").epsilon_left < 0.05


def test_adaptive_filter_and_declared_and_paper(ledger):
    ledger.set_budget("a", "ad", 1.0, 1e-6, "adaptive")
    ledger.charge("a", "ad", lap(0.4), "q")
    rep = report_for(ledger, "a", "ad")
    assert rep.epsilon_left >= 0.6 - 1e-12  # at least the basic headroom
    ledger.set_budget("a", "opt", 2.0, 1e-6, "optimal", max_queries=4, per_query_epsilon=0.5)
    ledger.charge("a", "opt", lap(0.5), "q")
    rep = report_for(ledger, "a", "opt")
    assert rep.epsilon_left == 0.5 and rep.queries_left == 3 and "ε0 = 0.5" in str(rep)
    ledger.set_budget("a", "pg", 2.0, 1e-6, "paper_gaussian", max_queries=10)
    rep = report_for(ledger, "a", "pg")
    assert rep.epsilon_left == pytest.approx(1.0)  # ε − γ, γ = ε/2 (Cor 2)
    ledger.charge("a", "pg", gauss(100.0), "q")  # S²/σ² = 1e-4 (S/σ = 0.01 ≤ k)
    assert report_for(ledger, "a", "pg").epsilon_left == pytest.approx(0.9999)


def _cli(*argv) -> str:
    from dpch.cli import main

    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(list(argv)) == 0
    return buf.getvalue()


def test_cli_set_and_show_in_user_units(tmp_path):
    d = str(tmp_path)
    out = _cli("budget", "set", "--analyst", "alice", "--dataset", "demo.purchases", "--epsilon", "1",
               "--delta", "1e-6", "--accountant", "zcdp", "--data-dir", d)
    assert "remaining ε = 1 at δ = 1e-06 of ε = 1 (zCDP ρ = " in out
    with Ledger(tmp_path / "ledger.sqlite") as led:
        led.charge("alice", "demo.purchases", gauss(10.0), "q")
        expected = zcdp_to_dp(zcdp_budget(1.0, 1e-6) - 0.005, 1e-6)
    out = _cli("budget", "show", "--data-dir", d)
    assert "ε left" in out and "at δ" in out
    assert f"alice on demo.purchases: remaining ε = {expected:.6g} at δ = 1e-06" in out
