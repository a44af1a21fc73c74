"""`Ledger`: check-and-charge, marks, settlements, budgets and resets over a `LedgerStore`
(semantics in the package docstring, `dpch/ledger/__init__.py`, and docs/LEDGER.md)."""
from __future__ import annotations

import hashlib
import hmac
import math
import secrets
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

from ..accounting import (ACCOUNTANTS, SETTLED_KIND, Budget, Decision, _fmt, dp_params, get_accountant,
                          make_budget)
from ..cost import MechanismCost, PrivacyCost
from ..errors import BudgetExceeded, InvalidParameter, LedgerError, NoBudget, QueryRejected
from .records import (BudgetRow, BudgetStatus, ChargeRecord, Event, Receipt, Settlement, budget_dict, check_name,
                      check_totals, cost_from_json, cost_numbers, cost_to_json, cost_to_json_checked,
                      default_ledger_path, is_ledger_url, spent_dict, summarize, totals)
from . import state as incremental
from .sqlite_store import SQLiteLedgerStore
from .store import LedgerStore, LedgerTxn


@dataclass
class _ChargeResult:
    receipt: Receipt | None = None
    error: Exception | None = None


@dataclass
class _SettleResult:
    settlement: Settlement | None = None
    error: Exception | None = None


class Ledger:
    """The privacy-budget ledger of one deployment (see the module docstring)."""

    def __init__(self, path: str | Path | None = None, *, create: bool = True, store: LedgerStore | None = None):
        """``path``: an SQLite ledger file, or a ``postgresql://`` URL (several gateways on one
        ledger, dpch/ledger/postgres_store.py); default $DPCH_LEDGER or the data directory's file."""
        if store is None:
            target = default_ledger_path() if path is None else path
            if is_ledger_url(target):
                from .postgres_store import PostgresLedgerStore  # psycopg is needed only here

                store = PostgresLedgerStore(str(target), create=create)
            else:
                store = SQLiteLedgerStore(target, create=create)
        self.path = getattr(store, "path", None) or (Path(path) if path is not None else None)
        self.store = store
        try:
            self.verify()
        except BaseException:
            store.close()
            raise

    # -- lifecycle --------------------------------------------------------------------------
    def backup(self, dest: str | Path) -> None:
        """Write a consistent copy of the whole ledger to `dest` (which must not exist), through the
        store's own means (SQLite's online backup API). Safe while other handles and processes
        charge: the copy is one committed state."""
        self.store.backup(str(dest))

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> "Ledger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def verify(self) -> None:
        """Full check: storage integrity, running totals, and every budget's recorded history
        within what its accountant allows. Raises LedgerError."""
        self.store.verify()

        def check(txn: LedgerTxn) -> None:
            for b in txn.list_budgets():
                rows = txn.charges(b.analyst, b.dataset, b.generation)
                self._check_history(b, rows)
                incremental.check(txn, self.path, b, rows)  # the stored state == a full recomputation
        self.store.read(check)

    def _check_history(self, b: BudgetRow, rows: Sequence[ChargeRecord]) -> None:
        if b.accountant not in ACCOUNTANTS:
            raise LedgerError(f"ledger {self.path}: budget of analyst {b.analyst!r} on dataset {b.dataset!r} names an "
                              f"unknown accountant {b.accountant!r}")
        budget = b.budget()
        problem = get_accountant(b.accountant).check_history(budget, [r.effective_cost() for r in rows],
                                                             [r.cost for r in rows])
        if problem is not None:
            raise LedgerError(f"ledger {self.path} is inconsistent: the recorded charges of analyst {b.analyst!r} on "
                              f"dataset {b.dataset!r} break the budget ({problem}); refusing to answer queries")

    # -- budgets ----------------------------------------------------------------------------
    def set_budget(self, analyst: str, dataset: str, epsilon: float, delta: float = 0.0, accountant: str = "basic",
                   **params) -> Budget:
        """Set (or change) the budget of (analyst, dataset). Changing an existing budget is allowed
        only if the charges already recorded fit the new budget under the new accountant."""
        analyst = check_name(analyst, "analyst")
        dataset = check_name(dataset, "dataset")
        budget = make_budget(epsilon, delta, accountant, analyst=analyst, dataset=dataset, **params)
        acc = get_accountant(budget.accountant)

        def fn(txn: LedgerTxn) -> Budget:
            now = time.time()
            old = txn.get_budget(analyst, dataset)
            if old is None:
                row = BudgetRow(analyst, dataset, budget.epsilon, budget.delta, budget.accountant, budget.params(), 0,
                                0.0, 0.0, 0.0, 0, now, now)
                detail = {"budget": budget_dict(budget)}
            else:
                rows = txn.charges(analyst, dataset, old.generation)
                check_totals(self.path, old, rows)
                problem = acc.check_history(budget, [r.effective_cost() for r in rows], [r.cost for r in rows])
                if problem is not None:
                    raise InvalidParameter(f"the {len(rows)} charges already recorded for analyst {analyst!r} on dataset "
                                           f"{dataset!r} do not fit the new budget ({problem}); a reset is needed first")
                row = replace(old, epsilon=budget.epsilon, delta=budget.delta, accountant=budget.accountant,
                              params=budget.params(), updated_at=now)
                detail = {"budget": budget_dict(budget), "previous": budget_dict(old.budget())}
            txn.put_budget(row)
            txn.add_event("budget_set", analyst, dataset, None, detail)
            return budget
        return self.store.transaction(fn)

    def get_budget(self, analyst: str, dataset: str) -> Budget:
        row = self.store.read(lambda txn: txn.get_budget(analyst, dataset))
        if row is None:
            raise NoBudget(analyst, dataset)
        return row.budget()

    def remaining(self, analyst: str, dataset: str) -> BudgetStatus:
        return self.store.read(lambda txn: self._status(*self._current(txn, analyst, dataset)))

    def _current(self, txn: LedgerTxn, analyst: str, dataset: str) -> tuple[BudgetRow, incremental.BudgetState]:
        """The budget and its current generation's composed state (dpch/ledger/state.py: the stored
        one if trustworthy, else recomputed from every charge with the totals checked)."""
        row = txn.get_budget(analyst, dataset)
        if row is None:
            raise NoBudget(analyst, dataset)
        return row, incremental.load(txn, self.path, row)

    def budgets(self) -> list[BudgetStatus]:
        def fn(txn: LedgerTxn) -> list[BudgetStatus]:
            return [self._status(row, incremental.load(txn, self.path, row)) for row in txn.list_budgets()]
        return self.store.read(fn)

    def _status(self, row: BudgetRow, st: incremental.BudgetState) -> BudgetStatus:
        budget = row.budget()
        acc = get_accountant(row.accountant)
        spent = acc.spent_from(budget, st.composed)
        realized, reserved, refunded, n_settled, n_held = st.split()
        return BudgetStatus(row.analyst, row.dataset, budget, spent, acc.remaining(budget, spent), st.n, row.generation,
                            realized_epsilon=realized, reserved_epsilon=reserved, refunded_epsilon=refunded,
                            settled=n_settled, unsettled=n_held)

    # -- charging ---------------------------------------------------------------------------
    def precheck(self, analyst: str, dataset: str, epsilon: float, delta: float = 0.0) -> None:
        """Can ``analyst`` afford a query that declares (ε, δ) on ``dataset``? Read-only and free:
        nothing is charged or recorded. The controller asks it before anything the analyst wrote is
        analysed by the engine (DESIGN.md invariant 10), so an analyst without budget learns nothing
        from analysis errors. Raises BudgetExceeded when the budget is missing, its query count is
        used up, or (basic composition, where a query costs exactly its declared ε and at most its
        δ) the remaining ε or δ is too small; for the other accountants, whose cost depends on the
        mechanisms, only when nothing remains. The charge itself (``charge``) decides exactly."""
        analyst = check_name(analyst, "analyst")
        dataset = check_name(dataset, "dataset")

        def fn(txn: LedgerTxn):
            row = txn.get_budget(analyst, dataset)
            if row is None:
                return None, None
            return row, self._status(*self._current(txn, analyst, dataset))

        row, status = self.store.read(fn)
        if row is None:
            raise NoBudget(analyst, dataset)
        left = status.remaining
        tol = 1e-9
        if left.queries is not None and left.queries <= 0:
            short = "no queries remain"
        elif row.accountant == "basic" and (epsilon > left.epsilon * (1 + tol) + 1e-15
                                            or delta > left.delta * (1 + tol) + 1e-18):
            short = f"the query declares ε={_fmt(epsilon)}, δ={_fmt(delta)}"
        elif left.epsilon <= 0 and (left.rho is None or left.rho <= 0):
            short = "nothing remains"
        else:
            return
        raise BudgetExceeded(f"privacy budget exceeded for analyst {analyst!r} on dataset {dataset!r} (accountant "
                             f"{row.accountant}): {short}; remaining: {left.describe()}. Nothing was analysed, nothing "
                             "ran and nothing was charged")

    def charge(self, analyst: str, dataset: str, cost: PrivacyCost, query: str) -> Receipt:
        """Atomic check-and-charge. Returns a Receipt once the charge is durable; raises
        BudgetExceeded (over budget, or no budget set) or QueryRejected (the accountant's theorem
        does not cover the query's mechanisms). A refused query is not charged; the refusal is
        recorded in the event log."""
        analyst = check_name(analyst, "analyst")
        dataset = check_name(dataset, "dataset")
        if not isinstance(cost, PrivacyCost) or not all(isinstance(m, MechanismCost) for m in cost.mechanisms):
            raise InvalidParameter("cost must be a PrivacyCost of MechanismCost")
        if not isinstance(query, str):
            raise InvalidParameter("query must be the query text")
        self._check_odp_declaration(cost)
        cost_json = cost_to_json_checked(cost)
        # the canonical (cached) object for this cost: the one later charges read back from the
        # table, so the accountants' caches find it by identity
        cost = cost_from_json(cost_json)
        qhash = hashlib.sha256(query.encode("utf-8", "surrogatepass")).hexdigest()
        summary = summarize(cost)
        eps, dlt, rho = cost_numbers(cost)
        token = secrets.token_hex(16)  # the settlement capability, held only by the returned Receipt
        token_hash = hashlib.sha256(token.encode()).hexdigest()

        def fn(txn: LedgerTxn) -> _ChargeResult:
            row = txn.get_budget(analyst, dataset)
            if row is None:
                txn.add_event("rejected", analyst, dataset, None,
                              {"reason": "no budget set", "query_hash": qhash, "needs": {"epsilon": eps, "delta": dlt}})
                return _ChargeResult(error=NoBudget(analyst, dataset))
            st = incremental.load(txn, self.path, row)  # O(1) in the history (dpch/ledger/state.py)
            decision, composed = get_accountant(row.accountant).decide_from(row.budget(), st.composed, cost)
            if not decision.ok or composed is None:
                txn.add_event("rejected", analyst, dataset, None, {
                    "reason": decision.reason, "query_hash": qhash, "accountant": row.accountant,
                    "needs": spent_dict(decision.needs), "remaining": spent_dict(decision.remaining)})
                return _ChargeResult(error=self._rejection(row, decision))
            now = time.time()
            rec = ChargeRecord(id=0, analyst=analyst, dataset=dataset, generation=row.generation,
                               accountant=row.accountant, summary=summary, epsilon=eps, delta=dlt, rho=rho,
                               effective_epsilon=eps, effective_delta=dlt, effective_rho=rho, query_hash=qhash,
                               query_text=query, outcome="reserved", created_at=now, updated_at=now,
                               cost_json=cost_json, realized_json=None)
            cid = txn.insert_charge(rec)
            st = st.after(replace(rec, id=cid), composed)
            s_eps, s_dlt, s_rho, n = st.totals.value("eps"), st.totals.value("delta"), st.totals.value("rho"), st.n
            row = replace(row, spent_epsilon=s_eps, spent_delta=s_dlt, spent_rho=s_rho, n_charges=n, updated_at=now)
            txn.put_budget(row)
            incremental.save(txn, row, st)
            txn.add_event("charge", analyst, dataset, cid, {
                "accountant": row.accountant, "epsilon": eps, "delta": dlt, "rho": rho, "query_hash": qhash,
                "spent_after": spent_dict(decision.spent_after), "remaining": spent_dict(decision.remaining),
                "total_epsilon": s_eps, "total_delta": s_dlt, "n_charges": n, "settle_token_sha256": token_hash})
            return _ChargeResult(receipt=Receipt(cid, analyst, dataset, row.accountant, cost, qhash, now,
                                                 decision.spent_after, decision.remaining, token))

        result = self.store.transaction(fn)
        if result.error is not None:
            raise result.error
        assert result.receipt is not None
        return result.receipt

    @staticmethod
    def _check_odp_declaration(cost: PrivacyCost) -> None:
        for m in cost.mechanisms:
            for e in m.odp_epsilons:
                if not isinstance(e, (int, float)) or not math.isfinite(e) or e < 0 or e > m.epsilon * (1 + 1e-12):
                    raise InvalidParameter(f"mechanism {m.label or m.kind!r}: ODP partition values must lie in "
                                           f"[0, ε = {_fmt(m.epsilon)}] (odp_privacy_accounting.md Lemma 4)")

    def _rejection(self, row: BudgetRow, d: Decision) -> Exception:
        who = f"analyst {row.analyst!r} on dataset {row.dataset!r}"
        if d.needs is None:
            return QueryRejected(f"the ledger refused the query for {who}: {d.reason}. Nothing ran and nothing was charged")
        in_eps = ""
        if row.accountant == "zcdp" and d.needs.rho is not None and d.remaining is not None \
                and d.remaining.rho is not None:
            from ..accounting import zcdp_to_dp  # the accountant's own conversion (CKS20 Prop 12)

            budget = row.budget()
            at = budget.delta - (budget.mechanism_delta or 0.0)
            in_eps = (f" In ε at δ = {_fmt(at)}: the query needs ε = {_fmt(zcdp_to_dp(d.needs.rho, at))}, "
                      f"ε = {_fmt(zcdp_to_dp(max(0.0, d.remaining.rho), at))} remains.")
        return BudgetExceeded(
            f"privacy budget exceeded for {who} (accountant {row.accountant}): {d.reason}. "
            f"The query needs {d.needs.describe()}; remaining: {d.remaining.describe()}.{in_eps} "
            f"Nothing ran and nothing was charged")

    def mark(self, receipt: Receipt, outcome: str) -> None:
        """Record how the execution ended: "executed" or "failed". Either way the charge stays
        (fail closed: a failed execution may still have touched or released data)."""
        if outcome not in ("executed", "failed"):
            raise InvalidParameter(f"outcome must be 'executed' or 'failed' (got {outcome!r})")

        def fn(txn: LedgerTxn) -> None:
            rec = self._charge_for(txn, receipt)
            if rec.outcome == outcome:
                return
            if rec.outcome != "reserved" and not (rec.outcome == "settled" and outcome == "executed"):
                raise InvalidParameter(f"charge #{rec.id} is {rec.outcome}; it cannot become {outcome}")
            if rec.outcome == "settled":
                return  # settled implies executed
            txn.update_charge(replace(rec, outcome=outcome, updated_at=time.time()))
            txn.add_event("mark", rec.analyst, rec.dataset, rec.id, {"outcome": outcome, "charge_kept": True})
        # Not fsynced: the charge itself already is, and losing this mark to a power cut leaves the
        # charge "reserved", which counts in full like "executed" (fail closed). Saves one fsync
        # (~4 ms here) per query; the next durable commit or checkpoint persists it.
        self.store.transaction(fn, durable=False)

    def _charge_for(self, txn: LedgerTxn, receipt: Receipt) -> ChargeRecord:
        rec = txn.get_charge(receipt.id)
        if rec is None or rec.analyst != receipt.analyst or rec.dataset != receipt.dataset or rec.query_hash != receipt.query_hash:
            raise LedgerError(f"ledger {self.path} has no charge matching receipt #{receipt.id}")
        return rec

    def settle(self, receipt: Receipt, realized: PrivacyCost, *, analyst: str | None = None) -> Settlement:
        """A posteriori settlement: odp_privacy_accounting.md Alg. 1 (ODPComposition) lines 13-15,
        valid by Thm 7; in filter form Alg. 6 line 12 (docs/LEDGER.md, "Output-DP accounting").

        Before running, each mechanism declared (P, E, δ) (Def. 2) through its ε (= sup E, charged
        and checked against the budget at charge time: Alg. 1 line 9, Alg. 6 line 7) and
        `odp_epsilons` (the values E(P_k)). After it ran, `realized` gives for each mechanism, in the
        same order, the ε of the cell its released output fell in (build it with
        `dpch.accounting.odp_realized(receipt.cost, cells)`): the ledger replaces the reserved ε by it
        (line 14). One store transaction, like `charge`. Refused (InvalidParameter, and a
        `settle_refused` event; nothing changes):
        - a receipt that is not the one `charge` returned (its settlement token does not match), or,
          with `analyst` given, a charge of another analyst;
        - accountants without simple composition (only `pure`, `basic`, `odp`: Thm 7 is proved for
          the linear filter Σε ≤ ε_t, Σδ ≤ δ_t, Appendix A);
        - a realised ε that is larger than the reservation or is not one of the declared E(P_k) or the
          full ε (trivial partition, Lemma 3); a realised δ larger than the reserved one. δ is never
          refunded (line 15 subtracts the declared δ_i whatever the output);
        - a failed charge (the output cell is unknown), a charge of an older generation (reset), and
          a second settlement with a different realised cost. Settling again with the same realised
          cost changes nothing and returns the recorded `Settlement` with `replayed=True`.
        Settling after later charges were made is conservative: those charges were checked against
        a smaller remaining budget than Alg. 1 would have used.
        """
        if not isinstance(receipt, Receipt):
            raise InvalidParameter("receipt must be the Receipt that charge returned")
        if not isinstance(realized, PrivacyCost) or not all(isinstance(m, MechanismCost) for m in realized.mechanisms):
            raise InvalidParameter("realized must be a PrivacyCost of MechanismCost")
        owner = None if analyst is None else check_name(analyst, "analyst")
        token_hash = hashlib.sha256(receipt.token.encode()).hexdigest() if isinstance(receipt.token, str) and receipt.token else None
        try:
            receipt_cost_json = cost_to_json(receipt.cost)
        except (ValueError, TypeError, AttributeError):
            raise InvalidParameter("the receipt's cost is unreadable") from None

        def fn(txn: LedgerTxn) -> _SettleResult:
            rec = self._charge_for(txn, receipt)
            if rec.created_at != receipt.created_at or rec.cost_json != receipt_cost_json:
                raise LedgerError(f"ledger {self.path} has no charge matching receipt #{receipt.id}")

            def refuse(message: str) -> _SettleResult:
                txn.add_event("settle_refused", rec.analyst, rec.dataset, rec.id, {"reason": message})
                return _SettleResult(error=InvalidParameter(message))

            if owner is not None and owner != rec.analyst:
                return refuse(f"charge #{rec.id} belongs to another analyst; only its own charges settle for {owner!r}")
            recorded = [e.detail.get("settle_token_sha256") for e in txn.events(kind="charge", charge_id=rec.id)]
            if len(recorded) != 1 or not isinstance(recorded[0], str):
                return refuse(f"charge #{rec.id} has no settlement token on record; it stays charged at its reservation")
            if token_hash is None or not hmac.compare_digest(recorded[0], token_hash):
                return refuse(f"receipt #{rec.id} is not the one its charge returned (settlement token mismatch); only "
                              f"the process that made the charge can settle it, and the charge stays at its reservation")
            row = txn.get_budget(rec.analyst, rec.dataset)
            if row is None or row.generation != rec.generation:
                return refuse(f"charge #{rec.id} belongs to a budget that was reset; nothing to settle")
            for name in dict.fromkeys((rec.accountant, row.accountant)):
                if not get_accountant(name).supports_settlement:
                    return refuse(f"a posteriori settlement is defined for simple composition only (ODP paper Thm 7); "
                                  f"the {name} accountant does not allow it")
            reserved = rec.cost
            if len(realized.mechanisms) != len(reserved.mechanisms):
                return refuse("the realized cost must list the same mechanisms as the reserved one")
            effective = []
            for m, r in zip(reserved.mechanisms, realized.mechanisms):
                what = m.label or m.kind
                if r.kind not in (m.kind, SETTLED_KIND) or r.label != m.label:
                    return refuse(f"realized mechanism {r.label or r.kind!r} does not match reserved {what!r}")
                full_eps, full_delta = dp_params(m)
                if not (isinstance(r.epsilon, (int, float)) and math.isfinite(r.epsilon) and r.epsilon >= 0):
                    return refuse(f"realized ε of {what!r} must be a finite number >= 0")
                if r.epsilon > full_eps * (1 + 1e-12):
                    return refuse(f"realized ε = {_fmt(r.epsilon)} of {what!r} is larger than the reservation "
                                  f"sup E = {_fmt(full_eps)} (Alg. 1 line 9 reserved the worst case)")
                if not (isinstance(r.delta, (int, float)) and math.isfinite(r.delta)) or r.delta > full_delta * (1 + 1e-12):
                    return refuse(f"realized δ of {what!r} is larger than the reserved δ = {_fmt(full_delta)}")
                allowed = [a for a in (full_eps, *m.odp_epsilons) if abs(r.epsilon - a) <= 1e-12 * max(1.0, a)]
                if not allowed:
                    declared = sorted({full_eps, *m.odp_epsilons})
                    return refuse(f"realized ε = {_fmt(r.epsilon)} of {what!r} is not one of the ODP partition values "
                                  f"declared before it ran ({', '.join(_fmt(a) for a in declared)})")
                # Alg. 1 line 14: ε_r -= E(P_k) of the realised cell; line 15: δ_r -= δ_i, whatever the output
                effective.append(MechanismCost(kind=SETTLED_KIND, sensitivity=0.0, scale=0.0,
                                               epsilon=min(full_eps, max(allowed)), delta=full_delta, rho=None,
                                               label=m.label))
            eff = PrivacyCost(tuple(effective))
            eff_json = cost_to_json(eff)
            if rec.outcome == "settled":
                if rec.realized_json == eff_json:  # the same settlement again: idempotent, nothing written
                    return _SettleResult(settlement=Settlement(rec.id, rec.epsilon, rec.effective_epsilon,
                                                               rec.epsilon - rec.effective_epsilon,
                                                               rec.effective_delta, replayed=True))
                return refuse(f"charge #{rec.id} is already settled at realised ε = {_fmt(rec.effective_epsilon)}; "
                              f"a charge settles once")
            if rec.outcome not in ("reserved", "executed"):
                return refuse(f"charge #{rec.id} is {rec.outcome}; only a reserved or executed charge settles "
                              f"(the output cell of a failed execution is unknown: it stays at its worst case)")
            rows = txn.charges(rec.analyst, rec.dataset, rec.generation)
            check_totals(self.path, row, rows)
            e_eps, e_dlt, _ = cost_numbers(eff)
            now = time.time()
            new = replace(rec, outcome="settled", realized_json=eff_json, effective_epsilon=e_eps,
                          effective_delta=e_dlt, effective_rho=None, updated_at=now)
            txn.update_charge(new)
            rows = [new if c.id == rec.id else c for c in rows]
            s_eps, s_dlt, s_rho, n = totals(rows)
            row = replace(row, spent_epsilon=s_eps, spent_delta=s_dlt, spent_rho=s_rho, n_charges=n, updated_at=now)
            txn.put_budget(row)
            incremental.save(txn, row, incremental.rebuild(self.path, row, rows))
            txn.add_event("settle", rec.analyst, rec.dataset, rec.id, {
                "accountant": row.accountant, "reserved_epsilon": rec.epsilon, "realized_epsilon": e_eps,
                "refund_epsilon": rec.epsilon - e_eps, "delta_kept": e_dlt, "total_epsilon": s_eps,
                "rule": "odp_privacy_accounting.md Alg. 1 lines 14-15 (Alg. 6 line 12)"})
            return _SettleResult(settlement=Settlement(rec.id, rec.epsilon, e_eps, rec.epsilon - e_eps, e_dlt))

        result = self.store.transaction(fn)
        if result.error is not None:
            raise result.error
        assert result.settlement is not None
        return result.settlement

    # -- administration ---------------------------------------------------------------------
    def reset(self, analyst: str, dataset: str, *, confirm: bool = False) -> None:
        """Start a new generation of the budget: the spent amount goes back to zero. The old charges
        stay in the history. Refused unless confirm=True; both the refusal and the reset are recorded."""
        analyst = check_name(analyst, "analyst")
        dataset = check_name(dataset, "dataset")
        if confirm is not True:
            self.store.transaction(lambda txn: txn.add_event("reset_refused", analyst, dataset, None,
                                                             {"reason": "confirm=True not given"}))
            raise InvalidParameter("reset forgets the privacy already spent; it needs an explicit confirmation "
                                   "(confirm=True, or --yes-i-know on the command line)")

        def fn(txn: LedgerTxn) -> None:
            row, st = self._current(txn, analyst, dataset)
            now = time.time()
            txn.put_budget(replace(row, generation=row.generation + 1, spent_epsilon=0.0, spent_delta=0.0, spent_rho=0.0,
                                   n_charges=0, updated_at=now))
            txn.add_event("budget_reset", analyst, dataset, None, {
                "confirm": True, "previous_generation": row.generation, "charges_forgotten": st.n,
                "spent_epsilon_forgotten": row.spent_epsilon, "spent_delta_forgotten": row.spent_delta})
        self.store.transaction(fn)

    # -- reading ----------------------------------------------------------------------------
    def history(self, analyst: str | None = None, dataset: str | None = None) -> list[ChargeRecord]:
        return self.store.read(lambda txn: txn.charges(analyst, dataset))

    def events(self, analyst: str | None = None, dataset: str | None = None, kind: str | None = None) -> list[Event]:
        return self.store.read(lambda txn: txn.events(analyst, dataset, kind))


