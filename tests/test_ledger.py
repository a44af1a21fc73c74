"""The ledger's Python API: budgets, atomic check-and-charge, outcomes, reset, history, and the
a posteriori (output-DP) settlement on the toy mechanism of odp_privacy_accounting.md."""
from __future__ import annotations

import math
import random
import threading

import pytest

from dpch.accounting import SETTLED_KIND
from dpch.cost import MechanismCost, PrivacyCost
from dpch.errors import BudgetExceeded, InvalidParameter, LedgerError, QueryRejected
from dpch.ledger import Ledger, default_ledger_path
from ledger_stores import ledger_target, pg_server  # noqa: F401  (the two stores)


def lap(eps: float, label: str = "COUNT(*)", odp=()) -> MechanismCost:
    return MechanismCost("laplace", 1.0, 1.0 / eps, eps, 0.0, None, label, tuple(odp))


def gauss(sigma: float, eps: float = 0.5, delta: float = 1e-7, label: str = "SUM(amount)") -> MechanismCost:
    return MechanismCost("gaussian", 1.0, sigma, eps, delta, 1.0 / (2 * sigma * sigma), label)


def q(*m) -> PrivacyCost:
    return PrivacyCost(tuple(m))


@pytest.fixture
def ledger(ledger_target):
    with Ledger(ledger_target) as led:
        yield led


def test_default_path(monkeypatch, tmp_path):
    monkeypatch.delenv("DPCH_LEDGER", raising=False)
    monkeypatch.delenv("DPCH_DATA_DIR", raising=False)
    assert str(default_ledger_path()).replace("\\", "/").endswith(".dpch_data/ledger.sqlite")
    monkeypatch.setenv("DPCH_DATA_DIR", str(tmp_path / "data"))
    assert default_ledger_path() == tmp_path / "data" / "ledger.sqlite"
    monkeypatch.setenv("DPCH_LEDGER", str(tmp_path / "x.sqlite"))
    assert default_ledger_path() == tmp_path / "x.sqlite"


def test_missing_ledger_without_create(tmp_path):
    with pytest.raises(LedgerError, match="not found"):
        Ledger(tmp_path / "nope.sqlite", create=False)
    assert not (tmp_path / "nope.sqlite").exists()


def test_budget_roundtrip_and_no_budget_message(ledger):
    with pytest.raises(LedgerError, match="no budget set for analyst 'alice' on dataset 'purchases'.*db.ledger.set_budget"):
        ledger.get_budget("alice", "purchases")
    with pytest.raises(LedgerError, match="no budget set"):
        ledger.remaining("alice", "purchases")
    b = ledger.set_budget("alice", "purchases", 3, 1e-6, "zcdp")
    assert (b.epsilon, b.delta, b.accountant, b.mechanism_delta) == (3.0, 1e-6, "zcdp", 0.0)
    assert ledger.get_budget("alice", "purchases") == b
    with pytest.raises(BudgetExceeded, match="no budget set for analyst 'bob'"):
        ledger.charge("bob", "purchases", q(lap(0.1)), "SELECT 1")
    ev = ledger.events(kind="rejected")
    assert len(ev) == 1 and ev[0].analyst == "bob" and ev[0].detail["reason"] == "no budget set"
    assert ledger.history() == []


def test_charge_records_everything(ledger):
    ledger.set_budget("alice", "purchases", 1.0, 1e-6, "basic")
    cost = q(lap(0.25, "COUNT(*)"), gauss(4.0, 0.25, 1e-7, "SUM(amount)"))
    r = ledger.charge("alice", "purchases", cost, "SELECT region, COUNT(*), SUM(amount) FROM purchases GROUP BY region")
    assert r.id >= 1 and r.accountant == "basic"
    assert r.spent_after.epsilon == pytest.approx(0.5) and r.remaining.epsilon == pytest.approx(0.5)
    (h,) = ledger.history()
    assert (h.id, h.analyst, h.dataset, h.accountant, h.outcome, h.generation) == (r.id, "alice", "purchases", "basic", "reserved", 0)
    assert h.epsilon == pytest.approx(0.5) and h.delta == pytest.approx(1e-7) and h.rho is None
    assert "laplace COUNT(*)" in h.summary and "gaussian SUM(amount)" in h.summary
    assert h.query_text.startswith("SELECT region") and len(h.query_hash) == 64
    assert h.cost == cost
    assert h.created_at > 0
    kinds = [e.kind for e in ledger.events()]
    assert kinds == ["ledger_created", "budget_set", "charge"]


def test_rejection_charges_nothing_and_says_what_remains(ledger):
    ledger.set_budget("alice", "purchases", 1.0)
    ledger.charge("alice", "purchases", q(lap(0.75)), "q1")
    with pytest.raises(BudgetExceeded) as exc:
        ledger.charge("alice", "purchases", q(lap(0.5)), "q2")
    msg = str(exc.value)
    assert "needs ε=0.5" in msg and "remaining: ε=0.25" in msg and "Nothing ran and nothing was charged" in msg
    assert len(ledger.history()) == 1
    st = ledger.remaining("alice", "purchases")
    assert st.spent.epsilon == pytest.approx(0.75) and st.queries == 1
    (ev,) = ledger.events(kind="rejected")
    assert ev.detail["needs"]["epsilon"] == pytest.approx(0.5) and ev.detail["remaining"]["epsilon"] == pytest.approx(0.25)
    # still room for a smaller query
    ledger.charge("alice", "purchases", q(lap(0.25)), "q3")


def test_unsupported_mechanism_is_query_rejected(ledger):
    ledger.set_budget("alice", "purchases", 1.0, accountant="pure")
    with pytest.raises(QueryRejected, match="not pure"):
        ledger.charge("alice", "purchases", q(gauss(3.0)), "q")
    assert ledger.history() == [] and len(ledger.events(kind="rejected")) == 1
    with pytest.raises(InvalidParameter):
        ledger.charge("alice", "purchases", q(MechanismCost("laplace", 1.0, 1.0, float("inf"))), "q")


def test_mark_outcomes_keep_the_charge(ledger):
    ledger.set_budget("alice", "purchases", 1.0)
    r1 = ledger.charge("alice", "purchases", q(lap(0.5)), "q1")
    r2 = ledger.charge("alice", "purchases", q(lap(0.5)), "q2")
    ledger.mark(r1, "executed")
    ledger.mark(r2, "failed")
    assert [h.outcome for h in ledger.history()] == ["executed", "failed"]
    assert ledger.remaining("alice", "purchases").remaining.epsilon == pytest.approx(0.0)
    with pytest.raises(InvalidParameter):
        ledger.mark(r2, "executed")
    with pytest.raises(InvalidParameter):
        ledger.mark(r1, "done")
    ledger.mark(r1, "executed")  # idempotent


def test_mark_skips_the_fsync_but_charges_stay_fully_synchronous(ledger):
    """A mark commits with synchronous=NORMAL (its loss is conservative: the charge stays
    "reserved", counted in full); every other write, a charge above all, must still commit with
    synchronous=FULL. PRAGMA synchronous reads 2 for FULL, 1 for NORMAL."""
    if "sqlite" not in type(ledger.store).__name__.lower():
        pytest.skip("SQLite's PRAGMA synchronous; PostgreSQL's synchronous_commit: tests/test_ledger_postgres.py")
    conn = ledger.store._live().conn
    seen = []

    def spy(txn):
        seen.append(conn.execute("PRAGMA synchronous").fetchone()[0])

    ledger.set_budget("alice", "purchases", 1.0)
    r = ledger.charge("alice", "purchases", q(lap(0.5)), "q1")
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2
    ledger.store.transaction(spy, durable=False)
    ledger.store.transaction(spy)
    assert seen == [1, 2]
    ledger.mark(r, "executed")
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # restored after the mark
    with pytest.raises(InvalidParameter):
        ledger.mark(r, "failed")  # a refused mark restores it too
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2
    assert [h.outcome for h in ledger.history()] == ["executed"]


def test_reset_needs_confirmation_and_is_recorded(ledger):
    ledger.set_budget("alice", "purchases", 1.0)
    ledger.charge("alice", "purchases", q(lap(1.0)), "q1")
    with pytest.raises(InvalidParameter, match="confirm"):
        ledger.reset("alice", "purchases")
    with pytest.raises(InvalidParameter):
        ledger.reset("alice", "purchases", confirm="yes")
    assert ledger.remaining("alice", "purchases").remaining.epsilon == 0.0
    ledger.reset("alice", "purchases", confirm=True)
    st = ledger.remaining("alice", "purchases")
    assert st.remaining.epsilon == 1.0 and st.queries == 0 and st.generation == 1
    ledger.charge("alice", "purchases", q(lap(1.0)), "q2")
    hist = ledger.history("alice", "purchases")
    assert [h.generation for h in hist] == [0, 1]  # the old charge is kept in the history
    kinds = [e.kind for e in ledger.events("alice", "purchases")]
    assert kinds.count("reset_refused") == 2 and kinds.count("budget_reset") == 1
    (ev,) = ledger.events(kind="budget_reset")
    assert ev.detail["confirm"] is True and ev.detail["charges_forgotten"] == 1


def test_changing_a_budget_must_fit_the_history(ledger):
    ledger.set_budget("alice", "purchases", 2.0)
    ledger.charge("alice", "purchases", q(lap(1.5)), "q")
    with pytest.raises(InvalidParameter, match="do not fit"):
        ledger.set_budget("alice", "purchases", 1.0)
    ledger.set_budget("alice", "purchases", 3.0)  # raising is allowed and recorded
    # switching accountant re-reads the history under the new theorem (1.5-DP Laplace = 1.125-zCDP)
    with pytest.raises(InvalidParameter):
        ledger.set_budget("alice", "purchases", 3.0, 1e-6, "zcdp")
    ledger.set_budget("alice", "purchases", 10.0, 1e-6, "zcdp")
    st = ledger.remaining("alice", "purchases")
    assert st.spent.rho == pytest.approx(1.5 ** 2 / 2)
    assert len(ledger.events(kind="budget_set")) == 3


def test_remaining_in_each_currency(ledger):
    ledger.set_budget("a", "d", 1.0, 1e-5, "zcdp")
    st = ledger.remaining("a", "d")
    rho_b = st.remaining.rho
    assert st.spent.rho == 0 and rho_b > 0
    sigma = math.sqrt(1 / (2 * rho_b / 2))  # half the ρ budget
    ledger.charge("a", "d", q(gauss(sigma)), "q")
    st = ledger.remaining("a", "d")
    assert st.spent.rho == pytest.approx(rho_b / 2) and st.remaining.rho == pytest.approx(rho_b / 2)
    ledger.set_budget("b", "d", 1.0, 1e-5, "paper_gaussian", max_queries=4)
    st = ledger.remaining("b", "d")
    assert st.remaining.queries == 4
    assert [s.analyst for s in ledger.budgets()] == ["a", "b"]


def test_persistence_across_reopen(ledger_target):
    path = ledger_target
    with Ledger(path) as led:
        led.set_budget("alice", "purchases", 1.0)
        r = led.charge("alice", "purchases", q(lap(0.4)), "q")
        led.mark(r, "executed")
    with Ledger(path, create=False) as led:
        st = led.remaining("alice", "purchases")
        assert st.spent.epsilon == pytest.approx(0.4)
        assert led.history()[0].outcome == "executed"


def test_threads_share_one_budget(ledger_target):
    path = ledger_target
    with Ledger(path) as admin:
        admin.set_budget("alice", "purchases", 25.0)
    ok = []
    shared = Ledger(path)

    def worker(use_shared: bool):
        led = shared if use_shared else Ledger(path)
        for i in range(40):
            try:
                led.charge("alice", "purchases", q(lap(0.25)), f"q{i}")
                ok.append(1)
            except BudgetExceeded:
                pass
        if not use_shared:
            led.close()

    threads = [threading.Thread(target=worker, args=(i % 2 == 0,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ok) == 100
    assert shared.remaining("alice", "purchases").spent.epsilon == 25.0
    assert len(shared.history()) == 100
    shared.close()


# ---------------------------------------------------------------------------------------------
# A posteriori settlement: odp_privacy_accounting.md, Alg. 1 (ODPComposition), Thm 7
# ---------------------------------------------------------------------------------------------

BOT = object()  # the ⊥ symbol


def toy_cost(eps: float) -> PrivacyCost:
    """M_toy: ODP partition P1 = R with E(P1) = ε, P2 = {⊥} with E(P2) = 0, δ = 0 (the paper, §3)."""
    return q(lap(eps, "toy", odp=(eps, 0.0)))


def run_toy(rng: random.Random, f_value: float, eps: float):
    """Flip an unbiased coin; heads: Laplace(1/ε) release of f, tails: ⊥. Test double only: real
    releases go through the CSPRNG kernel."""
    if rng.random() < 0.5:
        return f_value + rng.expovariate(eps) - rng.expovariate(eps)
    return BOT


def realized_for(out, eps: float) -> PrivacyCost:
    return q(MechanismCost("laplace", 1.0, 1.0 / eps, 0.0 if out is BOT else eps, 0.0, None, "toy"))


@pytest.mark.parametrize("accountant", ["basic", "pure"])
def test_toy_mechanism_settlement(ledger, accountant):
    eps_t = 1.0
    ledger.set_budget("alice", "toy", eps_t, accountant=accountant)
    rng = random.Random(20240501)
    outputs = []
    for _ in range(200):
        try:
            r = ledger.charge("alice", "toy", toy_cost(1.0), "toy")
        except BudgetExceeded:
            break
        out = run_toy(rng, 42.0, 1.0)
        outputs.append(out)
        ledger.settle(r, realized_for(out, 1.0))
    else:
        pytest.fail("the budget was never exhausted")
    released = [o for o in outputs if o is not BOT]
    # exactly one ε-release fits ε_t = 1; every ⊥ was refunded in full (E({⊥}) = 0)
    assert len(released) == 1 and outputs[-1] is not BOT and len(outputs) >= 2
    st = ledger.remaining("alice", "toy")
    assert st.spent.epsilon == pytest.approx(1.0) and st.queries == len(outputs)
    hist = ledger.history("alice", "toy")
    assert all(h.outcome == "settled" for h in hist)
    assert [h.effective_epsilon for h in hist] == [0.0] * (len(outputs) - 1) + [1.0]
    assert all(h.epsilon == 1.0 for h in hist)  # what was reserved stays visible
    settles = ledger.events(kind="settle")
    assert sum(e.detail["refund_epsilon"] for e in settles) == pytest.approx(len(outputs) - 1)
    ledger.verify()


def test_toy_protocol_reserves_sup_before_running(ledger):
    # Alg. 1 line 9: sup E(P) must fit the remaining budget *before* running, even if ⊥ is likely
    ledger.set_budget("alice", "toy", 1.5)
    r = ledger.charge("alice", "toy", toy_cost(1.0), "toy")
    with pytest.raises(BudgetExceeded):
        ledger.charge("alice", "toy", toy_cost(1.0), "toy")
    ledger.settle(r, realized_for(BOT, 1.0))
    ledger.charge("alice", "toy", toy_cost(1.0), "toy")


def test_settlement_only_as_the_protocol_allows(ledger):
    ledger.set_budget("alice", "toy", 5.0, 1e-6, "basic")
    r = ledger.charge("alice", "toy", toy_cost(1.0), "toy")
    # a value that is not one of the declared E(P_k)
    with pytest.raises(InvalidParameter, match="not one of the ODP partition values"):
        ledger.settle(r, q(MechanismCost("laplace", 1.0, 1.0, 0.5, 0.0, None, "toy")))
    # mechanisms must match
    with pytest.raises(InvalidParameter):
        ledger.settle(r, q(MechanismCost("laplace", 1.0, 1.0, 0.0, 0.0, None, "other")))
    with pytest.raises(InvalidParameter):
        ledger.settle(r, q())
    assert ledger.history()[0].outcome == "reserved"
    ledger.mark(r, "executed")
    first = ledger.settle(r, realized_for(BOT, 1.0))
    assert (first.refund_epsilon, first.replayed) == (1.0, False)
    # once only: the same settlement again is idempotent (nothing changes), a different one is refused
    assert ledger.settle(r, realized_for(BOT, 1.0)).replayed
    with pytest.raises(InvalidParameter, match="already settled"):
        ledger.settle(r, realized_for(42.0, 1.0))
    assert len(ledger.events(kind="settle")) == 1
    # a mechanism without an ODP partition (trivial partition, Lemma 3): no refund possible
    r2 = ledger.charge("alice", "toy", q(lap(1.0, "plain")), "plain")
    with pytest.raises(InvalidParameter):
        ledger.settle(r2, q(MechanismCost("laplace", 1.0, 1.0, 0.0, 0.0, None, "plain")))
    ledger.settle(r2, q(MechanismCost("laplace", 1.0, 1.0, 1.0, 0.0, None, "plain")))  # full ε: allowed, no-op
    # after a failed execution nothing settles (fail closed)
    r3 = ledger.charge("alice", "toy", toy_cost(1.0), "toy")
    ledger.mark(r3, "failed")
    with pytest.raises(InvalidParameter, match="failed"):
        ledger.settle(r3, realized_for(BOT, 1.0))
    # δ is never refunded (Alg. 1 line 15)
    thr = MechanismCost("threshold", 1.0, 1.0, 0.5, 1e-7, None, "keys", (0.5, 0.0))
    r4 = ledger.charge("alice", "toy", q(thr), "keys")
    ledger.settle(r4, q(MechanismCost("threshold", 1.0, 1.0, 0.0, 0.0, None, "keys")))
    h4 = [h for h in ledger.history() if h.id == r4.id][0]
    assert h4.effective_epsilon == 0.0 and h4.effective_delta == pytest.approx(1e-7)
    assert h4.realized.mechanisms[0].kind == SETTLED_KIND
    # declared partition values above the mechanism's ε are refused at charge time
    with pytest.raises(InvalidParameter, match="ODP partition"):
        ledger.charge("alice", "toy", q(lap(0.5, "bad", odp=(0.7, 0.0))), "bad")


@pytest.mark.parametrize("accountant, kwargs", [
    ("zcdp", dict(delta=1e-6)), ("advanced", dict(delta=1e-6)), ("paper_gaussian", dict(delta=1e-6, max_queries=5))])
def test_settlement_refused_outside_simple_composition(ledger, accountant, kwargs):
    ledger.set_budget("alice", "toy", 10.0, accountant=accountant, **kwargs)
    cost = q(gauss(30.0)) if accountant == "paper_gaussian" else toy_cost(1.0)
    r = ledger.charge("alice", "toy", cost, "toy")
    with pytest.raises(InvalidParameter, match="simple composition"):
        ledger.settle(r, realized_for(BOT, 1.0) if accountant != "paper_gaussian" else cost)


def test_switch_to_declared_accountant_checks_every_recorded_query(ledger):
    ledger.set_budget("alice", "purchases", 5.0)
    ledger.charge("alice", "purchases", q(lap(0.2)), "big")
    ledger.charge("alice", "purchases", q(lap(0.05)), "small")
    with pytest.raises(InvalidParameter, match="per-query"):
        ledger.set_budget("alice", "purchases", 5.0, accountant="optimal", max_queries=20, per_query_epsilon=0.1)
    ledger.set_budget("alice", "purchases", 5.0, accountant="optimal", max_queries=20, per_query_epsilon=0.2)
    assert ledger.remaining("alice", "purchases").remaining.queries == 18


def test_zcdp_refusal_states_epsilon_at_the_budgets_delta(ledger):
    """A zCDP refusal also speaks in the administrator's units: ε at the budget's δ, converted with
    the accountant's own zcdp_to_dp (checked here against that function directly)."""
    from dpch.accounting import zcdp_to_dp

    ledger.set_budget("z", "d", 1.0, 1e-5, "zcdp")
    rho_b = ledger.remaining("z", "d").remaining.rho
    sigma = math.sqrt(1 / (2 * rho_b * 2))  # ρ = 2·ρ_B: twice the budget
    with pytest.raises(BudgetExceeded) as info:
        ledger.charge("z", "d", q(gauss(sigma)), "too much")
    msg = str(info.value)
    assert "In ε at δ = 1e-05: the query needs ε = " in msg
    needs = float(msg.split("the query needs ε = ")[1].split(",")[0])
    assert needs == pytest.approx(zcdp_to_dp(2 * rho_b, 1e-5), rel=1e-5)
    remains = float(msg.split(", ε = ")[1].split(" remains")[0])
    assert remains == pytest.approx(1.0, rel=1e-5)  # nothing spent: the whole ε = 1 at δ = 1e-5
