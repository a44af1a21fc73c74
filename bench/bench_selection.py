"""Partition selection benchmark (issue 15; results: bench/RESULTS.md, "Partition selection (issue 15)").

Data: U privacy units over K keys with a Zipf(1) key distribution (deterministic: key = floor(K^u)
for a hash-uniform u, so P[key = j] ∝ log(1 + 1/j) ≈ 1/j). Two families:

- ``zipf``: k keys drawn per unit (k = 1: one row per unit; k = 5: five rows, duplicates merge), so
  nearly every unit fills its k groups;
- ``mixed`` (k > 1): a unit draws g_u = min(k, ⌊1/v⌋) keys (v hash-uniform in (0, 1]: P[g_u >= m]
  = 1/m, half the units in one group), duplicates merge: the skewed case the weighted Gaussian
  (Gopi et al. 2020) is for.

The query is

    SELECT key, COUNT(DISTINCT user_id) AS n FROM bench_sel.<table> GROUP BY key

with max_groups_contributed = k, so every true group has n distinct units and no public domain: the
controller must select partitions privately, and the selection's noisy count is the released n,
so the whole (ε, δ) is the selection's. The weighted Gaussian's statistic is not a count (an output
COUNT(DISTINCT) would need its own budget share), so its rows run the keys-only query
``SELECT key FROM … GROUP BY key``, whose selection has the same whole (ε, δ); "auto, keys only" is
what auto picks for that query (at k > 1 it may pick the weighted rule). For each (ε, δ) and rule
("laplace" = the rule DPCH used before issue 15, "auto" = what it uses now, and each rule forced)
the table reports

- expected released groups: Σ_g p(s_g) over the true groups g, with the rule's release
  probability p of the group's statistic s_g: its count n_g, or for the weighted rule the exact
  Int64 weight sum the engine computes (the rewritten query with noise and selection off,
  rewrite_for_sensitivity_check, read once per weight scale S). Exact for the optimal and Laplace
  rules, floating-point sums of the discrete Gaussian for the Gaussian ones: perfectly stable;
- measured: the mean number of groups released by db.query over --repeats runs (the engine and
  the kernel's samplers end to end), which must agree with the expectation (zipf k = 1 and 5,
  mixed k = 5; for the --expected-only k values only the exact expectation).

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
KS = (1, 5)  # zipf: measured end to end (the others: expectations only)
MIXED_MEASURED = (5,)
ANALYST = "bench"
_U53 = "9007199254740992"  # 2^53


def load(db, units: int, keys: int, k: int, family: str = "zipf") -> str:
    prefix = "z" if family == "zipf" else "m"
    table = f"bench_sel.{prefix}{k}_{units}_{keys}"
    db.command("CREATE DATABASE IF NOT EXISTS bench_sel")
    exists = db.raw_query(f"SELECT count() AS c FROM system.tables WHERE database = 'bench_sel' "
                          f"AND name = '{table.split('.')[1]}'")["c"][0]
    if not exists:
        # zipf: k draws per unit; mixed: g_u = min(k, floor(1/v)) draws, v uniform in (0, 1]
        draws = str(k) if family == "zipf" else \
            f"toUInt32(least({k}, floor({_U53}. / (cityHash64(number, 77) % {_U53} + 1))))"
        db.command(f"CREATE TABLE {table} (user_id UInt64, key UInt32) ENGINE = MergeTree ORDER BY user_id")
        db.command(f"INSERT INTO {table} SELECT number AS user_id, "
                   f"toUInt32(least(floor(pow({keys}, (cityHash64(number, i, 15) % {_U53}) / {_U53}.)), "
                   f"{keys - 1})) AS key FROM numbers({units}) ARRAY JOIN range({draws}) AS i")
    db.catalog.register(table, privacy_unit="user_id", max_groups_contributed=k, max_rows_per_unit=k)
    db.ledger.set_budget(ANALYST, table, epsilon=1e12, delta=0.999)
    return table


def true_counts(db, table: str) -> list[int]:
    df = db.raw_query(f"SELECT uniqExact(user_id) AS n FROM {table} GROUP BY key")
    return [int(x) for x in df["n"]]


def _hist(values) -> dict[int, int]:
    hist: dict[int, int] = {}
    for n in values:
        hist[n] = hist.get(n, 0) + 1
    return hist


def expected_released(sel, counts: list[int]) -> float:
    return sum(m * sel.release_probability(n) for n, m in _hist(counts).items())


def weight_sums(db, plan) -> dict[int, int]:
    """The histogram {weight sum: groups} of the weighted rule's statistic, as the engine computes
    it (the plan's rewritten query with noise and selection off: a trusted owner's measurement)."""
    from dpch.rewrite import rewrite_for_sensitivity_check

    q = plan.quantities[plan.selection.quantity]
    df = db.raw_query(rewrite_for_sensitivity_check(plan).sql)
    return _hist(int(x) for x in df[f"{q.noisy_column}_out"])


def expected_weighted(sel, hist: dict[int, int]) -> float:
    return sum(m * sel.rule.release_probability_weight(w) for w, m in hist.items())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--units", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--expected-only", default="2,10", help="zipf k values with expectations only (comma list)")
    ap.add_argument("--mixed", default="2,5,10", help="k values of the mixed family (comma list; '' for none)")
    ap.add_argument("--data-dir", default=str(HERE / ".data" / "selection"))
    ap.add_argument("--out", default=str(HERE / "out" / "selection.json"))
    ap.add_argument("--markdown", default=str(HERE / "out" / "selection.md"))
    args = ap.parse_args()
    t0 = time.time()
    db = dpch.connect(args.data_dir, analyst=ANALYST)
    rows = []
    try:
        extra = [int(x) for x in args.expected_only.split(",") if x.strip()]
        mixed = [int(x) for x in args.mixed.split(",") if x.strip()]
        work = [("zipf", k, k in KS) for k in sorted(set(KS) | set(extra))] + \
            [("mixed", k, k in MIXED_MEASURED) for k in mixed if k > 1]
        for family, k, measure in work:
            table = load(db, args.units, args.keys, k, family)
            counts = true_counts(db, table)
            sql = f"SELECT key, COUNT(DISTINCT user_id) AS n FROM {table} GROUP BY key"
            keys_sql = f"SELECT key FROM {table} GROUP BY key"
            rules = ["laplace", "auto"] + (["optimal", "gaussian", "weighted_gaussian", "auto_keys"] if k > 1 else [])
            sums_by_scale: dict[int, dict[int, int]] = {}
            for eps, delta in BUDGETS:
                base = gauss = None
                for rule in rules:
                    query = keys_sql if rule in ("weighted_gaussian", "auto_keys") else sql
                    option = "auto" if rule == "auto_keys" else rule
                    plan = prepare(db, query, epsilon=eps, delta=delta, selection=option).plan
                    sel = plan.selection
                    if sel.rule_name == "weighted_gaussian":
                        s = sel.rule.weight_scale
                        if s not in sums_by_scale:
                            sums_by_scale[s] = weight_sums(db, plan)
                        exp = expected_weighted(sel, sums_by_scale[s])
                    else:
                        exp = expected_released(sel, counts)
                    runs = []
                    for _ in range(args.repeats if measure else 0):
                        runs.append(len(db.query(query, epsilon=eps, delta=delta, selection=option)))
                    if rule == "laplace":
                        base = exp
                    if rule == "gaussian":
                        gauss = exp
                    row = {"family": family, "k": k, "epsilon": eps, "delta": delta, "rule": rule,
                           "chosen": sel.rule_name, "threshold": sel.threshold, "true_groups": len(counts),
                           "weight_scale": sel.rule.weight_scale, "expected": exp,
                           "measured_mean": statistics.fmean(runs) if runs else None, "measured": runs,
                           "gain_vs_laplace": exp / base - 1 if base else 0.0,
                           "gain_vs_gaussian": exp / gauss - 1 if gauss else None}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    finally:
        db.close()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"units": args.units, "keys": args.keys, "repeats": args.repeats,
                                          "seconds": time.time() - t0, "rows": rows}, indent=1))
    lines = ["| data | k | ε | δ | rule (chosen) | T (ρ/S) | true groups | expected released | measured (mean of "
             f"{args.repeats}) | vs old (Laplace) | vs Gaussian |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        name = {"auto": f"auto ({r['chosen']})", "auto_keys": f"auto, keys only ({r['chosen']})"}.get(r["rule"], r["rule"])
        gain = "—" if r["rule"] == "laplace" else f"{100 * r['gain_vs_laplace']:+.1f} %"
        vs_g = "—" if r["gain_vs_gaussian"] is None or r["rule"] == "gaussian" else f"{100 * r['gain_vs_gaussian']:+.1f} %"
        measured = "—" if r["measured_mean"] is None else f"{r['measured_mean']:.1f}"
        t = f"{r['threshold'] / r['weight_scale']:.2f}" if r["weight_scale"] else str(r["threshold"])
        lines.append(f"| {r['family']} | {r['k']} | {r['epsilon']:g} | {r['delta']:g} | {name} | {t} | "
                     f"{r['true_groups']} | {r['expected']:.1f} | {measured} | {gain} | {vs_g} |")
    Path(args.markdown).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"total {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
