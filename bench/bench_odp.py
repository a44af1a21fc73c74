"""Output-DP savings of the sparse vector (issue 16; results: bench/RESULTS.md, "Output-DP savings:
sparse vector (issue 16)").

Workload: "which of these S segments exceed T users?". A purchases-like table
(user_id, segment, amount), U users, each in ONE segment (1-5 purchase rows, all in it); the
segment of a user is key j with P[j] ∝ log(1 + 1/j) ≈ 1/j (Zipf(1), deterministic: j = floor(S^u)
for a hash-uniform u), ranks mapped to names by a fixed permutation so the large segments are not
the first ones asked about. The catalog registers user_id as the privacy unit, 1 group and ≤ 5 rows
per unit, amount ∈ [0, 500], so COUNT(DISTINCT user_id) WHERE segment = '<s>' has Δ = 1.

For each ε and max_positives c, R sessions (repeats) each run

    with db.sparse_vector(t, threshold=T, epsilon=ε, max_positives=c) as svt:
        for s in <the S segments, in a random order per repeat>:
            svt.above(f"SELECT COUNT(DISTINCT user_id) FROM t WHERE segment = '{s}'")

until the S queries are asked or c ⊤'s stop the session. T is the midpoint between the k-th and the
(k+1)-th largest true count (k = --true-above, default 3): k segments are truly above it. The
session reserves sup E = ε and settles ε1 + (c′/c)·ε2 for c′ ⊤'s (odp_privacy_accounting.md Alg. 2,
Lemma 8; dpch/svt.py). Repeats cycle over the analysts' accountants (--accountants): "odp" and
"basic" settle (simple composition, Thm 7), "advanced" cannot settle and keeps the worst case ε.
The spent ε is read from the ledger (the charge's realised ε if settled, else its reserved ε).

Second workload (§4.1 "Application"): the analyst's budget is ε + ε3 (ε3 = --release-epsilon × ε);
after the session it releases the noisy counts of the c′ ⊤ segments with db.query, each at ε3′/c′
where ε3′ = what the ledger says remains = ε3 + (c − c′)/c·ε2 under odp/basic. The baseline is the
same release at ε3/c′ (what remains when the session is charged its worst case). Scales are dpch's
calibration (the plan's Laplace scale b, Δ = 1); the noise std is the discrete Laplace's at b; the
error is measured against the true counts over --release-draws draws of each release (the first on
the analyst's own budget, which must fit; the others on a roomy measurement budget).

    python3 bench/bench_odp.py [--users 100000] [--segments 500] [--repeats 6] [--cs 3,5,10]
                               [--epsilons 0.5,1] [--release-draws 10] [--markdown FILE]
"""
from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import dpch  # noqa: E402
from dpch.controller import prepare  # noqa: E402
from dpch.svt import default_split, svt_epsilons  # noqa: E402
from accuracy import discrete_laplace_var  # noqa: E402  (bench/accuracy.py)

_U53 = "9007199254740992"  # 2^53
SETTLING = ("odp", "basic", "pure")


def segment_name(rank: int, segments: int) -> str:
    """A fixed permutation of ranks 1..S to names (coprime multiplier), so rank 1 is not 'seg000'."""
    mult = next(m for m in range(7919, 10 ** 6) if math.gcd(m, segments) == 1)
    return f"seg{(rank * mult) % segments:04d}"


def load(db, users: int, segments: int) -> str:
    table = f"bench_odp.purchases_{users}_{segments}"
    db.command("CREATE DATABASE IF NOT EXISTS bench_odp")
    exists = db.raw_query(f"SELECT count() AS c FROM system.tables WHERE database = 'bench_odp' "
                          f"AND name = '{table.split('.')[1]}'")["c"][0]
    if not exists:
        names = ", ".join(f"'{segment_name(j, segments)}'" for j in range(1, segments + 1))
        rank = (f"toUInt32(least(floor(pow({segments + 1}, (cityHash64(number, 16) % {_U53}) / {_U53}.)), "
                f"{segments}))")
        db.command(f"CREATE TABLE {table} (user_id UInt64, segment String, amount Float64) "
                   f"ENGINE = MergeTree ORDER BY user_id")
        db.command(f"INSERT INTO {table} SELECT number AS user_id, [{names}][{rank}] AS segment, "
                   f"round((cityHash64(number, i, 61) % 50000) / 100., 2) AS amount "
                   f"FROM numbers({users}) ARRAY JOIN range(1 + cityHash64(number, 5) % 5) AS i")
    db.catalog.register(table, privacy_unit="user_id", bounds={"amount": (0.0, 500.0)},
                        max_groups_contributed=1, max_rows_per_unit=5)
    return table


def true_counts(db, table: str) -> dict[str, int]:
    df = db.raw_query(f"SELECT segment, uniqExact(user_id) AS n FROM {table} GROUP BY segment")
    return {str(s): int(n) for s, n in zip(df["segment"], df["n"])}


def count_sql(table: str, segment: str) -> str:
    return f"SELECT COUNT(DISTINCT user_id) AS n FROM {table} WHERE segment = '{segment}'"


def charged(db, analyst: str, table: str) -> float:
    """The ε this analyst's charges count at (basic composition of their own numbers): the
    realised ε of the settled ones + the reserved ε of the others."""
    st = db.ledger.remaining(analyst, table)
    return st.realized_epsilon + st.reserved_epsilon


def release(db, analysts: list[str], table: str, segments: list[str], eps_each: float, truth: dict[str, int]):
    """db.query of each segment's count at eps_each, once per analyst in ``analysts`` (the first is
    the one whose budget the release is for; later ones are measurement repeats on a roomy budget);
    returns (plan scale b, [errors])."""
    db.analyst = analysts[0]
    scale = prepare(db, count_sql(table, segments[0]), epsilon=eps_each).plan.quantities[0].scale
    errors = []
    for who in analysts:
        db.analyst = who
        for s in segments:
            df = db.query(count_sql(table, s), epsilon=eps_each)
            errors.append(float(df["n"].iloc[0]) - truth[s])
    return scale, errors


def run_setting(db, table, truth, all_segments, threshold, over, eps, c, args, rows_out):
    accountants = [a.strip() for a in args.accountants.split(",") if a.strip()]
    eps3 = args.release_epsilon * eps
    sessions = []
    for r in range(args.repeats):
        acc = accountants[r % len(accountants)]
        analyst = f"{acc}_e{eps:g}_c{c}_r{r}_{args.tag}"
        if acc in SETTLING:
            db.ledger.set_budget(analyst, table, epsilon=eps + eps3, delta=0.0, accountant=acc)
        else:  # a non-settling accountant: a roomy budget, only its charge is of interest
            db.ledger.set_budget(analyst, table, epsilon=100 * eps, delta=1e-6, accountant=acc)
        db.analyst = analyst
        order = list(all_segments)
        random.Random(f"{args.seed}-{eps}-{c}-{r}").shuffle(order)  # the workload's order, not DP noise
        t0 = time.perf_counter()
        positives = []
        with db.sparse_vector(table, threshold=threshold, epsilon=eps, max_positives=c) as svt:
            for s in order:
                if svt.above(count_sql(table, s)):
                    positives.append(s)
                    if len(positives) == c:
                        break
        wall = time.perf_counter() - t0
        spent = charged(db, analyst, table)
        tp = sum(1 for s in positives if s in over)
        sess = {"accountant": acc, "positives": len(positives), "queries": svt.queries_run, "seconds": wall,
                "spent": spent, "svt_epsilon_spent": svt.epsilon_spent, "true_positives": tp,
                "precision": tp / len(positives) if positives else None,
                "recall": tp / len(over) if over else None}
        if positives and acc in SETTLING:
            remaining = db.ledger.remaining(analyst, table).remaining.epsilon
            each = remaining * (1 - 1e-9) / len(positives)
            extra = ["baseline_release"] * (args.release_draws - 1)
            b_odp, err_odp = release(db, [analyst] + extra, table, positives, each, truth)
            b_base, err_base = release(db, ["baseline_release"] + extra, table, positives, eps3 / len(positives),
                                       truth)
            sess.update({"eps3_settled": remaining, "eps3_worst": eps3, "scale_settled": b_odp,
                         "scale_worst": b_base, "err_settled": err_odp, "err_worst": err_base})
        sessions.append(sess)
        print(json.dumps({"epsilon": eps, "c": c, "repeat": r, **sess}), flush=True)
    split = default_split(c)
    cells = svt_epsilons(eps * split, eps - eps * split, c)
    settled = [s for s in sessions if s["accountant"] in SETTLING]
    rel = [s for s in settled if "scale_settled" in s]

    def mean(xs):
        xs = [x for x in xs if x is not None]
        return statistics.fmean(xs) if xs else None

    def rmse(key):
        errs = [e for s in rel for e in s[key]]
        return math.sqrt(statistics.fmean(e * e for e in errs)) if errs else None

    by_acc = {a: mean(s["spent"] for s in sessions if s["accountant"] == a) for a in accountants}
    row = {"epsilon": eps, "c": c, "threshold": threshold, "true_above": len(over), "repeats": len(sessions),
           "epsilon1": eps * split, "epsilon2": eps - eps * split, "cells": list(cells), "reserved": eps,
           "spent_settled_mean": mean(s["spent"] for s in settled),
           "spent_by_accountant": by_acc,
           "positives_mean": mean(s["positives"] for s in sessions),
           "positives": [s["positives"] for s in sessions],
           "precision_mean": mean(s["precision"] for s in sessions),
           "recall_mean": mean(s["recall"] for s in sessions),
           "queries_mean": mean(s["queries"] for s in sessions),
           "seconds_mean": mean(s["seconds"] for s in sessions),
           "release_sessions": len(rel),
           "eps3_worst": eps3, "eps3_settled_mean": mean(s["eps3_settled"] for s in rel),
           "scale_worst_mean": mean(s["scale_worst"] for s in rel),
           "scale_settled_mean": mean(s["scale_settled"] for s in rel),
           "scale_ratio_mean": mean(s["scale_settled"] / s["scale_worst"] for s in rel),
           "rmse_worst": rmse("err_worst"), "rmse_settled": rmse("err_settled"),
           "std_worst": mean(math.sqrt(discrete_laplace_var(s["scale_worst"])) for s in rel),
           "std_settled": mean(math.sqrt(discrete_laplace_var(s["scale_settled"])) for s in rel),
           "sessions": sessions}
    sp = row["spent_settled_mean"]
    row["saving"] = None if sp is None else 1 - sp / eps
    rows_out.append(row)
    return row


def _f(x, fmt):
    return "—" if x is None else format(x, fmt)


def markdown(rows, accountants) -> str:
    acc_cols = " | ".join(f"ε charged, {a}" for a in accountants)
    lines = [f"| ε | c | ε1 / ε2 | ε reserved (worst case) | {acc_cols} | saving (settled) | ⊤ (mean) | "
             "precision | recall | queries asked | s / session |",
             "|---|---|---|---|" + "---|" * len(accountants) + "---|---|---|---|---|---|"]
    for r in rows:
        accs = " | ".join(_f(r["spent_by_accountant"].get(a), ".4f") for a in accountants)
        lines.append(f"| {r['epsilon']:g} | {r['c']} | {r['epsilon1']:.3f} / {r['epsilon2']:.3f} | "
                     f"{r['reserved']:.4f} | {accs} | {_f(None if r['saving'] is None else 100 * r['saving'], '.1f')} % | "
                     f"{r['positives_mean']:.2f} | {_f(r['precision_mean'], '.3f')} | {_f(r['recall_mean'], '.3f')} | "
                     f"{r['queries_mean']:.0f} | {r['seconds_mean']:.1f} |")
    lines += ["", "| ε | c | ε3 (worst case charged) | ε3′ (settled, mean) | Laplace b per count, worst case | "
              "b, settled | b ratio (mean per session) | noise std, worst case | std, settled | RMSE, worst case | "
              "RMSE, settled | counts released (× draws) |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        n = sum(len(s["err_settled"]) for s in r["sessions"] if "err_settled" in s)
        ratio = r["scale_ratio_mean"]
        lines.append(f"| {r['epsilon']:g} | {r['c']} | {r['eps3_worst']:.4f} | {_f(r['eps3_settled_mean'], '.4f')} | "
                     f"{_f(r['scale_worst_mean'], '.3f')} | {_f(r['scale_settled_mean'], '.3f')} | {_f(ratio, '.3f')} | "
                     f"{_f(r['std_worst'], '.2f')} | {_f(r['std_settled'], '.2f')} | "
                     f"{_f(r['rmse_worst'], '.2f')} | {_f(r['rmse_settled'], '.2f')} | {n} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--users", type=int, default=100_000)
    ap.add_argument("--segments", type=int, default=500)
    ap.add_argument("--true-above", type=int, default=3, help="k: T lies between the k-th and (k+1)-th count")
    ap.add_argument("--cs", default="3,5,10", help="max_positives values (comma list)")
    ap.add_argument("--epsilons", default="0.5,1", help="session ε values (comma list)")
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--accountants", default="odp,basic,advanced",
                    help="the analysts' accountants, cycled over the repeats (comma list)")
    ap.add_argument("--release-epsilon", type=float, default=1.0, help="ε3 as a multiple of the session's ε")
    ap.add_argument("--release-draws", type=int, default=10,
                    help="draws of each release (the first on the analyst's budget; the rest measure the error)")
    ap.add_argument("--seed", type=int, default=16, help="seed of the query order (workload, not noise)")
    ap.add_argument("--data-dir", default=str(HERE / ".data" / "odp"))
    ap.add_argument("--out", default=str(HERE / "out" / "odp.json"))
    ap.add_argument("--markdown", default=str(HERE / "out" / "odp.md"))
    args = ap.parse_args(argv)
    args.tag = f"{int(time.time() * 1000):x}"  # fresh analysts on each run (the ledger persists)
    t_start = time.time()
    db = dpch.connect(args.data_dir, analyst="bench")
    rows: list[dict] = []
    try:
        table = load(db, args.users, args.segments)
        truth = true_counts(db, table)
        ordered = sorted(truth.values(), reverse=True)
        k = args.true_above
        if len(ordered) <= k:
            raise SystemExit(f"only {len(ordered)} non-empty segments; need more than --true-above = {k}")
        threshold = float(math.floor((ordered[k - 1] + ordered[k]) / 2))
        over = {s for s, n in truth.items() if n >= threshold}
        print(json.dumps({"table": table, "segments": len(truth), "top": ordered[:k + 2], "threshold": threshold,
                          "true_above": len(over)}), flush=True)
        db.ledger.set_budget("baseline_release", table, epsilon=1e12, delta=0.0, accountant="basic")
        all_segments = sorted(truth)
        for eps in [float(x) for x in args.epsilons.split(",") if x.strip()]:
            for c in [int(x) for x in args.cs.split(",") if x.strip()]:
                run_setting(db, table, truth, all_segments, threshold, over, eps, c, args, rows)
    finally:
        db.close()
    accountants = [a.strip() for a in args.accountants.split(",") if a.strip()]
    seconds = time.time() - t_start
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"users": args.users, "segments": args.segments, "repeats": args.repeats,
                                          "seconds": seconds, "rows": rows}, indent=1))
    text = markdown(rows, accountants)
    Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
    Path(args.markdown).write_text(text)
    print(text)
    print(f"total {seconds:.0f} s")


if __name__ == "__main__":
    main()
