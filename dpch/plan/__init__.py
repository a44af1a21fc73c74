"""Stage 3 of the controller: the privacy plan of a bound query.

``make_plan(bound, epsilon, delta, options) -> Plan`` decides, before anything runs:

1. **Quantities.** Every DP aggregate is built from noisy *quantities*, each computed once:
   a count of rows (optionally of rows satisfying a predicate), the count of distinct units, or a
   sum of a bounded per-row value in fixed point. COUNT → one count; SUM → one sum (centred at 0);
   AVG → a sum centred at the midpoint of its bounds and a count; VAR/STDDEV → centred sum, centred
   sum of squares and a count. Identical quantities are shared (AVG(x) and COUNT(x) share the
   count), so the budget pays for each once.

2. **Per-row bounds by interval arithmetic** (the paper, Remark 1: a Lipschitz/monotone map of a
   bounded value is bounded, in ``dpch.plan.bounds``): the expression inside an aggregate is evaluated over intervals from
   the catalog bounds (+, -, *, / by a value whose bounds exclude 0, abs, least/greatest, if/CASE,
   pow, sqrt, exp/log, rounding, casts, comparisons -> [0, 1]). Its columns are clipped to their
   bounds and the result is clipped to the computed interval in SQL, so the per-row bound holds by
   construction even if the arithmetic were loose (looseness costs accuracy only).

3. **Fixed point.** A sum quantity is computed in integer units of the power-of-two grid
   ``g = 2^(floor(log2 hw) + 1 - 20)`` (hw = half-width of the value interval around its centre):
   per-row units are clamped to ``[L, H] = [round((lo - c)/g), round((hi - c)/g)]`` and summed as
   Int64, which is exact, so floating-point summation order cannot inflate the sensitivity
   (Casacuberta et al. 2022). Noise is added by ``dpch_laplace_int`` / ``dpch_gaussian_int``.

4. **Sensitivity** of each quantity in grid units, from the contribution bounds (docs/CONTROLLER.md,
   "Sensitivity"): one unit contributes to at most k groups (k = max_groups_contributed when the
   query groups, else 1), at most C = max_rows_per_group rows per group and M = max_rows_per_unit
   rows in total; every per-row value lies in [L, H], B = max(|L|, |H|), M' = min(M, kC):
   - add_remove: L1 = M'·B; L2 = B·sqrt(q·C² + (M' - qC)²), q = min(k, floor(M'/C));
     distinct units: L1 = k, L2 = sqrt(k);
   - substitute, no GROUP BY: the unit's contribution ranges over [min(0, M'L), max(0, M'H)], so
     L1 = L2 = M'·(max(0, H) - min(0, L)) (distinct units: 1);
   - substitute, GROUP BY: L1 = 2·L1(add_remove), L2 = sqrt(2)·L2 when L and H have the same sign
     (else 2·L2); distinct units: 2k, sqrt(2k).
   Row-level tables are the case k = C = M = 1.

5. **Mechanism** per quantity (option ``mechanism=``): "laplace", "gaussian" or "auto" (default).
   auto: Laplace when δ = 0; when δ > 0, Gaussian for a quantity iff its σ is below the standard
   deviation √2·b of the Laplace noise it would otherwise get (with the same ε share and an equal
   δ share). Laplace: ``dpch.calibration.laplace_scale(L1, ε_q)`` (the paper, Thm 1). Gaussian:
   ``gaussian_sigma(L2, ε_q, δ_q, integer=True)`` when one unit can move a single released value
   (no GROUP BY, or k = 1 under add_remove: the exact discrete-Gaussian δ, CKS20 Thm 7), else the
   zCDP route: the multivariate discrete Gaussian is L2²/(2σ²)-zCDP (CKS20 Thm 4 and its
   multivariate extension) and ρ-zCDP implies (ε, δ)-DP with
   δ = inf_{α>1} exp((α-1)(αρ-ε))·(1-1/α)^(α-1)/α (CKS20 Cor. 13).

6. **Budget split** (option ``weights=``): ε is split in proportion to weights, one weight per noisy
   quantity (default 1 each) plus one for private partition selection (default 1, key
   ``"partition_selection"``). ``weights`` may name a quantity label (shown by explain) or an
   output column (sets the weight of each of its quantities). δ is split equally among the
   mechanisms that use it (Gaussian quantities and partition selection); δ that no mechanism uses
   is not charged. Costs compose by basic composition (Dwork & Roth Thm 3.16) in the ledger.

7. **Group keys.** No GROUP BY: one row. Otherwise, per key, a public domain when one exists:
   the catalog's ``public_keys`` for a column (or ``keys=`` given with the query), also mapped
   through a key expression of that one column; or the values of an integer column with declared
   bounds (at most 10 000 values). When every key has a domain, the output is exactly their cross
   product (empty groups get noise only; rows outside it are dropped). Otherwise, with δ > 0,
   **private partition selection** (``dpch.plan.selection``; docs/CONTROLLER.md, "Partition
   selection"): each group's number n of distinct units gets a noisy count and the group is
   released iff it is >= T; one unit moves at most c = k (2k under substitute) counts by 1. Rules:
   the optimal rule of Desfontaines et al. (PoPETs 2022, Thm 1) at (ε_sel/c, 1 - (1 - δ_sel)^(1/c))
   per group, sampled exactly by ``dpch_partition_select``; a Gaussian threshold (L2 √c noise,
   created groups pass with probability <= δ_thr/c); or the Laplace threshold of Korolova et al.
   2009 / Wilson et al. 2020 (b = c/ε, T with P[1 + K >= T] <= 1 - (1 - δ_sel)^(1/c)). Each
   releases its noisy counts within the same (ε_sel, δ_sel), which is why COUNT(DISTINCT unit)
   reuses the selection count under thresholding. On the user-level k > 1 path also the weighted
   Gaussian of Gopi et al. (ICML 2020): a unit in j groups adds w_j = ⌊S/√j⌋ (exactly: the largest
   integer with j·w_j² <= S²) to each, so its weight vector has L2 <= S; each group's weight sum
   (a quantity of kind "weighted_units", never an aggregate's value) gets discrete Gaussian noise
   calibrated for L2 S (√2·S under substitute) and passes iff >= ρ, ρ such that a unit alone in
   t <= k groups has one released with probability <= δ_thr; selection="weighted_gaussian" at k = 1
   or row level is the Gaussian threshold. ``selection="auto"`` takes the rule with the fewest
   expected missed units at (ε_sel, δ_sel, c), a data-independent score (the weighted rule's at its
   worst case, every unit in k groups; a candidate only when no output reuses the selection's
   count). With δ = 0 and a key without a public domain the query is rejected.

The package, by what each module does:

- ``options``: QueryOptions (the analyst's options) and check_budget_args (ε, δ);
- ``model``: the plan's dataclasses (Quantity, AggregatePlan, KeyDomain, Selection, Bounding, Plan);
- ``bounds``: per-row bounds of an aggregate's argument (point 2), a table of bounding rules;
- ``sensitivity``: L1/L2 sensitivities of quantities (point 4);
- ``gaussian``: the zCDP route of the vector Gaussian (point 5);
- ``selection``: the partition-selection rules, their thresholds, release probabilities and the
  choice among them (point 7);
- ``key_domains``: public key domains (point 7);
- ``planner``: make_plan, which puts them together (points 1 to 7).
"""
from .bounds import Interval, bound_expression, expr_nullable, float_literal
from .gaussian import vector_gaussian_sigma
from .key_domains import MAX_ENUMERATED_KEYS
from .model import AggregatePlan, Bounding, KeyDomain, Plan, Quantity, Selection
from .options import MECHANISMS, SELECTION_RULES, QueryOptions, check_budget_args
from .planner import FIXED_POINT_BITS, MAX_PUBLIC_GROUPS, SELECTION_WEIGHT_KEY, make_plan
from .selection import choose_selection, selection_release_probability, selection_threshold
from .sensitivity import row_sensitivity, unit_sensitivity

__all__ = [
    "AggregatePlan", "Bounding", "FIXED_POINT_BITS", "Interval", "KeyDomain", "MAX_ENUMERATED_KEYS",
    "MAX_PUBLIC_GROUPS", "MECHANISMS", "Plan", "Quantity", "QueryOptions", "SELECTION_RULES", "SELECTION_WEIGHT_KEY",
    "Selection", "bound_expression", "check_budget_args", "choose_selection", "expr_nullable", "float_literal",
    "make_plan", "row_sensitivity", "selection_release_probability", "selection_threshold", "unit_sensitivity",
    "vector_gaussian_sigma",
]
