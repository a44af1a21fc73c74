"""The gateway's dp_* path (issue 12: `dp_count(ε)`, `dp_sum(x, lo, hi, ε)`… from untrusted
analysts, rewritten into user-level controller queries by dpch.dp_functions) under the same D / D′
rule as test_attacks.py: each query is rejected before charging on both D and D′, or answered on
both with the same columns, rows and public keys, and charged. It never fails at run time."""
from __future__ import annotations

import pytest

from dpch.dp_functions import rewrite_sql, run_dp_functions
from dpch.errors import InvalidParameter, QueryRejected

from . import harness
from .harness import PAIRS, charge_count, leaked_secrets, normalise

CASES = [
    # (id, SQL with {t}, pair, extra δ for private group selection)
    ("intdiv_unit", "SELECT dp_count(1.0) AS n FROM {t} WHERE intDiv(1, toInt64(user_id) - 42) >= -100", "k1", 0.0),
    ("parse_in_value", "SELECT dp_sum(toInt64(name), 0, 10, 1.0) AS s FROM {t}", "k1", 0.0),
    ("intdiv_in_value", "SELECT dp_sum(intDiv(qty, qty - qty), 0, 10, 1.0) AS s FROM {t}", "k1", 0.0),
    ("guarded_todate", "SELECT region, dp_count(1.0) AS n FROM {t} WHERE user_id = 42 AND toDate(name) > today() "
                       "GROUP BY region", "k1", 0.0),
    ("regex_from_data", "SELECT dp_sum(amount, 0, 100, 1.0) AS s FROM {t} WHERE match(name, name)", "k1", 0.0),
    ("repeat_blowup", "SELECT dp_count(1.0) AS n FROM {t} WHERE repeat(name, 1000) != ''", "k1", 0.0),
    # an expression of a public-key column: its image is the public domain, NULL included
    ("null_key_k3", "SELECT nullIf(region, region) AS r, dp_count(1.0) AS n FROM {t} GROUP BY r", "k3", 1e-6),
    ("int64_sum", "SELECT dp_sum(qty, 0, 10, 1.0) AS s, dp_avg(big, 0, 100, 1.0) AS a FROM {t}", "k1", 0.0),
    ("string_x", "SELECT dp_sum(name, 0, 10, 1.0) AS s FROM {t}", "k1", 0.0),
    ("huge_bounds", "SELECT dp_avg(amount, 0, 1e300, 1.0) AS a FROM {t}", "k1", 0.0),
    ("decimal_cast", "SELECT dp_sum(CAST(price AS Int8), 0, 10, 1.0) AS s FROM {t}", "k1", 0.0),
    ("count_if_cond", "SELECT region, dp_count(1.0) AS n FROM {t} WHERE (user_id = 42) * (amount > 500) = 1 "
                      "GROUP BY region", "k1", 0.0),
    # quantiles (issue 15): unit 42's extreme rows and run-time errors planted in the value
    ("median_extreme", "SELECT dp_median(amount, 0, 1000, 1.0) AS m, dp_quantile(amount, 1, 0, 1e6, 1.0) AS mx "
                       "FROM {t}", "k1", 0.0),
    ("quantile_intdiv", "SELECT region, dp_quantile(intDiv(qty, qty - qty), 0.5, 0, 10, 1.0) AS q FROM {t} "
                        "GROUP BY region", "k3", 1e-6),
    ("quantile_bad_q", "SELECT dp_quantile(amount, 1.5, 0, 10, 1.0) AS q FROM {t}", "k1", 0.0),
    ("median_string", "SELECT dp_median(name, 0, 10, 1.0) AS m FROM {t}", "k1", 0.0),
]


def _outcome(db, sql: str, dataset: str, extra_delta: float):
    before = charge_count(db, dataset)
    try:
        rw = rewrite_sql(sql.format(t=dataset), extra_delta=extra_delta)
        df = run_dp_functions(db, rw)
    except (QueryRejected, InvalidParameter) as exc:
        assert charge_count(db, dataset) == before, f"rejected but charged: {exc}"
        assert not leaked_secrets(str(exc)), str(exc)
        return ("rejected", normalise(str(exc)))
    except Exception as exc:  # noqa: BLE001 - reported below with the query
        assert not leaked_secrets(str(exc)), str(exc)
        return ("error", type(exc).__name__, normalise(str(exc)))
    assert charge_count(db, dataset) == before + 1
    meta = df.attrs.get("dpch", {})
    keys = None
    if meta.get("key_mode") in ("public", "none"):
        keys = tuple(sorted(str(v) for v in df.iloc[:, 0])) if meta.get("key_mode") == "public" else ()
    return ("ok", tuple(map(str, df.columns)), len(df) if keys is not None else None, keys)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_dp_functions_path_d_vs_d_minus(adb, attack_setup, case):
    cid, sql, pair, extra_delta = case
    d, d_minus = PAIRS[pair].tables
    o, o_minus = _outcome(adb, sql, d, extra_delta), _outcome(adb, sql, d_minus, extra_delta)
    assert o[0] != "error", f"[{cid}] accepted, charged, then failed at run time: {o}"
    assert o == o_minus, f"[{cid}] SIDE CHANNEL through the dp_* path: D {o} vs D′ {o_minus}"
    if cid == "null_key_k3":
        assert o[:3] == ("ok", ("r", "n"), 1), o  # the NULL group, released once


def test_corpus_has_the_cases():
    assert len(CASES) >= 10 and harness.DB
