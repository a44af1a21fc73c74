"""Keep the benchmark harness (bench/run_all.py) working: run it end to end on tiny data.

No timing assertions: these only check that every system produces well-formed results, that the
accuracy bookkeeping is right, and that the report and plots are written. The peers run only where
their virtualenvs exist (`make bench` creates them); otherwise that test is skipped with the reason.
The harness runs in a subprocess because chDB holds one store per process (tests share theirs).
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
sys.path.insert(0, str(BENCH))

from accuracy import Accumulator, discrete_laplace_var, dpch_sum_grid, laplace_var  # noqa: E402


def _run_harness(tmp_path: Path, *args: str) -> dict:
    cmd = [sys.executable, str(BENCH / "run_all.py"), "--data-dir", str(tmp_path / "data"),
           "--out", str(tmp_path / "results.json"), "--results-md", str(tmp_path / "RESULTS.md"),
           "--plots-dir", str(tmp_path / "plots"), "--no-install", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((tmp_path / "results.json").read_text())


def test_accumulator_matches_direct_computation():
    rng = np.random.default_rng(1)  # test data only; never used for DP noise
    truth = {"count": [10.0, 0.0, 5.0]}
    acc = Accumulator(truth)
    draws = []
    for i in range(50):
        v = np.array(truth["count"]) + rng.normal(0, 2, 3)
        if i % 10 == 0:
            v[1] = np.nan  # a key not released in this repetition
        draws.append(v)
        acc.add({"count": list(v)})
    s = acc.summary()["count"]
    d = np.array(draws) - np.array(truth["count"])
    ok = ~np.isnan(d)
    assert math.isclose(s["rmse"], math.sqrt(np.mean(d[ok] ** 2)), rel_tol=1e-12)
    per_key_var = [np.var(d[ok[:, k], k], ddof=1) for k in range(3)]
    assert math.isclose(s["noise_var"], float(np.mean(per_key_var)), rel_tol=1e-9)
    assert math.isclose(s["released"], ok.mean(), rel_tol=1e-12)
    assert s["reps"] == 50 and s["mse_se"] > 0


def test_theoretical_variances():
    # discrete Laplace variance 2e^{-1/b}/(1-e^{-1/b})^2: below 2b^2, and → 2b^2 - 1/6 as b grows
    assert math.isclose(discrete_laplace_var(1.0), 2 * math.e ** -1 / (1 - math.e ** -1) ** 2)
    assert discrete_laplace_var(1.0) < laplace_var(1.0)
    assert abs(discrete_laplace_var(1000.0) - (laplace_var(1000.0) - 1 / 6)) < 1e-3
    assert dpch_sum_grid(0, 500) == 2.0 ** -11


def test_harness_inprocess_systems_tiny(tmp_path):
    data = _run_harness(tmp_path, "--sizes", "3000", "--peer-sizes", "", "--runs", "2", "--warmup", "1",
                        "--acc-rows", "1500", "--acc-reps", "5", "--acc-eps", "0.5,1", "--sweep-reps", "3",
                        "--systems", "plain,dpch_sql,dpch_controller,dpch_accel")
    speed = {(r["qid"], r["system"]): r for r in data["speed"]}
    assert speed[("b", "dpch_accel")]["status"] == "ok", speed[("b", "dpch_accel")]
    assert speed[("a", "dpch_accel")]["status"] == "n/a"
    for qid in "abcd":
        assert speed[(qid, "plain")]["status"] == "ok"
        assert speed[(qid, "dpch_controller")]["status"] == "ok", speed[(qid, "dpch_controller")]
    for qid in "acd":
        r = speed[(qid, "dpch_sql")]
        assert r["status"] == "ok", r
        assert r["runs"] == 2 and r["min_s"] <= r["median_s"] <= r["max_s"] and r["peak_rss_mib"] > 0
    assert speed[("b", "dpch_sql")]["status"] == "n/a"
    acc = {(r["qid"], r["system"], r["eps"]): r for r in data["accuracy"]}
    for key in (("a", "dpch_sql", 1.0), ("b", "dpch_controller", 1.0), ("b", "dpch_controller", 0.5)):
        r = acc[key]
        assert r["status"] == "ok", r
        assert r["reps_done"] == 5
        for st in ("count", "sum"):
            assert r["stats"][st]["rmse"] > 0
    assert "count_unclamped" in acc[("b", "dpch_controller", 1.0)]["stats"]
    assert acc[("a", "dpch_sql", 1.0)]["theory"]["count"]["optimum_var"] == pytest.approx(
        discrete_laplace_var(1.0))
    md = (tmp_path / "RESULTS.md").read_text()
    assert "## Benchmarks vs peers" in md and "### Targets" in md and "### Accuracy at equal ε" in md
    assert (tmp_path / "plots" / "time_vs_rows.png").stat().st_size > 1000
    assert (tmp_path / "plots" / "rmse_vs_epsilon.png").stat().st_size > 1000
    assert any(r["system"] == "smartnoise" for r in data["speed"]) is False


def _peer_envs_ready() -> str | None:
    sys.path.insert(0, str(BENCH))
    from run_all import ensure_venv

    for env in ("peers", "opendp"):
        reason = ensure_venv(env, install=False)
        if reason:
            return reason
    return None


def test_harness_peers_tiny(tmp_path):
    reason = _peer_envs_ready()
    if reason:
        pytest.skip(f"peer virtualenvs not set up ({reason}); `make bench` creates them")
    data = _run_harness(tmp_path, "--sizes", "3000", "--peer-sizes", "3000", "--runs", "1", "--warmup", "0",
                        "--queries", "ab", "--acc-rows", "1500", "--acc-reps", "2", "--acc-min-reps", "2",
                        "--acc-eps", "1", "--systems", "smartnoise,pipelinedp,opendp_polars")
    for r in data["speed"]:
        assert r["status"] == "ok", r
    assert {r["system"] for r in data["speed"]} == {"smartnoise", "pipelinedp", "opendp_polars"}
    for r in data["accuracy"]:
        assert r["status"] == "ok", r
        assert r["reps_done"] == 2


def test_report_replaces_only_its_section(tmp_path):
    from report_peers import write_section

    md = tmp_path / "RESULTS.md"
    md.write_text("# Results\n\n## UDF throughput\n\nkeep me\n\n## Benchmarks vs peers\n\nSTALE-PEER-NUMBERS\n\n## Other\n\nkeep too\n")
    write_section({"speed": [], "accuracy": []}, md, [], section="## Benchmarks vs peers")
    text = md.read_text()
    assert "keep me" in text and "keep too" in text and "STALE-PEER-NUMBERS" not in text
    assert text.index("## UDF throughput") < text.index("## Benchmarks vs peers") < text.index("## Other")


def test_quantile_harness_dpch_tiny(tmp_path):
    """bench/bench_quantiles.py, DPCH's part only (no peer virtualenvs), on tiny data."""
    from bench_quantiles import rank_errors

    # midrank: #{x < v} + #{x = v}/2 against α·n
    assert list(rank_errors(np.array([1.0, 2.0, 2.0, 3.0]), [2.0, 0.0, 3.5], 0.5)) == [0.0, 2.0, 2.0]
    out, md = tmp_path / "q.json", tmp_path / "q.md"
    cmd = [sys.executable, str(BENCH / "bench_quantiles.py"), "--systems", "dpch,dpch_joint", "--ns", "300",
           "--dists", "uniform,bimodal", "--eps", "1", "--levels", "0.5,0.9", "--dpch-reps", "4",
           "--time-runs", "1", "--data-dir", str(tmp_path / "data"), "--out", str(out), "--markdown", str(md),
           "--no-install"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert {d["name"] for d in data["datasets"]} == {"uniform_n300", "bimodal_n300"}
    got = {(r["system"], r["dataset"], r["eps"], r["level"]): r for r in data["results"]}
    assert len(got) == len(data["results"]) == 2 * 2 * 2  # systems × datasets × levels
    for (system, _, eps, level), r in got.items():
        assert system in ("dpch", "dpch_joint") and eps == 1.0 and level in (0.5, 0.9)
        assert r["status"] == "ok", r
        err = r["rank_error"]
        assert err["reps"] == 4 and err["in_bounds"]
        for k in ("median", "p90", "mean", "max"):
            assert math.isfinite(err[k]) and 0 <= err[k] <= 300
        assert err["median"] <= err["p90"] <= err["max"]
        assert r["release_s_median"] > 0
    text = md.read_text()
    assert "| data | n | ε | α | dpch | dpch_joint |" in text and "| uniform | 300 | 1 | 0.9 |" in text


def test_partition_peers_dpch_tiny(tmp_path):
    """bench/bench_partition_peers.py, DPCH's part only (no peer virtualenvs), on tiny data; and the
    peer worker's noise tails (bench/partition_peers.py imports only numpy at module level)."""
    from partition_peers import gaussian_tail, laplace_tail

    q = math.exp(-1 / 3.0)  # integer Laplace, scale 3: P[Z = z] = (1 − q)/(1 + q) q^|z|
    tail = laplace_tail(3.0)
    for m in (-4, 0, 1, 5):
        assert tail(m) - tail(m + 1) == pytest.approx((1 - q) / (1 + q) * q ** abs(m))
    assert tail(0) + tail(1) == pytest.approx(1.0) and gaussian_tail(2.0)(-100) == 1.0
    assert gaussian_tail(2.0)(1) + gaussian_tail(2.0)(0) == pytest.approx(1.0)  # symmetric about 0

    out, md = tmp_path / "p.json", tmp_path / "p.md"
    cmd = [sys.executable, str(BENCH / "bench_partition_peers.py"), "--systems", "dpch", "--units", "2000",
           "--keys", "200", "--ks", "1,3", "--budgets", "1:1e-6", "--repeats", "2",
           "--data-dir", str(tmp_path / "data"), "--out", str(out), "--markdown", str(md), "--no-install"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    true_groups = {d["k"]: d["true_groups"] for d in data["datasets"]}
    assert set(true_groups) == {1, 3} and all(n > 0 for n in true_groups.values())
    got = {(r["config"], r["k"]): r for r in data["results"]}
    assert set(got) == {(c, k) for c in ("dpch_auto", "dpch_laplace") for k in (1, 3)}
    for (_, k), r in got.items():
        assert r["status"] == "ok" and len(r["released"]) == 2
        assert r["released"] == r["true_released"] and all(0 <= x <= true_groups[k] for x in r["released"])
        assert 0 < r["expected"] <= true_groups[k] and r["params"]["threshold"] >= 1
    assert got[("dpch_auto", 1)]["params"]["rule"] == "optimal"
    # k = 1: the optimal rule's release probability is pointwise the largest, so never below Laplace's
    assert got[("dpch_auto", 1)]["expected"] >= got[("dpch_laplace", 1)]["expected"]
    text = md.read_text()
    assert '| DPCH `selection="auto"` |' in text and "| true groups |" in text and "k=3, ε=1, δ=1e-06" in text


def test_topk_recall_dpch_tiny(tmp_path):
    """bench/bench_topk.py on tiny data at ε = 50, where both methods must return the true top n
    (peeling: T = 2·n·Δ/(ε/2) <= 0.72 against gaps of dozens of units; post-processing: Laplace
    b <= 3/50), so every recall is exactly 1; the recall's tie rule; auto picks the smaller order
    noise; the markdown has one row per setting."""
    from bench_topk import recall

    counts = {10: 9, 11: 7, 12: 7, 13: 2}
    assert recall([10, 12], counts, [10, 11, 12, 13], 2) == 1.0  # 12 ties with the 2nd largest
    assert recall([13, 99], counts, [10, 11, 12, 13], 2) == 0.0 and recall([11], counts, [10, 11, 12, 13], 2) == 0.5

    out, md = tmp_path / "t.json", tmp_path / "t.md"
    cmd = [sys.executable, str(BENCH / "bench_topk.py"), "--units", "2000", "--keys", "200", "--ks", "3",
           "--ns", "1,3", "--epsilons", "50", "--repeats", "2", "--auto-repeats", "1",
           "--data-dir", str(tmp_path / "data"), "--out", str(out), "--markdown", str(md)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    (ds,) = data["datasets"]
    assert ds["rows"] == 6000 and [c for _, c in ds["top"]] == sorted((c for _, c in ds["top"]), reverse=True)
    got = {(r["keys"], r["query"], r["n"]): r for r in data["rows"]}
    assert set(got) == {(m, q, n) for m, q in (("public", "distinct"), ("public", "rows"), ("selected", "distinct"))
                        for n in (1, 3)}
    for r in got.values():
        assert set(r["methods"]) == {"peeling", "post_processing", "auto"}
        for m in r["methods"].values():
            assert all(0.0 <= x <= 1.0 for x in m["recalls"]) and m["seconds_mean"] > 0
            assert m["recalls"] == [1.0] * m["runs"], r
        scores = r["order_noise_std"]
        assert r["auto_pick"] == min(scores, key=scores.get) and r["verdict"] == "≈"
        assert (r["delta"] > 0) == (r["keys"] == "selected")
    text = md.read_text()
    assert "| public | distinct | 3 | 1 | 50 | 1.000 ± 0.000 | 1.000 ± 0.000 |" in text
    assert "| selected | distinct | 3 | 3 | 50 |" in text and len(text.strip().splitlines()) == 2 + 6


def test_odp_sparse_vector_tiny(tmp_path):
    """bench/bench_odp.py on tiny data: every settled session is charged exactly Lemma 8's cell
    ε1 + (c′/c)·ε2 ≤ the reserved ε (the non-settling accountant keeps ε), the saving is ≥ 0, the
    release after settlement gets ε3′ = ε3 + (ε − spent) and a scale no larger than the worst case's,
    and the markdown has one row per setting in each table."""
    from dpch.svt import svt_epsilons

    out, md = tmp_path / "o.json", tmp_path / "o.md"
    cmd = [sys.executable, str(BENCH / "bench_odp.py"), "--users", "3000", "--segments", "40", "--cs", "3,5",
           "--epsilons", "1", "--repeats", "3", "--accountants", "odp,basic,advanced",
           "--release-draws", "2", "--data-dir", str(tmp_path / "data"), "--out", str(out), "--markdown", str(md)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert [(r["epsilon"], r["c"]) for r in data["rows"]] == [(1.0, 3), (1.0, 5)]
    for r in data["rows"]:
        assert r["true_above"] == 3 and r["repeats"] == 3 and r["reserved"] == 1.0
        cells = svt_epsilons(r["epsilon1"], r["epsilon2"], r["c"])
        assert 0.0 <= r["saving"] < 1.0 and r["spent_settled_mean"] <= r["reserved"] + 1e-12
        for s in r["sessions"]:
            assert 0 <= s["positives"] <= r["c"] and 1 <= s["queries"] <= 40 and s["seconds"] > 0
            if s["accountant"] == "advanced":
                assert s["spent"] == pytest.approx(1.0)  # cannot settle: the worst case stays
                continue
            assert s["spent"] == pytest.approx(cells[s["positives"]], abs=1e-12) and s["spent"] <= 1.0 + 1e-12
            if s["positives"]:
                assert s["eps3_settled"] == pytest.approx(1.0 + (1.0 - s["spent"]), abs=1e-9)
                assert s["scale_settled"] <= s["scale_worst"] * (1 + 1e-6)
                assert len(s["err_settled"]) == len(s["err_worst"]) == 2 * s["positives"]
    lines = md.read_text().strip().splitlines()
    assert sum(1 for x in lines if x.startswith("| 1 | 3 |")) == 2 and sum(1 for x in lines if x.startswith("| 1 | 5 |")) == 2
    assert "ε charged, odp" in lines[0] and "saving (settled)" in lines[0]
