"""The floor of user-level contribution bounding at k > 1 (issue 33; results: bench/RESULTS.md,
"Bounding at k > 1: its own floor", and docs/PERFORMANCE.md, same title).

The ClickBench bench's "floor" (bench_clickbench.floor_sql: the WHERE and one plain
GROUP BY (UserID, keys) count pass) does no bounding. With k = 5 groups per unit and M = 100 rows
per unit, a user-level answer must also choose each unit's k groups (smallest salted hash of
(unit, key)) and cap its rows at M in that hash order (dpch/rewrite/bounding.py, the k > 1 branch
of ``groups_sql``; docs/CONTROLLER.md, "Contribution bounds"). This script times, interleaved on
one embedded store (a copy of bench/.data/clickbench-<rows> in --work, so the bench's store is
never written):

- ``plain``   the query as written (``db.raw_query``);
- ``floor``   bench_clickbench.floor_sql;
- ``pairs``   ``pair_pass_sql``: the salted (unit, key) hash and one GROUP BY (unit, hash) with the
              keys and the count, the part of the bounding every rule for k > 1 needs;
- ``one_pass`` ``one_pass_sql``: the same values in one GROUP BY unit over the rows (M smallest
              row hashes, k smallest distinct hashes) plus a (key hash → keys) join, for the
              queries it applies to (C = M, counts only); checked EQUAL to DPCH's group stage;
- ``min``     the least SQL found here for the same bounded per-group pre-noise values
              (``bounded_sql``): the pairs pass, one GROUP BY unit collecting arrays, the positions of
              the k smallest hashes, the M cap by ``arrayCumSum``, one ARRAY JOIN over the
              positions, the GROUP BY keys, ORDER BY, LIMIT (DPCH's SETTINGS appended); its
              group values are checked EQUAL to DPCH's noise-off group stage before timing;
- ``dpch_off`` DPCH's rewritten SQL, noise and partition selection off
              (``rewrite_for_sensitivity_check``, as tests/test_accelerate.py uses it);
- ``dpch_sel`` the same with partition selection on, noise off (thresholds on noiseless values);
- ``dpch_sql`` DPCH's full rewritten SQL (noise UDFs + selection) run raw, without the controller;
- ``dpch_oneblock`` the same with the selection draw fed one block (``one_block_rewriter``);
- ``dp``      ``db.query`` end to end (plan cache, ledger charge, post-processing; the ledger's
              generation is reset before each query as bench_clickbench does);
- ``noise``   the noise UDF alone on as many values as the query has candidate groups
              (``dpch_gaussian_int`` over ``numbers(groups)``): what noising every candidate's
              selection statistic costs by itself.

Per query: medians (ms) of --repeats rounds, each round running every variant once in a rotated
order, after one warm-up each; the 1-minute load average before and after.

    .venv/bin/python bench/bench_bounding_floor.py [--rows 1000000] [--queries Q12,Q14,Q30,Q33]
                                                   [--repeats 10] [--out bench/out/bounding_floor.json]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

VARIANTS = ["plain", "floor", "pairs", "one_pass", "min", "dpch_off", "dpch_sel", "dpch_sql", "dpch_oneblock", "dp",
            "noise"]


def one_block_rewriter(base):
    """A subclass of DPCH's ``_Rewriter`` whose selection draw gets every candidate group in one
    block (``groupArray`` of the group stage's rows, then ``ARRAY JOIN``): the executable noise UDF
    pays per block, and the group stage leaves two-level aggregation as 256 small blocks. Same
    draws, one per candidate. A benchmark probe, not used by DPCH."""
    class OneBlock(base):
        def _selection_first_sql(self, inner: str) -> str:
            cols = [self._k(j) for j in range(self.nk)] + [q.column for q in self.plan.quantities]
            outs = ", ".join(f"__dp_t.{i + 1} AS {c}" for i, c in enumerate(cols))
            inner = (f"SELECT {outs} FROM (SELECT groupArray(tuple({', '.join(cols)})) AS __dp_all "
                     f"FROM ({inner})) ARRAY JOIN __dp_all AS __dp_t")
            return super()._selection_first_sql(inner)
    return OneBlock


def rows_sql(rw, *, values: bool = True) -> str:
    """DPCH's rows stage, with its own expressions (so every form here chooses the same rows):
    unit __dp_u, keys __dp_rk<j>, the salted (unit, keys) hash __dp_h, and (``values``) the
    clipped row values __dp_re<i>, over the query's WHERE."""
    from dpch.catalog import quote_ident
    from dpch.sql_ast import sql_of
    keys = [f"{sql_of(key.expr)} AS __dp_rk{j}" for j, key in enumerate(rw.keys)]
    h = rw.unit_hash_sql([f"__dp_rk{j}" for j in range(rw.nk)], "__dp_u")
    res = "".join(f", {q.row_sql} AS __dp_re{i}" for i, q in enumerate(rw.row_qs)) if values else ""
    return (f"SELECT {quote_ident(rw.plan.entry.privacy_unit)} AS __dp_u, {', '.join(keys)}, {h} AS __dp_h{res} "
            f"FROM {rw.table_sql}{rw._where()}")


def bounded_sql(rw, *, order_limit: str = "") -> str:
    """The least SQL found for DPCH's bounded per-group values at k > 1 (private keys): the same
    rows stage (unit, keys, salted hash, clipped row values: DPCH's own expressions, so the same
    rows are chosen), one GROUP BY (unit, hash), one GROUP BY unit collecting the unit's groups,
    the k smallest hashes' positions, the M cap in hash order (``arrayCumSum``), one ARRAY JOIN
    over those positions, the GROUP BY keys. Columns as DPCH's group stage: __dp_k<j>, __dp_q<i>.
    Not private: a benchmark of the pre-noise values only."""
    from dpch.plan.selection import unit_weight_sql
    p, b = rw.plan, rw.plan.bounding
    k, C, M, nk, ns = b.k, b.rows_per_group, b.max_rows, rw.nk, len(rw.row_qs)
    assert nk and k > 1 and not rw.quant_qs and not any(p.key_nullable(j) for j in range(nk))
    rows = rows_sql(rw)
    s1 = ("SELECT __dp_u, __dp_h, toInt64(count()) AS c" + "".join(f", any(__dp_rk{j}) AS k{j}" for j in range(nk))
          + "".join(f", sum(__dp_re{i}) AS s{i}" for i in range(ns)) + f" FROM ({rows}) GROUP BY __dp_u, __dp_h")
    arrays = [("__dp_h", "ah"), ("c", "ac")] + [(f"k{j}", f"ak{j}") for j in range(nk)] + \
        [(f"s{i}", f"as{i}") for i in range(ns)]
    collect = ", ".join(f"groupArray({c}) AS {a}" for c, a in arrays)
    per_unit = f"SELECT {collect} FROM ({s1}) GROUP BY __dp_u"
    # positions of the unit's k smallest hashes (distinct within a unit), in hash order
    weight = f", {unit_weight_sql('length(o)', rw.weighted.hi_units)} AS w" if rw.weighted is not None else ""
    chosen = (f"SELECT *, arraySlice(arraySort((j, v) -> v, arrayEnumerate(ah), ah), 1, {k}) AS o, "
              f"arrayCumSum(arrayMap(j -> least(ac[j], {C}), o)) AS cum{weight} FROM ({per_unit})")
    cols = [f"ak{j}[j] AS __dp_k{j}" for j in range(nk)] + [
        "ac[j] AS __dp_c", f"toInt64(least(least(ac[j], {C}), greatest(0, {M} - (cum[n] - least(ac[j], {C}))))) AS __dp_r"] + \
        [f"as{i}[j] AS __dp_s{i}" for i in range(ns)] + (["w AS __dp_w"] if weight else [])
    unfold = f"SELECT {', '.join(cols)} FROM ({chosen}) ARRAY JOIN o AS j, arrayEnumerate(o) AS n"
    out = [f"__dp_k{j}" for j in range(nk)]
    for q in p.quantities:
        if q.kind == "units":
            agg = "count()"
        elif q.kind == "weighted_units":
            agg = "sum(__dp_w)"
        elif q.row_sql is None:
            agg = "sum(__dp_r)"
        else:
            i = rw.row_qs.index(q)
            agg = (f"sum(if(__dp_c <= __dp_r, __dp_s{i}, least(greatest(toInt64(round(__dp_s{i} * __dp_r / __dp_c)), "
                   f"__dp_r * ({q.lo_units})), __dp_r * {q.hi_units})))")
        out.append(f"toInt64({agg}) AS {q.column}")
    sql = f"SELECT {', '.join(out)} FROM ({unfold}) GROUP BY {', '.join(f'__dp_k{j}' for j in range(nk))}"
    return rw._salted(sql + order_limit)


def pair_pass_sql(rw) -> str:
    """The first step every k > 1 bounding needs and the bench's floor lacks: the salted hash of
    (unit, keys) on every row and one GROUP BY (unit, hash) with the keys and the row count."""
    rows = rows_sql(rw, values=False)
    anyk = "".join(f", any(__dp_rk{j}) AS k{j}" for j in range(rw.nk))
    return rw._salted(f"SELECT sum(c) FROM (SELECT __dp_u, __dp_h, count() AS c{anyk} FROM ({rows}) GROUP BY __dp_u, __dp_h)")


def one_pass_sql(rw, *, order_limit: str = "") -> str | None:
    """The same values by a cheaper form, where it applies (C = M, COUNT/COUNT(DISTINCT unit) only:
    no sums): ONE GROUP BY unit over the rows, keeping its M smallest row hashes
    (``groupArraySorted(M)``) and its k smallest distinct hashes (``groupArraySortedDistinct(k)``).
    A chosen group's kept rows are its hash's occurrences among the M smallest (= DPCH's
    min(c, M - rows before it) when C = M); the group stage is keyed by the key part of the hash,
    and the key values come back by joining (key hash, any(keys)) over the WHERE's rows. None when
    the shape does not apply."""
    from dpch.plan.selection import unit_weight_sql
    from dpch.sql_ast import sql_of
    p, b = rw.plan, rw.plan.bounding
    if rw.row_qs or rw.quant_qs or b.rows_per_group != b.max_rows:
        return None
    nk = rw.nk
    keys = [f"{sql_of(key.expr)} AS __dp_rk{j}" for j, key in enumerate(rw.keys)]
    rk = [f"__dp_rk{j}" for j in range(nk)]
    rows = rows_sql(rw, values=False)
    per_unit = (f"SELECT __dp_u, groupArraySorted({b.max_rows})(__dp_h) AS hs, "
                f"groupArraySortedDistinct({b.k})(__dp_h) AS ds FROM ({rows}) GROUP BY __dp_u")
    weight = f", {unit_weight_sql('length(ds)', rw.weighted.hi_units)} AS w" if rw.weighted is not None else ""
    unfold = (f"SELECT bitXor(d, {rw._unit_part_sql('__dp_u')}) AS kh, countEqual(hs, d) AS r{weight} "
              f"FROM ({per_unit}) ARRAY JOIN ds AS d")
    aggs = {"units": "count()", "weighted_units": "sum(w)"}
    out = [f"toInt64({aggs.get(q.kind, 'sum(r)')}) AS {q.column}" for q in p.quantities]
    groups = f"SELECT kh, {', '.join(out)} FROM ({unfold}) GROUP BY kh"
    kmap = (f"SELECT {rw._key_part_sql(rk)} AS kh, {', '.join(f'any({k}) AS __dp_k{j}' for j, k in enumerate(rk))} "
            f"FROM (SELECT {', '.join(keys)} FROM {rw.table_sql}{rw._where()}) GROUP BY kh")
    cols = [f"__dp_k{j}" for j in range(nk)] + [q.column for q in p.quantities]
    return rw._salted(f"SELECT {', '.join(cols)} FROM ({groups}) AS g JOIN ({kmap}) AS m USING kh{order_limit}")


def sorted_frame(df):
    return df.sort_values(list(df.columns)).reset_index(drop=True)


def same(a, b) -> bool:
    """Equal group by group (both sorted by every column), with DPCH's column names."""
    return a.shape == b.shape and bool((a.values == b.values).all())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--queries", default="Q12,Q14,Q30,Q33")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--data-root", default=str(HERE / ".data"))
    ap.add_argument("--work", default="/tmp/dpch-bounding-floor", help="where the store is copied to")
    ap.add_argument("--out", default=str(HERE / "out" / "bounding_floor.json"))
    args = ap.parse_args(argv)

    src = Path(args.data_root) / f"clickbench-{args.rows}"
    work = Path(args.work) / src.name
    if not (work / "clickbench_built.json").exists():
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(src, work, symlinks=True)
    os.environ.setdefault("DPCH_DATA_DIR", str(work))
    import dpch
    from bench_clickbench import floor_sql
    from clickbench import schema
    from clickbench.queries import BY_NAME
    from dpch.controller import prepare
    from dpch.rewrite import _Rewriter

    db = dpch.connect(str(work), analyst="bench")
    schema.register(db)
    eps, delta = 1.0, 1e-6
    results = []
    for name in args.queries.split(","):
        q = BY_NAME[name]
        plan = prepare(db, q.sql, epsilon=eps, delta=delta).plan
        off = _Rewriter(plan, noise=False, selection=False, table=None)
        sql_off = off.build().sql
        settings = sql_off[sql_off.rindex("\nSETTINGS"):]
        # the noise-off group stage: DPCH's bounded pre-noise values of every group
        dpch_groups = sorted_frame(db.raw_query(off._salted(off.groups_sql(key_hash=True))))
        mine = sorted_frame(db.raw_query(bounded_sql(off)))
        equal = same(dpch_groups, mine)
        order = f" ORDER BY {plan.quantities[0].column} DESC LIMIT 10"
        one = one_pass_sql(off)
        one_equal = same(dpch_groups, sorted_frame(db.raw_query(one))) if one else None
        sqls = {"plain": q.sql, "floor": floor_sql(q.sql), "pairs": pair_pass_sql(off),
                "one_pass": one + order + settings if one else None, "min": bounded_sql(off, order_limit=order) + settings,
                "dpch_off": sql_off,
                "dpch_sel": _Rewriter(plan, noise=False, selection=True, table=None).build().sql,
                "dpch_sql": _Rewriter(plan, noise=True, selection=True, table=None).build().sql,
                "dpch_oneblock": one_block_rewriter(_Rewriter)(plan, noise=True, selection=True, table=None).build().sql,
                # the selection statistic's noise alone: one Gaussian UDF call per candidate group
                "noise": f"SELECT sum(dpch_gaussian_int(toInt64(number), 1000.0)) FROM numbers({len(dpch_groups)})"}

        def run(v):
            if v == "dp":
                db.ledger.reset(db.analyst, schema.TABLE, confirm=True)
                t0 = time.perf_counter()
                db.query(q.sql, epsilon=eps, delta=delta)
            else:
                t0 = time.perf_counter()
                db.raw_query(sqls[v])
            return time.perf_counter() - t0

        load0 = os.getloadavg()[0]
        variants = [v for v in VARIANTS if v == "dp" or sqls[v]]
        for v in variants:
            run(v)  # warm-up
        times = {v: [] for v in variants}
        for r in range(args.repeats):
            rot = variants[r % len(variants):] + variants[:r % len(variants)]
            for v in rot:
                times[v].append(run(v))
        med = {v: 1000 * statistics.median(t) for v, t in times.items()}
        res = {"query": name, "groups": len(dpch_groups), "min_equals_dpch": equal, "one_pass_equals_dpch": one_equal,
               "load_before": round(load0, 2), "load_after": round(os.getloadavg()[0], 2),
               "median_ms": {v: round(m, 1) for v, m in med.items()}}
        print(json.dumps(res), flush=True)
        results.append(res)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"rows": args.rows, "repeats": args.repeats, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
