/*
 * DPCH noise kernel: OS CSPRNG buffer and exact samplers (C part).
 *
 * Shared by dpch._noise (udf/noise.pyx) and dpch._udf_program (udf/udf_program.pyx); each
 * extension gets its own copy of the (static) generator state.
 *
 * Randomness: getrandom(2) only, read into a 64 KiB buffer that is refilled when empty. Words are
 * zeroed as they are consumed, and a pthread_atfork child handler discards the buffer so that a
 * forked child never reuses its parent's random bytes. There is no userspace PRNG.
 *
 * Samplers: Canonne, Kamath & Steinke 2020, "The Discrete Gaussian for Differential Privacy"
 * (CKS20): Bernoulli(exp(-gamma)) for rational gamma (Alg. 1, with the gamma > 1 split), discrete
 * Laplace with rational scale t/s (Alg. 2), discrete Gaussian with rational sigma^2 (Alg. 3).
 * Arithmetic is integer only (uint64 / unsigned __int128). Bernoulli(a/b) is decided lazily by
 * comparing random bits with the binary expansion of a/b (exact, 2 random bits on average).
 *
 * Concurrency: callers hold the Python GIL (the state is process-global, not thread-local).
 * Failure of getrandom (other than EINTR) aborts the process: we fail closed rather than
 * release anything without fresh OS randomness.
 *
 * Everything that would overflow 128 bits is reported to the caller (status DPCH_SLOW), which
 * then finishes the draw exactly with arbitrary-precision integers (udf/kernel.pxi).
 */
#ifndef DPCH_KERNEL_H
#define DPCH_KERNEL_H

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

typedef unsigned __int128 dpch_u128;
typedef __int128 dpch_i128;

#define DPCH_RNG_BYTES 65536
#define DPCH_RNG_WORDS (DPCH_RNG_BYTES / 8)

/* ------------------------------------------------------------------------------------------ */
/* OS CSPRNG buffer                                                                            */
/* ------------------------------------------------------------------------------------------ */

typedef struct {
    uint64_t buf[DPCH_RNG_WORDS];
    size_t avail;        /* unread words at the end of buf */
    uint64_t bits;       /* bit reservoir */
    unsigned nbits;
    uint64_t refills;    /* statistics only */
} dpch_rng_state;

static dpch_rng_state dpch_rng;
static int dpch_atfork_registered = 0;

static void dpch_rng_discard(void) {
    memset(dpch_rng.buf, 0, sizeof(dpch_rng.buf));
    dpch_rng.avail = 0;
    dpch_rng.bits = 0;
    dpch_rng.nbits = 0;
}

static void dpch_rng_atfork_child(void) { dpch_rng_discard(); }

/* Call once at module initialisation. Returns 0 on success. */
static int dpch_rng_init(void) {
    if (!dpch_atfork_registered) {
        if (pthread_atfork(NULL, NULL, dpch_rng_atfork_child) != 0) return -1;
        dpch_atfork_registered = 1;
    }
    dpch_rng_discard();
    return 0;
}

static void dpch_rng_refill(void) {
    unsigned char *p = (unsigned char *)dpch_rng.buf;
    size_t left = sizeof(dpch_rng.buf);
    while (left > 0) {
        ssize_t got = getrandom(p, left, 0);
        if (got < 0) {
            if (errno == EINTR) continue;
            fprintf(stderr, "dpch noise kernel: getrandom failed (errno %d); aborting\n", errno);
            abort();
        }
        p += got;
        left -= (size_t)got;
    }
    dpch_rng.avail = DPCH_RNG_WORDS;
    dpch_rng.refills++;
}

static inline uint64_t dpch_u64(void) {
    if (__builtin_expect(dpch_rng.avail == 0, 0)) dpch_rng_refill();
    size_t i = DPCH_RNG_WORDS - dpch_rng.avail;
    dpch_rng.avail--;
    uint64_t w = dpch_rng.buf[i];
    dpch_rng.buf[i] = 0;
    return w;
}

static inline unsigned dpch_bit(void) {
    if (__builtin_expect(dpch_rng.nbits == 0, 0)) {
        dpch_rng.bits = dpch_u64();
        dpch_rng.nbits = 64;
    }
    unsigned b = (unsigned)(dpch_rng.bits & 1u);
    dpch_rng.bits >>= 1;
    dpch_rng.nbits--;
    return b;
}

/* k uniformly random bits, 1 <= k <= 64 */
static inline uint64_t dpch_bits(unsigned k) {
    uint64_t r;
    if (k <= dpch_rng.nbits) {
        if (k == 64) {
            r = dpch_rng.bits;
            dpch_rng.bits = 0;
        } else {
            r = dpch_rng.bits & ((UINT64_C(1) << k) - 1);
            dpch_rng.bits >>= k;
        }
        dpch_rng.nbits -= k;
        return r;
    }
    unsigned have = dpch_rng.nbits;
    unsigned need = k - have; /* 1..64 */
    uint64_t lo = dpch_rng.bits; /* exactly `have` valid bits (have < 64) */
    uint64_t w = dpch_u64();
    uint64_t hi = (need == 64) ? w : (w & ((UINT64_C(1) << need) - 1));
    r = lo | (have == 0 ? hi : (hi << have));
    dpch_rng.bits = (need == 64) ? 0 : (w >> need);
    dpch_rng.nbits = 64 - need;
    return r;
}

/* Random bytes handed out so far (statistics for the benchmarks). */
static inline uint64_t dpch_rng_bytes_used(void) {
    return 8 * (dpch_rng.refills * DPCH_RNG_WORDS - dpch_rng.avail);
}

static inline unsigned dpch_bitlen64(uint64_t x) { return x ? 64u - (unsigned)__builtin_clzll(x) : 0u; }

/* Uniform integer in [0, n), n >= 1, by rejection (no modulo bias). */
static inline uint64_t dpch_uniform(uint64_t n) {
    if (n <= 1) return 0;
    unsigned k = dpch_bitlen64(n - 1);
    for (;;) {
        uint64_t x = dpch_bits(k);
        if (x < n) return x;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Bernoulli samplers                                                                          */
/* ------------------------------------------------------------------------------------------ */

/* Bernoulli(a/b), 0 <= a, 1 <= b < 2^63. Compares a uniform V in [0,1), drawn bit by bit,
 * with the binary expansion of a/b produced by long division; returns [V < a/b]. */
static inline int dpch_bern_frac64(uint64_t a, uint64_t b) {
    if (a >= b) return 1;
    if (a == 0) return 0;
    uint64_t r = a;
    for (;;) {
        r <<= 1;
        uint64_t d = r >= b;
        r -= b & (0 - d); /* branchless long-division step */
        uint64_t v = dpch_bit();
        if (v != d) return (int)d; /* first differing bit: V < a/b iff the expansion has the 1 */
        if (r == 0) return 0;     /* the expansion ended: V >= a/b */
    }
}

/* Same for 128-bit operands, 1 <= b < 2^127. */
static inline int dpch_bern_frac128(dpch_u128 a, dpch_u128 b) {
    if (a >= b) return 1;
    if (a == 0) return 0;
    dpch_u128 r = a;
    for (;;) {
        r <<= 1;
        unsigned d = r >= b;
        r -= b & (0 - (dpch_u128)d);
        unsigned v = dpch_bit();
        if (v != d) return (int)d;
        if (r == 0) return 0;
    }
}

/* Bernoulli(1/k), k >= 1 */


/* Bernoulli(exp(-1)): CKS20 Alg. 1 with gamma = 1. K is the index of the first failed
 * Bernoulli(1/k) trial (the k = 1 trial always succeeds) and the output is [K odd]. The trials
 * k = 2, 3, 4 are decided jointly by one uniform W in [0, 24): Pr[K > k] = 1/k! = (24/k!)/24, so
 * K > 2 iff W < 12, K > 3 iff W < 4, K > 4 iff W < 1 -- the same joint law, fewer branches. The
 * trials k >= 5 (probability 1/24) run one by one. */
static inline int dpch_bern_exp1(void) {
    uint64_t w = dpch_uniform(24);
    if (__builtin_expect(w == 0, 0)) {
        uint64_t k = 5;
        while (dpch_bern_frac64(1, k)) k++;
        return (int)(k & 1);
    }
    return (w - 4) < 8; /* K = 3 (4 <= W < 12): odd; K = 2 or 4: even */
}

/* Bernoulli(exp(-a/b)) for 0 <= a <= b < 2^63 (gamma in [0,1]): CKS20 Alg. 1.
 * Bernoulli(gamma/K) is drawn as Bernoulli(1/K) AND Bernoulli(a/b) (independent). */
static inline int dpch_bern_exp_small64(uint64_t a, uint64_t b) {
    uint64_t k = 1;
    for (;;) {
        if (k > 1 && !dpch_bern_frac64(1, k)) break;
        if (!dpch_bern_frac64(a, b)) break;
        k++;
    }
    return (int)(k & 1);
}

static inline int dpch_bern_exp_small128(dpch_u128 a, dpch_u128 b) {
    uint64_t k = 1;
    for (;;) {
        if (k > 1 && !dpch_bern_frac64(1, k)) break;
        if (!dpch_bern_frac128(a, b)) break;
        k++;
    }
    return (int)(k & 1);
}

/* Bernoulli(exp(-n/d)), d in [1, 2^127): CKS20 Alg. 1 with the gamma > 1 split:
 * floor(gamma) independent Bernoulli(exp(-1)) trials, then Bernoulli(exp(-frac(gamma))).
 * The whole part is consumed by subtraction, one trial per unit, instead of a 128-bit division:
 * the same trials in the same order (so the same law, draw for draw), and most calls stop at
 * the first failed trial (probability 1 - 1/e), before any division would have finished
 * (permute-and-flip flips one coin per bucket; the division was 12 % of a quantile release). */
static inline int dpch_bern_exp128(dpch_u128 n, dpch_u128 d) {
    while (n >= d) {
        if (!dpch_bern_exp1()) return 0;
        n -= d;
    }
    return dpch_bern_exp_small128(n, d);
}

/* Bernoulli(exp(-n/d)) with n, d given as (hi, lo) 64-bit words; d in [1, 2^127). */
static inline int dpch_bern_exp_words(uint64_t nhi, uint64_t nlo, uint64_t dhi, uint64_t dlo) {
    dpch_u128 n = ((dpch_u128)nhi << 64) | nlo;
    dpch_u128 d = ((dpch_u128)dhi << 64) | dlo;
    return dpch_bern_exp128(n, d);
}

/* ------------------------------------------------------------------------------------------ */
/* Exponential mechanism by permute-and-flip (McKenna & Sheldon 2020, Alg. 1)                  */
/* ------------------------------------------------------------------------------------------ */

/* Permute-and-flip visits the candidates in a uniformly random order and returns the first whose
 * coin, Bernoulli(exp(-(u* - u_r) s / t)), comes up; the coins do not depend on the order, so the
 * first success in a uniform order is a uniform element of the set of successes. DPCH draws it in
 * that form: every candidate's coin is flipped in one pass and a reservoir keeps a uniform success
 * (exact Bernoulli(1/j) for the j-th). The work is then the same for every dataset: the early-exit
 * form visits about n / sum(p) candidates, and its running time revealed the scores (the quantile
 * auditor certified eps_LB = 1.6 > eps = 1 from release times alone; docs/AUDIT.md).
 * dpch_pf_flip is one candidate's step: 1 if it becomes the current choice. A maximiser's coin
 * (gap 0) always comes up, so there is at least one success. */
static inline int dpch_pf_flip(uint64_t gap, dpch_u128 t, uint64_t s, uint64_t *successes) {
    if (gap != 0 && !dpch_bern_exp128((dpch_u128)gap * s, t)) return 0;
    ++*successes;
    return *successes == 1 || dpch_bern_frac64(1, *successes);
}

/* The candidate chosen by permute-and-flip over integer scores u[0..n), n >= 1, at temperature
 * t/s (t in [1, 2^127), s in [1, 2^64)), decided exactly by dpch_bern_exp128. With t/s >= 2*D/eps
 * for scores of sensitivity D it is eps-DP (McKenna & Sheldon, Thm. 1). Gaps are taken modulo
 * nothing: u* - u_r < 2^64 and (u* - u_r) s < 2^128. */
static inline int64_t dpch_permute_flip(const int64_t *u, int64_t n, dpch_u128 t, uint64_t s) {
    int64_t best = u[0], chosen = 0;
    uint64_t successes = 0;
    for (int64_t i = 1; i < n; i++)
        if (u[i] > best) best = u[i];
    for (int64_t r = 0; r < n; r++)
        if (dpch_pf_flip((uint64_t)((dpch_i128)best - (dpch_i128)u[r]), t, s, &successes)) chosen = r;
    return chosen;
}

/* The same with the temperature numerator t given as (hi, lo) 64-bit words (for Cython). */
static inline int64_t dpch_permute_flip_words(const int64_t *u, int64_t n, uint64_t thi, uint64_t tlo, uint64_t s) {
    return dpch_permute_flip(u, n, ((dpch_u128)thi << 64) | tlo, s);
}

/* Top-n by peeling (Durfee & Rogers 2019: peeling exponential mechanisms; here each round is
 * permute-and-flip): n rounds, round i chooses among the candidates not chosen yet, every one of
 * them flipping its coin (the same work on every dataset with m candidates). Writes the chosen
 * indices to out[0..min(n, m)) in the order chosen and returns how many; `taken` is m bytes of
 * scratch. With t/s >= 2*D*n/eps for scores of sensitivity D each round is (eps/n)-DP and the
 * whole release eps-DP (sequential composition, Dwork & Roth Thm 3.16). */
static inline int64_t dpch_top_k(const int64_t *u, int64_t m, int64_t n, dpch_u128 t, uint64_t s,
                                 unsigned char *taken, int64_t *out) {
    int64_t rounds = n < m ? n : m;
    for (int64_t r = 0; r < m; r++) taken[r] = 0;
    for (int64_t i = 0; i < rounds; i++) {
        int64_t best = INT64_MIN, chosen = -1;
        uint64_t successes = 0;
        for (int64_t r = 0; r < m; r++)
            if (!taken[r] && u[r] > best) best = u[r];
        for (int64_t r = 0; r < m; r++)
            if (!taken[r] && dpch_pf_flip((uint64_t)((dpch_i128)best - (dpch_i128)u[r]), t, s, &successes))
                chosen = r;
        taken[chosen] = 1;
        out[i] = chosen;
    }
    return rounds;
}

static inline int64_t dpch_top_k_words(const int64_t *u, int64_t m, int64_t n, uint64_t thi, uint64_t tlo,
                                       uint64_t s, unsigned char *taken, int64_t *out) {
    return dpch_top_k(u, m, n, ((dpch_u128)thi << 64) | tlo, s, taken, out);
}

/* ------------------------------------------------------------------------------------------ */
/* Quantiles: permute-and-flip over the buckets of a fixed grid, from a sparse histogram        */
/* ------------------------------------------------------------------------------------------ */
/*
 * The histogram lists the non-empty buckets of the grid 0..B-1: keys[0..m) strictly ascending,
 * cum[i] = the total count of keys[0..i) (cum has m+1 entries). A sub-problem has the candidate
 * buckets [c0, c1] and takes its data from the buckets [d0, d1] (empty when d0 > d1). For a
 * candidate b, L = data in buckets < b and G = data in buckets > b (data in b itself counts in
 * neither), and the score of the quantile a/Q is -|(Q - a) L - a G| (the utility of OpenDP's
 * make_quantile_score_candidates, scaled by Q to integers). Adding or removing one row moves L or
 * G by one, so a score moves by at most max(a, Q - a); with rows rows per privacy unit, by rows
 * times that.
 */
/* The first index i with keys[i] >= x (m if none). */
static inline int64_t dpch_hist_index(const uint32_t *keys, int64_t m, uint64_t x) {
    int64_t lo = 0, hi = m;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if ((uint64_t)keys[mid] < x) lo = mid + 1; else hi = mid;
    }
    return lo;
}

/* The count of data in buckets < x. */
static inline uint64_t dpch_hist_below(const uint32_t *keys, const uint64_t *cum, int64_t m, uint64_t x) {
    return cum[dpch_hist_index(keys, m, x)];
}

typedef struct {
    const uint32_t *keys;
    const uint64_t *cum;
    int64_t m;
    uint64_t d0, d1;       /* data buckets [d0, d1] */
    uint64_t base, top;    /* data below d0, data below d1 + 1 */
    uint64_t a, q;         /* the quantile a/q */
} dpch_qscore;

static inline uint64_t dpch_clamp_u64(uint64_t x, uint64_t lo, uint64_t hi) {
    return x < lo ? lo : (x > hi ? hi : x);
}

/* (q - a) L - a G for candidate b (non-decreasing in b). |.| < 2^63 when the total count is below
 * 2^42 and q <= 2^20, checked by the caller. */
static inline int64_t dpch_qscore_signed(const dpch_qscore *z, uint64_t b) {
    if (z->d0 > z->d1) return 0;
    uint64_t xb = dpch_clamp_u64(b, z->d0, z->d1 + 1), xb1 = dpch_clamp_u64(b + 1, z->d0, z->d1 + 1);
    uint64_t L = dpch_hist_below(z->keys, z->cum, z->m, xb) - z->base;
    uint64_t G = z->top - dpch_hist_below(z->keys, z->cum, z->m, xb1);
    return (int64_t)((z->q - z->a) * L) - (int64_t)(z->a * G);
}

static inline int64_t dpch_qscore_at(const dpch_qscore *z, uint64_t b) {
    int64_t f = dpch_qscore_signed(z, b);
    return f < 0 ? f : -f;
}

/* The bucket in [c0, c1] chosen by permute-and-flip at temperature t/s, every bucket's coin
 * flipped in one sweep (dpch_pf_flip, as dpch_permute_flip). The best score comes from a
 * bisection (the signed score is monotone), the scores from a linear sweep over the histogram. */
static inline uint64_t dpch_quantile_pf(const dpch_qscore *z, uint64_t c0, uint64_t c1,
                                        dpch_u128 t, uint64_t s) {
    uint64_t lo = c0, hi = c1 + 1; /* the first b with signed score >= 0, or c1 + 1 */
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (dpch_qscore_signed(z, mid) >= 0) hi = mid; else lo = mid + 1;
    }
    int64_t best = INT64_MIN;
    if (lo <= c1) best = dpch_qscore_at(z, lo);
    if (lo > c0) { int64_t v = dpch_qscore_at(z, lo - 1); if (v > best) best = v; }
    /* sweep: L = data in [d0, b), G = data in (b, d1]; idx = the first key >= b */
    int empty = z->d0 > z->d1;
    int64_t m = z->m, idx = dpch_hist_index(z->keys, m, c0);
    uint64_t chosen = c0, successes = 0;
    for (uint64_t b = c0; b <= c1; b++) {
        while (idx < m && (uint64_t)z->keys[idx] < b) idx++;
        int64_t f = 0;
        if (!empty) {
            uint64_t xb = dpch_clamp_u64(b, z->d0, z->d1 + 1), xb1 = dpch_clamp_u64(b + 1, z->d0, z->d1 + 1);
            /* cum below xb / xb1: the histogram index moves with b, clamping keeps it in range */
            uint64_t below_b = (xb == b) ? z->cum[idx] : dpch_hist_below(z->keys, z->cum, m, xb);
            uint64_t below_b1;
            if (xb1 == b + 1) {
                int64_t j = idx;
                if (j < m && (uint64_t)z->keys[j] == b) j++;
                below_b1 = z->cum[j];
            } else {
                below_b1 = dpch_hist_below(z->keys, z->cum, m, xb1);
            }
            uint64_t L = below_b - z->base, G = z->top - below_b1;
            f = (int64_t)((z->q - z->a) * L) - (int64_t)(z->a * G);
        }
        int64_t score = f < 0 ? f : -f;
        if (dpch_pf_flip((uint64_t)(best - score), t, s, &successes)) chosen = b;
    }
    return chosen;
}

static inline uint64_t dpch_quantile_pf_words(const dpch_qscore *z, uint64_t c0, uint64_t c1,
                                              uint64_t thi, uint64_t tlo, uint64_t s) {
    return dpch_quantile_pf(z, c0, c1, ((dpch_u128)thi << 64) | tlo, s);
}

/* ------------------------------------------------------------------------------------------ */
/* Partition selection by the optimal rule (Desfontaines et al., PoPETs 2022, Thm 1)           */
/* ------------------------------------------------------------------------------------------ */

/* J = min{j >= 1 : U < A_j} for U uniform in [0, 2^127) (127 CSPRNG bits), where the table
 * A_1 <= ... <= A_len = 2^127 is given as (hi, lo) 64-bit words (A_j = hi[j-1]·2^64 + lo[j-1]).
 * P[J = j] = (A_j - A_(j-1)) / 2^127 exactly (A_0 = 0), and J <= n iff U < A_n, so a group of n
 * units is released (J <= n) with probability exactly A_n / 2^127 (dpch/partition_selection.py).
 * Binary search over the table: time independent of n. */
static inline int64_t dpch_select_index(const uint64_t *hi, const uint64_t *lo, int64_t len) {
    dpch_u128 u = ((dpch_u128)dpch_bits(63) << 64) | (dpch_u128)dpch_bits(64);
    int64_t a = 0, b = len - 1; /* A_len = 2^127 > U: the answer is in [0, len-1] */
    while (a < b) {
        int64_t m = a + (b - a) / 2;
        dpch_u128 c = ((dpch_u128)hi[m] << 64) | (dpch_u128)lo[m];
        if (u < c) b = m; else a = m + 1;
    }
    return a + 1;
}

/* ------------------------------------------------------------------------------------------ */
/* Discrete Laplace (CKS20 Alg. 2)                                                             */
/* ------------------------------------------------------------------------------------------ */

/* Saturating conversion of a magnitude to int64 with sign. Saturation needs |noise| >= 2^63,
 * which for the scales we accept (t/s <= 2^50) has probability below exp(-2^12). */
static inline int64_t dpch_signed_sat(dpch_u128 y, int negative) {
    if (y > (dpch_u128)INT64_MAX) return negative ? INT64_MIN : INT64_MAX;
    return negative ? -(int64_t)y : (int64_t)y;
}

/* Discrete Laplace with scale t/s: Pr[Z = z] proportional to exp(-|z| s / t).
 * t in [1, 2^63); s = 2^shift when s_div == 0 (any shift >= 0), else s = s_div (< 2^64). */
static inline int64_t dpch_dlap(uint64_t t, unsigned shift, uint64_t s_div) {
    for (;;) {
        uint64_t u = dpch_uniform(t);
        if (!dpch_bern_exp_small64(u, t)) continue;
        uint64_t v = 0;
        while (dpch_bern_exp1()) v++;
        dpch_u128 x = (dpch_u128)u + (dpch_u128)t * v;
        dpch_u128 y;
        if (s_div) y = x / s_div;
        else y = shift >= 128 ? 0 : (x >> shift);
        unsigned b = dpch_bit();
        if (b && y == 0) continue;
        return dpch_signed_sat(y, (int)b);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Discrete Gaussian (CKS20 Alg. 3) with sigma = S / 2^q                                        */
/* ------------------------------------------------------------------------------------------ */
/*
 * t = floor(sigma) + 1; repeat: Y <- DLap(t); accept with probability exp(-gamma),
 * gamma = (|Y| - sigma^2/t)^2 / (2 sigma^2) = (|Y| t 4^q - S^2)^2 / (2 S^2 t^2 4^q).
 */
typedef struct {
    uint64_t S;
    unsigned q;
    uint64_t t;
    int fast;          /* 0: every acceptance test goes to the arbitrary-precision path */
    dpch_u128 S2;      /* S^2 */
    dpch_u128 T4;      /* t 4^q */
    dpch_u128 B;       /* 2 S^2 t^2 4^q  (< 2^127 when fast) */
    uint64_t pending;  /* |Y| of the candidate handed to the slow path */
    int pending_neg;
} dpch_dg;

#define DPCH_SLOW 2

/* S in [1, 2^63), sigma = S/2^q <= 2^40 (checked by the caller). */
static inline void dpch_dg_init(dpch_dg *g, uint64_t S, unsigned q) {
    g->S = S;
    g->q = q;
    g->t = (q >= 64 ? 0 : (S >> q)) + 1;
    g->fast = 0;
    g->S2 = (dpch_u128)S * S;
    g->T4 = 0;
    g->B = 0;
    g->pending = 0;
    g->pending_neg = 0;
    if (S >= (UINT64_C(1) << 32)) return; /* S^2 must fit 64 bits for |A| < 2^64 below */
    if (2 * (unsigned long)q >= 126) return;
    dpch_u128 four_q = (dpch_u128)1 << (2 * q);
    dpch_u128 T4, B, tmp;
    if (__builtin_mul_overflow((dpch_u128)g->t, four_q, &T4)) return;
    if (__builtin_mul_overflow(g->S2, (dpch_u128)2, &tmp)) return;
    if (__builtin_mul_overflow(tmp, (dpch_u128)g->t, &tmp)) return;
    if (__builtin_mul_overflow(tmp, T4, &B)) return;
    if (B >> 127) return;
    g->T4 = T4;
    g->B = B;
    g->fast = 1;
}

/* Acceptance test of CKS20 Alg. 3 for candidate |Y| = y: 1 accept, 0 reject, DPCH_SLOW if the
 * numbers exceed 128 bits (the caller then decides it exactly with big integers). */
static inline int dpch_dg_accept(const dpch_dg *g, uint64_t y) {
    if (!g->fast) return DPCH_SLOW;
    dpch_u128 yt;
    if (__builtin_mul_overflow((dpch_u128)y, g->T4, &yt)) return DPCH_SLOW;
    dpch_u128 a = yt >= g->S2 ? yt - g->S2 : g->S2 - yt;
    if (a >> 64) return DPCH_SLOW;
    return dpch_bern_exp128(a * a, g->B);
}

/* One discrete Gaussian draw. Returns 0 and stores the sample in *out, or DPCH_SLOW with the
 * candidate in g->pending / g->pending_neg. */
static inline int dpch_dg_sample(dpch_dg *g, int64_t *out) {
    for (;;) {
        int64_t y = dpch_dlap(g->t, 0, 0);
        uint64_t ay = y < 0 ? (uint64_t)0 - (uint64_t)y : (uint64_t)y;
        int acc = dpch_dg_accept(g, ay);
        if (acc == 1) {
            *out = y;
            return 0;
        }
        if (acc == DPCH_SLOW) {
            g->pending = ay;
            g->pending_neg = y < 0;
            return DPCH_SLOW;
        }
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Grids and release parameters (docs/NOISE.md)                                                */
/* ------------------------------------------------------------------------------------------ */

/* ceil(log2(x)) for finite x > 0, exactly (frexp). */
static inline int dpch_ceil_log2(double x) {
    int e;
    double m = frexp(x, &e); /* x = m 2^e, m in [0.5, 1) */
    return m == 0.5 ? e - 1 : e;
}

/* Checks a scale / sigma: 0 ok, 1 NaN, 2 infinite, 3 not positive. */
static inline int dpch_check_scale(double x) {
    if (isnan(x)) return 1;
    if (isinf(x)) return 2;
    if (!(x > 0)) return 3;
    return 0;
}

/* Release parameters: grid r = 2^k, noise scale num / 2^den_log2 in grid units.
 * Laplace (bits 40): num = t, den_log2 = p. Gaussian (bits 20): num = S, den_log2 = q. */
typedef struct {
    int k;
    uint64_t num;
    unsigned den_log2;
} dpch_params;

static inline void dpch_params_compute(double scale, int bits, int integer, dpch_params *out) {
    int c = dpch_ceil_log2(scale);
    int k = c - bits;
    if (integer && k < 0) k = 0;
    double u = ldexp(scale, -k); /* exact: scaling by a power of two into [2^-1074, 2^bits] */
    int cu = dpch_ceil_log2(u);
    int p = bits - cu;
    if (p < 0) p = 0;
    double tu = ceil(ldexp(u, p)); /* u 2^p <= 2^bits: exact */
    out->k = k;
    out->num = (uint64_t)tu;
    out->den_log2 = (unsigned)p;
}

/* x 2^e, correctly rounded (as ldexp); a multiplication by an exact power of two when 2^e is a
 * normal double, which gives the identical result without a libm call. */
static inline double dpch_scale2(double x, int e) {
    if (e >= -1022 && e <= 1023) {
        uint64_t bits = (uint64_t)(e + 1023) << 52;
        double p;
        memcpy(&p, &bits, sizeof p);
        return x * p;
    }
    return ldexp(x, e);
}

/* m = round_half_even(v / 2^k) as an integer-valued double (inf if v / 2^k overflows). */
static inline double dpch_grid_round(double v, int k) {
    double x = dpch_scale2(v, -k);
    if (fabs(x) < 4503599627370496.0) /* 2^52 */
        x = nearbyint(x);           /* default rounding mode: ties to even */
    return x;
}

/* r (m + K) in double precision, r = 2^k; a deterministic function of m + K (post-processing). */
static inline double dpch_combine_f64(double m, int64_t noise, int k, double v) {
    if (isinf(m) || fabs(m) >= 85070591730234615865843651857942052864.0 /* 2^126 */)
        return v; /* |m| >= 2^126 > 2^75 |K|: m + K rounds to m, and r m == v */
    if (noise >= -9007199254740992LL && noise <= 9007199254740992LL) /* |K| <= 2^53: exact */
        return dpch_scale2(m + (double)noise, k); /* IEEE addition of exact operands is correctly rounded */
    dpch_i128 s = (dpch_i128)m + (dpch_i128)noise; /* exact */
    return dpch_scale2((double)s, k);
}

/* m = round_half_even(v / 2^k) for Int64 v, k >= 0. */
static inline int64_t dpch_grid_round_i64(int64_t v, int k) {
    if (k == 0) return v;
    if (k >= 64) return 0; /* |v| / 2^k <= 1/2, and the tie -1/2 rounds to 0 */
    dpch_i128 x = v;
    dpch_i128 q = x >> k; /* floor */
    dpch_i128 rem = x - q * ((dpch_i128)1 << k);
    dpch_i128 half = (dpch_i128)1 << (k - 1);
    if (rem > half || (rem == half && (q & 1))) q += 1;
    return (int64_t)q;
}

/* saturate(2^k (m + K)) for Int64 outputs. */
static inline int64_t dpch_combine_i64(int64_t m, int64_t noise, int k) {
    dpch_i128 s = (dpch_i128)m + (dpch_i128)noise;
    if (s == 0) return 0;
    if (k >= 64) return s > 0 ? INT64_MAX : INT64_MIN;
    dpch_i128 lim = (dpch_i128)INT64_MAX;
    if (s > (lim >> k)) return INT64_MAX;
    if (s < -((lim + 1) >> k)) return INT64_MIN;
    return (int64_t)(s * ((dpch_i128)1 << k));
}

/* ------------------------------------------------------------------------------------------ */
/* Bounded Laplace (biswal thesis §5.5, Def. 5.5.3) on the grid: constant-work sampler          */
/* ------------------------------------------------------------------------------------------ */
/*
 * The output is c + Z for Z discrete Laplace of scale t/2^shift (CKS20 Alg. 2) conditioned on
 * lo <= c + Z <= hi (grid units). Rejection sampling would run until a candidate lands in the
 * range, and its expected number of rounds (1/P(in range), between 1 and about 2) depends on the
 * centre c, hence on the data: a timing channel. Instead exactly K candidates are drawn every time
 * (K depends on the public scale and range only, dpch.mechanisms.bl_candidates) and the first one
 * in range is released; the choice is made without a data-dependent branch around the draws. If
 * none is in range (probability <= 2^-64 for that K) the clamp of the last candidate is released:
 * the output law is then within 2^-64 in total variation of the conditioned law, accounted as
 * δ = (1 + e^ε)·2^-64 (dpch.mechanisms.BoundedLaplaceMechanism). The draws Z_i do not depend on c,
 * so neither does the work.
 */
static inline dpch_i128 dpch_bounded_dlap(dpch_i128 c, dpch_i128 lo, dpch_i128 hi, uint64_t t,
                                          unsigned shift, uint64_t K) {
    dpch_i128 out = 0, last = c;
    int64_t found = 0;
    for (uint64_t i = 0; i < K; i++) {
        dpch_i128 v = c + (dpch_i128)dpch_dlap(t, shift, 0);
        int64_t in = (int64_t)((v >= lo) & (v <= hi));
        dpch_i128 take = (dpch_i128)0 - (dpch_i128)(in & (found ^ 1)); /* all ones or zero */
        out = (out & ~take) | (v & take);
        found |= in;
        last = v;
    }
    dpch_i128 fb = last < lo ? lo : (last > hi ? hi : last);
    dpch_i128 keep = (dpch_i128)0 - (dpch_i128)found;
    return (out & keep) | (fb & ~keep);
}

/* Grid bounds of [lo, hi] for the grid 2^k: *glo = ceil(lo / 2^k), *ghi = floor(hi / 2^k) as
 * integer-valued doubles. Returns 0, or 1 if |lo|/2^k or |hi|/2^k is not below 2^100, 2 if the
 * range holds no grid point. */
static inline int dpch_bounded_grid(double lo, double hi, int k, double *glo, double *ghi) {
    double a = dpch_scale2(lo, -k), b = dpch_scale2(hi, -k);
    const double lim = 1267650600228229401496703205376.0; /* 2^100 */
    if (!(fabs(a) < lim) || !(fabs(b) < lim)) return 1;
    *glo = ceil(a);
    *ghi = floor(b);
    if (*ghi < *glo) return 2;
    return 0;
}

/* One bounded Laplace release of a finite value v: clamp to [lo, hi], round half to even to the
 * grid 2^k, clamp to the grid bounds [glo, ghi] (from dpch_bounded_grid), then dpch_bounded_dlap;
 * the output 2^k (c + Z) is a correctly rounded double inside [lo, hi] (a function of the integer
 * c + Z alone: post-processing). */
static inline double dpch_bounded_release(double v, double lo, double hi, double glo, double ghi,
                                          int k, uint64_t t, unsigned shift, uint64_t K) {
    double x = v < lo ? lo : (v > hi ? hi : v);
    double m = dpch_grid_round(x, k);
    m = m < glo ? glo : (m > ghi ? ghi : m);
    dpch_i128 out = dpch_bounded_dlap((dpch_i128)m, (dpch_i128)glo, (dpch_i128)ghi, t, shift, K);
    return dpch_scale2((double)out, k);
}

/* The same on the grid {0..n} with the centre c in [0, n] (tests: the exact law is known). */
static inline int64_t dpch_bounded_units(int64_t c, int64_t n, uint64_t t, unsigned shift, uint64_t K) {
    return (int64_t)dpch_bounded_dlap((dpch_i128)c, 0, (dpch_i128)n, t, shift, K);
}

#endif /* DPCH_KERNEL_H */
