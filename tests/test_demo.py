"""`dpch demo` end to end, as `make demo` runs it (small data; a subprocess because chDB holds one
store per process). Checks that every step ran and that a second run starts from a fresh demo
budget (the reset is recorded), not that any noisy number has a given value."""
from __future__ import annotations

import subprocess
import sys


def _demo(data_dir, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dpch.cli", "demo", "--rows", "20000", "--data-dir", str(data_dir),
                           *args], capture_output=True, text=True, timeout=600)


def test_demo_runs_twice_and_every_step_reports(tmp_path):
    for run in range(2):
        proc = _demo(tmp_path, "--epsilon", "2" if run else "1")
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        out = proc.stdout
        for marker in ("1) SQL functions", "2) Controller", "3) Per-unit projection", "rejected: column 'user_id'",
                       "median with:", "4) Top-n and a sparse-vector session", "answered by",
                       "charged after the output-DP settlement",
                       "5) Robust statistics and early stopping", "by propose-test-release", "refined until",
                       "Total demo time"):
            assert marker in out, (marker, out[-3000:])
        # every budget line after step 3: 8 charges of ε each, within the demo budget
        eps = 2 if run else 1
        assert f"spent ε={8 * eps:g}, δ=0, queries=8" in out, out[-1500:]


def test_demo_rejects_bad_rows(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "dpch.cli", "demo", "--rows", "0", "--data-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--rows must be a positive integer" in proc.stderr
