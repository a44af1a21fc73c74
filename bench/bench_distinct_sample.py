"""COUNT(DISTINCT x): what a unit's sample of distinct values costs in accuracy and time (results:
bench/RESULTS.md, "COUNT(DISTINCT) samples: distinct values, not rows").

On a copy of bench/.data/clickbench-<rows> (make bench-clickbench builds it), for each column:
- the exact distinct count (uniqExact, no bounding);
- DPCH's noise-off answer (``rewrite_for_sensitivity_check``: the same bounding, no noise);
- the same SQL with ``groupArraySortedDistinct`` replaced by ``groupArraySorted`` (a unit keeping
  its first r ROWS, the rule before 2026-11-29);
- the ideal: each unit's first r distinct values in its own order, over the union, computed by a
  separate SQL with ``groupUniqArray`` (DPCH's answer must equal it);
and the full DP query's time (Q5-style ``SELECT COUNT(DISTINCT col)``), both forms interleaved,
``--reps`` runs each, medians (ms).

    .venv/bin/python bench/bench_distinct_sample.py [--rows 1000000] [--columns SearchPhrase,URL] [--reps 12]
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--columns", default="SearchPhrase,URL")
    ap.add_argument("--reps", type=int, default=12)
    args = ap.parse_args()

    import dpch
    from dpch.controller import prepare
    from dpch.rewrite import rewrite_for_sensitivity_check
    from dpch.rewrite.rewriter import _Rewriter

    work = Path(tempfile.mkdtemp(prefix="dpch_distinct_sample_"))
    try:
        shutil.copytree(HERE / ".data" / f"clickbench-{args.rows}", work / "s", symlinks=True)
        (work / "s" / "store" / "status").unlink(missing_ok=True)
        db = dpch.connect(work / "s", analyst="bench")
        session = db.backend._session
        print(f"| column | uniqExact | rows kept (before) | distinct values kept (now) | the ideal | "
              f"DP query ms, now | DP query ms, before |\n|---|---:|---:|---:|---:|---:|---:|")
        for col in args.columns.split(","):
            sql = f"SELECT COUNT(DISTINCT {col}) AS d FROM clickbench.hits"
            plan = prepare(db, sql, epsilon=1.0, delta=1e-6).plan
            off = rewrite_for_sensitivity_check(plan).sql
            assert "groupArraySortedDistinct" in off
            rows_rule = off.replace("groupArraySortedDistinct", "groupArraySorted")
            now = int(db.raw_query(off)["d"].iloc[0])
            before = int(db.raw_query(rows_rule)["d"].iloc[0])
            true = int(db.raw_query(f"SELECT uniqExact({col}) AS d FROM clickbench.hits")["d"].iloc[0])
            rw = _Rewriter(plan, noise=False, selection=False, table=None)
            (q,) = rw.quant_qs
            cap = min(plan.bounding.max_rows, plan.bounding.rows_per_group)
            pair = rw._pair(q, f"({q.row_sql})", plan.entry.privacy_unit)
            ideal_sql = (f"SELECT uniqExact(v) AS d FROM (SELECT arrayJoin(arrayMap(t -> bitAnd(bitShiftRight(t, 1), "
                         f"toUInt128(18446744073709551615)), arrayFilter(t -> bitAnd(t, 1) = 1, "
                         f"arraySlice(arraySort(groupUniqArray({pair})), 1, {cap})))) AS v "
                         f"FROM clickbench.hits GROUP BY {plan.entry.privacy_unit})")
            ideal = int(db.raw_query(rw._salted(ideal_sql))["d"].iloc[0])
            dp = prepare(db, sql, epsilon=1.0, delta=1e-6).rewritten.sql
            times: dict[str, list[float]] = {"now": [], "before": []}
            for i in range(args.reps + 2):  # two warm-ups
                for name, text in (("now", dp), ("before", dp.replace("groupArraySortedDistinct", "groupArraySorted"))):
                    t0 = time.perf_counter()
                    session.query(text, "TSV")
                    if i >= 2:
                        times[name].append((time.perf_counter() - t0) * 1e3)
            print(f"| {col} | {true} | {before} | {now} | {ideal} | {statistics.median(times['now']):.1f} | "
                  f"{statistics.median(times['before']):.1f} |")
        db.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
