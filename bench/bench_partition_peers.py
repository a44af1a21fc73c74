#!/usr/bin/env python3
"""Private partition selection against the peers (issue 15; results: bench/RESULTS.md, section
"Partition selection against the peers (issue 15)").

    make bench-partition-peers      # = the defaults below; peers' virtualenvs created on first use
    .venv/bin/python bench/bench_partition_peers.py [--units 100000] [--keys 10000] [--ks 1,5]
        [--budgets 0.1:1e-6,1:1e-6,1:1e-9] [--repeats 10] [--peer-repeats 3]
        [--systems dpch,pipelinedp,opendp,tumult] [--configs ...] [--no-install]

How many of the true groups each system's private partition selection releases, on the same data
at the same total (ε, δ), when no key domain is public.

Data (as bench/bench_selection.py, whose loader this reuses): U privacy units, keys Zipf(1) over K
values (key = ⌊K^u⌋ for a hash-uniform u = cityHash64(unit, i, 15)/2^53, deterministic), k keys
drawn per unit (k rows; repeated keys merge), in a MergeTree table of an embedded DPCH store. The
peers get that table's DISTINCT (user_id, key) pairs (an .npz per k, SHA-256 in the output): a
key's number of rows there is its number of distinct units, i.e. DPCH's COUNT(DISTINCT user_id)
(checked: the two group-size histograms are asserted equal). Every unit is in at most k groups and
has one row per group, so contribution bounding removes nothing in any system, and every system is
told (or enforces) the same bounds: k groups per unit, 1 row (unit) per group.

Systems and the exact calls (peers run out of process in their own virtualenvs through
run_all.ensure_venv / run_all.run_worker; bench/partition_peers.py has the peer code):
- `dpch_auto`: `db.query("SELECT key, COUNT(DISTINCT user_id) AS n FROM t GROUP BY key",
  epsilon=ε, delta=δ, selection="auto")`, catalog `max_groups_contributed=k`,
  `max_rows_per_unit=k`; the whole (ε, δ) goes to the selection, whose noisy count is the released
  n (DPCH picks the optimal rule of Desfontaines et al. at k = 1 and the Gaussian threshold at k = 5
  here); `dpch_laplace`: the same with `selection="laplace"` (the rule before issue 15).
- PipelineDP 0.3.1 (`DPEngine.aggregate`, `metrics=[PRIVACY_ID_COUNT]`, `public_partitions=None`,
  `max_partitions_contributed=k`, `max_contributions_per_partition=1`, `NaiveBudgetAccountant(ε,
  δ)`, LocalBackend): `pdp_geometric` (its default `partition_selection_strategy=TRUNCATED_GEOMETRIC`),
  `pdp_laplace_thr`, `pdp_gaussian_thr` (LAPLACE_ / GAUSSIAN_THRESHOLDING): the accountant gives the
  selection (ε/2, δ) and the Laplace privacy-id count ε/2 — PipelineDP's own split for a count
  with private selection; `pdp_post_laplace`, `pdp_post_gaussian`: `post_aggregation_thresholding=True`
  with `noise_kind` LAPLACE / GAUSSIAN: one thresholded count gets all of (ε, δ), DPCH's accounting;
  `pdp_select_only`: `DPEngine.select_partitions(SelectPartitionsParams(max_partitions_contributed=k))`
  (TRUNCATED_GEOMETRIC) at all of (ε, δ), keys without counts.
- OpenDP 0.16.0 (Polars): `odp_laplace`: `dp.Context.compositor(data=lf, privacy_unit=dp.unit_of(
  contributions=[Bound(per_group=k), Bound(by=["key"], per_group=1, num_groups=k)]),
  privacy_loss=dp.loss_of(epsilon=ε, delta=δ), split_evenly_over=1)`,
  `.query().group_by("key").agg(dp.len(signed=True))` without a key set: OpenDP spends ε on the
  integer-Laplace length and δ on its threshold (the length is the released count);
  `odp_laplace_truncate`: the same with `unit_of(contributions=1, identifier="user_id")` and
  OpenDP's own bounding `.truncate_per_group(1, by=["key"]).truncate_num_groups(k, by=["key"],
  keep="first")`; `odp_gaussian`: `make_private_lazyframe(..., approximate(zero_concentrated_divergence()),
  global_scale=σ, threshold=τ)` cast to (ε, δ) by `make_zCDP_to_approxDP` + `make_fix_delta(δ)`,
  the δ split between threshold and conversion chosen from {10, 25, 50, 75 %} for the smallest τ.
- Tumult Analytics 0.21.0: `Session.from_dataframe(ApproxDPBudget(ε, δ), protected_change=
  AddRowsWithID("user_id"))`, `QueryBuilder.enforce(MaxRowsPerGroupPerID("key", 1))
  .enforce(MaxGroupsPerID("key", k)).get_groups(["key"])` (`tumult_get_groups`): keys only, all of
  (ε, δ) to its geometric-threshold selection. Needs Java (pyspark); skipped with the reason if absent.

Per (k, ε, δ) and system: the number of released groups that are true groups (mean ± sd over the
repetitions; no system here can release a non-existent key) and the expected number Σ_g P[g is
released] from each mechanism's own parameters (DPCH: dpch.plan.selection's exact release
probability, as bench/bench_selection.py; PipelineDP: python-dp's `probability_of_keep`; OpenDP and
Tumult: their noise law and threshold) — exact, so stable where the repetitions are few.

Writes --out (JSON: every repetition, parameters, versions, data hashes) and --markdown (the table).
"""
from __future__ import annotations

import argparse
import hashlib
import math
import shlex
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))

from bench_quantiles import PEER_ENV_SPECS  # noqa: E402  (the peers' virtualenvs, Tumult's included)
from bench_selection import ANALYST, expected_released, load, true_counts  # noqa: E402
from run_all import ensure_venv, log, machine_info, run_worker, venv_python, write_results  # noqa: E402

PEERS = ("pipelinedp", "opendp", "tumult")
SYSTEMS = ("dpch",) + PEERS
# configuration -> (system, label in the table, what it is)
CONFIGS = {
    "dpch_auto": ("dpch", 'DPCH `selection="auto"`',
                  "db.query(..., selection=\"auto\"): all of (ε, δ) to the selection, the noisy count is the released n"),
    "dpch_laplace": ("dpch", 'DPCH `selection="laplace"` (old rule)',
                     "the Laplace threshold DPCH used before issue 15 (b = k/ε), all of (ε, δ)"),
    "pdp_geometric": ("pipelinedp", "PipelineDP aggregate, TRUNCATED_GEOMETRIC (default)",
                      "selection (ε/2, δ) + Laplace privacy-id count ε/2 (NaiveBudgetAccountant's split)"),
    "pdp_laplace_thr": ("pipelinedp", "PipelineDP aggregate, LAPLACE_THRESHOLDING",
                        "selection (ε/2, δ) + Laplace count ε/2"),
    "pdp_gaussian_thr": ("pipelinedp", "PipelineDP aggregate, GAUSSIAN_THRESHOLDING",
                         "selection (ε/2, δ) + Laplace count ε/2"),
    "pdp_post_laplace": ("pipelinedp", "PipelineDP post_aggregation_thresholding, LAPLACE",
                         "one Laplace-thresholded privacy-id count at (ε, δ)"),
    "pdp_post_gaussian": ("pipelinedp", "PipelineDP post_aggregation_thresholding, GAUSSIAN",
                          "one Gaussian-thresholded privacy-id count at (ε, δ)"),
    "pdp_select_only": ("pipelinedp", "PipelineDP select_partitions (keys only)",
                        "TRUNCATED_GEOMETRIC at (ε, δ), no counts"),
    "odp_laplace": ("opendp", "OpenDP group_by + dp.len (Laplace)",
                    "Context, loss_of(ε, δ): integer Laplace length at ε, threshold at δ; bounds declared"),
    "odp_gaussian": ("opendp", "OpenDP group_by + dp.len (Gaussian, zCDP→(ε, δ))",
                     "integer Gaussian length, δ split threshold/conversion; bounds declared"),
    "odp_laplace_truncate": ("opendp", "OpenDP Laplace + truncate_num_groups(k)",
                             "as odp_laplace, with identifier=user_id and OpenDP's own truncation"),
    "tumult_get_groups": ("tumult", "Tumult get_groups (keys only)",
                          "geometric noise α = k/ε, threshold τ at δ; AddRowsWithID + MaxGroupsPerID(k) "
                          "+ MaxRowsPerGroupPerID(1)"),
}
RULES = {"dpch_auto": "auto", "dpch_laplace": "laplace"}


# -- data ---------------------------------------------------------------------------------------
def prepare_data(db, args) -> list[dict]:
    """Load (or reuse) the DPCH table per k and export its DISTINCT (user_id, key) pairs for the peers."""
    args.data_dir.mkdir(parents=True, exist_ok=True)
    out = []
    for k in args.ks:
        table = load(db, args.units, args.keys, k)
        df = db.raw_query(f"SELECT DISTINCT user_id, key FROM {table} ORDER BY user_id, key")
        users = np.asarray(df["user_id"], dtype=np.int64)
        keys = np.asarray(df["key"], dtype=np.int64)
        path = args.data_dir / f"pairs_k{k}_{args.units}_{args.keys}.npz"
        np.savez(path, user_id=users, key=keys)
        counts = true_counts(db, table)
        _, per_key = np.unique(keys, return_counts=True)
        assert sorted(counts) == sorted(int(c) for c in per_key), "pairs and table disagree"
        assert int(np.unique(users, return_counts=True)[1].max()) <= k
        sha = hashlib.sha256(users.tobytes() + keys.tobytes()).hexdigest()
        out.append({"k": k, "table": table, "path": str(path), "sha256": sha, "pairs": len(keys),
                    "units": int(len(np.unique(users))), "true_groups": len(counts), "counts": counts,
                    "true_keys": set(int(x) for x in np.unique(keys))})
        log(f"k = {k}: {len(keys):,} pairs, {len(counts):,} true groups, largest {max(counts):,}")
    return out


def summarize(rec: dict) -> dict:
    vals = rec.get("true_released") or []
    rec["mean"] = statistics.fmean(vals) if vals else None
    rec["sd"] = statistics.stdev(vals) if len(vals) > 1 else (0.0 if vals else None)
    return rec


# -- DPCH ---------------------------------------------------------------------------------------
def run_dpch(db, datasets: list[dict], budgets, repeats: int, configs=("dpch_auto", "dpch_laplace")) -> list[dict]:
    """DPCH's releases: per dataset, budget and rule, `repeats` db.query runs and the exact expectation."""
    from dpch.controller import prepare

    records = []
    for ds in datasets:
        sql = f"SELECT key, COUNT(DISTINCT user_id) AS n FROM {ds['table']} GROUP BY key"
        for eps, delta in budgets:
            for config in configs:
                rule = RULES[config]
                sel = prepare(db, sql, epsilon=eps, delta=delta, selection=rule).plan.selection
                released, true_rel, secs = [], [], []
                for _ in range(repeats):
                    t = time.perf_counter()
                    got = db.query(sql, epsilon=eps, delta=delta, selection=rule)
                    secs.append(time.perf_counter() - t)
                    keys = [int(x) for x in got["key"]]
                    assert len(set(keys)) == len(keys)
                    released.append(len(keys))
                    true_rel.append(sum(1 for x in keys if x in ds["true_keys"]))
                records.append(summarize({
                    "system": "dpch", "config": config, "k": ds["k"], "eps": eps, "delta": delta, "status": "ok",
                    "released": released, "true_released": true_rel, "seconds": secs,
                    "expected": expected_released(sel, ds["counts"]),
                    "params": sel.summary()}))
                r = records[-1]
                log(f"{config} k={ds['k']} ε={eps:g} δ={delta:g}: {r['mean']:.1f} (expected {r['expected']:.1f}, "
                    f"{sel.rule_name}, T={sel.threshold})")
    return records


# -- peers --------------------------------------------------------------------------------------
def run_peer_system(args, system: str, datasets: list[dict]) -> tuple[list[dict], dict]:
    env, spec = PEER_ENV_SPECS[system]
    configs = [c for c in args.configs if CONFIGS[c][0] == system]
    reason = None
    if system == "tumult" and not shutil.which("java"):
        reason = "no Java runtime on PATH (pyspark needs one; apt-get install openjdk-17-jre-headless)"
    reason = reason or ensure_venv(env, install=not args.no_install, spec=spec)
    if reason:
        log(f"{system}: skipped: {reason}")
        return [skipped(c, ds, eps, delta, reason) for ds in datasets for eps, delta in args.budgets
                for c in configs], {"skipped": reason}
    job = {"system": system, "datasets": [{"k": ds["k"], "path": ds["path"]} for ds in datasets],
           "budgets": [list(b) for b in args.budgets], "repeats": args.peer_repeats, "configs": configs}
    log(f"{system}: running {', '.join(configs)} in {spec['dir'].name} ...")
    t0 = time.perf_counter()
    results = run_worker(venv_python(env, spec), BENCH / "partition_peers.py", job, args.peer_timeout_s, system)
    info: dict = {"seconds": time.perf_counter() - t0}
    records, done = [], set()
    for res in results:
        kind = res.get("kind")
        if kind == "info":
            info.update({k: v for k, v in res.items() if k != "kind"})
        elif kind in ("error", "timeout", "crash"):
            info.setdefault("errors", []).append(f"{kind}: {res.get('error')}")
            log(f"{system}: {kind}: {res.get('error')}")
        elif kind == "config_error":
            ds = next(d for d in datasets if d["k"] == res["k"])
            records.append({**skipped(res["config"], ds, res["eps"], res["delta"], res["error"]), "status": "error"})
            done.add((res["config"], res["k"], res["eps"], res["delta"]))
            log(f"{res['config']} k={res['k']} ε={res['eps']:g} δ={res['delta']:g}: error: {res['error']}")
        elif kind == "release":
            rec = summarize({"system": system, "status": "ok", **{k: v for k, v in res.items() if k != "kind"}})
            records.append(rec)
            done.add((rec["config"], rec["k"], rec["eps"], rec["delta"]))
            exp = "—" if rec["expected"] is None else f"{rec['expected']:.1f}"
            log(f"{rec['config']} k={rec['k']} ε={rec['eps']:g} δ={rec['delta']:g}: {rec['mean']:.1f} (expected {exp})")
    why = "; ".join(info.get("errors", [])) or "no result"
    for ds in datasets:
        for eps, delta in args.budgets:
            for c in configs:
                if (c, ds["k"], eps, delta) not in done:
                    records.append({**skipped(c, ds, eps, delta, why), "status": "error"})
    log(f"{system}: {len(done)} configurations in {info['seconds']:.0f} s")
    return records, info


def skipped(config: str, ds: dict, eps: float, delta: float, reason: str) -> dict:
    return {"system": CONFIGS[config][0], "config": config, "k": ds["k"], "eps": eps, "delta": delta,
            "status": "skipped", "reason": reason}


# -- report -------------------------------------------------------------------------------------
def cell(rec: dict | None) -> str:
    if rec is None:
        return "—"
    if rec["status"] != "ok":
        return rec["status"]
    exp = "" if rec.get("expected") is None else f" ({rec['expected']:.0f})"
    return f"{rec['mean']:.0f} ± {rec['sd']:.0f}{exp}"


def markdown(data: dict) -> str:
    recs = data["results"]
    settings = [(ds["k"], eps, delta) for ds in data["datasets"] for eps, delta in data["config"]["budgets"]]
    index = {(r["config"], r["k"], r["eps"], r["delta"]): r for r in recs}
    configs = [c for c in CONFIGS if any(r["config"] == c for r in recs)]
    m = data["machine"]
    lines = [f"Command `{data['command']}`: {m.get('date')}, DPCH {m.get('commit')}, {m.get('cpu')}, "
             f"{m.get('cores')} cores, {(data.get('seconds') or 0) / 60:.1f} min. Data: "
             f"{data['config']['units']:,} units, Zipf keys over {data['config']['keys']:,} values. "
             f"Repetitions: DPCH {data['config']['repeats']}, peers {data['config']['peer_repeats']}.", "",
             "Released true groups, **mean ± sd** over the repetitions, (exact expectation Σ_g P[g released]):", "",
             "| system | " + " | ".join(f"k={k}, ε={e:g}, δ={d:g}" for k, e, d in settings) + " |",
             "|---|" + "---:|" * len(settings),
             "| true groups | " + " | ".join(f"{ds['true_groups']:,}" for ds in data["datasets"]
                                            for _ in data["config"]["budgets"]) + " |"]
    for c in configs:
        lines.append(f"| {CONFIGS[c][1]} | " + " | ".join(cell(index.get((c, *s))) for s in settings) + " |")
    lines += ["", "Thresholds (release iff the noisy count ≥ T; OpenDP: > τ, shown as τ + 1):", "",
              "| system | " + " | ".join(f"k={k}, ε={e:g}, δ={d:g}" for k, e, d in settings) + " |",
              "|---|" + "---:|" * len(settings)]
    for c in configs:
        cells = []
        for s in settings:
            r = index.get((c, *s))
            p = (r or {}).get("params") or {}
            t = p.get("threshold")
            if t is None:
                cells.append("—")
                continue
            t = t + 1 if CONFIGS[c][0] == "opendp" else t
            name = p.get("rule", "")
            cells.append(f"{t:.4g}" + (f" ({name})" if name else ""))
        lines.append(f"| {CONFIGS[c][1]} | " + " | ".join(cells) + " |")
    lines += ["", "Configurations:", ""] + [f"- `{c}` ({CONFIGS[c][1]}): {CONFIGS[c][2]}" for c in configs]
    errors = {}
    for r in recs:
        if r["status"] != "ok":
            errors.setdefault((r["config"], r["status"], r.get("reason", "")), []).append(f"k={r['k']}, ε={r['eps']:g}, "
                                                                                     f"δ={r['delta']:g}")
    for (c, status, reason), where in errors.items():
        lines.append(f"- `{c}` {status} at {'; '.join(where)}: {reason}")
    for s, info in data.get("peer_info", {}).items():
        if info.get("versions"):
            lines.append(f"- {s} versions: " + ", ".join(f"{k} {v}" for k, v in info["versions"].items()))
        if info.get("skipped") or info.get("errors"):
            lines.append(f"- `{s}` not (fully) run: {info.get('skipped') or '; '.join(info['errors'])}")
    return "\n".join(lines) + "\n"


# -- main ---------------------------------------------------------------------------------------
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--units", type=int, default=100_000)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--ks", default="1,5", help="groups per unit (comma list)")
    ap.add_argument("--budgets", default="0.1:1e-6,1:1e-6,1:1e-9", help="ε:δ,... (comma list)")
    ap.add_argument("--repeats", type=int, default=10, help="DPCH releases per setting")
    ap.add_argument("--peer-repeats", type=int, default=3, help="peer releases per setting and configuration")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--configs", default=",".join(CONFIGS), help="subset of the configurations")
    ap.add_argument("--peer-timeout-s", type=float, default=1800.0)
    ap.add_argument("--data-dir", type=Path, default=BENCH / ".data" / "partition_peers")
    ap.add_argument("--out", type=Path, default=BENCH / "out" / "partition_peers.json")
    ap.add_argument("--markdown", type=Path, default=BENCH / "out" / "partition_peers.md")
    ap.add_argument("--no-install", action="store_true", help="never create the peer virtualenvs")
    args = ap.parse_args(argv)
    args.ks = [int(x) for x in args.ks.split(",") if x]
    args.budgets = [(float(e), float(d)) for e, d in (p.split(":") for p in args.budgets.split(",") if p)]
    args.systems = [s for s in args.systems.split(",") if s]
    args.configs = [c for c in args.configs.split(",") if c]
    unknown = [s for s in args.systems if s not in SYSTEMS] + [c for c in args.configs if c not in CONFIGS]
    if unknown:
        ap.error(f"unknown system/configuration: {unknown}")
    args.configs = [c for c in args.configs if CONFIGS[c][0] in args.systems]
    return args


def main(argv=None) -> int:
    import dpch

    args = parse_args(argv)
    command = "python3 bench/bench_partition_peers.py " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    t0 = time.perf_counter()
    db = dpch.connect(args.data_dir / "store", analyst=ANALYST)
    try:
        datasets = prepare_data(db, args)
        results = []
        if "dpch" in args.systems:
            results += run_dpch(db, datasets, args.budgets, args.repeats,
                                [c for c in args.configs if CONFIGS[c][0] == "dpch"])
    finally:
        db.close()
    data = {"command": command.strip(), "machine": machine_info(),
            "config": {"units": args.units, "keys": args.keys, "ks": args.ks, "budgets": args.budgets,
                       "repeats": args.repeats, "peer_repeats": args.peer_repeats, "systems": args.systems,
                       "configs": args.configs},
            "datasets": [{k: v for k, v in ds.items() if k not in ("counts", "true_keys")} for ds in datasets],
            "results": results, "peer_info": {}}
    for system in (s for s in args.systems if s in PEERS):
        recs, info = run_peer_system(args, system, datasets)
        data["results"] += recs
        data["peer_info"][system] = info
    data["seconds"] = time.perf_counter() - t0
    for r in data["results"]:  # every released key must be a true group
        if r["status"] == "ok":
            assert r["released"] == r["true_released"], r
            assert all(x <= next(d["true_groups"] for d in datasets if d["k"] == r["k"]) for x in r["released"])
            assert r["expected"] is None or math.isfinite(r["expected"])
    write_results(data, args.out, args.markdown, markdown(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
