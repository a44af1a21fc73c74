"""ClickBench-style workload (issue 17; results: bench/RESULTS.md, "ClickBench-style workload (issue 17)").

The 43 public ClickBench queries (bench/clickbench/queries.py) on a synthetic hits-like table
(bench/clickbench/schema.py: Zipf users and URLs; UserID is the privacy unit, k = 5, M = 100),
each run plainly (`db.raw_query`, the SQL as written) and through the controller (`db.query`, ε = 1,
δ = 1e-6) on the same embedded store. Per query: answered or rejected (with the message), and for
the answered ones the medians of --repeats alternating runs (plain, DP, plain, DP, ... after one
warm-up each) and DP / plain, and the same against the query's per-unit floor (its WHERE and one
plain GROUP BY (UserID, keys) pass: `floor_sql`). Summary: how many of the DP-expressible queries are answered, the
geometric mean and the maximum of DP / plain over the answered ones. The ledger's budget
generation is reset before each query (the benchmark's own budget), so a DP time does not grow with
the number of charges made before it.

    python3 bench/bench_clickbench.py --rows 10000000 [--repeats 5] [--queries Q0,Q27] [--out FILE.json]
                                      [--accelerate]

``--accelerate`` runs the same on a copy of the store whose table also holds DPCH's per-unit projection
for ungrouped queries (``db.accelerate(table)``: one row of per-unit states per user and part); queries
it cannot serve (GROUP BY at k = 5, WHERE on a column other than the unit) read the table as before.
``--accelerate table`` does the same with a per-unit table kept by a materialized view instead
(``db.accelerate(table, method="table")``, dpch.accelerate_table: one row per user).

The store is cached in bench/.data/clickbench-<rows> (delete it, or --rebuild, to regenerate).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import dpch  # noqa: E402
import sqlglot  # noqa: E402
from sqlglot import exp  # noqa: E402
from clickbench import schema  # noqa: E402
from clickbench.queries import BY_NAME, QUERIES  # noqa: E402
from dpch.errors import QueryRejected  # noqa: E402
from run_all import write_results  # noqa: E402

TARGET_GEOMEAN = 2.5
TARGET_MAX = 6.0


def open_store(rows: int, units: int, root: Path, rebuild: bool, accelerated: str | None = None):
    """An embedded store holding the table (built on first use, then cached). ``accelerated``: a
    separate copy of that store whose table also has DPCH's per-unit projection for ungrouped
    queries (``db.accelerate``), so the plain store stays as ClickBench defines it."""
    store = root / f"clickbench-{rows}"
    if accelerated:
        plain_store = store
        store = root / (f"clickbench-{rows}-accelerated" + ("" if accelerated == "projection" else f"-{accelerated}"))
        if rebuild or not (store / "clickbench_built.json").exists():
            if rebuild or not (plain_store / "clickbench_built.json").exists():
                # one process can open one chDB store: the plain store is built by a child process
                subprocess.run([sys.executable, __file__, "--rows", str(rows), "--units", str(units),
                                "--data-root", str(root), "--build-only"] + (["--rebuild"] if rebuild else []),
                               check=True)
            shutil.rmtree(store, ignore_errors=True)
            shutil.copytree(plain_store, store, symlinks=True)  # the store's metadata links are relative
    marker = store / "clickbench_built.json"
    fresh = rebuild or not marker.exists()
    store.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("DPCH_DATA_DIR", str(store))
    db = dpch.connect(str(store), analyst="bench")
    if fresh:
        t0 = time.perf_counter()
        schema.build(db, rows, units)
        info = {"rows": rows, "units": units, "build_s": round(time.perf_counter() - t0, 2)}
        marker.write_text(json.dumps(info))
    else:
        info = {**json.loads(marker.read_text()), "cached": True}
        schema.register(db)  # refresh the catalog entry and the budget (definitions may have changed)
    if accelerated:
        t0 = time.perf_counter()
        # no GROUP BY: every bounded column (kept if already built)
        acc = db.accelerate(schema.TABLE, method=accelerated)
        info = {**info, "accelerated": {accelerated: acc.name, "columns": list(acc.columns),
                                        "seconds": round(time.perf_counter() - t0, 2)}}
    return db, info


def floor_sql(sql: str) -> str:
    """The per-unit floor of a query: its WHERE and one GROUP BY (UserID, its keys) pass with a
    count, no bounding and no noise (the least work any user-level answer needs; Q0's floor is a
    GROUP BY UserID over every row where the plain query reads a count from the parts' metadata)."""
    tree = sqlglot.parse_one(sql, read="clickhouse")
    items = list(tree.expressions)
    aliases = {i.alias: i.this for i in items if isinstance(i, exp.Alias)}
    keys = []
    for g in (tree.args["group"].expressions if tree.args.get("group") else []):
        if isinstance(g, exp.Literal) and g.is_int:
            item = items[int(g.this) - 1]
            g = item.this if isinstance(item, exp.Alias) else item
        elif isinstance(g, exp.Column) and g.name in aliases:
            g = aliases[g.name]
        keys.append(g.sql(dialect="clickhouse"))
    where = tree.args.get("where")
    where_sql = f" {where.sql(dialect='clickhouse')}" if where is not None else ""
    cols = ", ".join(["UserID"] + [f"{k} AS __k{i}" for i, k in enumerate(keys)])
    by = ", ".join(["UserID"] + [f"__k{i}" for i in range(len(keys))])
    # sum(c), not count(): with an outer count() ClickHouse drops the unused per-unit count and the
    # "floor" only collects the keys (Q0: 104 vs 162 ms at 10 M rows); every user-level rule needs
    # each unit's row count
    return f"SELECT sum(c) AS n FROM (SELECT {cols}, count() AS c FROM {schema.TABLE}{where_sql} GROUP BY {by})"


def run_query(db, q, repeats: int, epsilon: float, delta: float) -> dict:
    """Answer or rejection; for answers, alternating timings of the plain and the DP query."""
    out = {"query": q.name, "expressible": q.expressible, "reason": q.reason}
    # a charge reads every earlier charge of the budget's generation (O(n) per charge): a new
    # generation per query keeps each DP time independent of how many queries ran before it
    db.ledger.reset(db.analyst, schema.TABLE, confirm=True)
    try:
        df = db.query(q.sql, epsilon=epsilon, delta=delta)  # also the DP warm-up
    except QueryRejected as e:
        return {**out, "status": "rejected", "message": str(e)}
    floor = floor_sql(q.sql)
    db.raw_query(q.sql)  # plain warm-up
    db.raw_query(floor)
    t_plain, t_dp, t_floor = [], [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        plain = db.raw_query(q.sql)
        t1 = time.perf_counter()
        df = db.query(q.sql, epsilon=epsilon, delta=delta)
        t2 = time.perf_counter()
        db.raw_query(floor)
        t3 = time.perf_counter()
        t_plain.append(t1 - t0)
        t_dp.append(t2 - t1)
        t_floor.append(t3 - t2)
    mp, md, mf = statistics.median(t_plain), statistics.median(t_dp), statistics.median(t_floor)
    return {**out, "status": "answered", "plain_s": mp, "dp_s": md, "floor_s": mf, "ratio": md / mp,
            "dp_over_floor": md / mf, "plain_rows": len(plain), "dp_rows": len(df),
            # what the per-unit stage read: "table", or the per-unit table that served it
            "per_unit_source": df.attrs.get("dpch", {}).get("per_unit_source")}


def summarise(results: list[dict]) -> dict:
    expressible = [r for r in results if r["expressible"]]
    answered = [r for r in results if r["status"] == "answered"]
    ratios = [r["ratio"] for r in answered]
    geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios)) if ratios else float("nan")
    over_floor = [r["dp_over_floor"] for r in answered]
    return {"queries": len(results), "expressible": len(expressible),
            "geomean_dp_over_floor": math.exp(sum(math.log(x) for x in over_floor) / len(over_floor))
            if over_floor else float("nan"),
            "expressible_answered": sum(r["status"] == "answered" for r in expressible),
            "answered_not_expressible": [r["query"] for r in answered if not r["expressible"]],
            "expressible_rejected": [r["query"] for r in expressible if r["status"] != "answered"],
            "geomean_ratio": geo, "max_ratio": max(ratios, default=float("nan")),
            "max_query": max(answered, key=lambda r: r["ratio"])["query"] if answered else None}


def markdown(result: dict) -> str:
    s = result["summary"]
    how = {"projection": "per-unit projection", "table": "per-unit table (`method=\"table\"`)"}
    lines = [(f"With DPCH's {how[result['accelerated']]} for ungrouped queries (`db.accelerate`). "
              if result.get("accelerated") else "") + f"{result['rows']:,} rows, {result['distinct_users']:,} users; "
             f"ε = {result['epsilon']}, "
             f"δ = {result['delta']}; medians of {result['repeats']} alternating runs; commit {result['commit']}.", "",
             f"Answered {s['expressible_answered']} of {s['expressible']} DP-expressible queries; DP / plain over "
             f"the answered: geometric mean **{s['geomean_ratio']:.2f}×**, max **{s['max_ratio']:.2f}×** "
             f"({s['max_query']}); targets ≤ {TARGET_GEOMEAN}× and ≤ {TARGET_MAX}×. DP / per-unit floor: "
             f"geometric mean {s['geomean_dp_over_floor']:.2f}×.", "",
             "| query | DP-expressible | status | plain ms | DP ms | DP / plain | floor ms | DP / floor | rows plain / DP |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in result["results"]:
        expr = "yes" if r["expressible"] else f"no: {r['reason']}"
        if r["status"] == "answered":
            lines.append(f"| {r['query']} | {expr} | answered | {1000 * r['plain_s']:.0f} | {1000 * r['dp_s']:.0f} | "
                         f"{r['ratio']:.2f} | {1000 * r['floor_s']:.0f} | {r['dp_over_floor']:.2f} | "
                         f"{r['plain_rows']} / {r['dp_rows']} |")
        else:
            msg = r["message"].replace("|", "\\|")
            lines.append(f"| {r['query']} | {expr} | rejected: {msg[:160]} | | | | | | |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--units", type=int, default=None, help="Zipf user ranks (default rows / 10)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--delta", type=float, default=1e-6)
    ap.add_argument("--queries", default=None, help="comma-separated names, e.g. Q0,Q27")
    ap.add_argument("--data-root", default=str(HERE / ".data"))
    ap.add_argument("--rebuild", action="store_true")
    ap.add_argument("--out", default=str(HERE / "out" / "clickbench.json"))
    ap.add_argument("--markdown", default=str(HERE / "out" / "clickbench.md"))
    ap.add_argument("--accelerate", nargs="?", const="projection", default=None, choices=["projection", "table"],
                    help="run on a copy of the store with DPCH's per-unit projection (or per-unit table) for "
                         "ungrouped queries (db.accelerate); the plain queries run on that copy too")
    ap.add_argument("--build-only", action="store_true", help="build (or keep) the store and exit")
    args = ap.parse_args(argv)
    units = args.units or max(1, args.rows // 10)
    if args.build_only:
        open_store(args.rows, units, Path(args.data_root), args.rebuild)[0].close()
        return 0
    started = time.perf_counter()
    # the code that runs is the code at the start (a commit made during a long run is not it)
    commit = subprocess.run(["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    chosen = [BY_NAME[n] for n in args.queries.split(",")] if args.queries else list(QUERIES)
    db, info = open_store(args.rows, units, Path(args.data_root), args.rebuild, accelerated=args.accelerate)
    try:
        users = int(db.raw_query(f"SELECT uniqExact(UserID) AS u FROM {schema.TABLE}")["u"][0])
        results = []
        for q in chosen:
            r = run_query(db, q, args.repeats, args.epsilon, args.delta)
            results.append(r)
            print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()
                              if k not in ("reason",)}), flush=True)
    finally:
        db.close()
    result = {"rows": args.rows, "units": units, "distinct_users": users, "epsilon": args.epsilon,
              "accelerated": args.accelerate,
              "delta": args.delta, "repeats": args.repeats, "commit": commit, "build": info,
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
              "results": results, "summary": summarise(results), "seconds": time.perf_counter() - started}
    write_results(result, Path(args.out), Path(args.markdown), markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
