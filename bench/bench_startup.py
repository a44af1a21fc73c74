"""Start-up time of the `dpch` command line and of `import dpch` (issue 31, item 2).

    python bench/bench_startup.py [--runs 21] [--importtime-top 12] [--source DIR]

`--source DIR` measures the dpch package of another checkout instead (e.g. the revision before a
change: `git archive REV | tar -x -C DIR`, plus the compiled dpch/*.so), run from DIR.

Each case runs N times as a fresh subprocess (hyperfine is not installed here); the wall time of
each run is taken with time.perf_counter around subprocess.run, and the median and p90 are
reported against the issue's targets. Then `python -X importtime` runs each case once and the
modules with the largest cumulative import time are listed (a table in Markdown), so a regression
names the module that brought the weight back. `dpch budget show` runs on a temporary ledger that
holds one budget, so it reads and prints a real row.

Then the embedded store's open (`dpch.connect(dir)` on an existing store, the imports excluded:
each fresh process imports pandas, chDB and dpch first and times only the call), which every
command that uses the engine pays after its imports. Last, two commands that open the engine but
read only the catalog (`dpch catalog list`, `dpch catalog show`), whole, as a user runs them.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PY = sys.executable
# the installed console script (what a user runs), else the same entry point through -c
_SCRIPT = Path(PY).parent / "dpch"
_ENTRY = [PY, "-c", "import sys; from dpch.cli import main; sys.exit(main())"]
DPCH = [PY, str(_SCRIPT)] if _SCRIPT.exists() else _ENTRY
CWD: str | None = None  # --source: the checkout whose dpch is imported (first on sys.path with -c)


def cases(ledger: Path) -> list[tuple[str, list[str], float]]:
    """(label, argv, target seconds; None: the interpreter's own start, the floor under the others)."""
    return [
        ("python -c pass", [PY, "-c", "pass"], None),
        ("dpch --version", DPCH + ["--version"], 0.3),
        ("dpch --help", DPCH + ["--help"], 0.3),
        ("dpch budget show", DPCH + ["budget", "show", "--ledger", str(ledger)], 1.0),
        ("import dpch", [PY, "-c", "import dpch"], 0.5),
    ]


def time_runs(argv: list[str], runs: int) -> list[float]:
    subprocess.run(argv, capture_output=True, check=True, cwd=CWD)  # warm the page cache once
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(argv, capture_output=True, check=True, cwd=CWD)
        out.append(time.perf_counter() - t0)
    return out


# prints the seconds of one `dpch.connect` on an existing store, the imports done beforehand
_OPEN = ("import sys, time, pandas, chdb, dpch, dpch.connection\n"
         "t = time.perf_counter(); db = dpch.connect(sys.argv[1]); print(time.perf_counter() - t); db.close()")


def store_open_runs(data_dir: Path, runs: int) -> list[float]:
    subprocess.run([PY, "-c", _OPEN, str(data_dir)], capture_output=True, check=True, cwd=CWD)  # creates the store
    return [float(subprocess.run([PY, "-c", _OPEN, str(data_dir)], capture_output=True, text=True, check=True,
                                 cwd=CWD).stdout.split()[-1]) for _ in range(runs)]


# one registered table in the store, for the catalog commands
_SETUP_TABLE = ("import sys, dpch\n"
                "db = dpch.connect(sys.argv[1])\n"
                "db.command('CREATE TABLE IF NOT EXISTS default.t (u UInt64, x Float64) ENGINE = MergeTree ORDER BY u')\n"
                "db.catalog.register('default.t', privacy_unit='u', bounds={'x': (0, 1)}, replace=True)\n"
                "db.close()")


def engine_cases(store: Path) -> list[tuple[str, list[str]]]:
    return [("dpch catalog list", DPCH + ["catalog", "list", "--data-dir", str(store)]),
            ("dpch catalog show default.t", DPCH + ["catalog", "show", "default.t", "--data-dir", str(store)])]


def p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10, method="inclusive")[-1]


def importtime(argv: list[str], top: int) -> list[tuple[int, int, str]]:
    """(cumulative µs, self µs, module) of the `top` slowest top-level-or-nested imports."""
    r = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], capture_output=True, text=True, check=True, cwd=CWD)
    rows, seen = [], set()
    for line in r.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        self_us, cum_us, name = (part.strip() for part in line[len("import time:"):].split("|"))
        if name.strip() not in seen:  # a module can be reported twice (a retried import)
            seen.add(name.strip())
            rows.append((int(cum_us), int(self_us), name))
    return sorted(rows, reverse=True)[:top]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=21)
    ap.add_argument("--importtime-top", type=int, default=12)
    ap.add_argument("--source", default=None, help="a checkout whose dpch to measure (default: the installed one)")
    args = ap.parse_args()
    global DPCH, CWD
    if args.source:
        DPCH, CWD = _ENTRY, str(Path(args.source).resolve())
    with tempfile.TemporaryDirectory() as tmp:
        ledger = Path(tmp) / "ledger.sqlite"
        subprocess.run(DPCH + ["budget", "set", "--analyst", "alice", "--dataset", "demo.purchases",
                               "--epsilon", "1", "--ledger", str(ledger)], capture_output=True, check=True, cwd=CWD)
        print(f"dpch from {CWD or 'the installed package'}; {args.runs} runs each, Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
              f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}\n")
        print("| command | median (s) | p90 (s) | target (s) | met |")
        print("|---|---|---|---|---|")
        ok = True
        for label, argv, target in cases(ledger):
            t = time_runs(argv, args.runs)
            med, hi = statistics.median(t), p90(t)
            met = "-" if target is None else "yes" if med < target else "NO"
            ok &= met != "NO"
            print(f"| `{label}` | {med:.3f} | {hi:.3f} | {target or '-'} | {met} |")
        store = Path(tmp) / "store"
        t = store_open_runs(store, args.runs)
        print(f"\nThe embedded store's open (`dpch.connect(dir)` on an existing store, imports excluded): median "
              f"{statistics.median(t):.3f} s, p90 {p90(t):.3f} s")
        subprocess.run([PY, "-c", _SETUP_TABLE, str(store)], capture_output=True, check=True, cwd=CWD)
        print("\nCommands that open the engine and read the catalog only (no target):\n")
        print("| command | median (s) | p90 (s) |")
        print("|---|---|---|")
        for label, argv in engine_cases(store):
            t = time_runs(argv, args.runs)
            print(f"| `{label}` | {statistics.median(t):.3f} | {p90(t):.3f} |")
        for label, argv, target in cases(ledger):
            if target is None:
                continue
            print(f"\n`python -X importtime` for `{label}`, largest cumulative first:\n")
            print("| module | cumulative (ms) | self (ms) |")
            print("|---|---|---|")
            for cum, self_us, name in importtime(argv, args.importtime_top):
                print(f"| `{name.strip()}` | {cum / 1000:.1f} | {self_us / 1000:.1f} |")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
