"""Tests of the executable UDF program (`python -m dpch.udf_entry <function>`,
udf/udf_program.pyx): the RowBinary + chunk-header protocol driven by hand-built byte streams, the
bad-input behaviour of docs/NOISE.md (exit 2 / exit 3, message on stderr, no un-noised output), and
the same functions through the embedded ClickHouse (chDB) with clickhouse_config/udf/*.xml.

Non-flakiness: checks that compare a noised value with its input use scales so small that a
correct implementation fails with negligible probability, stated at each check (e.g. Laplace noise
beyond 60 scales: exp(-60) per row). Moment checks use >= 6.5 standard errors (< 1e-9 each).
"""
from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("dpch._udf_program", reason="build the kernel: python3 setup.py build_ext --inplace")

REPO = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(
    [str(REPO)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))
INT64_MAX = 2**63 - 1


# ------------------------------------------------------------------------------------------------
# hand-built RowBinary streams
# ------------------------------------------------------------------------------------------------

def header(n: int) -> bytes:
    return f"{n}\n".encode()


def block_f64(values, scales) -> bytes:
    """Rows (value Float64, scale Float64)."""
    values = np.asarray(values, dtype="<f8")
    rows = np.empty(len(values), dtype=[("v", "<f8"), ("s", "<f8")])
    rows["v"] = values
    rows["s"] = scales
    return header(len(values)) + rows.tobytes()


def block_i64(values, scales) -> bytes:
    """Rows (value Int64, scale Float64)."""
    values = np.asarray(values, dtype="<i8")
    rows = np.empty(len(values), dtype=[("v", "<i8"), ("s", "<f8")])
    rows["v"] = values
    rows["s"] = scales
    return header(len(values)) + rows.tobytes()


def block_sigma(rows) -> bytes:
    return header(len(rows)) + b"".join(struct.pack("<ddd", *r) for r in rows)


# `python -m dpch.udf_entry` (what ClickHouse runs) first imports the dpch package, which currently
# pulls in pandas (~1-2 s per process on this machine). Most protocol tests start a fresh process,
# so they load the same compiled program directly; tests marked entry="module" use the real entry.
_DIRECT = (
    "import sys, importlib.util as u, importlib.machinery as m\n"
    "spec = m.PathFinder.find_spec('dpch._udf_program', u.find_spec('dpch').submodule_search_locations)\n"
    "mod = u.module_from_spec(spec)\n"
    "spec.loader.exec_module(mod)\n"
    "sys.exit(mod.run(sys.argv[1]))\n")


def run_udf(function: str | None, payload: bytes, *args: str, entry: str = "direct") -> subprocess.CompletedProcess:
    argv = ([function] if function is not None else []) + list(args)
    if entry == "module":
        cmd = [sys.executable, "-m", "dpch.udf_entry"] + argv
    else:
        assert len(argv) == 1
        cmd = [sys.executable, "-c", _DIRECT] + argv
    return subprocess.run(cmd, input=payload, capture_output=True, timeout=300, cwd=REPO, env=ENV)


def out_f64(proc) -> np.ndarray:
    assert len(proc.stdout) % 8 == 0
    return np.frombuffer(proc.stdout, dtype="<f8")


def out_i64(proc) -> np.ndarray:
    assert len(proc.stdout) % 8 == 0
    return np.frombuffer(proc.stdout, dtype="<i8")


BLOCK_SIZES = [0, 1, 2, 3, 7, 100, 1000, 0, 65536, 5, 1, 4096, 333, 0, 70000, 1, 2, 12345, 8, 1]


def _many_blocks(make, scale, dtype):
    payload, expected = [], []
    for b, n in enumerate(BLOCK_SIZES):
        values = (np.arange(n) + 1_000_000 * b).astype(dtype)
        payload.append(make(values, np.full(n, scale)))
        expected.append(values)
    return b"".join(payload), np.concatenate(expected)


# ------------------------------------------------------------------------------------------------
# protocol, driven as a subprocess
# ------------------------------------------------------------------------------------------------

def test_many_blocks_laplace_keeps_row_order():
    # scale 1e-6 on distinct values: |noise| > 60 scales has probability exp(-60) per row
    payload, values = _many_blocks(block_f64, 1e-6, np.float64)
    proc = run_udf("laplace", payload, entry="module")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == b""
    out = out_f64(proc)
    assert len(out) == len(values) == sum(BLOCK_SIZES)
    assert np.all(np.abs(out - values) <= 60e-6)
    assert np.any(out != values)  # noise was added (all equal: probability ~ 2^-40 per row)


def test_many_blocks_gaussian_keeps_row_order():
    # sigma 1e-6: |noise| > 12 sigma has probability < 1e-32 per row
    payload, values = _many_blocks(block_f64, 1e-6, np.float64)
    proc = run_udf("gaussian", payload)
    assert proc.returncode == 0, proc.stderr
    out = out_f64(proc)
    assert len(out) == len(values)
    assert np.all(np.abs(out - values) <= 12e-6)


def test_many_blocks_int_functions_exact_for_tiny_scales():
    # Int64 with r = 1: laplace_int scale 0.01 gives K != 0 w.p. 2e^-100/(1+e^-100) per row;
    # gaussian_int sigma 1e-3 gives K != 0 w.p. below exp(-5e5). So the output equals the input.
    payload, values = _many_blocks(block_i64, 0.01, np.int64)
    proc = run_udf("laplace_int", payload)
    assert proc.returncode == 0, proc.stderr
    assert np.array_equal(out_i64(proc), values)
    payload, values = _many_blocks(block_i64, 1e-3, np.int64)
    proc = run_udf("gaussian_int", payload)
    assert proc.returncode == 0, proc.stderr
    assert np.array_equal(out_i64(proc), values)


def test_scale_changing_row_by_row():
    # alternating scales exercise the per-row parameter cache: rows with scale 1e-6 stay within
    # 60 scales of their value; rows with scale 1e6 move (|noise| < 1 has probability ~1e-6 each,
    # and we only require that most of 5000 rows move)
    n = 10_000
    values = np.arange(n, dtype=np.float64)
    scales = np.where(np.arange(n) % 2 == 0, 1e-6, 1e6)
    proc = run_udf("laplace", block_f64(values, scales))
    assert proc.returncode == 0, proc.stderr
    out = out_f64(proc)
    assert np.all(np.abs(out[0::2] - values[0::2]) <= 60e-6)
    assert np.mean(np.abs(out[1::2] - values[1::2]) > 1.0) > 0.9


def test_empty_input_and_empty_blocks():
    proc = run_udf("laplace", b"")
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, b"", b"")
    proc = run_udf("gaussian_int", b"0\n0\n0\n")
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, b"", b"")


def test_one_row_block_then_one_million_rows():
    n = 1_000_000
    payload = block_f64([5.0], [1e-6]) + block_f64(np.zeros(n), np.ones(n)) + header(0) + block_f64([7.0], [1e-6])
    proc = run_udf("laplace", payload, entry="module")
    assert proc.returncode == 0, proc.stderr
    out = out_f64(proc)
    assert len(out) == n + 2
    assert abs(out[0] - 5.0) <= 60e-6 and abs(out[-1] - 7.0) <= 60e-6
    big = out[1:-1]
    # Laplace(1): mean 0 (s.e. sqrt(2/n) = 0.0014), variance 2 (s.e. sqrt(20/n) = 0.0045)
    assert abs(big.mean()) < 0.01
    assert abs(big.var() - 2.0) < 0.05
    assert len(np.unique(big)) > 0.99 * n  # independent draws, not one folded value


def test_gaussian_int_one_million_rows():
    n = 1_000_000
    proc = run_udf("gaussian_int", block_i64(np.zeros(n, dtype=np.int64), np.full(n, 3.0)))
    assert proc.returncode == 0, proc.stderr
    out = out_i64(proc)
    assert len(out) == n
    # discrete Gaussian sigma 3 (r = 1): variance 9 (s.e. 9 sqrt(2/n) = 0.0127)
    assert abs(out.mean()) < 0.03
    assert abs(out.var() - 9.0) < 0.1


BAD_FLOAT_ROWS = [
    ("laplace", float("nan"), 1.0, "value is NaN"),
    ("laplace", float("inf"), 1.0, "value is infinite"),
    ("laplace", float("-inf"), 1.0, "value is infinite"),
    ("laplace", 1.0, 0.0, "scale is not positive"),
    ("laplace", 1.0, -0.0, "scale is not positive"),
    ("laplace", 1.0, -2.0, "scale is not positive"),
    ("laplace", 1.0, float("nan"), "scale is NaN"),
    ("laplace", 1.0, float("inf"), "scale is infinite"),
    ("gaussian", float("nan"), 1.0, "value is NaN"),
    ("gaussian", float("-inf"), 1.0, "value is infinite"),
    ("gaussian", 1.0, 0.0, "sigma is not positive"),
    ("gaussian", 1.0, -1.0, "sigma is not positive"),
    ("gaussian", 1.0, float("nan"), "sigma is NaN"),
    ("gaussian", 1.0, float("-inf"), "sigma is infinite"),
]


@pytest.mark.parametrize("function,value,scale,problem", BAD_FLOAT_ROWS)
def test_bad_float_input_exits_2_without_output(function, value, scale, problem):
    good = block_f64([1.0, 2.0], [1.0, 1.0])
    bad = block_f64([123456.75, value, 3.0], [1.0, scale, 1.0])
    proc = run_udf(function, good + bad + good)
    assert proc.returncode == 2
    assert proc.stderr.decode() == f"dpch-udf {function}: {problem} (row 1 of block)\n"
    assert len(proc.stdout) == 16  # only the first (valid) block was answered
    assert b"123456" not in proc.stderr
    assert struct.pack("<d", 123456.75) not in proc.stdout  # no un-noised value


@pytest.mark.parametrize("function,scale,problem", [
    ("laplace_int", 0.0, "scale is not positive"),
    ("laplace_int", -1.0, "scale is not positive"),
    ("laplace_int", float("nan"), "scale is NaN"),
    ("laplace_int", float("inf"), "scale is infinite"),
    ("gaussian_int", 0.0, "sigma is not positive"),
    ("gaussian_int", float("nan"), "sigma is NaN"),
    ("gaussian_int", float("inf"), "sigma is infinite"),
])
def test_bad_int_scale_exits_2(function, scale, problem):
    proc = run_udf(function, block_i64([10, 20, 30], [1.0, 1.0, scale]))
    assert proc.returncode == 2
    assert proc.stderr.decode() == f"dpch-udf {function}: {problem} (row 2 of block)\n"
    assert proc.stdout == b""


@pytest.mark.parametrize("payload,problem", [
    (header(3) + struct.pack("<dddd", 1.0, 1.0, 2.0, 1.0), "truncated block (expected 3 rows, got 2)"),
    (header(1) + b"\x00" * 10, "truncated block (expected 1 rows, got 0)"),
    (b"12", "truncated chunk header"),
    (b"abc\n", "bad chunk header"),
    (b"-1\n", "bad chunk header"),
    (b"1 2\n", "bad chunk header"),
    (b"\n", "bad chunk header"),
    (b" 1\n" + struct.pack("<dd", 1.0, 1.0), "bad chunk header"),
    (b"9" * 40, "bad chunk header"),
    (b"99999999999999999999\n", "bad chunk header"),
])
def test_malformed_stream_exits_3(payload, problem):
    proc = run_udf("laplace", payload)
    assert proc.returncode == 3
    assert proc.stderr.decode() == f"dpch-udf laplace: malformed input: {problem}\n"


def test_malformed_after_valid_blocks():
    good = block_f64([1.0], [1e-6])
    proc = run_udf("laplace", good + good + b"xyz\n")
    assert proc.returncode == 3
    assert len(proc.stdout) == 16


def test_unknown_function_and_usage():
    proc = run_udf("uniform_noise", b"")
    assert proc.returncode == 2 and b"unknown function" in proc.stderr
    proc = run_udf(None, b"", entry="module")
    assert proc.returncode == 2 and b"usage" in proc.stderr
    proc = run_udf("laplace", b"", "extra", entry="module")
    assert proc.returncode == 2 and b"usage" in proc.stderr
    proc = run_udf("laplace", b"", entry="module")
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, b"", b"")


@pytest.fixture(scope="module")
def calibration():
    return pytest.importorskip("dpch.calibration")


def test_gaussian_sigma_matches_calibration(calibration):
    rows = [(1.0, 1.0, 1e-6), (1.0, 1.0, 1e-6), (2.0, 0.5, 1e-5), (1.0, 1.0, 1e-6), (10.0, 3.0, 1e-9)]
    proc = run_udf("gaussian_sigma", block_sigma(rows) + header(0) + block_sigma(rows[:1]), entry="module")
    assert proc.returncode == 0, proc.stderr
    expected = [calibration.udf_gaussian_sigma(*r) for r in rows + rows[:1]]
    assert out_f64(proc).tolist() == expected


@pytest.mark.parametrize("row,problem", [
    ((float("nan"), 1.0, 1e-6), "sensitivity is NaN"),
    ((1.0, float("inf"), 1e-6), "epsilon is infinite"),
    ((1.0, 1.0, float("nan")), "delta is NaN"),
])
def test_gaussian_sigma_non_finite_arguments(row, problem, calibration):
    proc = run_udf("gaussian_sigma", block_sigma([(1.0, 1.0, 1e-6), row]))
    assert proc.returncode == 2
    assert proc.stderr.decode() == f"dpch-udf gaussian_sigma: {problem} (row 1 of block)\n"
    assert proc.stdout == b""


@pytest.mark.parametrize("row,word", [((1.0, -1.0, 1e-6), "epsilon"), ((1.0, 1.0, 0.0), "delta"),
                                      ((1.0, 1.0, 1.5), "delta")])
def test_gaussian_sigma_invalid_parameters(row, word, calibration):
    proc = run_udf("gaussian_sigma", block_sigma([row]))
    assert proc.returncode == 2
    message = proc.stderr.decode()
    assert message.startswith("dpch-udf gaussian_sigma: ") and word in message
    assert message.endswith("(row 0 of block)\n")


# ------------------------------------------------------------------------------------------------
# through ClickHouse (chDB): the shared `db` fixture when it exists, else a private session
# ------------------------------------------------------------------------------------------------

class _OwnSession:
    """A chDB session with clickhouse_config/udf/*.xml and a launcher running this interpreter."""

    def __init__(self, tmp: Path):
        import shutil

        from chdb import session as chdb_session

        udf = tmp / "udf"
        udf.mkdir()
        for xml in (REPO / "clickhouse_config" / "udf").glob("*.xml"):
            shutil.copyfile(xml, udf / xml.name)
        launcher = udf / "dpch-udf"
        launcher.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m dpch.udf_entry "$@"\n')
        launcher.chmod(0o755)
        self.session = chdb_session.Session(f"{tmp}/data?udf_path={udf}")

    def raw_query(self, sql):
        return self.session.query(sql, "DataFrame")

    def close(self):
        self.session.close()


@pytest.fixture(scope="module")
def engine(request, tmp_path_factory):
    pytest.importorskip("chdb")
    # the pool processes inherit this environment: make `-m dpch.udf_entry` importable from any cwd
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = ENV["PYTHONPATH"]
    own = None
    try:
        try:
            conn = request.getfixturevalue("db")
        except pytest.FixtureLookupError:
            own = conn = _OwnSession(tmp_path_factory.mktemp("dpch_udf_chdb"))
        yield conn
    finally:
        if own is not None:
            own.close()
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


def test_chdb_all_functions(engine):
    df = engine.raw_query(
        "SELECT number AS n, dpch_laplace(toFloat64(number), 1e-6) AS l, "
        "dpch_gaussian(toFloat64(number), 1e-6) AS g, "
        "dpch_laplace_int(toInt64(number), 0.01) AS li, dpch_gaussian_int(toInt64(number), 1e-3) AS gi "
        "FROM numbers(5000) ORDER BY n")
    n = df["n"].to_numpy().astype(float)
    assert len(df) == 5000
    assert np.all(np.abs(df["l"].to_numpy() - n) <= 60e-6)   # exp(-60) per row
    assert np.all(np.abs(df["g"].to_numpy() - n) <= 12e-6)   # < 1e-32 per row
    assert np.array_equal(df["li"].to_numpy(), df["n"].to_numpy().astype(np.int64))  # r = 1, K = 0 a.s.
    assert np.array_equal(df["gi"].to_numpy(), df["n"].to_numpy().astype(np.int64))


def test_chdb_pool_reused_across_queries(engine):
    # sum of 200000 Laplace(1) draws: s.d. sqrt(2 * 200000) = 632; 7 s.d. = 4427
    true = 199_999 * 200_000 / 2
    for _ in range(6):
        df = engine.raw_query("SELECT sum(dpch_laplace(toFloat64(number), 1.0)) AS s FROM numbers(200000)")
        assert abs(float(df["s"].iloc[0]) - true) < 4427


def test_chdb_one_million_rows_independent_noise(engine):
    # the value argument varies per row, so every row gets its own draw
    df = engine.raw_query(
        "SELECT count() AS c, varPop(x) AS v, uniqExact(x) AS u FROM "
        "(SELECT dpch_laplace(toFloat64(number % 2), 1.0) - (number % 2) AS x FROM numbers(1000000))")
    assert int(df["c"].iloc[0]) == 1_000_000
    assert abs(float(df["v"].iloc[0]) - 2.0) < 0.05  # s.e. 0.0045
    assert int(df["u"].iloc[0]) > 990_000


def test_chdb_gaussian_sigma(engine, calibration):
    df = engine.raw_query("SELECT dpch_gaussian_sigma(1.0, 1.0, 1e-6) AS s1, "
                          "dpch_gaussian_sigma(2.0, 0.5, 1e-5) AS s2")
    assert float(df["s1"].iloc[0]) == calibration.udf_gaussian_sigma(1.0, 1.0, 1e-6)
    assert float(df["s2"].iloc[0]) == calibration.udf_gaussian_sigma(2.0, 0.5, 1e-5)


@pytest.mark.parametrize("sql,problem", [
    ("SELECT dpch_laplace(toFloat64(number) / 0, 1.0) FROM numbers(1)", "value is NaN"),
    ("SELECT dpch_laplace(toFloat64(number) + 1, 0.0) FROM numbers(3)", "scale is not positive"),
    ("SELECT dpch_gaussian_int(toInt64(number), -1.0) FROM numbers(3)", "sigma is not positive"),
])
def test_chdb_bad_input_raises_clean_error(engine, sql, problem):
    with pytest.raises(Exception) as exc:
        engine.raw_query(sql)
    message = str(exc.value)
    assert problem in message and "dpch-udf" in message
    # the pool recovers: the next query works
    df = engine.raw_query("SELECT dpch_laplace(toFloat64(number), 1e-6) AS x FROM numbers(3)")
    assert np.all(np.abs(df["x"].to_numpy() - np.arange(3)) <= 60e-6)


def test_chdb_null_is_rejected_before_the_program(engine):
    with pytest.raises(Exception):
        engine.raw_query("SELECT dpch_laplace(NULL, 1.0)")
