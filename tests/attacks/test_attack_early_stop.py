"""Attack cases for early stopping (dpch.early_stop, ``db.refine``): the same refinement on D and on
D′ = D without privacy unit 42 (harness.py), whose values make partial functions fail.

The target is an absolute half-width, which is data-independent, so the number of steps is the
same on both sides; what may differ is only the released measurements (and the estimate). What
must be identical: acceptance or refusal (error class and normalised text), the reservation
(ε = k_n·ε_step, its summary), the steps run, the settled ε (Lemma 11's cell), one charge (or none
when refused). No message may contain a secret of unit 42.
"""
from __future__ import annotations

import pytest

from dpch.errors import DPCHError

from . import harness
from .harness import PAIRS

QUERIES = [
    "SELECT COUNT(*) FROM {t} WHERE region = 'EU'",
    "SELECT SUM(amount) FROM {t}",
    "SELECT COUNT(*) FROM {t} WHERE toInt64(name) > 1500",  # unit 42's name is no number
    "SELECT COUNT(*) FROM {t} WHERE match(name, 'abc') OR toYear(day) > 2050",
    "SELECT SUM(qty) FROM {t} WHERE nregion IS NULL",
    "SELECT COUNT(DISTINCT user_id) FROM {t} WHERE big > 100",
    "SELECT region, COUNT(*) FROM {t} GROUP BY region",  # refused: GROUP BY
    "SELECT AVG(amount) FROM {t}",  # refused: not a COUNT or SUM
    "SELECT COUNT(*) FROM {t} WHERE dateDiff(unit_s, day, toDate('2030-01-01')) > 100",
]


def _refine(db, table, sql):
    before = harness.charge_count(db, table)
    try:
        r = db.refine(sql.format(t=table), epsilon_per_step=0.25, max_steps=4, target_halfwidth=1e-9)
    except DPCHError as exc:
        assert not harness.leaked_secrets(str(exc)), str(exc)
        return ("refused", type(exc).__name__, harness.normalise(str(exc)), harness.charge_count(db, table) - before)
    (rec,) = [c for c in db.ledger.history(db.analyst, table) if c.id == r.receipt.id]
    return ("ok", r.steps, r.stopped_by, r.epsilon_reserved, r.epsilon_charged, rec.epsilon, rec.summary,
            rec.outcome, rec.effective_epsilon, harness.charge_count(db, table) - before)


@pytest.mark.parametrize("pair", ["k1", "k3"])
@pytest.mark.parametrize("sql", QUERIES)
def test_same_outcome_on_neighbours(adb, pair, sql):
    d, dp = PAIRS[pair].tables
    a, b = _refine(adb, d, sql), _refine(adb, dp, sql)
    assert a == b
    if a[0] == "ok":
        assert a[1] == 4 and a[-1] == 1 and a[7] == "settled"
    else:
        assert a[-1] == 0
    # the one-COUNT/SUM queries are answered (refusing everything would pass vacuously)
    assert (a[0] == "ok") == ("GROUP BY" not in sql and "AVG" not in sql and "dateDiff" not in sql), a
