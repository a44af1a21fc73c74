"""The peers' private partition selection, run inside each peer's own virtualenv
(bench/bench_partition_peers.py, which documents the comparison).

    <venv>/bin/python bench/partition_peers.py < job.json

job = {"system": "pipelinedp" | "opendp" | "tumult",
       "datasets": [{"k": 1, "path": ".../pairs_k1_....npz"}, ...],
       "budgets": [[0.1, 1e-6], [1.0, 1e-6], ...], "repeats": 3,
       "configs": ["pdp_geometric", ...]}        # optional: a subset of the system's configurations

Each dataset is the DISTINCT (user_id, key) pairs of the benchmark table for one k (arrays
`user_id` and `key` in an .npz): every unit has at most k pairs, so the number of rows of a key is
its number of distinct units (DPCH's COUNT(DISTINCT user_id)); every system bounds contributions to
k groups per unit and 1 row per (unit, group).

Prints `RESULT <json>` lines on stdout (the protocol of bench/peer_worker.py, read by
run_all.run_worker): one {"kind": "info"} first, then per dataset, budget and configuration a
{"kind": "release", "k", "eps", "delta", "config", "released": [groups released per repetition],
"true_released": [released groups that are true groups], "expected": Σ_g P[g released] from the
mechanism's own parameters (None where not derivable), "seconds": [...], "params": {...}}.
Only numpy and the peer's own library (plus what it brings: polars, pandas, pyspark) are imported.

The configurations (the exact calls are in the functions below):
- pipelinedp: `DPEngine.aggregate` with `metrics=[PRIVACY_ID_COUNT]`, `public_partitions=None`,
  `max_partitions_contributed=k`, `max_contributions_per_partition=1`, LocalBackend, one
  `NaiveBudgetAccountant(total_epsilon=ε, total_delta=δ)` per release:
  `pdp_geometric` (the default `partition_selection_strategy=TRUNCATED_GEOMETRIC`),
  `pdp_laplace_thr` (LAPLACE_THRESHOLDING), `pdp_gaussian_thr` (GAUSSIAN_THRESHOLDING), all with
  `noise_kind=LAPLACE` for the count: the accountant gives the selection ε/2 and all of δ, the
  Laplace count ε/2; `pdp_post_laplace` / `pdp_post_gaussian`: `post_aggregation_thresholding=True`
  with `noise_kind=LAPLACE` / `GAUSSIAN`: one thresholded privacy-id count gets all of (ε, δ) (the
  accounting DPCH uses); `pdp_select_only`: `DPEngine.select_partitions` (SelectPartitionsParams,
  TRUNCATED_GEOMETRIC) at all of (ε, δ), keys only. Expected counts from python-dp's own
  `probability_of_keep` of the strategy PipelineDP builds from the accountant's (ε, δ) and k.
- opendp: `dp.Context.compositor(data, privacy_unit, privacy_loss=dp.loss_of(epsilon=ε,
  delta=δ), split_evenly_over=1)`, `query().group_by("key").agg(dp.len(signed=True))` with no key
  set, so OpenDP thresholds the noisy length (scale and threshold from its own binary searches;
  the resolved measurement is released `repeats` times, `map(d_in) ≤ (ε, δ)` asserted):
  `odp_laplace`: `privacy_unit = dp.unit_of(contributions=[Bound(per_group=k), Bound(by=["key"],
  per_group=1, num_groups=k)])` (the bounds hold by construction of the pairs);
  `odp_laplace_truncate`: `dp.unit_of(contributions=1, identifier="user_id")` and OpenDP's own
  bounding `.truncate_per_group(1, by=["key"]).truncate_num_groups(k, by=["key"], keep="first")`;
  `odp_gaussian`: `make_private_lazyframe` under `approximate(zero_concentrated_divergence())`
  (integer Gaussian noise, L2 sensitivity √k) cast by `make_zCDP_to_approxDP` and
  `make_fix_delta(δ)`: δ is split between the threshold and the zCDP→(ε, δ) conversion; for each
  split in GAUSSIAN_SPLITS the scale is the smallest with ε at the conversion's share and the
  threshold the smallest that fits the rest; the split with the smallest threshold is kept
  (data-independent). Expected counts from the noise law (integer Laplace / Gaussian) and the
  threshold (`len > threshold`).
- tumult: `Session.from_dataframe(ApproxDPBudget(ε, δ), "t", df,
  protected_change=AddRowsWithID("user_id"))`, `QueryBuilder("t").enforce(MaxRowsPerGroupPerID(
  "key", 1)).enforce(MaxGroupsPerID("key", k)).get_groups(["key"])` (`tumult_get_groups`): keys
  only, all of (ε, δ) to the selection (Tumult's GeometricPartitionSelection: geometric noise of
  scale α = k/ε, release iff count + noise ≥ τ). Expected counts from the compiled measurement's
  α and τ.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import sys
import tempfile
import time
import traceback

import numpy as np

from quantile_peers import emit, versions  # the same RESULT protocol (bench/ is the script's directory)

PIPELINEDP_CONFIGS = ("pdp_geometric", "pdp_laplace_thr", "pdp_gaussian_thr", "pdp_post_laplace",
                      "pdp_post_gaussian", "pdp_select_only")
OPENDP_CONFIGS = ("odp_laplace", "odp_gaussian", "odp_laplace_truncate")
TUMULT_CONFIGS = ("tumult_get_groups",)
GAUSSIAN_SPLITS = (0.1, 0.25, 0.5, 0.75)  # share of δ for OpenDP's Gaussian threshold


def config_error(k, eps, delta, config, exc) -> None:
    emit({"kind": "config_error", "k": k, "eps": eps, "delta": delta, "config": config,
          "error": f"{type(exc).__name__}: {str(exc)[:300]}"})


def guarded(k, eps, delta, config, fn) -> None:
    """Emit fn()'s record; a failing configuration is reported and the others still run."""
    try:
        rec = fn()
    except Exception as exc:
        traceback.print_exc()
        config_error(k, eps, delta, config, exc)
        return
    emit(rec)


def histogram(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct group sizes n, how many groups have that n) of the pairs' keys."""
    _, counts = np.unique(keys, return_counts=True)
    return np.unique(counts, return_counts=True)


def expected_from(prob, hist) -> float:
    sizes, mult = hist
    return float(sum(int(m) * float(prob(int(n))) for n, m in zip(sizes, mult)))


def laplace_tail(scale: float):
    """P[Z ≥ m] for integer Laplace noise, P[Z = z] ∝ exp(−|z|/scale)."""
    q = math.exp(-1.0 / scale)

    def tail(m: int) -> float:
        return q ** m / (1 + q) if m >= 1 else 1.0 - q ** (1 - m) / (1 + q)
    return tail


def gaussian_tail(sigma: float):
    """P[Z ≥ m] for integer Gaussian noise, P[Z = z] ∝ exp(−z²/(2σ²)) (summed over |z| ≤ 40σ + 10)."""
    width = int(40 * sigma) + 10
    z = np.arange(-width, width + 1, dtype=np.float64)
    w = np.exp(-z * z / (2 * sigma * sigma))
    upper = np.cumsum(w[::-1])[::-1] / w.sum()  # upper[i] = P[Z ≥ z_i]

    def tail(m: int) -> float:
        if m <= -width:
            return 1.0
        if m > width:
            return 0.0
        return float(upper[m + width])
    return tail


def released_true(keys_released, true_keys: set) -> tuple[int, int]:
    ks = [int(x) for x in keys_released]
    return len(ks), sum(1 for x in ks if x in true_keys)


# -- PipelineDP --------------------------------------------------------------------------------
def run_pipelinedp(job, data) -> None:
    import pipeline_dp
    from pipeline_dp import partition_selection as ps
    from pipeline_dp.aggregate_params import PartitionSelectionStrategy as S

    emit({"kind": "info", "versions": versions(["pipeline-dp", "python-dp", "numpy"])})
    lap, gau = pipeline_dp.NoiseKind.LAPLACE, pipeline_dp.NoiseKind.GAUSSIAN
    # config -> (strategy, count noise, post_aggregation_thresholding, select_partitions only)
    table = {"pdp_geometric": (S.TRUNCATED_GEOMETRIC, lap, False, False),
             "pdp_laplace_thr": (S.LAPLACE_THRESHOLDING, lap, False, False),
             "pdp_gaussian_thr": (S.GAUSSIAN_THRESHOLDING, lap, False, False),
             "pdp_post_laplace": (S.TRUNCATED_GEOMETRIC, lap, True, False),
             "pdp_post_gaussian": (S.TRUNCATED_GEOMETRIC, gau, True, False),
             "pdp_select_only": (S.TRUNCATED_GEOMETRIC, lap, False, True)}
    selection_types = {"Truncated Geometric": S.TRUNCATED_GEOMETRIC, "Laplace Thresholding": S.LAPLACE_THRESHOLDING,
                       "Gaussian Thresholding": S.GAUSSIAN_THRESHOLDING}
    extractors = pipeline_dp.DataExtractors(privacy_id_extractor=lambda r: r[0], partition_extractor=lambda r: r[1],
                                            value_extractor=lambda r: 0)

    def release(pairs, k, eps, delta, config):
        strategy, noise, post, select_only = table[config]
        accountant = pipeline_dp.NaiveBudgetAccountant(total_epsilon=eps, total_delta=delta)
        engine = pipeline_dp.DPEngine(accountant, pipeline_dp.LocalBackend())
        if select_only:
            params = pipeline_dp.SelectPartitionsParams(max_partitions_contributed=k,
                                                        partition_selection_strategy=strategy)
            result = engine.select_partitions(pairs, params, extractors)
            accountant.compute_budgets()
            keys = list(result)
        else:
            params = pipeline_dp.AggregateParams(
                noise_kind=noise, metrics=[pipeline_dp.Metrics.PRIVACY_ID_COUNT],
                max_partitions_contributed=k, max_contributions_per_partition=1,
                partition_selection_strategy=strategy, post_aggregation_thresholding=post)
            result = engine.aggregate(pairs, params, extractors, public_partitions=None)
            accountant.compute_budgets()
            keys = [pk for pk, _ in result]
        specs = [{"type": s.mechanism_spec.mechanism_type.value, "eps": float(s.mechanism_spec.eps),
                  "delta": float(s.mechanism_spec.delta)} for s in accountant._mechanisms]
        return keys, specs

    def measure(pairs, true_keys, hist, k, eps, delta, config) -> dict:
        released, true_rel, secs, specs = [], [], [], None
        for _ in range(int(job["repeats"])):
            t = time.perf_counter()
            got, specs = release(pairs, k, eps, delta, config)
            secs.append(time.perf_counter() - t)
            n_rel, n_true = released_true(got, true_keys)
            released.append(n_rel)
            true_rel.append(n_true)
        # the selection's own (ε, δ) and strategy, as PipelineDP built it
        sel = [s for s in specs if s["type"] in selection_types]
        assert len(sel) == 1, specs
        total_eps = sum(s["eps"] for s in specs)
        total_delta = sum(s["delta"] for s in specs)
        assert total_eps <= eps * (1 + 1e-9) and total_delta <= delta * (1 + 1e-9), (specs, eps, delta)
        strat = ps.create_partition_selection_strategy(selection_types[sel[0]["type"]], sel[0]["eps"],
                                                       sel[0]["delta"], k)
        return {"kind": "release", "k": k, "eps": eps, "delta": delta, "config": config,
                "released": released, "true_released": true_rel, "seconds": secs,
                "expected": expected_from(strat.probability_of_keep, hist),
                "params": {"mechanisms": specs, "selection": sel[0], "threshold": getattr(strat, "threshold", None)}}

    for ds in job["datasets"]:
        k = int(ds["k"])
        users, keys = data[ds["k"]]
        pairs = list(zip(users.tolist(), keys.tolist()))
        true_keys = set(keys.tolist())
        hist = histogram(keys)
        for eps, delta in job["budgets"]:
            for config in job.get("configs") or PIPELINEDP_CONFIGS:
                if config in table:
                    guarded(k, eps, delta, config, lambda: measure(pairs, true_keys, hist, k, eps, delta, config))


# -- OpenDP ------------------------------------------------------------------------------------
def run_opendp(job, data) -> None:
    import opendp.prelude as dp
    import polars as pl

    dp.enable_features("contrib")
    emit({"kind": "info", "versions": versions(["opendp", "polars", "numpy"])})

    def summary_params(query):
        row = query.summarize().row(0, named=True)
        return {"distribution": row["distribution"], "scale": float(row["scale"]),
                "threshold": int(row["threshold"])}

    def laplace(lf, k, eps, delta, truncate: bool):
        if truncate:
            unit = dp.unit_of(contributions=1, identifier=pl.col("user_id"))
        else:
            unit = dp.unit_of(contributions=[dp.polars.Bound(per_group=k),
                                             dp.polars.Bound(by=[pl.col("key")], per_group=1, num_groups=k)])
        ctx = dp.Context.compositor(data=lf, privacy_unit=unit, privacy_loss=dp.loss_of(epsilon=eps, delta=delta),
                                    split_evenly_over=1)
        q = ctx.query()
        if truncate:
            q = q.truncate_per_group(1, by=["key"]).truncate_num_groups(k, by=["key"], keep="first")
        q = q.group_by("key").agg(dp.len(signed=True))
        params = summary_params(q)
        meas = q.resolve()
        used = meas.map(unit[1])
        assert used[0] <= eps * (1 + 1e-9) and used[1] <= delta * (1 + 1e-9), (used, eps, delta)
        params.update({"map_d_in": [float(used[0]), float(used[1])]})
        return meas, params

    def gaussian(lf, schema, k, eps, delta):
        domain = dp.lazyframe_domain([dp.series_domain(c, dp.atom_domain(T="i64")) for c in schema])
        metric = dp.frame_distance(dp.symmetric_distance())
        d_in = [dp.polars.Bound(per_group=k), dp.polars.Bound(by=[pl.col("key")], per_group=1, num_groups=k)]
        plan = pl.LazyFrame(schema=schema).group_by("key").agg(dp.len(signed=True))

        def make(scale, threshold, d):
            m = dp.m.make_private_lazyframe(domain, metric, dp.approximate(dp.zero_concentrated_divergence()), plan,
                                            global_scale=scale, threshold=threshold)
            return dp.c.make_fix_delta(dp.c.make_zCDP_to_approxDP(m), d)

        def fits(scale, threshold, d):
            try:
                return make(scale, threshold, d).map(d_in)[0] <= eps
            except Exception:  # a threshold at or below the per-group bound is refused
                return False

        best = None
        for share in GAUSSIAN_SPLITS:
            # the threshold at u32::MAX spends no δ: the scale is set by ε at the conversion's δ
            scale = dp.binary_search(lambda s: fits(s, 2 ** 32 - 1, (1 - share) * delta), T=float)
            thr = dp.binary_search(lambda t: fits(scale, t, delta), bounds=(2, 2 ** 30), T=int)
            cand = (thr, scale, share)
            best = cand if best is None or cand[:2] < best[:2] else best
        thr, scale, share = best
        meas = make(scale, thr, delta)
        used = meas.map(d_in)
        assert used[0] <= eps * (1 + 1e-9) and used[1] <= delta * (1 + 1e-9), (used, eps, delta)
        return meas, {"distribution": "Integer Gaussian", "scale": float(scale), "threshold": int(thr),
                      "threshold_delta_share": share, "map_d_in": [float(used[0]), float(used[1])]}

    for ds in job["datasets"]:
        k = int(ds["k"])
        users, keys = data[ds["k"]]
        df = pl.DataFrame({"user_id": users.astype(np.int64), "key": keys.astype(np.int64)})
        lf = df.lazy()
        true_keys = set(keys.tolist())
        hist = histogram(keys)
        for eps, delta in job["budgets"]:
            for config in job.get("configs") or OPENDP_CONFIGS:
                if config not in OPENDP_CONFIGS:
                    continue
                t0 = time.perf_counter()
                try:
                    if config == "odp_gaussian":
                        meas, params = gaussian(lf, df.schema, k, eps, delta)
                        tail = gaussian_tail(params["scale"])
                    else:
                        meas, params = laplace(lf, k, eps, delta, truncate=config == "odp_laplace_truncate")
                        assert params["distribution"] == "Integer Laplace", params
                        tail = laplace_tail(params["scale"])
                except Exception as exc:  # one configuration failing does not stop the others
                    traceback.print_exc()
                    config_error(k, eps, delta, config, exc)
                    continue
                params["build_s"] = time.perf_counter() - t0
                thr = params["threshold"]
                released, true_rel, secs = [], [], []
                for _ in range(int(job["repeats"])):
                    t = time.perf_counter()
                    out = meas(lf)
                    out = out.collect() if hasattr(out, "collect") else out
                    secs.append(time.perf_counter() - t)
                    n_rel, n_true = released_true(out["key"].to_list(), true_keys)
                    released.append(n_rel)
                    true_rel.append(n_true)
                # released iff n + Z > threshold, i.e. Z ≥ threshold − n + 1 (the expectation uses the
                # untruncated counts: for odp_laplace_truncate it is what the bounds would allow)
                emit({"kind": "release", "k": k, "eps": eps, "delta": delta, "config": config,
                      "released": released, "true_released": true_rel, "seconds": secs,
                      "expected": expected_from(lambda n: tail(thr - n + 1), hist), "params": params})


# -- Tumult Analytics --------------------------------------------------------------------------
def _find(obj, cls, depth=0):
    """The first `cls` instance inside a Tumult Core measurement (walks its attributes)."""
    if isinstance(obj, cls):
        return obj
    if depth > 16 or not hasattr(obj, "__dict__"):
        return None
    for v in vars(obj).values():
        for item in (v if isinstance(v, (list, tuple)) else [v]):
            if hasattr(item, "__dict__") and type(item).__module__.startswith("tmlt."):
                got = _find(item, cls, depth + 1)
                if got is not None:
                    return got
    return None


def run_tumult(job, data) -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    import pandas as pd
    from pyspark.sql import SparkSession
    from tmlt.analytics import (AddRowsWithID, ApproxDPBudget, MaxGroupsPerID, MaxRowsPerGroupPerID, QueryBuilder,
                                Session)
    from tmlt.core.measurements.spark_measurements import GeometricPartitionSelection

    t0 = time.perf_counter()
    warehouse = tempfile.mkdtemp(prefix="dpch-bench-spark-")
    spark = (SparkSession.builder.master("local[2]").appName("dpch-bench-partition-peers")
             .config("spark.driver.memory", "4g").config("spark.sql.shuffle.partitions", "8")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.execution.arrow.pyspark.enabled", "true")
             .config("spark.sql.warehouse.dir", warehouse).getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    emit({"kind": "info", "versions": versions(["tmlt.analytics", "tmlt.core", "pyspark", "pandas", "numpy"]),
          "spark_start_s": time.perf_counter() - t0})

    def measure(sdf, true_keys, hist, k, eps, delta) -> dict:
        query = (QueryBuilder("t").enforce(MaxRowsPerGroupPerID("key", 1)).enforce(MaxGroupsPerID("key", k))
                 .get_groups(["key"]))
        released, true_rel, secs, params = [], [], [], {}
        for rep in range(int(job["repeats"])):
            t = time.perf_counter()
            session = Session.from_dataframe(privacy_budget=ApproxDPBudget(eps, delta), source_id="t",
                                             dataframe=sdf, protected_change=AddRowsWithID("user_id"))
            if rep == 0:  # the compiled measurement's own noise scale and threshold
                meas = session._compile_and_get_info(query._query_expr, ApproxDPBudget(eps, delta))[0]
                sel = _find(meas, GeometricPartitionSelection)
                if sel is not None:
                    params = {"alpha": float(sel.alpha.to_float(round_up=False)), "threshold": int(sel.threshold)}
            out = session.evaluate(query, ApproxDPBudget(eps, delta)).toPandas()
            secs.append(time.perf_counter() - t)
            n_rel, n_true = released_true(out["key"].tolist(), true_keys)
            released.append(n_rel)
            true_rel.append(n_true)
        expected = None
        if params:  # released iff n + Z ≥ τ, Z two-sided geometric with P ∝ exp(−|z|/α)
            tail = laplace_tail(params["alpha"])
            expected = expected_from(lambda n: tail(params["threshold"] - n), hist)
        return {"kind": "release", "k": k, "eps": eps, "delta": delta, "config": "tumult_get_groups",
                "released": released, "true_released": true_rel, "seconds": secs, "expected": expected,
                "params": params}

    for ds in job["datasets"]:
        k = int(ds["k"])
        users, keys = data[ds["k"]]
        sdf = spark.createDataFrame(pd.DataFrame({"user_id": users.astype(np.int64),
                                                  "key": keys.astype(np.int64)})).cache()
        sdf.count()
        true_keys = set(keys.tolist())
        hist = histogram(keys)
        for eps, delta in job["budgets"]:
            guarded(k, eps, delta, "tumult_get_groups", lambda: measure(sdf, true_keys, hist, k, eps, delta))
        sdf.unpersist()
    spark.stop()
    shutil.rmtree(warehouse, ignore_errors=True)


RUNNERS = {"pipelinedp": run_pipelinedp, "opendp": run_opendp, "tumult": run_tumult}


def main() -> int:
    job = json.load(sys.stdin)
    data = {}
    for ds in job["datasets"]:
        z = np.load(ds["path"])
        data[ds["k"]] = (z["user_id"], z["key"])
    try:
        RUNNERS[job["system"]](job, data)
    except Exception as exc:
        traceback.print_exc()
        emit({"kind": "error", "error": f"{type(exc).__name__}: {str(exc)[:500]}"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
