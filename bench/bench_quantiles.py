#!/usr/bin/env python3
"""Quantile accuracy against the peers (issue 15; results: bench/RESULTS.md, section "Quantile
accuracy against the peers (issue 15)").

    make bench-quantiles            # = the full run below, peers' virtualenvs created on first use
    .venv/bin/python bench/bench_quantiles.py [--systems dpch,opendp] [--dpch-reps 200] ...
    .venv/bin/python bench/bench_quantiles.py --systems dpch,dpch_joint,dpch_split --merge
                                    # re-run some systems, keep the others' results from --out

Same seeded data, same ε, same public bounds [0, 1000] for every system, row-level pure ε-DP
(add/remove one row; one row = one individual), one quantile level per release at ε:
- data: n ∈ {1 000, 100 000} values of three distributions (uniform on [0, 1000]; lognormal(ln 100,
  1) clipped to [0, 1000]; the mixture 0.6·N(250, 50²) + 0.4·N(750, 50²) clipped to [0, 1000]),
  drawn once from numpy's PCG64 with a fixed seed and saved as .npy (bench/data/quantiles/); every
  system reads those files (their SHA-256 are in the output);
- DPCH: `dp_quantile(x, α, 0, 1000, ε)` per level, through `db.raw_query` on an embedded store;
  two extra columns release both levels at ε in total: `dpch_joint` = `dp_quantiles(x, [0.5, 0.9],
  0, 1000, ε)` (Kaplan et al. recursion) and `dpch_split` = `dp_quantile` per level at ε/2. The
  repetitions are one query per dataset over the data cross-joined with `numbers(reps)` and
  `GROUP BY rep`: every group is one independent release on exactly that dataset (all the
  releases of a dataset are columns of that one query; ClickHouse computes the shared histogram
  once per group). Wall time per release: separate single-release queries;
- the peers run out of process in their own virtualenvs (bench/quantile_peers.py, which says how
  each is configured), through run_all.ensure_venv / run_all.run_worker: OpenDP and PipelineDP in
  the virtualenvs of `make bench` (bench/.venv-opendp, bench/.venv-peers), Tumult Analytics in
  bench/.venv-tumult (pyspark; needs Java).

Metric: rank error of a released v for level α on data x of n values,
|rank(v) − α·n| with the midrank rank(v) = #{x < v} + #{x = v}/2 (ties only occur at the clip
value 1000 of the lognormal data); per system and configuration the median, the 90th percentile
and the mean over the repetitions. The exact answer has rank error ≤ 1/2.

Writes bench/out/quantiles.json and bench/out/quantiles.md (a table to copy into RESULTS.md).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))

from run_all import (PEER_ENVS, ensure_venv, log, machine_info, run_worker, venv_python,  # noqa: E402
                     write_results)

LO, HI = 0.0, 1000.0
LARGE_N = 10_000  # Tumult runs only --tumult-large-dists from this size on
BUCKETS = 1 << 16  # DPCH's grid (dpch.mechanisms.QUANTILE_BUCKETS); OpenDP's candidates are its midpoints
DISTS = {
    "uniform": "uniform on [0, 1000]",
    "lognormal": "lognormal(μ = ln 100, σ = 1) clipped to [0, 1000] (median 100, p90 ≈ 360)",
    "bimodal": "0.6·N(250, 50²) + 0.4·N(750, 50²) clipped to [0, 1000]",
}
PEERS = ("opendp", "pipelinedp", "tumult")
DPCH_SYSTEMS = ("dpch", "dpch_joint", "dpch_split")
SYSTEMS = DPCH_SYSTEMS + PEERS
# The peers' virtualenvs: OpenDP and PipelineDP reuse run_all's (`make bench`); Tumult gets its own.
PEER_ENV_SPECS = {
    "opendp": ("opendp", PEER_ENVS["opendp"]),
    "pipelinedp": ("peers", PEER_ENVS["peers"]),
    "tumult": ("tumult", {"dir": BENCH / ".venv-tumult", "packages": ["tmlt.analytics==0.21.0"],
                          "imports": "import tmlt.analytics, pyspark, pandas", "systems": ("tumult",)}),
}
SYSTEM_NOTES = {
    "dpch": "dp_quantile(x, α, 0, 1000, ε): permute-and-flip over a 2^16-bucket histogram, the bucket's midpoint",
    "dpch_joint": "dp_quantiles(x, [0.5, 0.9], 0, 1000, ε): both levels jointly at ε in total "
                  "(Kaplan et al. recursion, ε/2 per depth)",
    "dpch_split": "dp_quantile(x, α, 0, 1000, ε/2) for α = 0.5 and 0.9: both levels at ε in total by basic "
                  "composition (the baseline for dpch_joint)",
    "opendp": "dp.m.make_private_quantile over the 2^16 bucket midpoints, scale from binary_search_param "
              "(map(1) ≤ ε asserted); report-noisy-max with exponential noise (= permute-and-flip)",
    "pipelinedp": "Metrics.PERCENTILE(50), PERCENTILE(90) in one aggregation at ε (its quantile tree: "
                  "height 4, branching 16, Laplace noise, δ = 0), one public partition, bounds already enforced",
    "tumult": "QueryBuilder.quantile(x, α, low=0, high=1000), PureDPBudget(ε), AddOneRow; "
              "exponential mechanism over the intervals between sorted values, uniform draw inside",
}


# -- data ---------------------------------------------------------------------------------------
def draw(dist: str, n: int, seed: int) -> np.ndarray:
    """The benchmark data (never used for noise): deterministic per (seed, dist, n)."""
    rng = np.random.default_rng([seed, list(DISTS).index(dist), n])
    if dist == "uniform":
        x = rng.uniform(LO, HI, n)
    elif dist == "lognormal":
        x = rng.lognormal(math.log(100.0), 1.0, n)
    elif dist == "bimodal":
        first = rng.random(n) < 0.6
        x = np.where(first, rng.normal(250.0, 50.0, n), rng.normal(750.0, 50.0, n))
    else:
        raise ValueError(dist)
    return np.clip(x, LO, HI).astype(np.float64)


def make_datasets(args) -> list[dict]:
    args.data_dir.mkdir(parents=True, exist_ok=True)
    out = []
    for n in args.ns:
        for dist in args.dists:
            name = f"{dist}_n{n}"
            x = draw(dist, n, args.seed)
            path = args.data_dir / f"{name}.npy"
            np.save(path, x)
            xs = np.sort(x)
            out.append({"name": name, "dist": dist, "n": n, "path": str(path),
                        "sha256": hashlib.sha256(x.tobytes()).hexdigest(),
                        "exact": {str(a): float(np.quantile(xs, a)) for a in args.levels},
                        "reps_dpch": args.dpch_reps, "reps_peers": lookup(args.peer_reps, n),
                        "reps_tumult": lookup(args.tumult_reps, n)})
    return out


def lookup(reps_by_n: dict[int, int], n: int) -> int:
    """Repetitions for data size n from an n:reps map (the nearest listed size below, else the smallest)."""
    below = [k for k in reps_by_n if k <= n]
    return reps_by_n[max(below) if below else min(reps_by_n)]


def rank_errors(xs_sorted: np.ndarray, values, alpha: float) -> np.ndarray:
    v = np.asarray(values, dtype=np.float64)
    below = np.searchsorted(xs_sorted, v, side="left")
    upto = np.searchsorted(xs_sorted, v, side="right")
    return np.abs(below + (upto - below) / 2.0 - alpha * len(xs_sorted))


def summarize(xs_sorted: np.ndarray, values, alpha: float) -> dict:
    err = rank_errors(xs_sorted, values, alpha)
    ok = bool(len(err)) and bool(np.all(np.isfinite(err)))
    vals = np.asarray(values, dtype=np.float64)
    return {"reps": len(err), "median": float(np.median(err)) if ok else math.nan,
            "p90": float(np.percentile(err, 90)) if ok else math.nan,
            "mean": float(np.mean(err)) if ok else math.nan, "max": float(np.max(err)) if ok else math.nan,
            "in_bounds": bool(np.all((vals >= LO) & (vals <= HI))) if len(vals) else False}


# -- DPCH ---------------------------------------------------------------------------------------
def run_dpch(args, datasets: list[dict], systems: list[str]) -> list[dict]:
    import pandas as pd

    import dpch

    store = Path(tempfile.mkdtemp(prefix="dpch-bench-quantiles-"))
    db = dpch.connect(store, analyst="bench")
    records: list[dict] = []
    try:
        db.command("CREATE DATABASE IF NOT EXISTS qbench")
        releases = []  # (system, eps, level, SQL expression)
        for eps in args.eps:
            if "dpch" in systems:
                releases += [("dpch", eps, a, f"dp_quantile(x, {a!r}, {LO!r}, {HI!r}, {eps!r})") for a in args.levels]
            if "dpch_split" in systems:  # the same two levels by basic composition: ε/#levels each
                share = eps / len(args.levels)
                releases += [("dpch_split", eps, a, f"dp_quantile(x, {a!r}, {LO!r}, {HI!r}, {share!r})")
                             for a in args.levels]
            if "dpch_joint" in systems:
                levels = "[" + ", ".join(repr(a) for a in args.levels) + "]"
                releases.append(("dpch_joint", eps, None, f"dp_quantiles(x, {levels}, {LO!r}, {HI!r}, {eps!r})"))
        for ds in datasets:
            x = np.load(ds["path"])
            xs = np.sort(x)
            table = f"qbench.{ds['name']}"
            db.command(f"CREATE TABLE {table} (x Float64) ENGINE = MergeTree ORDER BY tuple()")
            db.insert_df(table, pd.DataFrame({"x": x}))
            got = db.raw_query(f"SELECT count() AS n, sum(x) AS s FROM {table}")
            assert int(got["n"][0]) == len(x) and math.isclose(float(got["s"][0]), float(x.sum()), rel_tol=1e-12)
            cols = ", ".join(f"{expr} AS r{i}" for i, (_, _, _, expr) in enumerate(releases))
            t0 = time.perf_counter()
            df = db.raw_query(f"SELECT rep, {cols} FROM {table} CROSS JOIN "
                              f"(SELECT number AS rep FROM numbers({int(args.dpch_reps)})) AS reps GROUP BY rep")
            batch_s = time.perf_counter() - t0
            assert len(df) == args.dpch_reps and sorted(df["rep"]) == list(range(args.dpch_reps))
            log(f"dpch {ds['name']}: {len(releases)} × {args.dpch_reps} releases in {batch_s:.1f} s")
            for i, (system, eps, alpha, expr) in enumerate(releases):
                # wall time of single releases (one query on the n rows), interleaved below
                times = []
                single = f"SELECT {expr} AS v FROM {table}"
                db.raw_query(single)  # warm-up
                for _ in range(args.time_runs):
                    t = time.perf_counter()
                    db.raw_query(single)
                    times.append(time.perf_counter() - t)
                column = df[f"r{i}"]
                per_level = ({alpha: [float(v) for v in column]} if alpha is not None else
                             {a: [float(v[j]) for v in column] for j, a in enumerate(args.levels)})
                for a, values in per_level.items():
                    records.append({"system": system, "dataset": ds["name"], "dist": ds["dist"], "n": ds["n"],
                                    "eps": eps, "level": a, "status": "ok",
                                    "rank_error": summarize(xs, values, a),
                                    "value_median": float(np.median(values)),
                                    "release_s_median": statistics.median(times), "release_s_runs": len(times),
                                    "batch_s": batch_s, "sql": expr})
            db.command(f"DROP TABLE {table}")
    finally:
        db.close()
        shutil.rmtree(store, ignore_errors=True)
    return records


# -- peers --------------------------------------------------------------------------------------
def run_peer_system(args, system: str, datasets: list[dict]) -> tuple[list[dict], dict]:
    env, spec = PEER_ENV_SPECS[system]
    reason = None
    if system == "tumult" and not shutil.which("java"):
        reason = "no Java runtime on PATH (pyspark needs one; apt-get install openjdk-17-jre-headless)"
    reason = reason or ensure_venv(env, install=not args.no_install, spec=spec)
    if reason:
        log(f"{system}: skipped: {reason}")
        return [skipped(system, ds, eps, a, reason) for ds in datasets for eps in args.eps for a in args.levels], \
            {"skipped": reason}
    reps = {ds["name"]: ds["reps_peers"] for ds in datasets}
    records, run = [], datasets
    if system == "tumult":  # its exact-arithmetic exponential mechanism costs ≈ 10 s a release at n = 100 000
        reps = {ds["name"]: lookup(args.tumult_reps, ds["n"]) for ds in datasets}
        run = [ds for ds in datasets if ds["n"] < LARGE_N or ds["dist"] in args.tumult_large_dists]
        for ds in datasets:
            if ds not in run:
                why = (f"compute budget: Tumult takes ≈ 10 s a release at n = {ds['n']:,} on this machine; "
                       f"at n ≥ {LARGE_N:,} only {', '.join(args.tumult_large_dists) or 'no data'} is run")
                records += [skipped(system, ds, eps, a, why) for eps in args.eps for a in args.levels]
    job = {"system": system, "eps": args.eps, "levels": args.levels, "lo": LO, "hi": HI, "buckets": BUCKETS,
           "datasets": [{k: ds[k] for k in ("name", "n", "path")} for ds in run],
           "reps": {ds["name"]: reps[ds["name"]] for ds in run}, "time_runs": args.peer_time_runs}
    log(f"{system}: running in {spec['dir'].name} ...")
    t0 = time.perf_counter()
    results = run_worker(venv_python(env, spec), BENCH / "quantile_peers.py", job, args.peer_timeout_s, system)
    info: dict = {"seconds": time.perf_counter() - t0}
    by_name = {ds["name"]: ds for ds in datasets}
    sorted_x = {}
    done = set()
    for res in results:
        kind = res.get("kind")
        if kind == "info":
            info.update({k: v for k, v in res.items() if k != "kind"})
        elif kind in ("error", "timeout", "crash"):
            info.setdefault("errors", []).append(f"{kind}: {res.get('error')}")
            log(f"{system}: {kind}: {res.get('error')}")
        elif kind == "release":
            ds = by_name[res["dataset"]]
            if ds["name"] not in sorted_x:
                sorted_x[ds["name"]] = np.sort(np.load(ds["path"]))
            a, eps = float(res["level"]), float(res["eps"])
            records.append({"system": system, "dataset": ds["name"], "dist": ds["dist"], "n": ds["n"],
                            "eps": eps, "level": a, "status": "ok",
                            "rank_error": summarize(sorted_x[ds["name"]], res["values"], a),
                            "value_median": float(np.median(res["values"])),
                            "release_s_median": statistics.median(res["release_s"]),
                            "release_s_runs": len(res["release_s"]),
                            "setup_s": res.get("setup_s"), "config": res.get("config")})
            done.add((ds["name"], eps, a))
    why = "; ".join(info.get("errors", [])) or "no result"
    for ds in run:
        for eps in args.eps:
            for a in args.levels:
                if (ds["name"], eps, a) not in done:
                    records.append({**skipped(system, ds, eps, a, why), "status": "error"})
    log(f"{system}: {len(done)} configurations in {info['seconds']:.0f} s")
    return records, info


def skipped(system: str, ds: dict, eps: float, alpha: float, reason: str) -> dict:
    return {"system": system, "dataset": ds["name"], "dist": ds["dist"], "n": ds["n"], "eps": eps,
            "level": alpha, "status": "skipped", "reason": reason}


# -- report -------------------------------------------------------------------------------------
def fmt_err(rec: dict | None) -> str:
    if rec is None:
        return "—"
    if rec["status"] != "ok":
        return rec["status"]
    r = rec["rank_error"]
    return f"{r['median']:.3g} / {r['p90']:.3g}"


def fmt_time(s: float) -> str:
    return f"{s * 1000:.1f} ms" if s < 1 else f"{s:.2f} s"


def markdown(data: dict) -> str:
    recs = data["results"]
    systems = [s for s in SYSTEMS if any(r["system"] == s for r in recs)]
    index = {(r["system"], r["dataset"], r["eps"], r["level"]): r for r in recs}
    runs = data.get("runs") or [{"command": data["command"], "systems": data["config"]["systems"],
                                 "machine": data["machine"], "seconds": data.get("seconds")}]
    lines = [f"Command `{r['command']}` ({', '.join(r['systems'])}): {r['machine'].get('date')}, "
             f"DPCH {r['machine'].get('commit')}, {r['machine'].get('cpu')}, {r['machine'].get('cores')} cores, "
             f"{(r.get('seconds') or 0) / 60:.1f} min." for r in runs]
    lines += ["",
             "Rank error |#{x < v} + #{x = v}/2 − α·n|, **median / p90** over the repetitions "
             "(lower is better; the exact quantile scores ≤ 0.5). Repetitions: "
             + ", ".join(f"n = {ds['n']:,}: DPCH {ds['reps_dpch']}, OpenDP and PipelineDP {ds['reps_peers']}, "
                         f"Tumult {ds['reps_tumult']}"
                         for ds in {d["n"]: d for d in data["datasets"]}.values()) + ".", "",
             "| data | n | ε | α | " + " | ".join(systems) + " |",
             "|---|---:|---:|---:|" + "---:|" * len(systems)]
    for ds in data["datasets"]:
        for eps in data["config"]["eps"]:
            for a in data["config"]["levels"]:
                cells = [fmt_err(index.get((s, ds["name"], eps, a))) for s in systems]
                lines.append(f"| {ds['dist']} | {ds['n']:,} | {eps:g} | {a:g} | " + " | ".join(cells) + " |")
    lines += ["", ("Wall time per release (median over the configurations of the median single-release "
                   "time; peers' data already in memory, DPCH's in a MergeTree table):"), "",
              "| n | " + " | ".join(systems) + " |", "|---:|" + "---:|" * len(systems)]
    for n in data["config"]["ns"]:
        cells = []
        for s in systems:
            ts = [r["release_s_median"] for r in recs if r["system"] == s and r["n"] == n and r["status"] == "ok"]
            cells.append(fmt_time(statistics.median(ts)) if ts else "—")
        lines.append(f"| {n:,} | " + " | ".join(cells) + " |")
    lines += ["", "Systems:", ""] + [f"- `{s}`: {SYSTEM_NOTES[s]}" for s in systems]
    for s, info in data.get("peer_info", {}).items():
        if info.get("skipped") or info.get("errors"):
            lines.append(f"- `{s}` not (fully) run: {info.get('skipped') or '; '.join(info['errors'])}")
    lines += ["", "Data: " + "; ".join(f"{k}: {v}" for k, v in DISTS.items() if k in data["config"]["dists"])
              + f"; seed {data['config']['seed']}."]
    return "\n".join(lines) + "\n"


# -- main ---------------------------------------------------------------------------------------
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ints = lambda s: [int(float(x)) for x in s.split(",") if x]  # noqa: E731
    floats = lambda s: [float(x) for x in s.split(",") if x]  # noqa: E731
    ap.add_argument("--ns", type=ints, default=[1000, 100_000])
    ap.add_argument("--dists", default=",".join(DISTS))
    ap.add_argument("--eps", type=floats, default=[0.1, 1.0])
    ap.add_argument("--levels", type=floats, default=[0.5, 0.9])
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--dpch-reps", type=int, default=200)
    ap.add_argument("--peer-reps", default="1000:100,100000:50",
                    help="n:reps,... OpenDP's and PipelineDP's repetitions per data size (other sizes: the nearest listed size below)")
    ap.add_argument("--tumult-reps", default="1000:50,100000:5",
                    help="n:reps,... Tumult's repetitions (≈ 10 s a release at n = 100 000)")
    ap.add_argument("--tumult-large-dists", default="uniform",
                    help=f"the distributions Tumult runs at n ≥ {LARGE_N:,} (compute budget)")
    ap.add_argument("--time-runs", type=int, default=5, help="DPCH single-release timing runs per release")
    ap.add_argument("--peer-time-runs", type=int, default=1,
                    help="Tumult's single-release timing runs per n (OpenDP and PipelineDP time every repetition)")
    ap.add_argument("--seed", type=int, default=20261125)
    ap.add_argument("--peer-timeout-s", type=float, default=1800.0)
    ap.add_argument("--data-dir", type=Path, default=BENCH / "data" / "quantiles")
    ap.add_argument("--out", type=Path, default=BENCH / "out" / "quantiles.json")
    ap.add_argument("--markdown", type=Path, default=BENCH / "out" / "quantiles.md")
    ap.add_argument("--no-install", action="store_true", help="never create the peer virtualenvs")
    ap.add_argument("--merge", action="store_true",
                    help="keep the other systems' results from an earlier --out of the same configuration")
    args = ap.parse_args(argv)
    args.dists = [d for d in args.dists.split(",") if d]
    args.systems = [s for s in args.systems.split(",") if s]
    unknown = [d for d in args.dists if d not in DISTS] + [s for s in args.systems if s not in SYSTEMS]
    if unknown:
        ap.error(f"unknown distribution/system: {unknown}")
    args.tumult_large_dists = [d for d in args.tumult_large_dists.split(",") if d]
    for name in ("peer_reps", "tumult_reps"):
        setattr(args, name, {int(float(k)): int(v) for k, v in (p.split(":") for p in getattr(args, name).split(",") if p)})
    return args


def merge_previous(data: dict, old: dict) -> None:
    """--merge: keep the earlier results of the systems not run this time (same data and grid)."""
    same = ("ns", "dists", "eps", "levels", "lo", "hi", "buckets", "seed")
    if any(old["config"].get(k) != data["config"][k] for k in same) or \
            [d["sha256"] for d in old["datasets"]] != [d["sha256"] for d in data["datasets"]]:
        sys.exit(f"--merge: {data['config']} differs from the configuration in the earlier output")
    ran = set(data["config"]["systems"])
    data["results"] = [r for r in old["results"] if r["system"] not in ran] + data["results"]
    data["peer_info"] = {**{k: v for k, v in old.get("peer_info", {}).items() if k not in ran}, **data["peer_info"]}
    data["runs"] = old.get("runs", [{"command": old["command"], "systems": old["config"]["systems"],
                                     "machine": old["machine"], "seconds": old.get("seconds")}])
    data["runs"].append({"command": data["command"], "systems": sorted(ran), "machine": data["machine"],
                         "seconds": data["seconds"]})
    data["config"]["systems"] = [s for s in SYSTEMS if any(r["system"] == s for r in data["results"])]


def main(argv=None) -> int:
    args = parse_args(argv)
    command = "python3 bench/bench_quantiles.py " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    datasets = make_datasets(args)
    data = {"command": command.strip(), "machine": machine_info(),
            "config": {"ns": args.ns, "dists": args.dists, "eps": args.eps, "levels": args.levels,
                       "lo": LO, "hi": HI, "buckets": BUCKETS, "seed": args.seed, "systems": args.systems},
            "datasets": datasets, "results": [], "peer_info": {}}
    t0 = time.perf_counter()
    dpch_systems = [s for s in args.systems if s in DPCH_SYSTEMS]
    if dpch_systems:
        data["results"] += run_dpch(args, datasets, dpch_systems)
    for system in (s for s in args.systems if s in PEERS):
        recs, info = run_peer_system(args, system, datasets)
        data["results"] += recs
        data["peer_info"][system] = info
    data["seconds"] = time.perf_counter() - t0
    if args.merge and args.out.exists():
        merge_previous(data, json.loads(args.out.read_text()))
    write_results(data, args.out, args.markdown, markdown(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
