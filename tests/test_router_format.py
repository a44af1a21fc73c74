"""The gateway's trailing ``FORMAT name`` split (dpch.gateway.router.split_trailing_format): the
same answer as ClickHouse-style ``\\s+FORMAT\\s+name\\s*;?\\s*$`` (the regex it replaced, kept here as
the reference), without the regex's quadratic rescans of whitespace runs (issue 27)."""
from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from dpch.gateway.router import split_trailing_format

REFERENCE = re.compile(r"(?is)\s+FORMAT\s+([A-Za-z0-9_]+)\s*;?\s*$")
PIECES = st.sampled_from(["SELECT", "1", "FORMAT", "format", "JSON", "CSV", "x", ";", " ", "\n", "\t", "\u2003",
                          "FORMAT;", "é", "(", ")"])


def _reference(sql: str):
    m = REFERENCE.search(sql)
    return (sql[:m.start()], m.group(1)) if m else (sql, None)


@settings(max_examples=3000, deadline=None, derandomize=True)
@given(st.lists(PIECES, max_size=10).map("".join))
def test_same_split_as_the_reference_regex(sql):
    assert split_trailing_format(sql) == _reference(sql)


def test_long_whitespace_runs_are_split_correctly():
    sql = "SELECT 1" + " " * 300_000 + "FORMAT JSON ;" + "\n" * 1000
    assert split_trailing_format(sql) == ("SELECT 1", "JSON")
    assert split_trailing_format("SELECT 1" + " " * 300_000 + "x") == ("SELECT 1" + " " * 300_000 + "x", None)
