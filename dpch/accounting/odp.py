"""Output differential privacy (odp_privacy_accounting.md): the ODP filter, rounds, realised costs and the `odp` accountant."""
from __future__ import annotations

import math
from dataclasses import replace
from functools import lru_cache
from typing import Sequence

from ..cost import MechanismCost, PrivacyCost
from ..errors import InvalidParameter
from .budget import CostNotSupported, _fmt, _le
from .costs import dp_params
from .accountants import BasicAccountant

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

    def sum_terms(self, budget, cost):
        eps, dels = self._terms(cost)
        return {"eps": eps, "delta": dels}

    # spent_from is basic's: Σ ε^i and Σ δ_i over every round, exactly summed

    def violation_from(self, budget, state, last, spent):
        # the filter on the exact sums: the same test as odp_filter on the list of rounds
        if odp_filter([spent.epsilon], [spent.delta], budget.epsilon, budget.delta) == "CONT":
            return None
        if not _le(spent.epsilon, budget.epsilon):
            return (f"Σ realised ε + the worst case of the unsettled and of this query would be {_fmt(spent.epsilon)} "
                    f"> ε = {_fmt(budget.epsilon)} (ODP filter, odp_privacy_accounting.md Alg. 6 line 7)")
        return (f"Σδ would be {_fmt(spent.delta)} > δ = {_fmt(budget.delta)} (ODP filter, odp_privacy_accounting.md "
                f"Alg. 6 line 7; δ is never refunded, Alg. 1 line 15)")
