"""Where a small DP query's time goes (issue 33, item 1), and its latency over the plain query.

Data: ``bench.small``, 1 M rows, 100 000 users (10 rows each), 8 public regions (the catalog's
public keys), ``amount`` in [0, 500]; ``privacy_unit = user_id``, 1 group and 10 rows per unit.

1. Stage table (in process): each stage of ``run_query`` timed on its own, in the order run_query
   calls them (dpch.controller.prepare's ``timings_ms`` for parse / bind / plan / rewrite; the
   pre-charge type check ``dpch.probe_db.check_before_charge``; the ledger charge and its mark;
   the engine on the rewritten SQL, split into analysis + planning (``EXPLAIN PIPELINE`` of it,
   which parses, analyses and builds the pipeline without reading a row) and the rest; the
   post-processing ``dpch.postprocess.postprocess``). ``--cold`` empties the plan cache before each
   repetition (what a query seen for the first time costs).
2. Latency: DP p50 minus plain p50 for COUNT/SUM/AVG GROUP BY the public key, in process
   (``db.query`` vs ``db.raw_query`` of the plain query, interleaved) and, with ``--gateway``,
   through ``dpch serve`` (HTTP, TabSeparated) against the plain query in process on an identical
   second store (chDB: one store per process), interleaved too.

3. ``--methods``: the latency again with each per-unit structure (issue 33, item 2): none, the
   per-unit projection (``db.accelerate``) and the per-unit table (``method="table"``), side by
   side in one run; each is built, checked to be what the DP query read, measured, and dropped.
   ``--methods table`` (a comma list) measures only those; with the per-unit table, also the p50 of
   its freshness check (``dpch.rewrite.unit_table.fresh``, 50 calls).

    .venv/bin/python bench/bench_small_query.py [--rows 1000000] [--reps 60] [--gateway] [--cold] [--methods [LIST]]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import dpch  # noqa: E402

REGIONS = ["north", "south", "east", "west", "centre", "coast", "hills", "islands"]
QUERIES = {
    "COUNT": ("SELECT region, COUNT(*) AS n FROM bench.small GROUP BY region",
              "SELECT region, count() AS n FROM bench.small GROUP BY region"),
    "SUM": ("SELECT region, SUM(amount) AS s FROM bench.small GROUP BY region",
            "SELECT region, sum(amount) AS s FROM bench.small GROUP BY region"),
    "AVG": ("SELECT region, AVG(amount) AS a FROM bench.small GROUP BY region",
            "SELECT region, avg(amount) AS a FROM bench.small GROUP BY region"),
}
# the per-unit floor (docs/PERFORMANCE.md): the same answer's per-unit pre-aggregation and GROUP BY,
# no DP: what any user-level bounding must at least compute
_UNITS = ("SELECT user_id, any(region) AS region, least(count(), 10) AS c, sum(least(greatest(amount, 0), 500)) AS s "
          "FROM bench.small GROUP BY user_id")
FLOORS = {"COUNT": f"SELECT region, sum(c) AS n FROM ({_UNITS}) GROUP BY region",
          "SUM": f"SELECT region, sum(s) AS s FROM ({_UNITS}) GROUP BY region",
          "AVG": f"SELECT region, sum(s) / sum(c) AS a FROM ({_UNITS}) GROUP BY region"}
EPS = 0.01


def build(data_dir: Path, rows: int) -> None:
    """The table and its catalog entry, in ``data_dir`` (deterministic: two calls give equal stores)."""
    db = dpch.connect(data_dir, analyst="bench")
    try:
        db.command("CREATE DATABASE IF NOT EXISTS bench")
        db.command("CREATE TABLE bench.small (user_id UInt64, region String, amount Float64) "
                   "ENGINE = MergeTree ORDER BY (region, user_id)")
        regions = "[" + ",".join(f"'{r}'" for r in REGIONS) + "]"
        db.command(f"INSERT INTO bench.small SELECT intDiv(number, 10) AS user_id, "
                   f"{regions}[cityHash64(user_id) % {len(REGIONS)} + 1], "
                   f"round(500 * pow((cityHash64(number) % 1000000) / 1e6, 3), 2) FROM numbers({rows})")
        db.catalog.register("bench.small", privacy_unit="user_id", bounds={"amount": (0, 500)},
                            max_groups_contributed=1, max_rows_per_unit=10, public_keys={"region": REGIONS})
        db.ledger.set_budget("bench", "bench.small", epsilon=1e9)
    finally:
        db.close()


def p(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q / 100 * len(xs)))]


def stage_table(db, name: str, reps: int, cold: bool) -> dict[str, float]:
    """Median ms of each stage of run_query for query ``name`` (as dpch.controller.run_query calls
    them), and for comparison the plain query and its EXPLAIN PIPELINE."""
    sql, plain = QUERIES[name]
    from dpch import plan_cache
    from dpch.controller import _ledger_of, prepare
    from dpch.execute import execute
    from dpch.postprocess import postprocess
    from dpch.probe_db import check_before_charge
    from dpch import typecheck

    stages: dict[str, list[float]] = {}

    def add(k, v):
        stages.setdefault(k, []).append(v * 1e3)

    for i in range(reps + 5):
        if cold:
            plan_cache.clear()
            typecheck._PASSED.clear()
        t0 = time.perf_counter()
        pr = prepare(db, sql, epsilon=EPS, precheck=True, profile=True)
        t1 = time.perf_counter()
        check_before_charge(db, pr.plan, None)
        t2 = time.perf_counter()
        ledger = _ledger_of(db)
        receipt = ledger.charge(db.analyst, pr.dataset, pr.cost, sql)
        t3 = time.perf_counter()
        db.backend.query_df(f"EXPLAIN PIPELINE {pr.rewritten.sql}")
        t4 = time.perf_counter()
        df = execute(db.backend, pr.rewritten)
        t5 = time.perf_counter()
        ledger.mark(receipt, "executed")
        t6 = time.perf_counter()
        postprocess(df, pr.plan, pr.rewritten, receipt=receipt, controller_ms=pr.controller_ms)
        t7 = time.perf_counter()
        db.backend.query_df(f"EXPLAIN PIPELINE {plain}")
        t8 = time.perf_counter()
        db.backend.query_df(plain)
        t9 = time.perf_counter()
        if i < 5:
            continue
        for k, v in pr.timings_ms.items():
            add(f"controller: {k}", v / 1e3)
        add("controller: prepare total (incl. precheck)", t1 - t0)
        add("type check (probe)", t2 - t1)
        add("ledger charge + mark", (t3 - t2) + (t6 - t5))
        add("engine: analysis + planning (EXPLAIN PIPELINE)", t4 - t3)
        add("engine: full rewritten query", t5 - t4)
        add("post-processing", t7 - t6)
        add("(plain query: EXPLAIN PIPELINE)", t8 - t7)
        add("(plain query: run)", t9 - t8)
    return {k: statistics.median(v) for k, v in stages.items()}


def paired(run_plain, run_dp, reps: int) -> dict[str, tuple[float, ...]]:
    """Per query: (plain p50, DP p50, plain p99, DP p99, floor p50) in ms; plain, floor (by
    ``run_plain``) and DP interleaved, 5 warm-ups."""
    out = {}
    for name, (dp_sql, plain_sql) in QUERIES.items():
        dp_t, plain_t, floor_t = [], [], []
        for i in range(reps + 5):
            t0 = time.perf_counter()
            run_plain(plain_sql)
            t1 = time.perf_counter()
            run_plain(FLOORS[name])
            t2 = time.perf_counter()
            run_dp(dp_sql)
            t3 = time.perf_counter()
            if i >= 5:
                plain_t.append((t1 - t0) * 1e3)
                floor_t.append((t2 - t1) * 1e3)
                dp_t.append((t3 - t2) * 1e3)
        out[name] = (statistics.median(plain_t), statistics.median(dp_t), p(plain_t, 99), p(dp_t, 99),
                     statistics.median(floor_t))
    return out


def show(title: str, lat: dict) -> None:
    print(f"{title}\n| query | plain p50 | floor p50 | DP p50 | DP - plain | DP - floor | DP / plain | DP / floor "
          "| plain p99 | DP p99 |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, (pl, dp, pl99, dp99, fl) in lat.items():
        print(f"| {name} | {pl:.1f} | {fl:.1f} | {dp:.1f} | {dp - pl:.1f} | {dp - fl:.1f} | {dp / pl:.2f} | "
              f"{dp / fl:.2f} | {pl99:.1f} | {dp99:.1f} |")


def freshness_ms(db, name: str, calls: int = 50) -> float:
    """p50 ms of the per-unit table ``name``'s freshness check (what each served query runs first)."""
    from dpch.rewrite.unit_table import fresh, recorded

    entry = db.catalog.get("bench.small")
    ut = next(u for u in recorded(db.backend, "bench.small") if u.name == name)
    times = []
    for i in range(calls + 5):
        t0 = time.perf_counter()
        assert fresh(db.backend, ut, entry)
        if i >= 5:
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def methods_latency(db, reps: int, methods: list[str]) -> None:
    """DP p50 − plain p50 with no per-unit structure, a per-unit projection and a per-unit table."""
    out = {}
    if "none" in methods:
        out["none"] = paired(db.raw_query, lambda sql: db.query(sql, epsilon=EPS), reps)
    for method in [m for m in ("projection", "table") if m in methods]:
        t0 = time.perf_counter()
        acc = db.accelerate("bench.small", ["region"], method=method)
        built = time.perf_counter() - t0
        if method == "table":  # the DP query must read it (else the row measures nothing new)
            src = db.query(QUERIES["SUM"][0], epsilon=EPS).attrs["dpch"]["per_unit_source"]
            assert src == acc.name, src
        print(f"{method}: {acc.name} built in {built:.1f} s")
        if method == "table":
            print(f"table: freshness check p50 {freshness_ms(db, acc.name):.2f} ms over 50 calls")
        out[method] = paired(db.raw_query, lambda sql: db.query(sql, epsilon=EPS), reps)
        db.drop_accelerations("bench.small")
    print(f"load now: {os.getloadavg()[0]:.1f}")
    print("\nper-unit structure, in process, p50 ms (plain measured in each configuration: a projection "
          "adds planning to the plain query too):")
    print("| query | " + " | ".join(f"plain ({m}) | DP ({m}) | DP − plain ({m})" for m in out) + " |")
    print("|---|" + "---:|" * (3 * len(out)))
    for name in QUERIES:
        cells = [f"{out[m][name][0]:.1f} | {out[m][name][1]:.1f} | {out[m][name][1] - out[m][name][0]:.1f}"
                 for m in out]
        print(f"| {name} | " + " | ".join(cells) + " |")


def gateway_latency(local_db, data_dir: Path, reps: int) -> dict[str, tuple[float, float]]:
    import httpx

    subprocess.run([sys.executable, "-m", "dpch.cli", "users", "add", "bench", "--password-stdin", "--data-dir",
                    str(data_dir)], input="bench-password\n", text=True, check=True, cwd=ROOT, capture_output=True)
    from bench_gateway_concurrency import start_gateway

    proc, url = start_gateway(data_dir)
    try:
        with httpx.Client(auth=("bench", "bench-password"), timeout=60) as c:
            return paired(local_db.raw_query,
                          lambda sql: c.post(url, params={"dpch_epsilon": str(EPS)}, content=sql).raise_for_status(),
                          reps)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--reps", type=int, default=60)
    ap.add_argument("--gateway", action="store_true")
    ap.add_argument("--cold", action="store_true", help="also the stage table with the plan cache emptied each time")
    ap.add_argument("--methods", nargs="?", const="none,projection,table",
                    help="only the latency with no per-unit structure, a projection and a per-unit table "
                         "(or those of this comma list)")
    args = ap.parse_args()
    dirs = [Path(tempfile.mkdtemp(prefix="dpch_bench_small_")) for _ in range(2 if args.gateway else 1)]
    for d in dirs:
        build(d, args.rows)
    db = dpch.connect(dirs[-1], analyst="bench")
    print(f"load: {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f} {os.getloadavg()[2]:.1f} (2 cores, shared)")
    print(f"{args.rows} rows, 100k users, 8 public regions, ε={EPS}, {args.reps} repetitions, medians (ms)\n")
    try:
        if args.methods:
            methods_latency(db, args.reps, args.methods.split(","))
            return 0
        for cold in ([False, True] if args.cold else [False]):
            rows = {name: stage_table(db, name, args.reps, cold) for name in QUERIES}
            print(f"stages ({'plan cache emptied each time' if cold else 'repeated query, caches warm'}):")
            names = list(next(iter(rows.values())))
            print(f"| stage | {' | '.join(QUERIES)} |\n|---|{'---:|' * len(QUERIES)}")
            for k in names:
                print(f"| {k} | " + " | ".join(f"{rows[q][k]:.2f}" for q in QUERIES) + " |")
            print()
        lat = paired(db.raw_query, lambda sql: db.query(sql, epsilon=EPS), args.reps)
        show("in process (db.query vs db.raw_query), ms:", lat)
        if args.gateway:
            show("\nthrough the gateway (DP over HTTP, TabSeparated) vs plain and floor in process, ms:",
                 gateway_latency(db, dirs[0], args.reps))
    finally:
        db.close()
    print(f"load after: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
