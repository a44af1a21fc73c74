"""Stage 4 of the controller: the plan as ONE ClickHouse query.

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
4. ``noised``: each quantity through ``dpch_laplace_int``/``dpch_gaussian_int`` exactly once.
5. ``released``: partition selection (``noisy units >= T``), aggregate values computed from the
   noisy quantities (AVG = centre + g·S/max(N, 1) clamped, VAR/STDDEV from centred sums, counts
   clamped at 0): post-processing.
6. outer query: the analyst's output expressions, HAVING (as a filter on released values), ORDER BY
   and LIMIT over released values only, plus the internal noisy quantities ``__dp_n<i>`` that the
   post-processing stage uses for confidence intervals and then drops.

The secret salt only appears in ``Rewritten.sql`` (what runs); ``Rewritten.display_sql`` (what
explain shows) has ``<secret salt>`` instead.
"""
from __future__ import annotations

from dataclasses import dataclass

from .bind import aggregate_refs, sql_of
from .catalog import base_type, is_integer_type, is_nullable, quote_ident
from .mechanisms import QUANTILE_BUCKETS
from .plan import Plan, Quantity, float_literal
from .plan.selection import unit_weight_sql
from .typecheck import default_row_sql, with_settings

SALT_PLACEHOLDER = "/*<secret salt>*/"
UNIT_SALT_PLACEHOLDER = "/*<secret unit salt>*/"


@dataclass(frozen=True)
class Rewritten:
    sql: str  # executable (contains the salt)
    display_sql: str  # for explain/logs (salt masked)
    output_names: tuple[str, ...]  # the analyst's columns, in order
    internal_columns: tuple[str, ...]  # __dp_n<i> columns appended for post-processing
    # executable, the analyst's columns only (no internal columns), without a SETTINGS clause: what
    # a client that wants the released values rendered by the engine runs (formatted_sql)
    released_sql: str = ""

    def formatted_sql(self, settings: dict[str, str] | None = None) -> str:
        """``released_sql`` with the query settings plus ``settings`` (output format settings,
        already validated by the caller)."""
        return with_settings(self.released_sql, settings)


_LOW64 = "18446744073709551615"  # 2^64 - 1


def _packed_row(x_sql: str) -> str:
    """One row's Int64 contribution x and its count 1 as one Int128, x·2^64 + 1 (docs/PERFORMANCE.md)."""
    return f"(bitShiftLeft(toInt128({x_sql}), 64) + 1)"


def _unpack_count(packed_sum_sql: str) -> str:
    """The row count of a sum of ``_packed_row`` values: its low 64 bits (exact below 2^64 rows)."""
    return f"toInt64(bitAnd({packed_sum_sql}, {_LOW64}))"


def _unpack_sum(packed_sum_sql: str) -> str:
    """The Int64 sum of a sum of ``_packed_row`` values: its high 64 bits, which are Σx modulo 2^64
    (the count never carries into them), i.e. exactly the value an Int64 ``sum`` wraps to."""
    return f"toInt64(bitShiftRight({packed_sum_sql}, 64))"


def _indent(sql: str, n: int = 2) -> str:
    pad = " " * n
    return "\n".join(pad + line for line in sql.splitlines())


class _Rewriter:
    def __init__(self, plan: Plan, *, noise: bool, selection: bool, table: str | None):
        self.plan = plan
        self.noise = noise
        self.selection = selection
        e = plan.entry
        self.table_sql = table or e.table_sql
        self.keys = list(plan.bound.keys)
        self.nk = len(self.keys)
        self.row_qs = [q for q in plan.quantities if q.row_sql is not None and q.kind not in ("quantile", "distinct")]
        # quantiles: each unit keeps at most q.rows of its rows per group (those whose bucket has
        # the smallest keyed hash: a function of the unit's own rows), collected as (hash, bucket)
        # COUNT(DISTINCT expr) collects (hash, value) pairs the same way (values, not buckets)
        self.quant_qs = [q for q in plan.quantities if q.kind in ("quantile", "distinct")]
        # the weighted Gaussian's selection statistic (k > 1 path only): Σ over the group's units of
        # unit_weight(j_u, S), j_u = the unit's number of kept groups
        self.weighted = next((q for q in plan.quantities if q.kind == "weighted_units"), None)

    # -- helpers ----------------------------------------------------------------------------
    def _where(self, *, key_filters: bool = True) -> str:
        parts = []
        if self.plan.bound.where is not None:
            parts.append(f"({sql_of(self.plan.bound.where)})")
        for key, dom in zip(self.keys, self.plan.key_domains):
            if key_filters and dom is not None and dom.filter_sql:
                parts.append(f"({dom.filter_sql})")
        return ("\nWHERE " + " AND ".join(parts)) if parts else ""

    def _defer_key_filters(self) -> bool:
        """User level, k = 1, declared public domains: the unit's group is chosen among all its
        rows and groups outside the domain are dropped afterwards by the LEFT JOIN from the
        public keys. The per-unit stage then reads the table with the analyst's WHERE only, so a
        per-unit projection (dpch.accelerate) can serve it. Keys given per query (`keys=`) still
        filter rows first: an explicit restriction should steer which group a unit keeps."""
        p = self.plan
        return (not p.entry.row_level and self.nk > 0 and p.bounding.k == 1 and p.key_mode == "public"
                and all(d is not None and d.source != "query keys" for d in p.key_domains))

    def filters_keys_before_bounding(self) -> bool:
        """Whether the rows stage filters rows on group-key domains (then no per-unit projection,
        which holds every row's contribution, can serve the per-unit stage)."""
        return not self._defer_key_filters() and any(
            d is not None and d.filter_sql for d in self.plan.key_domains)

    def by_key_hash(self) -> bool:
        """User level, public domains for every key, key types known: the per-unit stage carries no
        key values, only the unit's smallest hash h; the group's key hash kh = h XOR hash(unit)
        (the key part of h) is the GROUP BY key of the group stage, and the LEFT JOIN from the
        public domain (whose kh the engine computes by the same function on values of the same type)
        gives the key values back. Which rows a unit keeps is unchanged; docs/PERFORMANCE.md."""
        p = self.plan
        return (not p.entry.row_level and self.nk > 0 and p.key_mode == "public" and p.key_types is not None
                and self.weighted is None)

    def _unit_part_sql(self, unit_sql: str) -> str:
        p = self.plan
        unit_type = p.entry.columns.get(p.entry.privacy_unit or "", "")
        if is_integer_type(unit_type) and base_type(unit_type) not in ("Int128", "Int256", "UInt128", "UInt256"):
            return f"intHash64(bitXor(toUInt64({unit_sql}), {UNIT_SALT_PLACEHOLDER}))"
        return f"cityHash64({unit_sql}, {UNIT_SALT_PLACEHOLDER})"

    def _key_part_sql(self, key_sqls: list[str]) -> str:
        # a NULL key is a group like any other: hashed inside a tuple (a bare NULL would hash to NULL)
        keys = [f"tuple({k})" if self.plan.key_nullable(j) else k for j, k in enumerate(key_sqls)]
        # xxh3 then a salted integer mix, not sipHash64Keyed: a String key is hashed on every row,
        # and sipHash was ~40 % of the per-unit floor (3x xxh3's cost here; docs/PERFORMANCE.md).
        # DP holds whatever the hash (the rule reads only the unit's own rows); the salt keeps the
        # choice unpredictable to analysts.
        return f"intHash64(bitXor(xxh3({', '.join(keys)}), tupleElement({SALT_PLACEHOLDER}, 1)))"

    def unit_hash_sql(self, key_sqls: list[str], unit_sql: str) -> str:
        """h(unit, keys) = intHash64(xxh3(keys) XOR salt) XOR hash(unit, salt'): salted, a function of
        the unit's own (unit, key) pair only. The key part is computed once per distinct value for
        LowCardinality keys; the unit part is an integer hash: cheap per row."""
        return f"bitXor({self._key_part_sql(key_sqls)}, {self._unit_part_sql(unit_sql)})"

    def per_unit_aggregates(self, *, inline: bool) -> list[str]:
        """The per-unit stage's aggregate calls (k = 1 or no GROUP BY), over the rows stage's
        aliases, or (``inline``) over the table's columns: the latter is what a per-unit projection
        stores (ClickHouse matches projections by expression, so both spell the same thing). A
        projection holds every form a query may use: the key values and the minimum hash, and the
        row count on its own as well as packed with each sum."""
        named = self._per_unit_named(inline=inline, key_hash=not inline and self.by_key_hash())
        if not inline:
            return [a for _, a in named]
        extra = []
        if self.nk:
            h = self._inline_hash()
            have = {a for _, a in named}
            extra = [a for a in ([f"min({h})", f"countArgMin({h})"] + self._choose_keys(inline=True))
                     if a not in have]
        return [a for _, a in named] + extra

    def _inline_hash(self) -> str:
        keys = [f"({sql_of(k.expr)})" for k in self.keys]
        return self.unit_hash_sql(keys, quote_ident(self.plan.entry.privacy_unit))  # type: ignore[arg-type]

    def _choose_keys(self, *, inline: bool) -> list[str]:
        keys = [f"({sql_of(k.expr)})" for k in self.keys] if inline else [f"__dp_rk{j}" for j in range(self.nk)]
        h = self._inline_hash() if inline else "__dp_h"
        return [f"argMin(tuple({k}), {h}).1" if self.plan.key_nullable(j) else f"argMin({k}, {h})"
                for j, k in enumerate(keys)]

    def _per_unit_named(self, *, inline: bool, key_hash: bool = False) -> list[tuple[str, str]]:
        """(column, aggregate) pairs of the per-unit stage (k = 1 or no GROUP BY): the chosen
        group (key values, or the smallest hash ``__dp_mh`` when ``by_key_hash``), the row count
        ``__dp_c`` and each sum ``__dp_s<i>`` of the rows whose hash is the unit's smallest, and
        each quantile/distinct quantity's collected pairs ``__dp_sq<i>``.

        Speed (docs/PERFORMANCE.md): each sum is ``sumArgMin`` of an Int128 ``x·2^64 + 1``, so one
        -ArgMin state gives both the count (the low 64 bits: exact below 2^64 rows) and the Int64
        sum (the high 64 bits: the sum modulo 2^64, exactly what an Int64 ``sum`` wraps to);
        ``countArgMin`` is used only without sums. Same values as countArgMin/sumArgMin."""
        if inline:
            h = self._inline_hash() if self.nk else ""
            res = [f"({q.row_sql})" for q in self.row_qs]
            rq = [f"({q.row_sql})" for q in self.quant_qs]
        else:
            h = "__dp_h"
            res = [f"__dp_re{i}" for i in range(len(self.row_qs))]
            rq = self._rq_columns()
        cap = min(self.plan.bounding.max_rows, self.plan.bounding.rows_per_group)
        pairs = [self._pair(q, r) for q, r in zip(self.quant_qs, rq)]
        sq = [f"__dp_sq{i}" for i in range(len(pairs))]
        if not self.nk:
            return [("__dp_c", "toInt64(count())")] + [(f"__dp_s{i}", f"sum({r})") for i, r in enumerate(res)] + \
                list(zip(sq, [f"groupArraySorted({cap})({p})" for p in pairs]))
        if key_hash:
            out = [("__dp_mh", f"min({h})")]
        else:
            out = [(self._k(j), a) for j, a in enumerate(self._choose_keys(inline=inline))]
        packed = [f"sumArgMin({_packed_row(r)}, {h})" for r in res]
        out.append(("__dp_c", _unpack_count(packed[0]) if packed else f"toInt64(countArgMin({h}))"))
        out += [(f"__dp_s{i}", _unpack_sum(a)) for i, a in enumerate(packed)]
        return out + list(zip(sq, [f"groupArraySortedArgMin({cap})({p}, {h})" for p in pairs]))

    def _rq_columns(self) -> list[str]:
        """The rows stage's column of each quantile/distinct quantity: quantities with the same row
        expression (MIN(x) and MAX(x), two quantiles of x) share the first one's, so their per-unit
        aggregates are the same expression and ClickHouse computes it once (the kept rows were
        identical anyway: same hash, same values); each quantity keeps its own noise."""
        first: dict[tuple[str, str | None], int] = {}
        return [f"__dp_rq{first.setdefault((q.kind, q.row_sql), i)}" for i, q in enumerate(self.quant_qs)]

    def _bq_column(self, q: Quantity) -> str:
        """The bounded stage's kept values of ``q``: the first quantity's with the same row
        expression (``_rq_columns``), so the group stage's aggregate is computed once too."""
        return self._rq_columns()[self.quant_qs.index(q)].replace("__dp_rq", "__dp_bq")

    def _pair(self, q: Quantity, value_sql: str) -> str:
        if q.kind == "quantile":
            return self._hashed_bucket(value_sql)
        # a distinct value: its keyed hash (tuple() makes a NULL value hashable) and a not-NULL bit,
        # packed as one UInt128 hash·2 + bit. A unit keeps its rows with the smallest hashes as
        # with the (hash, value) tuple this replaces (same multiset of kept hashes); the group stage
        # counts distinct kept hashes of non-NULL values, which equals the distinct values unless
        # two of them collide (the count is then lower; a unit still adds at most its kept hashes,
        # so the sensitivity is unchanged). A number sorts ~4x faster than a tuple holding a String
        # (bench/RESULTS.md, ClickBench Q5)
        return (f"bitOr(bitShiftLeft(toUInt128(sipHash64Keyed({SALT_PLACEHOLDER}, tuple({value_sql}))), 1), "
                f"toUInt128(isNotNull({value_sql})))")

    @staticmethod
    def _hashed_bucket(bucket_sql: str, hashed: bool = True) -> str:
        """(keyed hash of the bucket, bucket), packed: sorted, a unit's first r are the r rows it keeps
        (NULL buckets, rows not in the histogram, become QUANTILE_BUCKETS and are dropped later).
        Row level keeps every row, so no hash is computed there (``hashed=False``: 0)."""
        b = f"ifNull({bucket_sql}, {QUANTILE_BUCKETS})"
        key = f"sipHash64Keyed({SALT_PLACEHOLDER}, {b})" if hashed else "toUInt64(0)"
        # packed as one UInt128 hash·2^32 + bucket, which sorts exactly as the pair (hash, bucket)
        # does: groupArraySorted over a number is ~4x faster than over a tuple (bench/RESULTS.md,
        # ClickBench Q6); the bucket is the low 32 bits (_histogram)
        return f"bitOr(bitShiftLeft(toUInt128({key}), 32), toUInt128(toUInt32({b})))"

    def _k(self, j: int) -> str:
        return f"__dp_k{j}"

    def _key_list(self) -> str:
        return ", ".join(self._k(j) for j in range(self.nk))

    def _group_by(self) -> str:
        return f"\nGROUP BY {self._key_list()}" if self.nk else ""

    @staticmethod
    def _histogram(pairs_sql: str) -> str:
        """Group stage of a quantile: the sparse histogram (buckets, counts) of the kept pairs."""
        buckets = f"arrayMap(__dp_t -> toUInt32(bitAnd(__dp_t, 4294967295)), {pairs_sql})"
        kept = f"arrayFilter(__dp_b -> __dp_b < {QUANTILE_BUCKETS}, {buckets})"
        return f"sumMap({kept}, arrayMap(__dp_b -> toUInt64(1), {kept}))"

    def _q_agg(self, q: Quantity, rows_col: str, units_col: str, sum_prefix: str) -> str:
        if q.kind == "units":
            return units_col
        if q.row_sql is None:
            return rows_col
        return f"sum({sum_prefix}{self.row_qs.index(q)})"

    # -- stages -----------------------------------------------------------------------------
    def groups_sql(self, *, key_hash: bool = False) -> str:
        """Stages 1-3: per-group bounded aggregates, columns __dp_k<j>, __dp_q<i>; with ``key_hash``
        and ``by_key_hash()``, column __dp_kh (the groups' key hash) instead of __dp_k<j>, for
        ``with_public_keys`` to map back to key values."""
        p = self.plan
        kh = key_hash and self.by_key_hash()
        keys_proj = [f"{sql_of(k.expr)} AS {self._k(j)}" for j, k in enumerate(self.keys)]
        if p.entry.row_level:
            cols = keys_proj + [
                f"{self._q_agg(q, 'toInt64(count())', 'toInt64(count())', '__dp_e')} AS {q.column}"
                if q.row_sql is None else f"toInt64(uniqExact({q.row_sql})) AS {q.column}" if q.kind == "distinct" else
                f"{self._histogram(f'[{self._hashed_bucket(q.row_sql, hashed=False)}]')} AS {q.column}" if q.kind == "quantile"
                else f"sum({q.row_sql}) AS {q.column}"
                for q in p.quantities]
            return f"SELECT {', '.join(cols)}\nFROM {self.table_sql}{self._where()}{self._group_by()}"

        unit = quote_ident(p.entry.privacy_unit)  # type: ignore[arg-type]
        b = p.bounding
        rk = [f"{sql_of(k.expr)} AS __dp_rk{j}" for j, k in enumerate(self.keys)]
        re = [f"{q.row_sql} AS __dp_re{i}" for i, q in enumerate(self.row_qs)] + \
            [f"{q.row_sql} AS {c}" for q, c in zip(self.quant_qs, self._rq_columns()) if c == f"__dp_rq{self.quant_qs.index(q)}"]
        hash_sql = ""
        if self.nk:
            key_args = [f"__dp_rk{j}" for j in range(self.nk)]
            hash_sql = f"{self.unit_hash_sql(key_args, '__dp_u')} AS __dp_h"
        rows = ", ".join([f"{unit} AS __dp_u"] + rk + ([hash_sql] if hash_sql else []) + re)
        where = self._where(key_filters=not self._defer_key_filters())
        if is_nullable(p.entry.columns.get(p.entry.privacy_unit or "", "")):
            # a row without a privacy unit belongs to no unit: it is dropped (docs/CONTROLLER.md)
            where = (where + f" AND ({unit} IS NOT NULL)") if where else f"\nWHERE {unit} IS NOT NULL"
        rows_sql = f"SELECT {rows}\nFROM {self.table_sql}{where}"

        bq_cols = [f"__dp_sq{i} AS __dp_bq{i}" for i in range(len(self.quant_qs))]
        if not self.nk or b.k == 1:
            assert self.weighted is None, "the weighted selection statistic needs the k > 1 path"
            cap = min(b.max_rows, b.rows_per_group)
            named = self._per_unit_named(inline=False, key_hash=kh)
            per_unit_cols = (["__dp_u"] if kh else []) + [f"{a} AS {n}" for n, a in named]
            per_unit = (f"SELECT {', '.join(per_unit_cols)}\nFROM (\n{_indent(rows_sql)}\n)\nGROUP BY __dp_u")
            # the key part of the unit's smallest hash: the key hash of its group
            head = [f"bitXor(__dp_mh, {self._unit_part_sql('__dp_u')}) AS __dp_kh"] if kh else \
                [f"{self._k(j)}" for j in range(self.nk)]
            scaled = head + [f"least(__dp_c, {cap}) AS __dp_r"]
            for i, q in enumerate(self.row_qs):
                scaled.append(
                    f"if(__dp_c <= {cap}, __dp_s{i}, least(greatest(toInt64(round(__dp_s{i} * {cap} / __dp_c)), "
                    f"{cap * q.lo_units}), {cap * q.hi_units})) AS __dp_b{i}")
            bounded = f"SELECT {', '.join(scaled + bq_cols)}\nFROM (\n{_indent(per_unit)}\n)"
        else:
            k, C, M = b.k, b.rows_per_group, b.max_rows
            stage1_cols = ["__dp_u", "__dp_h"] + ([] if kh else [f"any(__dp_rk{j}) AS {self._k(j)}" for j in range(self.nk)]) + \
                ["toInt64(count()) AS __dp_c"] + [f"sum(__dp_re{i}) AS __dp_s{i}" for i in range(len(self.row_qs))] + \
                [f"groupArraySorted({C})({self._pair(q, c)}) AS __dp_sq{i}"
                 for i, (q, c) in enumerate(zip(self.quant_qs, self._rq_columns()))]
            stage1 = f"SELECT {', '.join(stage1_cols)}\nFROM (\n{_indent(rows_sql)}\n)\nGROUP BY __dp_u, __dp_h"
            # per unit: its k groups with the smallest keyed hashes, in hash order: one array per
            # column, the permutation that sorts the hashes computed once and applied to each (the
            # hashes of one unit's groups are distinct: the order is unique); element i of every
            # array is the same group. groupArray skips NULL: a nullable key goes in 1-tuples.
            fields = ["__dp_h", "__dp_c"] + ([] if kh else [self._k(j) for j in range(self.nk)]) + \
                [f"__dp_s{i}" for i in range(len(self.row_qs))] + [f"__dp_sq{i}" for i in range(len(self.quant_qs))]
            names = ["__dp_ah", "__dp_ac"] + ([] if kh else [f"__dp_ak{j}" for j in range(self.nk)]) + \
                [f"__dp_as{i}" for i in range(len(self.row_qs))] + [f"__dp_aq{i}" for i in range(len(self.quant_qs))]
            boxed = {self._k(j) for j in range(self.nk) if p.key_nullable(j)}
            collect = [f"groupArray(tuple({f})) AS {n}" if f in boxed else f"groupArray({f}) AS {n}"
                       for f, n in zip(fields, names)]
            gathered = f"SELECT __dp_u, {', '.join(collect)}\nFROM (\n{_indent(stage1)}\n)\nGROUP BY __dp_u"
            order = f"arraySlice(arraySort((__dp_j, __dp_v) -> __dp_v, arrayEnumerate(__dp_ah), __dp_ah), 1, {k})"
            picked = [f"arrayMap(__dp_j -> {n}[__dp_j]{'.1' if f in boxed else ''}, __dp_o) AS {n}"
                      for f, n in zip(fields, names)]
            stage2 = (f"SELECT __dp_u, {', '.join(picked)}\nFROM (SELECT *, {order} AS __dp_o FROM (\n"
                      f"{_indent(gathered)}\n))")
            passthrough = (["__dp_u"] if kh else []) + names
            stage2b = (f"SELECT {', '.join(passthrough)}, "
                       f"arrayMap((__dp_x, __dp_y) -> least(__dp_x, greatest(0, {M} - (__dp_y - __dp_x))), "
                       f"arrayMap(__dp_t -> least(__dp_t, {C}), __dp_ac), "
                       f"arrayCumSum(arrayMap(__dp_t -> least(__dp_t, {C}), __dp_ac))) AS __dp_ra"
                       + (f", {unit_weight_sql('length(__dp_ah)', self.weighted.hi_units)} AS __dp_w"
                          if self.weighted is not None else "")
                       + f"\nFROM (\n{_indent(stage2)}\n)")
            unfold_keys = [f"bitXor(__dp_ah[__dp_i], {self._unit_part_sql('__dp_u')}) AS __dp_kh"] if kh else \
                [f"__dp_ak{j}[__dp_i] AS {self._k(j)}" for j in range(self.nk)]
            unfold_cols = unfold_keys + \
                ["__dp_ac[__dp_i] AS __dp_c", "toInt64(__dp_ra[__dp_i]) AS __dp_r"] + \
                (["__dp_w"] if self.weighted is not None else []) + \
                [f"__dp_as{i}[__dp_i] AS __dp_s{i}" for i in range(len(self.row_qs))] + \
                [f"arraySlice(__dp_aq{i}[__dp_i], 1, __dp_ra[__dp_i]) AS __dp_sq{i}" for i in range(len(self.quant_qs))]
            unfold = (f"SELECT {', '.join(unfold_cols)}\nFROM (\n{_indent(stage2b)}\n)\n"
                      f"ARRAY JOIN arrayEnumerate(__dp_ah) AS __dp_i")
            scaled = (["__dp_kh"] if kh else [self._k(j) for j in range(self.nk)]) + ["__dp_r"] + (["__dp_w"] if self.weighted is not None else [])
            for i, q in enumerate(self.row_qs):
                scaled.append(
                    f"if(__dp_c <= __dp_r, __dp_s{i}, least(greatest(toInt64(round(__dp_s{i} * __dp_r / __dp_c)), "
                    f"__dp_r * ({q.lo_units})), __dp_r * {q.hi_units})) AS __dp_b{i}")
            bounded = f"SELECT {', '.join(scaled + bq_cols)}\nFROM (\n{_indent(unfold)}\n)"

        group_cols = ["__dp_kh"] if kh else [self._k(j) for j in range(self.nk)]
        for q in p.quantities:
            if q.kind == "quantile":
                group_cols.append(f"{self._histogram(self._bq_column(q))} AS {q.column}")
            elif q.kind == "distinct":  # NULL values (bit 0) are skipped, as COUNT(DISTINCT) does
                group_cols.append(f"toInt64(uniqExactArray(arrayMap(__dp_t -> bitShiftRight(__dp_t, 1), "
                                  f"arrayFilter(__dp_t -> bitAnd(__dp_t, 1) = 1, {self._bq_column(q)})))) "
                                  f"AS {q.column}")
            elif q.kind == "units":
                group_cols.append(f"toInt64(count()) AS {q.column}")
            elif q.kind == "weighted_units":
                group_cols.append(f"toInt64(sum(__dp_w)) AS {q.column}")
            elif q.row_sql is None:
                group_cols.append(f"toInt64(sum(__dp_r)) AS {q.column}")
            else:
                group_cols.append(f"toInt64(sum(__dp_b{self.row_qs.index(q)})) AS {q.column}")
        group_by = "\nGROUP BY __dp_kh" if kh else self._group_by()
        return f"SELECT {', '.join(group_cols)}\nFROM (\n{_indent(bounded)}\n){group_by}"

    def with_public_keys(self, groups: str, *, key_hash: bool = False) -> str:
        """Every public key, LEFT JOINed with the groups' aggregates (missing groups: 0). With
        ``key_hash`` (``groups`` has __dp_kh, see ``by_key_hash``) the join is on the key hash: the
        domain's kh is computed from its values cast to the key's engine type, the type the rows
        stage hashed; a kh that two domain keys share (a sipHash collision under this salt) joins
        neither, so every unit still reaches at most k released groups."""
        p = self.plan
        if p.key_mode != "public":
            return groups
        key_cols = ", ".join(f"arrayJoin({d.array_sql}) AS {self._k(j)}"  # type: ignore[union-attr]
                             for j, d in enumerate(p.key_domains))
        if key_hash and self.by_key_hash():
            typed = [f"CAST({self._k(j)} AS {t})" for j, t in enumerate(p.key_types)]  # type: ignore[arg-type]
            keys_sql = (f"SELECT *, count() OVER (PARTITION BY __dp_kh) = 1 AS __dp_kh_unique\nFROM (SELECT *, "
                        f"{self._key_part_sql(typed)} AS __dp_kh FROM (SELECT {key_cols}))")
            on = "__dp_keys.__dp_kh = __dp_agg.__dp_kh AND __dp_keys.__dp_kh_unique"
        else:
            keys_sql = f"SELECT {key_cols}"
            on = " AND ".join(f"isNotDistinctFrom(__dp_keys.{self._k(j)}, __dp_agg.{self._k(j)})" if p.key_nullable(j)
                              else f"__dp_keys.{self._k(j)} = __dp_agg.{self._k(j)}" for j in range(self.nk))
        cols = [f"__dp_keys.{self._k(j)} AS {self._k(j)}" for j in range(self.nk)] + \
            [f"__dp_agg.{q.column} AS {q.column}" if q.kind == "quantile"
             else f"toInt64(ifNull(__dp_agg.{q.column}, 0)) AS {q.column}" for q in p.quantities]
        return (f"SELECT {', '.join(cols)}\nFROM ({keys_sql}) AS __dp_keys\nLEFT JOIN (\n{_indent(groups)}\n) "
                f"AS __dp_agg ON {on}")

    def _selection_first_sql(self, inner: str) -> str:
        """Private partition selection before anything else is noised: the selection count is
        drawn and thresholded in its own subquery (so that the filter and the released count are
        one draw); the other quantities are noised only for the released groups (each draw is
        independent of the selection's, so their distribution is unchanged; the noise UDF then runs
        on the released groups, not on every candidate: ClickBench Q30, bench/RESULTS.md). A
        peeling top-n's candidates are the released groups."""
        p = self.plan
        sel_q = p.quantities[p.selection.quantity]  # type: ignore[union-attr]
        value = f"toInt64({sel_q.column})"
        noised = (f"SELECT *, {sel_q.noise_sql(value) if self.noise else value} AS {sel_q.noisy_column}\n"
                  f"FROM (\n{_indent(inner)}\n)")
        where = f"\nWHERE {sel_q.noisy_column} >= {p.selection.threshold}" if self.selection else ""  # type: ignore[union-attr]
        return f"SELECT *\nFROM (\n{_indent(noised)}\n){where}"

    def top_k_sql(self, inner: str) -> str:
        """The peeling top-n stage (dpch.plan.top_k): every candidate group in one array, the n
        chosen by dpch_top_k over their true scores (without noise, for neighbouring-dataset checks
        only: the exact top n, ties by position), then unfolded with their rank (1 = chosen first)."""
        p = self.plan
        t = p.top_k
        assert t is not None
        cols = [self._k(j) for j in range(self.nk)] + [q.column for q in p.quantities]
        if p.selection is not None:
            cols.append(p.quantities[p.selection.quantity].noisy_column)
        pos = cols.index(p.quantities[t.quantity].column) + 1
        sign = "" if t.shape.descending else "-"
        score = f"{sign}toInt64(tupleElement(__dp_t, {pos}))"
        scores = f"arrayMap(__dp_t -> {score}, __dp_all)"
        if self.noise:
            chosen = (f"dpch_top_k({scores}, toUInt32({t.n}), {float_literal(t.epsilon)}, "
                      f"toUInt64({t.sensitivity}))")
        else:
            chosen = (f"arrayMap(__dp_i -> toUInt32(__dp_i - 1), arraySlice(arraySort(__dp_i -> "
                      f"tuple(-({scores})[__dp_i], __dp_i), arrayEnumerate(__dp_all)), 1, {t.n}))")
        collect = f"SELECT groupArray(tuple({', '.join(cols)})) AS __dp_all\nFROM (\n{_indent(inner)}\n)"
        choose = f"SELECT __dp_all, {chosen} AS __dp_top\nFROM (\n{_indent(collect)}\n)"
        unfold = (f"SELECT arrayJoin(arrayMap((__dp_i, __dp_r) -> tuple(__dp_all[__dp_i + 1], __dp_r), __dp_top, "
                  f"arrayEnumerate(__dp_top))) AS __dp_g\nFROM (\n{_indent(choose)}\n)")
        out = [f"tupleElement(tupleElement(__dp_g, 1), {i + 1}) AS {c}" for i, c in enumerate(cols)]
        return f"SELECT {', '.join(out)}, tupleElement(__dp_g, 2) AS __dp_rank\nFROM (\n{_indent(unfold)}\n)"

    def _noised_here(self, q: Quantity) -> bool:
        """Whether the noised stage releases q (not a score that no output uses, not the
        selection count, drawn before: ``_selection_first_sql``)."""
        p = self.plan
        early = p.selection is not None and q.index == p.selection.quantity
        return q.released and not early

    def noised_sql(self, inner: str) -> str:
        p = self.plan
        cols = [self._k(j) for j in range(self.nk)]
        if p.top_k is not None:
            cols.append("__dp_rank")
        if p.selection is not None:
            cols.append(p.quantities[p.selection.quantity].noisy_column)
        for q in self.plan.quantities:
            if not self._noised_here(q):
                continue
            if q.kind == "quantile":
                cols.append(f"{self._quantile_buckets(q)} AS {q.noisy_column}")
                continue
            value = f"toInt64({q.column})"
            cols.append(f"{q.noise_sql(value) if self.noise else value} AS {q.noisy_column}")
        return f"SELECT {', '.join(cols)}\nFROM (\n{_indent(inner)}\n)"

    def _quantile_buckets(self, q: Quantity) -> str:
        """The released buckets (Array(UInt32), one per level): dpch_quantiles at ε/coords per
        group; without noise (neighbouring-dataset checks only), the exact bounded quantile's
        bucket (the first whose cumulative count reaches level · n)."""
        levels = "[" + ", ".join(float_literal(a) for a in q.levels) + "]"
        keys, counts = f"tupleElement({q.column}, 1)", f"tupleElement({q.column}, 2)"
        if not self.noise:
            return (f"arrayMap(__dp_a -> toUInt32(if(empty({keys}), 0, {keys}[greatest(arrayFirstIndex("
                    f"__dp_c -> __dp_c >= __dp_a * arraySum({counts}), arrayCumSum({counts})), 1)])), {levels})")
        return (f"dpch_quantiles({keys}, {counts}, toUInt32({QUANTILE_BUCKETS}), CAST({levels} AS Array(Float64)), "
                f"{float_literal(q.group_epsilon)}, toUInt64({q.rows}))")

    def _agg_value_sql(self, i: int) -> str:
        ap = self.plan.aggregates[i]
        qs = self.plan.quantities
        if ap.func in ("quantile", "quantiles"):
            lo, hi = ap.value_interval  # type: ignore[misc]
            width = float_literal((hi - lo) / QUANTILE_BUCKETS)
            values = (f"arrayMap(__dp_b -> least(greatest({float_literal(lo)} + (toFloat64(__dp_b) + 0.5) * {width}, "
                      f"{float_literal(lo)}), {float_literal(hi)}), {qs[ap.roles['quantile']].noisy_column})")
            return f"{values}[1]" if ap.func == "quantile" else values
        if "mean" in ap.roles:  # mechanism="bounded_laplace": AVG released directly, in its bounds
            return qs[ap.roles["mean"]].noisy_column
        if ap.func in ("count", "count_distinct_unit", "count_distinct"):
            return f"greatest({qs[ap.roles['count']].noisy_column}, 0)"
        if ap.func == "sum":
            q = qs[ap.roles["sum"]]
            return f"({q.noisy_column} * {float_literal(q.grid)})"
        n = f"greatest({qs[ap.roles['count']].noisy_column}, 1)"
        s = qs[ap.roles["sum"]]
        lo, hi = ap.value_interval  # type: ignore[misc]
        mean_c = f"({s.noisy_column} * {float_literal(s.grid)} / {n})"
        if ap.func == "avg":
            return f"least(greatest({float_literal(ap.centre)} + {mean_c}, {float_literal(lo)}), {float_literal(hi)})"
        sq = qs[ap.roles["sumsq"]]
        hw2 = ap.halfwidth * ap.halfwidth
        m2 = f"({sq.noisy_column} * {float_literal(sq.grid)} / {n} + {float_literal(sq.centre)})"
        var_pop = f"least(greatest({m2} - pow({mean_c}, 2), 0.), {float_literal(hw2)})"
        if ap.func == "var_pop":
            return var_pop
        if ap.func == "stddev_pop":
            return f"sqrt({var_pop})"
        var_samp = f"({var_pop} * {n} / greatest({n} - 1, 1))"
        if ap.func == "var_samp":
            return var_samp
        return f"sqrt({var_samp})"

    def _agg_released(self, i: int) -> bool:
        return all(self.plan.quantities[qi].released for qi in self.plan.aggregates[i].roles.values())

    def released_sql(self, inner: str) -> str:
        p = self.plan
        cols = [self._k(j) for j in range(self.nk)] + (["__dp_rank"] if p.top_k is not None else [])
        cols += [f"{self._agg_value_sql(i)} AS __dp_a{i}" for i in range(len(p.aggregates)) if self._agg_released(i)]
        cols += [q.noisy_column for q in p.quantities if q.released]
        where = ""
        if p.selection is not None and self.selection:
            sel_q = p.quantities[p.selection.quantity]
            where = f"\nWHERE {sel_q.noisy_column} >= {p.selection.threshold}"
        return f"SELECT {', '.join(cols)}\nFROM (\n{_indent(inner)}\n){where}"

    def outer_sql(self, inner: str, with_internal: bool = True) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
        bound = self.plan.bound
        cols = [f"{sql_of(o.template)} AS {quote_ident(o.name)}" for o in bound.outputs]
        internal = tuple(q.noisy_column for q in self.plan.quantities if q.released) if with_internal else ()
        cols += [f"{c} AS {c}_out" for c in internal]
        sql = f"SELECT {', '.join(cols)}\nFROM (\n{_indent(inner)}\n)"
        if bound.having is not None:
            sql += f"\nWHERE {sql_of(bound.having)}"
        if bound.order:
            items = []
            for o in bound.order:
                if not all(self._agg_released(i) for i in aggregate_refs(o.template)):
                    # a peeling top-n's score that is not released: the groups come in the order chosen
                    items.append("__dp_rank ASC")
                    continue
                s = sql_of(o.template) + (" DESC" if o.desc else " ASC")
                if o.nulls_first is not None:
                    s += " NULLS FIRST" if o.nulls_first else " NULLS LAST"
                items.append(s)
            sql += f"\nORDER BY {', '.join(items)}"
        elif self.nk:
            sql += f"\nORDER BY {self._key_list()}"
        if bound.limit is not None:
            sql += f"\nLIMIT {bound.limit}"
            if bound.offset:
                sql += f" OFFSET {bound.offset}"
        elif bound.offset:
            sql += f"\nLIMIT 18446744073709551615 OFFSET {bound.offset}"
        return sql, tuple(o.name for o in bound.outputs), tuple(f"{c}_out" for c in internal)

    def build(self) -> Rewritten:
        groups = self.groups_sql(key_hash=True)
        keyed = self.with_public_keys(groups, key_hash=True)
        if self.plan.selection is not None:
            keyed = self._selection_first_sql(keyed)
        if self.plan.top_k is not None:
            keyed = self.top_k_sql(keyed)
        noised = self.noised_sql(keyed)
        released = self.released_sql(noised)
        display, names, internal = self.outer_sql(released)
        shown = display.replace(SALT_PLACEHOLDER, "<secret salt>").replace(UNIT_SALT_PLACEHOLDER, "<secret salt>")
        return Rewritten(sql=self._salted(with_settings(display)), display_sql=shown, output_names=names,
                         internal_columns=internal,
                         released_sql=self._salted(self.outer_sql(released, with_internal=False)[0]))

    def _salted(self, sql: str) -> str:
        return sql.replace(SALT_PLACEHOLDER, self.plan.entry.hash_key_sql()).replace(
            UNIT_SALT_PLACEHOLDER, self.plan.entry.unit_salt_sql())


def rewrite(plan: Plan) -> Rewritten:
    """The executable query for ``plan`` (noise on, partition selection on)."""
    return _Rewriter(plan, noise=True, selection=True, table=None).build()


def rewrite_for_sensitivity_check(plan: Plan, *, table: str | None = None) -> Rewritten:
    """TESTS ONLY: the same query with the noise UDF calls replaced by the identity and partition
    selection off, optionally on another table (a neighbouring dataset D′). The controller never
    calls this; its output is not private."""
    return _Rewriter(plan, noise=False, selection=False, table=table).build()


def rewrite_probe(plan: Plan) -> Rewritten:
    """The same query over ONE row of default values instead of the table (dpch.typecheck runs it
    before the charge; it reads no private row). Noise off: the UDF calls are typed by
    construction, and the probe's output is discarded."""
    return _Rewriter(plan, noise=False, selection=True, table=default_row_sql(plan.entry)).build()
