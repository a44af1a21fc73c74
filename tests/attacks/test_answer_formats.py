"""An answer carries released values and nothing else (DESIGN.md invariant 11), in every output
format the gateway offers.

The query excludes unit 42 in its WHERE, so its released values are the same on D and D′ once the
noise is zero; the engine still READS unit 42's six rows on D, so anything about the engine's work
(statistics: rows_read, bytes_read, elapsed; rows_before_aggregation; rows_before_limit of an inner
LIMIT) differs between D and D′. The bodies must therefore be byte-identical on D and D′.

The pair here is the harness's k1 pair registered with bounds that keep every row (k = 4 regions,
M = 20 ≥ 10 rows per unit), so no salted choice of kept rows or groups differs between the two
registrations. Noise zero: ε = 1e5 for a count of sensitivity M = 20 gives discrete Laplace noise of
scale 2e-4, non-zero with probability below 2e^{-5000} per value: never, in any number of runs.
"""
from __future__ import annotations

import pytest

from dpch.controller import run_query_formatted
from dpch.gateway.formats import FORMATS

from . import harness

EPS = 1e5
QUERIES = [
    # public keys, ORDER BY and LIMIT: the LIMIT runs over released rows only
    "SELECT region, COUNT(*) AS n FROM {t} WHERE user_id != 42 GROUP BY region ORDER BY region LIMIT 3",
    # a global aggregate
    "SELECT COUNT(*) AS n FROM {t} WHERE user_id != 42",
]
# Binary container formats (Parquet, ORC, Arrow) are compared too: they write no timestamps.
ALL_FORMATS = sorted(set(FORMATS.values()) - {"Null"})


@pytest.fixture(scope="module")
def fmt_pair(adb):
    """(D, D′): copies of the k1 pair registered with bounds that keep every row."""
    names = []
    for src in harness.pair_tables("k1"):
        name = src + "_fmt"
        adb.command(f"DROP TABLE IF EXISTS {name}")
        adb.command(f"CREATE TABLE {name} AS {src}")
        adb.command(f"INSERT INTO {name} SELECT * FROM {src}")
        adb.catalog.register(name, privacy_unit="user_id", bounds=dict(harness.BOUNDS), max_groups_contributed=4,
                             max_rows_per_unit=20, public_keys={"region": harness.PUBLIC_REGIONS})
        adb.ledger.set_budget(adb.analyst, name, epsilon=1e7, delta=0.5)
        names.append(name)
    return tuple(names)


@pytest.mark.parametrize("fmt", ALL_FORMATS)
@pytest.mark.parametrize("query", QUERIES, ids=["grouped_limit", "global"])
def test_every_format_is_identical_on_neighbours(adb, fmt_pair, fmt, query):
    bodies = []
    for table in fmt_pair:
        sql = query.format(t=table)
        out = run_query_formatted(adb, sql, fmt, epsilon=EPS,
                                  format_settings={"output_format_json_quote_64bit_integers": "0"})
        bodies.append(out.body)
    assert bodies[0] == bodies[1], f"{fmt}: the rendered answers differ between D and D′"
    low = bodies[0].lower()
    for word in (b"statistics", b"rows_read", b"bytes_read", b"elapsed", b"rows_before_aggregation"):
        assert word not in low, f"{fmt} carries {word!r}"


def test_client_cannot_turn_statistics_back_on(adb):
    """The gateway refuses the setting (not in formats.OUTPUT_SETTINGS); even a caller that passes
    it gets it overridden (ANSWER_ONLY_SETTINGS come last)."""
    from dpch.gateway.formats import output_settings

    assert "output_format_write_statistics" not in output_settings({"output_format_write_statistics": "1"})
    full, _ = harness.pair_tables("k1")
    out = run_query_formatted(adb, f"SELECT COUNT(*) AS n FROM {full}", "JSON", epsilon=1.0,
                              format_settings={"output_format_write_statistics": "1",
                                               "rows_before_aggregation": "1"})
    assert b"statistics" not in out.body and b"rows_before_aggregation" not in out.body
