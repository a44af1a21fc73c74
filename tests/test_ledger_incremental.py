"""The incremental accountant state (dpch/ledger/state.py, issue 32 item 5): on random charge and
settlement sequences, for every accountant and in both stores, the ledger's decisions and its
stored state equal a full recomputation over the history; a missing, altered or stale state is
recomputed (never trusted), and a state that passes the cheap checks but differs is refused by
verify."""
from __future__ import annotations

import itertools
import math
from dataclasses import replace
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpch.accounting import ComposedState, get_accountant, odp_realized
from dpch.cost import MechanismCost, PrivacyCost
from dpch.errors import BudgetExceeded, LedgerError, QueryRejected
from dpch.ledger import Ledger
from dpch.ledger import state as incremental
from ledger_stores import ledger_target, pg_server  # noqa: F401  (the two stores)

# one budget per accountant mode: (accountant, ε, δ, params)
BUDGETS = {
    "pure": ("pure", 3.0, 0.0, {}),
    "basic": ("basic", 3.0, 1e-5, {}),
    "advanced": ("advanced", 3.0, 1e-5, {}),
    "advanced-declared": ("advanced", 14.0, 1e-5, {"max_queries": 12, "per_query_epsilon": 0.5}),
    "optimal": ("optimal", 4.0, 1e-5, {"max_queries": 10, "per_query_epsilon": 0.4}),
    "adaptive": ("adaptive", 2.0, 1e-5, {}),
    "adaptive-declared": ("adaptive", 6.0, 1e-5, {"max_queries": 12, "per_query_epsilon": 0.5}),
    "paper_gaussian": ("paper_gaussian", 2.0, 1e-5, {"max_queries": 20}),
    "zcdp": ("zcdp", 2.0, 1e-5, {"mechanism_delta": 1e-6}),
    "odp": ("odp", 3.0, 1e-6, {}),
}
_names = itertools.count()

# mechanisms: Laplace (S/b = ε), Gaussian, and a threshold with ODP cells (settled later)
eps_values = st.floats(0.01, 0.9, allow_nan=False, allow_infinity=False)
laplace = eps_values.map(lambda e: MechanismCost("laplace", 1.0, 1.0 / e, e, 0.0, None, "L"))
gaussian = st.tuples(st.floats(0.8, 20.0), eps_values).map(
    lambda t: MechanismCost("gaussian", 1.0, t[0], t[1], 1e-8, 1.0 / (2 * t[0] ** 2), "G"))
threshold = st.tuples(eps_values, st.sampled_from([0.0, 0.0, 1e-8])).map(
    lambda t: MechanismCost("threshold", 1.0, 1.0, t[0], t[1], None, "T", (0.0, t[0] / 4)))
costs = st.lists(st.one_of(laplace, gaussian, threshold), min_size=1, max_size=3).map(lambda ms: PrivacyCost(tuple(ms)))
# an operation: charge a cost, then settle it in cell 0 or 1, or not at all (None)
ops = st.lists(st.tuples(costs, st.sampled_from([None, None, 0, 1])), min_size=1, max_size=14)


def full_state(led: Ledger, analyst: str, dataset: str) -> incremental.BudgetState:
    def fn(txn):
        row = txn.get_budget(analyst, dataset)
        return incremental.rebuild(led.path, row, txn.charges(analyst, dataset, row.generation))
    return led.store.read(fn)


def stored_state(led: Ledger, analyst: str, dataset: str):
    return led.store.read(lambda txn: incremental.stored(txn, txn.get_budget(analyst, dataset)))


def run_sequence(led: Ledger, mode: str, sequence) -> None:
    """Charge and settle; after every step the ledger's decision equals the stateless accountant's
    decision on the full effective history, and the stored state equals the full recomputation."""
    name, eps, delta, params = BUDGETS[mode]
    analyst, dataset = f"a{next(_names)}", "d"
    budget = led.set_budget(analyst, dataset, eps, delta, name, **params)
    acc = get_accountant(name)
    for cost, cell in sequence:
        history = [h.effective_cost() for h in led.history(analyst, dataset)]
        expected = acc.decide(budget, history, cost)
        try:
            receipt = led.charge(analyst, dataset, cost, "q")
        except (BudgetExceeded, QueryRejected):
            assert not expected.ok
        else:
            assert expected.ok
            assert receipt.spent_after == expected.spent_after
            if cell is not None and acc.supports_settlement:
                led.settle(receipt, odp_realized(receipt.cost, [cell if m.odp_epsilons else None
                                                               for m in receipt.cost.mechanisms]))
        full = full_state(led, analyst, dataset)
        kept = stored_state(led, analyst, dataset)
        assert kept == full or (kept is None and full.n == 0)  # written by the first accepted charge
        status = led.remaining(analyst, dataset)
        effective = [h.effective_cost() for h in led.history(analyst, dataset)]
        assert status.spent == acc.spent(budget, effective)
        assert status.queries == len(effective)


@pytest.mark.parametrize("mode", sorted(BUDGETS))
def test_incremental_equals_full_recomputation(ledger_target, mode):
    with Ledger(ledger_target) as led:
        @settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(ops)
        def check(sequence):
            run_sequence(led, mode, sequence)
        check()
        led.verify()  # every stored state against its full recomputation once more


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.floats(0, 1e6, allow_nan=False, allow_infinity=False), max_size=4), max_size=40))
def test_exact_running_sums_equal_fsum(terms):
    """The state's sums, rounded once, equal math.fsum of every term: an independent check that the
    incremental path rounds exactly as the full recomputation did before it (never below)."""
    s = ComposedState()
    for t in terms:
        s = s.extend({"x": t})
    flat = [x for t in terms for x in t]
    assert s.value("x") == math.fsum(flat)
    assert s.n == len(terms)
    assert ComposedState.from_json(s.to_json()) == s


def _charge_some(led: Ledger, n: int = 4) -> None:
    led.set_budget("alice", "d", 1.0)
    for i in range(n):
        led.charge("alice", "d", PrivacyCost((MechanismCost("laplace", 1.0, 10.0, 0.1, 0.0, None, "L"),)), f"q{i}")


def _put(led: Ledger, st_: incremental.BudgetState) -> None:
    led.store.transaction(lambda txn: incremental.save(txn, txn.get_budget("alice", "d"), st_))


def test_missing_or_altered_state_is_recomputed(ledger_target):
    with Ledger(ledger_target) as led:
        _charge_some(led)
        good = stored_state(led, "alice", "d")
        assert good is not None and good.n == 4
        # a row that no longer matches its checksum is not read (recomputed instead)
        led.store.transaction(lambda txn: txn.conn.execute(
            "UPDATE budget_state SET state = ? WHERE analyst = 'alice'",
            (good.to_json() + " ",)))  # still valid JSON, but not what was checksummed
        assert stored_state(led, "alice", "d") is None
        assert led.remaining("alice", "d").spent.epsilon == pytest.approx(0.4)
        led.store.transaction(lambda txn: txn.conn.execute("DELETE FROM budget_state"))
        for _ in range(6):  # 0.4 + 6 × 0.1 = 1.0: exactly six more fit, whatever the state said
            led.charge("alice", "d", PrivacyCost((MechanismCost("laplace", 1.0, 10.0, 0.1, 0.0, None, "L"),)), "q")
        with pytest.raises(BudgetExceeded):
            led.charge("alice", "d", PrivacyCost((MechanismCost("laplace", 1.0, 10.0, 0.1, 0.0, None, "L"),)), "q")
        assert stored_state(led, "alice", "d") == full_state(led, "alice", "d")


def test_stale_state_is_not_trusted(ledger_target):
    """A state that does not describe the current history (older newest charge, other budget
    parameters, other totals) is recomputed: it can never make a charge fit that does not."""
    with Ledger(ledger_target) as led:
        _charge_some(led)
        old = stored_state(led, "alice", "d")
        _charge_some(led, 0)
        led.charge("alice", "d", PrivacyCost((MechanismCost("laplace", 1.0, 10.0, 0.1, 0.0, None, "L"),)), "q5")
        _put(led, old)  # the state from before the fifth charge: last_id and totals differ
        assert stored_state(led, "alice", "d") is None
        assert led.remaining("alice", "d").spent.epsilon == pytest.approx(0.5)
        led.set_budget("alice", "d", 2.0)  # other parameters: the key differs
        assert stored_state(led, "alice", "d") is None
        assert led.remaining("alice", "d").spent.epsilon == pytest.approx(0.5)


def test_forged_state_that_passes_the_checks_is_refused_by_verify(ledger_target):
    """A state with the right count, newest id and totals but smaller accountant sums (what a bug or
    a hand edit could leave) would under-count: verify compares it with the full recomputation."""
    with Ledger(ledger_target) as led:
        _charge_some(led)
        good = stored_state(led, "alice", "d")
        forged = replace(good, composed=ComposedState(good.composed.n, {"eps": Fraction(1, 10), "delta": Fraction(0)}))
        _put(led, forged)
        assert stored_state(led, "alice", "d") == forged  # the cheap checks cannot see it
        with pytest.raises(LedgerError, match="incremental accountant state"):
            led.verify()
    with pytest.raises(LedgerError, match="incremental accountant state"):
        Ledger(ledger_target, create=False)  # opening verifies: no query is answered on it
