# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The DPCH executable UDF program (`dpch._udf_program`), run by ClickHouse as an executable_pool
(`dpch-udf <function>`, i.e. `python -m dpch.udf_entry <function>`).

Protocol: format RowBinary with send_chunk_header=1. Each block is a text line "N\\n" followed by N
rows of RowBinary arguments; the program writes exactly N RowBinary results with one write(2) per
chunk (no userspace buffering, so every block is flushed) and loops until EOF on stdin.

Functions (docs/NOISE.md):
  laplace        (value Float64, scale Float64) -> Float64
  laplace_int    (value Int64,   scale Float64) -> Int64
  gaussian       (value Float64, sigma Float64) -> Float64
  gaussian_int   (value Int64,   sigma Float64) -> Int64
  gaussian_sigma (sensitivity Float64, epsilon Float64, delta Float64) -> Float64
  quantiles      (keys Array(UInt32), counts Array(UInt64), buckets UInt32, levels Array(Float64),
                  epsilon Float64, rows UInt64) -> Array(UInt32)
                 the buckets chosen for the quantile levels from a sparse histogram over the grid
                 0..buckets-1 (kernel.pxi _quantile_buckets; eps-DP when one privacy unit holds at
                 most `rows` rows of the histogram)
  top_k          (scores Array(Int64), n UInt32, epsilon Float64, sensitivity UInt64) -> Array(UInt32)
                 the 0-based indices of n scores chosen by peeling permute-and-flip, in the order
                 chosen (kernel.pxi _top_k; eps-DP when each score moves by at most `sensitivity`)
  bounded_laplace (value Float64, scale Float64, lo Float64, hi Float64) -> Float64
                 the bounded Laplace mechanism (biswal thesis §5.5): value clamped to [lo, hi] and
                 rounded to the grid r = grid(scale, 40), discrete Laplace noise conditioned on
                 the grid points of [lo, hi] by K candidates drawn every time (constant work;
                 dpch.mechanisms.BoundedLaplaceMechanism gives the privacy relation)
  bounded_laplace_scale (sensitivity Float64, epsilon Float64, delta Float64, lo Float64,
                 hi Float64) -> Float64
                 the least scale b with BoundedLaplaceMechanism(b, lo, hi) (epsilon, delta)-DP
                 at that sensitivity (Thm 5.5.5 on the grid)
  partition_select (n Int64, epsilon Float64, delta Float64, threshold Int64) -> Int64
                 private partition selection by the optimal rule (Desfontaines et al., PoPETs 2022,
                 Thm 1) for a group of n >= 0 distinct units: the released count n - J + t, where
                 the group is released iff it is >= t (dpch/partition_selection.py; (epsilon,
                 delta)-DP per group, the count included). `threshold` must equal the table's t
                 (the caller's WHERE uses it): a planner and a UDF program of different versions
                 fail instead of releasing at another threshold

Bad input: a NaN/Inf value or a scale that is <= 0, NaN or Inf -> message on stderr
"dpch-udf <function>: <problem> (row <i> of block)" and exit status 2; a malformed stream
(bad chunk header, truncated block) -> stderr message and exit status 3. No un-noised value is
ever written: a row is written only after its noise has been added. The module does not import
numpy, so a pool process starts quickly.
"""
include "kernel.pxi"

import sys

from libc.errno cimport EINTR, errno
from libc.stdint cimport uint32_t
from libc.math cimport isfinite, isnan
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memchr, memcpy, memmove
from posix.unistd cimport read, write

cdef enum:
    IN_CAP = 1 << 22          # input buffer (bytes); grows for one large array row
    MAX_ROW = 1 << 26         # the largest array row (bytes): 64 MiB
    MAX_HEADER = 24           # "N\n": at most 19 digits + newline (+ slack)

cdef enum:
    F_LAPLACE = 0
    F_LAPLACE_INT = 1
    F_GAUSSIAN = 2
    F_GAUSSIAN_INT = 3
    F_GAUSSIAN_SIGMA = 4
    F_QUANTILES = 5
    F_PARTITION_SELECT = 6
    F_TOP_K = 7
    F_BOUNDED_LAPLACE = 8
    F_BOUNDED_LAPLACE_SCALE = 9

FUNCTIONS = {
    "laplace": F_LAPLACE,
    "laplace_int": F_LAPLACE_INT,
    "gaussian": F_GAUSSIAN,
    "gaussian_int": F_GAUSSIAN_INT,
    "gaussian_sigma": F_GAUSSIAN_SIGMA,
    "quantiles": F_QUANTILES,
    "partition_select": F_PARTITION_SELECT,
    "top_k": F_TOP_K,
    "bounded_laplace": F_BOUNDED_LAPLACE,
    "bounded_laplace_scale": F_BOUNDED_LAPLACE_SCALE,
}

EXIT_OK = 0
EXIT_BAD_VALUE = 2
EXIT_MALFORMED = 3


def _array_u32(values):
    """RowBinary Array(UInt32): LEB128 length, then little-endian values."""
    out = bytearray()
    n = len(values)
    while True:
        byte = n & 0x7F
        n >>= 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            break
    for b in values:
        out += (<uint32_t>b).to_bytes(4, "little")
    return bytes(out)


class _Stop(Exception):
    """Ends the program with an exit status and a message for stderr."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status
        self.message = message


cdef class _Program:
    cdef str name
    cdef int fn
    cdef unsigned char *inbuf
    cdef Py_ssize_t cap
    cdef Py_ssize_t start, end
    cdef bint eof
    cdef unsigned char *outbuf
    # cached per-scale parameters (the scale column is usually constant)
    cdef bint have_scale
    cdef uint64_t scale_bits
    cdef dpch_params params
    cdef dpch_dg dg
    # gaussian_sigma cache
    cdef object sigma_fn
    cdef dict sigma_cache
    cdef double last_args[3]
    cdef double last_sigma
    cdef bint have_last
    # partition_select: the current table and the cache of tables per (epsilon, delta)
    cdef dict sel_cache
    cdef _SelectionTable sel
    cdef double sel_args[2]
    cdef int64_t sel_threshold
    # bounded_laplace: parameters of the current (scale, lo, hi), and calibrated scales
    cdef bint have_bl
    cdef double bl_args[3]
    cdef double bl_glo, bl_ghi
    cdef uint64_t bl_K
    cdef dict bl_cache

    def __cinit__(self, str name, int fn):
        self.name = name
        self.fn = fn
        self.inbuf = <unsigned char *>malloc(IN_CAP)
        self.cap = IN_CAP
        # at most IN_CAP / 16 rows are processed per chunk, 8 output bytes each
        self.outbuf = <unsigned char *>malloc(IN_CAP // 2 + 64)
        if self.inbuf == NULL or self.outbuf == NULL:
            raise MemoryError()
        self.start = 0
        self.end = 0
        self.eof = False
        self.have_scale = False
        self.sigma_fn = None
        self.sigma_cache = {}
        self.have_last = False
        self.sel_cache = {}
        self.sel = None
        self.have_bl = False
        self.bl_cache = {}

    def __dealloc__(self):
        free(self.inbuf)
        free(self.outbuf)

    # ---------------------------------------------------------------- I/O

    cdef int _fill(self) except -1:
        """Read more input after compacting the buffer. Sets eof on end of input."""
        cdef Py_ssize_t n
        if self.start > 0:
            if self.end > self.start:
                memmove(self.inbuf, self.inbuf + self.start, self.end - self.start)
            self.end -= self.start
            self.start = 0
        if self.end >= self.cap:
            return 0
        while True:
            n = read(0, self.inbuf + self.end, self.cap - self.end)
            if n < 0:
                if errno == EINTR:
                    continue
                raise _Stop(EXIT_MALFORMED, f"cannot read input (errno {errno})")
            break
        if n == 0:
            self.eof = True
        self.end += n
        return 0

    cdef int _write_all(self, const unsigned char *p, Py_ssize_t n) except -1:
        cdef Py_ssize_t w
        while n > 0:
            w = write(1, p, n)
            if w < 0:
                if errno == EINTR:
                    continue
                raise _Stop(1, f"cannot write output (errno {errno})")
            p += w
            n -= w
        return 0

    cdef long long _header(self) except -2:
        """Parse the chunk header "N\\n". Returns N, or -1 at a clean end of input."""
        cdef unsigned char *nl
        cdef Py_ssize_t length, i
        cdef long long value
        cdef unsigned char c
        while True:
            nl = <unsigned char *>memchr(self.inbuf + self.start, 10, self.end - self.start)
            if nl != NULL:
                break
            if self.end - self.start > MAX_HEADER:
                raise _Stop(EXIT_MALFORMED, "malformed input: bad chunk header")
            if self.eof:
                if self.end == self.start:
                    return -1
                raise _Stop(EXIT_MALFORMED, "malformed input: truncated chunk header")
            self._fill()
        length = nl - (self.inbuf + self.start)
        if length < 1 or length > 18:
            raise _Stop(EXIT_MALFORMED, "malformed input: bad chunk header")
        value = 0
        for i in range(length):
            c = self.inbuf[self.start + i]
            if c < 48 or c > 57:
                raise _Stop(EXIT_MALFORMED, "malformed input: bad chunk header")
            value = value * 10 + (c - 48)
        self.start += length + 1
        return value

    # ---------------------------------------------------------------- parameters

    cdef int _bad_scale(self, int code, Py_ssize_t row) except -1:
        cdef str what = "scale" if self.fn in (F_LAPLACE, F_LAPLACE_INT) else "sigma"
        cdef str problem
        if code == 1:
            problem = "is NaN"
        elif code == 2:
            problem = "is infinite"
        else:
            problem = "is not positive"
        raise _Stop(EXIT_BAD_VALUE, f"{what} {problem} (row {row} of block)")

    cdef inline int _set_scale(self, double scale, Py_ssize_t row) except -1:
        cdef uint64_t bits
        memcpy(&bits, &scale, 8)
        if self.have_scale and bits == self.scale_bits:
            return 0
        cdef int code = dpch_check_scale(scale)
        if code != 0:
            self._bad_scale(code, row)
        if self.fn == F_LAPLACE or self.fn == F_LAPLACE_INT:
            dpch_params_compute(scale, LAPLACE_BITS, self.fn == F_LAPLACE_INT, &self.params)
        else:
            dpch_params_compute(scale, GAUSSIAN_BITS, self.fn == F_GAUSSIAN_INT, &self.params)
            dpch_dg_init(&self.dg, self.params.num, self.params.den_log2)
        self.scale_bits = bits
        self.have_scale = True
        return 0

    cdef int _bad_value(self, double v, Py_ssize_t row) except -1:
        raise _Stop(EXIT_BAD_VALUE,
                    f"value is {'NaN' if isnan(v) else 'infinite'} (row {row} of block)")

    # ---------------------------------------------------------------- row kernels

    cdef int _rows_noise(self, const unsigned char *src, Py_ssize_t nrows,
                         Py_ssize_t row0) except -1:
        """Noise nrows rows of (value, scale) from src into outbuf."""
        cdef Py_ssize_t i
        cdef double v, scale, out_f
        cdef int64_t iv, out_i, noise
        cdef int fn = self.fn
        cdef unsigned char *dst = self.outbuf
        for i in range(nrows):
            memcpy(&scale, src + 16 * i + 8, 8)
            self._set_scale(scale, row0 + i)
            if fn == F_LAPLACE or fn == F_GAUSSIAN:
                memcpy(&v, src + 16 * i, 8)
                if not isfinite(v):
                    self._bad_value(v, row0 + i)
                if fn == F_LAPLACE:
                    noise = dpch_dlap(self.params.num, self.params.den_log2, 0)
                else:
                    _dg_draw(&self.dg, &noise)
                out_f = dpch_combine_f64(dpch_grid_round(v, self.params.k), noise,
                                         self.params.k, v)
                memcpy(dst + 8 * i, &out_f, 8)
            else:
                memcpy(&iv, src + 16 * i, 8)
                if fn == F_LAPLACE_INT:
                    noise = dpch_dlap(self.params.num, self.params.den_log2, 0)
                else:
                    _dg_draw(&self.dg, &noise)
                out_i = dpch_combine_i64(dpch_grid_round_i64(iv, self.params.k), noise,
                                         self.params.k)
                memcpy(dst + 8 * i, &out_i, 8)
        return 0

    cdef int _rows_sigma(self, const unsigned char *src, Py_ssize_t nrows,
                         Py_ssize_t row0) except -1:
        """gaussian_sigma(sensitivity, epsilon, delta) for nrows rows (cached per distinct tuple)."""
        cdef Py_ssize_t i, j
        cdef double a[3]
        cdef double sigma
        for i in range(nrows):
            memcpy(a, src + 24 * i, 24)
            if self.have_last and a[0] == self.last_args[0] and a[1] == self.last_args[1] \
                    and a[2] == self.last_args[2]:
                sigma = self.last_sigma
            else:
                for j in range(3):
                    if not isfinite(a[j]):
                        name = ("sensitivity", "epsilon", "delta")[j]
                        raise _Stop(EXIT_BAD_VALUE,
                                    f"{name} is {'NaN' if isnan(a[j]) else 'infinite'} "
                                    f"(row {row0 + i} of block)")
                sigma = self._sigma(a[0], a[1], a[2], row0 + i)
                memcpy(self.last_args, a, 24)
                self.last_sigma = sigma
                self.have_last = True
            memcpy(self.outbuf + 8 * i, &sigma, 8)
        return 0

    cdef double _sigma(self, double sens, double eps, double delta, Py_ssize_t row) except? -1.0:
        key = (sens, eps, delta)
        cached = self.sigma_cache.get(key)
        if cached is not None:
            return cached
        if self.sigma_fn is None:
            try:
                from dpch.calibration import udf_gaussian_sigma
            except ImportError:
                raise _Stop(EXIT_BAD_VALUE, "dpch.calibration.udf_gaussian_sigma is not available")
            self.sigma_fn = udf_gaussian_sigma
        try:
            value = float(self.sigma_fn(sens, eps, delta))
        except Exception as exc:  # fail closed: any calibration failure ends the query
            raise _Stop(EXIT_BAD_VALUE, f"{exc} (row {row} of block)")
        if not isfinite(value) or not value > 0:
            raise _Stop(EXIT_BAD_VALUE, f"calibrated sigma is not finite and positive "
                                        f"(row {row} of block)")
        if len(self.sigma_cache) > 100000:
            self.sigma_cache.clear()
        self.sigma_cache[key] = value
        return value

    cdef int _rows_select(self, const unsigned char *src, Py_ssize_t nrows,
                          Py_ssize_t row0) except -1:
        """partition_select(n, epsilon, delta, threshold) for nrows rows: the released count of
        each group (the table is cached per distinct (epsilon, delta))."""
        cdef Py_ssize_t i
        cdef int64_t n, out, threshold
        cdef double a[2]
        for i in range(nrows):
            memcpy(&n, src + 32 * i, 8)
            memcpy(a, src + 32 * i + 8, 16)
            memcpy(&threshold, src + 32 * i + 24, 8)
            if self.sel is None or a[0] != self.sel_args[0] or a[1] != self.sel_args[1]:
                self._select_table(a[0], a[1], row0 + i)
            if threshold != self.sel_threshold:
                raise _Stop(EXIT_BAD_VALUE, f"threshold does not match the selection table's "
                                            f"(row {row0 + i} of block)")
            if n < 0:
                raise _Stop(EXIT_BAD_VALUE, f"the count of units is negative (row {row0 + i} of block)")
            out = self.sel.draw(n)
            memcpy(self.outbuf + 8 * i, &out, 8)
        return 0

    cdef int _select_table(self, double eps, double delta, Py_ssize_t row) except -1:
        key = (eps, delta)
        table = self.sel_cache.get(key)
        if table is None:
            if not isfinite(eps) or not eps > 0:
                raise _Stop(EXIT_BAD_VALUE, f"epsilon must be a finite number > 0 (row {row} of block)")
            if not isfinite(delta) or not (0 < delta < 1):
                raise _Stop(EXIT_BAD_VALUE, f"delta must be a number in (0, 1) (row {row} of block)")
            try:
                table = selection_table(eps, delta)
            except ValueError as exc:  # fail closed: nothing is released without a valid table
                raise _Stop(EXIT_BAD_VALUE, f"{exc} (row {row} of block)")
            if len(self.sel_cache) > 64:
                self.sel_cache.clear()
            self.sel_cache[key] = table
        self.sel = table
        self.sel_threshold = table.threshold
        self.sel_args[0] = eps
        self.sel_args[1] = delta
        return 0

    cdef int _bl_params(self, double scale, double lo, double hi, Py_ssize_t row) except -1:
        """Checks (scale, lo, hi) and sets the grid, the grid bounds and K (cached while the
        arguments repeat). Messages name the argument, never a value."""
        cdef int code = dpch_check_scale(scale)
        if code != 0:
            raise _Stop(EXIT_BAD_VALUE, f"scale {('is NaN', 'is infinite', 'is not positive')[code - 1]} "
                                        f"(row {row} of block)")
        if not isfinite(lo):
            raise _Stop(EXIT_BAD_VALUE, f"lo is {'NaN' if isnan(lo) else 'infinite'} (row {row} of block)")
        if not isfinite(hi):
            raise _Stop(EXIT_BAD_VALUE, f"hi is {'NaN' if isnan(hi) else 'infinite'} (row {row} of block)")
        if not lo < hi:
            raise _Stop(EXIT_BAD_VALUE, f"hi must be greater than lo (row {row} of block)")
        dpch_params_compute(scale, LAPLACE_BITS, 0, &self.params)
        if dpch_bounded_grid(lo, hi, self.params.k, &self.bl_glo, &self.bl_ghi) != 0:
            raise _Stop(EXIT_BAD_VALUE, f"lo, hi do not fit the noise grid of scale "
                                        f"(row {row} of block)")
        try:
            from dpch.mechanisms import bounded_laplace_candidates
            self.bl_K = bounded_laplace_candidates(scale, lo, hi)
        except Exception as exc:  # fail closed
            raise _Stop(EXIT_BAD_VALUE, f"{exc} (row {row} of block)")
        self.bl_args[0] = scale
        self.bl_args[1] = lo
        self.bl_args[2] = hi
        self.have_bl = True
        return 0

    cdef int _rows_bounded(self, const unsigned char *src, Py_ssize_t nrows,
                           Py_ssize_t row0) except -1:
        """bounded_laplace(value, scale, lo, hi) for nrows rows."""
        cdef Py_ssize_t i
        cdef double a[4]
        cdef double out
        for i in range(nrows):
            memcpy(a, src + 32 * i, 32)
            if not (self.have_bl and a[1] == self.bl_args[0] and a[2] == self.bl_args[1]
                    and a[3] == self.bl_args[2]):
                self._bl_params(a[1], a[2], a[3], row0 + i)
            if not isfinite(a[0]):
                self._bad_value(a[0], row0 + i)
            out = dpch_bounded_release(a[0], a[2], a[3], self.bl_glo, self.bl_ghi, self.params.k,
                                       self.params.num, self.params.den_log2, self.bl_K)
            memcpy(self.outbuf + 8 * i, &out, 8)
        return 0

    cdef int _rows_bl_scale(self, const unsigned char *src, Py_ssize_t nrows,
                            Py_ssize_t row0) except -1:
        """bounded_laplace_scale(sensitivity, epsilon, delta, lo, hi) for nrows rows."""
        cdef Py_ssize_t i
        cdef double a[5]
        cdef double b
        for i in range(nrows):
            memcpy(a, src + 40 * i, 40)
            key = (a[0], a[1], a[2], a[3], a[4])
            cached = self.bl_cache.get(key)
            if cached is None:
                bad = [j for j in range(5) if not isfinite(a[j])]
                if bad:
                    raise _Stop(EXIT_BAD_VALUE, f"{('sensitivity', 'epsilon', 'delta', 'lo', 'hi')[bad[0]]} "
                                                f"is {'NaN' if isnan(a[bad[0]]) else 'infinite'} "
                                                f"(row {row0 + i} of block)")
                try:
                    from dpch.mechanisms import BoundedLaplaceMechanism
                    cached = float(BoundedLaplaceMechanism.calibrated(a[0], a[1], a[2], a[3], a[4]).scale)
                except Exception as exc:  # fail closed: any calibration failure ends the query
                    raise _Stop(EXIT_BAD_VALUE, f"{exc} (row {row0 + i} of block)")
                if len(self.bl_cache) > 10000:
                    self.bl_cache.clear()
                self.bl_cache[key] = cached
            b = cached
            memcpy(self.outbuf + 8 * i, &b, 8)
        return 0

    # ---------------------------------------------------------------- main loop

    cdef int _block(self, long long nrows) except -1:
        cdef Py_ssize_t rowsize = 24 if self.fn == F_GAUSSIAN_SIGMA else (32 if self.fn == F_PARTITION_SELECT else 16)
        if self.fn == F_BOUNDED_LAPLACE:
            rowsize = 32
        elif self.fn == F_BOUNDED_LAPLACE_SCALE:
            rowsize = 40
        cdef Py_ssize_t done = 0, avail, take
        while done < nrows:
            avail = (self.end - self.start) // rowsize
            if avail == 0:
                if self.eof:
                    raise _Stop(EXIT_MALFORMED,
                                f"malformed input: truncated block (expected {nrows} rows, "
                                f"got {done})")
                self._fill()
                continue
            take = avail if avail < nrows - done else nrows - done
            if take > IN_CAP // rowsize:  # the output buffer's capacity
                take = IN_CAP // rowsize
            if self.fn == F_GAUSSIAN_SIGMA:
                self._rows_sigma(self.inbuf + self.start, take, done)
            elif self.fn == F_PARTITION_SELECT:
                self._rows_select(self.inbuf + self.start, take, done)
            elif self.fn == F_BOUNDED_LAPLACE:
                self._rows_bounded(self.inbuf + self.start, take, done)
            elif self.fn == F_BOUNDED_LAPLACE_SCALE:
                self._rows_bl_scale(self.inbuf + self.start, take, done)
            else:
                self._rows_noise(self.inbuf + self.start, take, done)
            self._write_all(self.outbuf, 8 * take)
            self.start += take * rowsize
            done += take
        return 0

    # ---------------------------------------------------------------- variable-size rows

    cdef int _need(self, Py_ssize_t have) except -1:
        """Make at least `have` bytes available from self.start (offsets stay valid: _fill only
        moves the unread part to the buffer's start)."""
        cdef unsigned char *grown
        while self.end - self.start < have:
            if have > MAX_ROW:
                raise _Stop(EXIT_BAD_VALUE, "a row is larger than 64 MiB (too many buckets or scores)")
            if have > self.cap - self.start:
                if self.start > 0:  # compact first: offsets are relative to self.start
                    memmove(self.inbuf, self.inbuf + self.start, self.end - self.start)
                    self.end -= self.start
                    self.start = 0
                if have > self.cap:
                    grown = <unsigned char *>realloc(self.inbuf, MAX_ROW if have > MAX_ROW // 2 else 2 * have)
                    if grown == NULL:
                        raise MemoryError()
                    self.inbuf = grown
                    self.cap = MAX_ROW if have > MAX_ROW // 2 else 2 * have
            if self.eof:
                raise _Stop(EXIT_MALFORMED, "malformed input: truncated row")
            self._fill()
        return 0

    cdef Py_ssize_t _varint(self, Py_ssize_t *off) except -1:
        """A LEB128 array length at self.start + off[0]; advances off."""
        cdef Py_ssize_t value = 0
        cdef int shift = 0
        cdef unsigned char c
        while True:
            self._need(off[0] + 1)
            c = self.inbuf[self.start + off[0]]
            off[0] += 1
            value |= (<Py_ssize_t>(c & 0x7F)) << shift
            if c < 0x80:
                return value
            shift += 7
            if shift > 35:
                raise _Stop(EXIT_MALFORMED, "malformed input: bad array length")

    cdef bytes _quantile_row(self, Py_ssize_t row) except *:
        """Parse one row of `quantiles` at self.start, consume it, return its RowBinary result."""
        cdef Py_ssize_t off = 0, m, m2, nlev, i
        cdef uint32_t buckets
        cdef double eps, level
        cdef uint64_t rows
        m = self._varint(&off)
        self._need(off + 4 * m)
        cdef Py_ssize_t keys_off = off
        off += 4 * m
        m2 = self._varint(&off)
        if m2 != m:
            raise _Stop(EXIT_BAD_VALUE, f"keys and counts differ in length (row {row} of block)")
        self._need(off + 8 * m + 4)
        cdef Py_ssize_t counts_off = off
        off += 8 * m
        memcpy(&buckets, self.inbuf + self.start + off, 4)
        off += 4
        nlev = self._varint(&off)
        self._need(off + 8 * nlev + 16)
        levels = []
        for i in range(nlev):
            memcpy(&level, self.inbuf + self.start + off + 8 * i, 8)
            levels.append(level)
        off += 8 * nlev
        memcpy(&eps, self.inbuf + self.start + off, 8)
        memcpy(&rows, self.inbuf + self.start + off + 8, 8)
        off += 16
        cdef uint32_t *keys = <uint32_t *>malloc(4 * m + 4)
        cdef uint64_t *counts = <uint64_t *>malloc(8 * m + 8)
        cdef uint64_t *cum = <uint64_t *>malloc(8 * m + 8)
        try:
            if keys == NULL or counts == NULL or cum == NULL:
                raise MemoryError()
            memcpy(keys, self.inbuf + self.start + keys_off, 4 * m)
            memcpy(counts, self.inbuf + self.start + counts_off, 8 * m)
            self.start += off
            problem = _histogram_problem(keys, counts, m, buckets, cum)
            if problem is None:
                problem = _quantile_parameters(eps, rows, buckets)
            if problem is None:
                try:
                    problem_levels = quantile_levels(levels)
                except ValueError as exc:
                    problem = str(exc)
            if problem is not None:
                raise _Stop(EXIT_BAD_VALUE, f"{problem} (row {row} of block)")
            chosen = _quantile_buckets(keys, cum, m, buckets, problem_levels, eps, rows)
        finally:
            free(keys)
            free(counts)
            free(cum)
        return _array_u32(chosen)

    cdef bytes _top_k_row(self, Py_ssize_t row) except *:
        """Parse one row of `top_k` at self.start, consume it, return its RowBinary result (the
        chosen indices, 0-based, in the order chosen)."""
        cdef Py_ssize_t off = 0, m
        cdef uint32_t n
        cdef double eps
        cdef uint64_t sens
        m = self._varint(&off)
        self._need(off + 8 * m + 20)
        cdef Py_ssize_t scores_off = off
        off += 8 * m
        memcpy(&n, self.inbuf + self.start + off, 4)
        memcpy(&eps, self.inbuf + self.start + off + 4, 8)
        memcpy(&sens, self.inbuf + self.start + off + 12, 8)
        off += 20
        cdef int64_t *scores = <int64_t *>malloc(8 * m + 8)
        try:
            if scores == NULL:
                raise MemoryError()
            memcpy(scores, self.inbuf + self.start + scores_off, 8 * m)
            self.start += off
            problem = _top_k_problem(scores, m, n, eps, sens)
            if problem is not None:
                raise _Stop(EXIT_BAD_VALUE, f"{problem} (row {row} of block)")
            chosen = _top_k(scores, m, n, eps, sens)
        finally:
            free(scores)
        return _array_u32(chosen)

    cdef int _block_arrays(self, long long nrows) except -1:
        cdef long long i
        parts = []
        for i in range(nrows):
            parts.append(self._top_k_row(i) if self.fn == F_TOP_K else self._quantile_row(i))
        data = b"".join(parts)
        self._write_all(data, len(data))
        return 0

    cdef int _loop(self) except -1:
        cdef long long n
        while True:
            n = self._header()
            if n < 0:
                return 0
            if self.fn == F_QUANTILES or self.fn == F_TOP_K:
                self._block_arrays(n)
            else:
                self._block(n)


def run(str function):
    """Serve `function` on stdin/stdout until EOF. Returns the process exit status (0 at EOF,
    2 bad value or scale, 3 malformed input); messages go to stderr."""
    fn = FUNCTIONS.get(function)
    if fn is None:
        sys.stderr.write(f"dpch-udf: unknown function {function!r} "
                         f"(expected one of: {', '.join(FUNCTIONS)})\n")
        sys.stderr.flush()
        return EXIT_BAD_VALUE
    cdef _Program prog = _Program(function, fn)
    try:
        prog._loop()
    except _Stop as stop:
        sys.stderr.write(f"dpch-udf {function}: {stop.message}\n")
        sys.stderr.flush()
        return stop.status
    return EXIT_OK
