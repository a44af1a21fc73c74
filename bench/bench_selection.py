"""Partition selection benchmark (issue 15; results: bench/RESULTS.md, "Partition selection (issue 15)").

Data: U privacy units over K keys with a Zipf(1) key distribution (deterministic: key = floor(K^u)
for a hash-uniform u, so P[key = j] ∝ log(1 + 1/j) ≈ 1/j), k keys drawn per unit (k = 1: one row per
unit; k = 5: five rows, duplicates merge). The query is

    SELECT key, COUNT(DISTINCT user_id) AS n FROM bench_sel.z<k> GROUP BY key

with max_groups_contributed = k, so every true group has n distinct units and no public domain: the
controller must select partitions privately. For each (ε, δ) and rule ("laplace" = the rule DPCH
used before issue 15, "auto" = what it uses now, and each new rule forced) the table reports

- expected released groups: Σ_g p(n_g) over the true groups g, with the rule's exact release
  probability p (dpch.plan.selection; exact, so perfectly stable);
- measured: the mean number of groups released by db.query over --repeats runs (the engine and
  the kernel's sampler end to end), which must agree with the expectation (k = 1 and 5; for the
  --expected-only k, 2 and 10, only the exact expectation: it checks that "auto" picks the rule
  that releases the most groups).

    python3 bench/bench_selection.py [--units 1000000] [--keys 100000] [--repeats 3] [--markdown FILE]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import dpch  # noqa: E402
from dpch.controller import prepare  # noqa: E402

BUDGETS = [(0.1, 1e-6), (0.5, 1e-6), (1.0, 1e-6), (1.0, 1e-9), (2.0, 1e-6)]
KS = (1, 5)
ANALYST = "bench"


def load(db, units: int, keys: int, k: int) -> str:
    table = f"bench_sel.z{k}_{units}_{keys}"
    db.command("CREATE DATABASE IF NOT EXISTS bench_sel")
    exists = db.raw_query(f"SELECT count() AS c FROM system.tables WHERE database = 'bench_sel' "
                          f"AND name = '{table.split('.')[1]}'")["c"][0]
    if not exists:
        db.command(f"CREATE TABLE {table} (user_id UInt64, key UInt32) ENGINE = MergeTree ORDER BY user_id")
        db.command(f"INSERT INTO {table} SELECT number AS user_id, "
                   f"toUInt32(least(floor(pow({keys}, (cityHash64(number, i, 15) % 9007199254740992) / 9007199254740992.)), "
                   f"{keys - 1})) AS key FROM numbers({units}) ARRAY JOIN range({k}) AS i")
    db.catalog.register(table, privacy_unit="user_id", max_groups_contributed=k, max_rows_per_unit=k)
    db.ledger.set_budget(ANALYST, table, epsilon=1e12, delta=0.999)
    return table


def true_counts(db, table: str) -> list[int]:
    df = db.raw_query(f"SELECT uniqExact(user_id) AS n FROM {table} GROUP BY key")
    return [int(x) for x in df["n"]]


def expected_released(sel, counts: list[int]) -> float:
    hist: dict[int, int] = {}
    for n in counts:
        hist[n] = hist.get(n, 0) + 1
    return sum(m * sel.release_probability(n) for n, m in hist.items())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--units", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--expected-only", default="2,10", help="k values with expectations only (comma list)")
    ap.add_argument("--data-dir", default=str(HERE / ".data" / "selection"))
    ap.add_argument("--out", default=str(HERE / "out" / "selection.json"))
    ap.add_argument("--markdown", default=str(HERE / "out" / "selection.md"))
    args = ap.parse_args()
    t0 = time.time()
    db = dpch.connect(args.data_dir, analyst=ANALYST)
    rows = []
    try:
        extra = [int(x) for x in args.expected_only.split(",") if x.strip()]
        for k in sorted(set(KS) | set(extra)):
            measure = k in KS
            table = load(db, args.units, args.keys, k)
            counts = true_counts(db, table)
            sql = f"SELECT key, COUNT(DISTINCT user_id) AS n FROM {table} GROUP BY key"
            rules = ["laplace", "auto"] + (["optimal", "gaussian"] if k > 1 else [])
            for eps, delta in BUDGETS:
                base = None
                for rule in rules:
                    sel = prepare(db, sql, epsilon=eps, delta=delta, selection=rule).plan.selection
                    exp = expected_released(sel, counts)
                    runs = []
                    for _ in range(args.repeats if measure else 0):
                        runs.append(len(db.query(sql, epsilon=eps, delta=delta, selection=rule)))
                    if rule == "laplace":
                        base = exp
                    row = {"k": k, "epsilon": eps, "delta": delta, "rule": rule, "chosen": sel.rule_name,
                           "threshold": sel.threshold, "true_groups": len(counts), "expected": exp,
                           "measured_mean": statistics.fmean(runs) if runs else None, "measured": runs,
                           "gain_vs_laplace": exp / base - 1 if base else 0.0}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    finally:
        db.close()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"units": args.units, "keys": args.keys, "repeats": args.repeats,
                                          "seconds": time.time() - t0, "rows": rows}, indent=1))
    lines = ["| k | ε | δ | rule (chosen) | T | true groups | expected released | measured (mean of "
             f"{args.repeats}) | vs old (Laplace) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        name = r["rule"] if r["rule"] != "auto" else f"auto ({r['chosen']})"
        gain = "—" if r["rule"] == "laplace" else f"{100 * r['gain_vs_laplace']:+.1f} %"
        measured = "—" if r["measured_mean"] is None else f"{r['measured_mean']:.1f}"
        lines.append(f"| {r['k']} | {r['epsilon']:g} | {r['delta']:g} | {name} | {r['threshold']} | {r['true_groups']} | "
                     f"{r['expected']:.1f} | {measured} | {gain} |")
    Path(args.markdown).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"total {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
