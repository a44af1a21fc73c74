"""Stage 4 of the controller: the plan as ONE ClickHouse query.

Modules: ``bounding`` (stages 1-3), ``release`` (the public key join and stages 4-6), ``rewriter``
(``_Rewriter``, which composes them), ``base`` (the result type, salt placeholders, packing).

``rewrite(plan) -> Rewritten``. The query is a chain of subqueries, innermost first (each a small
pass, as in sqlglot's optimizer):

1. ``rows``: the table, filtered by the analyst's WHERE (and by the key domains, except declared
   public domains at user level with k = 1, which the LEFT JOIN of stage 3 applies after the
   per-unit choice so that a per-unit projection, dpch.accelerate, can serve stage 2), projected
   to the privacy unit, the group keys, the salted hash
   ``intHash64(xxh3(keys) XOR <salt>) XOR intHash64(unit XOR <salt'>)`` of the unit's (unit, keys) pair
   and each quantity's per-row contribution in fixed-point units (columns and values clipped).
2. ``per_unit``: per-unit pre-aggregation with contribution bounding. Which groups of a unit are
   kept depends only on that unit's rows (smallest keyed hashes; never ``rand()``):
   - no GROUP BY: one row per unit (``GROUP BY unit``);
   - k = 1: one pass, ``sumArgMin`` over the keyed hash of each row's packed Int128 x·2^64 + 1
     (count and Int64 sum in one state) keeps the unit's rows of its group with the smallest hash;
     the group is ``argMin(key, h)``, or with public domains ``min(h)`` (the group stage then
     groups by the key hash and the domain's LEFT JOIN gives the values back: ``by_key_hash``);
   - k > 1: ``GROUP BY (unit, hash)``, then per unit the permutation sorting its hashes, applied to
     each column's array, keeps the k groups with the smallest hashes; ``ARRAY JOIN`` unfolds them.
   (docs/PERFORMANCE.md: why this form, and why it computes the same values as the plain one.)
   With the weighted Gaussian selection (k > 1 only) each unit also gets its weight
   unit_weight(j, S), j = its number of kept groups (``__dp_w``), summed per group in stage 3.
   A unit's rows are then capped at C per group and M in total (in hash order of its groups); when
   a unit has c > r allowed rows in a group, each of its sums is scaled by r/c and clamped to
   r·[L, H] (the per-unit contribution clamp), so its contribution is exactly that of r rows.
   Row-level tables skip this stage (each row is its own unit).
3. ``groups``: native aggregation per group (Int64 sums: exact), optionally LEFT JOINed from the
   public key domain (every public key appears, missing ones with 0).
4. ``selected`` (plans with private partition selection): each group's noisy unit count is drawn
   in its own subquery, before anything else is noised, and thresholded (``noisy units >= T``) by
   the WHERE of the level above it; peeling top-n plans then choose among the released groups.
5. ``noised``: every other released quantity through ``dpch_laplace_int``/``dpch_gaussian_int``
   exactly once (for the selected groups only).
6. outer query: ``WITH`` the released values, aggregate values computed from the noisy quantities
   (AVG = centre + g·S/max(N, 1) clamped, VAR/STDDEV from centred sums, counts clamped at 0:
   post-processing), then the analyst's output expressions, HAVING (as a filter on released
   values), ORDER BY and LIMIT over released values only, plus the internal noisy quantities
   ``__dp_n<i>`` that the post-processing stage uses for confidence intervals and then drops.
   No level only passes columns through (each costs ClickHouse's analysis: docs/PERFORMANCE.md).

The secret salt only appears in ``Rewritten.sql`` (what runs); ``Rewritten.display_sql`` (what
explain shows) has ``<secret salt>`` instead.

A Distributed table sharded by the unit runs stages 1-3 on each shard and the rest on the
initiator (``shards``: -State / -Merge partial aggregates; docs/DEPLOY.md, "A cluster").
"""
from __future__ import annotations

from typing import Callable

from ..catalog import TableEntry
from ..engine import default_row_sql
from ..plan import Plan
from ..relation.syntax import RELATION_PLACEHOLDER
from .base import SALT_PLACEHOLDER, UNIT_SALT_PLACEHOLDER, Rewritten
from .probe import swap_tables
from .rewriter import _Rewriter
from .shards import cluster_rewrite, initiator_sql, placement, shard_sql, two_phase

__all__ = ["SALT_PLACEHOLDER", "UNIT_SALT_PLACEHOLDER", "Rewritten", "_Rewriter", "rewrite", "rewrite_for_sensitivity_check",
           "rewrite_probe", "probe_table_sql", "cluster_rewrite", "initiator_sql", "placement", "shard_sql",
           "two_phase"]


def rewrite(plan: Plan) -> Rewritten:
    """The executable query for ``plan`` (noise on, partition selection on). A Distributed table
    sharded by the unit gets the two-phase form (dpch.rewrite.shards: the per-unit and group stages
    on each shard, the rest once on the initiator), with the same privacy guarantee."""
    if two_phase(plan):
        return cluster_rewrite(plan)
    return _Rewriter(plan, noise=True, selection=True, table=None).build()


def rewrite_for_sensitivity_check(plan: Plan, *, table: str | None = None) -> Rewritten:
    """TESTS ONLY: the same query with the noise UDF calls replaced by the identity and partition
    selection off, optionally on another table (a neighbouring dataset D′). The controller never
    calls this; its output is not private."""
    return _Rewriter(plan, noise=False, selection=False, table=table).build()


def rewrite_probe(plan: Plan, probe_of: Callable[[str], str] | None = None) -> Rewritten:
    """The same query on probe data (dpch.typecheck runs it before the charge; it reads no private
    row). Noise off: the UDF calls are typed by construction, and the probe's output is discarded.

    Without ``probe_of``, or for one plain catalogued table, the table is ONE row of default values
    of its columns. With ``probe_of`` (dpch.probe_db.probe_tables), a joined relation is the REAL
    relation SQL with every table node swapped for its one-row probe table (dpch.probe_db), so its
    joins, semi-joins, reference-chain joins and key conversions are analysed and run, UNION ALL
    the relation's own row of defaults (NULLs included), so at least one row reaches every stage."""
    return _Rewriter(plan, noise=False, selection=True, table=probe_table_sql(plan, probe_of)).build()


def probe_table_sql(plan: Plan, probe_of: Callable[[str], str] | None = None) -> str:
    """The probe data that ``rewrite_probe`` reads instead of the table (see there): one row of
    defaults, or the real relation over probe tables UNION ALL its own default row. The release
    paths that build their own SQL from a plan (sparse vector, refine, propose-test-release) probe
    it on the same data."""
    entry = plan.entry
    if probe_of is None or type(entry) is TableEntry:
        return default_row_sql(entry)
    return (f"(SELECT * FROM {swap_tables(entry.table_sql, probe_of)}\nUNION ALL\n"
            f"SELECT * FROM {default_row_sql(entry)}) AS {RELATION_PLACEHOLDER}")
