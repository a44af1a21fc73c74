"""Gateway overhead: p50/p99 latency of one DP query through `dpch serve` (HTTP, auth, routing,
ClickHouse-rendered TabSeparated output) vs the same query in-process (`db.query`), and
queries/s with 8 concurrent HTTP clients, on the embedded engine.

Side by side: the gateway serves one copy of the data directory and this process opens another
(chDB holds one store per process), and the two paths alternate query by query, so both see the
same machine load and ledgers of the same length (a charge reads the analyst's history).

    .venv/bin/python bench/bench_gateway.py [--rows 20000] [--n 300]
"""
from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SQL = "SELECT region, COUNT(*) AS n FROM demo.purchases GROUP BY region"


def cli(*args, stdin=None):
    subprocess.run([sys.executable, "-m", "dpch.cli", *args], input=stdin, text=True, check=True, cwd=ROOT,
                   capture_output=True)


def pct(xs, p):
    return float(np.percentile(np.array(xs) * 1e3, p))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=20000)
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--clients", type=int, default=8)
    args = ap.parse_args()
    dirs = [Path(tempfile.mkdtemp(prefix="dpch_bench_gw_")) for _ in range(2)]
    for d in dirs:  # the demo data are deterministic: two identical stores
        cli("demo", "--data-dir", str(d), "--rows", str(args.rows))
        cli("users", "add", "bench", "--password-stdin", "--data-dir", str(d), stdin="bench-password\n")
        cli("budget", "set", "--data-dir", str(d), "--analyst", "bench", "--dataset", "demo.purchases",
            "--epsilon", "1e9")
    d, local_dir = dirs

    import dpch

    db = dpch.connect(local_dir, analyst="bench")

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "dpch.cli", "serve", "--data-dir", str(d), "--port", str(port)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/"
    try:
        for _ in range(100):
            try:
                httpx.get(url + "ping")
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        params = {"dpch_epsilon": "0.01"}
        local, remote = [], []
        with httpx.Client(auth=("bench", "bench-password")) as c:
            for i in range(20 + args.n):
                t0 = time.perf_counter()
                db.query(SQL, epsilon=0.01)
                t1 = time.perf_counter()
                c.post(url, params=params, content=SQL).raise_for_status()
                t2 = time.perf_counter()
                if i >= 20:  # warm-up done
                    local.append(t1 - t0)
                    remote.append(t2 - t1)
        done = [0]
        lock = threading.Lock()
        per_client = max(args.n // args.clients, 20)

        def client():
            with httpx.Client(auth=("bench", "bench-password")) as c:
                for _ in range(per_client):
                    c.post(url, params=params, content=SQL).raise_for_status()
                    with lock:
                        done[0] += 1
        ts = [threading.Thread(target=client) for _ in range(args.clients)]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        qps = done[0] / (time.perf_counter() - t0)
    finally:
        db.close()
        proc.terminate()
        proc.wait(timeout=30)
    print(f"query: {SQL}  (ε=0.01 each, {args.rows} rows, embedded engine, n={args.n})")
    print(f"in-process db.query : p50 {pct(local, 50):7.2f} ms  p99 {pct(local, 99):7.2f} ms")
    print(f"through the gateway : p50 {pct(remote, 50):7.2f} ms  p99 {pct(remote, 99):7.2f} ms")
    print(f"gateway overhead    : p50 {pct(remote, 50) - pct(local, 50):7.2f} ms  p99 {pct(remote, 99) - pct(local, 99):7.2f} ms"
          f"  (median of paired differences {float(np.median(np.array(remote) - np.array(local))) * 1e3:.2f} ms)")
    print(f"{args.clients} clients           : {qps:7.1f} queries/s ({done[0]} queries)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
