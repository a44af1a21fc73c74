"""The restructured per-unit stage (issue 17, docs/PERFORMANCE.md) releases the same pre-noise
values as the bounding rule it implements.

The rule (docs/CONTROLLER.md, "Contribution bounding"; unchanged by the restructuring): a unit keeps
the k groups whose keyed hash h(unit, keys) is smallest; in each kept group at most C rows count, and
at most M over its kept groups in hash order (r_i = min(min(c_i, C), max(0, M - Σ_{j<i} min(c_j, C))));
a kept group with c_i > r_i rows contributes each sum scaled by r_i / c_i, rounded (half to even, as
ClickHouse rounds Float64) and clamped to r_i·[L, H]. The group stage sums those contributions, and a
public key domain lists every key (missing ones 0).

``reference`` below implements that rule in Python over the per-row inputs (unit, keys, h, each
quantity's fixed-point row value), which the engine computes with the rewriter's own row expressions
(the rows stage, which the restructuring did not touch). The test runs the rewritten query with the
noise UDFs replaced by the identity and partition selection off (``rewrite_for_sensitivity_check``)
and asserts exact equality of every group's noisy-quantity inputs: k = 1 (the packed count/sum and
the key-hash join), k > 1 (one sort per unit), row caps, WHERE, NULL keys, integer and String keys,
and several aggregates. The data are fixed (seeded), the check deterministic: no tolerance.
"""
from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import pytest

from dpch.bind import sql_of
from dpch.catalog import quote_ident
from dpch.controller import prepare
from dpch.mechanisms import QUANTILE_BUCKETS
from dpch.rewrite import SALT_PLACEHOLDER as SALT
from dpch.rewrite import _Rewriter, rewrite_for_sensitivity_check

TABLE = "eqv.rows"
DOMAIN_G = ["a", "b", "c", "d", "e", None]


@pytest.fixture(scope="module")
def edb(db):
    rng = np.random.default_rng(20261124)
    units = rng.integers(0, 400, size=6000)
    rows = pd.DataFrame({
        "user_id": units.astype(np.uint64),
        # g: a unit's rows spread over 1-4 of 7 values (two outside the public domain), some NULL
        "g": [None if v == 6 else "abcdefz"[v] for v in (units * 7 + rng.integers(0, 4, size=units.size)) % 7],
        "gs": [f"s{v}" for v in rng.integers(0, 12, size=units.size)],
        "d": rng.integers(0, 12, size=units.size).astype(np.uint8),  # bounds (0, 9): 10, 11 outside
        "amount": np.where(rng.random(units.size) < 0.02, np.nan, rng.uniform(-20, 150, size=units.size)),
        "age": rng.integers(10, 110, size=units.size).astype(np.uint8),
    })
    # nv: a nullable value column (a fifth NULL), drawn from its own generator so that the columns
    # above stay as they were
    nv = np.random.default_rng(7).integers(0, 40, size=units.size)
    rows["nv"] = pd.array([None if v % 5 == 0 else int(v) for v in nv], dtype="UInt8")
    db.command("CREATE DATABASE IF NOT EXISTS eqv")
    db.command(f"DROP TABLE IF EXISTS {TABLE}")
    db.command(f"CREATE TABLE {TABLE} (user_id UInt64, g Nullable(String), gs String, d UInt8, amount Float64, "
               "age UInt8, nv Nullable(UInt8)) ENGINE = MergeTree ORDER BY tuple()")
    db.backend.insert_df(TABLE, rows)
    db.catalog.register(TABLE, privacy_unit="user_id", bounds={"amount": (0, 100), "age": (18, 99), "d": (0, 9)},
                        max_groups_contributed=1, max_rows_per_unit=10, public_keys={"g": DOMAIN_G})
    return db


def _norm(v):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    if isinstance(v, (float, np.floating)) and float(v).is_integer():
        return int(v)
    if isinstance(v, (np.integer, int)):
        return int(v)
    return str(v)


def _row_inputs(db, plan) -> pd.DataFrame:
    """Per row: unit, keys, h and each row quantity's fixed-point value, by the rewriter's own row
    expressions and filters (the rows stage)."""
    rw = _Rewriter(plan, noise=False, selection=False, table=None)
    keys = [f"({sql_of(k.expr)})" for k in rw.keys]
    unit = quote_ident(plan.entry.privacy_unit)
    h = rw.unit_hash_sql(keys, unit) if keys else "toUInt64(0)"  # no GROUP BY: one group per unit
    cols = [f"{unit} AS u", f"{h} AS h"] + [f"tuple({k}) AS k{j}" for j, k in enumerate(keys)] + \
        [f"toInt64({q.row_sql}) AS x{i}" for i, q in enumerate(rw.row_qs)]
    where = rw._where(key_filters=not rw._defer_key_filters())
    df = db.raw_query(rw._salted(f"SELECT {', '.join(cols)} FROM {plan.entry.table_sql}{where}"))
    df["key"] = [tuple(_norm(t[0]) for t in ts) for ts in zip(*[df[f"k{j}"] for j in range(len(keys))])] \
        if keys else [()] * len(df)
    return df


def reference(db, plan) -> dict[tuple, list[int]]:
    """The bounding rule in Python: per group, the value of every released quantity before noise."""
    rw = _Rewriter(plan, noise=False, selection=False, table=None)
    b = plan.bounding
    k, C, M = b.k, b.rows_per_group, b.max_rows
    if k == 1:
        C = M = min(C, M)  # the k = 1 path caps at min(C, M), the same rule
    df = _row_inputs(db, plan)
    nx = len(rw.row_qs)
    per_group: dict[tuple, list] = {}
    for _, rows in df.groupby("u", sort=False):
        groups = {}
        for h, key, *xs in zip(rows["h"], rows["key"], *[rows[f"x{i}"] for i in range(nx)]):
            g = groups.setdefault(int(h), [key, 0] + [0] * nx)
            g[1] += 1
            for i, x in enumerate(xs):
                g[2 + i] += int(x)
        used = 0
        for h in sorted(groups)[:k]:
            key, c, *s = groups[h]
            r = min(min(c, C), max(0, M - used))
            used += min(c, C)
            acc = per_group.setdefault(key, [0, 0] + [0] * nx)
            acc[0] += 1  # units
            acc[1] += r  # capped rows
            for i, q in enumerate(rw.row_qs):
                v = s[i] if c <= r else min(max(int(round(s[i] * r / c)), r * q.lo_units), r * q.hi_units)
                acc[2 + i] += v
    out = {}
    for key, acc in per_group.items():
        vals = []
        for q in plan.quantities:
            if not q.released:
                continue
            vals.append(acc[0] if q.kind == "units" else acc[1] if q.row_sql is None else acc[2 + rw.row_qs.index(q)])
        out[key] = vals
    return out


def released(db, plan) -> tuple[dict[tuple, list[int]], list[str]]:
    rw = rewrite_for_sensitivity_check(plan)
    df = db.raw_query(rw.sql)
    key_cols = [o.name for o in plan.bound.outputs if o.kind == "key"]
    out = {tuple(_norm(df[c].iloc[i]) for c in key_cols): [int(df[c].iloc[i]) for c in rw.internal_columns]
           for i in range(len(df))}
    return out, list(rw.internal_columns)


CASES = [
    # (query, options, delta); g: public (nullable, LowCardinality-free String), d: bounded integer,
    # gs: no public domain (partition selection: keys carried as values)
    ("SELECT g, COUNT(*) AS n, SUM(amount) AS s, AVG(age) AS a FROM {t} GROUP BY g", {}, 0.0),
    ("SELECT g, COUNT(*) AS n, SUM(amount) AS s FROM {t} WHERE age > 30 GROUP BY g",
     {"max_rows_per_unit": 4}, 0.0),
    ("SELECT g, d, COUNT(*) AS n, SUM(amount - 50) AS s, VAR_POP(age) AS v FROM {t} GROUP BY g, d",
     {"max_rows_per_unit": 7}, 0.0),
    ("SELECT gs, COUNT(*) AS n, SUM(amount) AS s, COUNT(DISTINCT user_id) AS u FROM {t} GROUP BY gs", {}, 1e-6),
    ("SELECT COUNT(*) AS n, SUM(amount) AS s, AVG(age) AS a FROM {t} WHERE d < 5", {}, 0.0),
    # k > 1: one sort per unit; row caps per group and per unit
    ("SELECT g, COUNT(*) AS n, SUM(amount) AS s, AVG(age) AS a FROM {t} GROUP BY g",
     {"max_groups_contributed": 3, "max_rows_per_unit": 12, "max_rows_per_group": 5}, 0.0),
    ("SELECT d, COUNT(*) AS n, SUM(amount) AS s FROM {t} WHERE amount > 10 GROUP BY d",
     {"max_groups_contributed": 4, "max_rows_per_unit": 9}, 0.0),
    ("SELECT g, d, COUNT(*) AS n, STDDEV_POP(amount) AS sd FROM {t} GROUP BY g, d",
     {"max_groups_contributed": 5, "max_rows_per_unit": 20, "max_rows_per_group": 3}, 0.0),
    ("SELECT gs, COUNT(*) AS n, SUM(age) AS s FROM {t} GROUP BY gs",
     {"max_groups_contributed": 2, "max_rows_per_unit": 6}, 1e-6),
    ("SELECT g, COUNT(*) AS n, SUM(amount) AS s FROM {t} GROUP BY g",
     {"max_groups_contributed": 4, "max_rows_per_unit": 8, "keys": {"g": ["a", "b", None]}}, 0.0),
]


@pytest.mark.parametrize("sql,opts,delta", CASES)
def test_pre_noise_values_equal_reference(edb, sql, opts, delta):
    plan = prepare(edb, sql.format(t=TABLE), epsilon=1.0, delta=delta, **opts).plan
    got, cols = released(edb, plan)
    ref = reference(edb, plan)
    assert cols and got, "the query released nothing"
    zero = [0] * len(cols)
    for key, vals in got.items():
        assert vals == ref.get(key, zero), (key, cols)
    if plan.key_mode == "public":
        # every group the rule fills lies outside the domain if it was not released
        missing = {key for key, vals in ref.items() if key not in got and any(vals)}
        domain = set(got)
        assert not (missing & domain)
    else:  # selection off: every group with a unit is released
        assert set(ref) == set(got)
    # the check has teeth: the rule really cut rows or groups here
    assert any(v for vals in got.values() for v in vals)


def test_key_hash_path_is_used_and_differs_from_values_path(edb):
    """Public keys with known types take the key-hash join (no key values in the per-unit stage);
    keys without a public domain carry their values. Both are covered by the cases above."""
    pub = prepare(edb, f"SELECT g, COUNT(*) AS n FROM {TABLE} GROUP BY g", epsilon=1.0).plan
    sel = prepare(edb, f"SELECT gs, COUNT(*) AS n FROM {TABLE} GROUP BY gs", epsilon=1.0, delta=1e-6).plan
    assert _Rewriter(pub, noise=False, selection=False, table=None).by_key_hash()
    assert "__dp_kh" in rewrite_for_sensitivity_check(pub).sql
    assert not _Rewriter(sel, noise=False, selection=False, table=None).by_key_hash()
    assert "__dp_kh" not in rewrite_for_sensitivity_check(sel).sql


def test_reference_detects_a_wrong_cap(edb):
    """The comparison can fail: the same plan with a different row cap gives other values."""
    plan = prepare(edb, f"SELECT g, COUNT(*) AS n, SUM(amount) AS s FROM {TABLE} GROUP BY g", epsilon=1.0,
                   max_rows_per_unit=3).plan
    other = prepare(edb, f"SELECT g, COUNT(*) AS n, SUM(amount) AS s FROM {TABLE} GROUP BY g", epsilon=1.0,
                    max_rows_per_unit=4).plan
    got, _ = released(edb, plan)
    assert got != reference(edb, other)


@pytest.mark.parametrize("sql,opts", [
    ("SELECT g, median(age) AS m, quantile(0.9)(amount) AS p FROM {t} GROUP BY g", {}),
    ("SELECT quantiles(0.1, 0.5)(amount) AS qs FROM {t} WHERE d < 8", {"max_rows_per_unit": 4}),
    # three quantities over one row expression share one per-unit aggregate (_rq_columns)
    ("SELECT g, MIN(age) AS lo, MAX(age) AS hi, median(age) AS m FROM {t} GROUP BY g", {}),
])
def test_quantile_rows_kept_equal_reference(edb, sql, opts):
    """The quantile path keeps, per unit, the rows of its chosen group (k = 1: smallest h) with the
    smallest (order, bucket) pairs, at most min(C, M) of them, where order is the unit's own order of
    the bucket (intHash64 of the keyed bucket hash XOR the unit's salted hash) and a row without a
    bucket (NULL) comes last; the group stage is their bucket histogram. The rewriter packs each pair
    into one UInt128 (order·2^32 + bucket, which sorts as the pair does); the reference sorts the
    pairs themselves, in Python, over the engine's per-row values: the histograms must be equal
    exactly."""
    plan = prepare(edb, sql.format(t=TABLE), epsilon=1.0, **opts).plan
    rw = _Rewriter(plan, noise=False, selection=False, table=None)
    assert rw.quant_qs and plan.bounding.k == 1
    keys = [f"({sql_of(k.expr)})" for k in rw.keys]
    unit = quote_ident(plan.entry.privacy_unit)
    h = rw.unit_hash_sql(keys, unit) if keys else "toUInt64(0)"
    buckets = [f"ifNull({q.row_sql}, {QUANTILE_BUCKETS})" for q in rw.quant_qs]
    cols = [f"{unit} AS u", f"{h} AS h"] + [f"tuple({k}) AS k{j}" for j, k in enumerate(keys)] + \
        [f"toUInt32({b}) AS b{i}" for i, b in enumerate(buckets)] + \
        [f"if(isNull({q.row_sql}), 18446744073709551615, intHash64(bitXor(sipHash64Keyed({SALT}, {b}), "
         f"{rw._unit_part_sql(unit)}))) AS ph{i}" for i, (q, b) in enumerate(zip(rw.quant_qs, buckets))]
    where = rw._where(key_filters=not rw._defer_key_filters())
    df = edb.raw_query(rw._salted(f"SELECT {', '.join(cols)} FROM {plan.entry.table_sql}{where}"))
    cap = min(plan.bounding.max_rows, plan.bounding.rows_per_group)
    ref: dict = {}
    for _, rows in df.groupby("u", sort=False):
        hmin = rows["h"].min()
        chosen = rows[rows["h"] == hmin]
        key = tuple(_norm(chosen[f"k{j}"].iloc[0][0]) for j in range(len(keys)))
        for i in range(len(buckets)):
            kept = sorted(zip(chosen[f"ph{i}"].astype(np.uint64), chosen[f"b{i}"]))[:cap]
            hist = ref.setdefault((key, i), {})
            for _, b in kept:
                if int(b) < QUANTILE_BUCKETS:
                    hist[int(b)] = hist.get(int(b), 0) + 1
    got = edb.raw_query(rw._salted(rw.groups_sql()))
    checked = 0
    for _, row in got.iterrows():
        key = tuple(_norm(row[f"__dp_k{j}"]) for j in range(len(keys)))
        for i, q in enumerate(rw.quant_qs):
            b, c = row[q.column]
            assert dict(zip(map(int, b), map(int, c))) == ref.get((key, i), {}), (key, i)
            checked += sum(map(int, c))
    assert checked > 0


@pytest.mark.parametrize("sql,opts", [
    ("SELECT d, COUNT(DISTINCT nv) AS nn, COUNT(DISTINCT age) AS na FROM {t} GROUP BY d", {"max_rows_per_unit": 4}),
    ("SELECT COUNT(DISTINCT gs) AS n FROM {t} WHERE age > 20", {"max_rows_per_unit": 3}),
    ("SELECT g, COUNT(DISTINCT nv) AS nn FROM {t} GROUP BY g",
     {"max_groups_contributed": 3, "max_rows_per_unit": 7, "max_rows_per_group": 2}),
])
def test_count_distinct_equals_reference(edb, sql, opts):
    """COUNT(DISTINCT v) keeps, per kept group of a unit, its first r distinct values (r: the row caps
    of the rule above; a value repeated by the unit takes one place) in the unit's own order: (the top 63 bits of intHash64(keyed value hash XOR the unit's
    salted hash), NULL values last; then the value hash), and counts the distinct non-NULL values of
    the kept rows per group. The rewriter packs (order, value hash, not-NULL bit) into one UInt128
    and counts distinct value hashes; the reference sorts the triples in Python and counts the values
    themselves, so it also checks that no two values of the data collide."""
    plan = prepare(edb, sql.format(t=TABLE), epsilon=1.0, **opts).plan
    rw = _Rewriter(plan, noise=False, selection=False, table=None)
    b = plan.bounding
    k, C, M = b.k, b.rows_per_group, b.max_rows
    if k == 1:
        C = M = min(C, M)
    assert [q.kind for q in rw.quant_qs] == ["distinct"] * len(rw.quant_qs) and rw.quant_qs
    keys = [f"({sql_of(k_.expr)})" for k_ in rw.keys]
    unit = quote_ident(plan.entry.privacy_unit)
    h = rw.unit_hash_sql(keys, unit) if keys else "toUInt64(0)"
    cols = [f"{unit} AS u", f"{h} AS h"] + [f"tuple({k_}) AS k{j}" for j, k_ in enumerate(keys)] + \
        [f"tuple({q.row_sql}) AS v{i}" for i, q in enumerate(rw.quant_qs)] + \
        [f"sipHash64Keyed({SALT}, tuple({q.row_sql})) AS vh{i}" for i, q in enumerate(rw.quant_qs)] + \
        [f"bitShiftRight(if(isNull({q.row_sql}), 18446744073709551615, intHash64(bitXor(sipHash64Keyed({SALT}, "
         f"tuple({q.row_sql})), {rw._unit_part_sql(unit)}))), 1) AS vo{i}" for i, q in enumerate(rw.quant_qs)]
    where = rw._where(key_filters=not rw._defer_key_filters())
    df = edb.raw_query(rw._salted(f"SELECT {', '.join(cols)} FROM {plan.entry.table_sql}{where}"))
    ref: dict = {}
    for _, rows in df.groupby("u", sort=False):
        used = 0
        for hv, grp in sorted(rows.groupby("h", sort=False), key=lambda t: int(t[0]))[:k]:
            c = len(grp)
            r = min(min(c, C), max(0, M - used))
            used += min(c, C)
            key = tuple(_norm(grp[f"k{j}"].iloc[0][0]) for j in range(len(keys)))
            for i in range(len(rw.quant_qs)):
                vals = [_norm(t[0]) for t in grp[f"v{i}"]]
                triples = sorted(set(zip(grp[f"vo{i}"].astype(np.uint64), grp[f"vh{i}"].astype(np.uint64), vals)),
                                 key=lambda t: (int(t[0]), int(t[1]), t[2] is not None))[:r]  # distinct values
                ref.setdefault((key, i), set()).update(v for _, _, v in triples if v is not None)
    got = edb.raw_query(rw._salted(rw.groups_sql()))
    checked = 0
    for _, row in got.iterrows():
        key = tuple(_norm(row[f"__dp_k{j}"]) for j in range(len(keys)))
        for i, q in enumerate(rw.quant_qs):
            assert int(row[q.column]) == len(ref.get((key, i), set())), (key, i)
            checked += int(row[q.column])
    assert checked > 0


def test_quantities_over_one_expression_share_their_per_unit_aggregate(edb):
    """MIN, MAX and median of one column: one rows-stage column, one groupArraySorted, one
    histogram (their values are checked against the reference above); each keeps its own noise."""
    plan = prepare(edb, f"SELECT g, MIN(age) AS lo, MAX(age) AS hi, median(age) AS m FROM {TABLE} GROUP BY g",
                   epsilon=1.0).plan
    sql = rewrite_for_sensitivity_check(plan).sql
    assert len(_Rewriter(plan, noise=False, selection=False, table=None).quant_qs) == 3
    assert sql.count(" AS __dp_rq") == 1 and sql.count("groupArraySortedArgMin(") == 3
    aggs = re.findall(r"(groupArraySortedArgMin\(.*?) AS __dp_sq\d", sql)
    assert len(aggs) == 3 and len(set(aggs)) == 1  # the same text: ClickHouse computes it once
