"""Mechanisms for the audit tests: correct references and DELIBERATELY BROKEN ones.

Every mechanism here is a test fixture. The broken ones exist only so that the auditor can prove
it catches them; several also break DESIGN.md invariant 3 on purpose (numpy floating-point noise)
and must never be used to release anything.

Python mechanisms take (df, n) and return n outputs for the dataset df. SQL fixtures are format
strings over {table} and {eps}.
"""
from __future__ import annotations

import contextlib
import math

import numpy as np

_rng = np.random.default_rng()


# ---------------------------------------------------------------------------------------------
# Correct references
# ---------------------------------------------------------------------------------------------
def discrete_laplace(n: int, scale: float) -> np.ndarray:
    """Reference discrete Laplace, P(k) ∝ exp(−|k|/scale): the difference of two i.i.d.
    geometric variables (CKS20, Sec. 2). numpy randomness: a test reference only."""
    p = 1.0 - math.exp(-1.0 / scale)
    return _rng.geometric(p, n) - _rng.geometric(p, n)


def correct_count(eps: float):
    """Count with discrete Laplace noise of scale 1/ε: ε-DP under add/remove-one-row."""
    def mechanism(df, n):
        return len(df) + discrete_laplace(n, 1.0 / eps)
    mechanism.__name__ = f"correct_count(eps={eps})"
    return mechanism


def correct_clipped_sum(eps: float, lo: float = 0.0, hi: float = 100.0, column: str = "x"):
    """Sum clipped to [lo, hi], rounded to an integer, plus integer discrete Laplace of scale
    (max(|lo|, |hi|) + 1)/ε: ε-DP under add/remove (rounding adds at most 1 to the sensitivity).
    Rounding matters: a raw floating-point sum carries low bits that differ between D and D′, and
    noise on a coarser lattice would not hide them (the auditor catches that through `lowbit`)."""
    def mechanism(df, n):
        total = round(float(np.clip(df[column].to_numpy(dtype=float), lo, hi).sum()))
        return total + discrete_laplace(n, (max(abs(lo), abs(hi)) + 1) / eps)
    mechanism.__name__ = f"correct_clipped_sum(eps={eps})"
    return mechanism


def correct_count_kernel(eps: float):
    """The same count through the project's noise kernel (dpch._noise), when it is built."""
    from dpch import _noise
    from dpch.calibration import laplace_scale

    def mechanism(df, n):
        return _noise.laplace_release_int(np.full(n, len(df), dtype=np.int64), laplace_scale(1.0, eps))
    mechanism.__name__ = f"kernel_count(eps={eps})"
    return mechanism


# ---------------------------------------------------------------------------------------------
# Broken on purpose
# ---------------------------------------------------------------------------------------------
def broken_scale_is_epsilon(eps: float):
    """BROKEN: noise scale ε instead of 1/ε. At claimed ε = 0.5 the scale is 0.5, i.e. the count
    is really 2-DP (a violation); at ε = 1 the bug is invisible, at ε > 1 it adds too much noise."""
    def mechanism(df, n):
        return len(df) + discrete_laplace(n, eps)
    mechanism.__name__ = f"broken_scale_is_epsilon(eps={eps})"
    return mechanism


def broken_half_sensitivity(eps: float, lo: float = 0.0, hi: float = 100.0, column: str = "x"):
    """BROKEN: `correct_clipped_sum` whose scale uses half the true sensitivity ((hi + 1)/2ε
    instead of (hi + 1)/ε), so it is really 2ε-DP."""
    def mechanism(df, n):
        total = round(float(np.clip(df[column].to_numpy(dtype=float), lo, hi).sum()))
        return total + discrete_laplace(n, (max(abs(lo), abs(hi)) + 1) / (2.0 * eps))
    mechanism.__name__ = f"broken_half_sensitivity(eps={eps})"
    return mechanism


def broken_one_sided_clip(eps: float, lo: float = 0.0, hi: float = 100.0, column: str = "x"):
    """BROKEN: clips only the upper side (`min(x, hi)`), so one very negative row moves the sum
    by far more than the sensitivity hi assumed by the noise scale."""
    def mechanism(df, n):
        total = round(float(np.minimum(df[column].to_numpy(dtype=float), hi).sum()))
        return total + discrete_laplace(n, (max(abs(lo), abs(hi)) + 1) / eps)
    mechanism.__name__ = f"broken_one_sided_clip(eps={eps})"
    return mechanism


def naive_float_laplace(value: float, scale: float, n: int) -> np.ndarray:
    """BROKEN (Mironov 2012): textbook inverse-CDF Laplace in floating point,
    value + scale·(−sign(u)·ln(1 − 2|u|)), u uniform on 53-bit doubles. The set of doubles it can
    output depends on `value`: for value 0 every output is scale·(a log), with arbitrary low
    bits; for value Δ the outputs in (−Δ/2, Δ/2) are Δ + (something ≥ Δ/2 in magnitude), exact by
    Sterbenz, hence multiples of ulp(Δ/2): their lowest set bit is never below that. The event
    {lowbit(output) < log2 ulp(Δ/2)} has positive probability on D and probability 0 on D′."""
    u = _rng.random(n) - 0.5
    return value + scale * (-np.sign(u) * np.log1p(-2.0 * np.abs(u)))


def broken_naive_float_sum(eps: float, sensitivity: float = 2.0 ** -20, column: str = "x"):
    """BROKEN: a sum with a tiny scale (values in [0, 2^-20]) released with naive floating-point
    Laplace of the right scale sensitivity/ε — correct on paper, leaky in its low bits."""
    def mechanism(df, n):
        total = float(np.clip(df[column].to_numpy(dtype=float), 0.0, sensitivity).sum())
        return naive_float_laplace(total, sensitivity / eps, n)
    mechanism.__name__ = f"broken_naive_float_sum(eps={eps})"
    return mechanism


# ---------------------------------------------------------------------------------------------
# SQL fixtures (through the real noise UDFs, with wrong calibration)
# ---------------------------------------------------------------------------------------------
SQL_SCALE_IS_EPSILON = "SELECT dpch_laplace_int(toInt64(count()), {eps}) AS n FROM {table}"
"""BROKEN: scale ε instead of 1/ε (violates at ε < 1)."""

SQL_HALF_SENSITIVITY = ("SELECT dpch_laplace(sum(least(greatest(toFloat64(amount), 0.), 500.)), "
                        "250. / {eps}) AS s FROM {table}")
"""BROKEN: sensitivity 250 used for a sum clipped to [0, 500]."""

SQL_ONE_SIDED_CLIP = ("SELECT dpch_laplace(sum(least(toFloat64(amount), 500.)), 500. / {eps}) AS s "
                      "FROM {table}")
"""BROKEN: clipping skipped on the lower side."""


# ---------------------------------------------------------------------------------------------
# Quantiles (dp_median / dp_quantile / dp_quantiles: dpch.mechanisms.QuantileMechanism)
# ---------------------------------------------------------------------------------------------
QUANTILE_BUCKETS = 1 << 16
QUANTILE_SCALE = 1 << 20


def quantile_histogram(values, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    """The sparse histogram of dpch_quantile_histogram: bucket floor((x − lo)/(hi − lo)·2^16)
    clamped to the grid; (ascending keys, counts)."""
    x = np.asarray(values, dtype=float)
    b = np.clip(np.floor((x - lo) / (hi - lo) * QUANTILE_BUCKETS), 0, QUANTILE_BUCKETS - 1)
    keys, counts = np.unique(b.astype(np.int64), return_counts=True)
    return keys, counts


def quantile_midpoint(bucket, lo: float, hi: float):
    """The released value of a bucket (dpch_quantile_value)."""
    return np.clip(lo + (np.asarray(bucket, dtype=float) + 0.5) * ((hi - lo) / QUANTILE_BUCKETS), lo, hi)


def kernel_quantile(levels, eps: float, lo: float, hi: float, column: str = "x"):
    """CORRECT: dp_quantile(s)(x, levels, lo, hi, eps) through the kernel (QuantileMechanism.sample,
    the code path of the SQL functions' UDF): ε-DP under add/remove-one-row. Released on a window
    of the 2^16 grid around the data (its first bucket one below the data's, its last one above):
    the buckets left out are chosen with probability < 1e-12 on the full grid on the audit
    designs, so the window changes the output law by less than that, and a release costs
    microseconds instead of 9 ms."""
    from dpch.mechanisms import QuantileMechanism

    mech = QuantileMechanism(eps)

    def mechanism(df, n):
        keys, counts = quantile_histogram(df[column], lo, hi)
        first = int(keys[0]) - 1
        chosen = mech.sample(keys - first, counts, int(keys[-1]) - first + 2, levels, n)
        return quantile_midpoint(np.asarray(chosen) + first, lo, hi)
    mechanism.__name__ = f"kernel_quantile(levels={levels}, eps={eps})"
    return mechanism


def broken_quantile_argmax(q: float, lo: float, hi: float, eps: float, column: str = "x"):
    """BROKEN: the bucket of the best score, no noise (the exponential mechanism's argmax; ties go
    to the lowest bucket). It claims ε but is deterministic: whenever one removed row moves the
    best bucket, D and D′ are told apart with certainty."""
    a = round(q * QUANTILE_SCALE)

    def mechanism(df, n):
        keys, counts = quantile_histogram(df[column], lo, hi)
        dense = np.zeros(QUANTILE_BUCKETS, dtype=np.int64)
        dense[keys] = counts
        below = np.cumsum(dense) - dense
        above = int(dense.sum()) - below - dense
        score = -np.abs((QUANTILE_SCALE - a) * below - a * above)
        return np.full(n, quantile_midpoint(int(np.argmax(score)), lo, hi))
    mechanism.__name__ = f"broken_quantile_argmax(q={q}, eps={eps})"
    return mechanism


SQL_QUANTILE_HALF_TEMPERATURE = (
    "SELECT arrayElement(arrayMap(b -> dpch_quantile_value(b, {lo}, {hi}), dpch_quantiles("
    "tupleElement(dpch_quantile_histogram(x, {lo}, {hi}), 1), "
    "tupleElement(dpch_quantile_histogram(x, {lo}, {hi}), 2), toUInt32(65536), [{q}], "
    "toFloat64({eps}) * 2, toUInt64(1))), 1) AS v FROM {table}")
"""BROKEN: dp_quantile through the real UDF with the temperature halved (the kernel is asked for
2ε): permute-and-flip at temperature Δ/ε is 2ε-DP, not ε-DP."""


# ---------------------------------------------------------------------------------------------
# Top-k (dp_top_k and the controller's peeling top-n: dpch.mechanisms.TopKMechanism)
# ---------------------------------------------------------------------------------------------
def top_k_scores(values, domain) -> list[int]:
    """dp_top_k's scores: the rows per domain value (values outside the domain count for none)."""
    x = np.asarray(values)
    return [int(np.sum(x == v)) for v in domain]


def kernel_top_k(domain, n: int, eps: float, column: str = "x"):
    """CORRECT: dp_top_k(x, domain, n, eps) through the kernel (TopKMechanism.sample, the code
    path of the UDF dpch_top_k): n rounds of permute-and-flip at temperature 2n/ε, ε-DP under
    add/remove-one-row (and ε/2 under it for these monotone scores: docs/AUDIT.md §9)."""
    from dpch.mechanisms import TopKMechanism

    mech = TopKMechanism(eps, n, 1)
    dom = list(domain)

    def mechanism(df, k):
        chosen = mech.sample(top_k_scores(df[column], dom), k)
        return np.asarray([[dom[i] for i in c] for c in chosen], dtype=float)
    mechanism.__name__ = f"kernel_top_k(n={n}, eps={eps})"
    return mechanism


def broken_top_k_full_epsilon_per_round(domain, n: int, eps: float, column: str = "x"):
    """BROKEN: every round of the peeling at the full ε (temperature 2/ε instead of 2n/ε: the
    kernel asked for n·ε), the ε/n split of sequential composition forgotten. nε-DP in general;
    under remove-row, where one score moves one way, n·ε/2 (docs/AUDIT.md §9), so a violation
    only from n = 3 on."""
    return _renamed(kernel_top_k(domain, n, n * eps, column),
                    f"broken_top_k_full_epsilon_per_round(n={n}, eps={eps})")


def broken_top_k_argmax(domain, n: int, eps: float, column: str = "x"):
    """BROKEN: the n values with the most rows, no noise (ties broken uniformly at random). It
    claims ε but is deterministic up to ties: when one removed row makes the top value tie with
    another, D always releases it and D′ only half of the time."""
    dom = list(domain)

    def mechanism(df, k):
        scores = np.asarray(top_k_scores(df[column], dom), dtype=float)
        out = np.empty((k, min(n, len(dom))))
        for r in range(k):
            order = np.lexsort((_rng.random(len(dom)), -scores))  # by score, ties at random
            out[r] = [dom[i] for i in order[:n]]
        return out
    mechanism.__name__ = f"broken_top_k_argmax(n={n}, eps={eps})"
    return mechanism


def _renamed(mechanism, name: str):
    mechanism.__name__ = name
    return mechanism


SQL_TOP_K_FULL_EPSILON_PER_ROUND = (
    "SELECT arrayMap(i -> {domain}[i + 1], dpch_top_k(arrayMap(d -> toInt64(sumMap(map(x, toUInt64(1)))[d]), "
    "{domain}), toUInt32({n}), toFloat64({eps}) * {n}, toUInt64(1))) AS t FROM {table}")
"""BROKEN: dp_top_k through the real UDF with every round at the full ε (the kernel asked for
n·ε, i.e. temperature 2/ε instead of 2n/ε)."""


# ---------------------------------------------------------------------------------------------
# Bounded Laplace (biswal thesis §5.5; dpch.mechanisms.BoundedLaplaceMechanism)
# ---------------------------------------------------------------------------------------------
def kernel_bounded_count(eps: float, delta: float, lo: float = 0.0, hi: float = 100.0):
    """CORRECT: the row count released inside [lo, hi] by the kernel's bounded Laplace at the scale
    of Thm 5.5.5 on the grid (BoundedLaplaceMechanism.calibrated(1, ε, δ, lo, hi)): (ε, δ)-DP
    under add/remove-one-row."""
    from dpch.mechanisms import BoundedLaplaceMechanism

    mech = BoundedLaplaceMechanism.calibrated(1.0, eps, delta, lo, hi)

    def mechanism(df, n):
        return mech.sample(float(len(df)), n)
    mechanism.__name__ = f"kernel_bounded_count(eps={eps}, delta={delta})"
    return mechanism


def broken_naive_bounded_count(eps: float, lo: float = 0.0, hi: float = 100.0):
    """BROKEN: the naive truncated Laplace: the same kernel sampler with the Laplace scale Δ/ε = 1/ε,
    truncated and renormalised on [lo, hi]. The renormalisation constant depends on the count, so
    at a count at lo it is really (ε + log(C_(lo+1)/C_lo))-DP = 1.49-DP at ε = 1 (Thm 5.5.5's ΔC
    term, which the naive scale ignores)."""
    from dpch.mechanisms import BoundedLaplaceMechanism

    mech = BoundedLaplaceMechanism(1.0 / eps, lo, hi)

    def mechanism(df, n):
        return mech.sample(float(len(df)), n)
    mechanism.__name__ = f"broken_naive_bounded_count(eps={eps})"
    return mechanism


# ---------------------------------------------------------------------------------------------
# Sparse vector (dpch.svt): broken sessions for dpch.audit.svt (docs/AUDIT.md §10)
# ---------------------------------------------------------------------------------------------
def _svt_session(name: str, calibration=None, settle_offset: int = 0):
    """A SparseVector subclass whose calibration is replaced by ``calibration(k, session)`` when Δ
    is fixed (so the session's ρ draw, its test SQL and the audit's fast path all use it), and
    which settles the cell c′ − ``settle_offset``."""
    from dpch.accounting import odp_realized
    from dpch.svt import SparseVector

    class Broken(SparseVector):
        def _prepare(self, sql, options):
            test, new_cal = super()._prepare(sql, options)
            if new_cal is not None and calibration is not None:
                new_cal = calibration(new_cal, self)
            return test, new_cal

        def _settle(self):
            if not settle_offset:
                return super()._settle()
            r = self.receipt
            c1 = max(0, self.positives - settle_offset)
            s = self.conn.ledger.settle(r, odp_realized(r.cost, [c1]), analyst=self.conn.analyst)
            self.conn.ledger.mark(r, "executed")
            return s.realized_epsilon

    Broken.__name__ = Broken.__qualname__ = name
    return Broken


class _NoNoise:
    """A 'mechanism' that adds nothing: sql(v) = v."""

    def sql(self, value_sql: str) -> str:
        return value_sql


def broken_svt_no_threshold_noise():
    """SVT with ρ = 0 (no threshold noise): each ⊥ answer leaks, the class E(S_0) = ε1 and sup E = ε
    fail."""
    import dataclasses

    from dpch.mechanisms import LaplaceMechanism
    from dpch.svt import SvtCalibration

    @dataclasses.dataclass(frozen=True)
    class NoRho(SvtCalibration):
        def mechanisms(self):
            return _NoNoise(), LaplaceMechanism(self.b2, True)

    return _svt_session("SvtNoThresholdNoise", lambda k, s: NoRho(**dataclasses.asdict(k)))


def broken_svt_answer_noise_delta_over_eps2():
    """SVT with ν at the scale Δ/ε2 instead of 2cΔ/ε2."""
    import dataclasses

    from dpch.mechanisms import LaplaceMechanism

    def cal(k, s):
        b2 = k.sensitivity_units / s.epsilon2
        return dataclasses.replace(k, b2=b2, tau2=LaplaceMechanism(b2, True).noise_scale_units)
    return _svt_session("SvtAnswerNoiseDeltaOverEps2", cal)


def broken_svt_settles_one_less():
    """SVT that settles the cell c′ − 1 for a run with c′ ⊤ answers (under-reports the realised ε;
    the reservation sup E = ε is unchanged)."""
    return _svt_session("SvtSettlesOneLess", settle_offset=1)


def correct_svt():
    """The real session class (for symmetry with the broken ones)."""
    from dpch.svt import SparseVector
    return SparseVector


# ---------------------------------------------------------------------------------------------
# Block-DP (dpch.mechanisms.block): deliberately broken calibrations
# ---------------------------------------------------------------------------------------------
def broken_block_dp1_per_row_scale(lo: float, hi: float, blocks: int, max_rows: int, statistic: str, eps: float):
    """Block-DP I calibrated as if a unit touched ONE value block (the thesis's Thm 5.4.2 proof at
    user level): per-block Laplace at laplace_scale(w, ε) although a unit's max_rows rows may fall
    in min(max_rows, m) blocks. Its privacy_function still claims ε (it reports touched = 1)."""
    from dpch import calibration as cal
    from dpch.mechanisms.block import BlockDP1Mechanism, block_edges, max_block_width

    class PerRowBlockDP1(BlockDP1Mechanism):
        @property
        def touched(self) -> int:
            return 1

    w = max_block_width(block_edges(lo, hi, blocks))
    return PerRowBlockDP1(lo, hi, blocks, max_rows, "add_remove", statistic, cal.laplace_scale(w, eps))


def broken_block_dp2_row_blocks(entry):
    """Block-DP II with blocks by row hash instead of by unit (the catalog entry seen as row level):
    a unit's rows spread over several blocks, while the noise is calibrated for one (Λ0/m)."""
    import dataclasses

    return dataclasses.replace(entry, privacy_unit=None)


# ---------------------------------------------------------------------------------------------
# Propose-test-release (dpch.ptr): run classes with a deliberately broken noisy test
# ---------------------------------------------------------------------------------------------
def _ptr_run(name: str, test_sql):
    """A PtrRun whose noisy tests render ``test_sql(test, statistic_sql)`` instead of the noisy
    comparison (same thresholds, same releases, same declared cells)."""
    import dataclasses

    from dpch.ptr import NoisyTest, PtrRun

    class BrokenTest(NoisyTest):
        def sql(self, statistic_sql: str) -> str:
            return test_sql(self, statistic_sql)

    class BrokenRun(PtrRun):
        def make_test(self, epsilon, delta, bad_at_most):
            t = NoisyTest.make(epsilon, delta, bad_at_most)
            return BrokenTest(*[getattr(t, f.name) for f in dataclasses.fields(t)])

    BrokenRun.__name__ = BrokenRun.__qualname__ = name
    return BrokenRun


def broken_ptr_release_without_test():
    """Releases the noisy statistic whatever its distance to instability (the test always passes)."""
    return _ptr_run("PtrReleaseWithoutTest", lambda t, s: "toUInt8(1)")


def broken_ptr_test_without_noise():
    """Compares the distance to instability with the threshold without noise."""
    return _ptr_run("PtrTestWithoutNoise", lambda t, s: f"toUInt8(toInt64({s}) >= {t.threshold})")


# ---------------------------------------------------------------------------------------------
# Mixed noise (biswal thesis §5.3; dpch.mechanisms.MixedNoiseMechanism)
# ---------------------------------------------------------------------------------------------
def _mixed_sum_sql(mech, column: str, sensitivity: float) -> str:
    """SUM(column) clipped to [0, Δ], released by ``mech.sql`` (the branch's UDF call)."""
    value = f"sum(least(greatest(toFloat64({column}), 0.), {float(sensitivity)!r}))"
    return f"SELECT {mech.sql(value)} AS s FROM {{table}}"


def sql_broken_thesis_mnm_sum(sensitivity: float, eps: float, delta: float, column: str = "x") -> str:
    """BROKEN: SUM(column) clipped to [0, Δ] released by the thesis's own MNM (Alg. 5.3.6, Thm 5.3.2:
    MixedNoiseMechanism.thesis(Δ, ε, δ)): for Δ <= t0 = √π·δ·ε/2 the Gaussian branch at
    σ = √2·Δ/ε, whatever Δ. Its δ at ε is the Gaussian mechanism's at Δ/σ = ε/√2 (Balle & Wang
    2018, Thm 8): 0.0396 at ε = 1, not the claimed δ (docs/NOISE.md, "Mixed noise"). The fixture
    refuses parameters where it would not take that branch."""
    from dpch.mechanisms import MixedNoiseMechanism

    mech = MixedNoiseMechanism.thesis(sensitivity, eps, delta)
    if not mech.uses_gaussian:
        raise ValueError("sql_broken_thesis_mnm_sum: Δ > t0, the thesis's MNM takes its (sound) Laplace branch")
    return _mixed_sum_sql(mech, column, sensitivity)


def broken_thesis_mnm_sum(sensitivity: float, eps: float, delta: float, column: str = "x"):
    """BROKEN: the Python twin of sql_broken_thesis_mnm_sum (MixedNoiseMechanism.thesis(...).sample,
    the kernel's dpch_gaussian at σ = √2·Δ/ε)."""
    from dpch.mechanisms import MixedNoiseMechanism

    mech = MixedNoiseMechanism.thesis(sensitivity, eps, delta)
    if not mech.uses_gaussian:
        raise ValueError("broken_thesis_mnm_sum: Δ > t0, the thesis's MNM takes its (sound) Laplace branch")

    def mechanism(df, n):
        return mech.sample(float(np.clip(df[column].to_numpy(dtype=float), 0.0, sensitivity).sum()), n)
    mechanism.__name__ = f"broken_thesis_mnm_sum(eps={eps}, delta={delta})"
    return mechanism


# ---------------------------------------------------------------------------------------------
# Early stopping (dpch.early_stop, db.refine): broken refinements for dpch.audit.early_stop
# ---------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _patched(module, name: str, value):
    """Replace ``module.name`` for the duration of a with-block (refine, its settlement probe and the
    audit's fast path all look the attribute up at call time, so all of them use the broken one)."""
    old = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, old)


def broken_refine_settles_one_less():
    """BROKEN: refine settles the cell of k − 1 steps (at least one) after k steps ran: it charges
    ε_step less than Lemma 11's E(P_k) = k·ε_step for every run of two steps or more; the
    reservation k_n·ε_step (sup E) is unchanged. A context manager."""
    from dpch import early_stop as es

    settle = es._settle

    def settle_one_less(conn, ledger, receipt, steps, odp):
        return settle(conn, ledger, receipt, max(1, steps - 1), odp)
    return _patched(es, "_settle", settle_one_less)


def broken_refine_half_scale():
    """BROKEN: every step's discrete Laplace at half the calibrated scale (τ = Δ/(2ε_step)): each
    step is 2ε_step-DP while refine reserves and settles k·ε_step; refine's fail-closed relation
    check is switched off so that it runs at all. A context manager."""
    from dpch import early_stop as es
    from dpch.mechanisms import LaplaceMechanism

    class HalfScale(LaplaceMechanism):
        @classmethod
        def calibrated(cls, sensitivity, epsilon, integer=False):
            return cls(LaplaceMechanism.calibrated(sensitivity, epsilon, integer).scale / 2.0, integer)

        def privacy_relation(self, sensitivity, epsilon):
            return True

    return _patched(es, "LaplaceMechanism", HalfScale)


# ---------------------------------------------------------------------------------------------
# Auto bounds (issue 29; tests/test_audit_auto_bounds.py)
# ---------------------------------------------------------------------------------------------
def broken_auto_bound_from_true_max(eps: float, unit: str = "user"):
    """BROKEN: chooses the bound M "from the data" without noise: the smallest √2-grid edge at or
    above the true largest number of rows of one unit (dpch.plan.profile.GRID). Removing the
    heaviest unit moves M deterministically: not ε-DP for any ε."""
    from dpch.plan.profile import GRID

    def mechanism(df, n):
        top = int(df.groupby(unit).size().max()) if len(df) else 1
        return np.full(n, float(min(e for e in GRID if e >= top) if top <= GRID[-1] else GRID[-1]))
    mechanism.__name__ = f"broken_auto_bound_from_true_max(eps={eps})"
    return mechanism
