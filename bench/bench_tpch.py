"""TPC-H benchmark for DP joins (issue 14; results: bench/RESULTS.md, section "TPC-H (issue 14)").

Generates TPC-H with tpchgen-cli (PyPI; `pip install -e '.[tpch]'`), cached as Parquet in
bench/.data/tpch-sf<SF>/parquet, loads it into an embedded DPCH store beside it (cached too),
registers the privacy catalog (bench/tpch/schema.py: customer is the unit, orders and lineitem
reach it through references, the other tables are public) and runs the DP versions of ten TPC-H
queries (bench/tpch/queries.py) against the same SQL run plainly, on the same data.

Per query: answered or rejected (with the QueryRejected message); the median relative error
|dp - exact| / |exact| over the output groups x aggregate columns, over groups with at least
--min-units distinct customers contributing and over all groups (a group missing from the DP output
counts as 1), each the median over --repeats runs; and the DP/plain wall-time ratio of the medians,
measured side by side (alternating, after one warm-up each).

With ``--bounds auto`` the query's declared k and M are replaced by ``"auto"`` (db.query chooses them
from the data with a share of ε, dpch/plan/profile.py); the chosen values of every run are recorded
(``chosen``: median and range per bound) and shown beside the errors.

    python3 bench/bench_tpch.py --sf 1 [--repeats 5] [--queries Q1,Q5] [--epsilon 1.0] [--bounds auto] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import dpch  # noqa: E402
from dpch.errors import QueryRejected  # noqa: E402
from tpch import schema  # noqa: E402
from tpch.queries import BY_NAME, QUERIES, R2T_PUBLISHED  # noqa: E402

CONTRIBUTION_OPTIONS = ("max_groups_contributed", "max_rows_per_unit", "max_rows_per_group")
#: the bounds --bounds auto leaves to db.query (chosen privately from the data)
AUTO_OPTIONS = ("max_rows_per_unit", "max_groups_contributed")
TARGET_ERROR = 0.05
TARGET_RATIO = 3.0


def query_option_fields() -> tuple[str, ...]:
    """The options db.query accepts now (the module may be dpch/plan.py or the package dpch/plan/)."""
    from dpch.plan import QueryOptions

    return tuple(QueryOptions.FIELDS)


# -- data -------------------------------------------------------------------------------------------
def tpchgen() -> str:
    exe = Path(sys.executable).parent / "tpchgen-cli"
    found = str(exe) if exe.exists() else shutil.which("tpchgen-cli")
    if not found:
        sys.exit("tpchgen-cli is not installed: pip install -e '.[tpch]' (or make bench-tpch)")
    return found


def generate(sf: str, root: Path) -> dict:
    """Parquet files of every table at scale factor ``sf`` (cached)."""
    out = root / "parquet"
    marker = out / "generated.json"
    if marker.exists():
        return {**json.loads(marker.read_text()), "cached": True}
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    t0 = time.perf_counter()
    subprocess.run([tpchgen(), "parquet", "-s", sf, "-o", str(out)], check=True)
    version = subprocess.run([tpchgen(), "--version"], check=False, capture_output=True, text=True).stdout.strip()
    info = {"seconds": round(time.perf_counter() - t0, 2),
            "bytes": sum(f.stat().st_size for f in out.glob("*.parquet")), "tpchgen_cli": version}
    marker.write_text(json.dumps(info))
    return {**info, "cached": False}


def load(db, parquet: Path, types: str, store: Path, reload: bool) -> dict:
    marker = store / "tpch_loaded.json"
    if marker.exists() and not reload:
        return {**json.loads(marker.read_text()), "cached": True}
    t0 = time.perf_counter()
    counts = schema.create_and_load(db, parquet, types)
    info = {"seconds": round(time.perf_counter() - t0, 2), "rows": counts, "types": types}
    marker.write_text(json.dumps(info))
    return {**info, "cached": False}


# -- scoring ----------------------------------------------------------------------------------------
def _norm(v):
    """A group key value, comparable between the DP and the plain result."""
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v if isinstance(v, (int, str)) else str(v)


def _records(df, keys):
    return {tuple(_norm(r[k]) for k in keys): r for r in df.to_dict("records")}


def relative_errors(dp, exact, keys, units: dict, min_units: int) -> dict:
    """Relative error per (group, column) of the exact answer. A group missing from the DP output
    counts 1; a NaN DP value counts 1; cells whose exact value is 0 are left out (counted)."""
    got = _records(dp, keys)
    cols = [c for c in exact.columns if c not in keys]
    cells, zero = [], 0
    for key, row in _records(exact, keys).items():
        d = got.get(key)
        for c in cols:
            ex = float(row[c])
            if d is None:
                err = 1.0
            elif ex == 0:
                zero += 1
                continue
            else:
                v = float(d[c])
                err = 1.0 if math.isnan(v) else abs(v - ex) / abs(ex)
            cells.append({"group": list(key), "column": c, "units": units.get(key, 0), "error": err})
    big = [x["error"] for x in cells if x["units"] >= min_units]
    return {"all": statistics.median([x["error"] for x in cells]) if cells else None,
            "big": statistics.median(big) if big else None, "cells": cells, "zero_exact_cells": zero}


def _median_or_none(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


# -- one query --------------------------------------------------------------------------------------
def _chosen(df) -> dict:
    """{bound name: value} chosen by db.query's auto step for this answer (empty if none ran)."""
    return {c["name"]: c["value"] for c in (df.attrs.get("bias") or {}).get("choices", [])}


def _chosen_summary(runs: list[dict]) -> dict:
    """Per bound: the median (the lower one of an even count: a value some run chose) and range of
    the values chosen over the runs."""
    names = sorted({n for r in runs for n in r if isinstance(r[n], (int, float))})
    return {n: {"median": statistics.median_low(v), "min": min(v), "max": max(v), "runs": len(v)}
            for n in names for v in [[r[n] for r in runs if n in r]]}


def run_query(db, q, *, epsilon: float, repeats: int, min_units: int, fields, bounds: str = "declared") -> dict:
    contribution = {k: v for k, v in q.contribution.items() if k in fields}
    if bounds == "auto":
        contribution = {**{k: v for k, v in contribution.items() if k not in AUTO_OPTIONS},
                        **{k: "auto" for k in AUTO_OPTIONS if k in fields}}
    options = {**q.options, **contribution}
    res = {"query": q.name, "sql": q.sql.strip(), "rewrite": q.rewrite, "options_used": sorted(options),
           "options_requested": sorted({**q.options, **q.contribution}),
           "contribution_ignored": {k: v for k, v in q.contribution.items() if k not in fields}}
    exact = db.raw_query(q.plain_sql)  # also the plain warm-up
    units_df = db.raw_query(q.units_sql)
    units = {tuple(_norm(r[k]) for k in q.keys): int(r["units"]) for r in units_df.to_dict("records")}
    res["exact_groups"] = len(exact)
    res["groups_with_min_units"] = sum(1 for v in units.values() if v >= min_units)
    res["units_per_group"] = {"/".join(map(str, k)) or "(all)": v for k, v in sorted(units.items(), key=str)}
    try:
        explanation = db.explain(q.sql, epsilon=epsilon, **options).to_dict()
        res["bounding"] = explanation["bounding"]
        res["relation"] = explanation.get("relation")
        db.query(q.sql, epsilon=epsilon, **options)  # DP warm-up
    except QueryRejected as exc:
        res.update(status="rejected", message=str(exc))
        return res
    except Exception as exc:  # noqa: BLE001 - reported, not fatal: the other queries still run
        res.update(status="error", message=f"{type(exc).__name__}: {exc}")
        return res
    t_plain, t_dp, errs, chosen = [], [], [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        db.raw_query(q.plain_sql)
        t1 = time.perf_counter()
        dp = db.query(q.sql, epsilon=epsilon, **options)
        t2 = time.perf_counter()
        t_plain.append(t1 - t0)
        t_dp.append(t2 - t1)
        errs.append(relative_errors(dp, exact, q.keys, units, min_units))
        chosen.append(_chosen(dp))
    mp, md = statistics.median(t_plain), statistics.median(t_dp)
    res.update(status="answered", epsilon_spent=dp.attrs.get("epsilon_spent"),
               plain_s=mp, dp_s=md, ratio=md / mp, plain_times=t_plain, dp_times=t_dp,
               error_big=_median_or_none([e["big"] for e in errs]),
               error_all=_median_or_none([e["all"] for e in errs]),
               chosen=_chosen_summary(chosen), chosen_runs=chosen,
               error_runs=[{"big": e["big"], "all": e["all"], "zero_exact_cells": e["zero_exact_cells"]} for e in errs],
               last_cells=errs[-1]["cells"],
               exact=exact.astype(str).to_dict("records"), last_dp=dp.astype(str).to_dict("records"))
    return res


# -- report -----------------------------------------------------------------------------------------
def _chosen_cell(r) -> str:
    """The auto-chosen bounds of a query, "M 64 [45–91], k 1" (median [range] over the runs)."""
    parts = []
    for name, c in (r.get("chosen") or {}).items():
        short = SHORT.get(name, name)
        rng = "" if c["min"] == c["max"] else f" [{c['min']:g}–{c['max']:g}]"
        parts.append(f"{short} {c['median']:g}{rng}")
    return ", ".join(parts) or "–"


def _pct(x):
    return "–" if x is None else f"{100 * x:.2f} %" if x >= 1e-3 else f"{100 * x:.1g} %"


SHORT = {"max_groups_contributed": "k", "max_rows_per_unit": "M", "max_rows_per_group": "C"}


def _options_cell(r) -> str:
    used = ", ".join(SHORT.get(k, k) for k in r["options_used"]) or "none"
    ignored = r["contribution_ignored"]
    if r.get("emulated_in_catalog"):
        used += "; in the catalog for this query: " + ", ".join(f"{SHORT[k]}={v}" for k, v in ignored.items())
    elif ignored:
        used += "; not accepted yet: " + ", ".join(f"{SHORT[k]}={v}" for k, v in ignored.items())
    return used


def summarize(results: list[dict], n_queries: int) -> dict:
    answered = [r for r in results if r["status"] == "answered"]
    ratios = [r["ratio"] for r in answered]
    geo = math.exp(statistics.fmean(math.log(x) for x in ratios)) if ratios else None
    scored = [r for r in answered if r["error_big"] is not None]
    worst = max((r["error_big"] for r in scored), default=None)
    return {
        "answered": len(answered), "of": n_queries,
        "geomean_ratio": geo,
        "worst_error_big": worst,
        "median_error_big": _median_or_none([r["error_big"] for r in scored]),
        "targets": {
            "all answered": len(answered) == n_queries,
            f"median relative error <= {TARGET_ERROR:.0%} on groups with >= min units (every answered query)":
                bool(scored) and worst <= TARGET_ERROR,
            f"DP/plain <= {TARGET_RATIO:g}x (geometric mean)": geo is not None and geo <= TARGET_RATIO,
        },
    }


def markdown(results: list[dict], summary: dict, min_units: int, sf: str, bounds: str = "declared") -> str:
    lines = [(f"| query | status | groups (≥ {min_units} customers) | error, groups ≥ {min_units} customers "
             "| error, all groups | plain s | DP s | DP/plain | k, M, C applied | per-query options |"),
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        b = r.get("bounding") or {}
        kmc = f"{b.get('k')}, {b.get('max_rows')}, {b.get('rows_per_group')}" if b else "–"
        if r.get("chosen"):  # explain shows the catalog's bounds before the auto step replaces them
            kmc = f"auto: {_chosen_cell(r)}"
        opts = _options_cell(r)
        if r["status"] == "answered":
            lines.append(f"| {r['query']} | answered | {r['exact_groups']} ({r['groups_with_min_units']}) | "
                         f"{_pct(r['error_big'])} | {_pct(r['error_all'])} | {r['plain_s']:.3f} | {r['dp_s']:.3f} | "
                         f"{r['ratio']:.2f} | {kmc} | {opts} |")
        else:
            msg = r["message"].replace("|", "\\|").replace("\n", " ")
            lines.append(f"| {r['query']} | **{r['status']}**: {msg} | {r['exact_groups']} "
                         f"({r['groups_with_min_units']}) | – | – | – | – | – | {kmc} | {opts} |")
    geo = summary["geomean_ratio"]
    lines.append("")
    lines.append(f"Answered {summary['answered']}/{summary['of']}; geometric mean DP/plain over answered queries: "
                 f"{'–' if geo is None else f'{geo:.2f}'}; worst per-query median error on groups ≥ {min_units} "
                 f"customers: {_pct(summary['worst_error_big'])}.")
    for name, ok in summary["targets"].items():
        lines.append(f"- {name}: {'PASS' if ok else 'FAIL'}")
    # R2T published SF 1 ("scale _3") numbers only
    r2t = [r for r in results if r["query"] in R2T_PUBLISHED and r["status"] == "answered" and float(sf) == 1]
    if r2t:
        auto = bounds == "auto"
        lines += ["", ("| query | exact answer | DPCH: median relative error | R2T (published): relative error "
                  "| DPCH DP s | R2T s (their machine) |" + (" DPCH chosen M, k: median [range] |" if auto else "")),
                  "|---|---|---|---|---|---|" + ("---|" if auto else "")]
        for r in r2t:
            pub = R2T_PUBLISHED[r["query"]]
            exact = float(next(iter(r["exact"][0].values())))
            lines.append(f"| {r['query']} | {exact:,.0f} | {_pct(r['error_all'])} | "
                         f"{_pct(pub['abs_error'] / pub['true'])} (true {pub['true']:,.0f}) | {r['dp_s']:.3f} | "
                         f"{pub['seconds']:.2f} |" + (f" {_chosen_cell(r)} |" if auto else ""))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sf", default="1", help="scale factor (e.g. 0.01, 0.1, 1)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--queries", default=",".join(q.name for q in QUERIES),
                    help="comma-separated; also R2T-Q3, R2T-Q10, R2T-Q18 (R2T's own queries, run at --epsilon 0.8)")
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--min-units", type=int, default=1000, help="groups scored for the error target")
    ap.add_argument("--types", choices=("decimal", "float"), default="decimal",
                    help="load the spec's DECIMAL(15,2) columns as Decimal(15, 2) or Float64")
    ap.add_argument("--data-root", default=str(HERE / ".data"))
    ap.add_argument("--reload", action="store_true", help="reload the tables even if the store has them")
    ap.add_argument("--emulate-bounds", action="store_true",
                    help="a query's contribution bounds that db.query does not accept yet are set in the catalog "
                         "(orders and lineitem) for that query only")
    ap.add_argument("--bounds", choices=("declared", "auto"), default="declared",
                    help="declared: each query's own k/M (else the catalog's); auto: k and M chosen by db.query "
                         "from the data with a share of ε (max_rows_per_unit/max_groups_contributed='auto')")
    ap.add_argument("--setup-only", action="store_true", help="generate, load and register, run no query")
    ap.add_argument("--out", default=None, help="write the results here (JSON)")
    ap.add_argument("--markdown", default=None, help="write the table here (Markdown)")
    args = ap.parse_args(argv)
    names = [n.strip().upper() for n in args.queries.split(",") if n.strip()]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        ap.error(f"unknown queries {unknown}; known: {', '.join(BY_NAME)}")

    root = Path(args.data_root) / f"tpch-sf{args.sf}"
    gen = generate(args.sf, root)
    print(f"data: SF {args.sf}, generation {gen['seconds']} s{' (cached)' if gen['cached'] else ''}", flush=True)
    store = root / f"store-{args.types}"
    db = dpch.connect(store, analyst="bench")
    try:
        loaded = load(db, root / "parquet", args.types, store, args.reload)
        print(f"load: {loaded['seconds']} s{' (cached)' if loaded['cached'] else ''}, rows {loaded['rows']}",
              flush=True)
        t0 = time.perf_counter()
        schema.register(db)
        register_s = time.perf_counter() - t0
        # a fresh, large budget: the benchmark measures accuracy and time, not budget exhaustion
        dataset = f"{schema.DB}.customer"
        db.ledger.set_budget(db.analyst, dataset, epsilon=1e9, delta=0.5)
        db.ledger.reset(db.analyst, dataset, confirm=True)
        print(f"catalog registered in {register_s:.2f} s", flush=True)
        if args.setup_only:
            return 0
        fields = query_option_fields()
        results = []
        for name in names:
            q = BY_NAME[name]
            emulated = {k: v for k, v in q.contribution.items() if k not in fields} if args.emulate_bounds else {}
            if emulated:  # the query's bounds as the catalog's, for this query only
                schema.register(db, emulated)
            try:
                r = run_query(db, q, epsilon=args.epsilon, repeats=args.repeats,
                              min_units=args.min_units, fields=fields, bounds=args.bounds)
            finally:
                if emulated:
                    schema.register(db)
            r["emulated_in_catalog"] = emulated
            results.append(r)
            extra = (f"error≥{args.min_units} {_pct(r['error_big'])}, all {_pct(r['error_all'])}, "
                     f"DP/plain {r['ratio']:.2f} ({r['dp_s']:.3f}/{r['plain_s']:.3f} s)"
                     + (f", chosen {_chosen_cell(r)}" if args.bounds == "auto" else "")
                     if r["status"] == "answered" else r["message"])
            print(f"{name}: {r['status']}: {extra}", flush=True)
        version = db.raw_query("SELECT version() AS v")["v"][0]
    finally:
        db.close()
    summary = summarize(results, len(names))
    table = markdown(results, summary, args.min_units, args.sf, args.bounds)
    print(table)
    out = {"sf": args.sf, "epsilon": args.epsilon, "repeats": args.repeats, "min_units": args.min_units,
           "emulate_bounds": args.emulate_bounds, "bounds": args.bounds,
           "types": args.types, "generation": gen, "load": loaded, "register_s": round(register_s, 2),
           "query_option_fields": list(fields), "clickhouse": version,
           "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "loadavg": os.getloadavg()},
           "summary": summary, "results": results}
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1, default=str))
    if args.markdown:
        Path(args.markdown).write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
