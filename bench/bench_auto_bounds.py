"""Bounds from the data (issue 29, "Measure"; results: bench/RESULTS.md, section "Auto bounds (issue 29)").

For each query of a 14-query workload over three datasets in one embedded store (bench/.data/auto-bounds):

- newcomer: 7 628 users with geometric(mean 6.6) orders each, capped at 60 (numpy seed 29), columns
  country (4), month (12), amount in [0, 200); catalog bounds = the README's k = 1, M = 10;
- tpch: TPC-H at --sf (tpchgen-cli, bench/bench_tpch.py's helpers), customer the unit, catalog
  bounds = bench/tpch/schema.py's (orders M = 34, k = 5; lineitem M = 149, k = 7);
- hits: the ClickBench-style table (bench/clickbench/schema.py, Zipf users), UserID the unit,
  catalog bounds k = 5, M = 100;

the relative error |released - truth| / |truth| (truth: the plain SQL on the raw table; grouped
queries: the mean over the groups), median over --runs runs at each ε of:

- defaults: the catalog's bounds (real db.query runs);
- auto: ``max_rows_per_unit="auto", max_groups_contributed="auto"`` (real runs; ε includes the
  auto share);
- oracle: the best fixed (k, M) on the √2 grid (dpch.plan.profile.GRID up to the data's largest
  per-unit count), found with the true data. Each candidate's error is computed, not run: the
  query's bounded answer with noise off (dpch.rewrite.rewrite_for_sensitivity_check, one engine run
  per candidate, independent of ε) plus the plan's noise (each quantity's Laplace scale, drawn in
  numpy; AVG = centre + grid·(U + noise)/(C + noise), clamped to the value bounds), the median over
  --runs draws, averaged over --mc replicates. The model is checked against the real runs at the
  default bounds (column "model@defaults").

The k dimension: with public keys and the Laplace mechanism the plan's noise does not depend on k
(one unit's L1 contribution is at most M rows whatever k is; checked per query below, "k-free"),
and a larger k only keeps more rows, so the oracle searches M on the grid with k = the number of
groups (a k-dependent plan would be searched over k as well).

    python3 bench/bench_auto_bounds.py [--sf 0.1] [--hits-rows 1000000] [--runs 20] [--out F.json] [--markdown F.md]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import dpch  # noqa: E402
from dpch.controller import prepare  # noqa: E402
from dpch.plan.profile import GRID  # noqa: E402
from dpch.rewrite import rewrite_for_sensitivity_check  # noqa: E402

import bench_tpch  # noqa: E402
from clickbench import schema as cb_schema  # noqa: E402
from tpch import schema as tpch_schema  # noqa: E402

EPSILONS = (0.25, 1.0)
NC = "newcomer.orders"
NC_KEYS = {"country": ["US", "DE", "FR", "CA"], "month": list(range(1, 13))}
ORACLE_GOAL, DEFAULTS_GOAL = 1.5, 1.10


@dataclass(frozen=True)
class Q:
    name: str
    dataset: str  # the budget's dataset (the unit's table)
    sql: str
    keys: tuple[str, ...] = ()


def workload(hits: str) -> list[Q]:
    o, li, c = "tpch.orders", "tpch.lineitem", "tpch.customer"
    return [
        Q("N1 count", NC, f"SELECT COUNT(*) AS n FROM {NC}"),
        Q("N2 count by month", NC, f"SELECT month, COUNT(*) AS n FROM {NC} GROUP BY month", ("month",)),
        Q("N3 count by country", NC, f"SELECT country, COUNT(*) AS n FROM {NC} GROUP BY country", ("country",)),
        Q("N4 sum", NC, f"SELECT SUM(amount) AS s FROM {NC}"),
        Q("N5 avg", NC, f"SELECT AVG(amount) AS a FROM {NC}"),
        Q("N6 count where", NC, f"SELECT COUNT(*) AS n FROM {NC} WHERE country = 'US' AND amount >= 50"),
        Q("N7 sum by month", NC, f"SELECT month, SUM(amount) AS s FROM {NC} GROUP BY month", ("month",)),
        Q("T1 orders by segment", c, f"SELECT c_mktsegment, COUNT(*) AS n FROM {o} JOIN {c} "
          "ON o_custkey = c_custkey GROUP BY c_mktsegment", ("c_mktsegment",)),
        Q("T2 revenue since 1995", c, f"SELECT SUM(l_extendedprice) AS s FROM {li} JOIN {o} "
          "ON l_orderkey = o_orderkey WHERE o_orderdate >= '1995-01-01'"),
        Q("T3 sum by priority", c, f"SELECT o_orderpriority, SUM(o_totalprice) AS s FROM {o} JOIN {c} "
          "ON o_custkey = c_custkey GROUP BY o_orderpriority", ("o_orderpriority",)),
        Q("T4 avg quantity", c, f"SELECT AVG(l_quantity) AS a FROM {li} JOIN {o} ON l_orderkey = o_orderkey"),
        Q("H1 count", hits, f"SELECT COUNT(*) AS n FROM {hits}"),
        Q("H2 count where", hits, f"SELECT COUNT(*) AS n FROM {hits} WHERE AdvEngineID <> 0"),
        Q("H3 avg width", hits, f"SELECT AVG(ResolutionWidth) AS a FROM {hits}"),
    ]


# -- data -------------------------------------------------------------------------------------------
def build_newcomer(db, seed: int = 29) -> dict:
    counts = np.minimum(np.random.default_rng(seed).geometric(1 / 6.6, 7628), 60)
    arr = ",".join(map(str, counts.tolist()))
    db.command("CREATE DATABASE IF NOT EXISTS newcomer")
    db.command(f"DROP TABLE IF EXISTS {NC}")
    db.command(f"CREATE TABLE {NC} (user_id UInt64, country String, month UInt8, amount Float64) "
               "ENGINE = MergeTree ORDER BY user_id")
    db.command(f"INSERT INTO {NC} SELECT u, ['US', 'DE', 'FR', 'CA'][1 + cityHash64(u, i) % 4], "
               "1 + cityHash64(i, u, 3) % 12, (cityHash64(u, i, 7) % 20000) / 100 FROM ("
               f"SELECT u - 1 AS u, arrayJoin(range(n)) AS i FROM (SELECT arrayJoin(arrayEnumerate([{arr}])) AS u, "
               f"[{arr}][u] AS n))")
    return {"users": len(counts), "rows": int(counts.sum()), "mean": round(float(counts.mean()), 2),
            "p90": float(np.percentile(counts, 90)), "max": int(counts.max())}


def open_store(root: Path, sf: str, hits_rows: int):
    """One store with the three datasets (built once, then cached), the catalog registered and a
    large budget on each dataset (the bench measures error, not budget)."""
    store = root / "auto-bounds"
    store.mkdir(parents=True, exist_ok=True)
    marker = store / "built.json"
    info = json.loads(marker.read_text()) if marker.exists() else {}
    db = dpch.connect(str(store), analyst="bench")
    if "newcomer" not in info:
        info["newcomer"] = build_newcomer(db)
    if info.get("tpch_sf") != sf:
        parquet = bench_tpch.generate(sf, root / f"tpch-sf{sf}")
        info["tpch_rows"] = tpch_schema.create_and_load(db, root / f"tpch-sf{sf}" / "parquet", "float")
        info["tpch_sf"], info["tpch_generation"] = sf, parquet
    if info.get("hits_rows") != hits_rows:
        cb_schema.build(db, hits_rows, hits_rows // 10)
        info["hits_rows"] = hits_rows
    marker.write_text(json.dumps(info))
    if NC in db.catalog:
        db.catalog.drop(NC)
    db.catalog.register(NC, privacy_unit="user_id", bounds={"amount": (0, 200)}, max_rows_per_unit=10,
                        max_groups_contributed=1, public_keys=NC_KEYS)
    tpch_schema.register(db)
    cb_schema.register(db)
    for ds in (NC, "tpch.customer", cb_schema.TABLE):
        db.ledger.set_budget(db.analyst, ds, epsilon=1e9, delta=0.5)
        db.ledger.reset(db.analyst, ds, confirm=True)
    return db, info


# -- scoring ----------------------------------------------------------------------------------------
def _aligned(df, truth, q: Q) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(released, true) values of the aggregate columns, groups aligned on the keys (a group missing
    from the release counts as 0)."""
    cols = [c for c in truth.columns if c not in q.keys]
    if q.keys:
        t = truth.set_index(list(q.keys)).sort_index()
        d = df.set_index(list(q.keys)).reindex(t.index)
        return d[cols].to_numpy(dtype=float), t[cols].to_numpy(dtype=float), cols
    return df[cols].to_numpy(dtype=float)[:1], truth[cols].to_numpy(dtype=float)[:1], cols


def rel_error(released: np.ndarray, true: np.ndarray) -> float:
    """Mean over groups (and aggregate columns) of |released - truth| / |truth|."""
    released = np.nan_to_num(released, nan=0.0)
    return float(np.mean(np.abs(released - true) / np.abs(true)))


def _quiet_query(db, sql, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return db.query(sql, **kw)


def measured(db, q: Q, truth, eps: float, runs: int, **bounds) -> dict:
    """Median relative error of ``runs`` real DP releases (and the auto choices, if any)."""
    errs, choices = [], []
    for _ in range(runs):
        df = _quiet_query(db, q.sql, epsilon=eps, **bounds)
        errs.append(rel_error(*_aligned(df, truth, q)[:2]))
        if "bias" in df.attrs and df.attrs["bias"].get("choices"):
            choices.append({c["name"]: c["value"] for c in df.attrs["bias"]["choices"]})
    return {"error": float(np.median(errs)), "choices": choices}


# -- the oracle's error model ------------------------------------------------------------------------
@dataclass
class Candidate:
    """One (k, M): the noise-off answer and the plan's noise, per ε."""
    k: int
    m: int
    noiseless: object  # DataFrame
    plans: dict  # ε -> Plan


def candidate(db, q: Q, k: int, m: int) -> Candidate:
    plans = {eps: prepare(db, q.sql, epsilon=eps, max_rows_per_unit=m, max_groups_contributed=k).plan
             for eps in EPSILONS}
    noiseless = db.raw_query(rewrite_for_sensitivity_check(plans[EPSILONS[0]]).sql)
    return Candidate(k, m, noiseless, plans)


def noise_signature(plan) -> tuple:
    return tuple(round(qt.scale * qt.grid, 9) for qt in plan.quantities if qt.released)


def simulate(c: Candidate, q: Q, truth, eps: float, runs: int, mc: int, rng) -> float:
    """The expected median (over ``runs`` releases) relative error of candidate c at ε, by Monte Carlo
    over ``mc`` replicates of the plan's Laplace noise added to the noise-off answer."""
    plan = c.plans[eps]
    t = truth.set_index(list(q.keys)).sort_index() if q.keys else truth
    d = c.noiseless.set_index(list(q.keys)).reindex(t.index) if q.keys else c.noiseless
    cols = [col for col in truth.columns if col not in q.keys]
    n_groups = len(t)
    shape = (mc, runs, n_groups)
    err = np.zeros(shape)
    for out in plan.bound.outputs:
        if out.name not in cols:
            continue
        ap = plan.aggregates[out.ref]
        parts = {role: plan.quantities[i] for role, i in ap.roles.items()}
        if any(p.mechanism != "laplace" for p in parts.values()):
            raise NotImplementedError(f"{q.name}: model only for Laplace ({[p.mechanism for p in parts.values()]})")
        true = t[out.name].to_numpy(dtype=float)
        if set(parts) == {"sum", "count"}:
            qs, qc = parts["sum"], parts["count"]
            u = np.nan_to_num(d[f"{qs.noisy_column}_out"].to_numpy(dtype=float))
            n = np.nan_to_num(d[f"{qc.noisy_column}_out"].to_numpy(dtype=float))
            base = qs.centre + qs.grid * u / np.maximum(n, 1)
            assert np.allclose(base, d[out.name].to_numpy(dtype=float), rtol=1e-6), (q.name, "AVG model")
            noisy = (qs.centre + qs.grid * (u + rng.laplace(0, qs.scale, shape))
                     / np.maximum(n + rng.laplace(0, qc.scale, shape), 1))
            lo, hi = ap.value_interval
            noisy = np.clip(noisy, lo, hi)
        elif len(parts) == 1:
            (p,) = parts.values()
            base = np.nan_to_num(d[out.name].to_numpy(dtype=float))
            noisy = base + rng.laplace(0, p.scale * p.grid, shape)
            if p.kind == "rows":
                noisy = np.maximum(noisy, 0)
        else:
            raise NotImplementedError(f"{q.name}: roles {sorted(parts)}")
        err += np.abs(noisy - true) / np.abs(true) / len(cols)
    return float(np.mean(np.median(err.mean(axis=2), axis=1)))


def oracle(db, q: Q, truth, runs: int, mc: int, m_max: int, n_groups: int, rng) -> dict:
    ms = [m for m in GRID if m <= m_max] + [next(m for m in GRID if m >= m_max)]
    ms = sorted(set(ms))
    k = next(g for g in GRID if g >= max(n_groups, 1))
    out = {"k": k, "candidates": {}, "k_free": None}
    cands = {m: candidate(db, q, k, m) for m in ms}
    if q.keys:  # the plan's noise at k = 1 equals that at k = #groups: k costs no noise
        sig_1 = noise_signature(candidate(db, q, 1, ms[len(ms) // 2]).plans[1.0])
        out["k_free"] = sig_1 == noise_signature(cands[ms[len(ms) // 2]].plans[1.0])
    for eps in EPSILONS:
        errs = {m: simulate(c, q, truth, eps, runs, mc, rng) for m, c in cands.items()}
        best = min(errs, key=errs.get)
        out["candidates"][eps] = errs
        out[eps] = {"m": best, "error": errs[best]}
    return out


def unit_maxima(db, q: Q, unit_sql: str) -> tuple[int, int]:
    """Largest rows per unit and distinct groups per unit in q's relation (plain SQL on the true data;
    used only to bound the oracle's search)."""
    return tuple(int(x) for x in db.raw_query(unit_sql).iloc[0])


UNIT_SQL = {
    "N": f"SELECT max(c), max(g) FROM (SELECT count() c, uniqExact(month) g FROM {NC} GROUP BY user_id)",
    "T1": "SELECT max(c), 1 FROM (SELECT count() c FROM tpch.orders GROUP BY o_custkey)",
    "T3": ("SELECT max(c), max(g) FROM (SELECT count() c, uniqExact(o_orderpriority) g FROM tpch.orders "
           "GROUP BY o_custkey)"),
    "T2": ("SELECT max(c), 1 FROM (SELECT count() c FROM tpch.lineitem JOIN tpch.orders ON l_orderkey = o_orderkey "
           "GROUP BY o_custkey)"),
    "H": f"SELECT max(c), 1 FROM (SELECT count() c FROM {cb_schema.TABLE} GROUP BY UserID)",
}
UNIT_SQL["T4"] = UNIT_SQL["T2"]


def unit_sql_for(q: Q) -> str:
    head = q.name.split()[0]
    return UNIT_SQL.get(head, UNIT_SQL.get(head[0]))


# -- report -----------------------------------------------------------------------------------------
def _pct(x: float) -> str:
    return f"{100 * x:.3g} %"


def _chosen(choices: list[dict], name: str) -> str:
    vals = sorted(c[name] for c in choices if name in c)
    return f"{int(np.median(vals))} [{vals[0]}–{vals[-1]}]" if vals else "–"


def markdown(results: list[dict]) -> str:
    """One row per query and ε; auto's chosen M as median [min–max] over the runs and how many runs
    chose M above the data's largest rows per unit (the bound cuts nothing there, only adds noise)."""
    lines = ["| query | ε | defaults | model@defaults | auto | auto's M: median [range] | runs M > max | "
             "oracle (M) | auto/oracle | auto/defaults |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        for eps in EPSILONS:
            e = r["eps"][str(eps)]
            ch = e["auto_choices"]
            over = sum(1 for c in ch if c.get("max_rows_per_unit", 0) > next(g for g in GRID if g >= r["max_rows_per_unit"]))
            flag_o = "" if e["auto_over_oracle"] <= ORACLE_GOAL else " ✗"
            flag_d = "" if e["auto_over_defaults"] <= DEFAULTS_GOAL else " ✗"
            lines.append(f"| {r['name']} | {eps} | {_pct(e['defaults'])} | {_pct(e['model_defaults'])} | "
                         f"{_pct(e['auto'])} | {_chosen(ch, 'max_rows_per_unit')} | {over}/{len(ch)} | "
                         f"{_pct(e['oracle'])} (M {e['oracle_m']}) | "
                         f"{e['auto_over_oracle']:.2f}{flag_o} | {e['auto_over_defaults']:.2f}{flag_d} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sf", default="0.1")
    ap.add_argument("--hits-rows", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--mc", type=int, default=200, help="Monte Carlo replicates of the oracle's error model")
    ap.add_argument("--queries", default=None, help="comma-separated name prefixes (e.g. N1,T2)")
    ap.add_argument("--data-root", default=str(HERE / ".data"))
    ap.add_argument("--out", default=None)
    ap.add_argument("--markdown", default=None)
    ap.add_argument("--table-from", default=None, help="print the table of an earlier --out JSON and exit")
    args = ap.parse_args(argv)
    if args.table_from:
        print(markdown([r for r in json.loads(Path(args.table_from).read_text())["results"] if "error" not in r]))
        return 0
    t_start = time.perf_counter()
    db, info = open_store(Path(args.data_root), args.sf, args.hits_rows)
    print(f"store ready in {time.perf_counter() - t_start:.1f} s: {info}", flush=True)
    rng = np.random.default_rng(2029)
    qs = workload(cb_schema.TABLE)
    if args.queries:
        wanted = [w.strip() for w in args.queries.split(",")]
        qs = [q for q in qs if any(q.name.startswith(w) for w in wanted)]
    results = []
    try:
        for q in qs:
            try:
                results.append(run_one(db, q, args, rng))
            except Exception as e:  # recorded, not hidden: a failure is a finding of the bench
                results.append({"name": q.name, "sql": q.sql, "error": f"{type(e).__name__}: {e}"})
                print(f"{q.name}: FAILED {type(e).__name__}: {e}", flush=True)
                continue
            r = results[-1]
            print(markdown([r]).splitlines()[-2:], f"({r['seconds']} s)", flush=True)
    finally:
        db.close()
    done = [r for r in results if "error" not in r]
    table = markdown(done)
    print(table)
    fails_o = [(r["name"], e) for r in done for e, v in r["eps"].items() if v["auto_over_oracle"] > ORACLE_GOAL]
    fails_d = [(r["name"], e) for r in done for e, v in r["eps"].items() if v["auto_over_defaults"] > DEFAULTS_GOAL]
    summary = {"queries": len(done), "failed": [(r["name"], r["error"]) for r in results if "error" in r],
               "auto_within_1.5x_oracle": 2 * len(done) - len(fails_o),
               "auto_within_10pct_of_defaults": 2 * len(done) - len(fails_d),
               "misses_oracle": fails_o, "misses_defaults": fails_d,
               "seconds": round(time.perf_counter() - t_start, 1)}
    print(json.dumps(summary))
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "store": info, "summary": summary,
                                              "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                                          "loadavg": os.getloadavg()},
                                              "results": results}, indent=1, default=str))
    if args.markdown:
        Path(args.markdown).write_text(table + "\n")
    return 0


def run_one(db, q: Q, args, rng) -> dict:
    """Defaults, auto and oracle errors of one query at every ε."""
    t0 = time.perf_counter()
    truth = db.raw_query(q.sql)
    m_max, g_max = unit_maxima(db, q, unit_sql_for(q))
    n_groups = len(truth) if q.keys else 1
    orc = oracle(db, q, truth, args.runs, args.mc, m_max, n_groups, rng)
    at_defaults = _defaults_candidate(db, q)  # the model at the catalog's bounds, checked against real runs
    r = {"name": q.name, "sql": q.sql, "max_rows_per_unit": m_max, "max_groups_per_unit": g_max,
         "oracle_k": orc["k"], "k_free": orc["k_free"], "eps": {}}
    for eps in EPSILONS:
        d = measured(db, q, truth, eps, args.runs)
        a = measured(db, q, truth, eps, args.runs, max_rows_per_unit="auto", max_groups_contributed="auto")
        md = simulate(at_defaults, q, truth, eps, args.runs, args.mc, rng)
        o = orc[eps]
        r["eps"][str(eps)] = {
            "defaults": d["error"], "model_defaults": md, "auto": a["error"], "auto_choices": a["choices"],
            "oracle": o["error"], "oracle_m": o["m"],
            "oracle_candidates": {str(m): v for m, v in orc["candidates"][eps].items()},
            "auto_over_oracle": a["error"] / o["error"], "auto_over_defaults": a["error"] / d["error"]}
    r["seconds"] = round(time.perf_counter() - t0, 1)
    return r


def _defaults_candidate(db, q: Q) -> Candidate:
    """The catalog's bounds as a Candidate (its k, M fields unused)."""
    plans = {eps: prepare(db, q.sql, epsilon=eps).plan for eps in EPSILONS}
    noiseless = db.raw_query(rewrite_for_sensitivity_check(plans[EPSILONS[0]]).sql)
    return Candidate(0, 0, noiseless, plans)


if __name__ == "__main__":
    sys.exit(main())
