"""User-level bounding vs the per-unit floor (issue 17; results: bench/RESULTS.md, section
"User-level bounding vs the per-unit floor (issue 17)"; analysis: docs/PERFORMANCE.md).

Data: ``--rows`` rows, ``--units`` privacy units (10 rows each by default), inserted in random row
order (sorted by a hash of the row number; the table has no sorting key, so nothing is in unit
order). Keys: ``g``/``gs`` (LowCardinality(String) / String), each unit's rows over 2 of 100 groups;
``g8``/``gs8``, each unit's rows over 8 of 100 groups (so k = 5 really drops groups). 100 public keys.

Per (k, key) configuration, interleaved repetitions in one run (medians, plus the ratio of minima):
- ``plain``: ``SELECT key, count(), sum(amount) … GROUP BY key``;
- ``floor``: the plain per-unit pre-aggregation with the same GROUP BY and no DP. For k = 1 a unit
  has one group: ``GROUP BY unit`` (``any(key)``, ``count()``, ``sum(amount)``), then ``GROUP BY key``;
  for k > 1 a unit has several: ``GROUP BY unit, key``, then ``GROUP BY key``;
- ``dp``: ``db.query`` of ``SELECT key, COUNT(*), SUM(amount) … GROUP BY key`` at ε = 1 with
  ``max_groups_contributed = k``, end to end (controller, ledger charge, ClickHouse, noise UDF,
  post-processing);
- ``dp_sql``: the same query's rewritten SQL through the engine only (no controller or ledger).

Each run records wall time and the process's CPU time (user + system over all threads, getrusage:
the embedded engine runs in this process; the noise UDF's own process is not counted, ~100 values).
On a shared machine the CPU-time ratio is the steadier one: other processes' load stretches wall
times, not the CPU a query spends.

- with ``--baseline-rev REV``, ``dp_sql_base``: the same plan rewritten by the rewriter (dpch/rewrite/) as of git
  revision REV (before/after in one run; e.g. ``--baseline-rev 87b875f``, before issue 17's change).

    python3 bench/bench_floor.py [--rows 10000000] [--units 1000000] [--reps 9] [--json FILE]
                                 [--baseline-rev REV]
"""
from __future__ import annotations

import argparse
import json
import os
import importlib.util
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dpch  # noqa: E402
from dpch.controller import prepare  # noqa: E402

TABLE = "bench.floor_events"
CONFIGS = [(1, "g"), (1, "gs"), (5, "g8"), (5, "gs8")]


def build_data(db, rows: int, units: int) -> None:
    per = max(1, rows // units)
    groups = [f"g{i:02d}" for i in range(100)]
    db.command("CREATE DATABASE IF NOT EXISTS bench")
    db.command(f"DROP TABLE IF EXISTS {TABLE}")
    db.command(f"CREATE TABLE {TABLE} (user_id UInt64, g LowCardinality(String), gs String, "
               "g8 LowCardinality(String), gs8 String, amount Float64) ENGINE = MergeTree ORDER BY tuple()")
    unit = f"intDiv(number, {per})"
    key = "concat('g', leftPad(toString((cityHash64({u}) + number % {n}) % 100), 2, '0'))"
    db.command(f"INSERT INTO {TABLE} SELECT user_id, g, g, g8, g8, amount FROM ("
               f"SELECT {unit} AS user_id, {key.format(u=unit, n=2)} AS g, {key.format(u=unit, n=8)} AS g8, "
               f"toFloat64(number % 1000) / 2 AS amount FROM numbers({rows}) ORDER BY cityHash64(number, 7))")
    db.command(f"OPTIMIZE TABLE {TABLE} FINAL")
    db.catalog.register(TABLE, privacy_unit="user_id", bounds={"amount": (0, 500)}, max_groups_contributed=1,
                        max_rows_per_unit=per, public_keys={k: groups for k in ("g", "gs", "g8", "gs8")})
    db.ledger.set_budget(db.analyst, TABLE, epsilon=1e12, delta=0.5)


def baseline_rewriter(rev: str):
    """The rewriter as of git revision ``rev`` (dpch/rewrite.py, or the dpch/rewrite/ package after
    the split), importable next to today's package as ``rewrite_base``."""
    repo = Path(__file__).resolve().parents[1]

    def show(path: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "show", f"{rev}:{path}"], cwd=repo, capture_output=True, text=True)

    root = Path(tempfile.mkdtemp(prefix="dpch_rewrite_base_"))
    single = show("dpch/rewrite.py")
    if single.returncode == 0:
        path = root / "rewrite_base.py"
        path.write_text(re.sub(r"^from \.", "from dpch.", single.stdout, flags=re.M))
        spec = importlib.util.spec_from_file_location("rewrite_base", path)
    else:
        names = subprocess.run(["git", "ls-tree", "--name-only", f"{rev}:dpch/rewrite"], cwd=repo, check=True,
                               capture_output=True, text=True).stdout.split()
        pkg = root / "rewrite_base"
        pkg.mkdir()
        for name in names:  # parent-relative imports point at today's dpch; sibling imports stay
            text = show(f"dpch/rewrite/{name}").stdout
            (pkg / name).write_text(re.sub(r"^from \.\.", "from dpch.", text, flags=re.M))
        spec = importlib.util.spec_from_file_location("rewrite_base", pkg / "__init__.py",
                                                      submodule_search_locations=[str(pkg)])
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["rewrite_base"] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def queries(db, k: int, key: str, base=None) -> dict:
    """The SQL (or callables) of one configuration, all answering per group of ``key``."""
    if k == 1:
        floor = (f"SELECT k, sum(n), sum(s) FROM (SELECT user_id, any({key}) AS k, count() AS n, "
                 f"sum(amount) AS s FROM {TABLE} GROUP BY user_id) GROUP BY k")
    else:
        floor = (f"SELECT {key}, sum(n), sum(s) FROM (SELECT user_id, {key}, count() AS n, sum(amount) AS s "
                 f"FROM {TABLE} GROUP BY user_id, {key}) GROUP BY {key}")
    dp = f"SELECT {key}, COUNT(*) AS n, SUM(amount) AS s FROM {TABLE} GROUP BY {key}"
    prepared = prepare(db, dp, epsilon=1.0, max_groups_contributed=k)
    rewritten = prepared.rewritten.sql
    extra = {}
    if base is not None:
        base_sql = base.rewrite(prepared.plan).sql
        extra["dp_sql_base"] = lambda: db.backend.query_df(base_sql)
    return extra | {
        "plain": lambda: db.raw_query(f"SELECT {key}, count(), sum(amount) FROM {TABLE} GROUP BY {key}"),
        "floor": lambda: db.raw_query(floor),
        "dp": lambda: db.query(dp, epsilon=1.0, max_groups_contributed=k),
        "dp_sql": lambda: db.backend.query_df(rewritten),
    }


def measure(db, k: int, key: str, reps: int, base=None) -> dict:
    runs = queries(db, k, key, base)
    for f in runs.values():  # warm-up: page cache, UDF pool
        f()
    times: dict[str, list[float]] = {n: [] for n in runs}
    cpu: dict[str, list[float]] = {n: [] for n in runs}
    names = list(runs)
    for r in range(reps):
        for n in names[r % len(names):] + names[:r % len(names)]:  # rotate the order every run
            c0, t0 = _cpu(), time.perf_counter()
            runs[n]()
            times[n].append(time.perf_counter() - t0)
            cpu[n].append(_cpu() - c0)
    med = {n: statistics.median(t) for n, t in times.items()}
    mins = {n: min(t) for n, t in times.items()}
    cmed = {n: statistics.median(t) for n, t in cpu.items()}
    return {"median_s": med, "min_s": mins, "times_s": times, "cpu_median_s": cmed, "cpu_s": cpu,
            "cpu_dp_over_floor": cmed["dp"] / cmed["floor"], "cpu_dp_over_plain": cmed["dp"] / cmed["plain"],
            "dp_over_floor": med["dp"] / med["floor"], "dp_over_floor_of_mins": mins["dp"] / mins["floor"],
            "dp_sql_over_floor": med["dp_sql"] / med["floor"], "floor_over_plain": med["floor"] / med["plain"],
            "dp_over_plain": med["dp"] / med["plain"]} | (
        {"base_sql_over_floor": med["dp_sql_base"] / med["floor"],
         "cpu_base_sql_over_floor": cmed["dp_sql_base"] / cmed["floor"],
         "cpu_dp_sql_over_floor": cmed["dp_sql"] / cmed["floor"]} if "dp_sql_base" in runs else {})


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def markdown(res: dict) -> str:
    lines = ["| k | key | plain (s) | floor (s) | DP end to end (s) | DP SQL only (s) | floor / plain | "
             "**DP / floor** | DP / floor (minima) | DP / plain | CPU s: floor / DP | **CPU DP / floor** |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in res["configs"].items():
        k, key = name.split(":")
        m = r["median_s"]
        lines.append(f"| {k} | `{key}` | {m['plain']:.3f} | {m['floor']:.3f} | {m['dp']:.3f} | {m['dp_sql']:.3f} | "
                     f"{r['floor_over_plain']:.2f} | **{r['dp_over_floor']:.2f}** | {r['dp_over_floor_of_mins']:.2f} | "
                     f"{r['dp_over_plain']:.2f} | {r['cpu_median_s']['floor']:.2f} / {r['cpu_median_s']['dp']:.2f} | "
                     f"**{r['cpu_dp_over_floor']:.2f}** |")
    if any("base_sql_over_floor" in r for r in res["configs"].values()):
        lines += ["", f"Rewritten SQL / floor, baseline {res['baseline_rev']} → this checkout:", "",
                  "| k | key | wall | CPU |", "|---|---|---:|---:|"]
        for name, r in res["configs"].items():
            k, key = name.split(":")
            lines.append(f"| {k} | `{key}` | {r['base_sql_over_floor']:.2f} → **{r['dp_sql_over_floor']:.2f}** | "
                         f"{r['cpu_base_sql_over_floor']:.2f} → **{r['cpu_dp_sql_over_floor']:.2f}** |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--units", type=int, default=1_000_000)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--baseline-rev", default=None, help="also run the SQL of the rewriter (dpch/rewrite/) at this git revision")
    args = ap.parse_args(argv)
    data_dir = args.data_dir or tempfile.mkdtemp(prefix="dpch_bench_floor_")
    base = baseline_rewriter(args.baseline_rev) if args.baseline_rev else None
    db = dpch.connect(data_dir, analyst="bench")
    try:
        t0 = time.perf_counter()
        build_data(db, args.rows, args.units)
        res = {"rows": args.rows, "units": args.units, "reps": args.reps, "cpus": os.cpu_count(),
               "build_s": time.perf_counter() - t0, "baseline_rev": args.baseline_rev, "configs": {}}
        for k, key in CONFIGS:
            res["configs"][f"{k}:{key}"] = measure(db, k, key, args.reps, base)
    finally:
        db.close()
    print(markdown(res))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
