#!/usr/bin/env python3
"""A user-level DP query at 100 M rows and 10 M privacy units on one machine (issue 17).

    make bench-large     # = python3 bench/bench_large.py (data in a temporary store, deleted after)
    python3 bench/bench_large.py --rows 100000000 --base-rows 10000000 --reps 3 [--data-dir DIR --keep]

The query is the peer benchmark's (b) (bench/workloads.py): `SELECT region, COUNT(*), SUM(amount)
FROM t GROUP BY region` through the controller (`db.query`, ε = 1 per statistic, Laplace,
privacy unit `user_id`, ≤1 group and ≤10 rows per unit, 100 public regions, ledger charge
included). Both tables are generated inside ClickHouse (`numbers()` and `cityHash64` of the row
number: deterministic, no data leaves the engine) into MergeTree tables ordered by row number, so
a unit's ~10 rows are scattered over the whole table (random order with respect to the unit).

Measured, in one process and one run (chDB is in-process, so the process's memory is the
engine's): for the large table and the base table (default 10 M rows, 1 M units), the wall time of
`db.query` and of the plain `count()`/`sum()` GROUP BY region, repetitions interleaved, medians;
and the peak resident memory of each run, `VmHWM` after resetting it with
`/proc/self/clear_refs = 5` just before the query (systems/base.timed_call). Targets (issue 17):
the large query answers (100 released regions, finite values), its peak RSS is under 8 GiB, and
its time per row is within 1.5× of the base table's.
"""
from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
try:  # normally installed (`make` runs `pip install -e .` first); else use the checkout
    import dpch
except ImportError:
    sys.path.insert(1, str(BENCH.parent))
    import dpch

from run_all import log, machine_info, write_results  # noqa: E402
from systems.base import PEAK_METHOD, Timing, timed_call  # noqa: E402
from systems.dpch_controller import DpchController  # noqa: E402
from systems.plain import Plain  # noqa: E402
from workloads import QUERIES, REGIONS, Workload, ensure_table, size_label  # noqa: E402

QID = "b"  # user-level COUNT + SUM GROUP BY region
# --probe-settings: ClickHouse settings that bound a GROUP BY's memory, appended to the rewritten
# query's SETTINGS clause (the controller itself sets none of them)
PROBES = {"default": "", "max_threads = 1": "max_threads = 1",
          "max_bytes_before_external_group_by = 1 GB": "max_bytes_before_external_group_by = 1000000000",
          "max_bytes_before_external_group_by = 512 MiB": "max_bytes_before_external_group_by = 536870912"}
PEAK_LIMIT_GIB = 8.0
PER_ROW_LIMIT = 1.5


def check_answer(values: dict[str, list[float]]) -> str | None:
    """None when the release is complete (every public region has a finite count and sum), else
    what is wrong. Only shapes are checked: the values are noisy by design."""
    for stat in ("count", "sum"):
        vals = values.get(stat, [])
        if len(vals) != REGIONS:
            return f"{stat}: {len(vals)} values, expected {REGIONS}"
        if not all(math.isfinite(v) for v in vals):
            return f"{stat}: a region is missing or not finite"
    return None


def measure(db, sizes: list[int], reps: int, eps: float) -> dict:
    """Interleaved repetitions of the controller and the plain query on each size; one warm-up
    each (the first query of a table also loads its marks)."""
    systems = {}
    for rows in sizes:
        wl = Workload(rows)
        systems[rows] = {"dpch_controller": DpchController(db, wl, QUERIES), "plain": Plain(db, wl, QUERIES)}
    timings = {(rows, name): Timing() for rows in sizes for name in ("dpch_controller", "plain")}
    answers: dict[tuple[int, str], str | None] = {}
    for rows in sizes:
        for name, system in systems[rows].items():
            system.run(QID, eps)  # warm-up
    for r in range(reps):
        for rows in (sizes if r % 2 == 0 else sizes[::-1]):
            for name, system in systems[rows].items():
                out = timed_call(lambda: system.run(QID, eps), timings[(rows, name)])
                if name == "dpch_controller":
                    problem = check_answer(out)
                    answers[(rows, name)] = answers.get((rows, name)) or problem
                log(f"  rep {r + 1} {size_label(rows):>5} {name:16s} {timings[(rows, name)].times_s[-1]:7.2f} s  "
                    f"peak {timings[(rows, name)].peak_rss_mib[-1]:6.0f} MiB")
    out = {}
    for (rows, name), t in timings.items():
        rec = t.summary()
        rec["max_peak_rss_mib"] = max(t.peak_rss_mib)
        rec["ns_per_row"] = rec["median_s"] / rows * 1e9
        if name == "dpch_controller":
            rec["answer_problem"] = answers.get((rows, name))
        out[f"{rows}:{name}"] = rec
    return out


def probe_settings(db, rows: int, eps: float, reps: int) -> dict:
    """The same DP query's rewritten SQL (prepare: parse, bind, plan, rewrite; no ledger) run with
    each of PROBES added to its SETTINGS clause: wall time and peak RSS per run. Runs are
    sequential, so a peak can include memory the allocator kept from the run before."""
    from dpch.controller import prepare

    system = DpchController(db, Workload(rows), QUERIES)
    sql = prepare(db, system.sql(QID), epsilon=system.total_epsilon(QID, eps)).rewritten.sql
    assert "\nSETTINGS " in sql  # the rewriter ends every query with its SETTINGS clause
    out = {}
    for name, extra in PROBES.items():
        t = Timing()
        for _ in range(reps):
            timed_call(lambda: db.backend.query_df(sql + (f", {extra}" if extra else "")), t)
        out[name] = {"times_s": t.times_s, "peak_rss_mib": t.peak_rss_mib, "delta_rss_mib": t.delta_rss_mib}
        log(f"  probe {name}: {[round(x, 1) for x in t.times_s]} s, peak {[round(x) for x in t.peak_rss_mib]} MiB")
    return out


def verdicts(res: dict, large: int, base: int) -> dict:
    big = res[f"{large}:dpch_controller"]
    small = res[f"{base}:dpch_controller"]
    per_row = big["ns_per_row"] / small["ns_per_row"]
    peak_gib = big["max_peak_rss_mib"] / 1024
    return {"answers": big["answer_problem"] is None, "peak_gib": peak_gib,
            "peak_ok": peak_gib < PEAK_LIMIT_GIB, "per_row_ratio": per_row, "per_row_ok": per_row <= PER_ROW_LIMIT,
            "plain_per_row_ratio": res[f"{large}:plain"]["ns_per_row"] / res[f"{base}:plain"]["ns_per_row"]}


def markdown(data: dict) -> str:
    m, res, v = data["machine"], data["results"], data["verdicts"]
    large, base = data["rows"], data["base_rows"]
    lines = [f"Run {m['date']} on commit {m['commit']} ({m['cores']} cores, {m['mem_gib']} GiB; load average "
             f"{data['load_before'][0]:.2f} before, {data['load_after'][0]:.2f} after). Command: `{data['command']}`. "
             f"Data generated in {data['generate_s']:.0f} s; peak memory: {PEAK_METHOD}.", "",
             "| table | system | median | min–max | runs | ns / row | peak RSS (max) | Δ RSS |",
             "|---|---|---|---|---|---|---|---|"]
    for rows in (base, large):
        for name in ("plain", "dpch_controller"):
            r = res[f"{rows}:{name}"]
            lines.append(f"| {size_label(rows)} rows, {rows // 10:,} units | {name} | {r['median_s']:.2f} s | "
                         f"{r['min_s']:.2f}–{r['max_s']:.2f} s | {r['runs']} | {r['ns_per_row']:.1f} | "
                         f"{r['max_peak_rss_mib']:.0f} MiB | {r['delta_rss_mib']:.0f} MiB |")
    lines += ["", "| target | verdict | measured |", "|---|---|---|",
              f"| answers at {size_label(large)} rows | **{'met' if v['answers'] else 'MISSED'}** | "
              f"{'100 regions, finite' if v['answers'] else res[f'{large}:dpch_controller']['answer_problem']} |",
              f"| peak resident memory < {PEAK_LIMIT_GIB:g} GiB | **{'met' if v['peak_ok'] else 'MISSED'}** | "
              f"{v['peak_gib']:.2f} GiB |",
              f"| time per row {size_label(large)} / {size_label(base)} ≤ {PER_ROW_LIMIT} | "
              f"**{'met' if v['per_row_ok'] else 'MISSED'}** | {v['per_row_ratio']:.2f} (plain: "
              f"{v['plain_per_row_ratio']:.2f}) |"]
    if data.get("probes"):
        lines += ["", f"Memory settings on the {size_label(large)}-row query (`--probe-settings`, the rewritten SQL "
                  "with one setting added, runs in sequence):", "",
                  "| setting | times | peak RSS |", "|---|---|---|"]
        for name, p in data["probes"].items():
            lines.append(f"| {name} | {', '.join(f'{x:.1f} s' for x in p['times_s'])} | "
                         f"{', '.join(f'{x:.0f} MiB' for x in p['peak_rss_mib'])} |")
    return "\n".join(lines) + "\n"


def put_between_markers(path: Path, md: str) -> None:
    """Replace the text between `<!-- bench-large:begin -->` and `<!-- bench-large:end -->`."""
    text = path.read_text()
    begin, end = "<!-- bench-large:begin -->\n", "<!-- bench-large:end -->"
    i, j = text.find(begin), text.find(end)
    if i < 0 or j < i:
        raise SystemExit(f"--results-md: {path} has no bench-large markers")
    path.write_text(text[:i + len(begin)] + md + text[j:])
    log(f"updated {path}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=100_000_000)
    ap.add_argument("--base-rows", type=int, default=10_000_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--eps", type=float, default=1.0, help="ε per released statistic")
    ap.add_argument("--data-dir", type=Path, default=None,
                    help="the embedded store's directory (default: a new temporary directory)")
    ap.add_argument("--keep", action="store_true", help="keep the store (and reuse its tables next time)")
    ap.add_argument("--out", type=Path, default=BENCH / "out" / "large.json")
    ap.add_argument("--markdown", type=Path, default=BENCH / "out" / "large.md")
    ap.add_argument("--probe-settings", action="store_true",
                    help="then run the large query's rewritten SQL under memory-bounding settings (PROBES)")
    ap.add_argument("--results-md", type=Path, default=None,
                    help="also put the tables between the bench-large markers of this file (bench/RESULTS.md)")
    args = ap.parse_args(argv)
    if args.rows <= args.base_rows:
        ap.error("--rows must be larger than --base-rows")
    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="dpch_large_"))
    t_start = time.perf_counter()
    load_before = os.getloadavg()
    db = dpch.connect(data_dir / "engine", analyst="bench")
    try:
        t0 = time.perf_counter()
        for rows in (args.base_rows, args.rows):
            ensure_table(db, Workload(rows), log=log)
        generate_s = time.perf_counter() - t0
        log(f"tables ready in {generate_s:.0f} s; measuring ({args.reps} interleaved repetitions)")
        res = measure(db, [args.base_rows, args.rows], args.reps, args.eps)
        probes = probe_settings(db, args.rows, args.eps, 2) if args.probe_settings else None
    finally:
        db.close()
        if not args.keep:
            shutil.rmtree(data_dir, ignore_errors=True)
    data = {"machine": machine_info(), "rows": args.rows, "base_rows": args.base_rows, "reps": args.reps,
            "eps": args.eps, "generate_s": generate_s, "load_before": load_before, "load_after": os.getloadavg(),
            "command": "python3 bench/bench_large.py " + " ".join(sys.argv[1:] if argv is None else argv),
            "results": res, "probes": probes, "seconds": time.perf_counter() - t_start}
    data["verdicts"] = verdicts(res, args.rows, args.base_rows)
    md = markdown(data)
    write_results(data, args.out, args.markdown, md)
    if args.results_md:
        put_between_markers(args.results_md, md)
    v = data["verdicts"]
    return 0 if v["answers"] and v["peak_ok"] and v["per_row_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
