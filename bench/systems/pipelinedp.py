"""PipelineDP (`pipeline-dp`) on its LocalBackend (pure Python, single process).

Fairest configuration (documented in RESULTS.md):
- input: the rows as an in-memory list of tuples (the LocalBackend's native input); the
  conversion from the DataFrame is done once and not timed;
- public partitions everywhere (the 100 regions, the 10 000 items, one constant partition for the
  whole-table AVG): no private partition selection, no δ needed;
- Laplace noise (`NoiseKind.LAPLACE`), δ = 0, `NaiveBudgetAccountant(total_epsilon)` with the
  total equal to DPCH's (2ε for COUNT + SUM, which PipelineDP splits evenly, ε for MEAN);
- row-level (a), (c), (d): `contribution_bounds_already_enforced=True` — each row is its own
  privacy unit, so there is nothing to bound (this skips PipelineDP's per-unit grouping, its
  fastest correct mode); `max_partitions_contributed=1`, `max_contributions_per_partition=1`;
- user-level (b): privacy id `user_id`, `max_partitions_contributed=1`,
  `max_contributions_per_partition=10`: the same bounds as DPCH's controller (PipelineDP samples
  the kept partitions and rows at random, DPCH keeps them by keyed hash);
- `min_value=0, max_value=500` (the same clipping as DPCH).
"""
from __future__ import annotations

from .base import System, align

# column positions in the row tuples
ROW_ID, USER_ID, REGION, ITEM, AMOUNT = range(5)


class PipelineDP(System):
    name = "pipelinedp"
    CONFIG = {
        "a": "COUNT+SUM, public partitions = 100 regions, bounds already enforced (row-level), Laplace",
        "b": "COUNT+SUM, privacy id user_id, max_partitions_contributed=1, max_contributions_per_partition=10",
        "c": "MEAN over one public partition, bounds already enforced (row-level), Laplace",
        "d": "COUNT+SUM, public partitions = 10 000 items, bounds already enforced (row-level)",
    }
    UNSUPPORTED = {"e": "not run: (e) exists to compare SmartNoise like with like (its row-only bound)"}

    def __init__(self, df, queries, rows: int):
        import pipeline_dp  # noqa: F401

        self.queries = queries
        cols = [df[c].tolist() for c in ("row_id", "user_id", "region", "item", "amount")]
        self.data = list(zip(*cols))

    def run(self, qid: str, eps: float):
        import pipeline_dp

        q = self.queries[qid]
        scalar = q.group is None
        total_eps = eps if scalar else 2 * eps
        accountant = pipeline_dp.NaiveBudgetAccountant(total_epsilon=total_eps, total_delta=0)
        engine = pipeline_dp.DPEngine(accountant, pipeline_dp.LocalBackend())
        metrics = [pipeline_dp.Metrics.MEAN] if scalar else [pipeline_dp.Metrics.COUNT, pipeline_dp.Metrics.SUM]
        user = q.level == "user"
        params = pipeline_dp.AggregateParams(
            noise_kind=pipeline_dp.NoiseKind.LAPLACE,
            metrics=metrics,
            max_partitions_contributed=1,
            max_contributions_per_partition=10 if user else 1,
            min_value=0.0,
            max_value=500.0,
            contribution_bounds_already_enforced=not user,
        )
        key_col = {"region": REGION, "item": ITEM, None: None}[q.group]
        extractors = pipeline_dp.DataExtractors(
            partition_extractor=(lambda r: 0) if key_col is None else (lambda r: r[key_col]),
            privacy_id_extractor=(lambda r: r[USER_ID]) if user else None,
            value_extractor=lambda r: r[AMOUNT],
        )
        public = [0] if scalar else q.keys
        result = engine.aggregate(self.data, params, extractors, public_partitions=public)
        accountant.compute_budgets()
        out = list(result)
        if scalar:
            return {"avg": [float(out[0][1].mean)]}
        keys = [k for k, _ in out]
        return align(q.keys, keys, {"count": [m.count for _, m in out], "sum": [m.sum for _, m in out]})
