"""Issue 16: output-DP accounting in the ledger (accountant = "odp").

The accountant is checked against an independent transcription of odp_privacy_accounting.md
Alg. 1 (ODPComposition) and of the linear ODP filter of Alg. 6 / Def. 19, in exact fractions, and
against the numbers the paper states for the sparse vector technique (Lemma 8 and its
application), the PTR functions of Dwork & Lei (Sec. 4.2, the three cases) and M_IQR (Lemma 10).
Then the ledger's side: worst case before anything runs, settlement refunds only what the output
allows, unsettled charges (crash) stay at the worst case, idempotent and refused double
settlements, settlement capability, concurrency across processes and threads, status.

Every ε and δ used in the arithmetic tests is dyadic (k/16, k·2^-20), so float sums are exact and
the ledger's decisions must equal the exact reference, with no tolerance."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import pytest

from dpch.accounting import (SETTLED_KIND, get_accountant, make_budget, odp_filter, odp_realized, odp_round)
from dpch.cost import MechanismCost, PrivacyCost
from dpch.errors import BudgetExceeded, InvalidParameter, LedgerError, QueryRejected
from dpch.ledger import Ledger, Receipt
from ledger_stores import ledger_target, pg_server  # noqa: F401  (the two stores)

REPO = Path(__file__).resolve().parents[1]
D = 2.0 ** -20  # a dyadic δ unit


def mech(sup: float, cells=(), delta: float = 0.0, label: str = "M", kind: str = "threshold") -> MechanismCost:
    """A mechanism that is (P, E, δ)-ODP with sup E = `sup` and E(P_k) = cells[k] (Def. 2)."""
    return MechanismCost(kind, 1.0, 1.0, sup, delta, None, label, tuple(cells))


def q(*m: MechanismCost) -> PrivacyCost:
    return PrivacyCost(tuple(m))


@pytest.fixture
def ledger(ledger_target):
    with Ledger(ledger_target) as led:
        yield led


# ---------------------------------------------------------------------------------------------
# The independent reference: odp_privacy_accounting.md Alg. 1, transcribed in exact fractions
# ---------------------------------------------------------------------------------------------

def alg1(eps_t, delta_t, rounds):
    """ODPComposition (Alg. 1) for a sequence of attempted rounds (sup E_i, δ_i, E_i(P_{i,k})):
    line 2 sets the remaining budget; a round whose sup E exceeds ε_r (line 9) or whose δ exceeds
    δ_r (line 10) cannot be chosen (the adversary picks the constant (0, 0) mechanism instead);
    otherwise it runs and lines 14-15 subtract the realised ε of its cell and its declared δ.
    Returns (accepted flags, ε spent, δ spent)."""
    eps_r, delta_r = Fraction(eps_t), Fraction(delta_t)
    accepted = []
    for sup, dlt, realised in rounds:
        sup, dlt, realised = Fraction(sup), Fraction(dlt), Fraction(realised)
        if sup <= eps_r and dlt <= delta_r:  # lines 9-10
            eps_r -= realised  # line 14
            delta_r -= dlt  # line 15
            accepted.append(True)
        else:
            accepted.append(False)
    return accepted, Fraction(eps_t) - eps_r, Fraction(delta_t) - delta_r


def linear_filter(eps_seq, delta_seq, eps_t, delta_t) -> str:
    """The ODP filter after Def. 19: HALT iff Σ ε^i > ε_t or Σ δ_i > δ_t (exact)."""
    if sum(map(Fraction, eps_seq), Fraction(0)) > Fraction(eps_t) or \
            sum(map(Fraction, delta_seq), Fraction(0)) > Fraction(delta_t):
        return "HALT"
    return "CONT"


def alg1_accepts_in_order(eps_t, delta_t, charges) -> bool:
    """Soundness of a recorded history: every charge, in charge order, passes Alg. 1 lines 9-10
    with the realised ε of the charges before it (charges: (sup, δ, realised))."""
    accepted, _, _ = alg1(eps_t, delta_t, charges)
    return all(accepted)


def test_reference_transcription_on_the_papers_toy_example():
    # M_toy (Sec. 1 / Sec. 3): E(R) = ε, E({⊥}) = 0. With ε_t = ε: ⊥, ⊥, release, then nothing fits
    eps = Fraction(1, 2)
    acc, spent, _ = alg1(eps, 0, [(eps, 0, 0), (eps, 0, 0), (eps, 0, eps), (eps, 0, 0)])
    assert acc == [True, True, True, False] and spent == eps
    assert linear_filter([0, 0, eps], [0, 0, 0], eps, 0) == "CONT"
    assert linear_filter([0, eps, eps], [0, 0, 0], eps, 0) == "HALT"


# ---------------------------------------------------------------------------------------------
# The accountant: budget validation, the filter, one round per mechanism, theorem coverage
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, match", [
    (dict(per_query_epsilon=0.1, max_queries=3), "declare"),
    (dict(gamma=0.1), "gamma"),
    (dict(mechanism_delta=0.0), "mechanism_delta"),
    (dict(delta=1.0), "delta"),
])
def test_budget_validation(kwargs, match):
    args = dict(epsilon=1.0, delta=1e-6, accountant="odp")
    args.update(kwargs)
    with pytest.raises(InvalidParameter, match=match):
        make_budget(**args)
    b = make_budget(1.0, 0.0, "odp")
    assert (b.accountant, b.delta) == ("odp", 0.0) and get_accountant("odp").supports_settlement


def test_odp_filter_matches_the_reference():
    rng = random.Random(16)
    for _ in range(2000):
        n = rng.randint(0, 6)
        eps = [rng.randint(0, 16) / 16 for _ in range(n)]
        dels = [rng.randint(0, 3) * D for _ in range(n)]
        eps_t, delta_t = rng.randint(1, 48) / 16, rng.randint(0, 8) * D
        assert odp_filter(eps, dels, eps_t, delta_t) == linear_filter(eps, dels, eps_t, delta_t)


def test_decide_is_the_filter_on_realised_past_and_worst_next():
    acc = get_accountant("odp")
    b = make_budget(1.0, 4 * D, "odp")
    settled = q(MechanismCost(SETTLED_KIND, 0.0, 0.0, 0.25, D, None, "svt"))  # realised 1/4 of a sup 3/4
    pending = q(mech(0.25, (0.25, 0.0), D, "ptr"))  # not settled: counts at sup E = 1/4
    d = acc.decide(b, [settled, pending], q(mech(0.5, (), D)))
    assert d.ok and d.spent_after.epsilon == 1.0 and d.spent_after.delta == 3 * D and d.remaining.epsilon == 0.0
    d = acc.decide(b, [settled, pending], q(mech(0.5 + 2 ** -10)))
    assert not d.ok and "Alg. 6 line 7" in d.reason and d.needs.epsilon == 0.5 + 2 ** -10
    d = acc.decide(b, [settled, pending], q(mech(0.0, (), 3 * D)))  # δ by simple addition, never refunded
    assert not d.ok and "Σδ" in d.reason and "line 15" in d.reason
    # a query's mechanisms are consecutive rounds: their worst cases add up
    d = acc.decide(b, [settled, pending], q(mech(0.25), mech(0.25 + 2 ** -10)))
    assert not d.ok


def test_what_the_theorem_covers():
    acc = get_accountant("odp")
    b = make_budget(10.0, 1e-3, "odp")
    gauss_rho_only = MechanismCost("gaussian", 1.0, 3.0, 0.0, 0.0, 1 / 18, "SUM(x)")
    for m in (gauss_rho_only, MechanismCost("mystery", 1.0, 1.0, 0.1)):
        d = acc.decide(b, [], q(m))
        assert not d.ok and d.needs is None and "cannot charge" in d.reason
    # (ε, δ) mechanisms are covered (Def. 2, Lemma 20 allow δ > 0), pure ones too
    for m in (MechanismCost("gaussian", 1.0, 3.0, 0.5, 1e-6, 1 / 18, "SUM(x)"), mech(0.5, (0.5, 0.25), 1e-6),
              MechanismCost("laplace", 1.0, 2.0, 0.5, 0.0, None, "COUNT(*)"), MechanismCost("exponential", 1.0, 1.0, 0.5)):
        assert acc.decide(b, [], q(m)).ok, m.kind
    # the Laplace worst case is max(declared ε, S/b), as for every accountant
    assert odp_round(MechanismCost("laplace", 1.0, 1.0, 0.5, 0.0, None, "x", (0.5, 0.0))) == (1.0, 0.0)


def test_odp_realized_builds_the_cell_values():
    cost = q(mech(0.75, (0.25, 0.375, 0.5), 0.0, "svt"), mech(0.5, (), D, "plain"))
    r = odp_realized(cost, [1, None])
    assert [m.epsilon for m in r.mechanisms] == [0.375, 0.5] and [m.label for m in r.mechanisms] == ["svt", "plain"]
    for cells in ([1], [3, None], [None, 0], [True, None], [-1, None]):
        with pytest.raises(InvalidParameter):
            odp_realized(cost, cells)
    # no refund = the reservation itself, which for a Laplace is max(declared ε, S/b)
    lap = MechanismCost("laplace", 1.0, 1.0, 0.5, 0.0, None, "x", (0.5, 0.0))
    assert odp_realized(q(lap), [None]).mechanisms[0].epsilon == 1.0


# ---------------------------------------------------------------------------------------------
# The ledger against Alg. 1: random sequences, settled right after each run
# ---------------------------------------------------------------------------------------------

def random_round(rng: random.Random):
    sup = rng.randint(1, 16) / 16
    cells = sorted({rng.randint(0, int(sup * 16)) / 16 for _ in range(rng.randint(0, 3))})
    delta = rng.choice([0.0] * 6 + [D, 2 * D])
    cell = rng.randrange(len(cells)) if cells and rng.random() < 0.8 else None
    realised = sup if cell is None else cells[cell]
    return mech(sup, cells, delta, "m"), cell, realised


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sequential_decisions_equal_alg1(ledger, seed):
    rng = random.Random(seed)
    eps_t, delta_t = 4.0, 24 * D
    ledger.set_budget("alice", "d", eps_t, delta_t, "odp")
    rounds, decisions = [], []
    for i in range(120):
        m, cell, realised = random_round(rng)
        rounds.append((m.epsilon, m.delta, realised))
        try:
            r = ledger.charge("alice", "d", q(m), f"q{i}")
        except BudgetExceeded:
            decisions.append(False)
            continue
        decisions.append(True)
        s = ledger.settle(r, odp_realized(r.cost, [cell]))
        assert s.realized_epsilon == realised and s.reserved_epsilon == m.epsilon
    want, eps_spent, delta_spent = alg1(eps_t, delta_t, rounds)
    assert decisions == want
    assert 10 < sum(want) < 120  # the sequence both refunds and refuses
    st = ledger.remaining("alice", "d")
    assert Fraction(st.spent.epsilon) == eps_spent and Fraction(st.spent.delta) == delta_spent
    assert st.settled == sum(want) and st.unsettled == 0


@pytest.mark.parametrize("seed", [4, 5])
def test_interleaved_reservations_are_sound_for_alg1(ledger, seed):
    """Several charges outstanding at once (concurrent queries): each decision is the filter with
    the unsettled ones at their worst case, and the history in charge order is one that Alg. 1
    accepts with the realised values."""
    rng = random.Random(seed)
    eps_t, delta_t = 8.0, 32 * D
    ledger.set_budget("alice", "d", eps_t, delta_t, "odp")
    outstanding, charges = [], []  # charges: [sup, δ, realised or None (unsettled)]
    refused = 0
    for i in range(200):
        if outstanding and rng.random() < 0.45:
            r, cell, realised, idx = outstanding.pop(rng.randrange(len(outstanding)))
            ledger.settle(r, odp_realized(r.cost, [cell]))
            charges[idx][2] = realised
            continue
        m, cell, realised = random_round(rng)
        past_e = [c[0] if c[2] is None else c[2] for c in charges]
        past_d = [c[1] for c in charges]
        expect = linear_filter(past_e + [m.epsilon], past_d + [m.delta], eps_t, delta_t) == "CONT"
        try:
            r = ledger.charge("alice", "d", q(m), f"q{i}")
        except BudgetExceeded:
            assert not expect
            refused += 1
            continue
        assert expect
        charges.append([m.epsilon, m.delta, None])
        outstanding.append((r, cell, realised, len(charges) - 1))
    assert refused > 5 and len(charges) > 20
    for r, cell, realised, idx in outstanding:
        ledger.settle(r, odp_realized(r.cost, [cell]))
        charges[idx][2] = realised
    assert alg1_accepts_in_order(eps_t, delta_t, [tuple(c) for c in charges])
    hist = ledger.history("alice", "d")
    assert [(h.epsilon, h.effective_epsilon) for h in hist] == [(c[0], c[2]) for c in charges]


# ---------------------------------------------------------------------------------------------
# The paper's own numbers
# ---------------------------------------------------------------------------------------------

def test_sparse_vector_lemma8_and_its_application(ledger):
    """Sec. 4.1: M_SVT is (P, E, 0)-ODP with E(S_c') = ε1 + (c'/c) ε2 (Lemma 8). With ε_t = ε1 + ε2
    + ε3 and c' < c tops, the release of the c' entries gets ε3' = ε3 + ((c - c')/c) ε2."""
    e1, e2, e3, c = 0.25, 0.5, 0.25, 4
    ledger.set_budget("alice", "v", e1 + e2 + e3, 0.0, "odp")
    cells = tuple(e1 + k / c * e2 for k in range(c + 1))
    assert cells == (0.25, 0.375, 0.5, 0.625, 0.75)
    r = ledger.charge("alice", "v", q(mech(e1 + e2, cells, 0.0, "SVT", kind="laplace")), "svt")
    c_prime = 1
    ledger.settle(r, odp_realized(r.cost, [c_prime]))
    e3_prime = e3 + (c - c_prime) / c * e2
    assert e3_prime == 0.625
    st = ledger.remaining("alice", "v")
    assert st.remaining.epsilon == e3_prime and st.spent.epsilon == e1 + c_prime / c * e2
    with pytest.raises(BudgetExceeded):
        ledger.charge("alice", "v", q(mech(e3_prime + 2 ** -10, (), 0.0, "release")), "too much")
    ledger.charge("alice", "v", q(*[mech(e3_prime / c_prime, (), 0.0, f"entry {i}") for i in range(c_prime)]), "rel")
    assert ledger.remaining("alice", "v").remaining.epsilon == 0.0


@pytest.mark.parametrize("case, outputs, want", [
    (1, ["r"], (2, 1)),  # M1 returns r: (2ε, δ)
    (2, ["⊥", "r"], (3, 2)),  # M1 ⊥, M2 r: (3ε, 2δ)
    (3, ["⊥", "⊥"], (2, 2)),  # both ⊥: (2ε, 2δ)
])
def test_ptr_functions_the_three_cases_of_sec_4_2(ledger, case, outputs, want):
    """Sec. 4.2: an (ε, δ)-PTR function is ({C', {⊥}}, E, δ)-ODP with E(C') = 2ε, E(⊥) = ε. M_IQR as
    two separate PTR functions composed by Alg. 1, where M2 runs only after M1 returned ⊥."""
    eps, delta = 0.25, 4 * D
    ledger.set_budget("alice", "iqr", 3 * eps, 2 * delta, "odp")
    ptr = (2 * eps, eps)  # cell 0: C' (a value), cell 1: ⊥
    for i, out in enumerate(outputs):
        r = ledger.charge("alice", "iqr", q(mech(2 * eps, ptr, delta, f"M{i + 1}_D")), f"M{i + 1}")
        if i == 0:  # worst case first: M2 does not fit before M1 settled (2ε + 2ε > 3ε)
            with pytest.raises(BudgetExceeded):
                ledger.charge("alice", "iqr", q(mech(2 * eps, ptr, delta, "M2_D")), "M2 too early")
        ledger.settle(r, odp_realized(r.cost, [0 if out == "r" else 1]))
    st = ledger.remaining("alice", "iqr")
    assert (st.spent.epsilon, st.spent.delta) == (want[0] * eps, want[1] * delta)
    _, e_ref, d_ref = alg1(3 * eps, 2 * delta, [(2 * eps, delta, (2 if o == "r" else 1) * eps) for o in outputs])
    assert (Fraction(st.spent.epsilon), Fraction(st.spent.delta)) == (e_ref, d_ref)


def test_iqr_lemma10_then_median(ledger):
    """Lemma 10: M_IQR is ({R, ⊥}, E, δ)-ODP with E(R) = 3ε, E(⊥) = 2ε. Application: budget
    (3ε1 + ε2, δ1 + δ2); after a ⊥ the median gets (ε1 + ε2, δ2)."""
    e1, e2, d1, d2 = 0.125, 0.25, 2 * D, 3 * D
    ledger.set_budget("alice", "iqr", 3 * e1 + e2, d1 + d2, "odp")
    r = ledger.charge("alice", "iqr", q(mech(3 * e1, (3 * e1, 2 * e1), d1, "M_IQR")), "iqr")
    ledger.settle(r, odp_realized(r.cost, [1]))  # ⊥
    st = ledger.remaining("alice", "iqr")
    assert (st.remaining.epsilon, st.remaining.delta) == (e1 + e2, d2)
    with pytest.raises(BudgetExceeded):
        ledger.charge("alice", "iqr", q(mech(e1 + e2 + 2 ** -10, (), d2, "median")), "median+")
    ledger.charge("alice", "iqr", q(mech(e1 + e2, (), d2, "median")), "median")


# ---------------------------------------------------------------------------------------------
# Worst case before running; coverage refusals through the ledger
# ---------------------------------------------------------------------------------------------

def test_worst_case_is_charged_even_if_the_realised_value_would_fit(ledger):
    ledger.set_budget("alice", "v", 1.0, 0.0, "odp")
    svt = q(mech(0.75, (0.25, 0.5, 0.75), 0.0, "SVT"))
    r = ledger.charge("alice", "v", svt, "svt")
    assert r.spent_after.epsilon == 0.75 and r.remaining.epsilon == 0.25
    # it will realise 1/4 and 1/4 + 1/2 fits, but the reservation is the worst case
    with pytest.raises(BudgetExceeded, match=r"Alg\. 6 line 7"):
        ledger.charge("alice", "v", q(mech(0.5, (), 0.0, "release")), "release")
    assert len(ledger.history()) == 1 and ledger.events(kind="rejected")
    ledger.settle(r, odp_realized(r.cost, [0]))
    ledger.charge("alice", "v", q(mech(0.5, (), 0.0, "release")), "release")
    assert ledger.remaining("alice", "v").spent.epsilon == 0.75


def test_uncovered_mechanism_is_rejected_not_charged(ledger):
    ledger.set_budget("alice", "d", 5.0, 1e-6, "odp")
    with pytest.raises(QueryRejected, match="odp accountant cannot charge"):
        ledger.charge("alice", "d", q(MechanismCost("gaussian", 1.0, 3.0, 0.0, 0.0, 1 / 18, "SUM(x)")), "g")
    assert ledger.history() == [] and ledger.events(kind="rejected")[-1].detail["reason"].startswith("the odp")
    # an (ε, δ) Gaussian is covered; its δ stays after any settlement
    r = ledger.charge("alice", "d", q(MechanismCost("gaussian", 1.0, 3.0, 0.5, 1e-7, 1 / 18, "SUM(x)")), "g2")
    s = ledger.settle(r, odp_realized(r.cost, [None]))
    assert (s.refund_epsilon, s.delta) == (0.0, 1e-7)


# ---------------------------------------------------------------------------------------------
# Settlement rules
# ---------------------------------------------------------------------------------------------

def test_double_settle_is_idempotent_or_refused(ledger):
    ledger.set_budget("alice", "v", 2.0, 0.0, "odp")
    r = ledger.charge("alice", "v", q(mech(0.75, (0.25, 0.5), 0.0, "SVT")), "svt")
    first = ledger.settle(r, odp_realized(r.cost, [0]))
    assert (first.reserved_epsilon, first.realized_epsilon, first.refund_epsilon, first.replayed) == (0.75, 0.25, 0.5, False)
    again = ledger.settle(r, odp_realized(r.cost, [0]))  # a retry: nothing changes
    assert again == replace(first, replayed=True)
    for cells in ([1], [None]):
        with pytest.raises(InvalidParameter, match="already settled"):
            ledger.settle(r, odp_realized(r.cost, cells))
    assert len(ledger.events(kind="settle")) == 1 and len(ledger.events(kind="settle_refused")) == 2
    st = ledger.remaining("alice", "v")
    assert st.spent.epsilon == 0.25 and st.refunded_epsilon == 0.5


def test_settle_refuses_more_than_the_reservation(ledger):
    ledger.set_budget("alice", "v", 5.0, 4 * D, "odp")
    r = ledger.charge("alice", "v", q(mech(0.5, (0.25, 0.0), D, "ptr")), "p")
    with pytest.raises(InvalidParameter, match="larger than the reservation"):
        ledger.settle(r, q(mech(0.75, (), D, "ptr")))
    with pytest.raises(InvalidParameter, match="larger than the reserved δ"):
        ledger.settle(r, q(mech(0.25, (), 2 * D, "ptr")))
    with pytest.raises(InvalidParameter, match="not one of the ODP partition values"):
        ledger.settle(r, q(mech(0.125, (), D, "ptr")))
    with pytest.raises(InvalidParameter, match="same mechanisms"):
        ledger.settle(r, q(mech(0.0, (), D, "ptr"), mech(0.0, (), 0.0, "ptr")))
    assert ledger.history()[0].outcome == "reserved"
    s = ledger.settle(r, q(mech(0.0, (), 0.0, "ptr")))  # a smaller realised δ is not refunded (line 15)
    assert (s.realized_epsilon, s.delta) == (0.0, D)


def test_settle_refuses_someone_elses_receipt(tmp_path):
    with Ledger(tmp_path / "a.sqlite") as a, Ledger(tmp_path / "b.sqlite") as b:
        for led in (a, b):
            led.set_budget("alice", "v", 5.0, 0.0, "odp")
            led.set_budget("bob", "v", 5.0, 0.0, "odp")
        cost = q(mech(1.0, (0.0,), 0.0, "toy"))
        ra = a.charge("alice", "v", cost, "same text")
        rb = b.charge("alice", "v", cost, "same text")
        assert ra.id == rb.id
        with pytest.raises(LedgerError, match="no charge matching"):  # a receipt of another ledger
            b.settle(ra, odp_realized(cost, [0]))
        # a receipt rebuilt from what the history shows: same fields, no settlement capability
        forged = replace(rb, token="0" * 32)
        with pytest.raises(InvalidParameter, match="token mismatch"):
            b.settle(forged, odp_realized(cost, [0]))
        with pytest.raises(InvalidParameter, match="token mismatch"):
            b.settle(replace(rb, token=""), odp_realized(cost, [0]))
        rbob = b.charge("bob", "v", cost, "bob's")
        with pytest.raises(InvalidParameter, match="another analyst"):
            b.settle(rbob, odp_realized(cost, [0]), analyst="alice")
        assert {h.outcome for h in b.history()} == {"reserved"}
        assert len(b.events(kind="settle_refused")) == 3
        assert b.settle(rb, odp_realized(cost, [0]), analyst="alice").refund_epsilon == 1.0
        assert "token" not in repr(rb) and rb.token not in repr(rb)


def test_failed_and_reset_charges_do_not_settle(ledger):
    ledger.set_budget("alice", "v", 5.0, 0.0, "odp")
    cost = q(mech(1.0, (0.0,), 0.0, "toy"))
    r = ledger.charge("alice", "v", cost, "x")
    ledger.mark(r, "failed")
    with pytest.raises(InvalidParameter, match="failed"):
        ledger.settle(r, odp_realized(cost, [0]))
    r2 = ledger.charge("alice", "v", cost, "y")
    ledger.reset("alice", "v", confirm=True)
    with pytest.raises(InvalidParameter, match="reset"):
        ledger.settle(r2, odp_realized(cost, [0]))


def test_settlement_is_one_transaction(ledger, monkeypatch):
    """A settlement that fails half-way (here: the event write) leaves nothing behind: the charge
    stays reserved at its worst case and the totals still match; a settle over inconsistent totals
    is refused like a charge."""
    from dpch.ledger.sqlite_txn import SQLiteTxn

    ledger.set_budget("alice", "v", 5.0, 0.0, "odp")
    r = ledger.charge("alice", "v", q(mech(1.0, (0.25,), 0.0, "SVT")), "svt")
    real_add_event = SQLiteTxn.add_event

    def failing_add_event(self, kind, *args):
        if kind == "settle":
            raise RuntimeError("disk full")
        return real_add_event(self, kind, *args)

    monkeypatch.setattr(SQLiteTxn, "add_event", failing_add_event)
    with pytest.raises(RuntimeError, match="disk full"):
        ledger.settle(r, odp_realized(r.cost, [0]))
    monkeypatch.setattr(SQLiteTxn, "add_event", real_add_event)
    (h,) = ledger.history()
    assert (h.outcome, h.effective_epsilon) == ("reserved", 1.0) and ledger.remaining("alice", "v").spent.epsilon == 1.0
    ledger.verify()

    def tamper(txn):
        txn.put_budget(replace(txn.get_budget("alice", "v"), spent_epsilon=0.5))
    ledger.store.transaction(tamper)
    with pytest.raises(LedgerError, match="running totals"):
        ledger.settle(r, odp_realized(r.cost, [0]))
    assert ledger.history()[0].outcome == "reserved"


def test_status_shows_realised_versus_reserved(ledger):
    ledger.set_budget("alice", "v", 5.0, 4 * D, "odp")
    r1 = ledger.charge("alice", "v", q(mech(1.0, (0.25,), 0.0, "a")), "a")
    r2 = ledger.charge("alice", "v", q(mech(0.5, (0.0,), D, "b")), "b")
    ledger.charge("alice", "v", q(mech(0.75, (0.25,), 0.0, "c")), "c")  # never settled
    r4 = ledger.charge("alice", "v", q(mech(0.5, (0.0,), 0.0, "d")), "d")
    ledger.mark(r4, "failed")  # failed: held at worst case
    ledger.settle(r1, odp_realized(r1.cost, [0]))
    ledger.settle(r2, odp_realized(r2.cost, [0]))
    st = ledger.remaining("alice", "v")
    assert (st.realized_epsilon, st.refunded_epsilon, st.settled) == (0.25, 1.25, 2)
    assert (st.reserved_epsilon, st.unsettled) == (1.25, 2)
    assert st.spent.epsilon == st.realized_epsilon + st.reserved_epsilon == 1.5
    assert st.remaining.epsilon == 3.5 and st.spent.delta == D and st.queries == 4
    text = st.describe()
    assert "2 settled at realised ε=0.25 (refunded 1.25), 2 held at worst case ε=1.25" in text
    assert [s.analyst for s in ledger.budgets()] == ["alice"] and ledger.budgets()[0] == st


# ---------------------------------------------------------------------------------------------
# Alg. 1 line 9 for every recorded charge: budget changes and verification on open
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("accountant", ["odp", "basic", "pure"])
def test_lowering_the_budget_below_a_past_worst_case_is_refused(ledger, accountant):
    ledger.set_budget("alice", "v", 1.0, 0.0, accountant)
    cost = q(MechanismCost("laplace", 1.0, 4 / 3, 0.75, 0.0, None, "SVT", (0.125,)) if accountant == "pure"
             else mech(0.75, (0.125,), 0.0, "SVT"))
    r = ledger.charge("alice", "v", cost, "svt")
    ledger.settle(r, odp_realized(r.cost, [0]))
    # the realised total (1/8) fits ε = 1/2, but Lemma 20 / Alg. 1 line 9 needed sup E = 3/4 ≤ ε_t
    with pytest.raises(InvalidParameter, match=r"Alg\. 1 line 9"):
        ledger.set_budget("alice", "v", 0.5, 0.0, accountant)
    ledger.set_budget("alice", "v", 0.75, 0.0, accountant)


def test_settled_history_does_not_move_to_another_composition_theorem(ledger):
    ledger.set_budget("alice", "v", 1.0, 1e-6, "odp")
    r = ledger.charge("alice", "v", q(mech(0.5, (0.0,), 0.0, "toy")), "t")
    ledger.settle(r, odp_realized(r.cost, [0]))
    with pytest.raises(InvalidParameter, match="simple composition"):
        ledger.set_budget("alice", "v", 1.0, 1e-6, "advanced")
    ledger.set_budget("alice", "v", 1.0, 1e-6, "basic")
    ledger.set_budget("alice", "v", 1.0, 1e-6, "odp")


def test_verify_on_open_checks_alg1_for_every_charge(tmp_path):
    """Totals alone miss a history whose realised sum fits but whose charges did not fit when they
    were made; opening the ledger checks Alg. 1 line 9 for each of them."""
    path = tmp_path / "ledger.sqlite"
    with Ledger(path) as led:
        led.set_budget("alice", "v", 1.0, 0.0, "odp")
        for name in ("a", "b"):
            r = led.charge("alice", "v", q(mech(1.0, (0.0,), 0.0, name)), name)
            led.settle(r, odp_realized(r.cost, [0]))
        assert led.remaining("alice", "v").spent.epsilon == 0.0

        def tamper(txn):  # the budget row edited behind the ledger's back, with a valid checksum
            txn.put_budget(replace(txn.get_budget("alice", "v"), epsilon=0.75))
        led.store.transaction(tamper)
    with pytest.raises(LedgerError, match=r"charge 1 of the generation .* Alg\. 1 line 9"):
        Ledger(path, create=False)


# ---------------------------------------------------------------------------------------------
# Crash after reserve: the worst case stays, for good
# ---------------------------------------------------------------------------------------------

def test_unsettled_charge_stays_at_worst_case_after_reopening(ledger_target):
    path = ledger_target
    cost = q(mech(0.75, (0.0, 0.25), 0.0, "SVT"))
    with Ledger(path) as led:
        led.set_budget("alice", "v", 1.0, 0.0, "odp")
        r = led.charge("alice", "v", cost, "svt")
        lost = replace(r, token="")  # what survives a crash: what the history shows, not the capability
        del r
    with Ledger(path, create=False) as led:
        st = led.remaining("alice", "v")
        assert (st.spent.epsilon, st.reserved_epsilon, st.unsettled, st.settled) == (0.75, 0.75, 1, 0)
        with pytest.raises(InvalidParameter, match="token"):
            led.settle(lost, odp_realized(cost, [0]))
        with pytest.raises(BudgetExceeded):
            led.charge("alice", "v", q(mech(0.5)), "next")
        assert led.remaining("alice", "v").spent.epsilon == 0.75


PREAMBLE = textwrap.dedent("""
    import os, sys, types
    _pkg = types.ModuleType("dpch")
    _pkg.__path__ = [os.path.join(os.environ["DPCH_REPO"], "dpch")]
    sys.modules["dpch"] = _pkg
    import json, signal, time
    from dpch.accounting import odp_realized
    from dpch.cost import MechanismCost, PrivacyCost
    from dpch.errors import BudgetExceeded
    from dpch.ledger import Ledger
    SVT = PrivacyCost((MechanismCost("threshold", 1.0, 1.0, 1.0, 0.0, None, "SVT", (1.0, 0.25)),))
""")

CRASH_WORKER = PREAMBLE + textwrap.dedent("""
    led = Ledger(sys.argv[1], create=False)
    r = led.charge("alice", "v", SVT, "svt, then the process dies before it settles")
    print(json.dumps({"id": r.id}), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def _env() -> dict:
    env = dict(os.environ)
    env["DPCH_REPO"] = str(REPO)
    return env


def test_process_killed_after_reserve_keeps_the_worst_case(ledger_target):
    path = ledger_target
    with Ledger(path) as led:
        led.set_budget("alice", "v", 1.5, 0.0, "odp")
    out = subprocess.run([sys.executable, "-c", CRASH_WORKER, str(path)], env=_env(), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == -signal.SIGKILL, out.stderr
    cid = json.loads(out.stdout)["id"]
    with Ledger(path, create=False) as led:
        (h,) = led.history()
        assert (h.id, h.outcome, h.effective_epsilon) == (cid, "reserved", 1.0)
        st = led.remaining("alice", "v")
        assert (st.spent.epsilon, st.unsettled) == (1.0, 1)
        with pytest.raises(BudgetExceeded):  # 1 + 1 > 1.5 although the SVT would have realised 1/4
            led.charge("alice", "v", PrivacyCost((MechanismCost("threshold", 1.0, 1.0, 1.0, 0.0, None, "SVT", (1.0, 0.25)),)), "x")
        rebuilt = Receipt(h.id, h.analyst, h.dataset, h.accountant, h.cost, h.query_hash, h.created_at,
                          st.spent, st.remaining)
        with pytest.raises(InvalidParameter, match="token"):
            led.settle(rebuilt, odp_realized(h.cost, [1]))
        assert led.remaining("alice", "v").spent.epsilon == 1.0


# ---------------------------------------------------------------------------------------------
# Concurrency: settle and charge from two processes, and two threads on one receipt
# ---------------------------------------------------------------------------------------------

LOOP_WORKER = PREAMBLE + textwrap.dedent("""
    path, name, other = sys.argv[1], sys.argv[2], sys.argv[3]
    led = Ledger(path, create=False)
    open(f"{path}.{name}.ready", "w").close()
    while not os.path.exists(path + ".go"):
        time.sleep(0.001)
    ok, refused, deadline = [], 0, time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            r = led.charge("alice", "v", SVT, name)
        except BudgetExceeded:
            refused += 1
            # stop only when nothing is held at its worst case any more: then the refusal is final
            if led.remaining("alice", "v").unsettled == 0:
                break
            time.sleep(0.0005)
            continue
        led.settle(r, odp_realized(r.cost, [1]))
        ok.append(r.id)
        if len(ok) == 1:  # both workers get through at least once, then race freely
            open(f"{path}.{name}.first", "w").close()
            while not os.path.exists(f"{path}.{other}.first") and time.monotonic() < deadline:
                time.sleep(0.0005)
    else:
        sys.exit("deadline")
    led.close()
    print(json.dumps({"ok": ok, "refused": refused}))
""")


def test_two_processes_charge_and_settle_exactly_to_the_budget(tmp_path):
    """Each worker charges sup E = 1 and settles at 1/4, as fast as it can. With ε_t = 10 an
    accepted charge needs Σ realised + 1 ≤ 10, so exactly 37 fit (36/4 + 1 = 10) whatever the
    interleaving; a refusal while the other worker holds a reservation is retried. Both start
    together and each waits for the other's first charge, so both take part whatever the load."""
    path = tmp_path / "ledger.sqlite"
    with Ledger(path) as led:
        led.set_budget("alice", "v", 10.0, 0.0, "odp")
    procs = [subprocess.Popen([sys.executable, "-c", LOOP_WORKER, str(path), f"w{i}", f"w{1 - i}"], env=_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    deadline = time.monotonic() + 120
    while not all(Path(f"{path}.w{i}.ready").exists() for i in range(2)):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
        time.sleep(0.002)
    Path(str(path) + ".go").touch()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
        results.append(json.loads(out))
    ids = sorted(i for r in results for i in r["ok"])
    assert len(ids) == 37 and len(set(ids)) == 37
    assert all(r["ok"] for r in results)  # both workers got charges through
    with Ledger(path, create=False) as led:  # opening verifies Alg. 1 line 9 for every charge
        hist = led.history("alice", "v")
        assert [h.id for h in hist] == ids and {h.outcome for h in hist} == {"settled"}
        assert alg1_accepts_in_order(10, 0, [(h.epsilon, h.delta, h.effective_epsilon) for h in hist])
        st = led.remaining("alice", "v")
        assert (st.spent.epsilon, st.unsettled, st.settled, st.refunded_epsilon) == (9.25, 0, 37, 27.75)
        assert len(led.events(kind="settle")) == 37 and len(led.events(kind="charge")) == 37


def test_two_threads_settling_one_receipt_apply_one_settlement(ledger):
    ledger.set_budget("alice", "v", 20.0, 0.0, "odp")
    cost = q(mech(1.0, (0.25, 0.5), 0.0, "SVT"))
    for _ in range(10):
        r = ledger.charge("alice", "v", cost, "svt")
        barrier = threading.Barrier(2)
        outcomes: list = [None, None]

        def settle(i: int, cell: int) -> None:
            barrier.wait()
            try:
                outcomes[i] = ledger.settle(r, odp_realized(cost, [cell])).realized_epsilon
            except InvalidParameter as exc:
                outcomes[i] = exc

        threads = [threading.Thread(target=settle, args=(i, i)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        won = [o for o in outcomes if isinstance(o, float)]
        lost = [o for o in outcomes if isinstance(o, InvalidParameter)]
        assert len(won) == 1 and len(lost) == 1 and "already settled" in str(lost[0])
        (h,) = [h for h in ledger.history() if h.id == r.id]
        assert h.effective_epsilon == won[0]
    assert len(ledger.events(kind="settle")) == 10
    ledger.verify()
