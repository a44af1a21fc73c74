# Shared by udf/noise.pyx and udf/udf_program.pyx (Cython `include`): declarations of the C
# kernel (udf/dpch_kernel.h) and the exact arbitrary-precision path used when an acceptance test of
# the discrete Gaussian needs more than 128 bits. Both paths implement CKS20 exactly; the slow path
# only differs in using Python integers.

from libc.stdint cimport INT64_MAX, int64_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc

cdef extern from "dpch_kernel.h" nogil:
    int dpch_rng_init()
    uint64_t dpch_u64()
    uint64_t dpch_rng_bytes_used()
    unsigned dpch_bit()
    uint64_t dpch_uniform(uint64_t n)
    int dpch_bern_frac64(uint64_t a, uint64_t b)
    int dpch_bern_exp1()
    int dpch_bern_exp_small64(uint64_t a, uint64_t b)
    int dpch_bern_exp_words(uint64_t nhi, uint64_t nlo, uint64_t dhi, uint64_t dlo)
    int64_t dpch_dlap(uint64_t t, unsigned shift, uint64_t s_div)
    int64_t dpch_permute_flip_words(const int64_t *u, int64_t n, uint64_t thi,
                                                               uint64_t tlo, uint64_t s)
    int64_t dpch_top_k_words(const int64_t *u, int64_t m, int64_t n, uint64_t thi, uint64_t tlo,
                             uint64_t s, unsigned char *taken, int64_t *out)
    ctypedef struct dpch_qscore:
        const uint32_t *keys
        const uint64_t *cum
        int64_t m
        uint64_t d0
        uint64_t d1
        uint64_t base
        uint64_t top
        uint64_t a
        uint64_t q
    uint64_t dpch_hist_below(const uint32_t *keys, const uint64_t *cum, int64_t m, uint64_t x)
    int64_t dpch_select_index(const uint64_t *hi, const uint64_t *lo, int64_t length)
    uint64_t dpch_quantile_pf_words(const dpch_qscore *z, uint64_t c0, uint64_t c1, uint64_t thi,
                                    uint64_t tlo, uint64_t s)

    ctypedef struct dpch_dg:
        uint64_t S
        unsigned q
        uint64_t t
        int fast
        uint64_t pending
        int pending_neg
    int DPCH_SLOW
    void dpch_dg_init(dpch_dg *g, uint64_t S, unsigned q)
    int dpch_dg_sample(dpch_dg *g, int64_t *out)

    ctypedef struct dpch_params:
        int k
        uint64_t num
        unsigned den_log2
    int dpch_ceil_log2(double x)
    int dpch_check_scale(double x)
    void dpch_params_compute(double scale, int bits, int integer, dpch_params *out)
    double dpch_grid_round(double v, int k)
    double dpch_combine_f64(double m, int64_t noise, int k, double v)
    int64_t dpch_grid_round_i64(int64_t v, int k)
    int64_t dpch_combine_i64(int64_t m, int64_t noise, int k)
    # bounded Laplace (thesis §5.5; dpch.mechanisms.BoundedLaplaceMechanism)
    int dpch_bounded_grid(double lo, double hi, int k, double *glo, double *ghi)
    double dpch_bounded_release(double v, double lo, double hi, double glo, double ghi, int k,
                                uint64_t t, unsigned shift, uint64_t K)
    int64_t dpch_bounded_units(int64_t c, int64_t n, uint64_t t, unsigned shift, uint64_t K)

# Grid sizes of docs/NOISE.md
cdef enum:
    LAPLACE_BITS = 40
    GAUSSIAN_BITS = 20

if dpch_rng_init() != 0:
    raise ImportError("dpch noise kernel: cannot register the fork handler for the CSPRNG buffer")


cdef int _bern_frac_big(object a, object b) except -1:
    """Bernoulli(a/b) for Python ints 0 <= a, 1 <= b: lazy comparison of random bits with the
    binary expansion of a/b (same method as dpch_bern_frac64)."""
    cdef unsigned d, v
    if a >= b:
        return 1
    if a <= 0:
        return 0
    r = a
    while True:
        r <<= 1
        if r >= b:
            d = 1
            r -= b
        else:
            d = 0
        v = dpch_bit()
        if v != d:
            return 1 if v < d else 0
        if r == 0:
            return 0


cdef int _bern_exp_big(object n, object d) except -1:
    """Bernoulli(exp(-n/d)) for Python ints n >= 0, d >= 1 (CKS20 Alg. 1 with the gamma > 1
    split: floor(gamma) Bernoulli(exp(-1)) trials, then Alg. 1 on the fractional part)."""
    cdef uint64_t k = 1
    g, r = divmod(n, d)
    while g > 0:
        if not dpch_bern_exp1():
            return 0
        g -= 1
    while True:
        if k > 1 and not dpch_bern_frac64(1, k):
            break
        if not _bern_frac_big(r, d):
            break
        k += 1
    return <int>(k & 1)


cdef int _dg_draw(dpch_dg *g, int64_t *out) except -1:
    """One discrete Gaussian sample (CKS20 Alg. 3); finishes acceptance tests that do not fit 128
    bits with exact Python-int arithmetic."""
    cdef int64_t v
    while True:
        if dpch_dg_sample(g, &v) == 0:
            out[0] = v
            return 0
        y = <object>g.pending
        S = <object>g.S
        t = <object>g.t
        four_q = 1 << (2 * <object>g.q)
        a = y * t * four_q - S * S
        if _bern_exp_big(a * a, 2 * S * S * t * t * four_q):
            if g.pending_neg:
                out[0] = -(<int64_t>(g.pending - 1)) - 1
            else:
                out[0] = <int64_t>g.pending
            return 0


# ------------------------------------------------------------------------------------------------
# Quantiles over a fixed grid (docs/NOISE.md "Quantiles")
# ------------------------------------------------------------------------------------------------

#: Quantile levels are rounded to multiples of 1/QUANTILE_Q, so that scores are integers.
QUANTILE_Q = 1 << 20
#: Largest total count of a histogram: keeps (Q - a) L - a G below 2^63.
QUANTILE_MAX_TOTAL = 1 << 42


def quantile_levels(alphas):
    """The quantile levels as integers a of a/QUANTILE_Q (round to nearest), raising ValueError
    naming the problem for a level outside [0, 1] or not finite."""
    out = []
    for x in alphas:
        v = float(x)
        if not (0.0 <= v <= 1.0):
            raise ValueError("quantile levels must be finite numbers in [0, 1]")
        out.append(int(round(v * QUANTILE_Q)))
    if not out:
        raise ValueError("at least one quantile level is needed")
    return out


cdef list _quantile_buckets(const uint32_t *keys, const uint64_t *cum, int64_t m, uint64_t buckets,
                            list levels, double eps, uint64_t rows):
    """The buckets chosen for the quantile levels a/Q (`levels`, ints), in their order, jointly
    eps-DP when one privacy unit holds at most `rows` rows of the histogram.

    Three or more distinct levels: Kaplan, Schnapp & Stemmer (2022), ApproximateQuantiles: the
    middle level is chosen by permute-and-flip over all buckets, then the levels below it over the
    buckets up to it with the data below it, those above over the buckets from it with the data
    above it, recursively. A row is in the data of at most one sub-problem per depth, so each depth
    is eps/depth-DP (parallel composition) and the whole eps-DP over depth = bit_length(#levels)
    depths (sequential composition). Each sub-problem's score has sensitivity
    rows * max(a', Q - a'), a'/Q its level relative to the sub-problem; the temperature is
    calibration.em_temperature(that * depth, eps).

    Exactly two distinct levels: the recursion would have depth 2 as well, so each level is
    released on its own instead, by permute-and-flip over all buckets with all the rows at its own
    level a (sensitivity rows * max(a, Q - a), temperature em_temperature(that * 2, eps)): eps/2-DP
    each, eps-DP together (sequential composition), the same cost without carrying the first
    level's error into the second. The two buckets are then sorted, so the output is monotone in
    the level (post-processing). One level: the first case with depth 1.
    """
    from dpch.calibration import em_temperature

    cdef list uniq = sorted(set(levels))
    cdef int depth = len(uniq).bit_length()
    cdef dict chosen = {}
    cdef dpch_qscore z
    z.keys = keys
    z.cum = cum
    z.m = m
    z.q = QUANTILE_Q
    if len(uniq) == 2:
        z.d0, z.d1 = 0, buckets - 1
        z.base = dpch_hist_below(keys, cum, m, 0)
        z.top = dpch_hist_below(keys, cum, m, buckets)
        pair = []
        for a in uniq:
            t, s = em_temperature(rows * max(a, QUANTILE_Q - a) * 2, eps)
            z.a = a
            pair.append(dpch_quantile_pf_words(&z, 0, buckets - 1, t >> 64, t & 0xFFFFFFFFFFFFFFFF, s))
        pair.sort()
        chosen = dict(zip(uniq, pair))
        return [chosen[a] for a in levels]
    # (candidate buckets c0..c1, data buckets d0..d1 (empty if d0 > d1), level indices lo..hi-1,
    #  the levels of the sub-problem's ends)
    stack = [(0, buckets - 1, 0, buckets - 1, 0, len(uniq), 0, QUANTILE_Q)]
    while stack:
        c0, c1, d0, d1, lo, hi, end_lo, end_hi = stack.pop()
        if lo >= hi:
            continue
        j = (lo + hi) // 2
        num = (uniq[j] - end_lo) * QUANTILE_Q
        width = end_hi - end_lo
        a = (2 * num + width) // (2 * width)  # round(num / width)
        t, s = em_temperature(rows * max(a, QUANTILE_Q - a) * depth, eps)
        if d0 > d1:
            z.d0, z.d1 = 1, 0
            z.base = z.top = 0
        else:
            z.d0, z.d1 = d0, d1
            z.base = dpch_hist_below(keys, cum, m, d0)
            z.top = dpch_hist_below(keys, cum, m, d1 + 1)
        z.a = a
        b = dpch_quantile_pf_words(&z, c0, c1, t >> 64, t & 0xFFFFFFFFFFFFFFFF, s)
        chosen[uniq[j]] = b
        stack.append((c0, b, d0, b - 1, lo, j, end_lo, uniq[j]))
        stack.append((b, c1, b + 1, d1, j + 1, hi, uniq[j], end_hi))
    return [chosen[a] for a in levels]


#: The largest grid the quantile kernel accepts (a release visits every bucket).
QUANTILE_MAX_BUCKETS = 1 << 24


cdef str _histogram_problem(const uint32_t *keys, const uint64_t *counts, int64_t m,
                            uint64_t buckets, uint64_t *cum):
    """Checks a sparse histogram and fills cum[0..m] (cum[i] = counts of keys[0..i)). Returns the
    problem (naming the argument, never a value) or None."""
    cdef int64_t i
    cdef uint64_t total = 0
    if buckets < 1 or buckets > QUANTILE_MAX_BUCKETS:
        return f"buckets must be between 1 and {QUANTILE_MAX_BUCKETS}"
    cum[0] = 0
    for i in range(m):
        if keys[i] >= buckets:
            return "a bucket index is outside the grid"
        if i > 0 and keys[i] <= keys[i - 1]:
            return "bucket indices must be strictly ascending"
        if counts[i] > QUANTILE_MAX_TOTAL - total:
            return f"the histogram's total count must be below 2^42"
        total += counts[i]
        cum[i + 1] = total
    return None


cdef object _quantile_parameters(double eps, uint64_t rows, uint64_t buckets):
    """The problem with the privacy parameters, or None."""
    if not (eps > 0.0 and eps < float("inf")):
        return "epsilon must be a finite number > 0"
    if rows < 1 or rows > (1 << 20):
        return "rows per unit must be between 1 and 2^20"
    return None


# ------------------------------------------------------------------------------------------------
# Partition selection by the optimal rule (dpch/partition_selection.py, docs/CONTROLLER.md)
# ------------------------------------------------------------------------------------------------

cdef class _SelectionTable:
    """The optimal rule's table at (epsilon, delta) in the kernel's layout: A_j as (hi, lo) words,
    and the offset t of the released count (v = n - J + t; released iff v >= t)."""
    cdef bytes hi
    cdef bytes lo
    cdef const uint64_t *hip
    cdef const uint64_t *lop
    cdef int64_t length
    cdef int64_t offset

    def __cinit__(self, table):
        from array import array
        self.hi = array("Q", [a >> 64 for a in table.cdf]).tobytes()
        self.lo = array("Q", [a & 0xFFFFFFFFFFFFFFFF for a in table.cdf]).tobytes()
        self.hip = <const uint64_t *><const char *>self.hi
        self.lop = <const uint64_t *><const char *>self.lo
        self.length = len(table.cdf)
        self.offset = table.offset

    cdef inline int64_t draw(self, int64_t n):
        """The released count n - J + t for n >= 0 (saturating; J <= 2^20, t <= 2^20)."""
        cdef int64_t j = dpch_select_index(self.hip, self.lop, self.length)
        cdef int64_t shift = self.offset - j
        if shift > 0 and n > INT64_MAX - shift:
            return INT64_MAX
        return n + shift

    def draws(self, int64_t n, Py_ssize_t size):
        """`size` independent released counts for a group of n >= 0 units (tests)."""
        if n < 0:
            raise ValueError("the count of units must be >= 0")
        return [self.draw(n) for _ in range(size)]

    @property
    def threshold(self):
        """t: the group is released iff its released count is >= t."""
        return self.offset


def selection_table(double epsilon, double delta):
    """The kernel's table for the optimal rule at (epsilon, delta) (raises ValueError naming the
    parameter when the rule cannot be used)."""
    from dpch.partition_selection import optimal_table
    return _SelectionTable(optimal_table(epsilon, delta))


# ------------------------------------------------------------------------------------------------
# Noisy top-n by peeling permute-and-flip (dpch.mechanisms.TopKMechanism, docs/NOISE.md "Top-k")
# ------------------------------------------------------------------------------------------------

#: At most this many candidates and rounds (a release flips about m * n coins).
TOP_K_MAX_CANDIDATES = 1 << 22
TOP_K_MAX_ROUNDS = 1 << 12
#: Scores are integers below 2^62 in absolute value, so every gap is below 2^63.
TOP_K_MAX_SCORE = 1 << 62
TOP_K_MAX_SENSITIVITY = 1 << 62


cdef object _top_k_problem(const int64_t *u, int64_t m, int64_t n, double eps, uint64_t sens):
    """The problem with a top-n release's input (naming the argument, never a value), or None."""
    cdef int64_t i
    if m > TOP_K_MAX_CANDIDATES:
        return f"at most {TOP_K_MAX_CANDIDATES} candidate scores"
    if n < 1 or n > TOP_K_MAX_ROUNDS:
        return f"n must be between 1 and {TOP_K_MAX_ROUNDS}"
    if not (eps > 0.0 and eps < float("inf")):
        return "epsilon must be a finite number > 0"
    if sens < 1 or sens > TOP_K_MAX_SENSITIVITY:
        return "sensitivity must be between 1 and 2^62"
    for i in range(m):
        if u[i] >= TOP_K_MAX_SCORE or u[i] <= -TOP_K_MAX_SCORE:
            return "scores must be below 2^62 in absolute value"
    return None


cdef list _top_k(const int64_t *u, int64_t m, int64_t n, double eps, uint64_t sens):
    """Indices of the n candidates chosen by n rounds of permute-and-flip over the ones not chosen
    yet, in the order chosen (all m when m <= n), each round at temperature
    calibration.em_temperature(sens * n, eps) = 2 * sens * n / eps rounded up: (eps/n)-DP per round
    for scores of sensitivity `sens` (McKenna & Sheldon 2020, Thm 1), eps-DP in all (sequential
    composition). Checked input only (_top_k_problem)."""
    from dpch.calibration import em_temperature

    if m == 0:
        return []
    t, s = em_temperature(sens * n, eps)
    cdef unsigned char *taken = <unsigned char *>malloc(m)
    cdef int64_t *out = <int64_t *>malloc(8 * (n if n < m else m))
    cdef int64_t got, i
    cdef uint64_t thi = t >> 64, tlo = t & 0xFFFFFFFFFFFFFFFF, sv = s
    try:
        if taken == NULL or out == NULL:
            raise MemoryError()
        with nogil:
            got = dpch_top_k_words(u, m, n, thi, tlo, sv, taken, out)
        return [out[i] for i in range(got)]
    finally:
        free(taken)
        free(out)
