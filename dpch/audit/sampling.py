"""Running the mechanism N times on D and on D′, vectorised.

One query draws many samples: the audited table is replaced by

    (SELECT t.*, n.number AS __rep FROM <D or D′> AS t CROSS JOIN numbers(a, b − a) AS n) AS <alias>

and a sqlglot pass threads `__rep` through every SELECT on the path from that table to the top:
it becomes an extra GROUP BY key (or the only one, for global aggregates), an extra projection, an
extra PARTITION BY key of window functions, the BY of LIMIT, and an extra equality in joins of two
replicated inputs. Each value of `__rep` is then one independent run of the query: the aggregation
and clipping run natively per replica and the noise UDF is called once per (replica, group) row,
drawing fresh noise each time (the UDFs are non-deterministic and read the OS CSPRNG per row).

Queries the pass cannot thread (e.g. the audited table read inside a scalar subquery, ROLLUP) fall
back to a loop: the query runs once per sample with only the table name replaced.

Empty input of a global aggregate. A top-level SELECT with aggregates and no GROUP BY returns one
row per run even when no row reaches it (e.g. D′ removed the only row that its WHERE keeps): the
aggregates of the empty set, noised (`dp_sum` releases a noisy 0). Threaded, it becomes
`GROUP BY __rep`, which returns no row for such a run. `draw_sql` therefore draws the output of
every run missing from a global aggregate's result separately, with the same SELECT evaluated on an
empty input (`WHERE false`) once per run (`GROUP BY GROUPING SETS ((), (), …)`: one output row per
empty grouping set, each with its own noise). Without that, the missing run was a NaN ("no output")
on one side only, a certain difference that a correct mechanism never shows (issue 11).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd
import sqlglot
from sqlglot import exp

REP = "__rep"
ROW = "__row"
NOISE_FUNCTIONS = {"dpch_laplace", "dpch_laplace_int", "dpch_gaussian", "dpch_gaussian_int",
                   "dpch_quantiles"}
# SQL functions (clickhouse_config/user_defined/) that hide an aggregate: a query calling one is an
# aggregation even though sqlglot sees a plain function call.
AGGREGATE_HELPERS = {"dpch_sum_units", "dpch_quantile_histogram", "dpch_quantiles_of"}
DIALECT = "clickhouse"


class ReplicationUnsupported(Exception):
    """The vectorising rewrite does not apply to this query (the caller falls back to a loop)."""


def _is_aggregate_call(node: exp.Expression) -> bool:
    if isinstance(node, exp.AggFunc):
        return True
    if isinstance(node, exp.Anonymous):
        name = str(node.this).lower()
        # SQL functions with aggregates inside (the public dp_* functions and AGGREGATE_HELPERS)
        # and parametric aggregates (see `parse`).
        return name.startswith(("dp_", "dpchp_")) or name in AGGREGATE_HELPERS
    return False


def _walk_scope(node: exp.Expression):
    """Nodes of one SELECT's expressions, not descending into nested queries or windows."""
    stack = [node]
    while stack:
        cur = stack.pop()
        yield cur
        for child in cur.iter_expressions():
            if isinstance(child, (exp.Select, exp.Subquery, exp.SetOperation, exp.Window)):
                if isinstance(child, exp.Window):
                    yield child
                continue
            stack.append(child)


def _has_aggregate(select: exp.Select) -> bool:
    parts = list(select.expressions)
    if select.args.get("having") is not None:
        parts.append(select.args["having"])
    return any(_is_aggregate_call(n) for p in parts for n in _walk_scope(p))


# sqlglot (ClickHouse dialect) knows only some parametric aggregates: it silently misreads
# `groupArraySorted(2)(x)` as `groupArraySorted(2) AS (x)`. Before parsing, every
# `name(<numbers>)(` becomes the plain call `dpchp_<name>_P_<encoded numbers>(`, and `render`
# turns it back. ClickHouse's parametric functions are all aggregates, so `_is_aggregate_call`
# treats these names as aggregates.
_PARAMETRIC = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)\(\s*([0-9.eE+\-]+(?:\s*,\s*[0-9.eE+\-]+)*)\s*\)\s*\(")
_PARAMETRIC_BACK = re.compile(r"\bdpchp_([A-Za-z0-9_]+?)_P_([0-9a-z]+)\(")
_ENC = {".": "d", ",": "c", "e": "x", "E": "x", "+": "p", "-": "m"}
_DEC = {"d": ".", "c": ", ", "x": "e", "p": "+", "m": "-"}


def _encode_params(m: re.Match) -> str:
    params = "".join(_ENC.get(ch, ch) for ch in re.sub(r"\s+", "", m.group(2)))
    return f"dpchp_{m.group(1)}_P_{params}("


def _decode_params(m: re.Match) -> str:
    params = "".join(_DEC.get(ch, ch) for ch in m.group(2))
    return f"{m.group(1)}({params})("


def parse(sql: str) -> exp.Expression:
    try:
        tree = sqlglot.parse_one(_PARAMETRIC.sub(_encode_params, sql), read=DIALECT)
    except sqlglot.errors.ParseError as exc:
        raise ValueError(f"cannot parse the audited query: {exc}") from exc
    return tree


def render(tree: exp.Expression) -> str:
    """ClickHouse SQL from the tree, keeping `rand()` as written (sqlglot would turn it into
    randCanonical(), a different function) and restoring parametric aggregates."""
    tree = tree.copy()
    for node in list(tree.find_all(exp.Rand)):
        node.replace(exp.Anonymous(this="rand", expressions=[]))
    return _PARAMETRIC_BACK.sub(_decode_params, tree.sql(dialect=DIALECT))


def table_key(table: exp.Table, default_db: str) -> str:
    return f"{table.db or default_db}.{table.name}".lower()


def referenced_tables(sql: str, default_db: str = "default") -> list[str]:
    """Fully qualified names of the tables a query reads (CTE names excluded)."""
    tree = parse(sql)
    ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
    out = []
    for t in tree.find_all(exp.Table):
        if not t.name or (not t.db and t.name.lower() in ctes) or isinstance(t.this, exp.Func):
            continue
        key = table_key(t, default_db)
        if key not in out:
            out.append(key)
    return out


def replace_tables(sql: str, table_map: dict[str, str], default_db: str = "default",
                   reps: tuple[int, int] | None = None) -> str:
    """Replace each audited table (keys of `table_map`, "db.table") by its audit copy. With
    `reps=(a, b)` also replicate it b − a times and thread `__rep` through the query."""
    tree = parse(sql)
    ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
    injected: set[int] = set()
    found = False
    for t in list(tree.find_all(exp.Table)):
        if not t.name or (not t.db and t.name.lower() in ctes):
            continue
        target = table_map.get(table_key(t, default_db))
        if target is None:
            continue
        found = True
        alias = t.alias or t.name
        db, name = target.split(".", 1)
        if reps is None:
            t.replace(exp.table_(name, db=db, alias=alias))
            continue
        inner = parse(f"SELECT __audit_t.*, __audit_n.number AS {REP} FROM {db}.{name} AS __audit_t "
                      f"CROSS JOIN numbers({int(reps[0])}, {int(reps[1]) - int(reps[0])}) AS __audit_n")
        sub = exp.Subquery(this=inner, alias=exp.TableAlias(this=exp.to_identifier(alias)))
        t.replace(sub)
        injected.add(id(inner))
    if not found:
        raise ValueError("the audited query does not read the audited table")
    if reps is not None:
        _thread_rep(tree, injected, reps)
    return render(tree)


def _source_alias(src: exp.Expression) -> str:
    return src.alias_or_name


def _is_array_join(join: exp.Join) -> bool:
    return str(join.args.get("kind") or "").upper() in ("ARRAY", "LEFT ARRAY")


def _sources(sel: exp.Select) -> list[exp.Expression]:
    """The FROM source and every joined source (ARRAY JOIN unfolds a column: not a source)."""
    from_ = _from(sel)
    if from_ is None:
        return []
    return [from_.this] + [j.this for j in sel.args.get("joins") or [] if not _is_array_join(j)]


def _replicate_source(src: exp.Expression, reps: tuple[int, int]) -> exp.Subquery:
    """(SELECT s.*, n.number AS __rep FROM <src> AS s CROSS JOIN numbers(a, b − a) AS n) AS alias:
    a source that does not depend on the audited table (e.g. a public key domain), repeated once
    per replica so that joins with replicated sources keep their per-replica meaning (a LEFT JOIN
    from the key domain must yield every key in every replica)."""
    alias = _source_alias(src)
    if isinstance(src, exp.Subquery):
        inner_from = src.this.copy()
        inner_from = exp.Subquery(this=inner_from, alias=exp.TableAlias(this=exp.to_identifier("__audit_s")))
    else:
        inner_from = src.copy()
        inner_from.set("alias", exp.TableAlias(this=exp.to_identifier("__audit_s")))
    wrapped = parse(f"SELECT __audit_s.*, __audit_n.number AS {REP} FROM __audit_placeholder AS __audit_s "
                    f"CROSS JOIN numbers({int(reps[0])}, {int(reps[1]) - int(reps[0])}) AS __audit_n")
    _from(wrapped).set("this", inner_from)
    return exp.Subquery(this=wrapped, alias=exp.TableAlias(this=exp.to_identifier(alias)) if alias else None)


def _thread_rep(tree: exp.Expression, injected: set[int], reps: tuple[int, int]) -> None:
    marked: set[int] = set(injected)
    replicated_ctes: set[str] = set()
    selects = list(tree.find_all(exp.Select))
    for sel in reversed(selects):  # breadth-first order reversed: inner queries first
        if id(sel) in marked:
            continue
        sources = _sources(sel)
        if not any(_is_replicated(s, marked, replicated_ctes) for s in sources):
            continue
        marked.add(id(sel))
        for join in sel.args.get("joins") or []:
            side = str(join.args.get("side") or "").upper()
            if not _is_array_join(join) and side in ("RIGHT", "FULL"):
                raise ReplicationUnsupported("RIGHT/FULL JOIN with the audited table")
        if len(sources) > 1:
            for src in sources:
                if not _is_replicated(src, marked, replicated_ctes):
                    wrapped = _replicate_source(src, reps)
                    src.replace(wrapped)
                    marked.add(id(wrapped.this))
            sources = _sources(sel)
            qualifier = _source_alias(sources[0]) or None
            if qualifier is None:
                raise ReplicationUnsupported("a join whose first source has no alias")
            _join_on_rep(sel, qualifier)
        else:
            qualifier = None
        rep_col = exp.column(REP, table=qualifier)
        if not any(isinstance(p, exp.Star) or (isinstance(p, exp.Column) and isinstance(p.this, exp.Star))
                   for p in sel.expressions):
            sel.append("expressions", exp.alias_(rep_col.copy(), REP))
        group = sel.args.get("group")
        if group is not None:
            if group.args.get("rollup") or group.args.get("cube") or group.args.get("totals") \
                    or group.args.get("grouping_sets"):
                raise ReplicationUnsupported("GROUP BY ROLLUP/CUBE/TOTALS/GROUPING SETS")
            group.append("expressions", rep_col.copy())
        elif _has_aggregate(sel):
            sel.set("group", exp.Group(expressions=[rep_col.copy()]))
        for node in [n for p in sel.expressions for n in _walk_scope(p)]:
            if isinstance(node, exp.Window):
                node.set("partition_by", list(node.args.get("partition_by") or []) + [rep_col.copy()])
        limit = sel.args.get("limit")
        if limit is not None:
            if limit.args.get("offset") is not None or sel.args.get("offset") is not None:
                raise ReplicationUnsupported("LIMIT with OFFSET")
            limit.set("expressions", list(limit.args.get("expressions") or []) + [rep_col.copy()])
        if sel.args.get("distinct") is not None and sel.args["distinct"].args.get("on") is not None:
            raise ReplicationUnsupported("DISTINCT ON")
        parent_cte = sel.parent if isinstance(sel.parent, exp.CTE) else None
        if parent_cte is not None:
            replicated_ctes.add(parent_cte.alias_or_name.lower())
    # Every replicated SELECT must feed a FROM/JOIN (or be the top); otherwise, e.g. a scalar
    # subquery over the audited table would return N rows where one is expected.
    for sel in selects:
        if id(sel) in marked and not _feeds_from(sel, tree):
            raise ReplicationUnsupported("the audited table is read outside FROM/JOIN")
    for setop in tree.find_all(exp.SetOperation):
        branches = [b for b in (setop.this, setop.expression) if isinstance(b, exp.Select)]
        if len({id(b) in marked for b in branches}) > 1:
            raise ReplicationUnsupported("UNION of replicated and non-replicated branches")
    top_selects = [tree] if isinstance(tree, exp.Select) else [
        b for b in tree.find_all(exp.Select) if _feeds_from(b, tree) and b.parent is not None
        and isinstance(b.parent, exp.SetOperation)]
    if not top_selects or not all(id(t) in marked for t in top_selects):
        raise ReplicationUnsupported("the top-level query does not depend on the audited table")


def _from(sel: exp.Select):
    return sel.args.get("from_") or sel.args.get("from")


def _feeds_from(sel: exp.Select, tree: exp.Expression) -> bool:
    node = sel
    while isinstance(node.parent, exp.SetOperation):
        node = node.parent
    if node is tree:
        return True
    parent = node.parent
    if isinstance(parent, exp.CTE):
        return True
    return isinstance(parent, exp.Subquery) and isinstance(parent.parent, (exp.From, exp.Join))


def _is_replicated(src: exp.Expression, marked: set[int], replicated_ctes: set[str]) -> bool:
    if isinstance(src, exp.Subquery):
        inner = src.this
        if isinstance(inner, exp.SetOperation):
            return any(id(s) in marked for s in inner.find_all(exp.Select))
        return id(inner) in marked
    if isinstance(src, exp.Table):
        return not src.db and src.name.lower() in replicated_ctes
    return False


def _join_on_rep(sel: exp.Select, first: str) -> None:
    """Every (non-ARRAY) join of a replicated SELECT also matches on `__rep`."""
    for join in sel.args.get("joins") or []:
        if _is_array_join(join):
            continue
        other = _source_alias(join.this)
        if not other:
            raise ReplicationUnsupported("a joined source without an alias")
        using = join.args.get("using")
        if using:
            join.set("using", list(using) + [exp.to_identifier(REP)])
            continue
        cond = exp.EQ(this=exp.column(REP, table=first), expression=exp.column(REP, table=other))
        on = join.args.get("on")
        if on is None and str(join.args.get("kind") or "").upper() == "CROSS":
            join.set("kind", None)  # CROSS JOIN → INNER JOIN ... ON __rep = __rep
        join.set("on", exp.and_(on, cond) if on is not None else cond)


# --------------------------------------------------------------------------------------------
# Which result columns are released values (outputs) and which are group keys
# --------------------------------------------------------------------------------------------
def _with_clause(sel: exp.Select):
    return sel.args.get("with_") or sel.args.get("with")  # sqlglot 30 names it with_


def _with_aliases(scope: exp.Select) -> dict[str, exp.Expression]:
    """The scope's ``WITH <expression> AS <name>`` aliases (ClickHouse's scalar WITH), by name."""
    w = _with_clause(scope)
    return {c.alias_or_name: c.this for c in (w.expressions if w else []) if c.args.get("scalar")}


def _is_noisy(node: exp.Expression, scope: exp.Select, depth: int = 0) -> bool | None:
    """Does an expression carry a released (aggregate/noise) value? Follows column references into
    derived tables. None when it cannot tell."""
    if depth > 20:
        return None
    for n in node.walk():
        if _is_aggregate_call(n):
            return True
        if isinstance(n, exp.Anonymous) and str(n.this).lower() in NOISE_FUNCTIONS:
            return True
    cols = list(node.find_all(exp.Column))
    if not cols:
        return False
    from_ = _from(scope)
    if from_ is None:
        return False
    sources = [from_.this] + [j.this for j in scope.args.get("joins") or []]
    derived = [s for s in sources if isinstance(s, exp.Subquery) and isinstance(s.this, exp.Select)]
    verdict = False
    aliases = _with_aliases(scope)
    for col in cols:
        if isinstance(col.this, exp.Star):
            return None
        if not col.table and col.name in aliases:  # `WITH expr AS name` (the released values)
            inner = _is_noisy(aliases[col.name], scope, depth + 1)
            if inner is None:
                return None
            verdict = verdict or inner
            continue
        for sub in derived:
            if col.table and col.table != sub.alias_or_name:
                continue
            projs = sub.this.expressions
            named = [p for p in projs if p.alias_or_name == col.name]
            if not named and any(isinstance(p, exp.Star) for p in projs):
                # `SELECT *` passes the column through from its own source (the controller's
                # selection stage: SELECT * FROM (SELECT *, noise AS n …) WHERE n >= threshold)
                named = [exp.column(col.name)]
            for proj in named:
                inner = _is_noisy(proj, sub.this, depth + 1)
                if inner is None:
                    return None
                verdict = verdict or inner
    return verdict


def classify_columns(sql: str, columns: list[str]) -> tuple[list[str], list[str]]:
    """(key columns, output columns) of a query's result. Keys: projections that are neither an
    aggregate nor a noise-UDF call (following derived tables); unresolvable projections count as
    outputs when numeric (decided later by the caller)."""
    tree = parse(sql)
    top = tree if isinstance(tree, exp.Select) else next(tree.find_all(exp.Select), None)
    verdicts: dict[str, bool | None] = {}
    if isinstance(top, exp.Select):
        for proj in top.expressions:
            if isinstance(proj, exp.Star):
                continue
            verdicts[proj.alias_or_name] = _is_noisy(proj, top)
    keys = [c for c in columns if c != REP and verdicts.get(c) is False]
    outputs = [c for c in columns if c != REP and c not in keys]
    return keys, outputs


# --------------------------------------------------------------------------------------------
# Drawing samples and shaping them into an (N × k) matrix
# --------------------------------------------------------------------------------------------
def _top_select(tree: exp.Expression) -> exp.Select | None:
    return tree if isinstance(tree, exp.Select) else None


def _projection_chain(tree: exp.Expression) -> list[exp.Select]:
    """The SELECTs from the top down to the first one with aggregates, when every SELECT above it
    maps each row of its single subquery to one row (no WHERE, GROUP BY, HAVING, join, window or
    aggregate): the controller's rewritten query wraps its global aggregate in such projections
    (noise, then post-processing). Empty when the query has no such shape."""
    chain: list[exp.Select] = []
    sel = _top_select(tree)
    while sel is not None:
        chain.append(sel)
        if _has_aggregate(sel):
            return chain
        if (_with_clause(sel) is not None and len(chain) > 1) or any(
                sel.args.get(a) is not None for a in ("where", "group", "having", "joins", "laterals")) \
                or any(isinstance(n, exp.Window) for p in sel.expressions for n in _walk_scope(p)):
            return []
        src = _from(sel)
        inner = src.this if src is not None else None
        if not isinstance(inner, exp.Subquery) or not isinstance(inner.this, exp.Select):
            return []
        sel = inner.this
    return []


def _global_chain(tree: exp.Expression) -> list[exp.Select]:
    """`_projection_chain` when its last SELECT makes the query a global aggregate (no GROUP BY, no
    window function; see `is_global_aggregate`), else empty."""
    chain = _projection_chain(tree)
    if not chain or chain[-1].args.get("group") is not None:
        return []
    if any(isinstance(n, exp.Window) for p in chain[-1].expressions for n in _walk_scope(p)):
        return []
    return chain


def is_global_aggregate(sql: str) -> bool:
    """Is the query a SELECT with aggregates, no GROUP BY and no window function, possibly wrapped
    in row-for-row projections, i.e. does one run return one row (before HAVING) whatever its
    input, the empty input included?"""
    return bool(_global_chain(parse(sql)))


EMPTY_RUNS_PER_QUERY = 500  # grouping sets per query (the engine's cost grows faster than linearly)


def empty_input_sql(sql: str, table_map: dict[str, str], runs: int, default_db: str = "default") -> str:
    """`runs` independent runs of a global-aggregate query's top level on an empty input: its WHERE
    becomes false and its GROUP BY `runs` empty grouping sets, each of which yields the aggregates
    of the empty set (then the SELECT list, noise included, is evaluated once per row, and HAVING
    filters each row on its own). ORDER BY, LIMIT and DISTINCT act on one run's single row, so they
    are dropped (across runs they would merge or cut rows)."""
    tree = parse(replace_tables(sql, table_map, default_db))
    chain = _global_chain(tree)
    if not chain:
        raise ValueError("not a global aggregate")
    chain[-1].set("where", exp.Where(this=exp.false()))
    chain[-1].set("group", exp.Group(expressions=[exp.GroupingSets(expressions=[exp.Tuple() for _ in range(runs)])]))
    for sel in chain:
        for arg in ("order", "limit", "distinct", "offset"):
            sel.set(arg, None)
    return render(tree)


def nonempty_runs_sql(sql: str, table_map: dict[str, str], reps: tuple[int, int],
                      default_db: str = "default") -> str:
    """The runs in [a, b) whose top-level aggregate receives at least one row: the threaded query
    with its SELECT list reduced to `__rep` and without HAVING, ORDER BY or LIMIT."""
    tree = parse(replace_tables(sql, table_map, default_db, reps=reps))
    chain = _projection_chain(tree)
    agg = chain[-1] if chain else None
    group = agg.args.get("group") if agg is not None else None
    if group is None:
        raise ValueError("not a global aggregate")
    agg.set("expressions", [exp.alias_(group.expressions[-1].copy(), REP)])
    for arg in ("having", "order", "limit", "distinct", "offset"):
        agg.set(arg, None)
    w = _with_clause(tree)
    ctes = [c.copy() for c in (w.expressions if w else []) if not c.args.get("scalar")]
    if agg is not tree and ctes:  # the aggregate's own runs; the projections above it keep every row
        agg.set("with_", exp.With(expressions=ctes))  # its tables, not the top's scalar aliases
    return render(agg)


def _fill_empty_runs(run: Callable[[str], pd.DataFrame], sql: str, table_map: dict[str, str],
                     frame: pd.DataFrame, reps: tuple[int, int], default_db: str) -> pd.DataFrame:
    """Add the outputs of the runs in [a, b) that are missing from a global aggregate's threaded
    result because their input was empty (see the module docstring)."""
    present = set(frame[REP].astype(np.int64).tolist()) if len(frame) else set()
    missing = [r for r in range(reps[0], reps[1]) if r not in present]
    if not missing:
        return frame
    if _global_chain(parse(sql))[-1].args.get("having") is not None:
        # a run may also be missing because HAVING rejected its row: only runs that received no
        # row at all are empty-input runs
        nonempty = set(run(nonempty_runs_sql(sql, table_map, reps, default_db))[REP].astype(np.int64).tolist())
        missing = [r for r in missing if r not in nonempty]
    rng = np.random.default_rng()
    parts = [frame] if len(frame) else []
    for i in range(0, len(missing), EMPTY_RUNS_PER_QUERY):
        chunk = missing[i:i + EMPTY_RUNS_PER_QUERY]
        out = run(empty_input_sql(sql, table_map, len(chunk), default_db)).reset_index(drop=True)
        # HAVING may drop some of the iid rows: give the survivors to a uniformly random subset of
        # the runs, so that the runs' outputs stay iid (no row = the run released nothing)
        out[REP] = rng.permutation(np.asarray(chunk, dtype=np.int64))[:len(out)]
        parts.append(out)
    if not parts:
        return frame
    return pd.concat(parts, ignore_index=True)


@dataclass
class SampleSet:
    """The raw result rows of N runs (column `__rep` = run index)."""

    frame: pd.DataFrame
    n: int
    vectorised: bool = True


def draw_sql(run: Callable[[str], pd.DataFrame], sql: str, table_map: dict[str, str], n: int, *,
             default_db: str = "default", rows_per_query: int = 20_000_000, table_rows: int = 1,
             vectorise: bool = True, on_batch: Callable[[int], None] | None = None) -> SampleSet:
    """Run `sql` n times on the audit copies in `table_map` and return all result rows tagged with
    `__rep`. Vectorised in batches of at most `rows_per_query` replicated input rows."""
    frames = []
    if vectorise:
        try:
            replace_tables(sql, table_map, default_db, reps=(0, 1))  # does the rewrite apply?
        except ReplicationUnsupported:
            vectorise = False
    if vectorise:
        batch = max(1, min(n, rows_per_query // max(1, table_rows)))
        global_aggregate = is_global_aggregate(sql)
        for start in range(0, n, batch):
            stop = min(n, start + batch)
            frame = run(replace_tables(sql, table_map, default_db, reps=(start, stop)))
            if global_aggregate:
                frame = _fill_empty_runs(run, sql, table_map, frame, (start, stop), default_db)
            frames.append(frame)
            if on_batch:
                on_batch(stop - start)
    else:
        plain = replace_tables(sql, table_map, default_db)
        for i in range(n):
            df = run(plain)
            df[REP] = i
            frames.append(df)
            if on_batch:
                on_batch(1)
    frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame({REP: []})
    return SampleSet(frame, n, vectorise)


def _is_array(value) -> bool:
    return isinstance(value, (list, tuple, np.ndarray))


def expand_arrays(sides: list[SampleSet], outputs: list[str]) -> tuple[list[SampleSet], list[str]]:
    """Array-valued outputs (e.g. `dp_quantiles`, one released value per level) become one output
    column per element, `c[1]`, `c[2]`, … (ClickHouse's 1-based element syntax). A run whose array
    is shorter (or NULL) has NaN in the missing elements, so its length becomes a feature too."""
    arrays = [c for c in outputs
              if any(c in s.frame and s.frame[c].map(_is_array).any() for s in sides)]
    if not arrays:
        return sides, outputs
    width = {c: max((int(s.frame[c].map(lambda v: len(v) if _is_array(v) else 0).max())
                     for s in sides if c in s.frame and len(s.frame)), default=0) for c in arrays}
    new_sides = []
    for s in sides:
        f = s.frame.copy()
        for c in arrays:
            if c not in f:
                continue
            for i in range(width[c]):
                f[f"{c}[{i + 1}]"] = [float(v[i]) if _is_array(v) and i < len(v) and v[i] is not None
                                     else np.nan for v in f[c]]
            f = f.drop(columns=c)
        new_sides.append(SampleSet(f, s.n, s.vectorised))
    new_outputs = []
    for c in outputs:
        new_outputs += [f"{c}[{i + 1}]" for i in range(width[c])] if c in arrays else [c]
    return new_sides, new_outputs


def to_matrix(sides: list[SampleSet], keys: list[str], outputs: list[str]):
    """Pivot result rows into one (n × k) float matrix per side over a common set of coordinates
    (output column × group key × row number within the key). A coordinate missing from a run
    (e.g. a group suppressed by thresholding) is NaN. Array outputs are expanded first
    (`expand_arrays`)."""
    sides, outputs = expand_arrays(sides, outputs)
    numeric_outputs, extra_keys = [], []
    for c in outputs:
        if all(pd.api.types.is_numeric_dtype(s.frame[c]) or pd.api.types.is_bool_dtype(s.frame[c])
               for s in sides if c in s.frame):
            numeric_outputs.append(c)
        else:
            extra_keys.append(c)
    keys = list(keys) + extra_keys
    if not keys and all(len(s.frame) and s.frame[REP].is_unique and s.frame[REP].between(0, s.n - 1).all()
                        for s in sides):
        return _one_row_runs(sides, numeric_outputs)
    return _pivot(sides, keys, numeric_outputs)


def _pivot(sides: list[SampleSet], keys: list[str], numeric_outputs: list[str]):
    """to_matrix's general case: any number of result rows per run, grouped by ``keys``."""
    pivots = []
    for s in sides:
        f = s.frame.copy()
        f[ROW] = f.groupby([REP] + keys, dropna=False).cumcount() if keys else f.groupby(REP).cumcount()
        idx = [REP] + keys + [ROW]
        values = f.set_index(idx)[numeric_outputs].astype(np.float64)
        wide = values.unstack([k for k in keys + [ROW]]) if len(idx) > 1 else values
        wide = wide.reindex(range(s.n))
        pivots.append(wide)
    columns = pivots[0].columns
    for p in pivots[1:]:
        columns = columns.union(p.columns, sort=False)
    columns = sorted(columns, key=lambda c: tuple(str(x) for x in (c if isinstance(c, tuple) else (c,))))
    mats = [p.reindex(columns=columns).to_numpy(dtype=np.float64) for p in pivots]
    names = [_coord_name(c, len(keys)) for c in columns]
    return mats, names


def _one_row_runs(sides: list[SampleSet], outputs: list[str]):
    """to_matrix for the common case, one result row per run and no keys: each side is its output
    columns indexed by run (the same matrices and names as the general pivot, without pandas'
    group-by and unstack, which cost ~10 ms a side: the worst-case search pivots once per
    candidate)."""
    columns = sorted(outputs, key=str)
    mats = []
    for s in sides:
        m = np.full((s.n, len(columns)), np.nan)
        m[s.frame[REP].to_numpy()] = s.frame[columns].to_numpy(dtype=np.float64, na_value=np.nan)
        mats.append(m)
    return mats, [str(c) for c in columns]


def _coord_name(col, n_keys: int) -> str:
    if not isinstance(col, tuple):
        return str(col)
    out, *rest = col
    key_vals, row = rest[:n_keys], rest[n_keys] if len(rest) > n_keys else 0
    label = str(out)
    if key_vals:
        label += "[" + ", ".join(str(v) for v in key_vals) + "]"
    if row:
        label += f"#{row}"
    return label
