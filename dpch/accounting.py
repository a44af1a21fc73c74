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
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from fractions import Fraction
from functools import lru_cache
from typing import Callable, Iterable, Sequence

from .cost import MechanismCost, PrivacyCost
from .errors import InvalidParameter

REL_TOL = 1e-12

#: The kind the ledger gives a mechanism after an a posteriori settlement (odp_privacy_accounting.md,
#: Alg. 1 line 14): only its realized ε and its reserved δ remain meaningful.
SETTLED_KIND = "settled"

#: A sparse-vector session (dpch.svt, odp_privacy_accounting.md Alg. 2): pure ε-DP with ε = ε1 + ε2
#: (Lemma 8's sup E), so ε²/2-zCDP (Bun & Steinke Prop 1.4); its ODP cells are settled at exit.
SPARSE_VECTOR_KIND = "sparse_vector"

MAX_DECLARED_QUERIES = 100_000


def _le(value: float, limit: float) -> bool:
    """value ≤ limit up to the documented floating-point slack."""
    return value <= limit + REL_TOL * max(1.0, abs(limit))


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return f"{x:.6g}"


# --------------------------------------------------------------------------------------------
# Budgets and results
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Budget:
    """A privacy budget for one (analyst, dataset), interpreted by the named accountant.

    - `epsilon`, `delta`: the total (ε, δ)-DP guarantee the accountant must keep.
    - `max_queries`: N. Required by `optimal`, `paper_gaussian` and the declared mode of
      `advanced`/`adaptive`; for the other accountants an additional cap on the number of queries.
    - `per_query_epsilon`, `per_query_delta`: the declared (ε0, δ0) of every query (declared mode).
    - `gamma`: γ of the paper's Thm 5 (`paper_gaussian`); default ε/2 as in Cor 2.
    - `mechanism_delta`: the part δ'' of δ reserved for the mechanisms' own δ_j (`advanced` filter,
      default δ/2; `zcdp`, default 0: approximate-zCDP mechanisms are then rejected). The rest,
      δ' = δ - δ'', bounds the tail of the privacy loss.
    """

    epsilon: float
    delta: float = 0.0
    accountant: str = "basic"
    max_queries: int | None = None
    per_query_epsilon: float | None = None
    per_query_delta: float = 0.0
    gamma: float | None = None
    mechanism_delta: float | None = None
    analyst: str = ""
    dataset: str = ""

    PARAM_NAMES = ("max_queries", "per_query_epsilon", "per_query_delta", "gamma", "mechanism_delta")

    def params(self) -> dict:
        """The accountant parameters (everything but ε, δ, accountant and the identity)."""
        return {name: getattr(self, name) for name in self.PARAM_NAMES}

    @property
    def declared(self) -> bool:
        return self.per_query_epsilon is not None


@dataclass(frozen=True)
class Spent:
    """An amount of privacy in an accountant's currency. Fields an accountant does not use are
    0 / None. `queries` counts queries (spent) or the queries still allowed (remaining; None when
    the accountant puts no limit on their number)."""

    epsilon: float = 0.0
    delta: float = 0.0
    rho: float | None = None
    queries: int | None = 0

    def describe(self) -> str:
        parts = [f"ε={_fmt(self.epsilon)}", f"δ={_fmt(self.delta)}"]
        if self.rho is not None:
            parts.append(f"ρ={_fmt(self.rho)}")
        if self.queries is not None:
            parts.append(f"queries={self.queries}")
        return ", ".join(parts)


@dataclass(frozen=True)
class Decision:
    ok: bool
    reason: str
    spent_after: Spent  # what is spent if the query is accepted (unchanged state if rejected)
    remaining: Spent  # what remains after the decision
    needs: Spent | None = None  # the increase the new query asks for (None if not computable)


class CostNotSupported(Exception):
    """Internal: the accountant's theorem does not cover this mechanism (reason in args[0])."""


# --------------------------------------------------------------------------------------------
# Closed forms (each one is cross-checked in tests/test_accounting.py)
# --------------------------------------------------------------------------------------------

def zcdp_to_dp_bun_steinke(rho: float, delta: float) -> float:
    """Bun & Steinke 2016, Prop 1.3: ρ-zCDP implies (ρ + 2√(ρ ln(1/δ)), δ)-DP for every δ > 0."""
    if rho <= 0:
        return 0.0
    return rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))


def _cks_objective(rho: float, log_inv_delta: float, alpha: float) -> float:
    # Canonne, Kamath & Steinke 2020 (arXiv:2004.00010) Prop 12 for (α, αρ)-RDP:
    # ε = αρ + (ln(1/δ) + (α-1) ln(1-1/α) - ln α) / (α-1).
    am1 = alpha - 1.0
    return alpha * rho + math.log1p(-1.0 / alpha) + (log_inv_delta - math.log(alpha)) / am1


@lru_cache(maxsize=4096)
def zcdp_to_dp(rho: float, delta: float) -> float:
    """ε such that ρ-zCDP implies (ε, δ)-DP: min over orders α > 1 of the conversion of
    Canonne, Kamath & Steinke 2020, Prop 12 (also used by Google's dp_accounting
    `rdp.compute_epsilon`), applied to the RDP curve (α, αρ) of ρ-zCDP, and never worse than
    Bun & Steinke's Prop 1.3. Any α gives a valid bound, so an imperfect numerical minimum is
    still sound, only slightly loose."""
    if not (0.0 < delta < 1.0):
        raise InvalidParameter("the zCDP to (ε, δ) conversion needs 0 < δ < 1")
    if rho < 0 or math.isnan(rho):
        raise InvalidParameter("ρ must be non-negative")
    if rho == 0:
        return 0.0
    if math.isinf(rho):
        return math.inf
    L = math.log(1.0 / delta)

    def f(t: float) -> float:  # α = 1 + e^t keeps α > 1 on the whole search line
        return _cks_objective(rho, L, 1.0 + math.exp(t))

    grid = [-12.0 + 0.25 * i for i in range(145)]  # α - 1 from e^-12 to e^24
    values = [f(t) for t in grid]
    i = min(range(len(grid)), key=values.__getitem__)
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    gr = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = lo, hi
    c, d = b - gr * (b - a), a + gr * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(80):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - gr * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + gr * (b - a)
            fd = f(d)
    best = min(values[i], fc, fd)
    return max(0.0, min(best, zcdp_to_dp_bun_steinke(rho, delta)))


@lru_cache(maxsize=1024)
def zcdp_budget(epsilon: float, delta: float) -> float:
    """ρ_B: the largest ρ (to bisection precision, rounded down) with zcdp_to_dp(ρ, δ) ≤ ε."""
    if epsilon <= 0:
        return 0.0
    hi = max(epsilon, 1e-12)
    while zcdp_to_dp(hi, delta) <= epsilon:
        hi *= 2.0
        if hi > 1e12:
            raise InvalidParameter("zCDP budget diverges: δ too close to 1")
    lo = 0.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if mid <= lo or mid >= hi:
            break
        if zcdp_to_dp(mid, delta) <= epsilon:
            lo = mid
        else:
            hi = mid
    assert zcdp_to_dp(lo, delta) <= epsilon
    return lo


def dr_advanced_epsilon(k: int, eps0: float, delta_prime: float) -> float:
    """Dwork & Roth Thm 3.20: k-fold adaptive composition of (ε0, δ0)-DP mechanisms is
    (√(2k ln(1/δ')) ε0 + k ε0 (e^ε0 - 1), kδ0 + δ')-DP."""
    if k <= 0:
        return 0.0
    return math.sqrt(2.0 * k * math.log(1.0 / delta_prime)) * eps0 + k * eps0 * math.expm1(eps0)


def kov_34_epsilons(k: int, eps0: float, delta_tilde: float) -> tuple[float, float]:
    """Kairouz, Oh & Viswanath 2015, Thm 3.4 (the two non-trivial terms of "self-adaptive
    selection" in `dpsql_algorithms.md`): with δ̃ ∈ (0, 1] the k-fold composition of (ε0, δ0)-DP
    mechanisms is (ε̃, 1 - (1-δ0)^k (1-δ̃))-DP for ε̃ = kε0(e^ε0-1)/(e^ε0+1) + ε0√(2k ln(e + √(kε0²)/δ̃))
    and for ε̃ = kε0(e^ε0-1)/(e^ε0+1) + ε0√(2k ln(1/δ̃))."""
    if k <= 0:
        return 0.0, 0.0
    mean = k * eps0 * math.tanh(eps0 / 2.0)  # (e^ε-1)/(e^ε+1) = tanh(ε/2)
    a = mean + eps0 * math.sqrt(2.0 * k * math.log(math.e + math.sqrt(k * eps0 * eps0) / delta_tilde))
    b = mean + eps0 * math.sqrt(2.0 * k * math.log(1.0 / delta_tilde))
    return a, b


@lru_cache(maxsize=8192)
def kov_delta(k: int, eps0: float, delta0: float, eps_total: float) -> float:
    """The smallest δ such that every k-fold adaptive composition of (ε0, δ0)-DP mechanisms is
    (eps_total, δ)-DP: Kairouz, Oh & Viswanath 2015, Thm 3.3. The composition's privacy region is
    contained in that of k-fold randomized response (their dominance argument), so
    δ = 1 - (1-δ0)^k (1 - H), H = Σ_l C(k,l) max(0, e^{(k-l)ε0} - e^{eps_total} e^{lε0}) / (1+e^ε0)^k,
    the hockey-stick divergence of k-fold randomized response. At eps_total = (k-2i)ε0 this is the
    δ_i of `dpsql_algorithms.md` ("advanced composition 2")."""
    if k <= 0:
        return 0.0
    if eps0 < 0 or eps_total < 0:
        raise InvalidParameter("ε must be non-negative")
    hs_terms = []
    if eps0 > 0:
        log_norm = k * (eps0 + math.log1p(math.exp(-eps0)))  # k ln(1 + e^ε0)
        for l in range(k + 1):
            gap = (k - 2 * l) * eps0  # ln of the likelihood ratio of an outcome with l "flips"
            if gap <= eps_total:
                break
            log_binom = math.lgamma(k + 1) - math.lgamma(l + 1) - math.lgamma(k - l + 1)
            log_term = log_binom + (k - l) * eps0 - log_norm + math.log(-math.expm1(eps_total - gap))
            hs_terms.append(math.exp(log_term))
    hs = min(1.0, math.fsum(hs_terms))
    if hs >= 1.0:
        return 1.0
    # 1 - (1-δ0)^k (1-H), computed without cancellation
    return -math.expm1(k * math.log1p(-delta0) + math.log1p(-hs)) if delta0 < 1 else 1.0


@lru_cache(maxsize=8192)
def kov_epsilon(k: int, eps0: float, delta0: float, delta_total: float) -> float | None:
    """The smallest ε (bisection, rounded up) with kov_delta(k, ε0, δ0, ε) ≤ delta_total, or None
    if even ε = kε0 needs more δ than delta_total (then no ε works: δ ≥ 1-(1-δ0)^k)."""
    if k <= 0:
        return 0.0
    hi = k * eps0
    if kov_delta(k, eps0, delta0, hi) > delta_total:
        return None
    lo = 0.0
    if kov_delta(k, eps0, delta0, lo) <= delta_total:
        return 0.0
    for _ in range(100):
        mid = (lo + hi) / 2.0
        if mid <= lo or mid >= hi:
            break
        if kov_delta(k, eps0, delta0, mid) <= delta_total:
            hi = mid
        else:
            lo = mid
    return hi


def advanced_filter_epsilon(sum_sq: float, delta_prime: float) -> float:
    """The ε of the advanced-composition filter for Σ ε_j² = sum_sq at tail probability δ':
    ½ Σε_j² + √(2 ln(1/δ') Σε_j²). Whitehouse, Ramdas, Rogers & Wu 2023 show this is a valid
    privacy filter (adaptive ε_j, (ε_j, δ_j)-DP mechanisms, total (ε, δ' + δ'') when Σδ_j ≤ δ'').
    The same number is ρ + 2√(ρ ln(1/δ')) for ρ = Σ ε_j²/2 (pure ε-DP is ε²/2-zCDP, Bun & Steinke
    Prop 1.4, composed by a zCDP filter and converted by their Prop 1.3), a second route to it."""
    if sum_sq <= 0:
        return 0.0
    return 0.5 * sum_sq + math.sqrt(2.0 * math.log(1.0 / delta_prime) * sum_sq)


def gaussian_paper_k(gamma: float, n: int, delta: float) -> float:
    """k = γ / (2√(n ln(1/δ))) of the paper's Thm 5 (with γ = ε/2 this is Cor 2's ε/(4√(n ln(1/δ))))."""
    return gamma / (2.0 * math.sqrt(n * math.log(1.0 / delta)))


# --------------------------------------------------------------------------------------------
# What a single mechanism costs in each currency
# --------------------------------------------------------------------------------------------

def _check_mechanism(m: MechanismCost) -> None:
    for name in ("sensitivity", "scale", "epsilon", "delta"):
        v = getattr(m, name)
        if not isinstance(v, (int, float)) or math.isnan(v) or math.isinf(v) or v < 0:
            raise CostNotSupported(f"mechanism {m.label or m.kind!r}: {name} must be a finite number >= 0")
    if m.rho is not None and (math.isnan(m.rho) or math.isinf(m.rho) or m.rho < 0):
        raise CostNotSupported(f"mechanism {m.label or m.kind!r}: rho must be a finite number >= 0")
    if m.delta >= 1:
        raise CostNotSupported(f"mechanism {m.label or m.kind!r}: δ must be < 1")


def _ratio(m: MechanismCost) -> float:
    """S(f)/p: sensitivity over the noise scale (b for Laplace, σ for Gaussian)."""
    if m.scale <= 0:
        if m.sensitivity == 0:
            return 0.0
        raise CostNotSupported(f"mechanism {m.label or m.kind!r}: noise scale must be > 0")
    return m.sensitivity / m.scale


@lru_cache(maxsize=65536)
def pure_epsilon(m: MechanismCost) -> float:
    """ε of a pure ε-DP mechanism: S(f)/b for Laplace (the paper, Thm 1), the declared ε for a
    δ = 0 threshold or a settled charge. The larger of S/b and the declared ε is used (fail closed
    if the two disagree)."""
    _check_mechanism(m)
    if m.delta > 0:
        raise CostNotSupported(f"mechanism {m.label or m.kind!r} is ({_fmt(m.epsilon)}, {_fmt(m.delta)})-DP, not pure ε-DP")
    if m.kind == "laplace":
        return max(m.epsilon, _ratio(m))
    if m.kind in ("threshold", "exponential", SPARSE_VECTOR_KIND, SETTLED_KIND):
        return m.epsilon
    raise CostNotSupported(f"{m.kind} mechanism {m.label!r} is not pure ε-DP")


@lru_cache(maxsize=65536)
def dp_params(m: MechanismCost) -> tuple[float, float]:
    """(ε, δ) of one mechanism for (ε, δ)-composition."""
    _check_mechanism(m)
    if m.kind == "laplace":
        return max(m.epsilon, _ratio(m)), m.delta
    if m.kind == "gaussian":
        if m.delta <= 0:
            raise CostNotSupported(f"gaussian mechanism {m.label!r} declares δ = 0; a Gaussian is not (ε, 0)-DP")
        if m.epsilon <= 0 and m.sensitivity > 0:
            raise CostNotSupported(f"gaussian mechanism {m.label!r} declares ε = 0")
        return m.epsilon, m.delta
    if m.kind in ("threshold", "exponential", SPARSE_VECTOR_KIND, SETTLED_KIND):
        return m.epsilon, m.delta
    raise CostNotSupported(f"unknown mechanism kind {m.kind!r}")


@lru_cache(maxsize=65536)
def zcdp_rho(m: MechanismCost) -> tuple[float, float]:
    """(ρ, δ_approx) of one mechanism: Gaussian ρ = Δ₂²/(2σ²) (Bun & Steinke Prop 1.6; the discrete
    Gaussian of docs/NOISE.md too, Canonne, Kamath & Steinke 2020); a pure ε-DP mechanism is ε²/2-zCDP
    (Bun & Steinke Prop 1.4); an (ε, δ)-DP threshold is δ-approximately ε²/2-zCDP."""
    _check_mechanism(m)
    if m.kind == "gaussian":
        r = _ratio(m)
        return max(m.rho or 0.0, r * r / 2.0), 0.0
    if m.kind == "laplace":
        if m.delta > 0:
            raise CostNotSupported(f"laplace mechanism {m.label!r} declares δ > 0")
        e = max(m.epsilon, _ratio(m))
        return e * e / 2.0, 0.0
    if m.kind in ("threshold", "exponential", SPARSE_VECTOR_KIND):
        return m.epsilon * m.epsilon / 2.0, m.delta
    raise CostNotSupported(f"{m.kind} mechanism {m.label!r} has no zCDP guarantee")


@lru_cache(maxsize=65536)
def query_dp(cost: PrivacyCost) -> tuple[float, float]:
    """(ε_q, δ_q) of a whole query by basic composition of its mechanisms (Dwork & Roth Thm 3.16)."""
    eps, dels = [], []
    for m in cost.mechanisms:
        e, d = dp_params(m)
        eps.append(e)
        dels.append(d)
    return math.fsum(eps), math.fsum(dels)


def _all_mechanisms(costs: Iterable[PrivacyCost]) -> list[MechanismCost]:
    return [m for c in costs for m in c.mechanisms]


# --------------------------------------------------------------------------------------------
# Accountants
# --------------------------------------------------------------------------------------------

def _require(cond: bool, message: str) -> None:
    if not cond:
        raise InvalidParameter(message)


def _finite_pos(x, name: str, *, allow_zero: bool = False) -> None:
    ok = isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and (x >= 0 if allow_zero else x > 0)
    _require(ok, f"{name} must be a finite number {'>= 0' if allow_zero else '> 0'} (got {x!r})")


class Accountant:
    """Base class. Subclasses implement `validate`, `spent`, `limits` and `violation`."""

    name = ""
    source = ""
    supports_settlement = False  # a posteriori (ODP) refunds: only under simple composition

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
    def spent(self, budget: Budget, costs: Sequence[PrivacyCost]) -> Spent:
        """What the sequence spends, in this accountant's currency. Raises CostNotSupported."""
        raise NotImplementedError

    def limits(self, budget: Budget) -> Spent:
        """The maximum of each currency (queries=None: unlimited)."""
        raise NotImplementedError

    def violation(self, budget: Budget, costs: Sequence[PrivacyCost], spent: Spent) -> str | None:
        """Why the sequence (the last element being the new query) breaks the theorem, or None."""
        raise NotImplementedError

    def _count_violation(self, budget: Budget, costs: Sequence[PrivacyCost]) -> str | None:
        if budget.max_queries is not None and len(costs) > budget.max_queries:
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
        before = self.spent(budget, accepted)
        try:
            after = self.spent(budget, [*accepted, new])
        except CostNotSupported as exc:
            return Decision(False, f"the {self.name} accountant cannot charge this query: {exc.args[0]}",
                            before, self.remaining(budget, before), None)
        needs = Spent(epsilon=max(0.0, after.epsilon - before.epsilon), delta=max(0.0, after.delta - before.delta),
                      rho=None if after.rho is None else max(0.0, after.rho - (before.rho or 0.0)), queries=1)
        reason = self._count_violation(budget, [*accepted, new]) or self.violation(budget, [*accepted, new], after)
        if reason is not None:
            return Decision(False, reason, before, self.remaining(budget, before), needs)
        return Decision(True, "accepted", after, self.remaining(budget, after), needs)

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
        problem = self._count_violation(budget, costs) or self.violation(budget, costs, s)
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
                    f"{', '.join(n for n, a in ACCOUNTANTS.items() if a.supports_settlement)}")
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

    def spent(self, budget, costs):
        return Spent(epsilon=math.fsum(pure_epsilon(m) for m in _all_mechanisms(costs)), queries=len(costs))

    def limits(self, budget):
        return Spent(epsilon=budget.epsilon, delta=0.0, queries=budget.max_queries)

    def violation(self, budget, costs, spent):
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

    def spent(self, budget, costs):
        eps, dels = [], []
        for c in costs:
            e, d = query_dp(c)
            eps.append(e)
            dels.append(d)
        return Spent(epsilon=math.fsum(eps), delta=math.fsum(dels), queries=len(costs))

    def limits(self, budget):
        return Spent(epsilon=budget.epsilon, delta=budget.delta, queries=budget.max_queries)

    def violation(self, budget, costs, spent):
        if not _le(spent.epsilon, budget.epsilon):
            return f"Σε would be {_fmt(spent.epsilon)} > ε = {_fmt(budget.epsilon)} (basic composition)"
        if not _le(spent.delta, budget.delta):
            return f"Σδ would be {_fmt(spent.delta)} > δ = {_fmt(budget.delta)} (basic composition)"
        return None


# --------------------------------------------------------------------------------------------
# Output differential privacy (odp_privacy_accounting.md)
# --------------------------------------------------------------------------------------------

def odp_filter(epsilons: Sequence[float], deltas: Sequence[float], eps_t: float, delta_t: float) -> str:
    """The ODP filter F_{ε_t,δ_t} with which Alg. 6 (ODPFilterComposition) is Alg. 1
    (odp_privacy_accounting.md Appendix A, after Def. 19): HALT if Σ ε^i > ε_t or Σ δ_i > δ_t, CONT
    otherwise; valid by Thm 7. Alg. 6 line 7 calls it on (ε^1, δ_1, …, ε^{i-1}, δ_{i-1}, sup E_i, δ_i,
    0, 0, …): the realised ε of the rounds before (line 12: ε^j = E_j(P_{j,k}) of the cell the output
    fell in), the worst case of the next round, and every round's declared δ_i."""
    if not _le(math.fsum(epsilons), eps_t) or not _le(math.fsum(deltas), delta_t):
        return "HALT"
    return "CONT"


@lru_cache(maxsize=65536)
def odp_round(m: MechanismCost) -> tuple[float, float]:
    """(sup E, δ) of one mechanism as one round of Alg. 1 / Alg. 6 (odp_privacy_accounting.md).

    The round needs a triple (P, E, δ) for which the mechanism is (P, E, δ)-ODP (Def. 2; Alg. 1
    lines 6 and 11). DPCH reads it from the mechanism's own (ε, δ)-DP guarantee (`dp_params`): that
    makes it ({O}, E ≡ ε, δ)-ODP for the trivial partition, and for any partition (Lemma 3); the
    declared `odp_epsilons` are the values E(P_k) of a finer partition with sup E ≤ ε (Lemma 4).
    δ may be > 0: Def. 2 and Lemma 20 (Thm 7's induction step) allow (P, E, δ)-ODP mechanisms; δ
    is one number per mechanism, never per cell (Alg. 1 line 15; the paper's Sec. 3.2 explains why
    a cell-dependent δ is a fallacy). Raises CostNotSupported for a mechanism without an (ε, δ)-DP
    guarantee (e.g. a Gaussian declared by ρ only) or whose declared cells exceed sup E."""
    e, d = dp_params(m)
    for v in m.odp_epsilons:
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0 or not _le(v, e):
            raise CostNotSupported(f"mechanism {m.label or m.kind!r} declares ODP cell values outside [0, sup E = {_fmt(e)}] "
                                   f"(odp_privacy_accounting.md Def. 2, Lemma 4)")
    return e, d


def odp_realized(cost: PrivacyCost, cells: Sequence[int | None]) -> PrivacyCost:
    """The realised cost to pass to `Ledger.settle` (odp_privacy_accounting.md Alg. 1 lines 13-14):
    for each mechanism of the reserved `cost`, in order, the index k into its declared
    `odp_epsilons` of the cell P_k its *released* output fell in, or None for no refund (its full
    ε: the trivial partition of Lemma 3). The cell must be a function of what the analyst receives
    (Def. 2: P partitions the mechanism's output set)."""
    if len(cells) != len(cost.mechanisms):
        raise InvalidParameter(f"one cell per mechanism: the cost has {len(cost.mechanisms)}, {len(cells)} given")
    out = []
    for m, k in zip(cost.mechanisms, cells):
        if k is None:
            try:
                full = dp_params(m)[0]  # the reservation itself (for a Laplace: max(declared ε, S/b))
            except CostNotSupported as exc:
                raise InvalidParameter(exc.args[0]) from None
            out.append(replace(m, epsilon=full, odp_epsilons=()))
            continue
        if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k < len(m.odp_epsilons):
            raise InvalidParameter(f"mechanism {m.label or m.kind!r} declares {len(m.odp_epsilons)} ODP cells; "
                                   f"cell {k!r} is not one of them")
        out.append(replace(m, epsilon=float(m.odp_epsilons[k]), odp_epsilons=()))
    return PrivacyCost(tuple(out))


class OdpAccountant(BasicAccountant):
    """Output-DP accounting: odp_privacy_accounting.md Alg. 1 (ODPComposition), valid by Thm 7, run
    as Alg. 6 (ODPFilterComposition) with the linear ODP filter of Def. 19 (`odp_filter`).

    Every mechanism of a query is one round i. At charge time (Alg. 6 line 7, = Alg. 1 lines 9-10)
    the round is refused unless Σ_{j<i} ε^j + sup E_i ≤ ε_t and Σ_{j≤i} δ_j ≤ δ_t, where ε^j is the
    realised value of a settled charge (Alg. 6 line 12) and the full reservation sup E_j of one not
    (yet) settled: reserved, executed, failed, or lost in a crash. Counting an unsettled round at
    its worst case only makes the test stricter than Alg. 1's, whatever its output turns out to be,
    so every accepted sequence is one Alg. 1 accepts in charge order, and Thm 7 gives (ε_t, δ_t)-DP
    for the whole interaction. The several mechanisms of one query are consecutive rounds whose
    later members do not wait for the earlier outputs (less adaptivity than Alg. 1 permits).

    Covered: every mechanism with an (ε, δ)-DP guarantee, δ ≥ 0 (`odp_round`); δ composes by simple
    addition and is never refunded (Alg. 1 line 15). Refused (the theorem does not cover them):
    mechanisms with no (ε, δ)-DP guarantee, such as a Gaussian declared by ρ only."""

    name = "odp"
    source = ("odp_privacy_accounting.md Alg. 1 (ODPComposition) and Thm 7; Alg. 6 (ODPFilterComposition) with "
              "the linear ODP filter of Def. 19")
    supports_settlement = True

    # the budget's parameters (_validate) and limits are those of `basic`

    def _terms(self, cost):
        eps, dels = [], []
        for m in cost.mechanisms:
            e, d = odp_round(m)
            eps.append(e)
            dels.append(d)
        return eps, dels

    def _sequence(self, costs) -> tuple[list[float], list[float]]:
        eps, dels = [], []
        for c in costs:
            e, d = self._terms(c)
            eps.extend(e)
            dels.extend(d)
        return eps, dels

    def spent(self, budget, costs):
        eps, dels = self._sequence(costs)
        return Spent(epsilon=math.fsum(eps), delta=math.fsum(dels), queries=len(costs))

    def violation(self, budget, costs, spent):
        eps, dels = self._sequence(costs)
        if odp_filter(eps, dels, budget.epsilon, budget.delta) == "CONT":
            return None
        if not _le(spent.epsilon, budget.epsilon):
            return (f"Σ realised ε + the worst case of the unsettled and of this query would be {_fmt(spent.epsilon)} "
                    f"> ε = {_fmt(budget.epsilon)} (ODP filter, odp_privacy_accounting.md Alg. 6 line 7)")
        return (f"Σδ would be {_fmt(spent.delta)} > δ = {_fmt(budget.delta)} (ODP filter, odp_privacy_accounting.md "
                f"Alg. 6 line 7; δ is never refunded, Alg. 1 line 15)")


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

    def _declared_spent(self, budget: Budget, costs, bound: Callable[[int], float]) -> Spent:
        for c in costs:
            query_dp(c)  # raises CostNotSupported for mechanisms without an (ε, δ) guarantee
        n = len(costs)
        return Spent(epsilon=bound(n) if n else 0.0, delta=budget.delta if n else 0.0, queries=n)

    def per_query_violation(self, budget: Budget, cost: PrivacyCost) -> str | None:
        if not budget.declared:
            return None
        return self._declared_query_violation(budget, cost)

    def _declared_violation(self, budget: Budget, costs) -> str | None:
        if len(costs) > budget.max_queries:
            return f"the budget declares k = {budget.max_queries} queries and all are used"
        return self._declared_query_violation(budget, costs[-1])

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

    def spent(self, budget, costs):
        if budget.declared:
            if not costs:
                return Spent()
            dprime = self._dprime(budget)
            return self._declared_spent(budget, costs, lambda n: dr_advanced_epsilon(n, budget.per_query_epsilon, dprime))
        sq, dels = self._filter_sums(costs)
        if not costs:
            return Spent()
        # δ spent: the tail δ' (committed by the first query) plus the mechanisms' own δ_j
        return Spent(epsilon=advanced_filter_epsilon(sq, self._dprime(budget)), delta=self._dprime(budget) + dels,
                     queries=len(costs))

    @staticmethod
    def _filter_sums(costs) -> tuple[float, float]:
        sq, dels = [], []
        for m in _all_mechanisms(costs):
            e, d = dp_params(m)
            sq.append(e * e)
            dels.append(d)
        return math.fsum(sq), math.fsum(dels)

    def limits(self, budget):
        return Spent(epsilon=budget.epsilon, delta=budget.delta, queries=budget.max_queries)

    def violation(self, budget, costs, spent):
        if budget.declared:
            return self._declared_violation(budget, costs)
        if not _le(spent.epsilon, budget.epsilon):
            return (f"the advanced-composition filter bound would be {_fmt(spent.epsilon)} > ε = {_fmt(budget.epsilon)} "
                    f"(Whitehouse et al. 2023)")
        _, dels = self._filter_sums(costs)
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

    def spent(self, budget, costs):
        return self._declared_spent(budget, costs, lambda n: self._eps(budget, n)) if costs else Spent()

    def limits(self, budget):
        return Spent(epsilon=budget.epsilon, delta=budget.delta, queries=budget.max_queries)

    def violation(self, budget, costs, spent):
        return self._declared_violation(budget, costs)


def homogeneous_bounds(k: int, eps0: float, delta0: float, delta: float) -> dict[str, float]:
    """ε of the k-fold composition of (ε0, δ0)-DP mechanisms at total δ, for each bound that is
    valid for it (missing key: the bound cannot reach δ). Used by the adaptive accountant."""
    out: dict[str, float] = {}
    if k * delta0 <= delta:
        out["basic (Dwork & Roth Thm 3.16)"] = k * eps0
    if delta - k * delta0 > 0:
        out["advanced (Dwork & Roth Thm 3.20)"] = dr_advanced_epsilon(k, eps0, delta - k * delta0)
    dt = 1.0 - (1.0 - delta) / (1.0 - delta0) ** k if delta0 < 1 else 0.0
    if dt > 0:
        a, b = kov_34_epsilons(k, eps0, min(dt, 1.0))
        out["Kairouz et al. Thm 3.4 (ln(e + √(kε²)/δ̃))"] = a
        out["Kairouz et al. Thm 3.4 (ln(1/δ̃))"] = b
    e = kov_epsilon(k, eps0, delta0, delta)
    if e is not None:
        out["optimal (Kairouz et al. Thm 3.3)"] = e
    return out


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

    def _filter_parts(self, budget, costs) -> tuple[float, float]:
        eps = [pure_epsilon(m) for m in _all_mechanisms(costs)]
        basic = math.fsum(eps)
        adv = advanced_filter_epsilon(math.fsum(e * e for e in eps), budget.delta) if budget.delta > 0 else math.inf
        return basic, adv

    def spent(self, budget, costs):
        if budget.declared:
            if not costs:
                return Spent()
            return self._declared_spent(budget, costs, lambda n: self.best_bound(budget, n)[1])
        basic, adv = self._filter_parts(budget, costs)
        if not costs:
            return Spent()
        return Spent(epsilon=min(basic, adv), delta=budget.delta if adv < basic else 0.0, queries=len(costs))

    def limits(self, budget):
        return Spent(epsilon=budget.epsilon, delta=budget.delta, queries=budget.max_queries)

    def violation(self, budget, costs, spent):
        if budget.declared:
            return self._declared_violation(budget, costs)
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

    def spent(self, budget, costs):
        if not costs:
            return Spent()
        total = math.fsum(self._ratio_sq(c) for c in costs)
        return Spent(epsilon=total + budget.gamma, delta=budget.delta, queries=len(costs))

    def limits(self, budget):
        return Spent(epsilon=budget.epsilon, delta=budget.delta, queries=budget.max_queries)

    def per_query_violation(self, budget, cost):
        r = math.sqrt(self._ratio_sq(cost))
        k = self.k(budget)
        if not _le(r, k):
            return f"S(f)/σ = {_fmt(r)} > k = {_fmt(k)} (paper Thm 5 with γ = {_fmt(budget.gamma)}, n = {budget.max_queries})"
        return None

    def violation(self, budget, costs, spent):
        problem = self.per_query_violation(budget, costs[-1])
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

    @staticmethod
    def _sums(costs) -> tuple[float, float]:
        rhos, dels = [], []
        for m in _all_mechanisms(costs):
            r, d = zcdp_rho(m)
            rhos.append(r)
            dels.append(d)
        return math.fsum(rhos), math.fsum(dels)

    def spent(self, budget, costs):
        rho, dels = self._sums(costs)
        if not costs:
            return Spent(rho=0.0)
        delta_conv = budget.delta - budget.mechanism_delta
        # ε: the (ε, δ') guarantee of what is spent so far; δ: δ' (committed by the first query) + Σδ_j
        return Spent(epsilon=zcdp_to_dp(rho, delta_conv), delta=delta_conv + dels, rho=rho, queries=len(costs))

    def limits(self, budget):
        return Spent(epsilon=budget.epsilon, delta=budget.delta, rho=self.rho_budget(budget), queries=budget.max_queries)

    def violation(self, budget, costs, spent):
        rb = self.rho_budget(budget)
        if not _le(spent.rho, rb):
            return (f"Σρ would be {_fmt(spent.rho)} > ρ budget {_fmt(rb)} (the largest ρ that converts to "
                    f"ε = {_fmt(budget.epsilon)} at δ = {_fmt(budget.delta - budget.mechanism_delta)})")
        _, dels = self._sums(costs)
        if dels > 0 and not _le(dels, budget.mechanism_delta):
            if budget.mechanism_delta == 0:
                return ("the query has an (ε, δ)-DP part with δ > 0; the zcdp budget reserves no δ for mechanisms "
                        "(set mechanism_delta)")
            return f"the mechanisms' Σδ would be {_fmt(dels)} > δ'' = {_fmt(budget.mechanism_delta)} (mechanism_delta)"
        return None


ACCOUNTANTS: dict[str, Accountant] = {
    a.name: a for a in (PureAccountant(), BasicAccountant(), AdvancedAccountant(), OptimalAccountant(),
                        AdaptiveAccountant(), PaperGaussianAccountant(), ZcdpAccountant(), OdpAccountant())
}


def get_accountant(name: str) -> Accountant:
    try:
        return ACCOUNTANTS[name]
    except KeyError:
        raise InvalidParameter(f"unknown accountant {name!r}; choose one of: {', '.join(ACCOUNTANTS)}") from None


def make_budget(epsilon: float, delta: float = 0.0, accountant: str = "basic", **params) -> Budget:
    """Build and validate a Budget. Raises InvalidParameter on an unknown parameter or a budget the
    accountant's theorem cannot honour."""
    unknown = set(params) - set(Budget.PARAM_NAMES) - {"analyst", "dataset"}
    if unknown:
        raise InvalidParameter(f"unknown budget parameter(s): {', '.join(sorted(unknown))}; "
                               f"known: {', '.join(Budget.PARAM_NAMES)}")
    clean = {k: v for k, v in params.items() if v is not None or k in ("analyst", "dataset")}
    if clean.get("per_query_delta") is None:
        clean.pop("per_query_delta", None)
    try:
        epsilon = float(epsilon)
        delta = float(delta)
    except (TypeError, ValueError):
        raise InvalidParameter("epsilon and delta must be numbers") from None
    for name in ("per_query_epsilon", "per_query_delta", "gamma", "mechanism_delta"):
        if name in clean:
            try:
                clean[name] = float(clean[name])
            except (TypeError, ValueError):
                raise InvalidParameter(f"{name} must be a number") from None
    budget = Budget(epsilon=epsilon, delta=delta, accountant=accountant, **clean)
    return get_accountant(accountant).validate(budget)


def budget_fields() -> list[str]:
    return [f.name for f in fields(Budget)]
