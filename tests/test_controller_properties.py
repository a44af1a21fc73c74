"""Property tests (hypothesis): for generated accepted queries, every output column of the
rewritten SQL is a noised aggregate, post-processing of noised aggregates, or a released group key
(public key domain, or raw key gated by the noisy partition-selection filter). Checked by a
column-lineage analysis of the rewritten SQL itself (parsed back with sqlglot), so it does not
trust the planner's own bookkeeping."""
from __future__ import annotations

import pytest
import sqlglot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlglot import exp

from dpch.controller import prepare
from dpch.errors import QueryRejected
from test_controller_fixtures import DB, setup_controller_data

NOISE_UDFS = {"dpch_laplace_int", "dpch_gaussian_int", "dpch_laplace", "dpch_gaussian", "dpch_partition_select"}


# ------------------------------------------------------------------------------------------------
# lineage of the rewritten SQL
# ------------------------------------------------------------------------------------------------

def _fname(node):
    if isinstance(node, (exp.Anonymous, exp.CombinedAggFunc, exp.AnonymousAggFunc)):
        return (node.this if isinstance(node.this, str) else node.name).lower()
    if isinstance(node, exp.Explode):
        return "arrayjoin"
    if isinstance(node, (exp.ArgMin, exp.ArgMax)):
        return "argmin"
    return ""


def _sources(select: exp.Select):
    """alias -> source (Subquery/Table) of a SELECT, plus ARRAY JOIN aliases."""
    out = {}
    frm = select.args.get("from_")
    srcs = [frm.this] if frm is not None else []
    array_joins = {}
    for j in select.args.get("joins") or []:
        if isinstance(j.this, (exp.Subquery, exp.Table)):
            srcs.append(j.this)
        elif isinstance(j.this, exp.Alias) or j.alias:
            array_joins[j.alias or j.this.alias] = j.this.this if isinstance(j.this, exp.Alias) else j.this
    for s in srcs:
        out[s.alias_or_name or f"__anon{len(out)}"] = s
    return out, array_joins


def _projection(select: exp.Select, name: str):
    for p in select.expressions:
        if p.alias_or_name == name:
            return p.this if isinstance(p, exp.Alias) else p
    return None


def column_deps(select: exp.Select, name: str, _seen=None) -> set[str]:
    expr = _projection(select, name)
    if expr is None:
        # a column of a source
        return _resolve(select, exp.column(name), _seen)
    return expr_deps(select, expr, _seen, exclude=name)


def _resolve(select, col: exp.Column, _seen, exclude=None) -> set[str]:
    name = col.name
    srcs, array_joins = _sources(select)
    if name in array_joins:
        return expr_deps(select, array_joins[name], _seen)
    if not col.table and name != exclude:
        own = _projection(select, name)
        if own is not None and not (isinstance(own, exp.Column) and own.name == name):
            return expr_deps(select, own, _seen, exclude=name)
    if not col.table:  # ClickHouse's scalar `WITH <expr> AS name` (the released values)
        w = select.args.get("with_")
        for cte in (w.expressions if w else []):
            if cte.args.get("scalar") and cte.alias_or_name == name:
                return expr_deps(select, cte.this, _seen)
    candidates = [s for a, s in srcs.items() if not col.table or a == col.table]
    deps: set[str] = set()
    found = False
    for s in candidates:
        if isinstance(s, exp.Table):
            deps.add(f"raw:{name}")
            found = True
        elif isinstance(s, exp.Subquery):
            inner = s.this
            if _projection(inner, name) is not None or len(candidates) == 1:
                deps |= column_deps(inner, name, _seen)
                found = True
    assert found, f"unresolved column {col.sql()}"
    return deps


def expr_deps(select, expr, _seen=None, exclude=None) -> set[str]:
    lambda_vars = set()
    for lam in expr.find_all(exp.Lambda):
        lambda_vars |= {e.name for e in lam.expressions}
    deps: set[str] = set()

    def visit(node):
        name = _fname(node)
        if name in NOISE_UDFS:
            deps.add("noise")
            return
        if name == "argmin" and isinstance(node, (exp.ArgMin, exp.ArgMax)):
            visit(node.this)  # the value comes from the first argument; the second chooses the row
            return
        if name.endswith(("argmin", "argmax")) and name != "countargmin":
            visit(node.expressions[0])
            return
        if name == "countargmin":
            return
        if name in ("siphash64keyed", "inthash64", "cityhash64"):
            # the keyed hash of (unit, keys) only orders a unit's groups (which ones it keeps): a
            # control dependency, tracked as "hash"; it must never be an output value by itself
            deps.add("hash")
            return
        if name == "arrayjoin" and not list(node.find_all(exp.Column)):
            deps.add("public")
            return
        if isinstance(node, exp.Column):
            if node.name in lambda_vars:
                return
            deps.update(_resolve(select, node, _seen, exclude))
            return
        for child in node.iter_expressions():
            visit(child)

    visit(expr)
    return deps


def _chain(select: exp.Select):
    """The chain of single-source subqueries from the outer query inwards."""
    out = [select]
    while True:
        frm = out[-1].args.get("from_")
        if frm is None or not isinstance(frm.this, exp.Subquery) or out[-1].args.get("joins"):
            return out
        out.append(frm.this.this)


def check_rewritten(prepared) -> None:
    plan = prepared.plan
    tree = sqlglot.parse_one(prepared.rewritten.sql, read="clickhouse")
    key_cols = {c for k in plan.bound.keys for c in k.columns}
    allowed_key_raw = {f"raw:{c}" for c in key_cols}
    gated = False
    for s in _chain(tree):
        w = s.args.get("where")
        if w is not None and "noise" in expr_deps(s, w.this):
            gated = True
    for out in plan.bound.outputs:
        deps = column_deps(tree, out.name)
        raw = {d for d in deps if d.startswith("raw:")}
        if out.kind in ("aggregate", "derived"):
            assert not raw or (raw <= allowed_key_raw and (gated or plan.key_mode != "threshold")), (out.name, deps)
            if out.kind == "aggregate":
                assert "noise" in deps, (out.name, deps)
        elif out.kind == "key" or raw:
            if plan.key_mode == "public":
                assert deps <= {"public"}, (out.name, deps)
            else:
                assert raw <= allowed_key_raw and gated, (out.name, deps, gated)
        assert deps != {"hash"}, (out.name, deps)
        for d in deps:
            assert d in ("noise", "public", "hash") or d in allowed_key_raw, (out.name, d)
    # filters and ordering of the outer query use released values only
    for part in ("where",):
        node = tree.args.get(part)
        if node is not None:
            deps = expr_deps(tree, node.this)
            assert all(d in ("noise", "public", "hash") or d in allowed_key_raw for d in deps), deps
    order = tree.args.get("order")
    if order is not None:
        for o in order.expressions:
            deps = expr_deps(tree, o.this)
            assert all(d in ("noise", "public", "hash") or d in allowed_key_raw for d in deps), deps


# ------------------------------------------------------------------------------------------------
# generated queries
# ------------------------------------------------------------------------------------------------

AGGS = ["COUNT(*)", "COUNT(price)", "SUM(amount)", "AVG(age)", "SUM(price * qty)", "COUNT(DISTINCT user_id)",
        "STDDEV_POP(amount)", "countIf(age > 40)", "sumIf(amount, flag)", "AVG(least(amount, 100) + 1)",
        "VAR_SAMP(qty)", "SUM(if(region = 'EU', 1, 0))"]
KEYS = ["region", "category", "qty", "intDiv(age, 10)", "lower(region)"]
WHERES = ["", "WHERE age > 30", "WHERE region IN ('EU', 'US')", "WHERE price IS NOT NULL AND flag",
          "WHERE category LIKE 'c1%'"]
WRAPS = ["{a}", "{a} * 2", "round({a}, 1)", "{a} + {b}", "{a} / greatest({b}, 1)", "abs({a} - {b})"]


@st.composite
def queries(draw):
    table = draw(st.sampled_from(["purchases", "events"]))
    keys = draw(st.lists(st.sampled_from(KEYS), min_size=0, max_size=2, unique=True))
    aggs = draw(st.lists(st.sampled_from(AGGS), min_size=1, max_size=4, unique=True))
    items = [f"{k} AS k{i}" for i, k in enumerate(keys)]
    for i, a in enumerate(aggs):
        wrap = draw(st.sampled_from(WRAPS))
        b = draw(st.sampled_from(aggs))
        items.append(f"{wrap.format(a=a, b=b)} AS v{i}")
    sql = f"SELECT {', '.join(items)} FROM {DB}.{table} {draw(st.sampled_from(WHERES))}"
    if keys:
        sql += " GROUP BY " + ", ".join(f"k{i}" for i in range(len(keys)))
        if draw(st.booleans()):
            sql += " HAVING v0 > 1"
    if draw(st.booleans()):
        sql += f" ORDER BY v{draw(st.integers(0, len(aggs) - 1))} DESC"
    if draw(st.booleans()):
        sql += f" LIMIT {draw(st.integers(1, 20))}"
    delta = draw(st.sampled_from([0.0, 1e-6]))
    mechanism = draw(st.sampled_from(["auto", "laplace", "gaussian"]))
    if mechanism == "gaussian" and delta == 0.0:
        mechanism = "auto"
    return sql, delta, mechanism


@pytest.fixture(scope="module")
def pdb(db):
    setup_controller_data(db)
    return db


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(q=queries())
def test_outputs_are_noised_or_released_keys(pdb, q):
    sql, delta, mechanism = q
    try:
        prepared = prepare(pdb, sql, epsilon=1.0, delta=delta, mechanism=mechanism)
    except QueryRejected as exc:
        # the only rejection this grammar can hit: a key without a public domain at delta = 0
        assert delta == 0.0 and "no public key set applies" in str(exc), str(exc)
        return
    check_rewritten(prepared)
    df = pdb.raw_query(prepared.rewritten.sql)  # the rewritten SQL is valid ClickHouse
    assert list(df.columns)[:len(prepared.plan.bound.outputs)] == [o.name for o in prepared.plan.bound.outputs]


def test_lineage_checker_catches_raw_output(pdb):
    """The checker is not vacuous: a rewritten query with a raw column smuggled into the output fails."""
    prepared = prepare(pdb, f"SELECT region, SUM(amount) AS s FROM {DB}.purchases GROUP BY region",
                       epsilon=1.0)
    bad_sql = prepared.rewritten.sql.replace("dpch_laplace_int(toInt64(__dp_q0)", "identity(toInt64(__dp_q0)")
    bad = type(prepared.rewritten)(sql=bad_sql, display_sql=bad_sql, output_names=prepared.rewritten.output_names,
                                   internal_columns=prepared.rewritten.internal_columns)
    prepared.rewritten = bad
    with pytest.raises(AssertionError):
        check_rewritten(prepared)
