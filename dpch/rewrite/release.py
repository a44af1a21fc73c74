"""Stages 3-6 of the rewritten query after the per-group aggregates: the public key domain's LEFT
JOIN, private partition selection (drawn first), peeling top-n, the noise UDF calls, the released
values (post-processing of the noisy quantities) and the analyst's outer query."""
from __future__ import annotations

from ..bind import aggregate_refs
from ..catalog import quote_ident
from ..mechanisms import QUANTILE_BUCKETS
from ..plan import Quantity, float_literal
from ..sql_ast import sql_of
from .base import _indent


class ReleaseStages:
    """Mixin of ``_Rewriter`` (dpch/rewrite/rewriter.py): everything after the group stage."""

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

    def _selection_first_sql(self, inner: str) -> tuple[str, str]:
        """Private partition selection before anything else is noised: (the level that draws the
        selection count, the threshold's WHERE for the level above it). The count is drawn in its
        own subquery and the parent filters on it, so that the filter and the released count are
        one draw; the other quantities are noised only for the released groups (each draw is
        independent of the selection's, so their distribution is unchanged; the noise UDF then runs
        on the released groups, not on every candidate: ClickBench Q30, bench/RESULTS.md). A
        peeling top-n's candidates are the released groups. The WHERE goes on the parent's own
        level rather than a ``SELECT * ... WHERE`` level of its own (one level less to analyse:
        docs/PERFORMANCE.md, "Flattening"); it names only the drawn column, which the parent
        passes through under its own name."""
        p = self.plan
        sel_q = p.quantities[p.selection.quantity]  # type: ignore[union-attr]
        value = f"toInt64({sel_q.column})"
        noised = (f"SELECT *, {sel_q.noise_sql(value) if self.noise else value} AS {sel_q.noisy_column}\n"
                  f"FROM (\n{_indent(inner)}\n)")
        where = f"\nWHERE {sel_q.noisy_column} >= {p.selection.threshold}" if self.selection else ""  # type: ignore[union-attr]
        return noised, where

    def top_k_sql(self, inner: str, where: str = "") -> str:
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
        collect = f"SELECT groupArray(tuple({', '.join(cols)})) AS __dp_all\nFROM (\n{_indent(inner)}\n){where}"
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

    def noised_sql(self, inner: str, where: str = "") -> str:
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
        return f"SELECT {', '.join(cols)}\nFROM (\n{_indent(inner)}\n){where}"

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

    def released_with(self) -> str:
        """The released values (``__dp_a<i>``: post-processing of the noisy columns) as the outer
        query's ``WITH`` aliases, not a level of their own (docs/PERFORMANCE.md, "Flattening"):
        deterministic expressions of the noised level's columns, which the outer query's SELECT,
        WHERE (the analyst's HAVING) and ORDER BY read by name. Partition selection has already
        filtered the groups (``_selection_first_sql``)."""
        p = self.plan
        items = [f"{self._agg_value_sql(i)} AS __dp_a{i}" for i in range(len(p.aggregates)) if self._agg_released(i)]
        return f"WITH {', '.join(items)}\n" if items else ""

    def outer_sql(self, noised: str, with_internal: bool = True) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
        """The analyst's query over the noised level: their outputs, HAVING (as WHERE), ORDER BY and
        LIMIT over the released values (``released_with``), the keys and ``__dp_rank``."""
        bound = self.plan.bound
        cols = [f"{sql_of(o.template)} AS {quote_ident(o.name)}" for o in bound.outputs]
        internal = tuple(q.noisy_column for q in self.plan.quantities if q.released) if with_internal else ()
        cols += [f"{c} AS {c}_out" for c in internal]
        sql = f"{self.released_with()}SELECT {', '.join(cols)}\nFROM (\n{_indent(noised)}\n)"
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
