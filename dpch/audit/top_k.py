"""Neighbouring datasets on which `dp_top_k` (and the controller's peeling top-n) loses the most.

`dp_top_k(x, domain, n, ε)` scores each domain value by its row count (Δ = 1) and chooses n of
them, in order, by n rounds of permute-and-flip over the values not chosen yet, each at the
temperature T = 2n/ε (dpch.mechanisms.TopKMechanism; docs/NOISE.md "Top-k"). The controller's
`SELECT k FROM t GROUP BY k ORDER BY COUNT(*) DESC LIMIT n` with `top_k="peeling"` runs the same
kernel over the public key domain with unit-level counts (docs/CONTROLLER.md "Top-n").

**What a removed row can do.** It lowers one score by one; no score rises. Permute-and-flip is
report-noisy-max with exponential noise of scale T (Ding, Kifer, Saghaian N. E., Steinke, Wang,
Xiao & Zhang, "The Permute-and-Flip Mechanism is Identical to Report-Noisy-Max with Exponential
Noise", arXiv:2105.07260, 2021), and for such monotone moves report-noisy-max is (Δ/T)-DP (the
argument of Dwork & Roth, Claim 3.9: fix the other noises; the threshold a candidate's noise must
pass moves by at most Δ, in one direction only). Each round is therefore ε/(2n)-DP under
remove-row and the n rounds compose to **ε/2**: no event of any remove-row (or add-row) pair has
a privacy loss above ε/2. The calibration T = 2Δn/ε pays for scores that move in both directions
(substitution), so on this relation the claim ε is conservative by a factor 2 and `dpch audit` can
certify at most ε/2 (the exhaustive search below agrees: no pair in it has an event of loss above
ε/2).

**The design.** One value Y holds `gap` more rows than each of m other values E₁ … E_m (m ≥ n),
and D′ removes one of Y's rows. On D, Y is the unique best by `gap` units, on D′ by gap − 1
(tied with every E when gap = 1). With Y on top, lowering Y is the same as raising every E by one
unit, so every round's chance to choose an E instead of Y grows by up to e^(1/T) on D′: the
event **"Y is not released"** (none of the n chosen is Y) favours D′, with loss up to n·(1/T) =
ε/2. As the E's are exchangeable, its probability is the product over the rounds i = 0 … n − 1
of 1 − P(Y | Y on top, m − i E's `gap` units below), where permute-and-flip with k others at
acceptance probability q = e^(−gap/T) takes Y with probability (1 − (1 − q)^(k+1))/((k + 1)q)
(Y is visited at a uniform position and accepted for sure; each E before it is rejected with
probability 1 − q). The number of E's and the gap are chosen to maximise the bound this event
certifies with 10⁴ held-out runs per side (`top_k_design`), as for the partition selection design.

For n = 1 the design is two values, Y one row above E: P_D′(E) = 1/2, P_D(E) = e^(−ε/2)/2, the
loss ε/2 exactly, which is the best any design can reach. An exhaustive search (2026-11-24) over
all score vectors of 2–6 candidates with scores 0..7 (0..6 for n = 3), every removed row and every
event (the Neyman–Pearson prefixes of the exact distribution of ordered outputs,
`TopKMechanism.probabilities`), at ε = 0.5, 1, 2 and n = 1, 2, 3, found no pair with an event of
loss above ε/2 and none that certifies more with 10⁴ held-out samples than this family: the best
pairs are of this form (n = 1: the pair (2, 1) shifted; n = 2: (7, 5, 5) at ε = 1, 2, (7, 6, 6)
at 0.5; n = 3: (6, 4, 4, 4) and (6, 5, 5, 5)), and tests/test_audit_top_k.py repeats a smaller
search.

The values are numbers so that the released array's elements are audit coordinates (docs/AUDIT.md
§2): Y = 0 and the E's 100, 101, …, so that "Y is not released" is "every element ≥ 100", a
half-space in the elements' sum, which the learned distinguishers find (the threshold search sees
one element). Y's rows are the smallest values of the table, so the worst-case search of
remove-row finds the removed row by itself ("the row with the smallest `x`").
"""
from __future__ import annotations

import math
from dataclasses import dataclass

#: E's first value: far from Y = 0, so that "Y not released" is linear in the elements' sum.
OTHERS_FROM = 100
#: The most candidates TopKMechanism.probabilities evaluates exactly.
EXACT_CANDIDATES = 8


def _pf_top(k: int, q: float) -> float:
    """Permute-and-flip's probability of choosing the best candidate (acceptance 1) against k
    others of acceptance probability q each."""
    if k == 0:
        return 1.0
    if q >= 1.0:
        return 1.0 / (k + 1)
    return -math.expm1((k + 1) * math.log1p(-q)) / ((k + 1) * q)


def not_released(temperature: float, n: int, others: int, gap: int) -> float:
    """P(Y is not among the n released) when Y is `gap` ≥ 0 units above `others` equal scores:
    the product over the rounds of 1 − P(Y | Y on top, the E's left `gap` units below)."""
    q = math.exp(-gap / temperature)
    p = 1.0
    for i in range(min(n, others)):
        p *= 1.0 - _pf_top(others - i, q)
    return p if n <= others else 0.0


def expected_certificate(p_fav: float, p_other: float, samples: int = 10_000,
                         alpha: float = 0.05 / 6) -> float:
    """The bound ln(p̲/p̄′) an event of these probabilities certifies with `samples` held-out runs
    per side at the audit's per-bound level (Clopper–Pearson at the expected counts)."""
    from .stats import cp_lower, cp_upper

    lo = float(cp_lower(round(p_fav * samples), samples, alpha))
    hi = float(cp_upper(round(p_other * samples), samples, alpha))
    return math.log(lo / hi) if lo > 0 and hi > 0 else -math.inf


@dataclass(frozen=True)
class TopKDesign:
    """D: a table (`unit` UInt64, `column` Int64) with `gap + base` rows of value Y = 0 and `base`
    rows of each of the `others` values 100, 101, …; one row per unit. D′: D without one of Y's
    rows (unit 0). Audited with `dp_top_k(x, [0, 100, …], n, ε)` (`sql`) or, through the
    controller, `SELECT x FROM t GROUP BY x ORDER BY COUNT(*) DESC LIMIT n` with
    `top_k="peeling"` over the public key domain (`controller_sql`, `options`)."""

    n: int
    epsilon: float
    others: int     # m: values E below Y
    gap: int        # Y's rows minus each E's rows on D
    base: int = 1   # rows of each E
    column: str = "x"
    unit: str = "user_id"

    # -- data ---------------------------------------------------------------------------------
    @property
    def values(self) -> tuple[int, ...]:
        """The domain: Y = 0 first, then the E's."""
        return (0,) + tuple(OTHERS_FROM + i for i in range(self.others))

    @property
    def favoured(self) -> int:
        return 0

    def scores(self) -> list[int]:
        """Row counts per domain value on D."""
        return [self.base + self.gap] + [self.base] * self.others

    def scores_prime(self) -> list[int]:
        """Row counts per domain value on D′ (one of Y's rows removed)."""
        return [self.base + self.gap - 1] + [self.base] * self.others

    @property
    def rows(self) -> int:
        return sum(self.scores())

    @property
    def removed_unit(self) -> int:
        return 0  # Y's rows are units 0 .. gap + base − 1

    def where(self) -> str:
        """The SQL predicate selecting the removed row (`audit(..., where=...)`)."""
        return f"{self.unit} = {self.removed_unit}"

    def table_rows(self) -> list[tuple[int, int]]:
        """(unit, value) of every row of D, Y's first."""
        out, uid = [], 0
        for value, count in zip(self.values, self.scores()):
            for _ in range(count):
                out.append((uid, value))
                uid += 1
        return out

    def create_table(self, conn, table: str, *, register: bool = False) -> None:
        """(Re)create `table` holding D; with `register`, register it in the catalog for the
        controller (unit column, one group and one row per unit, the domain as public keys)."""
        conn.command(f"DROP TABLE IF EXISTS {table}")
        conn.command(f"CREATE TABLE {table} ({self.unit} UInt64, {self.column} Int64) ENGINE = MergeTree "
                     f"ORDER BY {self.unit}")
        conn.command(f"INSERT INTO {table} VALUES " + ", ".join(f"({u}, {v})" for u, v in self.table_rows()))
        if register:
            conn.catalog.register(table, privacy_unit=self.unit, max_groups_contributed=1,
                                  max_rows_per_unit=1, public_keys={self.column: list(self.values)})

    def frame(self):
        import pandas as pd

        rows = self.table_rows()
        return pd.DataFrame({self.unit: [u for u, _ in rows], self.column: [v for _, v in rows]})

    def domain_sql(self) -> str:
        return "[" + ", ".join(str(v) for v in self.values) + "]"

    def sql(self, table: str, epsilon: float | None = None) -> str:
        """The audited SQL function call (at the design's ε unless `epsilon` is given)."""
        eps = self.epsilon if epsilon is None else epsilon
        return f"SELECT dp_top_k({self.column}, {self.domain_sql()}, {self.n}, {eps!r}) AS t FROM {table}"

    def controller_sql(self, table: str) -> str:
        """The analyst's top-n query for `audit(..., via="controller", options=self.options)`."""
        return (f"SELECT {self.column} FROM {table} GROUP BY {self.column} ORDER BY COUNT(*) DESC "
                f"LIMIT {self.n}")

    @property
    def options(self) -> dict:
        return {"top_k": "peeling"}

    # -- exact evaluation ---------------------------------------------------------------------
    def mechanism(self, epsilon: float | None = None):
        from ..mechanisms import TopKMechanism

        return TopKMechanism(float(self.epsilon if epsilon is None else epsilon), self.n, 1)

    def event_probabilities(self, epsilon: float | None = None) -> tuple[float, float]:
        """(P_D′, P_D) of the event "Y is not released" (it favours D′), from the closed form of
        the module docstring at the kernel's exact temperature (any number of candidates);
        `epsilon`: the ε the mechanism really runs at (a broken fixture's), default the design's."""
        t = float(self.mechanism(epsilon).temperature)
        return (not_released(t, self.n, self.others, self.gap - 1),
                not_released(t, self.n, self.others, self.gap))

    def exact_probabilities(self, epsilon: float | None = None) -> tuple[float, float]:
        """The same, summed over the ordered outputs of TopKMechanism.probabilities (at most 8
        candidates): an independent check of the closed form."""
        mech = self.mechanism(epsilon)
        self._check_exact()
        pd_, pq = mech.probabilities(self.scores()), mech.probabilities(self.scores_prime())
        return (sum(p for k, p in pq.items() if 0 not in k), sum(p for k, p in pd_.items() if 0 not in k))

    def event_loss(self, epsilon: float | None = None) -> float:
        """The design's exact loss: ln(P_D′(Y not released)/P_D(Y not released))."""
        p, q = self.event_probabilities(epsilon)
        return math.log(p / q)

    def max_loss(self, epsilon: float | None = None) -> float:
        """The largest privacy loss of any event on this pair (the largest |ln P_D(o)/P_D′(o)| over
        the ordered outputs o; at most 8 candidates)."""
        mech = self.mechanism(epsilon)
        self._check_exact()
        pd_, pq = mech.probabilities(self.scores()), mech.probabilities(self.scores_prime())
        return max(abs(math.log(pd_[k] / pq[k])) for k in pd_)

    def expected_certificate(self, samples: int = 10_000, alpha: float = 0.05 / 6,
                             epsilon: float | None = None) -> float:
        """What the event certifies with `samples` held-out runs per side (module docstring)."""
        return expected_certificate(*self.event_probabilities(epsilon), samples, alpha)

    def in_event(self, outputs):
        """Per run (rows of an audit's output matrix, one column per released element): is Y
        missing from the released array?"""
        import numpy as np

        out = np.asarray(outputs, dtype=float)
        return ~np.any(out == 0.0, axis=1)

    def _check_exact(self) -> None:
        if self.others + 1 > EXACT_CANDIDATES:
            raise ValueError(f"the exact evaluation handles at most {EXACT_CANDIDATES} candidates")

    @property
    def ceiling(self) -> float:
        """ε/2: the most any remove-row pair can show (module docstring)."""
        return self.epsilon / 2

    def describe(self) -> str:
        p, q = self.event_probabilities()
        others = (f"value {OTHERS_FROM}" if self.others == 1 else
                  f"{self.others} values {OTHERS_FROM}..{OTHERS_FROM + self.others - 1}")
        return (f"{self.rows} rows: value 0 (Y) {self.base + self.gap} rows, {others} {self.base} row(s) "
                f"each; D′ removes one of Y's rows; "
                f"event 'Y not released' {p:.4g} on D′, {q:.4g} on D (loss {math.log(p / q):.3f}, "
                f"ceiling ε/2 = {self.ceiling:g})")


def top_k_design(n: int, epsilon: float, *, others: int | None = None, gap: int | None = None,
                 base: int = 1, samples: int = 10_000, alpha: float = 0.05 / 6,
                 mechanism_epsilon: float | None = None) -> TopKDesign:
    """The design of the module docstring for `dp_top_k(x, domain, n, epsilon)`: `others` (m ≥ n)
    and `gap` default to the pair, among m = n … n + 3 (at most 7, so that the design fits
    TopKMechanism's exact evaluation, when n ≤ 7) and gap = 1 … 12, whose event certifies the most
    with `samples` held-out runs per side at the level `alpha` of each of the audit's one-sided
    bounds (default: confidence 0.95 split over 6 bounds). `mechanism_epsilon`: choose them for a
    mechanism that really runs at that ε (a broken fixture's) rather than at the claim."""
    if not (isinstance(n, int) and 1 <= n <= 4096):
        raise ValueError("n must be an integer between 1 and 4096")
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError("epsilon must be positive and finite")
    if not (isinstance(base, int) and base >= 1):
        raise ValueError("base must be a positive integer")
    eps_run = float(epsilon if mechanism_epsilon is None else mechanism_epsilon)
    if others is not None and not (isinstance(others, int) and others >= n):
        raise ValueError("others must be an integer ≥ n (Y must be able to stay out of the release)")
    if gap is not None and not (isinstance(gap, int) and gap >= 1):
        raise ValueError("gap must be a positive integer")
    top = max(n, EXACT_CANDIDATES - 1) if n < EXACT_CANDIDATES else n + 3
    m_range = [others] if others is not None else range(n, min(n + 3, top) + 1)
    g_range = [gap] if gap is not None else range(1, 13)
    from ..mechanisms import TopKMechanism

    t = float(TopKMechanism(eps_run, n, 1).temperature)
    best = None
    for m in m_range:
        for g in g_range:
            score = expected_certificate(not_released(t, n, m, g - 1), not_released(t, n, m, g), samples,
                                         alpha)
            if best is None or score > best[0] + 1e-12:
                best = (score, m, g)
    _, m, g = best
    return TopKDesign(n, float(epsilon), m, g, base)
