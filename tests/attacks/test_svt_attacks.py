"""Attack cases for sparse-vector sessions (dpch.svt): the same session on D and on D′ = D without
privacy unit 42 (harness.py), whose values no other unit has and that partial functions choke on.

What may differ between D and D′ is only what the mechanism released: the ⊤/⊥ answers, and so the
settled ε (a function of the answers). What must be identical: which queries are accepted and
which are refused (and the error text, with the table name normalised), how many queries ran, the
session's calibration (Δ, grid, b1, b2), and the charge (reserved ε, summary, one charge). No
message may contain a secret of unit 42. max_positives is the number of queries, so the session
never stops early (stopping is a function of the answers, released by the mechanism).
A session refused at open (over budget) charges nothing on either side; its message names the
remaining budget, which reflects earlier settlements (functions of released answers), so its
numbers are masked in the comparison.
"""
from __future__ import annotations

import re

import pytest

from dpch.errors import DPCHError

from . import harness
from .harness import PAIRS

QUERIES = [
    "SELECT COUNT(*) FROM {t} WHERE region = 'EU'",
    "SELECT SUM(amount) FROM {t}",  # rejected: grid finer than the first query's
    "SELECT COUNT(*) FROM {t} WHERE toInt64(name) > 1500",  # unit 42's name is no number
    "SELECT COUNT(*) FROM {t} WHERE dateDiff(unit_s, day, toDate('2030-01-01')) > 100",  # rejected: unit column
    "SELECT COUNT(*) FROM {t} WHERE match(name, 'abc') OR toYear(day) > 2050",
    "SELECT COUNT(DISTINCT user_id) FROM {t} WHERE qty > 50",
    "SELECT region, COUNT(*) FROM {t} GROUP BY region",  # rejected: GROUP BY
    "SELECT COUNT(*) FROM {t} WHERE nregion IS NULL",
    "SELECT COUNT(*) / 2 FROM {t}",  # rejected: an expression of the aggregate
    "SELECT COUNT(*) FROM {t} WHERE length(name) > 8",
]


def _session(adb, table: str, eps: float) -> dict:
    outcomes = []
    with adb.sparse_vector(table, threshold=500, epsilon=eps, max_positives=len(QUERIES)) as svt:
        for sql in QUERIES:
            try:
                svt.above(sql.format(t=table))
                outcomes.append(("ok",))
            except DPCHError as exc:
                outcomes.append((type(exc).__name__, harness.normalise(str(exc))))
                assert not harness.leaked_secrets(str(exc)), str(exc)
        k = svt.calibration
    (rec,) = [r for r in adb.ledger.history(adb.analyst, table) if r.id == svt.receipt.id]
    return {"outcomes": outcomes, "queries_run": svt.queries_run, "answers": len(svt.answers),
            "calibration": (k.sensitivity_units, k.grid, k.b1, k.b2, k.tau1, k.tau2),
            "charge": (rec.epsilon, rec.delta, rec.summary, rec.outcome), "spent": svt.epsilon_spent,
            "describe": harness.normalise(svt.describe().split("\nstate:")[0])}


@pytest.mark.parametrize("eps", [1.0, 1e-3])
def test_svt_session_same_observables_on_neighbours(adb, eps):
    full, minus = PAIRS["k1"].tables
    a, b = _session(adb, full, eps), _session(adb, minus, eps)
    assert a["outcomes"] == b["outcomes"]
    assert [o[0] for o in a["outcomes"]].count("ok") == 6  # the four rejections are static (the SQL, the plan)
    for key in ("queries_run", "answers", "calibration", "charge", "describe"):
        assert a[key] == b[key], key
    assert a["charge"][3] == "settled" and a["queries_run"] == 6


def test_svt_nothing_charged_when_refused_on_neighbours(adb):
    full, minus = PAIRS["k1"].tables
    seen = []
    for table in (full, minus):
        before = harness.charge_count(adb, table)
        svt = adb.sparse_vector(table, threshold=1, epsilon=1e7, max_positives=1)  # over the 1e6 budget
        try:
            with svt:
                pass
        except DPCHError as exc:
            # the remaining budget in the text reflects earlier settlements (functions of released
            # answers, so it may differ): numbers masked
            seen.append((type(exc).__name__, re.sub(r"\d[\d.e+-]*", "#", harness.normalise(str(exc)))))
        assert harness.charge_count(adb, table) == before
    assert len(seen) == 2 and seen[0] == seen[1]
