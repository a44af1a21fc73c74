"""Accountants: the composition theorems that decide whether one more query fits a budget.

An accountant is a stateless object. Given a `Budget`, the sequence of already accepted query costs
and the cost of a new query, `decide` answers "accept" or "reject" and reports what is spent and
what remains in the accountant's own currency (ε, δ, ρ, number of queries). The ledger
(`dpch/ledger/core.py`) calls it inside the transaction that records the charge, so the decision and the
charge are one atomic step.

Every accountant here is a *privacy filter* in the sense of Rogers, Roth, Ullman & Vadhan 2016
("Privacy Odometers and Filters: Pay-as-you-Go Composition"): a stopping rule evaluated on the
privacy parameters of the queries so far, which may themselves be chosen adaptively. Where the
underlying theorem needs the parameters fixed in advance (advanced composition of Dwork & Roth
Thm 3.20, the optimal composition of Kairouz, Oh & Viswanath 2015), the accountant makes them fixed:
the budget declares the number of queries k and the per-query (ε0, δ0), and every query is checked
against the declaration. Rejections depend only on public parameters, never on data, so they do not
leak (the paper, Lemma 2).

| name | rule | source |
|---|---|---|
| `pure` | Σ_j S(f_j)/p_j ≤ ε (Laplace only) | `dpch_paper.md` Thm 3 |
| `basic` | Σ ε_j ≤ ε and Σ δ_j ≤ δ | Dwork & Roth Thm 3.16; filter form: the paper's Thm 3 proof, Rogers et al. 2016, and ODP paper Alg. 1 / Thm 7 |
| `advanced` | filter: ½Σε_j² + √(2 ln(1/δ') Σε_j²) ≤ ε, Σδ_j ≤ δ''; or declared k, ε0, δ0 with Dwork & Roth Thm 3.20 | Whitehouse, Ramdas, Rogers & Wu 2023 (ICML), advanced-composition filter; Dwork & Roth Thm 3.20 |
| `optimal` | declared k, ε0, δ0: exact δ of the k-fold composition (hockey-stick of k-fold randomized response) | Kairouz, Oh & Viswanath 2015 Thm 3.3 ("advanced composition 2", `dpsql_algorithms.md`) |
| `adaptive` | "self-adaptive selection": the minimum of the bounds that are each valid for the sequence | `dpsql_algorithms.md`; Kairouz et al. Thm 3.4; soundness argument below |
| `paper_gaussian` | n ≤ N, S(f_i)/σ_i ≤ k, Σ S(f_j)²/σ_j² + γ ≤ ε | `dpch_paper.md` Thm 5, Cor 2 |
| `zcdp` | Σ ρ_j ≤ ρ_B, ρ_B the largest ρ whose (ε, δ) conversion fits | Bun & Steinke 2016 Prop 1.3/1.4/1.6, Lemma 2.3; Canonne, Kamath & Steinke 2020 Prop 12; filter: Feldman & Zrnic 2021 (Rényi filter), Whitehouse et al. 2023 |

Floating point: comparisons against a limit allow a slack of `REL_TOL` × max(1, limit) so that, for
example, three queries of ε = 0.1 fit a budget of 0.3 although 0.1 + 0.1 + 0.1 > 0.3 in binary.
The overspend this permits is at most 1e-12 · max(1, ε): far below any meaningful privacy loss.
"""
from .budget import (Budget, CostNotSupported, Decision, MAX_DECLARED_QUERIES, REL_TOL, SETTLED_KIND, SPARSE_VECTOR_KIND, Spent, _fmt, _le)  # noqa: F401
from .bounds import (_cks_objective, advanced_filter_epsilon, dr_advanced_epsilon, gaussian_paper_k, homogeneous_bounds, kov_34_epsilons, kov_delta, kov_epsilon, zcdp_budget, zcdp_to_dp, zcdp_to_dp_bun_steinke)  # noqa: F401
from .costs import (_all_mechanisms, _check_mechanism, _finite_pos, _ratio, _require, dp_params, pure_epsilon, query_dp, zcdp_rho)  # noqa: F401
from .accountants import (Accountant, AdaptiveAccountant, AdvancedAccountant, BasicAccountant, OptimalAccountant, PaperGaussianAccountant, PureAccountant, ZcdpAccountant, _DeclaredMixin, _SimpleCompositionFilter)  # noqa: F401
from .odp import (OdpAccountant, odp_filter, odp_realized, odp_round)  # noqa: F401
from .registry import (ACCOUNTANTS, budget_fields, get_accountant, make_budget)  # noqa: F401
from .state import ComposedState, exact_sum  # noqa: F401
