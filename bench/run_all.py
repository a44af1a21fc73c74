#!/usr/bin/env python3
"""DPCH benchmarks against plain ClickHouse and against SmartNoise SQL, PipelineDP and OpenDP.

    make bench                      # = python3 bench/run_all.py (everything, defaults below)
    python3 bench/run_all.py --phases speed --sizes 1000000 --peer-sizes 1000000
    python3 bench/run_all.py --phases report     # re-render RESULTS.md + plots from bench/out/results.json

What it does:
1. Peer virtualenvs. smartnoise-sql pins pandas<3 and opendp<0.15, which conflicts with DPCH's own
   environment (pandas 3, and OpenDP's current release); so the peers never go into DPCH's
   environment. `bench/.venv-peers` gets SmartNoise SQL + PipelineDP, `bench/.venv-opendp` gets the
   current OpenDP with Polars. They are created on first use (pinned versions below) and reused.
2. Data (bench/workloads.py): deterministic synthetic tables in the embedded store at
   `bench/data/engine` (database `bench`), generated once per size, exported once to Parquet for
   the peers. Sizes: 1 M, 10 M, 100 M rows (100 M for plain ClickHouse and DPCH only).
3. Speed: for every size and query, the in-process systems (plain, DPCH SQL functions, DPCH
   controller) run side by side, interleaved run by run (one warm-up each, then `--runs` timed
   runs, the order rotated every run); then each peer runs the same queries on the same data in its
   own process. Wall time (median, min–max) and peak RSS per run (systems/base.py).
4. Accuracy: at equal ε per released statistic (δ = 0 everywhere: pure ε-DP, public keys), each
   system answers each query `--acc-reps` times on the accuracy table (`--acc-rows` rows); RMSE,
   relative error and noise variance against the truth (bench/accuracy.py); plus an ε sweep for
   the RMSE-vs-ε plot.
5. Writes bench/out/results.json (merged across invocations, so phases can be run separately),
   the PNG plots in bench/plots/, and the `## Benchmarks vs peers` section of bench/RESULTS.md.
Only one heavy job runs at a time (everything is sequential).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))
try:  # normally installed (`make bench` runs `pip install -e .` first); else use the checkout
    import dpch  # noqa: F401
except ImportError:
    sys.path.insert(1, str(REPO))

from accuracy import (Accumulator, discrete_laplace_var, dpch_optimum_var, dpch_sum_grid,  # noqa: E402
                      laplace_var)
from systems import INPROC, PEERS  # noqa: E402
from systems.base import PEAK_METHOD, Timing, timed_call  # noqa: E402
from workloads import (AMOUNT_BOUNDS, ITEMS, MAX_ROWS_PER_UNIT, QUERIES, Workload,  # noqa: E402
                       ensure_parquet, ensure_table, size_label, truth)

PEER_ENVS = {
    "peers": {"dir": BENCH / ".venv-peers",
              "packages": ["smartnoise-sql==1.0.10", "pipeline-dp==0.3.1", "pyarrow"],
              "imports": "import snsql, pipeline_dp, pyarrow",
              "systems": ("smartnoise", "pipelinedp")},
    "opendp": {"dir": BENCH / ".venv-opendp",
               "packages": ["opendp[polars]==0.16.0", "pyarrow", "pandas"],
               "imports": "import opendp, polars, pyarrow, pandas",
               "systems": ("opendp_polars",)},
}
PEER_ENV_OF = {s: name for name, env in PEER_ENVS.items() for s in env["systems"]}
SECTION = "## Benchmarks vs peers"


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# -- environment ------------------------------------------------------------------------------
def write_results(data: dict, out: Path, markdown: Path, md: str) -> None:
    """Write a benchmark's JSON record and its Markdown table (``data["seconds"]``: its run time),
    and print the table."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1))
    markdown.parent.mkdir(parents=True, exist_ok=True)
    markdown.write_text(md)
    print(md)
    log(f"wrote {out} and {markdown} ({data['seconds']:.0f} s)")


def venv_python(env: str, spec: dict | None = None) -> Path:
    return (spec or PEER_ENVS[env])["dir"] / "bin" / "python"


def ensure_venv(env: str, *, install: bool = True, spec: dict | None = None) -> str | None:
    """Create/complete the peer virtualenv `env` (PEER_ENVS[env], or `spec` of the same shape
    for an environment another harness owns); returns None when usable, else the reason."""
    spec = spec or PEER_ENVS[env]
    py = venv_python(env, spec)
    if py.exists() and subprocess.run([str(py), "-c", spec["imports"]], capture_output=True).returncode == 0:
        return None
    if not install:
        return f"peer virtualenv {spec['dir'].name} missing (run without --no-install)"
    log(f"creating peer virtualenv {spec['dir']} ({', '.join(spec['packages'])}) ...")
    try:
        if not py.exists():
            subprocess.run([sys.executable, "-m", "venv", str(spec["dir"])], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", *spec["packages"]], check=True)
    except (subprocess.CalledProcessError, OSError) as exc:
        return f"could not install {spec['packages']}: {exc}"
    if subprocess.run([str(py), "-c", spec["imports"]], capture_output=True).returncode != 0:
        return f"{spec['dir'].name}: imports still fail after install"
    return None


def machine_info() -> dict:
    from importlib import metadata

    cpu = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = "?"
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal"):
                mem_gib = f"{int(line.split()[1]) / 2**20:.1f}"
    except OSError:
        pass
    versions = {}
    for pkg in ("dpch", "chdb", "chdb-core", "pandas", "numpy", "sqlglot", "matplotlib"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    try:
        commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "dpch", "udf",
                                "clickhouse_config"], capture_output=True, text=True).stdout.strip()
        if dirty:
            commit += f" + uncommitted changes in {len(dirty.splitlines())} file(s) of dpch/, udf/, clickhouse_config/"
    except OSError:
        commit = "?"
    return {"cpu": cpu, "cores": os.cpu_count(), "mem_gib": mem_gib, "kernel": platform.release(),
            "python": platform.python_version(), "versions": versions, "commit": commit,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "peak_method": PEAK_METHOD}


# -- results store ----------------------------------------------------------------------------
class Results:
    def __init__(self, path: Path):
        self.path = path
        self.data = {"machine": {}, "commands": [], "speed": [], "accuracy": [], "peer_info": {},
                     "notes": []}
        if path.exists():
            try:
                self.data.update(json.loads(path.read_text()))
            except json.JSONDecodeError:
                pass

    @staticmethod
    def _key(rec: dict, fields) -> tuple:
        return tuple(rec.get(f) for f in fields)

    def put(self, kind: str, rec: dict) -> None:
        fields = ("rows", "qid", "system") if kind == "speed" else ("rows", "qid", "system", "eps")
        k = self._key(rec, fields)
        self.data[kind] = [r for r in self.data[kind] if self._key(r, fields) != k] + [rec]
        self.save()

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=float))
        tmp.replace(self.path)


# -- in-process systems -----------------------------------------------------------------------
def open_db(data_dir: Path):
    import dpch

    return dpch.connect(data_dir / "engine", analyst="bench")


def dpch_availability(db) -> dict[str, str | None]:
    """None if usable, else why not (e.g. the noise UDFs or the controller have not landed)."""
    out: dict[str, str | None] = {"plain": None}
    try:
        db.raw_query("SELECT dp_count(1.0) AS n, dp_sum(number, 0, 10, 1.0) AS s FROM numbers(10)")
        out["dpch_sql"] = None
    except Exception as exc:
        out["dpch_sql"] = f"DPCH SQL functions unavailable: {str(exc).splitlines()[0][:200]}"
    try:
        import dpch.controller  # noqa: F401
        import dpch.catalog  # noqa: F401
        out["dpch_controller"] = None if out["dpch_sql"] is None else out["dpch_sql"]
        out["dpch_accel"] = out["dpch_controller"]
    except Exception as exc:
        out["dpch_controller"] = f"DPCH controller unavailable: {type(exc).__name__}: {exc}"
        out["dpch_accel"] = out["dpch_controller"]
    return out


def make_inproc(name: str, db, wl):
    if name == "plain":
        from systems.plain import Plain
        return Plain(db, wl, QUERIES)
    if name == "dpch_sql":
        from systems.dpch_sql import DpchSql
        return DpchSql(db, wl, QUERIES)
    from systems.dpch_controller import DpchAccelerated, DpchController
    if name == "dpch_accel":
        system = DpchAccelerated(db, wl, QUERIES)
        log(f"dpch_accel: table copy + per-unit projection built in {system.setup_s:.1f} s (setup, untimed)")
        return system
    return DpchController(db, wl, QUERIES)


def peer_unsupported(system: str, qid: str) -> str | None:
    import importlib

    mod = importlib.import_module(f"systems.{system}")
    for obj in vars(mod).values():
        if isinstance(obj, type) and getattr(obj, "name", None) == system:
            return obj.UNSUPPORTED.get(qid)
    return None


def run_peer(system: str, parquet: Path, rows: int, tasks: list[dict], timeout_s: float) -> list[dict]:
    job = {"system": system, "parquet": str(parquet), "rows": rows, "tasks": tasks}
    return run_worker(venv_python(PEER_ENV_OF[system]), BENCH / "peer_worker.py", job, timeout_s, system)


def run_worker(python: Path, script: Path, job: dict, timeout_s: float, label: str) -> list[dict]:
    """Run `script` under a peer virtualenv's `python` with `job` as JSON on stdin; returns the
    objects of its `RESULT <json>` lines, plus a "timeout"/"crash" record if it did not finish."""
    cmd = [str(python), str(script)]
    try:
        proc = subprocess.run(cmd, input=json.dumps(job), capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        res = [json.loads(l[7:]) for l in out.splitlines() if l.startswith("RESULT ")]
        return res + [{"kind": "timeout", "error": f"peer worker exceeded {timeout_s:.0f} s"}]
    res = [json.loads(l[7:]) for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    if proc.returncode != 0:
        res.append({"kind": "crash", "error": proc.stderr.strip().splitlines()[-1:] or ["?"]})
    elif proc.stderr.strip():
        sys.stderr.write("".join(f"    [{label}] {l}\n" for l in proc.stderr.strip().splitlines()[-5:]))
    return res


# -- phases ---------------------------------------------------------------------------------
def phase_speed(args, db, results: Results, avail: dict) -> None:
    for rows in args.sizes:
        wl = Workload(rows)
        t0 = time.perf_counter()
        regenerated = ensure_table(db, wl, log=log)
        if regenerated:
            results.data["notes"].append(f"generated {rows:,} rows in {time.perf_counter() - t0:.1f} s")
        n_items = int(db.raw_query(f"SELECT uniqExact(item) AS n FROM {wl.table}")["n"][0])
        systems = [s for s in args.systems if s in INPROC]
        built = {}
        for name in systems:
            if avail.get(name):
                for qid in args.queries:
                    results.put("speed", {"rows": rows, "qid": qid, "system": name, "status": "skipped",
                                          "reason": avail[name]})
                continue
            built[name] = make_inproc(name, db, wl)
        rounds = {}  # qid -> (active systems, timings, errors)
        for qid in args.queries:
            q = QUERIES[qid]
            active = []
            for name, s in built.items():
                reason = s.supports(qid)
                if reason:
                    results.put("speed", {"rows": rows, "qid": qid, "system": name, "status": "n/a",
                                          "reason": reason})
                else:
                    active.append((name, s))
            if qid == "d" and n_items < ITEMS:
                results.data["notes"].append(f"{size_label(rows)}: only {n_items} of {ITEMS} items occur")
            log(f"speed {size_label(rows)} ({qid}) {q.title}: {', '.join(n for n, _ in active)}")
            timings = {name: Timing() for name, _ in active}
            errors: dict[str, str] = {}
            for name, s in active:  # warm-up
                for _ in range(args.warmup):
                    try:
                        s.run(qid, args.eps)
                    except Exception as exc:
                        errors[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            time_inproc(active, qid, args, timings, errors)
            rounds[qid] = (active, timings, errors)
        peers_here = rows in args.peer_sizes and any(s in PEERS for s in args.systems)
        if not peers_here:
            record_inproc(results, rows, rounds, args)
            if rows not in args.peer_sizes:
                for p in (s for s in args.systems if s in PEERS):
                    for qid in args.queries:
                        results.put("speed", {"rows": rows, "qid": qid, "system": p, "status": "skipped",
                                              "reason": "peers are run at the sizes in --peer-sizes only"})
            continue
        parquet = ensure_parquet(db, wl, args.data_dir / "parquet", regenerated=regenerated, log=log)
        for p in (s for s in args.systems if s in PEERS):
            reason = args.peer_unavailable.get(p)
            tasks = []
            for qid in args.queries:
                if peer_unsupported(p, qid):
                    results.put("speed", {"rows": rows, "qid": qid, "system": p, "status": "n/a",
                                          "reason": peer_unsupported(p, qid)})
                    continue
                skip = reason or projected_skip(results, p, qid, rows, args)
                if skip:
                    results.put("speed", {"rows": rows, "qid": qid, "system": p, "status": "skipped", "reason": skip})
                    continue
                tasks.append({"kind": "time", "qid": qid, "eps": args.eps, "runs": args.peer_runs,
                              "warmup": args.peer_warmup})
            if not tasks:
                continue
            log(f"speed {size_label(rows)} peer {p}: queries {''.join(t['qid'] for t in tasks)}")
            for res in run_peer(p, parquet, rows, tasks, args.peer_timeout_s):
                if res.get("kind") == "info":
                    results.data["peer_info"][p] = {**res, "rows": rows}
                    continue
                if res.get("kind") in ("timeout", "crash"):
                    results.data["notes"].append(f"{p} at {size_label(rows)}: {res['error']}")
                    continue
                rec = {"rows": rows, "system": p, **res}
                rec.pop("kind", None)
                results.put("speed", rec)
                if rec.get("status") == "ok":
                    log(f"   {p:16s} ({rec['qid']}) median {rec['median_s']:8.2f} s [{rec['min_s']:.2f}–{rec['max_s']:.2f}]"
                        f"  peak {rec['peak_rss_mib']:.0f} MiB")
                else:
                    log(f"   {p:16s} ({rec['qid']}) {rec.get('status')}: {rec.get('error')}")
            results.save()
        # the peers ran for minutes to hours on a shared machine: time the in-process systems again
        # now, so their medians cover the peers' time span too (same load, as far as possible)
        log(f"speed {size_label(rows)}: in-process systems again, after the peers")
        for qid, (active, timings, errors) in rounds.items():
            time_inproc(active, qid, args, timings, errors)
        record_inproc(results, rows, rounds, args, note="half of the runs before the peers, half after")


def time_inproc(active: list, qid: str, args, timings: dict, errors: dict) -> None:
    """`args.runs` timed runs of each in-process system, interleaved, the order rotated each run."""
    for r in range(args.runs):
        order = active[r % len(active):] + active[:r % len(active)] if active else []
        for name, s in order:
            if name in errors:
                continue
            try:
                timed_call(lambda: s.run(qid, args.eps), timings[name])
            except Exception as exc:
                errors[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"


def record_inproc(results: Results, rows: int, rounds: dict, args, note: str | None = None) -> None:
    for qid, (active, timings, errors) in rounds.items():
        for name, _ in active:
            rec = {"rows": rows, "qid": qid, "system": name, "eps": args.eps}
            if name in errors:
                rec.update(status="error", error=errors[name])
            else:
                rec.update(status="ok", **timings[name].summary())
                if note:
                    rec["note"] = note
            results.put("speed", rec)
            if rec["status"] == "ok":
                log(f"   ({qid}) {name:16s} median {rec['median_s'] * 1000:9.1f} ms  "
                    f"[{rec['min_s'] * 1000:.1f}–{rec['max_s'] * 1000:.1f}]  peak {rec['peak_rss_mib']:.0f} MiB")
            else:
                log(f"   ({qid}) {name:16s} {rec['status']}: {rec.get('error')}")


def projected_skip(results: Results, system: str, qid: str, rows: int, args) -> str | None:
    """Skip a peer at a size where its previous, smaller size projects (linearly) past the
    per-query time cap: the harness must finish on a 2-core machine."""
    prev = [r for r in results.data["speed"] if r["system"] == system and r["qid"] == qid
            and r.get("status") == "ok" and r["rows"] < rows]
    if not prev:
        return None
    last = max(prev, key=lambda r: r["rows"])
    projected = last["median_s"] * rows / last["rows"] * (args.peer_runs + args.peer_warmup)
    if projected > args.peer_max_s:
        return (f"projected {projected / 60:.0f} min for {args.peer_runs}+{args.peer_warmup} runs "
                f"(from {last['median_s']:.1f} s at {size_label(last['rows'])}), over --peer-max-s={args.peer_max_s:.0f}")
    return None


def sensitivity(q, stat: str) -> float:
    per_unit_rows = 1 if q.level == "row" else MAX_ROWS_PER_UNIT
    return per_unit_rows * (1.0 if stat == "count" else max(abs(b) for b in AMOUNT_BOUNDS))


def theory(system: str, q, stat: str, eps: float) -> dict:
    """Theoretical noise variances for a released count/sum at per-statistic ε."""
    clamped = system == "dpch_controller" and stat == "count"  # released as max(noisy, 0)
    stat = stat.removesuffix("_unclamped")
    if stat not in ("count", "sum"):
        return {}
    delta = sensitivity(q, stat)
    if clamped:
        return {"sensitivity": delta, "laplace_var": laplace_var(delta / eps),
                "note": "released as max(noisy count, 0): see count_unclamped for the noise"}
    out = {"sensitivity": delta, "laplace_var": laplace_var(delta / eps)}
    if system == "dpch_sql":
        grid = 1.0 if stat == "count" else dpch_sum_grid(*AMOUNT_BOUNDS)
        out["optimum_var"] = dpch_optimum_var(stat, delta, eps, grid)
        out["optimum"] = f"discrete Laplace, b = Δ/ε on a grid of {grid:g}"
    elif system == "dpch_controller":
        out["optimum_var"] = discrete_laplace_var(delta / eps) if stat == "count" else laplace_var(delta / eps)
        out["optimum"] = ("discrete Laplace, b = Δ/ε on the integers" if stat == "count"
                          else "Laplace 2(Δ/ε)² (grid finer than 2^-10 of the scale)")
    return out


def phase_accuracy(args, db, results: Results, avail: dict) -> None:
    wl = Workload(args.acc_rows, tag="acc")
    regenerated = ensure_table(db, wl, log=log)
    inproc = {}
    for name in ("dpch_sql", "dpch_controller"):
        if name in args.systems and not avail.get(name):
            inproc[name] = make_inproc(name, db, wl)
        elif name in args.systems:
            for eps in args.acc_eps:
                for qid in args.queries:
                    results.put("accuracy", {"rows": wl.rows, "qid": qid, "system": name, "eps": eps,
                                             "status": "skipped", "reason": avail[name]})
    peers = [p for p in args.systems if p in PEERS]
    parquet = ensure_parquet(db, wl, args.data_dir / "parquet", regenerated=regenerated, log=log) if peers else None
    truths = {qid: truth(db, wl, QUERIES[qid]) for qid in args.queries}
    cells = [(eps, qid) for eps in args.acc_eps for qid in args.queries
             if math.isclose(eps, args.eps) or qid in args.sweep_queries]
    for eps, qid in cells:
        q = QUERIES[qid]
        for name, s in inproc.items():
            if s.supports(qid):
                continue
            tv = dict(truths[qid].values)
            if name == "dpch_controller" and "count" in tv:
                tv["count_unclamped"] = tv["count"]
            acc = Accumulator(tv)
            start = time.perf_counter()
            run = getattr(s, "run_detailed", s.run)
            try:
                for _ in range(args.acc_reps):
                    acc.add(run(qid, eps))
                rec = {"status": "ok", "reps_done": acc.reps, "seconds": time.perf_counter() - start,
                       "stats": acc.summary()}
            except Exception as exc:
                rec = {"status": "error", "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
            rec.update(rows=wl.rows, qid=qid, system=name, eps=eps,
                       theory={st: theory(name, q, st, eps) for st in tv})
            results.put("accuracy", rec)
            log(f"accuracy ε={eps} ({qid}) {name}: {brief(rec)}")
    for p in peers:
        reason = args.peer_unavailable.get(p)
        if reason:
            for eps, qid in cells:
                results.put("accuracy", {"rows": wl.rows, "qid": qid, "system": p, "eps": eps,
                                         "status": "skipped", "reason": reason})
            continue
        tasks = []
        for eps, qid in cells:
            if peer_unsupported(p, qid):
                continue
            reps = args.acc_reps if math.isclose(eps, args.eps) else args.sweep_reps
            min_reps = args.acc_min_reps if QUERIES[qid].n_keys <= 1000 else args.acc_min_reps_many_keys
            tasks.append({"kind": "acc", "qid": qid, "eps": eps, "reps": reps,
                          "min_reps": min(reps, min_reps), "budget_s": args.acc_budget_s,
                          "truth": truths[qid].values})
        log(f"accuracy peer {p}: {len(tasks)} cells")
        for res in run_peer(p, parquet, wl.rows, tasks, args.peer_timeout_s):
            if res.get("kind") == "info":
                continue
            if res.get("kind") in ("timeout", "crash"):
                results.data["notes"].append(f"{p} accuracy: {res['error']}")
                continue
            q = QUERIES[res["qid"]]
            rec = {**res, "rows": wl.rows, "system": p,
                   "theory": {st: theory(p, q, st, res["eps"]) for st in q.stats}}
            rec.pop("kind", None)
            results.put("accuracy", rec)
            log(f"accuracy ε={res['eps']} ({res['qid']}) {p}: {brief(rec)}")


def brief(rec: dict) -> str:
    if rec.get("status") != "ok":
        return f"{rec.get('status')}: {rec.get('error') or rec.get('reason')}"
    return ", ".join(f"{st} rmse {v['rmse']:.4g}" for st, v in rec["stats"].items()) + f" ({rec['reps_done']} reps)"


def import_rendered(results: Results, md: Path) -> None:
    """Add the cells of an earlier rendered peers section (report_peers.parse_section) that
    results.json does not hold: results.json lives in bench/out (not in git), so a new checkout
    would otherwise drop every earlier run from RESULTS.md. Measured cells always win."""
    from report_peers import parse_section

    text = md.read_text()
    section = text[text.find(SECTION):]
    commit = section.split("DPCH commit ", 1)[1].split(";")[0] if "DPCH commit " in section else "?"
    cpu = section.split("- Machine: ", 1)[1].split(",")[0] if "- Machine: " in section else "?"
    source = f"RESULTS.md of DPCH {commit} (measured on {cpu})"
    old = parse_section(text, SECTION, source)
    for kind, fields in (("speed", ("rows", "qid", "system")), ("accuracy", ("rows", "qid", "system", "eps"))):
        have = {Results._key(r, fields) for r in results.data[kind]}
        for rec in old[kind]:
            if Results._key(rec, fields) in have:
                continue
            if kind == "accuracy":
                rec["theory"] = {st: theory(rec["system"], QUERIES[rec["qid"]], st, rec["eps"]) for st in rec["stats"]}
            results.data[kind].append(rec)
    results.data["commands"] = [c for c in old["commands"] if c not in results.data["commands"]] + results.data["commands"]
    note = f"cells not re-run since are carried over from the {source} (values as rounded there; no accuracy s.e.)"
    results.data["notes"] = [n for n in old["notes"] if n not in results.data["notes"]] + results.data["notes"] + [note]
    results.save()
    log(f"imported {len(old['speed'])} speed and {len(old['accuracy'])} accuracy cells from {md} ({source})")


# -- main -----------------------------------------------------------------------------------
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ints = lambda s: [int(float(x)) for x in s.split(",") if x]  # noqa: E731
    floats = lambda s: [float(x) for x in s.split(",") if x]  # noqa: E731
    ap.add_argument("--phases", default="speed,accuracy,report")
    ap.add_argument("--sizes", type=ints, default=[1_000_000, 10_000_000, 100_000_000])
    ap.add_argument("--peer-sizes", type=ints, default=[1_000_000, 10_000_000])
    ap.add_argument("--queries", default="abcd")
    ap.add_argument("--systems", default=",".join(INPROC + PEERS))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    # the pure-Python peers take minutes per run at 10 M rows (PipelineDP's LocalBackend): fewer
    # timed runs for them keep a 10 M-row run within an hour on 2 cores; the report states the count
    ap.add_argument("--peer-runs", type=int, default=None, help="timed runs per peer query (default: --runs)")
    ap.add_argument("--peer-warmup", type=int, default=None, help="peer warm-up runs (default: --warmup)")
    ap.add_argument("--eps", type=float, default=1.0, help="ε per released statistic (speed, headline accuracy)")
    ap.add_argument("--peer-max-s", type=float, default=1800.0,
                    help="skip a peer at a size whose projected time for one query exceeds this")
    ap.add_argument("--peer-timeout-s", type=float, default=7200.0)
    ap.add_argument("--acc-rows", type=int, default=5000)
    ap.add_argument("--acc-reps", type=int, default=1000)
    ap.add_argument("--acc-min-reps", type=int, default=1000,
                    help="a peer task stops at its time budget only after this many repetitions")
    ap.add_argument("--acc-min-reps-many-keys", type=int, default=100,
                    help="the same for queries with > 1000 keys ((d): 100 repetitions = 1 M released values)")
    ap.add_argument("--acc-budget-s", type=float, default=300.0,
                    help="a peer accuracy task stops after this many seconds once it has its minimum repetitions")
    ap.add_argument("--acc-eps", type=floats, default=[0.1, 0.3, 1.0, 3.0])
    ap.add_argument("--sweep-queries", default="ab")
    ap.add_argument("--sweep-reps", type=int, default=200, help="peer repetitions at the ε ≠ --eps sweep points")
    ap.add_argument("--data-dir", type=Path, default=BENCH / "data")
    ap.add_argument("--out", type=Path, default=BENCH / "out" / "results.json")
    ap.add_argument("--results-md", type=Path, default=BENCH / "RESULTS.md")
    ap.add_argument("--plots-dir", type=Path, default=BENCH / "plots")
    ap.add_argument("--no-install", action="store_true", help="never create the peer virtualenvs")
    ap.add_argument("--fresh", action="store_true", help="discard earlier results.json")
    ap.add_argument("--import-md", type=Path, default=None,
                    help="carry over the cells of a rendered RESULTS.md (e.g. from git) that results.json lacks")
    args = ap.parse_args(argv)
    args.phases = set(args.phases.split(","))
    args.peer_runs = args.runs if args.peer_runs is None else args.peer_runs
    args.peer_warmup = args.warmup if args.peer_warmup is None else args.peer_warmup
    args.systems = [s for s in args.systems.split(",") if s]
    args.queries = [q for q in args.queries if q in QUERIES]
    args.sweep_queries = [q for q in args.sweep_queries if q in QUERIES]
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.fresh and args.out.exists():
        args.out.unlink()
    results = Results(args.out)
    if args.import_md:
        import_rendered(results, args.import_md)
    if {"speed", "accuracy"} & args.phases or not results.data.get("machine"):
        results.data["machine"] = machine_info()  # a report-only run keeps the measuring run's machine/commit
    cmd = "python3 bench/run_all.py " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    stamp = f"   # {results.data['machine']['date']}, DPCH {results.data['machine']['commit']}"
    if {"speed", "accuracy"} & args.phases:  # only measuring runs are listed as reproducing commands
        results.data["commands"] = (results.data.get("commands", []) + [cmd.strip() + stamp])[-20:]
    args.peer_unavailable = {}
    needs_peers = any(s in PEERS for s in args.systems) and ({"speed", "accuracy"} & args.phases)
    if needs_peers:
        for env in PEER_ENVS:
            reason = ensure_venv(env, install=not args.no_install)
            for s in PEER_ENVS[env]["systems"]:
                if reason:
                    args.peer_unavailable[s] = reason
    if {"speed", "accuracy"} & args.phases:
        db = open_db(args.data_dir)
        try:
            avail = dpch_availability(db)
            for k, v in avail.items():
                if v:
                    log(f"{k}: {v}")
            if "speed" in args.phases:
                phase_speed(args, db, results, avail)
            if "accuracy" in args.phases:
                phase_accuracy(args, db, results, avail)
        finally:
            db.close()
    results.save()
    if "report" in args.phases:
        from plots import make_plots
        from report_peers import write_section

        plots = make_plots(results.data, args.plots_dir)
        write_section(results.data, args.results_md, plots, section=SECTION)
        log(f"wrote {args.results_md} and {len(plots)} plots in {args.plots_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
