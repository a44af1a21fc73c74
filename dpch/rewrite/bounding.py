"""Stages 1-3 of the rewritten query (``rows`` → ``per_unit`` → ``groups``): the keyed hash that
chooses each unit's groups and rows, contribution bounding, and the native aggregation per group.
See the package docstring (dpch/rewrite/__init__.py) and docs/PERFORMANCE.md."""
from __future__ import annotations

from ..catalog import base_type, is_integer_type, is_nullable, quote_ident
from ..mechanisms import QUANTILE_BUCKETS
from ..plan import Quantity
from ..plan.selection import unit_weight_sql
from ..sql_ast import sql_of
from .base import SALT_PLACEHOLDER, UNIT_SALT_PLACEHOLDER, _indent, _packed_row, _unpack_count, _unpack_sum


class BoundingStages:
    """Mixin of ``_Rewriter`` (dpch/rewrite/rewriter.py): the per-unit and per-group stages."""

    units = None  # _Rewriter's per-unit table reader (dpch.rewrite.unit_table), if any

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
            rq = self.rq_columns
        cap = min(self.plan.bounding.max_rows, self.plan.bounding.rows_per_group)
        unit = quote_ident(self.plan.entry.privacy_unit) if inline else "__dp_u"  # type: ignore[arg-type]
        pairs = [self._pair(q, r, unit) for q, r in zip(self.quant_qs, rq)]
        sq = [f"__dp_sq{i}" for i in range(len(pairs))]
        if not self.nk:
            return [("__dp_c", "toInt64(count())")] + [(f"__dp_s{i}", f"sum({r})") for i, r in enumerate(res)] + \
                list(zip(sq, [f"{self._sample_function(q)}({cap})({p})" for q, p in zip(self.quant_qs, pairs)]))
        if key_hash:
            out = [("__dp_mh", f"min({h})")]
        else:
            out = [(self._k(j), a) for j, a in enumerate(self._choose_keys(inline=inline))]
        packed = [f"sumArgMin({_packed_row(r)}, {h})" for r in res]
        out.append(("__dp_c", _unpack_count(packed[0]) if packed else f"toInt64(countArgMin({h}))"))
        out += [(f"__dp_s{i}", _unpack_sum(a)) for i, a in enumerate(packed)]
        return out + list(zip(sq, [f"{self._sample_function(q)}ArgMin({cap})({p}, {h})"
                                   for q, p in zip(self.quant_qs, pairs)]))

    @staticmethod
    def _sample_function(q: Quantity) -> str:
        """The aggregate that keeps a unit's sample for ``q``, its first r in the unit's order:
        rows for a quantile (each row weighs in the histogram), distinct values for a distinct
        count (-Distinct: a value repeated by one unit takes one place, not one per row; with
        rows, SearchPhrase's repeats lost 8.7 % of its distinct values at 1 M rows, ClickBench;
        it costs a hash set of each unit's distinct values: +27-31 % on URL's query, nothing on
        SearchPhrase's, bench/RESULTS.md). Either way the unit adds at most r values: the
        sensitivity is the same."""
        return "groupArraySortedDistinct" if q.kind == "distinct" else "groupArraySorted"

    def _rq_columns(self) -> list[str]:
        """The rows stage's column of each quantile/distinct quantity: quantities with the same row
        expression (MIN(x) and MAX(x), two quantiles of x) share the first one's, so their per-unit
        aggregates are the same expression and ClickHouse computes it once (the kept rows were
        identical anyway: same hash, same values); each quantity keeps its own noise."""
        first: dict[tuple[str, str | None], int] = {}
        return [f"__dp_rq{first.setdefault((q.kind, q.row_sql), i)}" for i, q in enumerate(self.quant_qs)]

    def _bq_column(self, q: Quantity) -> str:
        """The bounded stage's kept values of ``q`` (its ``__dp_sq<i>``, passed through): the first
        quantity's with the same row expression (``rq_columns``), so the group stage's aggregate is
        computed once too."""
        return self.rq_columns[self.quant_qs.index(q)].replace("__dp_rq", "__dp_sq")

    def _pair(self, q: Quantity, value_sql: str, unit_sql: str) -> str:
        if q.kind == "quantile":
            return self._hashed_bucket(value_sql, unit_sql=unit_sql)
        # a distinct value: its keyed hash vh (tuple() makes a NULL value hashable) and a not-NULL
        # bit, packed as one UInt128 after the unit's order key: order·2^65 + vh·2 + bit, with
        # order = the top 63 bits of _row_order (NULL last). A unit keeps the distinct values that
        # come first (_sample_function);
        # the group stage counts distinct vh of non-NULL values, which equals the distinct values
        # unless two of them collide (the count is then lower; a unit still adds at most its kept
        # hashes, so the sensitivity is unchanged). A number sorts ~4x faster than a tuple holding a
        # String (bench/RESULTS.md, ClickBench Q5)
        vh = f"sipHash64Keyed({SALT_PLACEHOLDER}, tuple({value_sql}))"
        order = f"bitShiftRight({self._row_order(vh, f'isNull({value_sql})', unit_sql)}, 1)"
        return (f"bitOr(bitOr(bitShiftLeft(toUInt128({order}), 65), bitShiftLeft(toUInt128({vh}), 1)), "
                f"toUInt128(isNotNull({value_sql})))")

    def _row_order(self, value_hash: str, is_null: str, unit_sql: str) -> str:
        """The order in which a unit keeps its rows for a quantile or a distinct count (UInt64, the
        smallest first): the value's keyed hash mixed with the unit's own salted hash, so that each
        unit's order is its own (with one order for every unit, all units would keep the same
        values, and a quantile's kept rows would lean towards whichever values the salt ranks
        first), and every row whose value is NULL (a NULL column, a row outside an -If condition)
        last, so that such rows never take the place of a value (they are dropped afterwards).
        A function of the unit's own rows (and its id) only: the sensitivity is unchanged."""
        return (f"if({is_null}, toUInt64(18446744073709551615), "
                f"intHash64(bitXor({value_hash}, {self._unit_part_sql(unit_sql)})))")

    def _hashed_bucket(self, bucket_sql: str, hashed: bool = True, unit_sql: str = "") -> str:
        """(the unit's order of the bucket (``_row_order``), bucket), packed: sorted, a unit's first r
        are the r rows it keeps (NULL buckets, rows not in the histogram, become QUANTILE_BUCKETS,
        come last and are dropped later). Row level keeps every row, so no hash is computed there
        (``hashed=False``: 0)."""
        b = f"ifNull({bucket_sql}, {QUANTILE_BUCKETS})"
        key = (self._row_order(f"sipHash64Keyed({SALT_PLACEHOLDER}, {b})", f"isNull({bucket_sql})", unit_sql)
               if hashed else "toUInt64(0)")
        # packed as one UInt128 order·2^32 + bucket, which sorts exactly as the pair (order, bucket)
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
            [f"{q.row_sql} AS {c}" for i, (q, c) in enumerate(zip(self.quant_qs, self.rq_columns)) if c == f"__dp_rq{i}"]
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

        bq_cols = [f"__dp_sq{i}" for i in range(len(self.quant_qs))]
        if not self.nk or b.k == 1:
            assert self.weighted is None, "the weighted selection statistic needs the k > 1 path"
            cap = min(b.max_rows, b.rows_per_group)
            named = self._per_unit_named(inline=False, key_hash=kh)
            if self.units is not None:  # a maintained per-unit table holds this stage (rewrite.unit_table)
                per_unit = self.units(self, kh)
            else:
                per_unit_cols = (["__dp_u"] if kh else []) + [f"{a} AS {n}" for n, a in named]
                per_unit = f"SELECT {', '.join(per_unit_cols)}\nFROM (\n{_indent(rows_sql)}\n)\nGROUP BY __dp_u"
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
                [f"{self._sample_function(q)}({C})({self._pair(q, c, '__dp_u')}) AS __dp_sq{i}"
                 for i, (q, c) in enumerate(zip(self.quant_qs, self.rq_columns))]
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
            # without sums nothing is scaled: the group stage reads the unfolded rows directly
            # (a pass-through level costs the engine's analysis 1-2 ms: docs/PERFORMANCE.md)
            bounded = unfold if not self.row_qs else \
                f"SELECT {', '.join(scaled + bq_cols)}\nFROM (\n{_indent(unfold)}\n)"

        group_cols = ["__dp_kh"] if kh else [self._k(j) for j in range(self.nk)]
        for q in p.quantities:
            if q.kind == "quantile":
                group_cols.append(f"{self._histogram(self._bq_column(q))} AS {q.column}")
            elif q.kind == "distinct":  # NULL values (bit 0) are skipped, as COUNT(DISTINCT) does
                group_cols.append(f"toInt64(uniqExactArray(arrayMap(__dp_t -> bitAnd(bitShiftRight(__dp_t, 1), "
                                  f"toUInt128(18446744073709551615)), "
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
