"""The accountants of simple, advanced, optimal, adaptive, Gaussian-paper and zCDP composition."""
from __future__ import annotations

import math
from dataclasses import replace
from fractions import Fraction
from typing import Callable, Sequence

from ..cost import PrivacyCost
from .budget import Budget, CostNotSupported, Decision, MAX_DECLARED_QUERIES, Spent, _fmt, _le
from .bounds import advanced_filter_epsilon, dr_advanced_epsilon, gaussian_paper_k, homogeneous_bounds, kov_delta, kov_epsilon, zcdp_budget, zcdp_to_dp
from .state import ComposedState
from .costs import _check_mechanism, _finite_pos, _ratio, _require, dp_params, pure_epsilon, query_dp, zcdp_rho

class Accountant:
    """Base class. Subclasses implement `validate`, `spent`, `limits` and `violation`."""

    name = ""
    source = ""
    supports_settlement = False  # a posteriori (ODP) refunds: only under simple composition
    # the names of the accountants that support settlement, for the message below: set by
    # dpch.accounting.registry, which imports the accountants (never the reverse)
    settlement_names: tuple[str, ...] = ()

    # -- configuration ----------------------------------------------------------------------
    def validate(self, budget: Budget) -> Budget:
        """Check the budget's parameters against the theorem and return it with defaults filled
        in. Raises InvalidParameter."""
        _finite_pos(budget.epsilon, "epsilon")
        _require(isinstance(budget.delta, (int, float)) and 0 <= budget.delta < 1, f"delta must be in [0, 1) (got {budget.delta!r})")
        if budget.max_queries is not None:
            _require(isinstance(budget.max_queries, int) and not isinstance(budget.max_queries, bool)
                     and budget.max_queries >= 1, "max_queries must be an integer >= 1")
        _require(isinstance(budget.per_query_delta, (int, float)) and 0 <= budget.per_query_delta < 1,
                 "per_query_delta must be in [0, 1)")
        if budget.per_query_epsilon is not None:
            _finite_pos(budget.per_query_epsilon, "per_query_epsilon")
        if budget.gamma is not None:
            _finite_pos(budget.gamma, "gamma")
        if budget.mechanism_delta is not None:
            _require(isinstance(budget.mechanism_delta, (int, float)) and 0 <= budget.mechanism_delta <= budget.delta,
                     "mechanism_delta must be in [0, delta]")
        return self._validate(replace(budget, accountant=self.name))

    def _validate(self, budget: Budget) -> Budget:
        return budget

    def _no_declared(self, budget: Budget) -> None:
        _require(budget.per_query_epsilon is None and budget.per_query_delta == 0,
                 f"per_query_epsilon/per_query_delta declare a fixed-k composition; the {self.name} accountant does not use them "
                 f"(use advanced, optimal or adaptive)")

    def _no_param(self, budget: Budget, *names: str) -> None:
        for n in names:
            _require(getattr(budget, n) is None, f"the {self.name} accountant does not use {n}")

    # -- accounting -------------------------------------------------------------------------
    def sum_terms(self, budget: Budget, cost: PrivacyCost) -> dict[str, list[float]]:
        """The terms one query adds to each of this accountant's running sums (the composition is
        a function of these sums and the number of queries only). Raises CostNotSupported."""
        raise NotImplementedError

    def fold(self, budget: Budget, costs: Sequence[PrivacyCost]) -> ComposedState:
        """The composed state of a whole sequence (exact sums). Raises CostNotSupported."""
        return ComposedState.compose(self.sum_terms(budget, c) for c in costs)

    def spent_from(self, budget: Budget, state: ComposedState) -> Spent:
        """What a composed state spends, in this accountant's currency."""
        raise NotImplementedError

    def violation_from(self, budget: Budget, state: ComposedState, last: PrivacyCost, spent: Spent) -> str | None:
        """Why the composed sequence (`last` being its newest query) breaks the theorem, or None."""
        raise NotImplementedError

    def spent(self, budget: Budget, costs: Sequence[PrivacyCost]) -> Spent:
        """What the sequence spends, in this accountant's currency. Raises CostNotSupported."""
        return self.spent_from(budget, self.fold(budget, costs))

    def limits(self, budget: Budget) -> Spent:
        """The maximum of each currency (queries=None: unlimited)."""
        raise NotImplementedError

    def violation(self, budget: Budget, costs: Sequence[PrivacyCost], spent: Spent) -> str | None:
        """Why the sequence (the last element being the new query) breaks the theorem, or None."""
        return self.violation_from(budget, self.fold(budget, costs), costs[-1], spent)

    def _count_violation(self, budget: Budget, n: int) -> str | None:
        if budget.max_queries is not None and n > budget.max_queries:
            if budget.declared:
                return f"the budget declares k = {budget.max_queries} queries and all are used"
            return f"the budget allows at most {budget.max_queries} queries"
        return None

    def remaining(self, budget: Budget, spent: Spent) -> Spent:
        lim = self.limits(budget)
        rho = None
        if lim.rho is not None:
            rho = max(0.0, lim.rho - (spent.rho or 0.0))
        queries = None if lim.queries is None else max(0, lim.queries - (spent.queries or 0))
        return Spent(epsilon=max(0.0, lim.epsilon - spent.epsilon), delta=max(0.0, lim.delta - spent.delta),
                     rho=rho, queries=queries)

    def decide(self, budget: Budget, accepted: Sequence[PrivacyCost], new: PrivacyCost) -> Decision:
        """Accept `new` after `accepted` iff the accountant's theorem allows the whole sequence."""
        return self.decide_from(budget, self.fold(budget, accepted), new)[0]

    def decide_from(self, budget: Budget, state: ComposedState,
                    new: PrivacyCost) -> tuple[Decision, ComposedState | None]:
        """`decide` from the composed state of the accepted sequence (O(1) in its length); also
        returns the state after `new` when it is accepted (None otherwise)."""
        before = self.spent_from(budget, state)
        try:
            after_state = state.extend(self.sum_terms(budget, new))
        except CostNotSupported as exc:
            return Decision(False, f"the {self.name} accountant cannot charge this query: {exc.args[0]}",
                            before, self.remaining(budget, before), None), None
        after = self.spent_from(budget, after_state)
        needs = Spent(epsilon=max(0.0, after.epsilon - before.epsilon), delta=max(0.0, after.delta - before.delta),
                      rho=None if after.rho is None else max(0.0, after.rho - (before.rho or 0.0)), queries=1)
        reason = self._count_violation(budget, after_state.n) or self.violation_from(budget, after_state, new, after)
        if reason is not None:
            return Decision(False, reason, before, self.remaining(budget, before), needs), None
        return Decision(True, "accepted", after, self.remaining(budget, after), needs), after_state

    def per_query_violation(self, budget: Budget, cost: PrivacyCost) -> str | None:
        """A condition on a single query (declared ε0/δ0, the paper's per-query ratio k), if any."""
        return None

    def check_history(self, budget: Budget, costs: Sequence[PrivacyCost],
                      reserved: Sequence[PrivacyCost] | None = None) -> str | None:
        """None if the recorded sequence is within the budget (used to verify a ledger on open and
        to change a budget). `costs` are the effective costs (after settlement), `reserved` (same
        length, optional) what each charge reserved before it ran. Without settlements the
        aggregate conditions are monotone in the prefix, so checking the whole sequence covers every
        prefix; per-query conditions are checked for each query. With settlements, see
        `settlement_violation`."""
        try:
            s = self.spent(budget, costs)
            for c in costs:
                problem = self.per_query_violation(budget, c)
                if problem is not None:
                    return problem
        except CostNotSupported as exc:
            return exc.args[0]
        if not costs:
            return None
        problem = self._count_violation(budget, len(costs)) or self.violation(budget, costs, s)
        if problem is None and reserved is not None:
            problem = self.settlement_violation(budget, costs, reserved)
        return problem

    def settlement_violation(self, budget: Budget, costs: Sequence[PrivacyCost],
                             reserved: Sequence[PrivacyCost]) -> str | None:
        """Charges settled a posteriori compose only under simple composition (odp_privacy_accounting.md
        Thm 7; an ODP advanced composition is left open in its Appendix A): an accountant without
        settlement refuses a history that holds any."""
        if len(reserved) != len(costs):
            return "the reserved and effective histories differ in length"
        settled = sum(1 for c, r in zip(costs, reserved) if c is not r and c != r)
        if settled:
            return (f"{settled} charge(s) were settled a posteriori (output DP); realised ε composes only under "
                    f"simple composition (odp_privacy_accounting.md Thm 7): accountants "
                    f"{', '.join(self.settlement_names)}")
        return None


class _SimpleCompositionFilter:
    """Shared by the accountants that allow a posteriori settlement (`pure`, `basic`, `odp`): their
    filter is linear, Σ_j x_j ≤ ε and Σ_j y_j ≤ δ over per-step terms (`_terms`), which is the ODP
    filter of odp_privacy_accounting.md Def. 19 (Appendix A), valid by Thm 7.

    With settlements the total alone no longer covers every step: Alg. 1 line 9 (equivalently
    Alg. 6 line 7) must have held for each charge i when it was made, with the charges before it at
    their realised values and charge i at its worst case: Σ_{j<i} ε^j + sup E_i ≤ ε_t. Checked here on
    the final history, where ε^j is the realised value of a settled charge and the reservation of an
    unsettled one. Settlements only lower earlier terms, so a history whose every charge passed this
    test when it was made passes it later too; a tampered or wrongly changed budget does not. Sums
    are exact (Fraction) and rounded once, like math.fsum at charge time."""

    def _terms(self, cost: PrivacyCost) -> tuple[list[float], list[float]]:
        raise NotImplementedError

    def settlement_violation(self, budget: Budget, costs: Sequence[PrivacyCost],
                             reserved: Sequence[PrivacyCost]) -> str | None:
        if len(reserved) != len(costs):
            return "the reserved and effective histories differ in length"
        if all(c is r or c == r for c, r in zip(costs, reserved)):
            return None  # nothing settled: the total (already checked) bounds every prefix
        eps_run, del_run = Fraction(0), Fraction(0)
        try:
            for i, (eff, res) in enumerate(zip(costs, reserved), start=1):
                re_, rd_ = self._terms(res)
                need_e = float(eps_run + sum(map(Fraction, re_), Fraction(0)))
                need_d = float(del_run + sum(map(Fraction, rd_), Fraction(0)))
                if not _le(need_e, budget.epsilon):
                    return (f"charge {i} of the generation was accepted with Σ realised ε before it + its worst case = "
                            f"{_fmt(need_e)} > ε = {_fmt(budget.epsilon)} (odp_privacy_accounting.md Alg. 1 line 9)")
                if not _le(need_d, budget.delta):
                    return (f"charge {i} of the generation was accepted with Σδ = {_fmt(need_d)} > δ = "
                            f"{_fmt(budget.delta)} (odp_privacy_accounting.md Alg. 1 line 10)")
                ee, ed = self._terms(eff)
                eps_run += sum(map(Fraction, ee), Fraction(0))
                del_run += sum(map(Fraction, ed), Fraction(0))
        except CostNotSupported as exc:
            return exc.args[0]
        return None


class PureAccountant(_SimpleCompositionFilter, Accountant):
    """The paper, Thm 3 (Laplace filter): answer query i only if Σ_{j≤i} S(f_j)/p_j ≤ ε. Valid for
    adaptively chosen f_j and p_j. Only pure ε-DP mechanisms (Laplace; δ = 0 thresholds)."""

    name = "pure"
    source = "dpch_paper.md Thm 3 (composition for Laplacian noise, with rejection)"
    supports_settlement = True  # ODP paper Alg. 1 with δ_t = 0

    def _validate(self, budget):
        _require(budget.delta == 0, "the pure accountant keeps (ε, 0)-DP: delta must be 0")
        self._no_declared(budget)
        self._no_param(budget, "gamma", "mechanism_delta")
        return budget

    def _terms(self, cost):
        return [pure_epsilon(m) for m in cost.mechanisms], []

    def sum_terms(self, budget, cost):
        return {"eps": [pure_epsilon(m) for m in cost.mechanisms]}

    def spent_from(self, budget, state):
        return Spent(epsilon=state.value("eps"), queries=state.n)

    def limits(self, budget):
        return Spent(epsilon=budget.epsilon, delta=0.0, queries=budget.max_queries)

    def violation_from(self, budget, state, last, spent):
        if not _le(spent.epsilon, budget.epsilon):
            return f"Σ S(f)/p would be {_fmt(spent.epsilon)} > ε = {_fmt(budget.epsilon)} (paper Thm 3)"
        return None


class BasicAccountant(_SimpleCompositionFilter, Accountant):
    """(ε, δ) basic composition, Dwork & Roth Thm 3.16: Σε_j ≤ ε and Σδ_j ≤ δ. As a filter it is
    valid for adaptively chosen (ε_j, δ_j) (the paper's Thm 3 proof for δ = 0; for δ > 0 it is the
    ODP paper's Alg. 1 with trivial partitions, Thm 7, and Rogers et al. 2016)."""

    name = "basic"
    source = "Dwork & Roth Thm 3.16; filter form: odp_privacy_accounting.md Alg. 1 / Thm 7"
    supports_settlement = True

    def _validate(self, budget):
        self._no_declared(budget)
        self._no_param(budget, "gamma", "mechanism_delta")
        return budget

    def _terms(self, cost):
        e, d = query_dp(cost)
        return [e], [d]

    def sum_terms(self, budget, cost):
        e, d = query_dp(cost)
        return {"eps": [e], "delta": [d]}

    def spent_from(self, budget, state):
        return Spent(epsilon=state.value("eps"), delta=state.value("delta"), queries=state.n)

    def limits(self, budget):
        return Spent(epsilon=budget.epsilon, delta=budget.delta, queries=budget.max_queries)

    def violation_from(self, budget, state, last, spent):
        if not _le(spent.epsilon, budget.epsilon):
            return f"Σε would be {_fmt(spent.epsilon)} > ε = {_fmt(budget.epsilon)} (basic composition)"
        if not _le(spent.delta, budget.delta):
            return f"Σδ would be {_fmt(spent.delta)} > δ = {_fmt(budget.delta)} (basic composition)"
        return None


class _DeclaredMixin:
    """Declared-k mode: the budget fixes k = max_queries and the per-query (ε0, δ0); a query is
    accepted only if its own (ε_q, δ_q) (basic composition of its mechanisms) is at most (ε0, δ0) and
    fewer than k queries were accepted. An (ε_q, δ_q)-DP query with ε_q ≤ ε0, δ_q ≤ δ0 is also
    (ε0, δ0)-DP, so the k-fold composition theorems with fixed parameters apply to any sequence the
    analyst chooses adaptively."""

    def _validate_declared(self, budget: Budget) -> None:
        _require(budget.max_queries is not None and budget.per_query_epsilon is not None,
                 f"the {self.name} accountant in declared mode needs max_queries (k) and per_query_epsilon (ε0)")
        _require(budget.max_queries <= MAX_DECLARED_QUERIES, f"max_queries must be <= {MAX_DECLARED_QUERIES}")

    @staticmethod
    def _declared_terms(cost: PrivacyCost) -> dict[str, list[float]]:
        query_dp(cost)  # raises CostNotSupported for mechanisms without an (ε, δ) guarantee
        return {}

    @staticmethod
    def _declared_spent(budget: Budget, n: int, bound: Callable[[int], float]) -> Spent:
        return Spent(epsilon=bound(n) if n else 0.0, delta=budget.delta if n else 0.0, queries=n)

    def per_query_violation(self, budget: Budget, cost: PrivacyCost) -> str | None:
        if not budget.declared:
            return None
        return self._declared_query_violation(budget, cost)

    def _declared_violation(self, budget: Budget, n: int, last: PrivacyCost) -> str | None:
        if n > budget.max_queries:
            return f"the budget declares k = {budget.max_queries} queries and all are used"
        return self._declared_query_violation(budget, last)

    def _declared_query_violation(self, budget: Budget, cost: PrivacyCost) -> str | None:
        e, d = query_dp(cost)
        if not _le(e, budget.per_query_epsilon):
            return f"the query costs ε = {_fmt(e)} > the declared per-query ε0 = {_fmt(budget.per_query_epsilon)}"
        if not _le(d, budget.per_query_delta):
            return f"the query costs δ = {_fmt(d)} > the declared per-query δ0 = {_fmt(budget.per_query_delta)}"
        return None


class AdvancedAccountant(_DeclaredMixin, Accountant):
    """Advanced composition, in one of two forms that are sound for adaptively chosen queries.

    Filter mode (default): Whitehouse, Ramdas, Rogers & Wu 2023, "Fully-Adaptive Composition in
    Differential Privacy" (ICML), advanced-composition filter: with δ = δ' + δ'', continue while
    ½Σε_j² + √(2 ln(1/δ') Σε_j²) ≤ ε and Σδ_j ≤ δ''. Every mechanism of every query is one step
    (releasing several at once is a special case of releasing them one after another). This improves
    on the filter of Rogers et al. 2016, Thm 5.1, which has larger constants. For pure ε_j-DP steps
    the argument is: the privacy loss increments ℓ_j lie in [-ε_j, ε_j] with conditional mean
    ≤ ε_j tanh(ε_j/2) ≤ ε_j²/2, so exp(λ(L_n - Σμ_j) - λ²Σε_j²/2) is a non-negative supermartingale
    (Hoeffding's lemma) and Ville's inequality bounds L_n uniformly over n by the expression above,
    with λ fixed by the budget.

    Declared mode (per_query_epsilon set, with max_queries = k): Dwork & Roth Thm 3.20, k queries each
    (ε0, δ0)-DP are (√(2k ln(1/δ'))ε0 + kε0(e^ε0 - 1), kδ0 + δ')-DP with δ' = δ - kδ0; the budget is
    refused when this exceeds ε.
    """

    name = "advanced"
    source = "Whitehouse, Ramdas, Rogers & Wu 2023 (advanced-composition filter); Dwork & Roth Thm 3.20 (declared k)"

    def _validate(self, budget):
        self._no_param(budget, "gamma")
        _require(budget.delta > 0, "the advanced accountant needs δ > 0")
        if budget.declared:
            self._validate_declared(budget)
            _require(budget.mechanism_delta is None, "mechanism_delta is for filter mode; declared mode uses per_query_delta")
            dprime = budget.delta - budget.max_queries * budget.per_query_delta
            _require(dprime > 0, f"k·δ0 = {_fmt(budget.max_queries * budget.per_query_delta)} leaves no δ' of δ = {_fmt(budget.delta)}")
            eps = dr_advanced_epsilon(budget.max_queries, budget.per_query_epsilon, dprime)
            _require(_le(eps, budget.epsilon),
                     f"k = {budget.max_queries} queries of ε0 = {_fmt(budget.per_query_epsilon)} compose to "
                     f"ε = {_fmt(eps)} > {_fmt(budget.epsilon)} under Dwork & Roth Thm 3.20")
            return budget
        _require(budget.per_query_delta == 0, "per_query_delta needs per_query_epsilon (declared mode)")
        md = budget.delta / 2.0 if budget.mechanism_delta is None else budget.mechanism_delta
        _require(md < budget.delta, "mechanism_delta must leave δ' = δ - mechanism_delta > 0")
        return replace(budget, mechanism_delta=md)

    def _dprime(self, budget):
        if budget.declared:
            return budget.delta - budget.max_queries * budget.per_query_delta
        return budget.delta - budget.mechanism_delta

    def sum_terms(self, budget, cost):
        if budget.declared:
            return self._declared_terms(cost)
        sq, dels = [], []
        for m in cost.mechanisms:
            e, d = dp_params(m)
            sq.append(e * e)
            dels.append(d)
        return {"sq": sq, "delta": dels}

    def spent_from(self, budget, state):
        if not state.n:
            return Spent()
        dprime = self._dprime(budget)
        if budget.declared:
            return self._declared_spent(budget, state.n, lambda n: dr_advanced_epsilon(n, budget.per_query_epsilon, dprime))
        # δ spent: the tail δ' (committed by the first query) plus the mechanisms' own δ_j
        return Spent(epsilon=advanced_filter_epsilon(state.value("sq"), dprime), delta=dprime + state.value("delta"),
                     queries=state.n)

    def limits(self, budget):
        return Spent(epsilon=budget.epsilon, delta=budget.delta, queries=budget.max_queries)

    def violation_from(self, budget, state, last, spent):
        if budget.declared:
            return self._declared_violation(budget, state.n, last)
        if not _le(spent.epsilon, budget.epsilon):
            return (f"the advanced-composition filter bound would be {_fmt(spent.epsilon)} > ε = {_fmt(budget.epsilon)} "
                    f"(Whitehouse et al. 2023)")
        dels = state.value("delta")
        if not _le(dels, budget.mechanism_delta):
            return f"the mechanisms' Σδ would be {_fmt(dels)} > δ'' = {_fmt(budget.mechanism_delta)} (mechanism_delta)"
        return None


class OptimalAccountant(_DeclaredMixin, Accountant):
    """Optimal composition of k homogeneous (ε0, δ0)-DP mechanisms, Kairouz, Oh & Viswanath 2015
    Thm 3.3 ("advanced composition 2" in dpsql_algorithms.md). Needs the declared k and ε0 (and δ0,
    default 0): the theorem holds for k mechanisms with the same guarantee fixed in advance; the
    accountant enforces both. The budget is refused when δ(ε) of the k-fold composition exceeds δ."""

    name = "optimal"
    source = "Kairouz, Oh & Viswanath 2015 Thm 3.3 (dpsql_algorithms.md, advanced composition 2)"

    def _validate(self, budget):
        self._no_param(budget, "gamma", "mechanism_delta")
        _require(budget.declared, "the optimal accountant needs max_queries (k) and per_query_epsilon (ε0)")
        self._validate_declared(budget)
        d = kov_delta(budget.max_queries, float(budget.per_query_epsilon), float(budget.per_query_delta), float(budget.epsilon))
        _require(_le(d, budget.delta),
                 f"k = {budget.max_queries} queries of (ε0, δ0) = ({_fmt(budget.per_query_epsilon)}, {_fmt(budget.per_query_delta)}) "
                 f"are (ε = {_fmt(budget.epsilon)}, δ = {_fmt(d)})-DP at best (Kairouz et al. Thm 3.3), more than δ = {_fmt(budget.delta)}")
        return budget

    def _eps(self, budget, n):
        e = kov_epsilon(n, float(budget.per_query_epsilon), float(budget.per_query_delta), float(budget.delta))
        return n * budget.per_query_epsilon if e is None else e

    def sum_terms(self, budget, cost):
        return self._declared_terms(cost)

    def spent_from(self, budget, state):
        return self._declared_spent(budget, state.n, lambda n: self._eps(budget, n)) if state.n else Spent()

    def limits(self, budget):
        return Spent(epsilon=budget.epsilon, delta=budget.delta, queries=budget.max_queries)

    def violation_from(self, budget, state, last, spent):
        return self._declared_violation(budget, state.n, last)


class AdaptiveAccountant(_DeclaredMixin, Accountant):
    """"Self-adaptive selection" (dpsql_algorithms.md): use the smallest of the composition bounds.

    Taking a minimum is sound only when every bound in it is valid for the sequence actually run.

    Declared mode (max_queries = k and per_query_epsilon = ε0, optional per_query_delta = δ0): the
    homogeneous bounds basic, Dwork & Roth Thm 3.20, Kairouz et al. Thm 3.4 (both forms) and Thm 3.3
    all hold for k-fold adaptive composition of (ε0, δ0)-DP mechanisms, so the smallest of them at the
    budget's δ is a valid ε for that composition. The minimum is taken once, from public parameters,
    when the budget is set; queries are then enforced as in the optimal accountant.

    Filter mode (no declaration): the heterogeneous formula of dpsql_algorithms.md (Kairouz et al.
    Thm 3.5) assumes ε_i fixed in advance and is NOT valid for adaptively chosen ε_i, so it is not
    used. Instead the accountant continues while Σε_j ≤ ε (basic filter) OR
    ½Σε_j² + √(2 ln(1/δ) Σε_j²) ≤ ε (advanced filter), for pure ε_j-DP mechanisms only. Soundness of
    this OR: the advanced filter's bound comes from Ville's inequality, i.e. it holds for all n at once
    outside an event of probability δ, so at the stopping time either Σε² is within the advanced limit
    (loss ≤ ε outside that event) or Σε ≤ ε (loss ≤ ε always). Mechanisms with δ_j > 0 are rejected
    in filter mode.
    """

    name = "adaptive"
    source = "dpsql_algorithms.md self-adaptive selection; Kairouz et al. Thm 3.3/3.4; Dwork & Roth Thm 3.16/3.20; Whitehouse et al. 2023"

    def _validate(self, budget):
        self._no_param(budget, "gamma", "mechanism_delta")
        if budget.declared:
            self._validate_declared(budget)
            bounds = homogeneous_bounds(budget.max_queries, float(budget.per_query_epsilon), float(budget.per_query_delta),
                                        float(budget.delta))
            _require(bounds, f"no composition bound reaches δ = {_fmt(budget.delta)} with k·δ0 = "
                             f"{_fmt(budget.max_queries * budget.per_query_delta)}")
            best = min(bounds.values())
            _require(_le(best, budget.epsilon),
                     f"k = {budget.max_queries} queries of ε0 = {_fmt(budget.per_query_epsilon)} compose to at best "
                     f"ε = {_fmt(best)} > {_fmt(budget.epsilon)} (self-adaptive selection)")
            return budget
        _require(budget.per_query_delta == 0, "per_query_delta needs per_query_epsilon (declared mode)")
        return budget

    def best_bound(self, budget: Budget, n: int | None = None) -> tuple[str, float]:
        """(name, ε) of the smallest valid bound for n (default k) declared queries."""
        k = budget.max_queries if n is None else n
        bounds = homogeneous_bounds(k, float(budget.per_query_epsilon), float(budget.per_query_delta), float(budget.delta))
        name = min(bounds, key=bounds.__getitem__)
        return name, bounds[name]

    def sum_terms(self, budget, cost):
        if budget.declared:
            return self._declared_terms(cost)
        eps = [pure_epsilon(m) for m in cost.mechanisms]
        return {"eps": eps, "sq": [e * e for e in eps]}

    def spent_from(self, budget, state):
        if not state.n:
            return Spent()
        if budget.declared:
            return self._declared_spent(budget, state.n, lambda n: self.best_bound(budget, n)[1])
        basic = state.value("eps")
        adv = advanced_filter_epsilon(state.value("sq"), budget.delta) if budget.delta > 0 else math.inf
        return Spent(epsilon=min(basic, adv), delta=budget.delta if adv < basic else 0.0, queries=state.n)

    def limits(self, budget):
        return Spent(epsilon=budget.epsilon, delta=budget.delta, queries=budget.max_queries)

    def violation_from(self, budget, state, last, spent):
        if budget.declared:
            return self._declared_violation(budget, state.n, last)
        if not _le(spent.epsilon, budget.epsilon):
            return (f"both the basic (Σε) and the advanced filter bound exceed ε = {_fmt(budget.epsilon)} "
                    f"(smallest: {_fmt(spent.epsilon)})")
        return None


class PaperGaussianAccountant(Accountant):
    """The paper's Gaussian filter, Thm 5 with the parameters of Cor 2. At most N = max_queries
    queries; with γ (default ε/2, Cor 2) and k = γ / (2√(N ln(1/δ))), query i is rejected if
    S(f_i)/σ_i > k or if Σ_{j≤i} S(f_j)²/σ_j² + γ > ε. The guarantee is (ε, δ)-DP.

    A query with several Gaussian releases is one step of the paper's martingale: its increment
    Σ_m (noise_m Δ_m/σ_m²) is Gaussian with variance Σ_m Δ_m²/σ_m², so the per-query ratio used is
    r_i = √(Σ_m S_m²/σ_m²) (the L2 norm, as for a vector release, the paper's Remark 2), and r_i² enters
    the running sum. Only the one-sided tail of Azuma's inequality (the paper's Thm 4 as proved) is
    needed, which gives exactly δ. Laplace and threshold mechanisms are rejected."""

    name = "paper_gaussian"
    source = "dpch_paper.md Thm 5 and Cor 2 (composition for Gaussian noise, with rejection)"

    def _validate(self, budget):
        self._no_declared(budget)
        self._no_param(budget, "mechanism_delta")
        _require(budget.max_queries is not None, "the paper_gaussian accountant needs max_queries (n of Thm 5)")
        _require(0 < budget.delta < 1, "the paper_gaussian accountant needs 0 < δ < 1")
        gamma = budget.epsilon / 2.0 if budget.gamma is None else budget.gamma
        _require(gamma < budget.epsilon, "gamma must be < epsilon (Thm 5 needs Σ S²/σ² + γ ≤ ε)")
        return replace(budget, gamma=gamma)

    def k(self, budget: Budget) -> float:
        return gaussian_paper_k(budget.gamma, budget.max_queries, budget.delta)

    @staticmethod
    def _ratio_sq(cost: PrivacyCost) -> float:
        parts = []
        for m in cost.mechanisms:
            _check_mechanism(m)
            if m.kind != "gaussian":
                raise CostNotSupported(f"{m.kind} mechanism {m.label!r}: the paper's Thm 5 covers Gaussian noise only")
            r = _ratio(m)
            parts.append(r * r)
        return math.fsum(parts)

    def sum_terms(self, budget, cost):
        return {"ratio_sq": [self._ratio_sq(cost)]}

    def spent_from(self, budget, state):
        if not state.n:
            return Spent()
        return Spent(epsilon=state.value("ratio_sq") + budget.gamma, delta=budget.delta, queries=state.n)

    def limits(self, budget):
        return Spent(epsilon=budget.epsilon, delta=budget.delta, queries=budget.max_queries)

    def per_query_violation(self, budget, cost):
        r = math.sqrt(self._ratio_sq(cost))
        k = self.k(budget)
        if not _le(r, k):
            return f"S(f)/σ = {_fmt(r)} > k = {_fmt(k)} (paper Thm 5 with γ = {_fmt(budget.gamma)}, n = {budget.max_queries})"
        return None

    def violation_from(self, budget, state, last, spent):
        problem = self.per_query_violation(budget, last)
        if problem is not None:
            return problem
        if not _le(spent.epsilon, budget.epsilon):
            return f"Σ S²/σ² + γ would be {_fmt(spent.epsilon)} > ε = {_fmt(budget.epsilon)} (paper Thm 5)"
        return None


class ZcdpAccountant(Accountant):
    """zCDP filter. ρ_j = Δ₂²/(2σ_j²) for a Gaussian (Bun & Steinke Prop 1.6), ε_j²/2 for a pure
    ε_j-DP mechanism (Prop 1.4); ρ composes additively (Lemma 2.3). The filter continues while
    Σρ_j ≤ ρ_B, where ρ_B is the largest ρ whose conversion to (ε, δ') fits the budget, using the
    conversion of Canonne, Kamath & Steinke 2020 Prop 12 (never worse than Bun & Steinke Prop 1.3,
    ε = ρ + 2√(ρ ln(1/δ))). Sound for adaptively chosen ρ_j: at each fixed order α a Rényi filter
    Σ αρ_j ≤ αρ_B is valid (Feldman & Zrnic 2021, "Individual Privacy Accounting via a Rényi Filter"), so the stopped composition is ρ_B-zCDP
    (also Whitehouse et al. 2023, zCDP filter). An (ε_j, δ_j)-DP threshold is δ_j-approximately
    ε_j²/2-zCDP; those need mechanism_delta = δ'' > 0 and Σδ_j ≤ δ'' (approximate zCDP filter,
    Whitehouse et al. 2023), and the conversion then uses δ' = δ - δ''."""

    name = "zcdp"
    source = "Bun & Steinke 2016 Prop 1.3/1.4/1.6, Lemma 2.3; Canonne, Kamath & Steinke 2020 Prop 12; Feldman & Zrnic 2021"

    def _validate(self, budget):
        self._no_declared(budget)
        self._no_param(budget, "gamma")
        _require(0 < budget.delta < 1, "the zcdp accountant needs 0 < δ < 1 (zCDP implies no pure ε-DP)")
        md = 0.0 if budget.mechanism_delta is None else budget.mechanism_delta
        _require(md < budget.delta, "mechanism_delta must leave δ' = δ - mechanism_delta > 0")
        return replace(budget, mechanism_delta=md)

    def rho_budget(self, budget: Budget) -> float:
        return zcdp_budget(float(budget.epsilon), float(budget.delta - budget.mechanism_delta))

    def sum_terms(self, budget, cost):
        rhos, dels = [], []
        for m in cost.mechanisms:
            r, d = zcdp_rho(m)
            rhos.append(r)
            dels.append(d)
        return {"rho": rhos, "delta": dels}

    def spent_from(self, budget, state):
        rho, dels = state.value("rho"), state.value("delta")
        if not state.n:
            return Spent(rho=0.0)
        delta_conv = budget.delta - budget.mechanism_delta
        # ε: the (ε, δ') guarantee of what is spent so far; δ: δ' (committed by the first query) + Σδ_j
        return Spent(epsilon=zcdp_to_dp(rho, delta_conv), delta=delta_conv + dels, rho=rho, queries=state.n)

    def limits(self, budget):
        return Spent(epsilon=budget.epsilon, delta=budget.delta, rho=self.rho_budget(budget), queries=budget.max_queries)

    def violation_from(self, budget, state, last, spent):
        rb = self.rho_budget(budget)
        if not _le(spent.rho, rb):
            return (f"Σρ would be {_fmt(spent.rho)} > ρ budget {_fmt(rb)} (the largest ρ that converts to "
                    f"ε = {_fmt(budget.epsilon)} at δ = {_fmt(budget.delta - budget.mechanism_delta)})")
        dels = state.value("delta")
        if dels > 0 and not _le(dels, budget.mechanism_delta):
            if budget.mechanism_delta == 0:
                return ("the query has an (ε, δ)-DP part with δ > 0; the zcdp budget reserves no δ for mechanisms "
                        "(set mechanism_delta)")
            return f"the mechanisms' Σδ would be {_fmt(dels)} > δ'' = {_fmt(budget.mechanism_delta)} (mechanism_delta)"
        return None
