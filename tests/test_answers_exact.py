"""Generated data and queries (hypothesis): where contribution bounding and clipping change nothing,
DPCH's answer with the noise off is ClickHouse's own answer.

Complements the D/D′ tests (which bound what one unit can move) with the other half of a DP system's
promise: the pre-noise value is the query's value. The data are drawn so that nothing binds: every
unit's rows lie in one group (k = 1) and number at most M = C, every value lies inside its declared
bounds, group keys come from a declared public domain (no partition selection). Columns are
nullable with drawn NULLs: NULL handling is where the engine's semantics moved under the clipping
(ClickHouse 24.12 made ``greatest(NULL, 0) = 0``: every NULL counted as the lower bound until
2026-11-29, found by this kind of comparison).

Compared per released group: COUNT(*), COUNT(x), countIf, COUNT(DISTINCT), SUM/AVG (the fixed-point
grid rounds each row to g/2 at most: |error| <= rows · g/2 with g <= 2^-10 for these bounds and
expressions, at most 72 rows, so 0.05 for a sum and 1e-3 for an average bound it), the same over
derived row expressions (abs, least/greatest, if, coalesce, nullIf, round, pow, sqrt, products,
intDiv, multiIf: the bounder's SQL must mean what ClickHouse's does), MIN/MAX and quantiles (the bucket of the 2^16-bucket grid
that holds the true value, the lower empirical quantile: within one bucket width), uniqIf. A public key with no rows is released with COUNT 0 (the
plain query has no such row)."""
from __future__ import annotations

import datetime

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpch.controller import prepare
from dpch.rewrite import rewrite_for_sensitivity_check

DB = "t_exact"
M = 6  # max_rows_per_unit (k = 1: also the per-group cap)
GROUPS = ["a", "b", "c", "d"]  # the public domain; "d" may hold no row
BOUNDS = {"x": (-50.0, 150.0), "y": (0.0, 40.0), "z": (-1000.0, 1000.0), "d": ("2024-01-01", "2024-12-31")}
DAY0 = 19723  # 2024-01-01 as days since the epoch
DATE_EPOCH = datetime.date(1970, 1, 1)

# (DPCH's aggregate, ClickHouse's exact one when it differs, kind)
AGGS = [
    ("COUNT(*)", None, "count"), ("COUNT(x)", None, "count"), ("countIf(y > 20)", None, "count"),
    ("COUNT(DISTINCT y)", None, "count"), ("uniqIf(z, x > 0)", "uniqExactIf(z, x > 0)", "count"),
    ("SUM(x)", None, "sum"), ("SUM(z)", None, "sum"), ("sumIf(x, y > 10)", None, "sum"), ("SUM(x * 2 + 1)", None, "sum"),
    ("AVG(x)", None, "avg"), ("AVG(z)", None, "avg"), ("avgIf(x, z > 0)", None, "avg"),
    ("MIN(x)", None, "bucket"), ("MAX(z)", None, "bucket"), ("MIN(y)", None, "bucket"),
    # the noise-off quantile is the first bucket whose cumulative count reaches level · n: the
    # ceil(level · n)-th smallest value (ClickHouse's median interpolates, and its quantileExactLow
    # takes the (floor(level · n) + 1)-th)
    ("median(x)", "_lowq(0.5, x)", "bucket"), ("quantile(0.9)(z)", "_lowq(0.9, z)", "bucket"),
    # a Date's MIN/MAX is released as a Date (the bucket's centre, rounded to its day)
    ("MIN(d)", "toUInt16(min(d))", "day"), ("MAX(d)", "toUInt16(max(d))", "day"),
    # from the centred sums of x and x² (post-processing), exact on integer-valued data up to float rounding
    ("VAR_POP(x)", None, "moment"), ("STDDEV_SAMP(z)", None, "moment"),
]


# row expressions under SUM and AVG, each with ClickHouse's exact equivalent where it differs: in a DP
# query least/greatest return NULL for a NULL argument (the interval that bounds them assumes so),
# ClickHouse's ignore it
EXPRS = [("abs(x - 50)", None), ("least(x, 100) + 1", "if(x IS NULL, NULL, least(x, 100)) + 1"),
         ("greatest(z, 0)", "if(z IS NULL, NULL, greatest(z, 0))"), ("if(y > 10, x, 0)", None), ("coalesce(x, 0)", None),
         ("nullIf(y, 0)", None), ("round(z / 3, 1)", None), ("pow(x, 2)", None), ("sqrt(abs(z))", None),
         ("x * y", None), ("intDiv(y, 3)", None), ("multiIf(y < 10, 1, y < 20, 2, 3)", None)]
AGGS += [(f"{f}({e})", f"{f}({p})" if p else None, kind) for e, p in EXPRS for f, kind in (("SUM", "sum"), ("AVG", "avg"))]


def _exact(plain: str) -> str:
    """``_lowq(level, col)`` as ClickHouse SQL: the ceil(level · n)-th smallest non-NULL value, NULL
    for none."""
    if not plain.startswith("_lowq("):
        return plain
    level, col = plain[len("_lowq("):-1].split(", ")
    return (f"if(count({col}) = 0, NULL, arraySort(groupArray({col}))"
            f"[toUInt64(greatest(ceil({level} * count({col})), 1))])")
WHERES = ["", "WHERE y >= 5", "WHERE x IS NOT NULL", "WHERE z < 500 OR z IS NULL"]


def _value(bounds: tuple[float, float]):
    lo, hi = bounds
    # integer-valued floats (a sum of them is exact in Float64), NULL one time in four
    return st.one_of(st.none(), st.integers(int(lo), int(hi)).map(float), st.integers(int(lo), int(hi)).map(float),
                     st.integers(int(lo), int(hi)).map(float))


@st.composite
def datasets(draw):
    units = draw(st.integers(1, 12))
    rows = []
    for u in range(units):
        g = draw(st.sampled_from(GROUPS[:3]))  # one group per unit (k = 1 keeps it whole)
        for _ in range(draw(st.integers(1, M))):
            x, z = draw(_value(BOUNDS["x"])), draw(_value(BOUNDS["z"]))
            y = draw(st.integers(0, 40))
            d = draw(st.one_of(st.none(), st.integers(0, 365)))  # a day of 2024 (a leap year), or NULL
            rows.append((u, g, x, y, z, d))
    return rows


@st.composite
def queries(draw):
    aggs = draw(st.lists(st.sampled_from(AGGS), min_size=1, max_size=4, unique=True))
    grouped = draw(st.booleans())
    where = draw(st.sampled_from(WHERES))
    return aggs, grouped, where


@pytest.fixture(scope="module")
def xdb(db):
    db.command(f"CREATE DATABASE IF NOT EXISTS {DB}")
    return db


def sql_literal(v) -> str:
    return "NULL" if v is None else repr(v)


def _load(db, rows) -> None:
    db.command(f"DROP TABLE IF EXISTS {DB}.t")
    db.command(f"CREATE TABLE {DB}.t (user_id UInt64, g String, x Nullable(Float64), y Int32, z Nullable(Float64), "
               "d Nullable(Date)) "
               "ENGINE = MergeTree ORDER BY user_id")
    values = ", ".join(f"({u}, '{g}', {sql_literal(x)}, {y}, {sql_literal(z)}, "
                       f"{'NULL' if d is None else f'toDate({DAY0 + d})'})" for u, g, x, y, z, d in rows)
    db.command(f"INSERT INTO {DB}.t VALUES {values}")
    db.catalog.register(f"{DB}.t", privacy_unit="user_id", bounds=BOUNDS, max_groups_contributed=1,
                        max_rows_per_unit=M, public_keys={"g": GROUPS}, replace=True)
    db.ledger.set_budget("tester", f"{DB}.t", epsilon=1e9, delta=0.5)


def close(kind: str, got: float, want: float, lo_hi: tuple[float, float] | None = None) -> bool:
    """Whether a noise-off value matches the exact one, by the tolerances of the module docstring."""
    if kind in ("count", "day"):
        return got == want
    if kind == "sum":
        return abs(got - want) <= 0.05
    if kind == "avg":
        return abs(got - want) <= 1e-3
    if kind == "moment":
        return abs(got - want) <= 1e-6 * max(1.0, abs(want)) + 1e-3
    width = (lo_hi[1] - lo_hi[0]) / 65536  # type: ignore[index]
    return abs(got - want) <= width


def assert_same_answers(sql: str, got, plain, keys, aggs, lo_hi_of=lambda a: None) -> None:
    """DPCH's noise-off answer ``got`` against ClickHouse's exact ``plain``, group by group (column
    ``k``; ``keys``: the public domain it must release, None for an ungrouped query). ``aggs``: (the
    aggregate's text, its kind) of the columns v0, v1, …; ``lo_hi_of``: the bounds of a "bucket"."""
    want = {(r["k"] if keys is not None else ()): r for _, r in plain.iterrows()}
    have = {(r["k"] if keys is not None else ()): r for _, r in got.iterrows()}
    if keys is not None:
        assert set(have) == set(keys), sorted(have)  # every public key, with or without rows
    for k, row in have.items():
        for i, (a, kind) in enumerate(aggs):
            v = row[f"v{i}"]
            if k not in want:  # a public key without rows in the plain answer
                if kind == "count":
                    assert v == 0, (sql, k, a, v)
                continue
            w = want[k][f"v{i}"]
            if pd.isna(w):
                continue  # AVG/MIN/MAX of no value: ClickHouse says NaN or NULL, DPCH releases a number
            g = float((pd.Timestamp(v) - pd.Timestamp(DATE_EPOCH)).days if kind == "day" else v)
            assert close(kind, g, float(w), lo_hi_of(a) if kind == "bucket" else None), (sql, k, a, g, float(w))


def _bounds_of(expr: str) -> tuple[float, float]:
    """The bounds of the column an aggregate reads (its last parenthesised argument)."""
    return BOUNDS[expr[expr.rindex("(") + 1]]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow, HealthCheck.data_too_large])
@given(rows=datasets(), q=queries())
def test_noise_off_answer_is_the_plain_answer(xdb, rows, q):
    aggs, grouped, where = q
    _load(xdb, rows)
    key = "g AS k, " if grouped else ""
    tail = " GROUP BY k" if grouped else ""
    sql = f"SELECT {key}{', '.join(f'{a} AS v{i}' for i, (a, _, _) in enumerate(aggs))} FROM {DB}.t {where}{tail}"
    exact = f"SELECT {key}{', '.join(f'{_exact(e or a)} AS v{i}' for i, (a, e, _) in enumerate(aggs))} FROM {DB}.t {where}{tail}"
    plain = xdb.raw_query(exact)
    plan = prepare(xdb, sql, epsilon=1.0).plan
    got = xdb.raw_query(rewrite_for_sensitivity_check(plan).sql)
    assert_same_answers(sql, got, plain, GROUPS if grouped else None, [(a, kind) for a, _, kind in aggs], _bounds_of)
