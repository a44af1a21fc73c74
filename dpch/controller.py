"""The controller: analyst SQL in, differentially private DataFrame out.

    parse ─► relation ─► bind ─► total ─► plan ─► rewrite ─► type-check ─► charge ─► execute ─► post-process
  dpch.parse  dpch.relation  dpch.bind  dpch.totality  dpch.plan  dpch.rewrite  dpch.typecheck (and
  dpch.probe_db)  ledger  dpch.execute  dpch.postprocess

This module alone composes the stages; each imports only the stages before it and the shared model
(docs/ARCHITECTURE.md, checked by lint-imports). What a stage needs from a later one or from the
engine, it receives from here as an argument (dpch.relation.services.RelationServices).

``run_query(conn, sql, *, epsilon, delta=0, **options)`` and ``explain_query(...)`` are what
``Connection.query`` / ``Connection.explain`` call. Guarantees:

- a query that is rejected (parse, bind, totality, plan, or the type check on one row of default
  values) runs nothing on the data and charges nothing; a query that passes cannot fail on the data
  for a value-dependent reason (every row-level function is total, dpch.totality);
- the plan's full cost is charged to ``(conn.analyst, <database.table>)`` through
  ``conn.ledger.charge`` *before* the query runs (fail closed: a ledger error means no answer);
  the charge is then marked "executed" or "failed" (a failed execution stays charged);
- ``explain_query`` never charges and never executes.

Options (keyword arguments): ``mechanism`` ("auto" | "laplace" | "gaussian"), ``weights``
(budget split, see dpch.plan), ``keys`` (public key values per GROUP BY key for this query),
``confidence`` (CI level, default 0.95), ``with_ci`` (add CI columns).
"""
from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import pandas as pd
from sqlglot import exp

from . import plan_cache
from .bind import BoundQuery, bind
from .errors import CatalogError, DPCHError, InvalidParameter, LedgerError, QueryRejected
from .execute import execute, execute_formatted
from .parse import ParsedQuery, parse
from .plan import Plan, QueryOptions, check_budget_args, make_plan
from .postprocess import postprocess
from .relation import RELATION_PLACEHOLDER, split_from
from .relation.resolver import needs_unit_chain, resolve
from .relation.services import RelationServices
from .probe_db import check_before_charge
from .rewrite import Rewritten, placement, rewrite
from .rewrite.unit_table import forget as forget_per_unit, serve as serve_per_unit
from .totality import make_total, make_total_expressions, make_total_templates
from .typecheck import expression_types
from .catalog import base_type
from .cost import PrivacyCost
from .plan.profile import BiasEstimate
from .unit_profile import (ProfileSpec, affine, choose_bounds, noise_rows, noise_value, profile_spec,
                           run_bias_counts, run_histograms)
from .unit_profile import attach as attach_bias
from .units import unit_path


@dataclass
class Prepared:
    """Everything decided before the ledger is touched."""

    parsed: ParsedQuery
    bound: BoundQuery
    plan: Plan
    rewritten: Rewritten
    timings_ms: dict[str, float] = field(default_factory=dict)
    # the unit profile (bounds from the data, bias counts): released after the charge, before the plan
    # runs; the plan was made at ε minus the profile's share (dpch.unit_profile)
    profile: ProfileSpec | None = None
    key_types: Any = None
    requested: tuple[float, float] = (0.0, 0.0)

    @property
    def dataset(self) -> str:
        return self.plan.entry.table

    @property
    def cost(self) -> PrivacyCost:
        """What the query is charged: its plan and, when there is one, its profile's releases."""
        if self.profile is None:
            return self.plan.cost
        return PrivacyCost(self.profile.costs() + self.plan.cost.mechanisms)

    @property
    def controller_ms(self) -> float:
        return sum(self.timings_ms.values())


def prepare(conn, sql: str, *, epsilon: Any, delta: Any = 0.0, tree=None, precheck: bool = False,
            profile: bool = False, cache: bool = True, **options) -> Prepared:
    """parse → budget precheck → bind → total → plan → rewrite. Raises QueryRejected /
    InvalidParameter / BudgetExceeded; charges nothing and reads no row: the engine is asked only
    for the catalog (usually cached) and for the types of the query's expressions (a DESCRIBE,
    dpch.typecheck). ``precheck``: before the engine analyses anything the analyst wrote, the
    ledger confirms (read-only) that the analyst can afford the declared (ε, δ) on every dataset
    the query reads (DESIGN.md invariant 10). Every path that charges afterwards passes True (run_query,
    run_query_formatted, propose-test-release); inspection (explain, the audit, tests) does not. ``tree``:
    ``sql`` already parsed (dpch.parse.parse). ``profile``: the caller runs the unit profile (bounds
    'auto', bias_share; dpch.unit_profile) as run_query does; other release paths refuse those options.
    ``cache``: False prepares afresh, bypassing dpch.plan_cache (the audit: it examines the mechanism
    as it stands now)."""
    t0 = time.perf_counter()
    opts = QueryOptions.from_kwargs(options)
    if not profile and opts.profile_share > 0:
        raise InvalidParameter("bounds 'auto' and bias_share are answered by db.query / the gateway's SELECT only; "
                               "give fixed bounds here (choose them with db.tune or a query with 'auto')")
    eps, dlt = check_budget_args(epsilon, delta)
    key = plan_cache.key_for(conn, sql, tree, eps, dlt, opts, profile) if cache else None
    if (hit := plan_cache.get(key)) is not None:  # same analyst, query, catalog state, ε, δ, options
        if precheck:
            _precheck_budget(conn, hit.parsed, eps, dlt)
        return replace(hit, timings_ms={"plan cache": (time.perf_counter() - t0) * 1e3})
    parsed = parse(sql, tree)
    if precheck:
        _precheck_budget(conn, parsed, eps, dlt)
    t1 = time.perf_counter()
    parsed, entry = _relation(conn, parsed)
    opts = _with_catalog_auto(opts, entry, profile)
    entry = _with_contribution(entry, opts)
    bound = bind(parsed, entry)
    bound = make_total(bound, lambda sqls: expression_types(conn.backend, entry, sqls))
    key_types = expression_types(conn.backend, entry, [k.sql for k in bound.keys]) if bound.keys else None
    bound = make_total_templates(bound, key_types)
    bound, value_columns = _with_value_bounds(bound, opts)
    t2 = time.perf_counter()
    # the profile's share of ε (auto bounds, bias counts) is not the plan's: ε_plan = ε - shares
    plan_eps = eps - (opts.auto_share * eps if opts.auto else 0.0) - opts.bias_share * eps
    plan = make_plan(bound, plan_eps, dlt, opts, key_types=key_types)
    profile = (profile_spec(plan, eps, noise_at(bound, plan, key_types), value_columns)
               if opts.profile_share > 0 else None)
    if opts.auto and (profile is None or profile.request is None):
        # nothing to choose after all (e.g. bounds 'auto' of a column no aggregate reads): the plan
        # gets the auto share back
        plan_eps = eps - opts.bias_share * eps
        plan = make_plan(bound, plan_eps, dlt, opts, key_types=key_types)
        profile = profile_spec(plan, eps, noise_at(bound, plan, key_types), value_columns) if opts.bias_share else None
    if profile is not None:
        plan = _exact_total(plan, profile, eps, lambda e: make_plan(bound, e, dlt, opts, key_types=key_types))
    t3 = time.perf_counter()
    rewritten = rewrite(plan)
    t4 = time.perf_counter()
    timings = {"parse": (t1 - t0) * 1e3, "bind": (t2 - t1) * 1e3, "plan": (t3 - t2) * 1e3,
               "rewrite": (t4 - t3) * 1e3}
    prepared = Prepared(parsed, bound, plan, rewritten, timings, profile, key_types, (eps, dlt))
    plan_cache.put(key, prepared)
    return prepared


def _exact_total(plan: Plan, profile: ProfileSpec, eps: float, plan_at) -> Plan:
    """The plan whose cost, with the profile's, sums (as the ledger sums it) to exactly ε when an ulp
    step of the plan's ε can reach it, else to just below: never above what was asked."""
    def total(p: Plan) -> float:
        return PrivacyCost(profile.costs() + p.cost.mechanisms).epsilon

    for _ in range(8):
        t = total(plan)
        if t == eps:
            break
        if t > eps:
            plan = plan_at(math.nextafter(plan.epsilon, 0.0))
            continue
        trial = plan_at(math.nextafter(plan.epsilon, math.inf))
        if total(trial) > eps:
            break
        plan = trial
    while total(plan) > eps:  # not reached in practice: eight steps always come back under
        plan = plan_at(math.nextafter(plan.epsilon, 0.0))
    return plan


def _precheck_budget(conn, parsed: ParsedQuery, eps: float, dlt: float) -> None:
    """The ledger's free, read-only affordability check (Ledger.precheck) for every dataset the query
    would charge: the unit root of each protected table it names. Uses the catalog only; a table the
    catalog does not know is left to the relation stage's message."""
    names = [parsed.table_ref] if parsed.sources is None else _source_tables(parsed.sources)
    datasets = []
    for name in names:
        try:
            entry = conn.catalog.get(conn.catalog.qualify(name))
            if entry.public:
                continue
            path = unit_path(entry, conn.catalog.lookup)
        except CatalogError:
            continue
        root = path.root.table if path is not None else entry.table
        if root not in datasets:
            datasets.append(root)
    if not datasets:
        return
    ledger = charging_ledger(conn)
    for dataset in datasets:
        ledger.precheck(conn.analyst, dataset, eps, dlt)


def _source_tables(spec) -> list[str]:
    """Every table named in a FromSpec: its FROM/JOIN tables, and those inside its subqueries and
    semi-joins (CTE names among them are skipped by the caller: the catalog does not know them)."""
    out = []
    nodes = [src.table for src in spec.sources if src.table is not None]
    for sub in [src.subquery for src in spec.sources if src.subquery is not None] + [s.subquery for s in spec.semijoins]:
        nodes += list(sub.find_all(exp.Table))
    for t in nodes:
        name = f"{t.db}.{t.name}" if t.db else t.name
        if name not in out:
            out.append(name)
    return out


def _with_catalog_auto(opts: QueryOptions, entry, profile: bool) -> QueryOptions:
    """The catalog's 'auto' bounds (TableEntry.auto) for what the query does not give itself. A
    release path without the unit profile (``profile`` False) refuses them: it needs fixed bounds."""
    wanted = [a for a in getattr(entry, "auto", ()) if not (
        (a in QueryOptions.AUTO and (getattr(opts, a) is not None or a in opts.auto))
        or (a.startswith("bounds:") and (a[7:] in (opts.value_bounds or {}) or a[7:] in opts.auto_columns
                                          or opts.auto_columns == ("*",))))]
    if not wanted or opts.auto_share == 0.0:
        return opts
    if not profile:
        raise InvalidParameter(f"{entry.table} declares {', '.join(wanted)} as 'auto' (chosen per query from the "
                               "data), which db.query / the gateway's SELECT answer; give fixed ones here "
                               "(max_rows_per_unit=..., bounds={column: (lo, hi)})")
    auto = tuple(opts.auto) + tuple(a for a in wanted if a in QueryOptions.AUTO)
    cols = tuple(opts.auto_columns) + tuple(a[7:] for a in wanted if a.startswith("bounds:"))
    if cols != tuple(opts.auto_columns) and "bounds" not in auto:
        auto += ("bounds",)
    return replace(opts, auto=auto, auto_columns=cols)


def _with_value_bounds(bound: BoundQuery, opts: QueryOptions) -> tuple[BoundQuery, tuple[str, ...]]:
    """The query's own clipping bounds (option ``bounds``): fixed ones replace the catalog's; 'auto'
    columns (every numeric column an aggregate reads, for bounds='auto') get a placeholder (0, 1),
    replaced by the bounds chosen from the data before anything runs on them (dpch.unit_profile)."""
    if not opts.value_bounds and not opts.auto_columns:
        return bound, ()
    entry = bound.entry
    read = []
    for call in bound.aggregates:
        for col in (call.arg.find_all(exp.Column) if call.arg is not None else ()):
            if col.name in entry.columns and col.name not in read:
                read.append(col.name)
    named = list(opts.value_bounds or {}) + [c for c in opts.auto_columns if c != "*"]
    unknown = [c for c in named if c not in entry.columns]
    if unknown:
        raise InvalidParameter(f"bounds: {', '.join(map(repr, unknown))} not a column of {entry.table}")
    numeric = [c for c in read if base_type(entry.columns[c]).startswith(("Int", "UInt", "Float", "Decimal"))]
    # a column no aggregate reads has nothing to clip: no histogram for it
    auto = tuple(numeric) if opts.auto_columns == ("*",) else tuple(c for c in opts.auto_columns if c in read)
    merged = dict(entry.bounds)
    merged.update(opts.value_bounds or {})
    merged.update({c: (0.0, 1.0) for c in auto})
    return replace(bound, entry=replace(entry, bounds=merged)), tuple(auto)


def _with_contribution(entry, opts: QueryOptions):
    """The relation with the query's own contribution bounds (k, M, C), if it gives any."""
    given = opts.contribution()
    if not given:
        return entry
    if entry.privacy_unit is None:
        raise InvalidParameter(f"{', '.join(given)}: {entry.table} is row level (every row is a unit, k = M = C = 1); "
                               "contribution bounds apply to tables with a privacy unit")
    return replace(entry, **given)


def _relation(conn, parsed: ParsedQuery) -> tuple[ParsedQuery, Any]:
    """The one relation the query reads: a catalogued table, or the joined relation that
    dpch.relation builds (joins, CTEs, subqueries, IN over public tables, units via references)."""
    if parsed.sources is None:
        try:
            entry = conn.catalog.get(conn.catalog.qualify(parsed.table_ref))
        except CatalogError as exc:
            raise QueryRejected(str(exc)) from None
        if not needs_unit_chain(entry, conn.catalog):
            return parsed, entry
        spec, flat = split_from(parsed.select)
        parsed = replace(parsed, select=flat, database=None, table=RELATION_PLACEHOLDER, alias=None, sources=spec)
    flat, entry = resolve(parsed.sources, parsed.select, conn.catalog, _relation_services(conn.backend))
    return replace(parsed, select=flat), entry


def _relation_services(backend) -> RelationServices:
    """The engine reads and later stages the relation stage may call (it imports neither)."""
    def types(entry, sqls):
        return expression_types(backend, entry, sqls)

    def total(roots, entry):
        return make_total_expressions(roots, entry, lambda sqls: expression_types(backend, entry, sqls))

    return RelationServices(query_df=backend.query_df, expression_types=types, total_expressions=total)


def run_query(conn, sql: str, *, epsilon: Any, delta: Any = 0.0, tree=None, **options) -> pd.DataFrame:
    """Answer ``sql`` with (ε, δ)-differential privacy (see the module docstring). ``tree``: ``sql``
    already parsed by the caller (the ledger records ``sql``)."""
    prepared = prepare(conn, sql, epsilon=epsilon, delta=delta, tree=tree, precheck=True, profile=True, **options)
    if prepared.profile is None:
        (df, rw, source), receipt = _charge_and_run(
            conn, prepared, sql, None, lambda: _served(conn, prepared, lambda r: execute(conn.backend, r)))
        out = postprocess(df, prepared.plan, rw, receipt=receipt, controller_ms=prepared.controller_ms)
        out.attrs["dpch"]["per_unit_source"] = source
        return out

    def run():
        final, bias = _profiled(conn, prepared)
        return (final, bias) + _served(conn, final, lambda r: execute(conn.backend, r))

    (final, bias, df, rw, source), receipt = _charge_and_run(conn, prepared, sql, None, run)
    out = postprocess(df, final.plan, rw, receipt=receipt, controller_ms=prepared.controller_ms)
    out.attrs["dpch"]["per_unit_source"] = source
    cost = prepared.cost
    return attach_bias(out, bias, cost.epsilon, cost.delta)


def _served(conn, prepared: Prepared, run: Callable[[Rewritten], Any]) -> tuple[Any, Rewritten, str]:
    """(``run``'s result, the query it ran, where the per-unit stage was read: "table" or a
    maintained per-unit table's name). A fresh per-unit table that holds the plan's per-unit stage
    is read instead of the table (dpch.rewrite.unit_table: the same pre-noise values, so the same
    guarantee); if reading it fails (dropped meanwhile), the table is read, once."""
    rewritten, source = serve_per_unit(conn.backend, prepared.plan, prepared.rewritten)
    if source != "table":
        try:
            return run(rewritten), rewritten, source
        except DPCHError:
            forget_per_unit(conn.backend, prepared.plan.entry.table)
    return run(prepared.rewritten), prepared.rewritten, "table"


def _profiled(conn, prepared: Prepared) -> tuple[Prepared, BiasEstimate]:
    """After the charge: release the profile, re-plan at the bounds it chose (post-processing of
    the released histograms) and measure the bias with the final bounds. The re-planned query must
    cost exactly what was charged (its releases differ in k and M only, not in ε or δ); otherwise
    nothing more runs (fail closed: the charge stays)."""
    spec = prepared.profile
    assert spec is not None
    final, choices, dropped = prepared, (), None
    if spec.request is not None:
        hists = run_histograms(conn.backend, prepared.plan, spec)
        def noise_value_at(fixed: dict, col: str, bounds: tuple[float, float]) -> float:
            return noise_value(_plan_at(prepared.bound, prepared.plan, prepared.key_types,
                                        {**fixed, "bounds": {col: bounds}}))

        chosen, choices, dropped = choose_bounds(prepared.plan, hists,
                                                 noise_at(prepared.bound, prepared.plan, prepared.key_types),
                                                 noise_value_at)
        if chosen:
            final = _replanned(prepared, chosen)
    cut = clipped = sd = None
    if spec.bias_epsilon > 0:
        cut, clipped, sd = run_bias_counts(conn.backend, final.plan, spec)
    source = " and ".join(s for s, on in (("auto-bounds histograms", spec.request is not None),
                                          ("bias counts", spec.bias_epsilon > 0)) if on)
    eps = sum(c.epsilon for c in spec.costs())
    return final, BiasEstimate(cut, clipped, dropped, sd, eps, source, tuple(choices))


def _plan_at(bound: BoundQuery, plan: Plan, key_types, bounds: dict) -> Plan:
    """``plan`` made again with other contribution bounds (same ε, δ and options); ``bounds`` may
    carry "bounds": {column: (lo, hi)}, merged into the entry's clipping bounds."""
    fields = dict(bounds)
    if "bounds" in fields:
        fields["bounds"] = {**bound.entry.bounds, **fields["bounds"]}
    entry = replace(bound.entry, **fields)
    return make_plan(replace(bound, entry=entry), plan.epsilon, plan.delta, plan.options, key_types=key_types)


def noise_at(bound: BoundQuery, plan: Plan, key_types):
    """noise_rows(k, M) of the plan at those bounds (dpch.unit_profile.noise_rows), cached. For a
    given k the noise is affine in M (sensitivities are M·B; the unit counts do not depend on M): it
    is planned at M = 1, 2 and 64, and the line used when it predicts M = 64 within 1 %, else every
    M is planned. Utility only: the bounds' privacy does not depend on this estimate."""
    cache: dict[tuple[int, int], float] = {}
    lines: dict[int, Callable[[float], float]] = {}

    def exact(k: int, m: int) -> float:
        if (k, m) not in cache:
            cache[(k, m)] = noise_rows(_plan_at(bound, plan, key_types,
                                                {"max_groups_contributed": k, "max_rows_per_unit": m}))
        return cache[(k, m)]

    def at(k: int, m: int) -> float:
        if k not in lines:
            lines[k] = affine(lambda x: exact(k, int(x)), 1.0, 2.0, 64.0)
        return lines[k](m)
    return at


def _replanned(prepared: Prepared, chosen: dict[str, int]) -> Prepared:
    plan = _plan_at(prepared.bound, prepared.plan, prepared.key_types, chosen)
    if _privacy_of(plan.cost) != _privacy_of(prepared.plan.cost):
        raise LedgerError("the bounds chosen from the data changed the plan's privacy cost; nothing more "
                          "ran (the charge stays)")
    return replace(prepared, plan=plan, rewritten=rewrite(plan))


def _privacy_of(cost: PrivacyCost) -> list[tuple]:
    """What the accountants read of a cost, bounds aside: each release's kind, ε, δ, ρ."""
    return sorted((m.kind, m.epsilon, m.delta, m.rho) for m in cost.mechanisms)


@dataclass(frozen=True)
class FormattedAnswer:
    """A DP answer rendered by the engine in a ClickHouse output format (``body``), with what was
    charged for it."""

    body: bytes
    rows: int | None
    dataset: str
    epsilon: float
    delta: float
    receipt: Any
    bias: BiasEstimate | None = None  # the profile's estimate, when the query asked for one


def run_query_formatted(conn, sql: str, fmt: str, *, epsilon: Any, delta: Any = 0.0, tree=None,
                        format_settings: dict[str, str] | None = None, **options) -> FormattedAnswer:
    """``run_query`` with the same guarantee and the same pipeline, but the released columns are
    rendered by ClickHouse itself in output format ``fmt`` (with ``format_settings``, validated by
    the caller) in the query that computes them: no DataFrame round trip (the gateway's path). The
    type check renders its probe in ``fmt`` too, so a result the format cannot hold is refused
    before the charge. Confidence-interval columns need the DataFrame path (``with_ci`` refused)."""
    if options.get("with_ci"):
        raise InvalidParameter("run_query_formatted does not add CI columns; use run_query")
    prepared = prepare(conn, sql, epsilon=epsilon, delta=delta, tree=tree, precheck=True, profile=True, **options)

    def run():
        final, bias = _profiled(conn, prepared) if prepared.profile is not None else (prepared, None)
        return bias, _served(conn, final, lambda r: execute_formatted(conn.backend, r, fmt, format_settings))[0]

    (bias, out), receipt = _charge_and_run(conn, prepared, sql, (fmt, format_settings), run)
    cost = prepared.cost
    return FormattedAnswer(out.body, out.rows, prepared.dataset, cost.epsilon, cost.delta,
                           getattr(receipt, "id", receipt), bias)


def charge_first(conn, dataset: str, cost, text: str):
    """(ledger, receipt): the charge made before anything runs (DESIGN.md invariant 2), by every
    release path (queries, sparse vector, PTR, early stopping, Block-DP). No ledger, no release
    (fail closed). Raises BudgetExceeded / QueryRejected with nothing charged."""
    ledger = charging_ledger(conn)
    return ledger, ledger.charge(conn.analyst, dataset, cost, text)


def charging_ledger(conn):
    """The connection's ledger; any failure to reach it is a LedgerError (fail closed: no ledger,
    no release)."""
    try:
        return conn.ledger
    except DPCHError:
        raise
    except Exception as exc:  # fail closed
        raise LedgerError(f"the budget ledger is unavailable ({type(exc).__name__}); nothing ran") from None


def _charge_and_run(conn, prepared: Prepared, sql: str, rendering, run):
    """type-check → charge → execute → mark; returns (run's result, receipt). ``rendering`` =
    (format, settings) when the result is rendered by the engine (the probe is rendered alike)."""
    # on probe data (one row of defaults per table, the real joins), before the charge: a query
    # that cannot run is rejected free (dpch.probe_db)
    check_before_charge(conn, prepared.plan, rendering)
    ledger, receipt = charge_first(conn, prepared.dataset, prepared.cost, sql)
    try:
        result = run()
    except BaseException:
        ledger.mark(receipt, "failed")  # the charge stays: fail closed
        raise
    try:
        ledger.mark(receipt, "executed")
    except DPCHError as exc:  # the charge is durable already; the answer was paid for
        warnings.warn(f"dpch: could not mark the ledger charge as executed: {exc}", RuntimeWarning, stacklevel=3)
    return result, receipt


# ------------------------------------------------------------------------------------------------
# explain
# ------------------------------------------------------------------------------------------------

@dataclass
class Explanation:
    """What a query would do: the rewritten SQL (salt masked), the sensitivity, mechanism and
    budget share of every noisy value, the key policy and the total cost. Nothing ran, nothing was
    charged."""

    sql: str
    table: str
    privacy_unit: str | None
    neighbour: str
    bounding: dict
    key_mode: str
    key_domains: list
    selection: dict | None
    quantities: list[dict]
    aggregates: list[dict]
    outputs: list[dict]
    epsilon: float
    delta: float
    requested_epsilon: float
    requested_delta: float
    timings_ms: dict
    per_unit_stage: str = ""  # how the per-unit stage runs; whether a per-unit projection can serve it
    relation: list[str] = field(default_factory=list)  # joins: the tables, how each reaches the unit
    top_k: dict | None = None  # a top-n query: how it is answered (dpch.plan.top_k.top_k_facts)
    profile: dict | None = None  # bounds from the data / bias counts: the ε split and the rule
    placement: str = ""  # a Distributed table: which stage runs where (dpch.rewrite.shards)

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    def __str__(self) -> str:
        lines = [f"table {self.table}: privacy unit {self.privacy_unit or '(row level)'}, "
                 f"neighbour relation {self.neighbour}"]
        if self.relation:
            lines.append(f"joined relation (bounded per unit after the join; charged to {self.table}):")
            lines += [f"  {line}" for line in self.relation]
        b = self.bounding
        lines.append(f"contribution bounds: {b['k']} group(s) per unit, {b['max_rows']} row(s) per unit, "
                     f"{b['rows_per_group']} per group")
        lines.append(f"group keys: {self.key_mode}")
        for d in self.key_domains:
            lines.append(f"  {d['key']}: {d['source']}" + (f" ({d['size']} values)" if d.get("size") else ""))
        if self.selection:
            s = self.selection
            lines.append(f"partition selection ({s['rule']} rule, ε={s['epsilon']:.6g}, δ={s['delta']:.3g}, "
                         f"<= {s['max_new_groups_per_unit']} count(s) moved per unit): release a group iff noisy "
                         f"{s.get('statistic', 'distinct units')} >= {s['threshold']}; {s['description']}; "
                         f"source: {s['source']}")
        if self.top_k:
            lines.append(_top_k_line(self.top_k))
        lines.append("noisy values:")
        for q in self.quantities:
            if q["kind"] == "quantile":
                lo, hi = q["value_interval"]
                lines.append(
                    f"  {q['label']}: quantile level(s) {', '.join(f'{a:g}' for a in q['levels'])} on a "
                    f"{q['grid_buckets']}-bucket grid over [{lo:.6g}, {hi:.6g}], <= {q['rows_per_unit_per_group']} "
                    f"row(s) per unit per group, exponential mechanism (permute-and-flip), ε={q['epsilon']:.6g} "
                    f"(ε/{q['groups_per_unit']} per group), δ=0, 95% rank error <= ±{q['rank_halfwidth_95']:.4g} rows")
                continue
            lines.append(
                f"  {q['label']}: {q['kind']}, L1={q['sensitivity_l1']:.6g} L2={q['sensitivity_l2']:.6g} "
                f"(value units), {q['mechanism']} scale={q['noise_scale']:.6g}, ε={q['epsilon']:.6g}, "
                f"δ={q['delta']:.3g}, 95% ±{q['ci95_halfwidth']:.6g}")
            if q.get("thesis_mechanism"):
                lines.append("    " + _thesis_line(q["thesis_mechanism"]))
        lines.append("aggregates:")
        for a in self.aggregates:
            lines.append(f"  {a['aggregate']}: {a['function']} from {', '.join(a['quantities'])}")
        if self.per_unit_stage:
            lines.append(f"per-unit stage: {self.per_unit_stage}")
        if self.placement:
            lines.append(f"cluster: {self.placement}")
        if self.profile:
            p = self.profile
            if p["auto"]:
                lines.append(f"bounds from the data: {', '.join(p['auto'])} = 'auto': histograms of "
                             f"{' and '.join(p['histograms']) or '(none needed)'} on a {p['grid']}, "
                             f"ε={p['auto_epsilon']:.6g}; {p['rule']}; the bounds, noise scales and "
                             "intervals above are the catalog's (an 'auto' column's clipping bounds a "
                             "placeholder (0, 1)), replaced by the chosen ones when the query runs")
            if p["bias_epsilon"]:
                lines.append(f"bias counts (units cut by bounding, values clipped): ε={p['bias_epsilon']:.6g}")
        lines.append(f"total cost: ε={self.epsilon:.6g}, δ={self.delta:.3g} "
                     f"(requested ε={self.requested_epsilon:.6g}, δ={self.requested_delta:.3g})")
        lines.append(f"controller time: {sum(self.timings_ms.values()):.2f} ms")
        lines.append("rewritten SQL:")
        lines.append(self.sql)
        return "\n".join(lines)

    def _repr_pretty_(self, p, cycle) -> None:  # IPython
        p.text(str(self))


def _thesis_line(f: dict) -> str:
    """The explain line of a thesis mechanism (dpch.plan.thesis): its parameters and guarantee."""
    if f["mechanism"] == "mixed":
        return (f"mixed noise, {f['branch']} branch (rule {f['rule']}, threshold Δ <= {f['threshold']:.4g}; "
                f"Laplace b={f['laplace_scale']:.6g}, Gaussian σ={f['gaussian_sigma']:.6g}): "
                f"{f['guarantee']}; {f['source']}")
    lo, hi = f["output_range"]
    return (f"bounded Laplace on [{lo:.6g}, {hi:.6g}] ({f['released']}), scale {f['scale']:.6g}, per group "
            f"Δ={f['group_sensitivity']:.6g} at ε={f['group_epsilon']:.6g}, δ={f['group_delta']:.3g}, "
            f"<= {f['groups_per_unit']} group(s) per unit: {f['guarantee']}; {f['source']}")


def _top_k_line(t: dict) -> str:
    scores = t.get("order_noise_std")
    choice = (f" (auto: order noise std {scores['peeling']:.4g} peeling vs {scores['post_processing']:.4g} "
              "post-processing)") if scores else ""
    if t["method"] != "peeling":
        return f"top-n: {t['mechanism']}{choice}"
    gap = f", 95% score gap <= {t['score_gap_95']:.4g}" if t.get("score_gap_95") is not None else ""
    return (f"top-n: the {t['n']} groups with the {'largest' if t['order'] == 'descending' else 'smallest'} "
            f"{t['score']} chosen by {t['mechanism']} among {t['candidates']}, ε={t['epsilon']:.6g} "
            f"(ε/{t['n']} per round), score sensitivity {t['score_sensitivity']:.6g}, temperature "
            f"{t['temperature']:.6g}{gap}; values of the chosen groups only "
            f"(<= {t['groups_per_unit_released']} per unit)" + ("" if t["values_released"] else
                                                                 ", the score itself not released") + choice)


def explain_prepared(prepared: Prepared) -> Explanation:
    from .plan.top_k import top_k_facts
    from .postprocess import mechanism_name, thesis_facts
    from .rewrite.projection import projection_hint

    plan = prepared.plan
    quantities = []
    for q in plan.quantities:
        if not q.released:  # a peeling top-n's score that no output uses (in the top-n line)
            continue
        quantities.append({
            "label": q.label,
            "kind": "partition selection" if q.is_selection and not q.aggregates else (
                {"rows": "count", "units": "distinct units", "sum": "fixed-point sum", "quantile": "quantile",
                 "distinct": "distinct values (kept rows)"}[q.kind]),
            "partition_selection": q.is_selection,
            "sensitivity_l1": q.l1 * q.grid,
            "sensitivity_l2": q.l2 * q.grid,
            "sensitivity_units": {"l1": q.l1, "l2": q.l2},
            "grid": q.grid,
            "per_row_units": [q.lo_units, q.hi_units],
            "value_interval": list(q.value_interval) if q.value_interval else None,
            "mechanism": mechanism_name(q),
            "thesis_mechanism": thesis_facts(q),  # bounded_laplace / mixed: parameters and guarantee
            "noise_scale": q.scale * q.grid,
            "epsilon": q.epsilon,
            "delta": q.delta,
            "weight": q.weight,
            "ci95_halfwidth": float("nan") if q.kind == "quantile" else q.ci_halfwidth_units(0.95) * q.grid,
        })
        if (quantities[-1]["thesis_mechanism"] or {}).get("released") == "clamped mean of the bounded data":
            quantities[-1]["kind"] = "clamped mean (bounded Laplace AVG)"
        if q.kind == "quantile":
            facts = q.quantile_facts(0.95)
            facts["rank_halfwidth_95"] = facts.pop("rank_halfwidth")
            quantities[-1].update(facts)
    aggregates = []
    for ap in plan.aggregates:
        aggregates.append({
            "aggregate": ap.call.text,
            "function": ap.func,
            "quantities": [plan.quantities[qi].label for qi in ap.roles.values()],
            "value_bounds": list(ap.value_interval) if ap.value_interval else None,
        })
    outputs = [{"name": o.name, "kind": o.kind} for o in plan.bound.outputs]
    key_domains = []
    for key, d in zip(plan.bound.keys, plan.key_domains):
        key_domains.append({"key": key.sql, "source": d.source if d else "private partition selection",
                            "size": d.size if d else None})
    sel = plan.selection
    b = plan.bounding
    return Explanation(
        sql=prepared.rewritten.display_sql, table=plan.entry.table,
        privacy_unit=getattr(plan.entry, "unit_name", "") or plan.entry.privacy_unit,
        neighbour=plan.entry.neighbour,
        bounding={"k": b.k, "max_rows": b.max_rows, "rows_per_group": b.rows_per_group, "row_level": b.row_level},
        key_mode=plan.key_mode, key_domains=key_domains,
        selection=None if sel is None else sel.summary(),
        quantities=quantities, aggregates=aggregates, outputs=outputs,
        epsilon=prepared.cost.epsilon, delta=prepared.cost.delta,
        requested_epsilon=prepared.requested[0] if prepared.profile else plan.epsilon,
        requested_delta=prepared.requested[1] if prepared.profile else plan.delta, timings_ms=dict(prepared.timings_ms), per_unit_stage=projection_hint(plan),
        relation=list(getattr(plan.entry, "layout", ())), top_k=top_k_facts(plan),
        profile=prepared.profile.summary() if prepared.profile else None,
        placement=placement(plan.entry) or "")


def explain_query(conn, sql: str, *, epsilon: Any, delta: Any = 0.0, **options) -> Explanation:
    """Explain ``sql`` without executing or charging anything."""
    return explain_prepared(prepare(conn, sql, epsilon=epsilon, delta=delta, profile=True, **options))
