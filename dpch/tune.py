"""``db.tune``: choose contribution bounds for a workload before running it (issue 29 item 2; after
PipelineDP's utility analysis).

For each query of the workload a small declared ε (split evenly across the queries) releases the
histograms of rows and groups per unit of its relation (dpch.plan.profile: discrete Laplace in
ClickHouse, L1 1 per histogram, 2 under substitution), charged once before anything runs. Then, as
post-processing, for a grid of candidate (k, M): the expected noise of the query's released values at
``query_epsilon`` (from its plan at those bounds) and the estimated rows bounding drops (from the tail
model), in rows, summed over the workload. The table, the best (k, M), a plot, and optionally the
catalog updated with it.

Privacy: the only releases are the histograms, ``epsilon``-DP in all (basic composition over the
queries, Dwork & Roth Thm 3.16); the table and the choice are functions of them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import pandas as pd

from .controller import charge_first, noise_at, prepare
from .cost import PrivacyCost
from .plan.profile import CANDIDATES, ProfileRequest, tail_model
from .unit_profile import ProfileSpec, run_histograms


@dataclass
class TuneReport:
    """The candidates (one row per (k, M): noise, bias and their sum in rows), the best one, what it
    cost; ``plot(path)`` draws error against M."""

    table: pd.DataFrame
    best: dict
    epsilon: float
    notes: list[str] = field(default_factory=list)

    def plot(self, path: str | None = None):
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for k, part in self.table.groupby("max_groups_contributed"):
            ax.plot(part["max_rows_per_unit"], part["total_rows"], marker=".", label=f"k = {k}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("max_rows_per_unit (M)")
        ax.set_ylabel("estimated error (rows): bias + noise sd")
        ax.axvline(self.best["max_rows_per_unit"], color="grey", ls=":")
        ax.legend()
        fig.tight_layout()
        if path:
            fig.savefig(path, dpi=120)
        return fig

    def __str__(self) -> str:
        b = self.best
        return (f"best bounds: max_groups_contributed={b['max_groups_contributed']}, max_rows_per_unit="
                f"{b['max_rows_per_unit']} (estimated bias {b['bias_rows']:.4g} + noise {b['noise_rows']:.4g} "
                f"rows); spent ε = {self.epsilon:.6g}")


def tune(conn, table: str, workload: str | Sequence[str], *, epsilon: float, query_epsilon: float,
         query_delta: float = 0.0, write: bool = False, max_k: int = 64) -> TuneReport:
    """Estimate, for candidate bounds, the noise and the bias of ``workload`` (one SQL or a list) run
    at ``query_epsilon`` each, spending ``epsilon`` (charged once, before anything runs) on the
    histograms of rows and groups per unit; ``write``: put the best (k, M) into the catalog.
    Guarantee: ``epsilon``-DP (the histograms); everything else is post-processing."""
    queries = [workload] if isinstance(workload, str) else list(workload)
    if not queries:
        raise ValueError("tune needs at least one query")
    preps = [prepare(conn, q, epsilon=query_epsilon, delta=query_delta, precheck=True) for q in queries]
    entry = preps[0].plan.entry
    specs = [ProfileSpec(ProfileRequest(rows=True, groups=p.plan.grouped, epsilon=epsilon / len(queries),
                                        neighbour=entry.neighbour), 0.0, ("max_rows_per_unit",)) for p in preps]
    cost = PrivacyCost(tuple(c for s in specs for c in s.costs()))
    charge_first(conn, preps[0].dataset, cost, f"tune: {len(queries)} quer{'y' if len(queries) == 1 else 'ies'}")
    rows = []
    ks = [k for k in CANDIDATES if k <= max_k]
    models = []
    for p, s in zip(preps, specs):
        h = run_histograms(conn.backend, p.plan, s)
        models.append((p, tail_model(h["rows"]), tail_model(h["groups"]) if "groups" in h else None,
                       noise_at(p.bound, p.plan, p.key_types)))
    for k in ks:
        for m in CANDIDATES:
            if m > 65536:
                break
            bias = noise = 0.0
            for p, rm, gm, at in models:
                noise += at(k if p.plan.grouped else 1, m)
                bias += rm.excess(m)
                if gm is not None and p.plan.grouped:
                    bias += gm.excess(k) * rm.total() / max(gm.total(), 1.0)
            rows.append({"max_groups_contributed": k, "max_rows_per_unit": m, "noise_rows": noise,
                         "bias_rows": bias, "total_rows": noise + bias})
    df = pd.DataFrame(rows)
    best = df.loc[df["total_rows"].idxmin()].to_dict()
    best = {k: (int(v) if k.startswith("max_") else float(v)) for k, v in best.items()}
    notes = ["bias is estimated from noisy histograms (dpch.plan.profile); noise is the plan's sd in rows"]
    if write:
        conn.catalog.update(entry.table, max_groups_contributed=best["max_groups_contributed"],
                            max_rows_per_unit=best["max_rows_per_unit"])
        notes.append(f"written to the catalog entry of {entry.table}")
    return TuneReport(df, best, cost.epsilon, notes)
