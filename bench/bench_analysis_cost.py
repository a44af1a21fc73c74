"""What the engine's analysis of DPCH's rewritten SQL costs, and where (issue 33; results:
bench/RESULTS.md, "The engine's analysis of the rewritten SQL (issue 33)"; discussion:
docs/PERFORMANCE.md, same title).

ClickHouse takes several times longer to analyse and plan a rewritten DP query (``EXPLAIN
PIPELINE``) than the plain query. This script takes the rewritten SQL of a few representative
queries (the small-query bench's COUNT/SUM/AVG GROUP BY a public key, bench/bench_small_query.py;
ClickBench Q7, Q9 (k = 5 private keys, full scan) and Q40, Q41 (k = 5, CounterID = 62),
bench/bench_clickbench.py) and times, interleaved, ``--reps`` runs each, medians in ms:

- ``kinds``: the engine's stages one after the other: ``EXPLAIN AST`` (parse), ``EXPLAIN QUERY
  TREE`` (+ analysis), ``EXPLAIN PLAN`` (+ plan and its optimisations), ``EXPLAIN PIPELINE`` (+ the
  pipeline), the whole query over an empty copy of the table, and the whole query; the same for the
  plain query, and ``SELECT 1``.
- ``levels``: each nested SELECT cut out on its own (innermost = level 0), ``EXPLAIN QUERY TREE``
  and ``EXPLAIN PIPELINE``: the growth from one level to the next is that level's cost.
- ``shapes``: the noise UDFs replaced by an identity SQL function (same shape), and the parser
  alone on parts of the text (``EXPLAIN AST`` of the expressions).
- ``view``: the same SQL stored as a view on the engine, read with ``SELECT * FROM`` it (does the
  engine keep a view's analysis? no: it analyses the view's text again on every query).
- ``baseline``: the rewritten SQL of another commit's rewriter (``--baseline REV``) for the same
  plans, against this tree's, interleaved: ``EXPLAIN PIPELINE`` and the run (``--verify``: rows
  equal with the noise off).
- ``settings``: ``EXPLAIN PIPELINE`` with one setting toggled at a time, interleaved with the
  query as emitted; with ``--verify``, every toggle is also run with the noise replaced by the
  identity and its rows compared with the emitted query's (equal rows: the toggle is exact there).

The stores are COPIES (bench/.data/clickbench-1000000 into a temporary directory; the small table
built afresh by bench_small_query.build): nothing under bench/.data is written. chDB holds one store
per process, so each store is measured by a child process of this script (``--only``).

    .venv/bin/python bench/bench_analysis_cost.py [--reps 30] [--parts kinds,levels,shapes,settings]
                                                  [--verify] [--only clickbench|small] [--queries Q40,Q41]
    .venv/bin/python bench/bench_analysis_cost.py --parts baseline --baseline 4900797 --verify
        (the rewriter of another commit against this one: same plans, interleaved)
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

CLICKBENCH_STORE = HERE / ".data" / "clickbench-1000000"
CLICKBENCH_QUERIES = ["Q7", "Q9", "Q40", "Q41"]
SMALL_QUERIES = ["COUNT", "SUM", "AVG"]  # bench_small_query.QUERIES
EPS, DELTA = 1.0, 1e-6

# one toggle at a time, each against the query as emitted (the setting's default on this engine)
TOGGLES = [
    "enable_analyzer = 0", "query_plan_enable_optimizations = 0", "query_plan_max_optimizations_to_apply = 0",
    "optimize_move_to_prewhere = 0", "query_plan_optimize_prewhere = 0", "query_plan_filter_push_down = 0",
    "query_plan_merge_expressions = 0", "query_plan_merge_filters = 0", "query_plan_remove_unused_columns = 0",
    "query_plan_optimize_lazy_materialization = 0", "query_plan_lift_up_array_join = 0",
    "query_plan_push_down_limit = 0", "query_plan_remove_redundant_sorting = 0",
    "query_plan_aggregation_in_order = 0", "query_plan_read_in_order = 0", "optimize_read_in_order = 0",
    "optimize_use_projections = 0", "optimize_use_implicit_projections = 0", "use_skip_indexes = 0",
    "optimize_functions_to_subcolumns = 0", "optimize_syntax_fuse_functions = 0",
    "optimize_injective_functions_in_group_by = 0", "optimize_group_by_function_keys = 0",
    "optimize_aggregators_of_group_by_keys = 0", "optimize_extract_common_expressions = 0",
    "optimize_and_compare_chain = 0", "optimize_trivial_count_query = 0", "enable_scalar_subquery_optimization = 0",
    "query_plan_convert_outer_join_to_inner_join = 0", "query_plan_use_new_logical_join_step = 0",
    "query_plan_join_swap_table = 'false'", "join_algorithm = 'hash'", "compile_expressions = 0",
    "use_query_cache = 0", "max_threads = 1", "log_queries = 0", "log_processors_profiles = 0",
    "allow_statistics_optimize = 0", "use_statistics = 0", "use_concurrency_control = 0",
]


# ClickHouse's own counters of each stage of a query (system.events, cumulative, microseconds)
STAGES = {"parse": "QueryParseMicroseconds", "analysis": "QueryAnalysisMicroseconds",
          "plan build": "QueryPlanBuildMicroseconds", "plan optimize": "QueryPlanOptimizeMicroseconds",
          "pipeline build": "QueryPipelineBuildMicroseconds", "engine total": "QueryTimeMicroseconds"}
_EVENTS_SQL = ("SELECT name, value FROM system.events WHERE name IN ("
               + ", ".join(f"'{e}'" for e in STAGES.values()) + ")")


def events(session) -> dict[str, int]:
    rows = session.query(_EVENTS_SQL, "TSV").bytes().decode().splitlines()
    return {name: int(v) for name, v in (r.split("\t") for r in rows)}


def timed(session, variants: dict[str, str], reps: int, stages: bool = False) -> dict[str, dict[str, float]]:
    """Per variant: the median wall ms of running it (round-robin over the variants, one run of each
    in turn, 3 warm-ups, so a change of machine load touches every variant alike) and, with
    ``stages``, the median ms of each of ClickHouse's stage counters over the same runs (read from
    system.events around each run, minus what reading them costs: the median delta over an empty
    run)."""
    out: dict[str, dict[str, list[float]]] = {k: {} for k in variants}
    calib: dict[str, list[float]] = {}

    def add(to: dict[str, list[float]], a: dict[str, int], b: dict[str, int]) -> None:
        for k, e in STAGES.items():
            to.setdefault(k, []).append((b.get(e, 0) - a.get(e, 0)) / 1e3)

    for i in range(reps + 3):
        if stages:
            a = events(session)
            add(calib, a, events(session))
        for k, sql in variants.items():
            a = events(session) if stages else {}
            t0 = time.perf_counter()
            session.query(sql, "TSV")
            wall = (time.perf_counter() - t0) * 1e3
            b = events(session) if stages else {}
            if i >= 3:
                out[k].setdefault("wall", []).append(wall)
                if stages:
                    add(out[k], a, b)
    base = {k: statistics.median(v) for k, v in calib.items()}
    return {k: {s: statistics.median(v) - base.get(s, 0.0) for s, v in d.items()} for k, d in out.items()}


def split_settings(sql: str) -> tuple[str, str]:
    body, _, settings = sql.rpartition("\nSETTINGS ")
    return body, settings


def levels(body: str) -> list[str]:
    """The nested SELECTs of ``body``, outermost first: each level's first ``FROM (`` subquery
    (the rewritten SQL nests one subquery per stage; a public-key join's domain table is a second
    subquery of its level and stays inside it)."""
    out, cur = [body], body
    while (m := re.search(r"FROM \(", cur)) is not None:
        i = j = m.end()
        depth = 1
        while depth:
            depth += (cur[j] == "(") - (cur[j] == ")")
            j += 1
        cur = cur[i:j - 1].strip()
        out.append(cur)
    return out


def identity_noise(sql: str) -> str:
    """The same SQL with the noise UDF calls replaced by ``__ac_identity(x, scale) = x`` (an SQL
    function created in the copied store): the shape stays, the noise goes."""
    return re.sub(r"\bdpch_(laplace|gaussian)_int\(", "__ac_identity(", sql)


COLS = ["wall"] + list(STAGES)


_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def _split(level: str) -> tuple[str, str, str] | None:
    """(the SELECT list with its keyword, the first FROM subquery, what follows it) of one level."""
    m = re.search(r"FROM \(", level)
    if m is None:
        return None
    i = j = m.end()
    depth = 1
    while depth:
        depth += (level[j] == "(") - (level[j] == ")")
        j += 1
    return level[:m.start()].strip(), level[i:j - 1].strip(), level[j:].strip()


def _items(select: str) -> list[str]:
    """The top-level comma-separated items of ``SELECT a, f(b, c) AS d``."""
    body, out, depth, cur = select[len("SELECT"):], [], 0, ""
    for ch in body:
        depth += (ch in "([") - (ch in ")]")
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return out + [cur.strip()]


def _merge_bounding(chain: list[list[str]]) -> None:
    """Step (d) of ``flatten``, in place on its chain of [SELECT list, tail], outermost first."""
    rename = lambda t: re.sub(r"\b__dp_a(h|c|k\d+)\b", r"__dp_g\1", t)  # noqa: E731
    for i in range(3, len(chain)):
        (d, d_tail), (c, c_tail), (b, b_tail), (a, a_tail) = chain[i - 3:i + 1]
        if not (a.startswith("SELECT __dp_u, groupArray(") and a_tail == "GROUP BY __dp_u"
                and b.startswith("SELECT *, arraySlice(") and c.startswith("SELECT __dp_u, arrayMap(")
                and not (b_tail or c_tail or d_tail)):
            continue
        items = [rename(x) for x in _items(a)]
        items += [rename(x) for x in _items(b)[1:]]
        items += [rename(x.rsplit(" AS ", 1)[0]) + " AS " + x.rsplit(" AS ", 1)[1] for x in _items(c)[1:]]
        items += [x for x in _items(d) if " AS " in x]
        chain[i - 3:i + 1] = [["SELECT " + ", ".join(items), a_tail]]
        return


def flatten(body: str, merge_bounding: bool = False) -> str:
    """PROTOTYPE (issue 33): the rewritten SQL with its pass-through levels merged, the noise still
    computed once per row in its own level:
    (a) a level that only projects bare columns (``SELECT a, b FROM (...)``) under a parent that
        names its columns is dropped;
    (b) a level ``SELECT * FROM (X) WHERE c`` is merged into its parent ``SELECT ... FROM (X) WHERE
        c`` (the parent has no WHERE/GROUP BY of its own and defines no name that c reads; WHERE
        runs before the parent's SELECT list, as the subquery did);
    (c) the level under the outermost one, when it only computes ``expr AS name`` from the noisy
        columns, is folded into the outermost SELECT (``name AS alias`` -> ``expr AS alias``,
        ``name`` in its ORDER BY -> ``alias``).
    ``merge_bounding``: also (d), the k > 1 bounding's four levels after its per-unit GROUP BY
    (groupArray per unit; the permutation sorting the unit's hashes; the arrays permuted; the
    caps) as ONE SELECT with that GROUP BY, each later array an alias over the earlier ones
    (all deterministic: ClickHouse computes each once per unit, as the levels did).
    The rows must be the same as the emitted SQL's (``--verify`` checks it with the noise off)."""
    chain, cur = [], body
    while (sp := _split(cur)) is not None:
        chain.append([sp[0], sp[2]])
        cur = sp[1]
    inner = cur
    i = 1
    while i < len(chain):  # (a) and (b), outermost first
        head, tail = chain[i]
        parent_head, parent_tail = chain[i - 1]
        items = _items(head)
        names = [re.fullmatch(_IDENT, x) is not None for x in items]
        if all(names) and not tail and "*" not in _items(parent_head):
            del chain[i]
            continue
        if items == ["*"] and re.fullmatch(r"WHERE .*", tail, re.S) and not parent_tail and i < len(chain) - 1:
            defined = set(re.findall(rf"AS ({_IDENT})", parent_head))
            if not defined & set(re.findall(_IDENT, tail)):
                chain[i - 1][1] = tail
                del chain[i]
                continue
        i += 1
    if len(chain) >= 2 and not chain[1][1]:  # (c)
        outer_head, outer_tail = chain[0]
        computed = {}
        ok = True
        for it in _items(chain[1][0]):
            m = re.fullmatch(rf"(.*) AS ({_IDENT})", it, re.S)
            if m:
                computed[m.group(2)] = m.group(1)
            elif re.fullmatch(_IDENT, it) is None:
                ok = False
        outer = _items(outer_head)
        if ok:
            new_items = []
            for it in outer:
                m = re.fullmatch(rf"({_IDENT}) AS (`[^`]+`|{_IDENT})", it)
                if m and m.group(1) in computed:
                    new_items.append(f"{computed[m.group(1)]} AS {m.group(2)}")
                    outer_tail = re.sub(rf"\b{m.group(1)}\b", m.group(2), outer_tail)
                else:
                    new_items.append(it)
            if not any(re.search(rf"\b{n}\b", " ".join(new_items) + outer_tail) for n in computed
                       if n not in " ".join(computed.values())):
                chain[0] = ["SELECT " + ", ".join(new_items), outer_tail]
                del chain[1]
    if merge_bounding:
        _merge_bounding(chain)
    text = inner
    for link in chain:  # a joined subquery (the public keys' LEFT JOIN) is a chain of its own
        m = re.search(r"JOIN \(", link[1])
        if m:
            sub = _split("FROM (" + link[1][m.end():])
            link[1] = f"{link[1][:m.start()]}JOIN (\n{flatten(sub[1])}\n) {sub[2]}"
    for head, tail in reversed(chain):
        text = f"{head}\nFROM (\n{text}\n){(chr(10) + tail) if tail else ''}"
    return text


def table(title: str, rows: dict[str, dict[str, float]], cols: list[str] = COLS) -> None:
    print(f"\n{title}\n| | {' | '.join(cols)} |\n|---|{'---:|' * len(cols)}")
    for name, r in rows.items():
        print(f"| {name} | " + " | ".join(f"{r[c]:.2f}" if c in r else "" for c in cols) + " |")


def baseline_rewriter(rev: str):
    """The ``dpch.rewrite`` package of git revision ``rev``, imported as ``dpch._rewrite_<rev>`` from
    its files (``git show``): its relative imports resolve to this tree's dpch.plan, dpch.catalog,
    … (the package's name, not its files' place, decides them), so only the rewriter differs."""
    import importlib.util

    root = HERE.parent
    names = subprocess.run(["git", "-C", str(root), "ls-tree", "--name-only", f"{rev}:dpch/rewrite"],
                           check=True, capture_output=True, text=True).stdout.split()
    where = Path(tempfile.mkdtemp(prefix="dpch_rewrite_baseline_"))
    for n in names:
        if n.endswith(".py"):
            (where / n).write_bytes(subprocess.run(["git", "-C", str(root), "show", f"{rev}:dpch/rewrite/{n}"],
                                                   check=True, capture_output=True).stdout)
    name = f"dpch._rewrite_{re.sub(r'[^A-Za-z0-9]', '_', rev)}"
    spec = importlib.util.spec_from_file_location(name, where / "__init__.py", submodule_search_locations=[str(where)])
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[name] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def measure(db, queries: dict[str, tuple[str, str, str]], args, baselines: dict[str, str] | None = None) -> None:
    """``queries``: name -> (rewritten SQL, plain SQL, the catalogued table's name in the SQL);
    ``baselines``: name -> the rewritten SQL of ``--baseline``'s rewriter (part ``baseline``)."""
    session = db.backend._session  # the chDB session itself: no DataFrame conversion in the timing
    db.backend.command("CREATE FUNCTION IF NOT EXISTS __ac_identity AS (x, s) -> x")
    db.backend.command("CREATE DATABASE IF NOT EXISTS __ac_empty")
    parts = args.parts.split(",")
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} (2 cores, shared); "
          f"{args.reps} runs per variant, interleaved, medians (ms); stage columns: ClickHouse's "
          "ProfileEvents counters (system.events) of each run")
    for name, (sql, plain, tbl) in queries.items():
        body, settings = split_settings(sql)
        if args.dump:  # the SQL measured, for reading (it holds the copied store's salt: bench data only)
            Path(args.dump, name.replace(" ", "_") + ".sql").write_text(sql)
        empty = f"`__ac_empty`.`{tbl.split('.')[-1].strip('`')}`"
        db.backend.command(f"CREATE TABLE IF NOT EXISTS {empty} AS {tbl}")
        print(f"\n### {name}: {plain}\nrewritten SQL: {len(body)} characters, "
              f"{body.count('SELECT')} SELECTs, load {os.getloadavg()[0]:.2f}")
        if "kinds" in parts:
            v = {"SELECT 1": "SELECT 1", "plain: EXPLAIN PIPELINE": f"EXPLAIN PIPELINE {plain}",
                 "plain: run": plain}
            v |= {f"rewritten: EXPLAIN {k}": f"EXPLAIN {k} {body} SETTINGS {settings}"
                  for k in ("AST", "QUERY TREE", "PLAN", "PIPELINE")}
            v |= {"rewritten: run over an empty table": sql.replace(tbl, empty), "rewritten: run": sql}
            table("the engine's stages (EXPLAIN kinds and runs):", timed(session, v, args.reps, stages=True))
        if "levels" in parts:
            joined = re.search(r"JOIN \(", body)  # the public keys' LEFT JOIN: its right side's levels too
            pairs = [("", t) for t in levels(body)[::-1]]
            if joined:
                pairs = [("joined ", t) for t in levels(_split("FROM (" + body[joined.end():])[1])[::-1]] + pairs
            names = {}
            for i, (where, text) in enumerate(pairs):
                one = " ".join(text.split())[:44].replace("|", "/")
                names[f"{where}{i}: `{one}`"] = f"EXPLAIN PIPELINE {text} SETTINGS {settings}"
            rows = timed(session, names, args.reps, stages=True)  # all levels interleaved
            table("each level cut out on its own (0 = innermost), EXPLAIN PIPELINE of it:", rows)
        if "baseline" in parts:  # the rewriter of another commit, same plan, same store, interleaved
            old_body = split_settings(baselines[name])[0]
            table(f"as emitted ({len(levels(body))} levels) vs the rewriter of {args.baseline} "
                  f"({len(levels(old_body))} levels):", timed(session, {
                      "as emitted: EXPLAIN PIPELINE": f"EXPLAIN PIPELINE {body} SETTINGS {settings}",
                      f"{args.baseline}: EXPLAIN PIPELINE": f"EXPLAIN PIPELINE {old_body} SETTINGS {settings}",
                      "as emitted: run": sql, f"{args.baseline}: run": baselines[name]}, args.reps, stages=True))
            if args.verify:
                print(f"{args.baseline} vs emitted, noise replaced by the identity: {compare(session, sql, old_body)}")
        if "shapes" in parts:
            flat, flat_d = flatten(body), flatten(body, merge_bounding=True)
            table("the same query in other shapes, EXPLAIN PIPELINE:", timed(session, {
                "as emitted": f"EXPLAIN PIPELINE {body} SETTINGS {settings}",
                "noise UDFs -> identity SQL function": f"EXPLAIN PIPELINE {identity_noise(body)} SETTINGS {settings}",
                "no SETTINGS clause": f"EXPLAIN PIPELINE {body}",
                "whitespace collapsed": f"EXPLAIN PIPELINE {' '.join(body.split())} SETTINGS {settings}",
                f"flattened (prototype, {len(levels(flat))} levels)": f"EXPLAIN PIPELINE {flat} SETTINGS {settings}",
                "flattened + bounding merged (d)": f"EXPLAIN PIPELINE {flat_d} SETTINGS {settings}",
                "flattened, run over an empty table": f"{flat} SETTINGS {settings}".replace(tbl, empty),
                "as emitted, run over an empty table": sql.replace(tbl, empty)},
                args.reps, stages=True))
            if args.verify:
                print(f"flattened vs emitted, noise replaced by the identity: {compare(session, sql, flat)}")
                print(f"flattened + (d) vs emitted, the same: {compare(session, sql, flat_d)}")
        if "view" in parts:  # the same SQL kept as a view on the engine: is a view's analysis kept?
            view = f"`__ac_empty`.`v_{re.sub(r'[^A-Za-z0-9]', '_', name)}`"
            db.backend.command(f"CREATE OR REPLACE VIEW {view} AS {body}")
            table("the same SQL as a view, EXPLAIN PIPELINE and run:", timed(session, {
                "as emitted": f"EXPLAIN PIPELINE {body} SETTINGS {settings}",
                "SELECT * FROM the view": f"EXPLAIN PIPELINE SELECT * FROM {view} SETTINGS {settings}",
                "as emitted, run": sql,
                "the view, run": f"SELECT * FROM {view} SETTINGS {settings}"}, args.reps, stages=True))
        if "settings" in parts:
            base = f"EXPLAIN PIPELINE {body} SETTINGS {settings}"
            rows = {}
            for tog in (args.toggles.split(";") if args.toggles else TOGGLES):
                try:
                    session.query(f"{base}, {tog}", "TSV")
                except Exception as exc:  # e.g. enable_analyzer = 0: refused since 26.9
                    print(f"- {tog}: refused by the engine: {str(exc).splitlines()[0][:160]}")
                    continue
                v = {"emitted": base, "toggled": f"{base}, {tog}"}
                if args.toggles:  # the chosen few: the whole query's run too (a plan setting may slow the run)
                    v |= {"run": sql, "run toggled": f"{sql}, {tog}"}
                r = {k: x["wall"] for k, x in timed(session, v, args.reps).items()}
                rows[tog] = r | {"Δ": r["toggled"] - r["emitted"]}
                if args.toggles:
                    rows[tog]["run Δ"] = r["run toggled"] - r["run"]
                if args.verify:
                    rows[tog]["same rows"] = float(same_rows(session, identity_noise(sql), tog))
            table("EXPLAIN PIPELINE with one setting toggled, wall ms (Δ < 0: faster)", rows,
                  ["emitted", "toggled", "Δ"] + (["run", "run toggled", "run Δ"] if args.toggles else [])
                  + (["same rows"] if args.verify else []))


def _rows(session, sql: str) -> list[str]:
    return sorted(session.query(sql, "TSV").bytes().decode().splitlines())


def same_rows(session, sql: str, toggle: str) -> bool:
    """The query's rows (noise replaced by the identity) with and without ``toggle``, compared as
    sorted multisets of their text rows."""
    return _rows(session, sql) == _rows(session, f"{sql}, {toggle}")


def compare(session, sql: str, flat_body: str) -> str:
    """The emitted SQL and its flattened form with the noise replaced by the identity: their rows
    as emitted (ORDER BY, LIMIT) and without LIMIT/OFFSET (ties at a LIMIT boundary may be cut
    differently by two plans, and by two runs of one plan)."""
    body, settings = split_settings(sql)
    unlimited = lambda b: re.sub(r"\nLIMIT \d+( OFFSET \d+)?\s*$", "", b)  # noqa: E731
    a, b = identity_noise(body), identity_noise(flat_body)
    if re.search(r"WHERE __dp_n\d+ >= \d+", a):  # partition selection keeps no group with the noise off
        a, b = (re.sub(r"WHERE __dp_n\d+ >= \d+", "", x) for x in (a, b))
    full = [session.query(f"{x} SETTINGS {settings}", "TSV").bytes().decode() for x in (a, a, b)]
    ua, ub = (_rows(session, f"{unlimited(x)} SETTINGS {settings}") for x in (a, b))
    return (f"(selection threshold removed from both) " * ("WHERE __dp_n" in body and "WHERE __dp_n" not in a)
            + f"{len(ua)} rows without LIMIT, equal: {ua == ub}; as emitted, in order: equal: {full[0] == full[2]} "
            f"(the emitted SQL run twice: equal: {full[0] == full[1]})")


def clickbench_queries(db, names: list[str]) -> dict[str, tuple[str, str, object]]:
    from clickbench.queries import BY_NAME
    from dpch.controller import prepare

    return {n: (BY_NAME[n].sql, "`clickbench`.`hits`", prepare(db, BY_NAME[n].sql, epsilon=EPS, delta=DELTA))
            for n in names}


def small_queries(db, names: list[str]) -> dict[str, tuple[str, str, object]]:
    from bench_small_query import EPS as SMALL_EPS, QUERIES
    from dpch.controller import prepare

    return {f"small {n}": (plain, "`bench`.`small`", prepare(db, dp, epsilon=SMALL_EPS))
            for n, (dp, plain) in QUERIES.items() if n in names}


def child(args) -> int:
    import dpch

    work = Path(tempfile.mkdtemp(prefix="dpch_analysis_cost_"))
    try:
        if args.only == "clickbench":
            shutil.copytree(CLICKBENCH_STORE, work / "s", symlinks=True)
            (work / "s" / "store" / "status").unlink(missing_ok=True)
        else:
            from bench_small_query import build

            build(work / "s", args.small_rows)
        db = dpch.connect(work / "s", analyst="bench")
        try:
            names = args.queries.split(",")
            prepared = (clickbench_queries(db, [n for n in names if n in CLICKBENCH_QUERIES + [f"Q{i}" for i in range(43)]])
                        if args.only == "clickbench" else small_queries(db, [n for n in names if n in SMALL_QUERIES]))
            qs = {n: (p.rewritten.sql, plain, tbl) for n, (plain, tbl, p) in prepared.items()}  # type: ignore[attr-defined]
            baselines = None
            if args.baseline:
                old = baseline_rewriter(args.baseline)
                baselines = {n: old.rewrite(p.plan).sql for n, (_, _, p) in prepared.items()}  # type: ignore[attr-defined]
            measure(db, qs, args, baselines)
        finally:
            db.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--parts", default="kinds,levels,shapes,settings",
                    help="comma list of kinds, levels, shapes, view, settings, baseline (needs --baseline)")
    ap.add_argument("--verify", action="store_true", help="compare each toggle's rows with the noise off")
    ap.add_argument("--only", choices=["clickbench", "small"], help="one store, in this process")
    ap.add_argument("--queries", default=",".join(SMALL_QUERIES + CLICKBENCH_QUERIES),
                    help="small-table queries (COUNT, SUM, AVG) and ClickBench queries (Q0-Q42)")
    ap.add_argument("--toggles", help="only these settings (';'-separated, e.g. 'max_threads = 1;compile_expressions = 0')")
    ap.add_argument("--baseline", metavar="REV", help="part baseline: the rewriter of git revision REV, same plans")
    ap.add_argument("--dump", metavar="DIR", help="write each rewritten SQL measured into DIR")
    ap.add_argument("--small-rows", type=int, default=1_000_000)
    args = ap.parse_args()
    if args.only:
        return child(args)
    names = args.queries.split(",")
    for store in [s for s, qs in (("small", SMALL_QUERIES), ("clickbench", None))
                  if any((n in qs) if qs else n.startswith("Q") for n in names)]:
        subprocess.run([sys.executable, __file__, "--only", store] + sys.argv[1:], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
