"""The peers' private quantiles, run inside each peer's own virtualenv (bench/bench_quantiles.py).

    <venv>/bin/python bench/quantile_peers.py < job.json

job = {"system": "opendp" | "pipelinedp" | "tumult",
       "datasets": [{"name": "uniform_n1000", "n": 1000, "path": ".../uniform_n1000.npy"}, ...],
       "eps": [0.1, 1.0], "levels": [0.5, 0.9], "lo": 0.0, "hi": 1000.0, "buckets": 65536,
       "reps": {"uniform_n1000": 100, ...}, "time_runs": 3}

Prints `RESULT <json>` lines on stdout (the protocol of bench/peer_worker.py, read by
run_all.run_worker): one {"kind": "info"} first, then per dataset, ε and level a
{"kind": "release", "values": [...]} with the released values (the harness computes the rank
errors, the same code for every system) and "release_s", the wall time of single releases.
Only numpy and the peer's own library are imported: every peer virtualenv can run this.

Every peer is configured for row-level pure ε-DP with add/remove-one-row neighbours (one row = one
privacy unit), public bounds [lo, hi], and ε per released quantile:
- opendp: `dp.m.make_private_quantile` over vector_domain(atom_domain(float, nan=False)) of
  unknown size, symmetric_distance, max_divergence; the candidates are the midpoints of `buckets`
  equal buckets of [lo, hi] (DPCH's output grid); the scale comes from OpenDP's own
  `binary_search_param(..., d_in=1, d_out=ε)` and the measurement's map(1) is asserted ≤ ε.
- pipelinedp: one public partition, `contribution_bounds_already_enforced=True` (each row is its
  own unit), max_partitions_contributed = max_contributions_per_partition = 1, Laplace noise,
  `NaiveBudgetAccountant(total_epsilon=ε, total_delta=0)`; both levels from ONE aggregation
  (Metrics.PERCENTILE(50) and PERCENTILE(90)): PipelineDP's quantile tree spends ε once for any
  number of percentiles, so each level's distribution is that of a single-level release at ε.
- tumult: `Session.from_dataframe(PureDPBudget(ε), protected_change=AddOneRow())`,
  `QueryBuilder.quantile(x, α, low=lo, high=hi)`. The repetitions are one query per (n, ε, level):
  the datasets of that n are replicated `reps` times into disjoint rows, grouped by the public
  KeySet (dataset, rep); under AddOneRow a row lies in one group, so every group's value is a
  release at ε on that group's data (parallel composition), distributed exactly like a query on
  that dataset alone. Single-release times come from separate ungrouped queries.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
import traceback

import numpy as np


def emit(obj: dict) -> None:
    sys.stdout.write("RESULT " + json.dumps(obj) + "\n")
    sys.stdout.flush()


def versions(pkgs) -> dict:
    from importlib import metadata

    out = {}
    for pkg in pkgs:
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return out


def grid(job) -> list[float]:
    lo, hi, k = float(job["lo"]), float(job["hi"]), int(job["buckets"])
    return [float(v) for v in lo + (np.arange(k) + 0.5) * ((hi - lo) / k)]


# -- OpenDP ------------------------------------------------------------------------------------
def run_opendp(job, data) -> None:
    import opendp.prelude as dp

    dp.enable_features("contrib")
    cands = grid(job)
    domain = dp.vector_domain(dp.atom_domain(T=float, nan=False))
    emit({"kind": "info", "versions": versions(["opendp", "numpy"]), "candidates": len(cands)})
    for eps in job["eps"]:
        for alpha in job["levels"]:
            t0 = time.perf_counter()

            def make(scale, alpha=alpha):
                return dp.m.make_private_quantile(domain, dp.symmetric_distance(), dp.max_divergence(),
                                                  cands, alpha, scale)

            scale = dp.binary_search_param(make, d_in=1, d_out=eps)
            meas = make(scale)
            assert meas.map(1) <= eps, (meas.map(1), eps)
            build_s = time.perf_counter() - t0
            for ds in job["datasets"]:
                x = data[ds["name"]].tolist()
                values, times = [], []
                for _ in range(int(job["reps"][ds["name"]])):
                    t = time.perf_counter()
                    values.append(float(meas(x)))
                    times.append(time.perf_counter() - t)
                emit({"kind": "release", "dataset": ds["name"], "eps": eps, "level": alpha, "values": values,
                      "release_s": times, "setup_s": build_s,
                      "config": {"scale": scale, "map_d_in_1": float(meas.map(1))}})


# -- PipelineDP --------------------------------------------------------------------------------
def run_pipelinedp(job, data) -> None:
    import pipeline_dp

    emit({"kind": "info", "versions": versions(["pipeline-dp", "python-dp", "numpy"])})
    levels = list(job["levels"])
    metrics = [pipeline_dp.Metrics.PERCENTILE(100 * a) for a in levels]

    def release(rows, eps):
        accountant = pipeline_dp.NaiveBudgetAccountant(total_epsilon=eps, total_delta=0)
        engine = pipeline_dp.DPEngine(accountant, pipeline_dp.LocalBackend())
        params = pipeline_dp.AggregateParams(
            noise_kind=pipeline_dp.NoiseKind.LAPLACE, metrics=metrics,
            max_partitions_contributed=1, max_contributions_per_partition=1,
            min_value=float(job["lo"]), max_value=float(job["hi"]),
            contribution_bounds_already_enforced=True)
        extractors = pipeline_dp.DataExtractors(partition_extractor=lambda r: 0, privacy_id_extractor=None,
                                                value_extractor=lambda r: r)
        result = engine.aggregate(rows, params, extractors, public_partitions=[0])
        accountant.compute_budgets()
        (_, m), = list(result)
        specs = [s for s in getattr(accountant, "_mechanisms", [])]
        spent = [(float(s.mechanism_spec.eps), float(s.mechanism_spec.delta)) for s in specs]
        return [float(v) for v in m], spent

    for ds in job["datasets"]:
        rows = data[ds["name"]].tolist()
        for eps in job["eps"]:
            values = {a: [] for a in levels}
            times, spent = [], None
            for _ in range(int(job["reps"][ds["name"]])):
                t = time.perf_counter()
                out, spent = release(rows, eps)
                times.append(time.perf_counter() - t)
                for a, v in zip(levels, out):
                    values[a].append(v)
            if spent:  # one mechanism (the quantile tree) got the whole ε
                assert len(spent) == 1 and abs(spent[0][0] - eps) < 1e-12 and spent[0][1] == 0, spent
            for a in levels:
                emit({"kind": "release", "dataset": ds["name"], "eps": eps, "level": a, "values": values[a],
                      "release_s": times, "config": {"mechanism_eps": spent,
                                                     "joint_levels": levels}})


# -- Tumult Analytics --------------------------------------------------------------------------
def run_tumult(job, data) -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # Spark's Python workers: this venv
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    import pandas as pd
    from pyspark.sql import SparkSession
    from tmlt.analytics import AddOneRow, KeySet, PureDPBudget, QueryBuilder, Session

    t0 = time.perf_counter()
    warehouse = tempfile.mkdtemp(prefix="dpch-bench-spark-")  # not ./spark-warehouse
    spark = (SparkSession.builder.master("local[2]").appName("dpch-bench-quantiles")
             .config("spark.driver.memory", "6g").config("spark.sql.shuffle.partitions", "8")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.execution.arrow.pyspark.enabled", "true")
             .config("spark.sql.warehouse.dir", warehouse).getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    emit({"kind": "info", "versions": versions(["tmlt.analytics", "tmlt.core", "pyspark", "pandas", "numpy"]),
          "spark_start_s": time.perf_counter() - t0})
    lo, hi = float(job["lo"]), float(job["hi"])

    def evaluate(sdf, eps, alpha, keys=None):
        session = Session.from_dataframe(privacy_budget=PureDPBudget(eps), source_id="t", dataframe=sdf,
                                         protected_change=AddOneRow())
        qb = QueryBuilder("t")
        if keys is not None:
            qb = qb.groupby(keys)
        return session.evaluate(qb.quantile("x", alpha, low=lo, high=hi, name="v"), PureDPBudget(eps)).toPandas()

    by_n: dict[int, list[dict]] = {}
    for ds in job["datasets"]:
        by_n.setdefault(int(ds["n"]), []).append(ds)
    for n, dss in sorted(by_n.items()):
        reps = max(int(job["reps"][ds["name"]]) for ds in dss)
        base = pd.concat([pd.DataFrame({"g": ds["name"], "x": data[ds["name"]]}) for ds in dss], ignore_index=True)
        base_sdf = spark.createDataFrame(base).cache()
        base_sdf.count()
        # the replication happens inside Spark (a cross join with the public rep ids)
        rep_sdf = base_sdf.crossJoin(spark.range(reps).withColumnRenamed("id", "rep"))
        keys = KeySet.from_dict({"g": [ds["name"] for ds in dss], "rep": list(range(reps))})
        grouped = {}
        for eps in job["eps"]:
            for alpha in job["levels"]:
                t = time.perf_counter()
                grouped[eps, alpha] = evaluate(rep_sdf, eps, alpha, keys), time.perf_counter() - t
        # single-release wall time (JVM warm by now): ungrouped queries on the first dataset of this n
        single = spark.createDataFrame(pd.DataFrame({"x": data[dss[0]["name"]]})).cache()
        single.count()
        times = []
        for _ in range(int(job["time_runs"])):
            t = time.perf_counter()
            evaluate(single, job["eps"][-1], job["levels"][0])
            times.append(time.perf_counter() - t)
        for eps in job["eps"]:
            for alpha in job["levels"]:
                out, query_s = grouped[eps, alpha]
                for ds in dss:
                    got = out[out["g"] == ds["name"]].sort_values("rep")
                    values = [float(v) for v in got["v"]][: int(job["reps"][ds["name"]])]
                    emit({"kind": "release", "dataset": ds["name"], "eps": eps, "level": alpha, "values": values,
                          "release_s": times, "config": {"grouped_query_s": query_s, "groups": len(out),
                                                         "rows_in_query": len(base) * reps}})
        base_sdf.unpersist()
        single.unpersist()
    spark.stop()
    shutil.rmtree(warehouse, ignore_errors=True)


RUNNERS = {"opendp": run_opendp, "pipelinedp": run_pipelinedp, "tumult": run_tumult}


def main() -> int:
    job = json.load(sys.stdin)
    data = {ds["name"]: np.load(ds["path"]) for ds in job["datasets"]}
    try:
        RUNNERS[job["system"]](job, data)
    except Exception as exc:
        traceback.print_exc()
        emit({"kind": "error", "error": f"{type(exc).__name__}: {str(exc)[:500]}"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
