"""Fixed cases of the generative join test (tests/attacks/test_join_generative.py): the causes of
issue 26 written as scenarios of tests/attacks/gen_joins.py, and every failing case the generator
has found, shrunk by hand. Each runs the same checks (declared L1/L2 and k on D/D′ without noise,
the same outcome on D and D′, nothing charged for a failure)."""
from __future__ import annotations

from collections import Counter

import pytest

from . import gen_joins as g
from .test_join_generative import run_scenario

INT = g.ColType("int", "UInt64")
E = g.EXTREME


def schema(**kw) -> g.Schema:
    base = dict(ck=INT, ock=INT, rck=INT, pk=INT, ok=INT, lok=INT, vtypes=("Float64",) * 4, cg_public=True,
                bounds=((1, 1), (1, 4), (1, 4), (1, 10)), engine="Memory")
    return g.Schema(**{**base, **kw})


def data(cust, ord_=(), li=(), ret=(), pub=(), dup=(), target=None) -> g.Data:
    return g.Data([tuple(c) for c in cust], [tuple(o) for o in ord_], [tuple(r) for r in ret],
                  [tuple(x) for x in li], [tuple(p) for p in pub], [tuple(d) for d in dup], target)


def q(sql: str, delta: float = 0.0, **options) -> g.Query:
    return g.Query(sql, delta, tuple(options.items()))


# issue 26, cause 1: customers without orders take the LEFT JOIN miss's default key 0, owned by
# unit 9's order 0 (20 lineitems)
_LEFT_MISS = data(cust=[(i, 10, "a", 0) for i in range(1, 11)] + [(9 + 100, 10, "b", 1)],
                  ord_=[(0, 109, 5, "x")], li=[(0, 5, "p")] * 20, target=109)
# cause 2: a Decimal(18, 0) key of 10^17 against a Decimal(18, 2) reference (the common type overflows)
_DEC = g.ColType("dec", "Decimal(18, 0)")
_DEC2 = g.ColType("dec", "Decimal(18, 2)")
_DT3 = g.ColType("dt", "DateTime64(3, 'UTC')")
_DT9 = g.ColType("dt", "DateTime64(9, 'UTC')")

CASES = [
    pytest.param(schema(), _LEFT_MISS,
                 q("SELECT COUNT(*) AS a0 FROM {db}.cust c LEFT JOIN {db}.ord o ON c.ck = o.ock "
                   "JOIN {db}.li l ON o.ok = l.lok"), id="left-miss-then-reference"),
    pytest.param(schema(), _LEFT_MISS,
                 q("SELECT COUNT(*) AS a0 FROM {db}.cust c LEFT JOIN {db}.ord o ON c.ck = o.ock "
                   "WHERE o.ok IN (SELECT lok FROM {db}.li)"), id="left-miss-then-semi-join"),
    pytest.param(schema(), _LEFT_MISS,
                 q("SELECT COUNT(*) AS a0 FROM (SELECT o.ock AS u, COUNT(*) AS cnt FROM {db}.cust c "
                   "LEFT JOIN {db}.ord o ON c.ck = o.ock GROUP BY o.ock) t"), id="left-miss-as-per-unit-output"),
    pytest.param(schema(ck=_DEC, ock=_DEC2, rck=_DEC, pk=_DEC),
                 data(cust=[(1, 5, "a", 0), (2, 5, "a", 0), (E, 5, "b", 0)], ord_=[(1, 1, 5, "x"), (2, 2, 5, "x")],
                      target=E),
                 q("SELECT COUNT(*) AS a0 FROM {db}.cust c JOIN {db}.ord o ON c.ck = o.ock"),
                 id="decimal-key-overflow"),
    pytest.param(schema(ck=_DT3, ock=_DT9, rck=_DT3, pk=_DT3),
                 data(cust=[(1, 5, "a", 0), (2, 5, "a", 0), (E, 5, "b", 0)], ord_=[(1, 1, 5, "x"), (2, 2, 5, "x")],
                      target=E),
                 q("SELECT COUNT(*) AS a0 FROM {db}.ord"), id="datetime64-chain-overflow"),
    pytest.param(schema(ck=_DT9, ock=_DT3, rck=_DT9, pk=_DT9),
                 data(cust=[(1, 5, "a", 0), (2, 5, "a", 0)], ord_=[(1, 1, 5, "x"), (2, 2, 5, "x"), (3, E, 5, "x")],
                      li=[(1, 5, "p"), (3, 5, "p")], target=1),
                 q("SELECT COUNT(*) AS a0 FROM {db}.li"), id="datetime64-orphan-in-chain"),
    pytest.param(schema(ck=_DEC2, ock=_DEC, rck=_DEC2, pk=_DEC2),
                 data(cust=[(1, 5, "a", 0), (2, 5, "a", 0)], ord_=[(1, 1, 5, "x"), (2, 2, 5, "x"), (3, E, 5, "x")],
                      li=[(1, 5, "p"), (3, 5, "p")], target=1),
                 q("SELECT COUNT(*) AS a0 FROM {db}.li"), id="decimal-orphan-in-chain"),
    pytest.param(schema(),
                 data(cust=[(i, 10, "a", 0) for i in range(1, 11)] + [(0, 10, "b", 1)],
                      ord_=[(1, 0, 5, "x"), (2, 0, 5, "x"), (3, 0, 5, "x")], target=0),
                 q("SELECT t.cnt AS g0, COUNT(*) AS a0 FROM (SELECT o.ock AS u, COUNT(*) AS cnt FROM {db}.cust c "
                   "LEFT JOIN {db}.ord o ON c.ck = o.ock GROUP BY o.ock) t GROUP BY g0", 1e-6),
                 id="left-miss-merges-into-unit-0"),
    pytest.param(schema(),
                 data(cust=[(i, 5, "a", 0) for i in range(1, 21)] + [(30, 5, "a", 0)],
                      ord_=[(100, 30, 5, "x")], li=[(100, 5, "p")] * 10,
                      dup=[(100, i, 5, "y") for i in range(1, 21)], target=30),
                 q("SELECT COUNT(*) AS a0 FROM {db}.li l JOIN {db}.ord o ON o.ok = l.lok"),
                 id="duplicated-referenced-key"),
    pytest.param(schema(vtypes=("Float64", "Float64", "Float64", "Decimal(18, 2)")),
                 data(cust=[(1, 5, "a", 0), (2, 5, "a", 0)], ord_=[(1, 1, 5, "x"), (2, 2, 5, "x")],
                      li=[(1, 5, "p"), (1, 5, "p"), (2, 5, "p"), (2, 5, "p")], target=2),
                 q("SELECT COUNT(*) AS a0 FROM {db}.ord o WHERE o.ok IN (SELECT lok FROM {db}.li GROUP BY lok "
                   "HAVING MAX(lv) / (COUNT(*) - 2) > 1)"), id="having-decimal-max-division"),
]


# Found by the generator (make fuzz, run 4): an order key of the removed unit 1 duplicated after
# registration by an order of unit 2, in its own MergeTree part. The reference chain of li
# (``ANY`` join on ord.ok) attributes unit 1's lineitems of order 10 to unit 2, so removing unit 1
# (with every row reached from it) moved unit 2's contribution too: two groups moved at k = 1
# (un-noised distinct units per group: D {p: 1, q: 1}, D′ {}; declared L1 = k = 1). Fixed in b7aa423
# (reference chains read only keys that occur once).
_DUP_MOVES = data(cust=[(1, 5, "a", 0), (2, 5, "a", 0)], ord_=[(10, 1, 5, "x"), (11, 1, 5, "x")],
                  li=[(10, 5, "p")] * 3 + [(11, 5, "q")] * 3, dup=[(10, 2, 5, "y")], target=1)
# Which order ANY picked varied from one execution to the next (measured before the fix: the
# duplicate in 19 of 20 runs), so these cases run REPEAT times: a defect is missed with
# probability about 0.05^5 < 1e-6.
FOUND = [
    pytest.param(schema(engine="MergeTree"), _DUP_MOVES,
                 q("SELECT l.lg AS g0, COUNT(*) AS a0 FROM {db}.li l GROUP BY g0", 1e-6),
                 id="dup-key-chain-moves-rows"),
    pytest.param(schema(engine="MergeTree"), _DUP_MOVES,
                 q("SELECT o.og AS g0, COUNT(*) AS a0 FROM {db}.li l JOIN {db}.ord o ON o.ok = l.lok "
                   "GROUP BY g0", 1e-6),
                 id="dup-key-join-moves-rows"),
]
REPEAT = 5


@pytest.mark.parametrize("sch,dat,query", CASES)
def test_join_case(db, sch, dat, query):
    stats = Counter()
    run_scenario(db, g.Scenario(sch, dat, (query,)), stats, None)
    assert stats["scenarios"] == 1 and stats["schemas refused"] == 0, stats


@pytest.mark.parametrize("sch,dat,query", FOUND)
def test_found_case(db, sch, dat, query):
    stats = Counter()
    for _ in range(REPEAT):
        run_scenario(db, g.Scenario(sch, dat, (query,)), stats, None)
    assert stats["scenarios"] == REPEAT and stats["schemas refused"] == 0, stats
