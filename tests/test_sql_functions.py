"""End-to-end tests of the public SQL functions (dp_count, dp_sum, dp_avg and the Gaussian
variants) on the embedded engine.

Sample sizes and tolerances: every statistical check below compares an estimate with its exact
expectation using a tolerance of at least 8 standard errors, so a correct implementation fails with
probability below 1e-12 per check (normal approximation; the estimates are means/variances of
200 000 iid draws, far into the CLT regime even for the heavy-tailed Laplace: its excess kurtosis
is 3, so the variance estimate has relative standard error sqrt(5/N) = 0.5%). The discrete Laplace
is slightly heavier (excess kurtosis 3.13 at ε = 0.5, 3.54 at ε = 1), so 8·sqrt(5/N) is 7.9 and 7.6
true standard errors; with the skewness of the squared noise (Cramér correction ≈ 3x at this N) a
correct implementation still fails such a check with probability below 1e-12.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from dpch.errors import BackendError

N = 200_000  # draws per statistical test; one query draws them all (one group per draw)
ROWS_PER_GROUP = 10


def discrete_laplace_variance(scale: float) -> float:
    """Exact variance of the discrete Laplace with pmf ∝ exp(-|k|/scale) (CKS20, Sec. 2):
    2 e^{-1/t} / (1 - e^{-1/t})^2."""
    q = math.exp(-1.0 / scale)
    return 2 * q / (1 - q) ** 2


@pytest.fixture(scope="module")
def sqlfn(db):
    db.command("CREATE DATABASE IF NOT EXISTS t_sqlfn")
    db.command("DROP TABLE IF EXISTS t_sqlfn.purchases")
    db.command("CREATE TABLE t_sqlfn.purchases (user_id UInt64, region String, amount Float64) "
               "ENGINE = MergeTree ORDER BY user_id")
    db.command("INSERT INTO t_sqlfn.purchases SELECT number, ['north','south'][number % 2 + 1], "
               "(number * 37) % 400 FROM numbers(1000)")
    return db


def test_public_functions_exist_and_answer(sqlfn):
    df = sqlfn.raw_query(
        "SELECT region, dp_count(1.0) AS n, dp_sum(amount, 0, 500, 1.0) AS revenue, "
        "dp_avg(amount, 0, 500, 1.0) AS mean_amount, dp_count_gaussian(1.0, 1e-6) AS ng, "
        "dp_sum_gaussian(amount, 0, 500, 1.0, 1e-6) AS sg, dp_avg_gaussian(amount, 0, 500, 1.0, 1e-6) AS ag "
        "FROM t_sqlfn.purchases GROUP BY region ORDER BY region")
    assert list(df["region"]) == ["north", "south"]
    truth = sqlfn.raw_query("SELECT region, count() n, sum(amount) s, avg(amount) a FROM t_sqlfn.purchases "
                            "GROUP BY region ORDER BY region")
    # Loose sanity bounds: 60 noise scales for counts/sums (|Laplace| > 60 scales: probability
    # e^-60 < 1e-26 per value); averages are clamped into [0, 500].
    assert np.all(np.abs(df["n"] - truth["n"]) < 60)
    assert np.all(np.abs(df["revenue"] - truth["s"]) < 60 * 500)
    assert np.all((df["mean_amount"] >= 0) & (df["mean_amount"] <= 500))
    assert np.all((df["ag"] >= 0) & (df["ag"] <= 500))
    assert df["n"].dtype.kind == "i"


def _draws(db, expr: str, inner: str = "number % 2 AS x") -> np.ndarray:
    sql = (f"SELECT rep, {expr} AS v FROM (SELECT intDiv(number, {ROWS_PER_GROUP}) AS rep, {inner} "
           f"FROM numbers({N * ROWS_PER_GROUP})) GROUP BY rep")
    return db.raw_query(sql)["v"].to_numpy(dtype=float)


@pytest.mark.parametrize("eps", [0.5, 1.0])
def test_dp_count_variance_matches_calibration(sqlfn, eps):
    noise = _draws(sqlfn, f"dp_count({eps})") - ROWS_PER_GROUP
    # The continuous Laplace would give 2/eps^2; the exact discrete Laplace variance is slightly
    # lower (1.84 vs 2 at eps=1). The grid slack of docs/NOISE.md changes the scale by < 2^-37.
    expected = discrete_laplace_variance(1.0 / eps)
    assert abs(noise.mean()) < 8 * math.sqrt(expected / N)
    assert abs(noise.var() / expected - 1) < 8 * math.sqrt(5 / N)
    # Against the continuous 2/eps^2: allowed to differ by the exact discrete-vs-continuous gap
    # (2.0% at eps=0.5, 8.0% at eps=1) plus the same 8 standard errors.
    gap = abs(expected / (2 / eps**2) - 1)
    assert abs(noise.var() / (2 / eps**2) - 1) < gap + 8 * math.sqrt(5 / N)


def test_dp_count_gaussian_variance(sqlfn):
    from dpch.calibration import udf_gaussian_sigma as gaussian_sigma

    sigma = gaussian_sigma(1.0, 1.0, 1e-6)
    noise = _draws(sqlfn, "dp_count_gaussian(1.0, 1e-6)") - ROWS_PER_GROUP
    # Gaussian: kurtosis 3, so the variance estimate has relative s.e. sqrt(2/N).
    assert abs(noise.var() / sigma**2 - 1) < 8 * math.sqrt(2 / N)


def test_clipping_bounds_the_effect_of_an_extreme_row(sqlfn):
    """A row of 1e12 moves dp_sum(x, 0, 500, eps) by at most 500 (plus noise): the mean of N noisy
    sums over rows {1e12, 100 x (k % 2)} equals the clipped truth 500 + (#odd k)."""
    eps = 1.0
    inner = "if(number % 10 = 0, 1e12, toFloat64(number % 2) * 100) AS x"
    sums = _draws(sqlfn, f"dp_sum(x, 0, 500, {eps})", inner)
    clipped_truth = 500 + 100 * (ROWS_PER_GROUP // 2)  # one 1e12 row per group, 5 odd rows of 100
    b = 500 / eps
    assert abs(sums.mean() - clipped_truth) < 8 * math.sqrt(2 * b * b / N)


def test_dp_avg_is_clamped_and_unbiased_for_large_groups(sqlfn):
    df = sqlfn.raw_query("SELECT dp_avg(number % 100, 0, 100, 1.0) AS a FROM numbers(1000000)")
    # noise on a 1M-row average is ~1e-4 (sum noise of scale ~100 over a count of 1e6): missing by
    # 1.0 needs noise beyond 1e4 scales, probability < e^-9000
    assert abs(df["a"][0] - 49.5) < 1.0


@pytest.mark.parametrize("call, problem", [
    ("dp_count(-1.0)", "epsilon must be positive and finite"),
    ("dp_count(0)", "epsilon must be positive and finite"),
    ("dp_count(inf)", "epsilon must be positive and finite"),
    ("dp_sum(amount, 500, 0, 1.0)", "lo <= hi"),
    ("dp_sum(amount, 0, inf, 1.0)", "finite"),
    ("dp_avg(amount, 0, 500, nan)", "epsilon must be positive and finite"),
    ("dp_count_gaussian(1.0, 0)", "delta must be in the open interval (0, 1)"),
    ("dp_sum_gaussian(amount, 0, 500, 1.0, 1.0)", "delta must be in the open interval (0, 1)"),
    ("dp_avg_gaussian(amount, 0, 500, -2, 1e-6)", "epsilon must be positive and finite"),
])
def test_invalid_arguments_raise_clear_errors_without_data_values(sqlfn, call, problem):
    sqlfn.command("DROP TABLE IF EXISTS t_sqlfn.secret")
    sqlfn.command("CREATE TABLE t_sqlfn.secret (amount Float64) ENGINE = Memory")
    sqlfn.command("INSERT INTO t_sqlfn.secret VALUES (987654.321), (123457.5)")
    with pytest.raises(BackendError) as info:
        sqlfn.raw_query(f"SELECT {call} FROM t_sqlfn.secret")
    message = str(info.value)
    assert problem in message
    assert "987654" not in message and "123457" not in message and "1975111" not in message


def test_udf_noises_nan_rows_as_lower_bound(sqlfn):
    """NaN values are clipped to lo (documented): dp_sum over NaN rows with lo=0 is pure noise."""
    sums = _draws(sqlfn, "dp_sum(x, 0, 10, 1.0)", "nan AS x")
    assert np.all(np.isfinite(sums))
    assert abs(sums.mean()) < 8 * math.sqrt(2 * 100 / N)


def test_null_rows_are_left_out_not_clipped_to_lo(sqlfn):
    """NULL is not a value (as in sum/avg): 500 rows of 10 and 500 NULL rows, bounds (5, 10).
    dp_sum is 5000 + noise and dp_avg 10 + noise; NULLs taken as lo would give 7500 and 7.5.
    ε = 10^6 (per call): the sum's Laplace scale is about 10^-5, the average's noisy count and sum
    move it by far less than 0.01, so the tolerances (1 and 0.01) fail only if the noise exceeds
    10^5 scales: probability e^-100000."""
    df = sqlfn.raw_query("SELECT dp_sum(x, 5, 10, 1000000.) AS s, dp_avg(x, 5, 10, 1000000.) AS a "
                         "FROM (SELECT if(number % 2 = 1, NULL, 10.) AS x FROM numbers(1000))")
    assert abs(float(df["s"].iloc[0]) - 5000) < 1
    assert abs(float(df["a"].iloc[0]) - 10) < 0.01


# ------------------------------------------------------------------------------------------------
# Errors never depend on, nor echo, the data (issue 11): argument types, constness and parameter
# values are checked while ClickHouse analyses the query (the checks are constant expressions; see
# clickhouse_config/user_defined/function_dpch_require.sql), so whether a query errors, and its
# message, depend only on the query text and the column types.
# ------------------------------------------------------------------------------------------------

SECRET_ROW = ("(4242, 'east', 'SECRET_ZEBRA_7731', 987654.321, 31337.5, '1999-12-31', "
              "['SECRET_TAG_5521'])")
SECRETS = ("SECRET_ZEBRA_7731", "SECRET_TAG_5521", "987654", "31337", "1999-12-31", "4242")
FUNCTIONS = {  # name -> its arguments, in order
    "dp_count": ("eps",),
    "dp_count_gaussian": ("eps", "delta"),
    "dp_sum": ("x", "lo", "hi", "eps"),
    "dp_sum_gaussian": ("x", "lo", "hi", "eps", "delta"),
    "dp_avg": ("x", "lo", "hi", "eps"),
    "dp_avg_gaussian": ("x", "lo", "hi", "eps", "delta"),
}
VALID = {"x": "amount", "lo": "0", "hi": "500", "eps": "1.0", "delta": "1e-6"}


def _call(fn: str, **override: str) -> str:
    return f"{fn}({', '.join(override.get(a, VALID[a]) for a in FUNCTIONS[fn])})"


@pytest.fixture(scope="module")
def neighbours(sqlfn):
    """t_sqlfn.d_with = t_sqlfn.d_without + one row of distinctive values (D and D′). In D′ the
    Nullable column `n` is NULL on every row."""
    for name in ("d_with", "d_without"):
        sqlfn.command(f"DROP TABLE IF EXISTS t_sqlfn.{name}")
        sqlfn.command(f"CREATE TABLE t_sqlfn.{name} (id UInt64, region String, name String, "
                      "amount Float64, n Nullable(Float64), day Date, tags Array(String)) "
                      "ENGINE = MergeTree ORDER BY id")
        sqlfn.command(f"INSERT INTO t_sqlfn.{name} SELECT number, ['north', 'south'][number % 2 + 1], "
                      "'plain', number * 10, NULL, '2020-01-01', ['t'] FROM numbers(20)")
    sqlfn.command(f"INSERT INTO t_sqlfn.d_with VALUES {SECRET_ROW}")
    return sqlfn


def _outcome(db, sql: str) -> tuple[str, str]:
    """('ok', '') or ('error', message with the table name normalised)."""
    try:
        db.raw_query(sql)
    except BackendError as exc:
        return "error", str(exc).replace("t_sqlfn.d_without", "T").replace("t_sqlfn.d_with", "T")
    return "ok", ""


def _assert_no_secret(message: str) -> None:
    for secret in SECRETS:
        assert secret not in message, (secret, message)


@pytest.mark.parametrize("fn, arg", [(f, a) for f, args in FUNCTIONS.items() for a in args])
def test_wrong_typed_argument_names_the_argument_never_a_value(neighbours, fn, arg):
    """Each argument of each function, given a String, Date or Array column (or a String literal
    for the parameters): a clean error naming the function and the argument, with no data value,
    identical on D and D′, with and without GROUP BY (an empty group set included)."""
    bad = {"name": "String", "day": "Date", "tags": "Array(String)"}
    if arg != "x":
        bad["'0.5'"] = "String"
    for expr, type_name in bad.items():
        call = _call(fn, **{arg: expr})
        for tail in ("", " GROUP BY region", " WHERE id = 4242 GROUP BY region"):
            outcomes = [_outcome(neighbours, f"SELECT {call} AS v FROM t_sqlfn.{t}{tail}")
                        for t in ("d_with", "d_without")]
            assert outcomes[0] == outcomes[1], (call, tail)
            kind, message = outcomes[0]
            assert kind == "error", (call, tail)
            assert f"{fn}: argument {arg} must be numeric (got {type_name})" in message, message
            _assert_no_secret(message)


@pytest.mark.parametrize("fn, arg", [(f, a) for f, args in FUNCTIONS.items() for a in args if a != "x"])
def test_parameters_must_be_constants(neighbours, fn, arg):
    """A parameter taken from a column would make its validity checks depend on the data."""
    call = _call(fn, **{arg: "amount"})
    outcomes = [_outcome(neighbours, f"SELECT {call} AS v FROM t_sqlfn.{t} GROUP BY region, amount")
                for t in ("d_with", "d_without")]
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][0] == "error"
    assert f"{fn}: argument {arg} must be a constant" in outcomes[0][1]
    _assert_no_secret(outcomes[0][1])


NEIGHBOUR_QUERIES = [
    # valid calls, on a numeric column and on a Nullable one (all NULL in D′, one value in D)
    *[_call(f) for f in FUNCTIONS],
    *[_call(f, x="n") for f in FUNCTIONS if "x" in FUNCTIONS[f]],
    "dp_sum(toDecimal64(amount, 2), 0, 500, 1.0)",
    "dp_avg(toInt64(amount), -10, 10, 0.5)",
    # invalid parameters
    "dp_count(-1.0)", "dp_count(0)", "dp_count(1e-300)", "dp_sum(amount, 0, 500, 1e-300)",
    "dp_sum(amount, 500, 0, 1.0)", "dp_sum(amount, 0, inf, 1.0)", "dp_sum(amount, 0, 1e299, 1.0)",
    "dp_avg(amount, -1e300, 0, 1.0)", "dp_count_gaussian(1.0, 1.0)", "dp_sum_gaussian(amount, 0, 500, 1.0, 0)",
    "dp_avg_gaussian(amount, 0, 500, nan, 1e-6)", "dp_sum(amount, NULL, 500, 1.0)",
    # invalid types and non-constant parameters
    "dp_sum(name, 0, 500, 1.0)", "dp_avg(tags, 0, 500, 1.0)", "dp_sum(amount, 0, n, 1.0)",
    "dp_count(amount)",
]


@pytest.mark.parametrize("call", NEIGHBOUR_QUERIES)
@pytest.mark.parametrize("tail", ["", " GROUP BY region", " WHERE id = 4242", " WHERE id = 4242 GROUP BY region",
                                  " WHERE name LIKE 'SECRET%' GROUP BY day"])
def test_outcome_is_the_same_on_neighbouring_tables(neighbours, call, tail):
    """D and D′ differ by one row; the query errors on both or on neither, with the same message.
    With `WHERE id = 4242` D′ selects no row at all (an empty group set under GROUP BY)."""
    sql = "SELECT {call} AS v FROM t_sqlfn.{t}{tail}"
    with_row = _outcome(neighbours, sql.format(call=call, t="d_with", tail=tail))
    without_row = _outcome(neighbours, sql.format(call=call, t="d_without", tail=tail))
    assert with_row == without_row, (call, tail, with_row, without_row)
    _assert_no_secret(with_row[1])


@pytest.mark.parametrize("fn", [f for f in FUNCTIONS if "x" in FUNCTIONS[f]])
@pytest.mark.parametrize("arg, value", [("lo", "-1e299"), ("hi", "1e299"), ("hi", "2.1e298"),
                                        ("lo", "-1.7976931348623157e308")])
def test_huge_bounds_give_a_clear_error(neighbours, fn, arg, value):
    """|lo|, |hi| <= 1e298 (README): beyond 2^991 (about 2.09e298) the fixed-point grid of the sum
    overflows Float64 (docs/NOISE.md)."""
    call = _call(fn, **{arg: value, "lo" if arg == "hi" else "hi": "0"})
    kind, message = _outcome(neighbours, f"SELECT {call} AS v FROM t_sqlfn.d_with")
    assert kind == "error"
    assert f"{fn}: argument {arg} is out of range" in message
    assert "[-1e298, 1e298]" in message
    _assert_no_secret(message)


@pytest.mark.parametrize("fn", [f for f in FUNCTIONS if "x" in FUNCTIONS[f]])
def test_bounds_at_the_limit_answer(neighbours, fn):
    df = neighbours.raw_query(f"SELECT {_call(fn, lo='-1e298', hi='1e298')} AS v FROM t_sqlfn.d_with")
    assert np.isfinite(df["v"][0])


def test_tiny_epsilon_is_refused_before_the_noise_scale_overflows(neighbours):
    kind, message = _outcome(neighbours, "SELECT dp_count(1e-300) AS v FROM t_sqlfn.d_without GROUP BY region")
    assert kind == "error" and "dp_count: argument eps is too small" in message


def test_nullable_x_skips_null_rows(sqlfn):
    """NULL rows contribute nothing (sum and count skip them); a group whose x is all NULL is a
    noisy 0, not an error. Mean of N noisy sums within 8 standard errors of the truth (5 non-NULL
    rows of 1 per group; discrete Laplace variance below 2 b^2 with b = 1/eps = 1)."""
    inner = "if(number % 2 = 0, NULL, toFloat64(1)) AS x"
    sums = _draws(sqlfn, "dp_sum(x, 0, 1, 1.0)", inner)
    assert abs(sums.mean() - ROWS_PER_GROUP // 2) < 8 * math.sqrt(2 / N)
    empty = _draws(sqlfn, "dp_sum(x, 0, 1, 1.0)", "CAST(NULL AS Nullable(Float64)) AS x")
    assert abs(empty.mean()) < 8 * math.sqrt(2 / N)
    avgs = _draws(sqlfn, "dp_avg(x, 0, 1, 1.0)", "CAST(NULL AS Nullable(Float64)) AS x")
    assert np.all((avgs >= 0) & (avgs <= 1))
