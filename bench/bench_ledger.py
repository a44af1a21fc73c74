"""Ledger charge latency against history length, SQLite and PostgreSQL, with the incremental
accountant state (dpch/ledger/state.py) and with a full recomputation on every charge (the state
never trusted: what every charge did before issue 32 item 5); and several processes charging one
PostgreSQL ledger (issue 32 "Measure").

    .venv/bin/python bench/bench_ledger.py                    # everything (about 10 minutes)
    .venv/bin/python bench/bench_ledger.py --skip-gateways    # latency only
    .venv/bin/python bench/bench_ledger.py --levels 10,1000 --samples 50 --runs 2   # quick

Latency: a fresh ledger per (store, level, mode); `level` prior charges are written in bulk (one
transaction of checksummed charge rows, the budget's totals and state), then `samples` charges of
ε = 2^-20 each are timed one by one, round robin over the levels (the machine's load falls on all
levels alike; "before" runs in its own process afterwards) (each a durable commit: fsync in SQLite, synchronous_commit in
PostgreSQL). PostgreSQL is a local server started by tests/ledger_stores.py (postgres 15, fsync on).

Gateways: `--processes` processes × `--threads` clients (one ledger connection each) charge one
analyst's budget of exactly N queries until it refuses, `--runs` times; then one run in which the
first process is killed with SIGKILL after N/4 answers. Counts answered vs charged.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from dpch.cost import MechanismCost, PrivacyCost  # noqa: E402
from dpch.ledger import ChargeRecord, Ledger, cost_to_json  # noqa: E402
from dpch.ledger import state as incremental  # noqa: E402

EPS = 2.0 ** -20
COST = PrivacyCost((MechanismCost("laplace", 1.0, 1.0 / EPS, EPS, 0.0, None, "COUNT(*)"),))


def fill(led: Ledger, n: int) -> None:
    """n prior charges of the budget (analyst a, dataset d), written in one transaction."""
    led.set_budget("a", "d", 1e9)
    cost_json = cost_to_json(COST)

    def fn(txn):
        row = txn.get_budget("a", "d")
        now = time.time()
        rec = ChargeRecord(0, "a", "d", row.generation, row.accountant, "bulk", EPS, 0.0, None, EPS, 0.0, None,
                           "0" * 64, "bulk", "executed", now, now, cost_json)
        if hasattr(txn.conn, "conn"):  # PostgreSQL: ids from the sequence, rows in one pipelined batch
            from dpch.ledger.records import row_checksum
            from dpch.ledger.sqlite_txn import COLUMNS, _charge_values

            ids = [r[0] for r in txn.conn.execute("SELECT nextval('charges_id_seq') FROM generate_series(1, ?)", (n,))]
            values = [v + [row_checksum(v)] for v in (_charge_values(rec, cid) for cid in ids)]
            with txn.conn.conn.cursor() as cur:
                cur.executemany(f"INSERT INTO charges ({', '.join(COLUMNS['charges'])}) VALUES "
                                f"({', '.join(['%s'] * len(COLUMNS['charges']))})", values)
        else:
            for _ in range(n):
                txn.insert_charge(rec)
        rows = txn.charges("a", "d", row.generation)
        row = replace(row, spent_epsilon=math.fsum(r.effective_epsilon for r in rows), n_charges=len(rows))
        txn.put_budget(row)
        incremental.save(txn, row, incremental.rebuild(led.path, row, rows))
    led.store.transaction(fn)


def _p50_p99(times: list[float]) -> tuple[float, float]:
    times = sorted(times)
    return statistics.median(times), times[min(len(times) - 1, math.ceil(0.99 * len(times)) - 1)]


def latencies(targets: dict[int, object], samples: dict[int, int], full: bool) -> dict[int, tuple[float, float]]:
    """(p50, p99) in ms of one charge after `level` prior charges, for every level at once: the
    ledgers are filled first, then charged in turn (one charge on each level, round robin), so
    that the machine's load falls on every level alike."""
    ledgers = {level: Ledger(t) for level, t in targets.items()}
    times: dict[int, list[float]] = {level: [] for level in targets}
    kept = incremental.stored
    try:
        for level, led in ledgers.items():
            fill(led, level)
        if full:  # never trust the state: every charge re-reads and re-composes the whole history
            incremental.stored = lambda txn, row: None
        for i in range(max(samples.values())):
            for level, led in ledgers.items():
                if i < samples[level]:
                    t = time.perf_counter()
                    led.charge("a", "d", COST, f"q{i}")
                    times[level].append((time.perf_counter() - t) * 1000)
    finally:
        incremental.stored = kept
        for led in ledgers.values():
            led.close()
    return {level: _p50_p99(ts) for level, ts in times.items()}


BEFORE = """
import json, math, os, statistics, sys, time, types
_pkg = types.ModuleType("dpch"); _pkg.__path__ = [os.path.join(sys.argv[1], "dpch")]; sys.modules["dpch"] = _pkg
from dataclasses import replace
from dpch.cost import MechanismCost, PrivacyCost
from dpch.ledger import ChargeRecord, Ledger, cost_to_json
path, level, samples = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
eps = 2.0 ** -20
cost = PrivacyCost((MechanismCost("laplace", 1.0, 1.0 / eps, eps, 0.0, None, "COUNT(*)"),))
led = Ledger(path)
led.set_budget("a", "d", 1e9)
def fn(txn):
    row = txn.get_budget("a", "d"); now = time.time()
    rec = ChargeRecord(0, "a", "d", row.generation, row.accountant, "bulk", eps, 0.0, None, eps, 0.0, None,
                       "0" * 64, "bulk", "executed", now, now, cost_to_json(cost))
    for _ in range(level):
        txn.insert_charge(rec)
    txn.put_budget(replace(row, spent_epsilon=math.fsum([eps] * level), n_charges=level))
led.store.transaction(fn)
times = []
for i in range(samples):
    t = time.perf_counter(); led.charge("a", "d", cost, f"q{i}"); times.append((time.perf_counter() - t) * 1000)
print(json.dumps(sorted(times)))
"""


def latency_before(commit: str, path: Path, level: int, samples: int) -> tuple[float, float]:
    """(p50, p99) in ms with the ledger code of `commit` (before the incremental state; SQLite only)."""
    tree = path.parent / f"before-{commit.replace('^', '_')}"
    if not tree.exists():
        tree.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "dpch"], check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    out = subprocess.run([sys.executable, "-c", BEFORE, str(tree), str(path), str(level), str(samples)], check=True,
                         capture_output=True, text=True, env=dict(os.environ)).stdout
    return _p50_p99(json.loads(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", default="10,1000,100000")
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--full-samples-at-100k", type=int, default=20, help="full recomputation is slow there")
    ap.add_argument("--stores", default="sqlite,postgresql")
    ap.add_argument("--skip-gateways", action="store_true")
    ap.add_argument("--before", default="458f393^", help="commit whose ledger (before the incremental state) "
                                                         "is measured too, SQLite only ('' to skip)")
    ap.add_argument("--processes", type=int, default=3)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--n", type=int, default=400, help="the analyst's budget in queries (gateway runs)")
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the PostgreSQL server on kill too
    from ledger_stores import pg_available, start_pg_server, stop_pg_server

    tmp = Path(tempfile.mkdtemp(prefix="dpch-bench-ledger-"))
    stores = args.stores.split(",")
    server = None
    if "postgresql" in stores:
        reason = pg_available()
        if reason:
            print(f"PostgreSQL skipped: {reason}")
            stores.remove("postgresql")
        else:
            pg_dir = Path(tempfile.mkdtemp(prefix="dpch-bench-pg-"))
            server = start_pg_server(pg_dir, "bench")
    try:
        print("| store | prior charges | incremental p50 / p99 (ms) | full recomputation p50 / p99 (ms) | "
              f"before ({args.before}) p50 / p99 (ms) |")
        print("|---|---:|---:|---:|---:|")
        levels = [int(x) for x in args.levels.split(",")]
        k = 0
        for store in stores:
            result = {}
            for full in (False, True):
                targets = {}
                for level in levels:
                    k += 1
                    targets[level] = tmp / f"l{k}.sqlite" if store == "sqlite" else server.new_schema("bench")
                n = {level: args.full_samples_at_100k if full and level >= 100_000 else args.samples for level in levels}
                for level, (p50, p99) in latencies(targets, n, full).items():
                    result.setdefault(level, []).append(
                        f"{p50:.2f} / {p99:.2f}" + (f" (n={n[level]})" if n[level] != args.samples else ""))
            for level in levels:
                row = result[level]
                if store == "sqlite" and args.before:
                    samples = args.full_samples_at_100k if level >= 100_000 else args.samples
                    k += 1
                    p50, p99 = latency_before(args.before, tmp / f"l{k}.sqlite", level, samples)
                    row.append(f"{p50:.2f} / {p99:.2f}" + (f" (n={samples})" if samples != args.samples else ""))
                else:
                    row.append("-")
                print(f"| {store} | {level:,} | {row[0]} | {row[1]} | {row[2]} |", flush=True)
        if server is not None and not args.skip_gateways:
            from test_ledger_postgres import run_gateways

            url = server.new_schema("gw")
            clients = args.processes * args.threads
            print(f"\n{args.processes} processes x {args.threads} clients = {clients} on one PostgreSQL ledger, "
                  f"budget of exactly N = {args.n} queries")
            print("| run | answered | charged | exactly N | answered ⊆ charged | s | charges/s | retries | errors |")
            print("|---:|---:|---:|---|---|---:|---:|---:|---:|")
            plan = [(f"{i + 1}", None, True) for i in range(args.runs)] + [("kill -9", args.n // 4, True)]
            plan += [(f"no writers' lock {i + 1}", None, False) for i in range(2)]
            for label, kill, turns in plan:
                r = run_gateways(url, processes=args.processes, threads=args.threads, n=args.n, kill_after=kill,
                                 serialize_writers=turns)
                print(f"| {label} | {len(r.answered)} | {len(r.charged)} | {len(r.charged) == args.n} | "
                      f"{set(r.answered) <= set(r.charged)} | {r.seconds:.2f} | {len(r.charged) / r.seconds:.0f} | "
                      f"{r.retries} | {r.errors} |", flush=True)
    finally:
        if server is not None:
            stop_pg_server(server)
            shutil.rmtree(pg_dir, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
