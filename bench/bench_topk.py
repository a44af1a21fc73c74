"""Noisy top-n recall against the true top n (issue 15; results: bench/RESULTS.md, "Noisy top-k recall
(issue 15)").

Data: U privacy units over K keys with Zipf(1)-like key popularity. Every unit has exactly k distinct
keys and one row per key (k rows): its keys are the first k distinct values of 3k + 8 hash-uniform
draws key = floor((K + 1)^u) - 1 (P[key = j] ∝ log((j + 2)/(j + 1)) ≈ 1/(j + 1.5)), topped up, in the
rare case of fewer than k distinct draws, from k consecutive keys at a hashed offset. The load checks
that every unit has exactly k distinct keys and k rows.

The table is registered with max_groups_contributed = k and max_rows_per_unit = k. Contribution
bounding changes counts only when a unit has more than k keys (or rows): it keeps k of them. Here no
unit has, so the bounded counts are the raw counts, and the truth is the raw per-key distinct-unit
count from db.raw_query (equal to the per-key row count, checked). The true top n is the set of keys
whose count is >= the n-th largest count (ties at the boundary all count as hits).

Queries, over n ∈ {1, 5, 10} and ε ∈ {0.1, 0.5, 1}:

    SELECT key, COUNT(DISTINCT user_id) AS n FROM t GROUP BY key ORDER BY n DESC LIMIT {n}   ("distinct")
    SELECT key, COUNT(*) AS n FROM t GROUP BY key ORDER BY n DESC LIMIT {n}                  ("rows")

- keys = "public": the key column's public domain (all K keys) is registered, δ = 0; both queries.
- keys = "selected": the same data in a table without public keys, δ = 1e-6: the candidates are the
  groups released by private partition selection; the "distinct" query only.

Recall = |released keys ∩ true top n| / n (a release with fewer than n rows loses the missing ones).
Methods, all through db.query on a huge budget (db.ledger.set_budget):

- peeling (top_k="peeling"): --repeats releases per (setting, n).
- post_processing (top_k="post_processing"): --repeats releases of LIMIT max(n) per setting, whose
  first n rows are the top-n release for each n. The post-processing plan does not depend on n (every
  group's value is noised and the noisy values sorted; LIMIT only truncates): the script checks, by
  explain, that LIMIT n plans the same noise and the same selection for every n, so the prefix of a
  LIMIT-10 release has exactly the distribution of a LIMIT-n release. This saves 2/3 of those queries.
- auto (the default, top_k="auto"): the planner's choice is data-independent (dpch.plan.top_k: the
  smaller standard deviation of the noise that decides the order), so auto's releases have the
  distribution of the method it picks. The pick and both order-noise scores come from explain; auto
  itself runs --auto-repeats times per (setting, n) to check, from the result metadata, that it runs
  the method explain names, and to time it; its own recall over those few runs is reported too.

A row marks auto ✗ when the method it did not pick had a higher mean recall by more than 2 standard
errors of the difference (✓ when the pick is better by that margin, ≈ otherwise). Times are the wall
time of db.query (controller + engine + ledger), mean per release.

    python3 bench/bench_topk.py [--units 50000] [--keys 10000] [--repeats 20] [--markdown FILE]

Cost: 81 cells × (20 peeling + 2 auto releases) + 27 × 20 post-processing releases = 2322 db.query
calls; their time is the bounding of k·U rows (k = 20 dominates). --units 50000 took 877 s under a
load average of 5–8 on this 2-core machine, --units 5000 233 s; --units 200000 makes each k = 20
release 2–4 s, about an hour in all.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import dpch  # noqa: E402

ANALYST = "bench"
DELTA_SELECTED = 1e-6
QUERIES = {"distinct": "COUNT(DISTINCT user_id)", "rows": "COUNT(*)"}
METHODS = ("peeling", "post_processing")


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def load(db, units: int, keys: int, k: int, seed: int) -> dict[str, str]:
    """The two tables of one k (same rows): "public" (public key domain) and "selected" (none)."""
    db.command("CREATE DATABASE IF NOT EXISTS bench_topk")
    base = f"z{k}_{units}_{keys}_{seed}"
    tables = {"public": f"bench_topk.{base}", "selected": f"bench_topk.{base}_sel"}
    exists = db.raw_query(f"SELECT count() AS c FROM system.tables WHERE database = 'bench_topk' "
                          f"AND name IN ('{base}', '{base}_sel')")["c"][0]
    if exists != 2:
        for t in tables.values():
            db.command(f"DROP TABLE IF EXISTS {t}")
            db.command(f"CREATE TABLE {t} (user_id UInt64, key UInt32) ENGINE = MergeTree ORDER BY user_id")
        zipf = (f"toUInt32(least(floor(pow({keys + 1}, (cityHash64(number, i, {seed}) % 9007199254740992) "
                f"/ 9007199254740992.)), {keys}) - 1)")
        fill = f"arrayMap(j -> toUInt32((cityHash64(number, {seed}, 7) + j) % {keys}), range({k}))"
        db.command(f"INSERT INTO {tables['public']} SELECT number AS user_id, key FROM numbers({units}) "
                   f"ARRAY JOIN arraySlice(arrayDistinct(arrayConcat(arrayMap(i -> {zipf}, range({3 * k + 8})), "
                   f"{fill})), 1, {k}) AS key")
        db.command(f"INSERT INTO {tables['selected']} SELECT * FROM {tables['public']}")
    check = db.raw_query(f"SELECT min(c) AS lo, max(c) AS hi, min(d) AS dlo, max(d) AS dhi, count() AS u FROM "
                         f"(SELECT user_id, count() AS c, uniqExact(key) AS d FROM {tables['selected']} GROUP BY user_id)")
    got = [int(check[c][0]) for c in ("lo", "hi", "dlo", "dhi", "u")]
    if got != [k, k, k, k, units]:
        raise SystemExit(f"{tables['selected']}: rows/distinct keys per unit (min, max) and units {got}, "
                         f"expected [{k}, {k}, {k}, {k}, {units}]; drop bench_topk in the data dir")
    db.catalog.register(tables["public"], privacy_unit="user_id", max_groups_contributed=k, max_rows_per_unit=k,
                        public_keys={"key": list(range(keys))})
    db.catalog.register(tables["selected"], privacy_unit="user_id", max_groups_contributed=k, max_rows_per_unit=k)
    for t in tables.values():
        db.ledger.set_budget(ANALYST, t, epsilon=1e15, delta=0.999)
    return tables


def true_counts(db, table: str) -> dict[int, int]:
    df = db.raw_query(f"SELECT key, uniqExact(user_id) AS u, count() AS c FROM {table} GROUP BY key")
    if any(int(u) != int(c) for u, c in zip(df["u"], df["c"])):
        raise SystemExit(f"{table}: a unit has two rows with one key")
    return {int(key): int(u) for key, u in zip(df["key"], df["u"])}


def recall(released, counts: dict[int, int], ranked: list[int], n: int) -> float:
    """|released ∩ true top n| / n, a key tied with the n-th largest count counting as a hit."""
    cut = counts[ranked[n - 1]] if len(ranked) >= n else 0
    hits = sum(1 for key in set(int(x) for x in released) if counts.get(key, 0) >= cut and key in counts)
    return min(hits, n) / n


def _stats(xs: list[float]) -> tuple[float, float]:
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def _plan_signature(expl) -> tuple:
    """What the released values' noise depends on (explain; LIMIT must not change it)."""
    q = tuple((x["label"], x["mechanism"], round(x["noise_scale"], 9), round(x["epsilon"], 12)) for x in expl.quantities)
    s = expl.selection
    return q, None if s is None else (s["rule"], s["threshold"], s["epsilon"], s["delta"])


def verdict(pick: dict, other: dict) -> str:
    """✗ when the method auto did not pick has a higher mean recall by > 2 standard errors."""
    se = math.sqrt(pick["sd"] ** 2 / pick["runs"] + other["sd"] ** 2 / other["runs"])
    diff = pick["mean"] - other["mean"]
    if diff < -2 * se and diff < 0:
        return "✗"
    if diff > 2 * se and diff > 0:
        return "✓"
    return "≈"


def run_setting(db, table: str, keymode: str, qname: str, k: int, eps: float, ns: list[int], counts, ranked,
                repeats: int, auto_repeats: int) -> list[dict]:
    delta = DELTA_SELECTED if keymode == "selected" else 0.0
    agg = QUERIES[qname]
    sql = {n: f"SELECT key, {agg} AS n FROM {table} GROUP BY key ORDER BY n DESC LIMIT {n}" for n in ns}
    nmax = max(ns)
    # post-processing: one LIMIT max(n) release per repeat serves every n (its plan does not depend on n)
    sigs = {_plan_signature(db.explain(sql[n], epsilon=eps, delta=delta, top_k="post_processing")) for n in ns}
    if len(sigs) != 1:
        raise SystemExit(f"post-processing plans differ across LIMIT n for {sql[nmax]}: {sigs}")
    rec = {("post_processing", n): [] for n in ns}
    size = {("post_processing", n): [] for n in ns}  # rows released (fewer than n: too few selected)
    times = {"post_processing": []}
    for _ in range(repeats):
        t0 = time.perf_counter()
        df = db.query(sql[nmax], epsilon=eps, delta=delta, top_k="post_processing")
        times["post_processing"].append(time.perf_counter() - t0)
        assert df.attrs["dpch"]["top_k"]["method"] == "post_processing"
        keys_out = [int(x) for x in df["key"]]
        for n in ns:
            rec[("post_processing", n)].append(recall(keys_out[:n], counts, ranked, n))
            size[("post_processing", n)].append(min(n, len(keys_out)))
    rows = []
    for n in ns:
        expl = db.explain(sql[n], epsilon=eps, delta=delta)
        facts = expl.top_k or {}
        pick = facts.get("method", "post_processing")
        scores = facts.get("order_noise_std") or {}
        thresholds = {m: (db.explain(sql[n], epsilon=eps, delta=delta, top_k=m).selection or {}).get("threshold")
                      for m in METHODS} if keymode == "selected" else None
        out = {"keys": keymode, "query": qname, "k": k, "n": n, "epsilon": eps, "delta": delta,
               "selection_threshold": thresholds,
               "true_nth": counts[ranked[n - 1]], "true_gap_n": counts[ranked[n - 1]] - counts[ranked[n]],
               "order_noise_std": scores, "auto_pick": pick, "methods": {}}
        peel, peel_t, peel_n = [], [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            df = db.query(sql[n], epsilon=eps, delta=delta, top_k="peeling")
            peel_t.append(time.perf_counter() - t0)
            meta = df.attrs["dpch"]["top_k"]
            assert meta["method"] == "peeling", meta
            peel.append(recall(df["key"], counts, ranked, n))
            peel_n.append(len(df))
        auto, auto_t, auto_n = [], [], []
        for _ in range(auto_repeats):
            t0 = time.perf_counter()
            df = db.query(sql[n], epsilon=eps, delta=delta)
            auto_t.append(time.perf_counter() - t0)
            ran = df.attrs["dpch"]["top_k"]["method"]
            if ran != pick:
                raise SystemExit(f"auto ran {ran} but explain said {pick}: {sql[n]}")
            auto.append(recall(df["key"], counts, ranked, n))
            auto_n.append(len(df))
        for name, xs, ts, rs in (("peeling", peel, peel_t, peel_n),
                                 ("post_processing", rec[("post_processing", n)], times["post_processing"],
                                  size[("post_processing", n)]),
                                 ("auto", auto, auto_t, auto_n)):
            if not xs:
                continue
            mean, sd = _stats(xs)
            out["methods"][name] = {"mean": mean, "sd": sd, "runs": len(xs), "recalls": xs,
                                    "released_rows_mean": statistics.fmean(rs),
                                    "seconds_mean": statistics.fmean(ts), "seconds": ts}
        other = "post_processing" if pick == "peeling" else "peeling"
        out["verdict"] = verdict(out["methods"][pick], out["methods"][other])
        rows.append(out)
        print(json.dumps({key: v for key, v in out.items() if key != "methods"}
                         | {m: [round(r["mean"], 3), round(r["sd"], 3), round(r["seconds_mean"], 3)]
                            for m, r in out["methods"].items()}), flush=True)
    return rows


def markdown(rows: list[dict], repeats: int, auto_repeats: int) -> str:
    lines = [f"| keys | query | k | n | ε | peeling recall | post-processing recall | auto picks (order noise std "
             f"peel / post) | auto's own recall ({auto_repeats} runs) | auto's pick | rows released peel / post "
             "| s/query peel / post / auto |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m = r["methods"]
        sc = r["order_noise_std"]
        scores = f" ({sc['peeling']:.3g} / {sc['post_processing']:.3g})" if sc else ""
        auto = m.get("auto")
        lines.append(
            f"| {r['keys']} | {r['query']} | {r['k']} | {r['n']} | {r['epsilon']:g} | "
            f"{m['peeling']['mean']:.3f} ± {m['peeling']['sd']:.3f} | "
            f"{m['post_processing']['mean']:.3f} ± {m['post_processing']['sd']:.3f} | "
            f"{r['auto_pick'].replace('_', '-')}{scores} | "
            f"{'—' if auto is None else format(auto['mean'], '.3f')} | {r['verdict']} | "
            f"{m['peeling']['released_rows_mean']:.1f} / {m['post_processing']['released_rows_mean']:.1f} | "
            f"{m['peeling']['seconds_mean']:.2f} / {m['post_processing']['seconds_mean']:.2f} / "
            f"{'—' if auto is None else format(auto['seconds_mean'], '.2f')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--units", type=int, default=50_000)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--ks", default="1,5,20", help="keys per unit (comma list)")
    ap.add_argument("--ns", default="1,5,10", help="LIMIT n (comma list)")
    ap.add_argument("--epsilons", default="0.1,0.5,1")
    ap.add_argument("--queries", default="distinct,rows", help="queries with public keys: distinct, rows")
    ap.add_argument("--selected-queries", default="distinct",
                    help="queries without public keys at δ = 1e-6 (partition selection); empty: none")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--auto-repeats", type=int, default=2)
    ap.add_argument("--seed", type=int, default=16)
    ap.add_argument("--data-dir", default=str(HERE / ".data" / "topk"))
    ap.add_argument("--out", default=str(HERE / "out" / "topk.json"))
    ap.add_argument("--markdown", default=str(HERE / "out" / "topk.md"))
    args = ap.parse_args(argv)
    ks, ns, epsilons = _ints(args.ks), sorted(_ints(args.ns)), _floats(args.epsilons)
    settings = [("public", q) for q in args.queries.split(",") if q.strip()]
    settings += [("selected", q) for q in args.selected_queries.split(",") if q.strip()]
    for _, q in settings:
        if q not in QUERIES:
            raise SystemExit(f"unknown query {q!r}: one of {', '.join(QUERIES)}")
    if min(ns) < 1 or args.repeats < 2:
        raise SystemExit("n >= 1 and --repeats >= 2")
    t0 = time.time()
    load_before = os.getloadavg()
    db = dpch.connect(args.data_dir, analyst=ANALYST)
    rows, datasets = [], []
    try:
        for k in ks:
            tables = load(db, args.units, args.keys, k, args.seed)
            counts = true_counts(db, tables["public"])
            ranked = sorted(counts, key=lambda key: -counts[key])
            if len(ranked) <= max(ns):
                raise SystemExit(f"k = {k}: only {len(ranked)} keys have units; lower --ns or raise --units")
            datasets.append({"k": k, "rows": args.units * k, "keys_with_units": len(ranked),
                             "top": [[key, counts[key]] for key in ranked[:max(ns) + 1]]})
            db.query(f"SELECT COUNT(*) AS n FROM {tables['public']}", epsilon=1.0)  # warm-up, untimed
            for keymode, q in settings:
                for eps in epsilons:
                    rows += run_setting(db, tables[keymode], keymode, q, k, eps, ns, counts, ranked,
                                        args.repeats, args.auto_repeats)
    finally:
        db.close()
    seconds = time.time() - t0
    cmd = "python3 bench/bench_topk.py " + " ".join(sys.argv[1:] if argv is None else argv)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"units": args.units, "keys": args.keys, "repeats": args.repeats,
                                          "auto_repeats": args.auto_repeats, "seed": args.seed, "command": cmd,
                                          "seconds": seconds,
                                          "loadavg_1_5_15": {"start": load_before, "end": os.getloadavg()},
                                          "cpus": os.cpu_count(), "datasets": datasets, "rows": rows}, indent=1))
    text = markdown(rows, args.repeats, args.auto_repeats)
    Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
    Path(args.markdown).write_text(text)
    print(text)
    print(f"total {seconds:.0f} s (load average at start {load_before[0]:.1f}, at end {os.getloadavg()[0]:.1f}, "
          f"{os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
