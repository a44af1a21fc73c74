"""Stage 6 of the controller: post-processing of released values (free of privacy cost).

``postprocess(df, plan, rewritten, receipt=None) -> DataFrame``:

- drops the internal noisy quantities (``__dp_n<i>_out``) after using them;
- computes a confidence interval (default level 0.95, option ``confidence=``) for every DP
  aggregate column, for the value of the aggregate on the *bounded* data (after contribution
  bounding and clipping; the bias those introduce is not in the interval):
  COUNT/SUM: the noisy value ± the exact discrete-noise half-width of its mechanism
  (``dpch.mechanisms``), counts clamped at 0; AVG and VAR/STDDEV: the interval image of the
  component intervals (each at level 1 - (1 - level)/m for m components, union bound), clamped
  to the value bounds; quantiles and derived columns (arithmetic over aggregates): ``dpch.intervals``
  (a rank interval, and the interval image of the aggregates' intervals);
- attaches metadata in ``df.attrs["dpch"]`` (documented in docs/CONTROLLER.md):
  ``columns[name]`` = kind ("key", "aggregate", "derived", "constant"), aggregate, mechanism,
  noise_scale (in value units), sensitivity, epsilon, delta, ci_level, ci_low, ci_high (lists);
  plus epsilon, delta (charged), receipt, table, key_mode, selection, sql (salt masked);
- copies the main facts to flat keys of ``df.attrs`` (`FLAT_KEYS`: ``epsilon_spent``,
  ``delta_spent``, ``rho_spent``, ``dataset``, ``receipt``, ``mechanism``, ``noise_scale``,
  ``ci_level``, ``ci_low``, ``ci_high``, ``ci_note``: intervals cover the noise only, ``ci_notes``),
  next to the nested ``df.attrs["dpch"]``;
- with ``with_ci=True``, adds columns ``<name>_lo`` and ``<name>_hi`` after each aggregate and
  derived column (quantiles: ``<name>_rank_ci``, ``<name>_level_lo``/``_level_hi``).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from .mechanisms import MixedNoiseMechanism
from .mechanisms.bounded_laplace import GroupedBoundedLaplace
from .intervals import NOISE_ONLY, derived_ci, quantile_ci
from .mechanisms.intervals import POPULATION_MEAN_CI, population_mean_interval
from .plan import AggregatePlan, Plan, Quantity
from .plan.top_k import top_k_facts
from .results import Rewritten


def _halfwidth_value(q: Quantity, level: float) -> float:
    return q.ci_halfwidth_units(level) * q.grid


def _interval_div(a_lo, a_hi, n_lo, n_hi):
    """[a]/[n] with n > 0 elementwise (numpy arrays)."""
    c = np.stack([a_lo / n_lo, a_lo / n_hi, a_hi / n_lo, a_hi / n_hi])
    return c.min(axis=0), c.max(axis=0)


def mechanism_name(q: Quantity) -> str:
    """The mechanism a quantity's release uses, as results and explain name it: the thesis
    mechanisms ("mixed", "bounded_laplace") by their own name, the branch in their facts."""
    if isinstance(q.noise, MixedNoiseMechanism):
        return "mixed"
    if isinstance(q.noise, GroupedBoundedLaplace):
        return "bounded_laplace"
    return q.mechanism


def thesis_facts(q: Quantity) -> dict | None:
    """The thesis mechanism's public parameters and guarantee (None for the others)."""
    if isinstance(q.noise, MixedNoiseMechanism):
        return q.noise.facts(q.epsilon, q.delta, q.grid)
    if isinstance(q.noise, GroupedBoundedLaplace):
        return q.noise.facts()
    return None


def population_ci(ap: AggregatePlan, plan: Plan, noisy: dict[int, np.ndarray], level: float
                  ) -> tuple[np.ndarray, np.ndarray] | None:
    """The §5.7 interval for the population mean of an AVG (dpch.mechanisms.intervals,
    population_mean_interval), or None where it does not apply: not an AVG, or an AVG released
    directly by bounded Laplace (no noisy count, so no lower bound on n)."""
    if ap.func != "avg" or "count" not in ap.roles:
        return None
    beta = 1.0 - level
    # the noise part at 1 − β/2 (its two components at 1 − β/4 each, as aggregate_ci splits them)
    m_lo, m_hi = aggregate_ci(ap, plan, noisy, 1.0 - beta / 2.0)
    qn = plan.quantities[ap.roles["count"]]
    n = noisy[qn.index].astype(float)
    n_lo = n - _halfwidth_value(qn, 1.0 - beta / 4.0)
    lo, hi = ap.value_interval  # type: ignore[misc]
    return population_mean_interval(m_lo, m_hi, n_lo, lo, hi, beta)


def aggregate_ci(ap: AggregatePlan, plan: Plan, noisy: dict[int, np.ndarray], level: float
                 ) -> tuple[np.ndarray, np.ndarray]:
    qs = plan.quantities
    func = ap.func
    if "mean" in ap.roles:
        # mechanism="bounded_laplace": the clamped mean released directly; its noise interval
        # (BoundedLaplaceMechanism.ci_halfwidth, §5.7) intersected with the value bounds
        q = qs[ap.roles["mean"]]
        v = noisy[q.index].astype(float)
        h = _halfwidth_value(q, level)
        lo, hi = ap.value_interval  # type: ignore[misc]
        return np.clip(v - h, lo, hi), np.clip(v + h, lo, hi)
    if func in ("quantile", "quantiles"):
        # no value interval: one would need the data's ranks; the rank interval is intervals.quantile_ci
        raise ValueError("a quantile has a rank interval only (dpch.intervals.quantile_ci)")
    if func in ("count", "count_distinct_unit", "count_distinct"):
        q = qs[ap.roles["count"]]
        v = noisy[q.index].astype(float)
        h = _halfwidth_value(q, level)
        return np.maximum(v - h, 0.0), np.maximum(v + h, 0.0)
    if func == "sum":
        q = qs[ap.roles["sum"]]
        v = noisy[q.index].astype(float) * q.grid
        h = _halfwidth_value(q, level)
        return v - h, v + h
    m = 3 if "sumsq" in ap.roles else 2
    lv = 1.0 - (1.0 - level) / m
    qn, qs1 = qs[ap.roles["count"]], qs[ap.roles["sum"]]
    n = noisy[qn.index].astype(float)
    hn = _halfwidth_value(qn, lv)
    n_lo = np.maximum(n - hn, 1.0)
    n_hi = np.maximum(n + hn, 1.0)
    s = noisy[qs1.index].astype(float) * qs1.grid
    hs = _halfwidth_value(qs1, lv)
    mean_lo, mean_hi = _interval_div(s - hs, s + hs, n_lo, n_hi)
    lo, hi = ap.value_interval  # type: ignore[misc]
    if func == "avg":
        return (np.clip(ap.centre + mean_lo, lo, hi), np.clip(ap.centre + mean_hi, lo, hi))
    q2 = qs[ap.roles["sumsq"]]
    s2 = noisy[q2.index].astype(float) * q2.grid
    h2 = _halfwidth_value(q2, lv)
    m2_lo, m2_hi = _interval_div(s2 - h2, s2 + h2, n_lo, n_hi)
    m2_lo, m2_hi = m2_lo + q2.centre, m2_hi + q2.centre
    straddle = (mean_lo <= 0) & (mean_hi >= 0)
    sq_lo = np.where(straddle, 0.0, np.minimum(mean_lo ** 2, mean_hi ** 2))
    sq_hi = np.maximum(mean_lo ** 2, mean_hi ** 2)
    hw2 = ap.halfwidth ** 2
    var_lo = np.clip(m2_lo - sq_hi, 0.0, hw2)
    var_hi = np.clip(m2_hi - sq_lo, 0.0, hw2)
    if func in ("var_samp", "stddev_samp"):
        # factor N/(N-1) is decreasing in N; N >= 1 (N = 1 uses factor 1, as the SQL does)
        f_lo = n_hi / np.maximum(n_hi - 1.0, 1.0)
        f_hi = n_lo / np.maximum(n_lo - 1.0, 1.0)
        var_lo, var_hi = var_lo * np.minimum(f_lo, f_hi), var_hi * np.maximum(f_lo, f_hi)
    if func.startswith("stddev"):
        return np.sqrt(var_lo), np.sqrt(var_hi)
    return var_lo, var_hi


def column_metadata(plan: Plan, rewritten: Rewritten) -> dict[str, dict[str, Any]]:
    """Per output column: kind and, for aggregates, mechanism/scale/sensitivity/budget."""
    meta: dict[str, dict[str, Any]] = {}
    level = plan.options.confidence
    for out in plan.bound.outputs:
        info: dict[str, Any] = {"kind": out.kind}
        if out.kind == "key":
            key = plan.bound.keys[out.ref]  # type: ignore[index]
            info["key"] = key.sql
            info["release"] = ("public key domain" if plan.key_mode == "public"
                               else "private partition selection")
        elif out.kind == "aggregate":
            ap = plan.aggregates[out.ref]  # type: ignore[index]
            parts = {role: plan.quantities[qi] for role, qi in ap.roles.items()}
            mechs = sorted({mechanism_name(q) for q in parts.values()})
            info.update({
                "aggregate": ap.call.text,
                "function": ap.func,
                "mechanism": mechs[0] if len(mechs) == 1 else "+".join(mechs),
                "ci_level": level,
            })
            if len(parts) == 1:
                q = next(iter(parts.values()))
                info.update(_quantity_meta(q, level))
            else:
                info["components"] = {role: dict(label=q.label, **_quantity_meta(q, level))
                                      for role, q in parts.items()}
                info["epsilon"] = sum(q.epsilon for q in parts.values())
                info["delta"] = sum(q.delta for q in parts.values())
                info["value_bounds"] = list(ap.value_interval) if ap.value_interval else None
        elif out.kind == "derived":
            info["mechanism"] = "post-processing of released values"
        meta[out.name] = info
    return meta


def _ci_kind(ap: AggregatePlan) -> str:
    """Which interval ci_low/ci_high is (every aggregate column says it, at ci_level)."""
    if ap.func in ("quantile", "quantiles"):
        return ("rank: no value interval; rank_ci = ±r rows around the level's rank (exponential "
                "mechanism utility bound, docs/CONTROLLER.md \"Intervals\"), level_ci_low/high where a "
                "COUNT of the same rows is released")
    if "mean" in ap.roles:
        return ("noise: the clamped mean of the bounded data, bounded Laplace noise quantile "
                "(biswal thesis §5.5/§5.7, exact tail bound of the grid law), within the value bounds")
    if len(ap.roles) == 1:
        return "noise: the value on the bounded data, exact quantile of the discrete noise"
    return ("noise: the value on the bounded data, interval image of the components' exact noise "
            "intervals (union bound)")


def _quantity_meta(q: Quantity, level: float) -> dict[str, Any]:
    if q.kind == "quantile":
        return {
            "mechanism": "exponential",
            "sampler": ("permute-and-flip over a sparse histogram (two levels: independent at ε/2 each, "
                        "sorted; three or more: the Kaplan et al. recursion)"),
            "epsilon": q.epsilon,
            "delta": 0.0,
            "noise_scale": q.scale,  # temperature in rows at level 0 or 1
            "shared_with_partition_selection": False,
            **q.quantile_facts(level),
        }
    sens = q.l1 if q.mechanism in ("laplace", "optimal_selection", "bounded_laplace") else q.l2
    facts = thesis_facts(q)
    return {
        **({"thesis_mechanism": facts} if facts else {}),
        "mechanism": mechanism_name(q),
        "noise_scale": q.scale * q.grid,  # b or σ in value units
        "sensitivity": sens * q.grid,  # L1 (Laplace) or L2 (Gaussian), value units
        "epsilon": q.epsilon,
        "delta": q.delta,
        "ci_halfwidth": _halfwidth_value(q, level),
        "shared_with_partition_selection": q.is_selection,
    }


def _interval_meta(plan: Plan, noisy: dict[int, np.ndarray], level: float, meta: dict, n: int) -> None:
    """Each aggregate's and derived column's interval into ``meta`` (ci_low/ci_high per row, NaN
    where none; quantiles: rank_ci and the level interval; ci_note where a column has none)."""
    counts = {o.ref: o.name for o in plan.bound.outputs
              if o.kind == "aggregate" and plan.aggregates[o.ref].func == "count"}  # type: ignore[index]
    for o in plan.bound.outputs:
        info = meta[o.name]
        if o.kind == "derived":
            ci = derived_ci(o.template, plan, n, lambda ap, lv: aggregate_ci(ap, plan, noisy, lv), level)
            info.update(ci_level=level, ci_low=[float(x) for x in ci.lo], ci_high=[float(x) for x in ci.hi],
                        ci_kind="noise: interval image of the released aggregates' intervals (union bound)")
            if ci.note:
                info["ci_note"] = ci.note
            continue
        if o.kind != "aggregate":
            continue
        ap = plan.aggregates[o.ref]  # type: ignore[index]
        info["ci_kind"] = _ci_kind(ap)
        if ap.func in ("quantile", "quantiles"):
            qci = quantile_ci(ap, plan, noisy, level, counts)
            info.update(ci_low=None, ci_high=None, rank_ci=qci.rank,
                        ci_note="no value interval: see rank_ci (rows) and level_ci_low/level_ci_high")
            if qci.level_lo is not None:
                info.update(level_ci_low=qci.level_lo.tolist(), level_ci_high=qci.level_hi.tolist(),  # type: ignore[union-attr]
                            level_ci_count=qci.count_column)
            continue
        lo, hi = aggregate_ci(ap, plan, noisy, level)
        info["ci_low"] = [float(x) for x in lo]
        info["ci_high"] = [float(x) for x in hi]
        pop = population_ci(ap, plan, noisy, level)
        if pop is not None:
            info["population_ci_low"] = [float(x) for x in pop[0]]
            info["population_ci_high"] = [float(x) for x in pop[1]]
            info["population_ci"] = POPULATION_MEAN_CI


def _with_ci_columns(plan: Plan, meta: dict, out: pd.DataFrame) -> pd.DataFrame:
    """``<name>_lo``/``<name>_hi`` after each aggregate and derived column (NaN where there is no
    interval); a quantile gets ``<name>_rank_ci`` and, with a COUNT of its rows, ``<name>_level_lo``
    and ``<name>_level_hi`` instead (its column bounds are no interval)."""
    new: dict[str, Any] = {}
    for o in plan.bound.outputs:
        new[o.name] = out[o.name]
        info = meta[o.name]
        if "rank_ci" in info:
            new[f"{o.name}_rank_ci"] = [info["rank_ci"]] * len(out)
            if "level_ci_low" in info:
                new[f"{o.name}_level_lo"] = info["level_ci_low"]
                new[f"{o.name}_level_hi"] = info["level_ci_high"]
        elif o.kind in ("aggregate", "derived"):
            new[f"{o.name}_lo"] = info["ci_low"]
            new[f"{o.name}_hi"] = info["ci_high"]
    return pd.DataFrame(new)


def postprocess(df: pd.DataFrame, plan: Plan, rewritten: Rewritten, *, receipt: Any = None,
                controller_ms: float | None = None) -> pd.DataFrame:
    level = plan.options.confidence
    noisy: dict[int, np.ndarray] = {}
    for q in plan.quantities:  # a peeling top-n's unreleased score has no column
        col = f"{q.noisy_column}_out"
        noisy[q.index] = df[col].to_numpy() if col in df.columns else np.zeros(len(df))
    out = df.drop(columns=[c for c in rewritten.internal_columns if c in df.columns]).reset_index(drop=True)
    for q in plan.quantities:
        noisy[q.index] = np.asarray(noisy[q.index]).reshape(-1)
    meta = column_metadata(plan, rewritten)
    _interval_meta(plan, noisy, level, meta, len(out))
    if plan.options.with_ci:
        out = _with_ci_columns(plan, meta, out)
    sel = plan.selection
    out.attrs["dpch"] = {
        "table": plan.entry.table,
        "privacy_unit": plan.entry.privacy_unit,
        "neighbour": plan.entry.neighbour,
        "epsilon": plan.cost.epsilon,
        "delta": plan.cost.delta,
        "confidence": level,
        "key_mode": plan.key_mode,
        "selection": None if sel is None else sel.summary(),
        "top_k": top_k_facts(plan),
        "columns": meta,
        "receipt": getattr(receipt, "id", receipt),
        "sql": rewritten.display_sql,
        "controller_ms": controller_ms,
    }
    out.attrs.update(flat_attrs(out.attrs["dpch"], getattr(plan.cost, "rho", None)))
    return out


#: The flat keys of a result's ``df.attrs`` (docs/CONTROLLER.md, "Result metadata").
FLAT_KEYS = ("epsilon_spent", "delta_spent", "rho_spent", "dataset", "receipt", "mechanism", "noise_scale",
             "ci_level", "ci_low", "ci_high", "ci_note", "ci_notes")


def flat_attrs(meta: dict, rho: float | None = None) -> dict[str, Any]:
    """The flat view of the nested metadata: one key per fact, per-column facts as {column: value}.
    ``noise_scale`` is b (Laplace) or σ (Gaussian) in value units; for AVG/VAR/STDDEV, which combine
    several noisy releases, it is {component: scale}."""
    mechanism, scale, lo, hi, notes = {}, {}, {}, {}, {}
    for name, info in meta["columns"].items():
        if info.get("ci_note"):
            notes[name] = info["ci_note"]
        if info.get("kind") == "derived":
            lo[name], hi[name] = info.get("ci_low"), info.get("ci_high")
        if info.get("kind") != "aggregate":
            continue
        mechanism[name] = info.get("mechanism")
        if "noise_scale" in info:
            scale[name] = info["noise_scale"]
        else:
            scale[name] = {role: c.get("noise_scale") for role, c in info.get("components", {}).items()}
        lo[name], hi[name] = info.get("ci_low"), info.get("ci_high")
    return {"epsilon_spent": meta["epsilon"], "delta_spent": meta["delta"], "rho_spent": rho,
            "dataset": meta["table"], "receipt": meta["receipt"], "mechanism": mechanism,
            "noise_scale": scale, "ci_level": meta["confidence"], "ci_low": lo, "ci_high": hi,
            "ci_note": NOISE_ONLY, "ci_notes": notes}


def spend_summary(df: pd.DataFrame) -> str:
    """One line: what the query spent, on which dataset, with which mechanisms."""
    a = df.attrs
    if "epsilon_spent" not in a:
        return "no DPCH metadata on this result"
    from .accounting import _fmt

    cost = f"ε = {_fmt(a['epsilon_spent'])}" + (f", δ = {_fmt(a['delta_spent'])}" if a.get("delta_spent") else "")
    mechs = ", ".join(f"{c}: {m}" for c, m in a.get("mechanism", {}).items())
    return (f"DP answer on {a.get('dataset')}: spent {cost} (receipt {a.get('receipt')})"
            + (f"; noise {mechs}" if mechs else "") + f"; {round(100 * a['ci_level'])}% intervals available")


def result_metadata(df: pd.DataFrame) -> dict:
    """The DPCH metadata of a result (``df.attrs["dpch"]``)."""
    meta = df.attrs.get("dpch")
    if meta is None:
        raise KeyError("this DataFrame carries no DPCH metadata")
    return meta
