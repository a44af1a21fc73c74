#!/usr/bin/env python3
"""Benchmark of `dpch audit` (dpch.audit): power, false alarms, broken fixtures and speed.

    python3 bench/bench_audit.py                    # everything, 20 000 samples per side
    python3 bench/bench_audit.py --samples 5000 --power-reps 2 --skip-grid    # quick look

Runs in its own embedded store (bench/data/audit, database `bench_audit`; one store per process)
and writes bench/out/audit.json, the audit report of the first power run in
bench/out/audit_report/ (JSON, text, histograms, ε_LB vs samples; the two plots are copied to
bench/plots/audit_*.png) and the `## Audit` section of bench/RESULTS.md.

Measured, at confidence 0.95 (the CLI default) and `--samples` per side:
1. power: ε_LB of dp_count(1.0) under remove-row, repeated `--power-reps` times (target ≥ 0.9);
2. no false alarms: every shipped SQL function and three controller queries at ε ∈ {0.5, 1, 2}
   (ε_LB ≤ ε expected; at confidence 0.95 a correct mechanism is flagged with probability ≤ 5%
   per audit, so the table also shows how far below ε each bound is);
3. the deliberately broken fixtures of tests/fixtures_broken.py (expected: VIOLATION);
4. wall time of each audit (worst-case search, sampling, analysis), target < 60 s;
5. quantiles: dp_median, dp_quantile(x, 0.9, …) and dp_quantiles(x, [0.25, 0.5], …) at
   ε ∈ {0.5, 1, 2} on the neighbouring datasets of dpch/audit/designs.py (ε_LB against ε and
   against the exact privacy loss of the design's event), dp_median on the synthetic purchases
   (the neighbour searched), and the broken quantiles (temperature halved, raw argmax).

    python3 bench/bench_audit.py --quantiles-only                   # only 5., merged into
    python3 bench/bench_audit.py --quantiles-only --quantile-eps 1  # bench/out/audit.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])  # UDF children

import math  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

import dpch  # noqa: E402
from dpch.audit import audit, quantile_design  # noqa: E402

SECTION = "## Audit"
DB = "bench_audit"
SRC = f"{DB}.purchases"
DELTA = 1e-6


def log(msg: str) -> None:
    print(f"[bench_audit {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def make_data(db, rows: int, users: int) -> None:
    db.command(f"CREATE DATABASE IF NOT EXISTS {DB}")
    db.command(f"DROP TABLE IF EXISTS {SRC}")
    db.command(f"CREATE TABLE {SRC} (user_id UInt64, region String, amount Float64) "
               "ENGINE = MergeTree ORDER BY user_id")
    db.command(f"INSERT INTO {SRC} SELECT cityHash64(number, 'u') % {users}, "
               "['north', 'south', 'east'][cityHash64(number, 'r') % 3 + 1], "
               "round(5 + 480 * pow((cityHash64(number, 'a') % 1000000) / 1e6, 3), 2) FROM numbers(" f"{rows})")
    db.catalog.register(SRC, privacy_unit="user_id", bounds={"amount": (0, 500)},
                        max_groups_contributed=1, max_rows_per_unit=5,
                        public_keys={"region": ["north", "south", "east"]})


def row(r, label: str, **extra) -> dict:
    return {"label": label, "query": r.target, "mode": r.mode, "epsilon": r.epsilon, "delta": r.delta,
            "neighbour": f"{r.neighbour_kind}: {r.neighbour}", "samples": r.samples,
            "epsilon_lb": r.epsilon_lb, "verdict": r.verdict,
            "by_method": {c.method: c.epsilon_lb for c in r.analysis.certificates},
            "mi_accuracy": r.analysis.membership.accuracy if r.analysis.membership else None,
            "mi_bound": r.analysis.membership.bound if r.analysis.membership else None,
            "seconds": sum(r.timings.values()), "timings": r.timings, **extra}


def run(args) -> dict:
    out: dict = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                             "platform": platform.platform()},
                 "samples": args.samples, "confidence": args.confidence}
    data_dir = BENCH / "data" / "audit"
    with dpch.connect(data_dir, analyst="bench") as db:
        make_data(db, args.rows, args.users)
        common = dict(samples=args.samples, confidence=args.confidence, database=DB)

        # 1. power
        power = []
        for i in range(args.power_reps):
            t = time.perf_counter()
            r = audit(db, f"SELECT dp_count(1.0) AS n FROM {SRC}", epsilon=1.0, neighbour="remove-row",
                      report_dir=(BENCH / "out" / "audit_report") if i == 0 else None, **common)
            power.append(row(r, "dp_count (power)", wall=time.perf_counter() - t))
            log(f"power rep {i}: ε_LB {r.epsilon_lb:.3f} in {power[-1]['wall']:.1f} s")
        out["power"] = power

        # 2. no false alarms
        grid = []
        if not args.skip_grid:
            sqlfns = [
                ("dp_count", "SELECT dp_count({e}) AS v FROM {t}", "remove-row", 0.0),
                ("dp_sum", "SELECT dp_sum(amount, 0, 500, {e}) AS v FROM {t}", "add-row", 0.0),
                ("dp_avg", "SELECT dp_avg(amount, 0, 500, {e}) AS v FROM {t}", "add-row", 0.0),
                ("dp_count_gaussian", "SELECT dp_count_gaussian({e}, {d}) AS v FROM {t}", "remove-row", DELTA),
                ("dp_sum_gaussian", "SELECT dp_sum_gaussian(amount, 0, 500, {e}, {d}) AS v FROM {t}", "add-row", DELTA),
                ("dp_avg_gaussian", "SELECT dp_avg_gaussian(amount, 0, 500, {e}, {d}) AS v FROM {t}", "add-row", DELTA),
            ]
            for eps in (0.5, 1.0, 2.0):
                for label, tmpl, nb, delta in sqlfns:
                    t = time.perf_counter()
                    r = audit(db, tmpl.format(e=eps, d=delta, t=SRC), epsilon=eps, delta=delta,
                              neighbour=nb, **common)
                    grid.append(row(r, label, wall=time.perf_counter() - t))
                    log(f"{label} ε={eps}: ε_LB {r.epsilon_lb:.3f} {r.verdict} ({grid[-1]['wall']:.1f} s)")
                for label, sql in (
                        ("controller count", f"SELECT count(*) AS n FROM {SRC}"),
                        ("controller grouped count+sum", f"SELECT region, count(*) AS n, sum(amount) AS s "
                                                         f"FROM {SRC} GROUP BY region"),
                        ("controller avg", f"SELECT avg(amount) AS a FROM {SRC}")):
                    t = time.perf_counter()
                    r = audit(db, sql, epsilon=eps, via="controller", **common)
                    grid.append(row(r, label, wall=time.perf_counter() - t))
                    log(f"{label} ε={eps}: ε_LB {r.epsilon_lb:.3f} {r.verdict} ({grid[-1]['wall']:.1f} s)")
        out["grid"] = grid

        # 3. broken fixtures
        import fixtures_broken as fx

        broken = []
        for label, sql, eps, nb in (
                ("SQL: scale ε instead of 1/ε", fx.SQL_SCALE_IS_EPSILON, 0.5, "remove-row"),
                ("SQL: half the sensitivity", fx.SQL_HALF_SENSITIVITY, 1.0, "add-row"),
                ("SQL: clipping skipped below", fx.SQL_ONE_SIDED_CLIP, 1.0, "add-row")):
            t = time.perf_counter()
            r = audit(db, sql.format(eps=eps, table=SRC), epsilon=eps, neighbour=nb, **common)
            broken.append(row(r, label, wall=time.perf_counter() - t))
            log(f"{label}: ε_LB {r.epsilon_lb:.3f} {r.verdict}")
    data = pd.DataFrame({"x": np.round(np.random.default_rng(0).uniform(0, 100, 500), 2)})
    zeros = pd.DataFrame({"x": np.zeros(50)})
    for label, mech, d, eps, nb in (
            ("Python: scale ε instead of 1/ε", fx.broken_scale_is_epsilon(0.5), data, 0.5, "remove-row"),
            ("Python: half the sensitivity", fx.broken_half_sensitivity(1.0), data, 1.0, "add-row"),
            ("Python: clipping skipped below", fx.broken_one_sided_clip(1.0), data, 1.0, "add-row"),
            ("Python: naive float Laplace, scale 2^-20 (Mironov)", fx.broken_naive_float_sum(1.0), zeros, 1.0,
             "add-row")):
        t = time.perf_counter()
        r = audit(mech, data=d, epsilon=eps, neighbour=nb, samples=args.samples, confidence=args.confidence)
        broken.append(row(r, label, wall=time.perf_counter() - t))
        log(f"{label}: ε_LB {r.epsilon_lb:.3f} {r.verdict}")
    out["broken"] = broken
    return out


QUANTILE_FUNCTIONS = (
    ("dp_median", 0.5, "SELECT dp_median(x, 0, 100, {e}) AS m FROM {t}"),
    ("dp_quantile q=0.9", 0.9, "SELECT dp_quantile(x, 0.9, 0, 100, {e}) AS q FROM {t}"),
    ("dp_quantiles [0.25, 0.5]", [0.25, 0.5], "SELECT dp_quantiles(x, [0.25, 0.5], 0, 100, {e}) AS q FROM {t}"),
)


def run_quantiles(args) -> dict:
    """5. Quantile audits on the designs of dpch.audit.designs (the design's row removed)."""
    import fixtures_broken as fx

    rows, broken = [], []
    table = f"{DB}.quantile_design"
    common = dict(samples=args.samples, confidence=args.confidence, database=DB)
    with dpch.connect(BENCH / "data" / "audit", analyst="bench") as db:
        db.command(f"CREATE DATABASE IF NOT EXISTS {DB}")
        for eps in args.quantile_eps:
            for label, levels, tmpl in QUANTILE_FUNCTIONS:
                d = quantile_design(levels, 0, 100, eps)
                d.create_table(db, table)
                p, p_prime = d.event_probabilities()
                t = time.perf_counter()
                r = audit(db, tmpl.format(e=eps, t=table), epsilon=eps, where=d.where(), pilot=0, **common)
                rows.append(row(r, label, wall=time.perf_counter() - t, design_loss=math.log(p / p_prime),
                                p_d=p, p_dprime=p_prime, design=d.describe()))
                log(f"{label} ε={eps}: ε_LB {r.epsilon_lb:.3f} (design event {math.log(p / p_prime):.3f}) "
                    f"{r.verdict} ({rows[-1]['wall']:.1f} s)")
        if "1.0" in {f"{e:.1f}" for e in args.quantile_eps}:
            make_data(db, args.rows, args.users)
            t = time.perf_counter()
            r = audit(db, f"SELECT dp_median(amount, 0, 500, 1.0) AS m FROM {SRC}", epsilon=1.0,
                      neighbour="remove-row", **common)
            rows.append(row(r, "dp_median on purchases (searched)", wall=time.perf_counter() - t))
            log(f"dp_median on purchases: ε_LB {r.epsilon_lb:.3f} {r.verdict} ({rows[-1]['wall']:.1f} s)")
            d = quantile_design(0.5, 0, 100, 1.0)
            d.create_table(db, table)
            t = time.perf_counter()
            r = audit(db, fx.SQL_QUANTILE_HALF_TEMPERATURE.format(lo=0, hi=100, q=0.5, eps=1.0, table=table),
                      epsilon=1.0, where=d.where(), pilot=0, **common)
            broken.append(row(r, "SQL: dp_median with the temperature halved (2ε)", wall=time.perf_counter() - t))
            log(f"{broken[-1]['label']}: ε_LB {r.epsilon_lb:.3f} {r.verdict}")
    d = quantile_design(0.5, 0, 100, 1.0)
    frame = d.frame()
    t = time.perf_counter()
    r = audit(fx.broken_quantile_argmax(0.5, 0, 100, 1.0), data=frame, epsilon=1.0,
              where=np.asarray(frame["x"] == d.removed_value), pilot=0, samples=args.samples,
              confidence=args.confidence)
    broken.append(row(r, "Python: quantile by the raw argmax (no noise)", wall=time.perf_counter() - t))
    log(f"{broken[-1]['label']}: ε_LB {r.epsilon_lb:.3f} {r.verdict}")
    return {"quantiles": rows, "quantiles_broken": broken, "quantile_samples": args.samples}


def merge_quantiles(data: dict, new: dict) -> dict:
    """Replace the rows of `data` that `new` measured again (same label and ε), keep the others."""
    for key in ("quantiles", "quantiles_broken"):
        fresh = {(r["label"], r["epsilon"]) for r in new.get(key, [])}
        data[key] = [r for r in data.get(key, []) if (r["label"], r["epsilon"]) not in fresh] + new.get(key, [])
    data["quantile_samples"] = new.get("quantile_samples", data.get("quantile_samples"))
    return data


def render(data: dict) -> str:
    n, conf = data["samples"], data["confidence"]
    lines = [SECTION, "",
             f"`python3 bench/bench_audit.py` — {n:,} samples per side, confidence {conf}, "
             f"{data['machine']['cpus']} CPUs ({data['machine']['platform']}). Data: {SRC}, synthetic "
             "(see the script). ε_LB is the certified empirical lower bound (max over the three methods, "
             "Bonferroni over them); the verdict is VIOLATION iff ε_LB > claimed ε.", ""]
    power = data.get("power", [])
    if power:
        lbs = [p["epsilon_lb"] for p in power]
        walls = [p["wall"] for p in power]
        lines += ["### Power: Laplace count (dp_count, ε = 1, remove-row)", "",
                  f"ε_LB over {len(lbs)} independent audits: mean {statistics.mean(lbs):.3f}, "
                  f"min {min(lbs):.3f}, max {max(lbs):.3f} (target ≥ 0.9). Per method (first run): "
                  + ", ".join(f"{k} {v:.3f}" for k, v in power[0]["by_method"].items())
                  + f". Membership-inference accuracy {power[0]['mi_accuracy']:.4f} vs bound "
                    f"{power[0]['mi_bound']:.4f}. Wall time per audit: median {statistics.median(walls):.1f} s.",
                  "", "First run: ![outputs on D and D′](plots/audit_histograms.png) "
                  "![ε_LB against held-out samples](plots/audit_epsilon_vs_samples.png) "
                  "(full report: `bench/out/audit_report/`).", ""]
    grid = data.get("grid", [])
    if grid:
        lines += ["### No false alarms: shipped mechanisms at ε ∈ {0.5, 1, 2}", "",
                  "| mechanism | neighbours | ε=0.5: ε_LB | ε=1: ε_LB | ε=2: ε_LB | verdicts | time (s) |",
                  "|---|---|---|---|---|---|---|"]
        labels = list(dict.fromkeys(g["label"] for g in grid))
        for label in labels:
            rows = {g["epsilon"]: g for g in grid if g["label"] == label}
            cells = []
            for e in sorted(rows):
                g = rows[e]
                cells.append(f"{g['epsilon_lb']:.3f}" + (f" (claim ε={g['epsilon']:.3g})" if label.startswith("controller") and abs(g["epsilon"] - e) > 1e-9 else ""))
            verdicts = ", ".join(sorted({g["verdict"] for g in rows.values()}))
            times = "/".join(f"{g['wall']:.0f}" for g in rows.values())
            nb = next(iter(rows.values()))["neighbour"].split(":")[0]
            lines.append(f"| {label} | {nb} | " + " | ".join(cells) + f" | {verdicts} | {times} |")
        lines += ["", "Reading: the Laplace releases (dp_count, dp_sum, controller count) come within ~0.1 of "
                  "their ε, i.e. the auditor is tight on them and they are not over-noised. Lower bounds "
                  "well below ε are expected where the release loses information or the worst case is "
                  "not in the data: dp_avg (a ratio of two ε/2 releases, post-processed and clamped), "
                  "the Gaussian functions (ε is attained only on tail events of probability ~δ = 1e-6, "
                  "out of reach of 10 000 held-out samples), and the controller's user-level queries "
                  "(ε is split across quantities and no unit of the synthetic data contributes the "
                  "maximum to every quantity at once).", ""]
    broken = data.get("broken", [])
    if broken:
        lines += ["### Broken fixtures (tests/fixtures_broken.py)", "",
                  "| fixture | claimed ε | neighbour chosen | ε_LB | verdict | time (s) |", "|---|---|---|---|---|---|"]
        for b in broken:
            lines.append(f"| {b['label']} | {b['epsilon']:g} | {b['neighbour']} | {b['epsilon_lb']:.3f} | "
                         f"{b['verdict']} | {b['wall']:.1f} |")
        lines += ["", "ε_LB of a mechanism with no overlap between D and D′ outputs is capped by the sample "
                  "size: ln(n_B / ln(2m/α)) ≈ 7.6 with 10 000 held-out samples per side.", ""]
    quant = data.get("quantiles", [])
    if quant:
        qn = data.get("quantile_samples", n)
        lines += ["### Quantiles (dp_median, dp_quantile, dp_quantiles)", "",
                  f"`python3 bench/bench_audit.py --quantiles-only` — {qn:,} samples per side, confidence "
                  f"{conf}, remove-row. D and D′: `dpch.audit.quantile_design` (docs/AUDIT.md, \"Quantiles\"); "
                  "'design' is the exact privacy loss ln(P_D(Y)/P_D′(Y)) of its event, the most the audit "
                  "can certify with that event.", "",
                  "| function | ε | design | ε_LB | by method (search / logistic / boosting) | verdict | time (s) |",
                  "|---|---|---|---|---|---|---|"]
        for q in sorted(quant, key=lambda r: (r["label"], r["epsilon"])):
            design = f"{q['design_loss']:.3f}" if "design_loss" in q else "—"
            methods = " / ".join(f"{v:.3f}" for v in q["by_method"].values())
            lines.append(f"| {q['label']} | {q['epsilon']:g} | {design} | {q['epsilon_lb']:.3f} | {methods} | "
                         f"{q['verdict']} | {q['wall']:.0f} |")
        lines.append("")
        qb = data.get("quantiles_broken", [])
        if qb:
            lines += ["| broken quantile (tests/fixtures_broken.py) | claimed ε | ε_LB | verdict | time (s) |",
                      "|---|---|---|---|---|"]
            for b in qb:
                lines.append(f"| {b['label']} | {b['epsilon']:g} | {b['epsilon_lb']:.3f} | {b['verdict']} | "
                             f"{b['wall']:.1f} |")
            lines.append("")
    all_runs = power + grid + broken
    if all_runs:
        worst = max(all_runs, key=lambda r: r["wall"])
        lines += ["### Speed", "",
                  f"Slowest audit: {worst['wall']:.1f} s ({worst['label']}, ε={worst['epsilon']:g}; "
                  + ", ".join(f"{k} {v:.1f} s" for k, v in worst["timings"].items())
                  + f"). Target: < 60 s per audit of one query with {n:,} samples per side.", ""]
    return "\n".join(lines)


def copy_plots() -> None:
    import shutil

    src, dst = BENCH / "out" / "audit_report", BENCH / "plots"
    dst.mkdir(parents=True, exist_ok=True)
    for name in ("histograms.png", "epsilon_vs_samples.png"):
        if (src / name).exists():
            shutil.copyfile(src / name, dst / f"audit_{name}")


def write_section(body: str, md_path: Path) -> None:
    text = md_path.read_text() if md_path.exists() else "# DPCH benchmark results\n\n"
    start = text.find(SECTION + "\n")
    if start < 0:
        new = text.rstrip() + "\n\n" + body + "\n"
    else:
        nxt = text.find("\n## ", start + len(SECTION))
        new = text[:start] + body + ("\n" + text[nxt + 1:] if nxt >= 0 else "\n")
    md_path.write_text(new)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=20_000)
    ap.add_argument("--confidence", type=float, default=0.95)
    ap.add_argument("--power-reps", type=int, default=5)
    ap.add_argument("--rows", type=int, default=1000)
    ap.add_argument("--users", type=int, default=300)
    ap.add_argument("--skip-grid", action="store_true", help="skip the no-false-alarm grid")
    ap.add_argument("--report-only", action="store_true", help="re-render RESULTS.md from bench/out/audit.json")
    ap.add_argument("--quantiles-only", action="store_true",
                    help="run only the quantile audits (5.) and merge them into bench/out/audit.json")
    ap.add_argument("--quantile-eps", type=lambda v: [float(x) for x in v.split(",")], default=[0.5, 1.0, 2.0],
                    help="comma-separated ε of the quantile audits (default 0.5,1,2)")
    ap.add_argument("--results-md", type=Path, default=BENCH / "RESULTS.md")
    args = ap.parse_args()
    out_json = BENCH / "out" / "audit.json"
    if args.report_only:
        data = json.loads(out_json.read_text())
    elif args.quantiles_only:
        old = json.loads(out_json.read_text()) if out_json.exists() else {
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                        "platform": platform.platform()},
            "samples": args.samples, "confidence": args.confidence}
        data = merge_quantiles(old, run_quantiles(args))
        out_json.parent.mkdir(parents=True, exist_ok=True)
        out_json.write_text(json.dumps(data, indent=2, default=float))
    else:
        data = run(args)
        data.update(run_quantiles(args))
        out_json.parent.mkdir(parents=True, exist_ok=True)
        out_json.write_text(json.dumps(data, indent=2, default=float))
        copy_plots()
    write_section(render(data), args.results_md)
    log(f"wrote {out_json} and the {SECTION!r} section of {args.results_md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
