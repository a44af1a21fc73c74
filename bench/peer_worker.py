"""Run one peer system on one Parquet file, inside that peer's virtualenv.

    <venv>/bin/python bench/peer_worker.py < job.json

job = {"system": "smartnoise" | "pipelinedp" | "opendp_polars", "parquet": path, "rows": N,
       "tasks": [{"kind": "time", "qid": "a", "eps": 1.0, "runs": 5, "warmup": 1},
                 {"kind": "acc", "qid": "a", "eps": 1.0, "reps": 1000, "min_reps": 100,
                  "budget_s": 300, "truth": {"count": [...], "sum": [...]}}, ...]}

Prints one line `RESULT <json>` per task on stdout (logs go to stderr). The data is loaded once
(not timed: every system is handed its data already loaded, DPCH's sits in a MergeTree table).
"""
from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from accuracy import Accumulator  # noqa: E402
from systems.base import Timing, timed_call  # noqa: E402
from workloads import QUERIES  # noqa: E402

CLASSES = {"smartnoise": ("systems.smartnoise", "SmartNoise"),
           "pipelinedp": ("systems.pipelinedp", "PipelineDP"),
           "opendp_polars": ("systems.opendp_polars", "OpenDPPolars")}


def versions() -> dict:
    from importlib import metadata

    out = {}
    for pkg in ("smartnoise-sql", "pipeline-dp", "python-dp", "opendp", "polars", "pandas", "numpy"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return out


def emit(obj: dict) -> None:
    sys.stdout.write("RESULT " + json.dumps(obj) + "\n")
    sys.stdout.flush()


def main() -> int:
    job = json.load(sys.stdin)
    import pandas as pd

    t0 = time.perf_counter()
    df = pd.read_parquet(job["parquet"])
    # SQLite (SmartNoise's pandas engine) has no unsigned 64-bit type; values fit in int64.
    df = df.astype({c: "int64" for c in ("row_id", "user_id", "region", "item")})
    load_s = time.perf_counter() - t0
    module, cls = CLASSES[job["system"]]
    t1 = time.perf_counter()
    system = getattr(__import__(module, fromlist=[cls]), cls)(df, QUERIES, int(job["rows"]))
    if hasattr(system, "setup"):
        system.setup()
    setup_s = time.perf_counter() - t1
    emit({"kind": "info", "versions": versions(), "load_s": load_s, "setup_s": setup_s})
    for task in job["tasks"]:
        try:
            emit(run_task(system, task))
        except Exception as exc:  # report and go on with the next task
            traceback.print_exc()
            emit({**{k: v for k, v in task.items() if k != "truth"}, "status": "error",
                  "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
    return 0


def run_task(system, task: dict) -> dict:
    qid, eps = task["qid"], float(task["eps"])
    head = {k: v for k, v in task.items() if k != "truth"}
    if task["kind"] == "time":
        timing = Timing()
        for _ in range(int(task.get("warmup", 1))):
            system.run(qid, eps)
        for _ in range(int(task["runs"])):
            timed_call(lambda: system.run(qid, eps), timing)
        return {**head, "status": "ok", **timing.summary()}
    if task["kind"] == "acc":
        acc = Accumulator(task["truth"])
        run = system.repeated(qid, eps) if hasattr(system, "repeated") else (lambda: system.run(qid, eps))
        reps = int(task["reps"])
        min_reps, budget = int(task.get("min_reps", reps)), float(task.get("budget_s", 1e18))
        start = time.perf_counter()
        while acc.reps < reps:
            acc.add(run())
            if acc.reps >= min_reps and time.perf_counter() - start > budget:
                break
        return {**head, "status": "ok", "reps_done": acc.reps, "seconds": time.perf_counter() - start,
                "stats": acc.summary()}
    raise ValueError(f"unknown task kind {task['kind']!r}")


if __name__ == "__main__":
    sys.exit(main())
