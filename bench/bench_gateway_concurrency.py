"""The gateway under concurrent analysts (issue 33, item 3).

One ``dpch serve`` (embedded engine, ``--engine-sessions`` 4 by default), one analyst per client:

1. queries/s of light DP queries with 1, 8 and 32 closed-loop clients (each sends its next query
   when the previous one is answered), and their p50/p99 latency;
2. the same 32 clients while one more analyst starts a heavy DP query every second (open loop:
   started on time whether or not the previous one ended): the light queries' p50/p99 with and
   without that load (goal: loaded p99 <= 3x unloaded p99), and /ping's p99 meanwhile.

Light: ``SELECT region, COUNT(*) GROUP BY region`` over ``bench.light`` (20 000 rows). Heavy:
``SELECT region, SUM(amount), AVG(amount) GROUP BY region`` over ``bench.heavy`` (``--heavy-rows``,
default 2 M rows, 200 000 users). ε = 0.001 each, budgets large.

    .venv/bin/python bench/bench_gateway_concurrency.py [--seconds 20] [--heavy-rows 2000000] [--sessions 4,1]

``--sessions 4,1`` (default) runs every phase on a gateway with 4 engine sessions, then on one with 1
(the one-engine-thread gateway of before), in one run: the ratios side by side under the same load.
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

REGIONS = ["north", "south", "east", "west", "centre", "coast", "hills", "islands"]
LIGHT = "SELECT region, COUNT(*) AS n FROM bench.light GROUP BY region"
HEAVY = "SELECT region, SUM(amount) AS s, AVG(amount) AS a FROM bench.heavy GROUP BY region"
PARAMS = {"dpch_epsilon": "0.001"}
N_USERS = 32

_BUILD = """
import sys
import dpch
db = dpch.connect(sys.argv[1], analyst="bench")
regions = "[" + ",".join("'" + r + "'" for r in sys.argv[3].split(",")) + "]"
db.command("CREATE DATABASE IF NOT EXISTS bench")
for name, rows in (("light", 20000), ("heavy", int(sys.argv[2]))):
    db.command(f"CREATE TABLE bench.{name} (user_id UInt64, region String, amount Float64) "
               "ENGINE = MergeTree ORDER BY (region, user_id)")
    db.command(f"INSERT INTO bench.{name} SELECT intDiv(number, 10), {regions}[cityHash64(intDiv(number, 10)) % 8 + 1], "
               f"round(500 * pow((cityHash64(number) % 1000000) / 1e6, 3), 2) FROM numbers({rows})")
    db.catalog.register(f"bench.{name}", privacy_unit="user_id", bounds={"amount": (0, 500)},
                        max_rows_per_unit=10, public_keys={"region": sys.argv[3].split(",")})
db.close()
"""


def build(d: Path, heavy_rows: int) -> list[str]:
    subprocess.run([sys.executable, "-c", _BUILD, str(d), str(heavy_rows), ",".join(REGIONS)], check=True, cwd=ROOT)
    from dpch.ledger import Ledger
    from dpch.users import UserStore

    users, ledger = UserStore(d), Ledger(d / "ledger.sqlite")
    names = [f"a{i:02d}" for i in range(N_USERS)] + ["heavy"]
    for n in names:
        users.add(n, f"{n}-password")
        for t in ("bench.light", "bench.heavy"):
            ledger.set_budget(n, t, 1e9)
    ledger.close()
    return names


def start_gateway(data_dir: Path, *flags: str) -> tuple[subprocess.Popen, str]:
    """``dpch serve`` on a free port over ``data_dir``, answering /ping: (process, base URL)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "dpch.cli", "serve", "--data-dir", str(data_dir), "--port",
                             str(port), *flags], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/"
    for _ in range(600):
        try:
            httpx.get(url + "ping")
            break
        except httpx.HTTPError:
            time.sleep(0.1)
    return proc, url


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q / 100 * len(xs)))] if xs else float("nan")


def closed_loop(url: str, users: list[str], seconds: float, heavy: bool) -> dict:
    """``users`` clients sending LIGHT in a closed loop for ``seconds``; with ``heavy``, one HEAVY
    started every second by the user 'heavy', and a /ping every 0.2 s."""
    stop = time.perf_counter() + seconds
    lat: list[float] = []
    heavy_lat: list[float] = []
    heavy_refused: list[int] = []
    pings: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()

    def client(user):
        with httpx.Client(auth=(user, f"{user}-password"), timeout=120) as c:
            while time.perf_counter() < stop:
                t0 = time.perf_counter()
                r = c.post(url, params=PARAMS, content=LIGHT)
                dt = time.perf_counter() - t0
                with lock:
                    (lat.append(dt * 1e3) if r.status_code == 200 else errors.append(r.text[:120]))

    def one_heavy():
        t0 = time.perf_counter()
        r = httpx.post(url, params=PARAMS, content=HEAVY, auth=("heavy", "heavy-password"), timeout=120)
        with lock:
            if r.status_code == 200:
                heavy_lat.append((time.perf_counter() - t0) * 1e3)
            elif r.headers.get("X-ClickHouse-Exception-Code") == "202":  # the heavy user's cap
                heavy_refused.append(1)
            else:
                errors.append("heavy: " + r.text[:120])

    def heavy_sender():
        started = []
        t_next = time.perf_counter()
        while t_next < stop:
            th = threading.Thread(target=one_heavy)
            th.start()
            started.append(th)
            t_next += 1.0
            time.sleep(max(0.0, t_next - time.perf_counter()))
        for th in started:
            th.join()

    def pinger():
        with httpx.Client(timeout=30) as c:
            while time.perf_counter() < stop:
                t0 = time.perf_counter()
                c.get(url + "ping")
                pings.append((time.perf_counter() - t0) * 1e3)
                time.sleep(0.2)

    threads = [threading.Thread(target=client, args=(u,)) for u in users] + [threading.Thread(target=pinger)]
    if heavy:
        threads.append(threading.Thread(target=heavy_sender))
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return {"n": len(lat), "qps": len(lat) / seconds, "p50": pct(lat, 50), "p99": pct(lat, 99),
            "ping_p99": pct(pings, 99), "heavy_n": len(heavy_lat), "heavy_refused": len(heavy_refused),
            "heavy_p50": statistics.median(heavy_lat) if heavy_lat else float("nan"), "errors": errors[:3],
            "n_errors": len(errors), "wall": wall}


def run_phases(d: Path, users: list[str], sessions: int, seconds: float, heavy_cap: int | None) -> None:
    cap = () if heavy_cap is None else ("--max-concurrent-queries-for-user", f"heavy={heavy_cap}")
    proc, url = start_gateway(d, "--engine-sessions", str(sessions), *cap)
    label = f"{sessions}" + ("" if heavy_cap is None else f", heavy user capped at {heavy_cap}")
    try:
        for u in users + ["heavy"]:  # warm: first queries import the planner, make probe tables, fill caches
            for sql in (LIGHT, HEAVY) if u == "heavy" else (LIGHT,):
                httpx.post(url, params=PARAMS, content=sql, auth=(u, f"{u}-password"), timeout=120).raise_for_status()
        res = {}
        for name, n, heavy in (("1 client", 1, False), ("8 clients", 8, False), ("32 clients", 32, False),
                               ("32 clients + 1 heavy/s", 32, True)):
            r = closed_loop(url, users[:n], seconds, heavy)
            res[name] = r
            hv = f"{r['heavy_n']} ({r['heavy_p50']:.0f})" + (f", {r['heavy_refused']} refused (202)"
                                                              if r["heavy_refused"] else "") if heavy else "-"
            print(f"| {label} | {name} | {r['qps']:.1f} | {r['p50']:.1f} | {r['p99']:.1f} | {r['ping_p99']:.1f} | "
                  f"{hv} | {r['n_errors']} |" + (f" {r['errors']}" if r["errors"] else ""), flush=True)
        a, b = res["32 clients"], res["32 clients + 1 heavy/s"]
        print(f"| {label} | loaded / unloaded (32 clients) | | {b['p50'] / a['p50']:.2f}x | {b['p99'] / a['p99']:.2f}x "
              f"| | | |", flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--heavy-rows", type=int, default=2_000_000)
    ap.add_argument("--sessions", default="4,1", help="engine sessions, comma-separated: one gateway each, in turn")
    ap.add_argument("--heavy-cap", type=int, default=None,
                    help="--max-concurrent-queries-for-user heavy=N on the gateway (the heavy user's cap)")
    args = ap.parse_args()
    d = Path(tempfile.mkdtemp(prefix="dpch_bench_gwc_"))
    users = build(d, args.heavy_rows)[:N_USERS]
    print(f"load: {' '.join(f'{x:.1f}' for x in os.getloadavg())} (2 cores, shared with other agents)")
    print(f"{args.seconds:g} s per phase, heavy table {args.heavy_rows} rows\n")
    print("| engine sessions | phase | light q/s | light p50 ms | light p99 ms | /ping p99 ms | heavy done (p50 ms) "
          "| errors |\n|---|---|---:|---:|---:|---:|---:|---:|")
    for sessions in [int(x) for x in args.sessions.split(",")]:
        run_phases(d, users, sessions, args.seconds, args.heavy_cap)
    print(f"load after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
