"""`dpch demo`: a deterministic sample dataset in the embedded engine, and DP queries on it.

The true values are printed next to the noisy ones ONLY because this is a demo on synthetic data;
real deployments never release them.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from .calibration import gaussian_ci_halfwidth, laplace_ci_halfwidth, laplace_scale, udf_gaussian_sigma

REGIONS = ["north", "south", "east", "west", "centre"]
DEMO_DB = "demo"


def create_purchases(db, rows: int = 1_000_000, users: int = 100_000) -> None:
    """Deterministic synthetic purchases: the same rows on every machine (hash-derived, no RNG)."""
    db.command(f"CREATE DATABASE IF NOT EXISTS {DEMO_DB}")
    existing = db.raw_query(f"SELECT count() AS n FROM system.tables WHERE database = '{DEMO_DB}' "
                            "AND name = 'purchases'")["n"][0]
    if existing:
        n = db.raw_query(f"SELECT count() AS n FROM {DEMO_DB}.purchases")["n"][0]
        if n == rows:
            return
        db.command(f"DROP TABLE {DEMO_DB}.purchases")
    db.command(f"CREATE TABLE {DEMO_DB}.purchases (purchase_id UInt64, user_id UInt64, region String, "
               "age UInt8, amount Float64) ENGINE = MergeTree ORDER BY (region, user_id)")
    regions = "[" + ",".join(f"'{r}'" for r in REGIONS) + "]"
    # A user's region and age are fixed per user; amounts are skewed (most small, a few large).
    db.command(
        f"INSERT INTO {DEMO_DB}.purchases SELECT number AS purchase_id, "
        f"cityHash64(number, 'user') % {users} AS user_id, "
        f"{regions}[cityHash64(user_id, 'region') % {len(REGIONS)} + 1] AS region, "
        "18 + cityHash64(user_id, 'age') % 70 AS age, "
        "round(5 + 600 * pow((cityHash64(number, 'amount') % 1000000) / 1e6, 3), 2) AS amount "
        f"FROM numbers({rows})")


@dataclass(frozen=True)
class SqlFunctionRelease:
    label: str
    sql_expr: str
    truth_expr: str
    mechanism: str
    ci95: float  # half-width of the 95% interval of the noise


def sql_function_releases(eps: float, delta: float) -> list[SqlFunctionRelease]:
    """The demo's SQL-function queries with their exact 95% noise intervals (from dpch.calibration;
    dp_sum's fixed-point grid adds at most 2^-19 relative to the scale, see docs/NOISE.md)."""
    b_count = laplace_scale(1.0, eps)
    b_sum = laplace_scale(500.0, eps)
    s_count = udf_gaussian_sigma(1.0, eps, delta)  # what dp_count_gaussian uses
    return [
        SqlFunctionRelease("purchases", f"dp_count({eps})", "count()", "Laplace",
                           laplace_ci_halfwidth(b_count)),
        SqlFunctionRelease("revenue", f"dp_sum(amount, 0, 500, {eps})", "sum(least(amount, 500))", "Laplace",
                           laplace_ci_halfwidth(b_sum)),
        SqlFunctionRelease("purchases (Gaussian)", f"dp_count_gaussian({eps}, {delta})", "count()",
                           "Gaussian", gaussian_ci_halfwidth(s_count)),
    ]


def run_demo(db, *, rows: int = 1_000_000, eps: float = 1.0, delta: float = 1e-6, out=print) -> None:
    t0 = time.perf_counter()
    create_purchases(db, rows=rows)
    out(f"Generated {rows:,} deterministic purchases in {DEMO_DB}.purchases "
        f"({time.perf_counter() - t0:.1f} s)\n")

    out(f"1) SQL functions (row-level DP, each value ε={eps}; trusted path, no ledger)")
    releases = sql_function_releases(eps, delta)
    select = ", ".join(f"{r.sql_expr} AS v{i}, {r.truth_expr} AS t{i}" for i, r in enumerate(releases))
    sql = f"SELECT region, {select} FROM {DEMO_DB}.purchases GROUP BY region ORDER BY region"
    t = time.perf_counter()
    df = db.raw_query(sql)
    elapsed = time.perf_counter() - t
    out(f"   SELECT region, {', '.join(r.sql_expr for r in releases)} FROM purchases GROUP BY region")
    header = f"   {'region':<8} {'value':<22} {'noisy':>14} {'± 95% CI':>11} {'TRUE (demo only)':>17}"
    out(header)
    for _, row in df.iterrows():
        for i, r in enumerate(releases):
            out(f"   {row['region']:<8} {r.label:<22} {row[f'v{i}']:>14,.1f} {r.ci95:>11,.1f} "
                f"{row[f't{i}']:>17,.1f}")
    out(f"   query time: {elapsed * 1000:.0f} ms\n")

    try:
        from .controller import run_query  # noqa: F401
    except ImportError:
        out("(controller not installed: skipping the budget-enforcing queries)")
        return
    _controller_demo(db, eps=eps, delta=delta, out=out)
    out(f"\nTotal demo time: {time.perf_counter() - t0:.1f} s")


def _controller_demo(db, *, eps: float, delta: float, out) -> None:
    from .errors import DPCHError

    out("2) Controller (user-level DP: one privacy unit = one user_id; budget-enforcing path)")
    db.catalog.register(f"{DEMO_DB}.purchases", privacy_unit="user_id",
                        bounds={"amount": (0, 610), "age": (18, 100)},
                        max_groups_contributed=1, max_rows_per_unit=24,
                        public_keys={"region": REGIONS}, replace=True)  # the demo's own table, as the demo needs it
    dataset = f"{DEMO_DB}.purchases"
    # the demo spends <= 12ε: 2 queries here, 6 timed runs in step 3, 1.5ε in step 4, 2.5ε in step 5
    budget = 13.0 * max(eps, 1.0)
    # The demo starts each run from a fresh demo budget; the reset is recorded in the ledger.
    from .errors import LedgerError

    try:
        db.ledger.reset(db.analyst, dataset, confirm=True)
    except LedgerError:  # first run: no budget yet
        pass
    db.ledger.set_budget(db.analyst, dataset, epsilon=budget, delta=1e-5, accountant="basic")
    out(f"   budget for analyst {db.analyst!r} on {dataset}: ε={budget:g}, δ=1e-5 (basic composition)")
    region_query = (f"SELECT region, COUNT(*) AS n, SUM(amount) AS revenue, AVG(age) AS mean_age "
                    f"FROM {DEMO_DB}.purchases WHERE age >= 30 GROUP BY region ORDER BY region")
    queries = [(region_query, eps, 0.0),
               (f"SELECT COUNT(DISTINCT user_id) AS buyers FROM {DEMO_DB}.purchases", eps, 0.0)]
    for sql, e, d in queries:
        out(f"   {sql}   [ε={e}]")
        t = time.perf_counter()
        try:
            df = db.query(sql, epsilon=e, delta=d, with_ci=True, bias_share=0.05)
        except DPCHError as exc:
            out(f"   rejected: {exc}")
            continue
        elapsed = time.perf_counter() - t
        out("   " + df.to_string(index=False, float_format=lambda v: f"{v:,.1f}").replace("\n", "\n   "))
        meta = df.attrs["dpch"]
        out(f"   charged ε={meta['epsilon']:g}, δ={meta['delta']:g}; 95% intervals as *_lo/*_hi; "
            f"time: {elapsed * 1000:.0f} ms")
        bias = df.attrs.get("bias") or {}
        if bias.get("units_cut_share") is not None:
            out(f"   bias of bounding (noisy, 5% of ε): {bias['units_cut_share']:.1%} of the users cut, "
                f"{bias['values_clipped_share']:.1%} with clipped values; the intervals cover the noise only")
    truth = db.raw_query(region_query.replace("COUNT(*)", "count()").replace("SUM(amount)", "sum(amount)")
                         .replace("AVG(age)", "avg(age)"))
    out("   TRUE values of the first query (demo only; the DP answer is for data bounded to 24 rows "
        "and 1 region per user, which every user here fits):")
    out("   " + truth.to_string(index=False, float_format=lambda v: f"{v:,.1f}").replace("\n", "\n   "))
    status = db.ledger.remaining(db.analyst, f"{DEMO_DB}.purchases")
    out(f"   budget: {status.describe()}")
    out("   A query the controller cannot make private is rejected before it runs:")
    try:
        db.query(f"SELECT user_id, amount FROM {DEMO_DB}.purchases", epsilon=eps)
    except DPCHError as exc:
        out(f"   rejected: {exc}")
    _acceleration_demo(db, eps=eps, out=out)
    _top_n_and_sparse_vector_demo(db, eps=eps, out=out)
    _output_dp_demo(db, eps=eps, out=out)


def _output_dp_demo(db, *, eps: float, out) -> None:
    """Propose-test-release and early stopping: each reserves its worst case, then the ledger
    keeps what the realised output cost (at most 2.5ε)."""
    dataset = f"{DEMO_DB}.purchases"
    out("\n5) Robust statistics and early stopping, charged by what they released (output DP)")
    r = db.robust_median(dataset, "amount", epsilon=eps, delta=1e-6, bound=2.0)
    shown = f"{r.value:,.1f}" if r.value is not None else "⊥ (not stable enough to release)"
    out(f"   median(amount) by propose-test-release, proposed bound 2: {shown}; "
        f"reserved ε={r.epsilon_reserved:g}, charged ε={r.epsilon_charged:g}")
    sql = f"SELECT COUNT(*) FROM {dataset} WHERE age >= 60"
    e = db.refine(sql, epsilon_per_step=eps / 10, max_steps=15, target_relative=0.001)
    out(f"   {sql}: refined until its 95% interval is within ±0.1%: {e.estimate:,.0f} "
        f"[{e.ci_low:,.0f}, {e.ci_high:,.0f}] after {e.steps} of at most {e.max_steps} steps; "
        f"reserved ε={e.epsilon_reserved:g}, charged ε={e.epsilon_charged:g}")
    out(f"   budget: {db.ledger.remaining(db.analyst, dataset).describe()}")


def _top_n_and_sparse_vector_demo(db, *, eps: float, out) -> None:
    """A top-n query, then a sparse-vector session settled by output-DP accounting (the demo's
    budget has 2ε left after step 3: this step spends at most 1.5ε)."""
    dataset = f"{DEMO_DB}.purchases"
    out("\n4) Top-n and a sparse-vector session")
    sql = f"SELECT region, COUNT(*) AS n FROM {dataset} GROUP BY region ORDER BY n DESC LIMIT 2"
    df = db.query(sql, epsilon=eps / 2)
    facts = df.attrs["dpch"]["top_k"]
    out(f"   {sql}   [ε={eps / 2:g}; answered by {facts['method'].replace('_', '-')}]")
    out("   " + df.to_string(index=False).replace("\n", "\n   "))
    threshold = 8_000
    out(f"   Which regions have more than {threshold:,} buyers aged 60+? (sparse vector, ε={eps:g}, "
        "stop after 4 'above')")
    with db.sparse_vector(dataset, threshold=threshold, epsilon=eps, max_positives=4) as svt:
        for region in REGIONS:
            if svt.positives >= svt.max_positives:
                break
            above = svt.above(f"SELECT COUNT(DISTINCT user_id) FROM {dataset} WHERE region = '{region}' AND age >= 60")
            out(f"   {region:<8} {'above' if above else 'below'}")
    out(f"   reserved ε={eps:g}; charged after the output-DP settlement: ε={svt.epsilon_spent:.4g} "
        f"({svt.positives} 'above' of at most {svt.max_positives})")
    out(f"   budget: {db.ledger.remaining(db.analyst, dataset).describe()}")


def _acceleration_demo(db, *, eps: float, out) -> None:
    """Time one user-level query before and after `db.accelerate` (a per-unit projection)."""
    sql = f"SELECT region, COUNT(*) AS n, SUM(amount) AS revenue FROM {DEMO_DB}.purchases GROUP BY region"
    out("\n3) Per-unit projection for user-level queries (db.accelerate; same answers' distribution)")
    out(f"   {sql}   [ε={eps}, run 3 times before and 3 times after]")

    def timed() -> float:  # median of 3 (each run is charged: 3ε)
        times = []
        for _ in range(3):
            t = time.perf_counter()
            db.query(sql, epsilon=eps)
            times.append(time.perf_counter() - t)
        return sorted(times)[1]

    db.drop_accelerations(f"{DEMO_DB}.purchases")  # a previous demo run may have left one
    before = timed()
    t = time.perf_counter()
    acc = db.accelerate(f"{DEMO_DB}.purchases", ["region"])
    db.command(f"OPTIMIZE TABLE {DEMO_DB}.purchases FINAL")  # one part: one state row per user
    built = time.perf_counter() - t
    after = timed()
    out(f"   median without: {before * 1000:.0f} ms; projection {acc.name} built in {built:.1f} s; "
        f"median with: {after * 1000:.0f} ms (the gain grows with the number of rows per user and the table size; "
        "bench/RESULTS.md)")
    out(f"   budget: {db.ledger.remaining(db.analyst, f'{DEMO_DB}.purchases').describe()}")
