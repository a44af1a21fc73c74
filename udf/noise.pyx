# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""DPCH noise kernel (`dpch._noise`): OS-CSPRNG randomness and exact integer samplers.

Randomness comes only from getrandom(2), buffered 64 KiB at a time (udf/dpch_kernel.h); there is no
userspace PRNG, no numpy/Python `random`, no floating-point `log(uniform)`.

Samplers (Canonne, Kamath & Steinke 2020, "The Discrete Gaussian for Differential Privacy",
CKS20): Bernoulli(exp(-gamma)) for rational gamma (Alg. 1 with the gamma > 1 split), discrete
Laplace with rational scale t/s (Alg. 2) and discrete Gaussian with rational sigma = S/2^q
(Alg. 3). All arithmetic is on integers (uint64 / unsigned __int128, and exact Python integers when
an acceptance test needs more than 128 bits), so the output distributions are exactly the stated
ones. The release functions implement docs/NOISE.md (grids, rationals, rounding) exactly; that file
is the binding specification and states the privacy relation of each release.

Every function raises ValueError naming the argument at fault (never a data value) for bad inputs.
"""
include "kernel.pxi"

import operator
from collections import namedtuple

import numpy as np

from libc.math cimport isfinite, isnan, ldexp
from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC

__all__ = [
    "NoiseParameters",
    "bernoulli_exp",
    "bounded_laplace_release",
    "bounded_laplace_units",
    "discrete_gaussian",
    "discrete_laplace",
    "gaussian_parameters",
    "gaussian_release",
    "gaussian_release_int",
    "grid",
    "laplace_parameters",
    "laplace_release",
    "laplace_release_int",
    "permute_and_flip",
    "quantile_buckets",
    "random_u64",
    "round_to_grid",
    "round_to_grid_int",
    "rng_bytes_used",
    "timed_discrete_gaussian",
    "timed_discrete_laplace",
    "top_k",
    "uniform",
]

LAPLACE_GRID_BITS = LAPLACE_BITS
GAUSSIAN_GRID_BITS = GAUSSIAN_BITS

#: Release parameters of docs/NOISE.md: grid r = 2**granularity_log2 (`granularity` is r as a
#: float, 0.0 if it underflows), noise scale num/den in grid units (Laplace: t/s, Gaussian: S/2^q).
NoiseParameters = namedtuple("NoiseParameters", "granularity_log2 granularity num den")



# --------------------------------------------------------------------------------------------
# argument checking (messages name the argument, never a data value)
# --------------------------------------------------------------------------------------------

cdef object _int_arg(str fn, str name, object x, object lo):
    try:
        v = operator.index(x)
    except TypeError:
        raise ValueError(f"{fn}: {name} must be an integer") from None
    if v < lo:
        raise ValueError(f"{fn}: {name} must be >= {lo}")
    return v


cdef double _scale_arg(str fn, str name, object x) except? -1.0:
    cdef double v
    try:
        v = float(x)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{fn}: {name} must be a finite number > 0") from None
    cdef int code = dpch_check_scale(v)
    if code == 1:
        raise ValueError(f"{fn}: {name} is NaN")
    if code == 2:
        raise ValueError(f"{fn}: {name} is infinite")
    if code == 3:
        raise ValueError(f"{fn}: {name} must be > 0")
    return v


cdef object _float_values(str fn, object values):
    arr = np.asarray(values)
    if arr.dtype.kind not in "fiub":
        raise ValueError(f"{fn}: values must be numeric")
    arr = np.ascontiguousarray(arr, dtype=np.float64)
    cdef const double[::1] flat = arr.reshape(-1)
    cdef Py_ssize_t i
    for i in range(flat.shape[0]):
        if not isfinite(flat[i]):
            what = "NaN" if isnan(flat[i]) else "infinite"
            raise ValueError(f"{fn}: value is {what} (index {i})")
    return arr


cdef object _int_values(str fn, object values):
    arr = np.asarray(values)
    if arr.dtype.kind not in "iub":
        raise ValueError(f"{fn}: values must be integers (Int64)")
    if arr.dtype.kind == "u" and arr.size and arr.max() > np.iinfo(np.int64).max:
        raise ValueError(f"{fn}: value out of the Int64 range")
    return np.ascontiguousarray(arr, dtype=np.int64)


# --------------------------------------------------------------------------------------------
# raw randomness and the basic samplers
# --------------------------------------------------------------------------------------------

def random_u64(n):
    """`n` uniformly random 64-bit words straight from the getrandom(2) buffer (uint64 array).
    For tests of the CSPRNG plumbing (e.g. that a forked child does not repeat its parent)."""
    cdef Py_ssize_t count = _int_arg("random_u64", "n", n, 0)
    out = np.empty(count, dtype=np.uint64)
    cdef uint64_t[::1] o = out
    cdef Py_ssize_t i
    for i in range(count):
        o[i] = dpch_u64()
    return out


def rng_bytes_used():
    """Bytes of OS randomness this module has consumed so far (for benchmarks)."""
    return int(dpch_rng_bytes_used())


def uniform(m, n):
    """`n` independent uniform integers in [0, m), 1 <= m < 2^64, by rejection sampling on
    ceil(log2 m) random bits (no modulo bias). Returns a uint64 array."""
    cdef object mm = _int_arg("uniform", "m", m, 1)
    if mm >= (1 << 64):
        raise ValueError("uniform: m must be < 2^64")
    cdef uint64_t mv = mm
    cdef Py_ssize_t count = _int_arg("uniform", "n", n, 0)
    out = np.empty(count, dtype=np.uint64)
    cdef uint64_t[::1] o = out
    cdef Py_ssize_t i
    for i in range(count):
        o[i] = dpch_uniform(mv)
    return out


def bernoulli_exp(num, den, n):
    """`n` independent exact samples of Bernoulli(exp(-num/den)) (bool array), num >= 0, den >= 1
    integers. CKS20 Alg. 1: for gamma = num/den <= 1, K counts successive Bernoulli(gamma/K)
    successes and the result is [K odd]; for gamma > 1, floor(gamma) Bernoulli(exp(-1)) trials
    followed by Alg. 1 on the fractional part. Bernoulli(a/b) compares random bits with the binary
    expansion of a/b, so every probability is exact."""
    cdef object nn = _int_arg("bernoulli_exp", "num", num, 0)
    cdef object dd = _int_arg("bernoulli_exp", "den", den, 1)
    cdef Py_ssize_t count = _int_arg("bernoulli_exp", "n", n, 0)
    out = np.empty(count, dtype=np.bool_)
    cdef unsigned char[::1] o = out.view(np.uint8)
    cdef Py_ssize_t i
    cdef uint64_t nhi, nlo, dhi, dlo
    mask = (1 << 64) - 1
    if nn < (1 << 128) and dd < (1 << 127):
        nhi = nn >> 64
        nlo = nn & mask
        dhi = dd >> 64
        dlo = dd & mask
        for i in range(count):
            o[i] = dpch_bern_exp_words(nhi, nlo, dhi, dlo)
    else:
        for i in range(count):
            o[i] = _bern_exp_big(nn, dd)
    return out


def discrete_laplace(t, s, n):
    """`n` exact samples of the discrete Laplace distribution with scale t/s (int64 array):
    Pr[X = x] = (e^(s/t) - 1)/(e^(s/t) + 1) * exp(-|x| s/t), sampled by CKS20 Alg. 2.

    Privacy: adding X to an integer-valued query with L1 sensitivity D is (D*s/t)-DP (the
    geometric mechanism; CKS20 Sec. 2 / Alg. 2).

    Domain: integers 1 <= t < 2^63, s >= 1 a power of two (any size) or any integer < 2^64, and
    t/s <= 2^50 so that int64 holds every sample except with probability below exp(-2^12)
    (a sample beyond int64 saturates)."""
    cdef object tt = _int_arg("discrete_laplace", "t", t, 1)
    cdef object ss = _int_arg("discrete_laplace", "s", s, 1)
    cdef Py_ssize_t count = _int_arg("discrete_laplace", "n", n, 0)
    if tt >= (1 << 63):
        raise ValueError("discrete_laplace: t must be < 2^63")
    if tt > ss * (1 << 50):
        raise ValueError("discrete_laplace: scale t/s must be <= 2^50")
    cdef unsigned shift = 0
    cdef uint64_t s_div = 0
    if ss & (ss - 1) == 0:
        shift = ss.bit_length() - 1
    elif ss < (1 << 64):
        s_div = ss
    else:
        raise ValueError("discrete_laplace: s must be a power of two or < 2^64")
    cdef uint64_t tv = tt
    out = np.empty(count, dtype=np.int64)
    cdef int64_t[::1] o = out
    cdef Py_ssize_t i
    for i in range(count):
        o[i] = dpch_dlap(tv, shift, s_div)
    return out


def permute_and_flip(scores, t, s, n):
    """`n` independent draws of the exponential mechanism by permute-and-flip (McKenna & Sheldon
    2020, Alg. 1) over integer `scores` (int64 array-like, at least one) at temperature t/s
    (integers, 1 <= t < 2^127, 1 <= s < 2^64): the candidates are visited in a uniformly random
    order and candidate r is accepted with probability exp(-(max(scores) - scores[r]) * s / t),
    decided exactly (CKS20 Alg. 1 on the rational (gap * s) / t); a maximiser is always accepted.
    Drawn in the equivalent form "every candidate's coin, then a uniform success", so the work does
    not depend on the scores (udf/dpch_kernel.h, dpch_pf_flip). Returns the chosen indices.

    Privacy: if every score moves by at most D between neighbouring datasets and t/s >= 2D/eps,
    the released index is eps-DP (McKenna & Sheldon, Thm. 1); its error is never worse than the
    exponential mechanism's at the same eps (their Thm. 2)."""
    cdef object tt = _int_arg("permute_and_flip", "t", t, 1)
    cdef object ss = _int_arg("permute_and_flip", "s", s, 1)
    cdef Py_ssize_t count = _int_arg("permute_and_flip", "n", n, 0)
    if tt >= (1 << 127):
        raise ValueError("permute_and_flip: t must be < 2^127")
    if ss >= (1 << 64):
        raise ValueError("permute_and_flip: s must be < 2^64")
    arr = np.ascontiguousarray(scores, dtype=np.int64).reshape(-1)
    cdef Py_ssize_t m = arr.shape[0]
    if m < 1:
        raise ValueError("permute_and_flip: at least one candidate is needed")
    if m > 1 and int(arr.max()) - int(arr.min()) >= (1 << 64):
        raise ValueError("permute_and_flip: scores must span less than 2^64")
    cdef const int64_t[::1] u = arr
    out = np.empty(count, dtype=np.int64)
    cdef int64_t[::1] o = out
    cdef uint64_t thi = tt >> 64, tlo = tt & ((1 << 64) - 1), sv = ss
    cdef Py_ssize_t i
    for i in range(count):
        o[i] = dpch_permute_flip_words(&u[0], m, thi, tlo, sv)
    return out


cdef int _init_dg(str fn, dpch_dg *g, object S, object q) except -1:
    cdef object ss = _int_arg(fn, "S", S, 1)
    cdef object qq = _int_arg(fn, "q", q, 0)
    if ss >= (1 << 63):
        raise ValueError(f"{fn}: S must be < 2^63")
    if qq > 4096:
        raise ValueError(f"{fn}: q must be <= 4096")
    if ss > (1 << (40 + qq)):
        raise ValueError(f"{fn}: sigma = S/2^q must be <= 2^40")
    dpch_dg_init(g, <uint64_t>ss, <unsigned>qq)
    return 0


def discrete_gaussian(S, q, n):
    """`n` exact samples of the discrete Gaussian N_Z(0, sigma^2) with sigma = S/2^q (int64
    array): Pr[X = x] proportional to exp(-x^2 / (2 sigma^2)), sampled by CKS20 Alg. 3 (discrete
    Laplace proposals with t = floor(sigma) + 1, accepted with probability
    exp(-(|Y| - sigma^2/t)^2 / (2 sigma^2)) by CKS20 Alg. 1).

    Privacy: adding X to an integer-valued query with L2 sensitivity D satisfies
    D^2/(2 sigma^2)-zCDP (CKS20 Thm. 4) and hence the (eps, delta)-DP of CKS20 Cor. 9 / Thm. 7.

    Domain: integers 1 <= S < 2^63, 0 <= q <= 4096, sigma <= 2^40."""
    cdef dpch_dg g
    _init_dg("discrete_gaussian", &g, S, q)
    cdef Py_ssize_t count = _int_arg("discrete_gaussian", "n", n, 0)
    out = np.empty(count, dtype=np.int64)
    cdef int64_t[::1] o = out
    cdef Py_ssize_t i
    for i in range(count):
        _dg_draw(&g, &o[i])
    return out


# --------------------------------------------------------------------------------------------
# grids and release parameters (docs/NOISE.md)
# --------------------------------------------------------------------------------------------

def grid(x, bits):
    """grid(x, bits) = 2 ** (ceil(log2 x) - bits), computed exactly with frexp (docs/NOISE.md).
    x must be finite and > 0. May underflow to 0.0 for x below about 2^(bits-1074); the release
    functions work with the exponent and never underflow."""
    cdef double v = _scale_arg("grid", "x", x)
    cdef object b = _int_arg("grid", "bits", bits, -(1 << 20))
    if b > (1 << 20):
        raise ValueError("grid: bits must be <= 2^20")
    return ldexp(1.0, dpch_ceil_log2(v) - <int>b)


cdef object _params(str fn, str name, object scale, int bits, bint integer):
    cdef double v = _scale_arg(fn, name, scale)
    cdef dpch_params p
    dpch_params_compute(v, bits, integer, &p)
    return NoiseParameters(p.k, ldexp(1.0, p.k), int(p.num), 1 << (<object>p.den_log2))


def laplace_parameters(scale, integer=False):
    """Parameters of dpch_laplace (integer=False) or dpch_laplace_int (integer=True) for `scale`:
    r = grid(scale, 40) (or max(1, grid(scale, 40))), and the rational t/s >= scale/r with
    s = 2^p, p = max(0, 40 - ceil(log2(scale/r))), t = ceil(scale/r * s). Returns
    NoiseParameters(k, r, t, s) with r = 2^k."""
    return _params("laplace_parameters", "scale", scale, LAPLACE_BITS, bool(integer))


def gaussian_parameters(sigma, integer=False):
    """Parameters of dpch_gaussian (integer=False) or dpch_gaussian_int (integer=True): r =
    grid(sigma, 20) (or max(1, grid(sigma, 20))) and sigma/r <= S/2^q with
    q = max(0, 20 - ceil(log2(sigma/r))), S = ceil(sigma/r * 2^q). Returns
    NoiseParameters(k, r, S, 2^q) with r = 2^k."""
    return _params("gaussian_parameters", "sigma", sigma, GAUSSIAN_BITS, bool(integer))


def round_to_grid(values, k):
    """m = round_half_even(value / 2^k) as integer-valued float64 (the rounding step of the Float64
    releases, exact: division by a power of two; +-inf where value/2^k overflows)."""
    cdef object kk = _int_arg("round_to_grid", "k", k, -(1 << 20))
    if kk > (1 << 20):
        raise ValueError("round_to_grid: k must be <= 2^20")
    arr = _float_values("round_to_grid", values)
    out = np.empty_like(arr)
    cdef const double[::1] x = arr.reshape(-1)
    cdef double[::1] o = out.reshape(-1)
    cdef Py_ssize_t i
    cdef int kv = kk
    for i in range(x.shape[0]):
        o[i] = dpch_grid_round(x[i], kv)
    return out


def round_to_grid_int(values, k):
    """m = round_half_even(value / 2^k) for Int64 values and k >= 0 (the rounding step of the
    Int64 releases), exact integer arithmetic."""
    cdef object kk = _int_arg("round_to_grid_int", "k", k, 0)
    if kk > (1 << 20):
        raise ValueError("round_to_grid_int: k must be <= 2^20")
    arr = _int_values("round_to_grid_int", values)
    out = np.empty_like(arr)
    cdef const int64_t[::1] x = arr.reshape(-1)
    cdef int64_t[::1] o = out.reshape(-1)
    cdef Py_ssize_t i
    cdef int kv = kk
    for i in range(x.shape[0]):
        o[i] = dpch_grid_round_i64(x[i], kv)
    return out


# --------------------------------------------------------------------------------------------
# releases (the four UDFs, vectorised)
# --------------------------------------------------------------------------------------------

def laplace_release(values, scale):
    """dpch_laplace on an array: r = grid(scale, 40), m = round_half_even(value/r), K ~ discrete
    Laplace(t/s) (CKS20 Alg. 2) with t/s >= scale/r, output r*(m + K) in double precision (a
    function of the exact integer m + K alone). Returns float64, same shape.

    Guarantee (docs/NOISE.md): if the true value has L1 sensitivity D, the release is
    ((D + r)/scale)-DP, and r <= scale * 2^-39. NaN/Inf values or a bad scale raise ValueError."""
    cdef double sc = _scale_arg("laplace_release", "scale", scale)
    arr = _float_values("laplace_release", values)
    cdef dpch_params p
    dpch_params_compute(sc, LAPLACE_BITS, 0, &p)
    out = np.empty_like(arr)
    cdef const double[::1] x = arr.reshape(-1)
    cdef double[::1] o = out.reshape(-1)
    cdef Py_ssize_t i
    cdef double m
    for i in range(x.shape[0]):
        m = dpch_grid_round(x[i], p.k)
        o[i] = dpch_combine_f64(m, dpch_dlap(p.num, p.den_log2, 0), p.k, x[i])
    return out


def laplace_release_int(values, scale):
    """dpch_laplace_int on an Int64 array: r = max(1, grid(scale, 40)) (a power of two),
    m = round_half_even(value/r), K ~ discrete Laplace(t/s >= scale/r) (CKS20 Alg. 2), output
    saturate(r*(m + K)) in Int64. Guarantee: ((D + r)/scale)-DP for L1 sensitivity D, and
    (D/scale)-DP when r = 1 (scale <= 2^40)."""
    cdef double sc = _scale_arg("laplace_release_int", "scale", scale)
    arr = _int_values("laplace_release_int", values)
    cdef dpch_params p
    dpch_params_compute(sc, LAPLACE_BITS, 1, &p)
    out = np.empty_like(arr)
    cdef const int64_t[::1] x = arr.reshape(-1)
    cdef int64_t[::1] o = out.reshape(-1)
    cdef Py_ssize_t i
    for i in range(x.shape[0]):
        o[i] = dpch_combine_i64(dpch_grid_round_i64(x[i], p.k),
                                dpch_dlap(p.num, p.den_log2, 0), p.k)
    return out


def gaussian_release(values, sigma):
    """dpch_gaussian on an array: r = grid(sigma, 20), m = round_half_even(value/r), K ~ discrete
    Gaussian with sigma S/2^q >= sigma/r (CKS20 Alg. 3), output r*(m + K) in double precision.

    Guarantee (docs/NOISE.md): for L2 sensitivity D, every (eps, delta) of the Gaussian mechanism
    with sensitivity D + r and standard deviation sigma, and (D + r)^2/(2 sigma^2)-zCDP (CKS20
    Thm. 4, Cor. 9); r <= sigma * 2^-19."""
    cdef double sg = _scale_arg("gaussian_release", "sigma", sigma)
    arr = _float_values("gaussian_release", values)
    cdef dpch_params p
    dpch_params_compute(sg, GAUSSIAN_BITS, 0, &p)
    cdef dpch_dg g
    dpch_dg_init(&g, p.num, p.den_log2)
    out = np.empty_like(arr)
    cdef const double[::1] x = arr.reshape(-1)
    cdef double[::1] o = out.reshape(-1)
    cdef Py_ssize_t i
    cdef int64_t noise
    for i in range(x.shape[0]):
        _dg_draw(&g, &noise)
        o[i] = dpch_combine_f64(dpch_grid_round(x[i], p.k), noise, p.k, x[i])
    return out


def gaussian_release_int(values, sigma):
    """dpch_gaussian_int on an Int64 array: r = max(1, grid(sigma, 20)), m =
    round_half_even(value/r), K ~ discrete Gaussian (S/2^q >= sigma/r, CKS20 Alg. 3), output
    saturate(r*(m + K)). Guarantee as gaussian_release with sensitivity D + r, or D when r = 1."""
    cdef double sg = _scale_arg("gaussian_release_int", "sigma", sigma)
    arr = _int_values("gaussian_release_int", values)
    cdef dpch_params p
    dpch_params_compute(sg, GAUSSIAN_BITS, 1, &p)
    cdef dpch_dg g
    dpch_dg_init(&g, p.num, p.den_log2)
    out = np.empty_like(arr)
    cdef const int64_t[::1] x = arr.reshape(-1)
    cdef int64_t[::1] o = out.reshape(-1)
    cdef Py_ssize_t i
    cdef int64_t noise
    for i in range(x.shape[0]):
        _dg_draw(&g, &noise)
        o[i] = dpch_combine_i64(dpch_grid_round_i64(x[i], p.k), noise, p.k)
    return out


# --------------------------------------------------------------------------------------------
# timing diagnostics (udf/README.md, "Timing side channel")
# --------------------------------------------------------------------------------------------

cdef inline int64_t _now_ns() noexcept:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <int64_t>ts.tv_sec * 1000000000 + ts.tv_nsec


def timed_discrete_laplace(t, s, n):
    """Like discrete_laplace, and also the wall time of each draw in nanoseconds (int64 array,
    including about 20-40 ns of clock overhead). Diagnostic for the timing side channel only."""
    cdef object tt = _int_arg("timed_discrete_laplace", "t", t, 1)
    cdef object ss = _int_arg("timed_discrete_laplace", "s", s, 1)
    cdef Py_ssize_t count = _int_arg("timed_discrete_laplace", "n", n, 0)
    if tt >= (1 << 63) or tt > ss * (1 << 50) or ss & (ss - 1) != 0:
        raise ValueError("timed_discrete_laplace: need t < 2^63, t/s <= 2^50, s a power of two")
    cdef unsigned shift = ss.bit_length() - 1
    cdef uint64_t tv = tt
    out = np.empty(count, dtype=np.int64)
    ns = np.empty(count, dtype=np.int64)
    cdef int64_t[::1] o = out
    cdef int64_t[::1] w = ns
    cdef Py_ssize_t i
    cdef int64_t t0
    for i in range(count):
        t0 = _now_ns()
        o[i] = dpch_dlap(tv, shift, 0)
        w[i] = _now_ns() - t0
    return out, ns


def timed_discrete_gaussian(S, q, n):
    """Like discrete_gaussian, and also the wall time of each draw in nanoseconds."""
    cdef dpch_dg g
    _init_dg("timed_discrete_gaussian", &g, S, q)
    cdef Py_ssize_t count = _int_arg("timed_discrete_gaussian", "n", n, 0)
    out = np.empty(count, dtype=np.int64)
    ns = np.empty(count, dtype=np.int64)
    cdef int64_t[::1] o = out
    cdef int64_t[::1] w = ns
    cdef Py_ssize_t i
    cdef int64_t t0
    for i in range(count):
        t0 = _now_ns()
        _dg_draw(&g, &o[i])
        w[i] = _now_ns() - t0
    return out, ns


def quantile_buckets(keys, counts, buckets, levels, epsilon, rows=1, n=1):
    """`n` independent joint releases of the quantiles `levels` (floats in [0, 1], rounded to
    multiples of 2^-20) of a sparse histogram over the grid 0..buckets-1 (`keys` strictly
    ascending bucket indices, `counts` their counts): a list of n lists of chosen buckets, one per
    level, in the order given. The same code path as the SQL function dp_quantile's UDF.

    Privacy: eps-DP for histograms that differ by at most `rows` rows (Kaplan, Schnapp & Stemmer
    2022 recursion over permute-and-flip; docs/NOISE.md "Quantiles")."""
    cdef uint32_t[::1] kv = np.ascontiguousarray(keys, dtype=np.uint32).reshape(-1)
    cdef uint64_t[::1] cv = np.ascontiguousarray(counts, dtype=np.uint64).reshape(-1)
    cdef int64_t m = kv.shape[0]
    if cv.shape[0] != m:
        raise ValueError("quantile_buckets: keys and counts must have the same length")
    cdef uint64_t nb = _int_arg("quantile_buckets", "buckets", buckets, 1)
    cdef uint64_t rv = _int_arg("quantile_buckets", "rows", rows, 1)
    cdef Py_ssize_t count = _int_arg("quantile_buckets", "n", n, 0)
    cum = np.empty(m + 1, dtype=np.uint64)
    cdef uint64_t[::1] cumv = cum
    problem = _histogram_problem(&kv[0] if m else NULL, &cv[0] if m else NULL, m, nb, &cumv[0])
    if problem is None:
        problem = _quantile_parameters(float(epsilon), rv, nb)
    if problem is not None:
        raise ValueError(f"quantile_buckets: {problem}")
    lv = quantile_levels(levels)
    cdef Py_ssize_t i
    return [_quantile_buckets(&kv[0] if m else NULL, &cumv[0], m, nb, lv, float(epsilon), rv)
            for i in range(count)]


def top_k(scores, n, epsilon, sensitivity, draws=1):
    """`draws` independent top-`n` releases over integer `scores` (int64 array-like; |score| <
    2^62): each a list of the chosen indices in the order chosen (all of them when there are at
    most n). Round i runs permute-and-flip over the candidates not chosen yet at temperature
    2 * sensitivity * n / epsilon (rounded up, exact). The same code path as the UDF dpch_top_k.

    Privacy: epsilon-DP when every score moves by at most `sensitivity` between neighbouring
    datasets (n rounds of (epsilon/n)-DP permute-and-flip, McKenna & Sheldon 2020 Thm 1, composed
    sequentially; the peeling of Durfee & Rogers 2019)."""
    arr = np.ascontiguousarray(scores, dtype=np.int64).reshape(-1)
    cdef int64_t m = arr.shape[0]
    cdef int64_t nn = _int_arg("top_k", "n", n, 1)
    cdef uint64_t sens = _int_arg("top_k", "sensitivity", sensitivity, 1)
    cdef Py_ssize_t count = _int_arg("top_k", "draws", draws, 0)
    cdef double eps = float(epsilon)
    cdef const int64_t[::1] u = arr if m > 0 else np.zeros(1, dtype=np.int64)
    problem = _top_k_problem(&u[0], m, nn, eps, sens)
    if problem is not None:
        raise ValueError(f"top_k: {problem}")
    return [_top_k(&u[0], m, nn, eps, sens) for _ in range(count)]



# --------------------------------------------------------------------------------------------
# bounded Laplace (biswal thesis §5.5; dpch.mechanisms.BoundedLaplaceMechanism, docs/NOISE.md)
# --------------------------------------------------------------------------------------------

def bounded_laplace_release(values, scale, lo, hi):
    """dpch_bounded_laplace on an array: each value clamped to [lo, hi] and rounded to the grid
    r = grid(scale, 40), then the discrete Laplace of scale t/s >= scale/r (CKS20 Alg. 2)
    conditioned on the grid points of [lo, hi], drawn by K candidates every time (K =
    dpch.mechanisms.bounded_laplace_candidates(scale, lo, hi); udf/dpch_kernel.h,
    dpch_bounded_dlap). Returns float64 outputs in [lo, hi].

    Guarantee: dpch.mechanisms.BoundedLaplaceMechanism(scale, lo, hi).privacy_function."""
    cdef double sc = _scale_arg("bounded_laplace_release", "scale", scale)
    cdef double a = float(lo), b = float(hi)
    if not isfinite(a):
        raise ValueError("bounded_laplace_release: lo must be finite")
    if not isfinite(b):
        raise ValueError("bounded_laplace_release: hi must be finite")
    if not a < b:
        raise ValueError("bounded_laplace_release: hi must be greater than lo")
    from dpch.mechanisms import bounded_laplace_candidates
    from dpch.errors import InvalidParameter
    try:
        K = bounded_laplace_candidates(sc, a, b)
    except InvalidParameter as exc:
        raise ValueError(f"bounded_laplace_release: {exc}") from None
    arr = _float_values("bounded_laplace_release", values)
    cdef dpch_params p
    dpch_params_compute(sc, LAPLACE_BITS, 0, &p)
    cdef double glo, ghi
    if dpch_bounded_grid(a, b, p.k, &glo, &ghi) != 0:
        raise ValueError("bounded_laplace_release: lo, hi do not fit the noise grid")
    out = np.empty_like(arr)
    cdef const double[::1] x = arr.reshape(-1)
    cdef double[::1] o = out.reshape(-1)
    cdef Py_ssize_t i
    cdef uint64_t kk = K
    for i in range(x.shape[0]):
        o[i] = dpch_bounded_release(x[i], a, b, glo, ghi, p.k, p.num, p.den_log2, kk)
    return out


def bounded_laplace_units(c, n, t, s, K, draws):
    """`draws` outputs of the kernel's bounded discrete Laplace on the grid {0..n} centred at
    c (0 <= c <= n < 2^62), scale t/s (s a power of two), K candidates (tests: the exact law,
    fallback included, is known)."""
    cdef int64_t cc = _int_arg("bounded_laplace_units", "c", c, 0)
    cdef int64_t nn = _int_arg("bounded_laplace_units", "n", n, 0)
    cdef object tt = _int_arg("bounded_laplace_units", "t", t, 1)
    cdef object ss = _int_arg("bounded_laplace_units", "s", s, 1)
    cdef uint64_t kk = _int_arg("bounded_laplace_units", "K", K, 1)
    cdef Py_ssize_t count = _int_arg("bounded_laplace_units", "draws", draws, 0)
    if cc > nn or nn >= (1 << 62):
        raise ValueError("bounded_laplace_units: need 0 <= c <= n < 2^62")
    if tt >= (1 << 63) or tt > ss * (1 << 50) or ss & (ss - 1) != 0:
        raise ValueError("bounded_laplace_units: need t < 2^63, t/s <= 2^50, s a power of two")
    cdef unsigned shift = ss.bit_length() - 1
    cdef uint64_t tv = tt
    out = np.empty(count, dtype=np.int64)
    cdef int64_t[::1] o = out
    cdef Py_ssize_t i
    for i in range(count):
        o[i] = dpch_bounded_units(cc, nn, tv, shift, kk)
    return out
