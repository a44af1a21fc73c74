# Shared by udf/noise.pyx and udf/udf_program.pyx (Cython `include`): declarations of the C
# kernel (udf/dpch_kernel.h) and the exact arbitrary-precision path used when an acceptance test of
# the discrete Gaussian needs more than 128 bits. Both paths implement CKS20 exactly; the slow path
# only differs in using Python integers.

from libc.stdint cimport int64_t, uint64_t

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
                                                               uint64_t tlo, uint64_t s, int64_t *perm)

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
