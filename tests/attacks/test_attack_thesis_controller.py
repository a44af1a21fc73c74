"""Attack cases for the thesis mechanisms in the controller (issue 16): ``mechanism="bounded_laplace"``
and ``mechanism="mixed"`` on the attack corpus's neighbouring tables (harness.py: D and D′ = D
without privacy unit 42, whose values no other unit has and lie far outside the declared bounds).

What must not differ between D and D′: whether the query is answered or refused, the error text,
the columns, the released keys (public here), the explain text and the metadata's public facts
(mechanism, scale, ranges, guarantee). No error may contain a secret of unit 42. For bounded
Laplace every released value lies in its public range, on both sides, in every run (a hard
property of the mechanism, not a statistical one: no threshold needed).
"""
from __future__ import annotations

import pytest

from . import harness
from .harness import PAIRS, run

EPS, DELTA = 1.0, 1e-6
R = 2  # runs per side per case

# (pair, SQL, options, {column: (lo, hi)} the released values must lie in)
ANSWERED = [
    ("k1", "SELECT region, COUNT(*) AS n, SUM(amount) AS s FROM {t} GROUP BY region",
     dict(mechanism="bounded_laplace", output_range=(0, 5000)), {"n": (0, 5000), "s": (0, 5000)}),
    ("k1", "SELECT region, AVG(amount) AS a FROM {t} GROUP BY region",
     dict(mechanism="bounded_laplace"), {"a": (0, 1000)}),
    ("k3", "SELECT region, AVG(qty) AS a, COUNT(*) AS n FROM {t} GROUP BY region",
     dict(mechanism="bounded_laplace", output_range={"n": (10, 60)}), {"a": (-100, 100), "n": (10, 60)}),
    ("nu1", "SELECT AVG(amount) AS a, SUM(amount) AS s FROM {t}",
     dict(mechanism="bounded_laplace", output_range={"s": (-10, 10)}), {"a": (0, 1000), "s": (-10, 10)}),
    ("k1", "SELECT region, COUNT(*) AS n, SUM(amount) AS s, AVG(amount) AS a FROM {t} GROUP BY region",
     dict(mechanism="mixed"), {}),
    ("k3", "SELECT region, SUM(qty) AS s FROM {t} GROUP BY region",
     dict(mechanism="mixed", mixed_rule="variance"), {}),
]

REFUSED = [
    ("k1", "SELECT region, COUNT(*) AS n FROM {t} GROUP BY region", dict(mechanism="bounded_laplace"), DELTA),
    ("k1", "SELECT STDDEV_POP(amount) AS v FROM {t}", dict(mechanism="bounded_laplace"), DELTA),
    ("k3", "SELECT region, AVG(amount) AS a FROM {t} GROUP BY region", dict(mechanism="bounded_laplace"), 0.0),
    ("k1", "SELECT SUM(amount) AS s FROM {t}", dict(mechanism="mixed"), 0.0),
    ("k1", "SELECT name, COUNT(*) AS n FROM {t} GROUP BY name",
     dict(mechanism="bounded_laplace", output_range={"m": (0, 1)}), DELTA),
]


def _explain_text(adb, sql: str, opts: dict) -> str:
    """The explain text without the controller's own timing line (the one line that may differ)."""
    text = harness.normalise(str(adb.explain(sql, epsilon=EPS, delta=DELTA, **opts)))
    return "\n".join(line for line in text.splitlines() if not line.startswith("controller time:"))


def _public_facts(outcome) -> dict:
    """The metadata that depends on public parameters only (no released value, no receipt)."""
    cols = outcome.df.attrs["dpch"]["columns"]
    keep = ("mechanism", "noise_scale", "thesis_mechanism", "epsilon", "delta", "ci_kind", "components")
    return {c: {k: v for k, v in info.items() if k in keep} for c, info in cols.items()}


@pytest.mark.parametrize("pair,sql,opts,ranges", ANSWERED)
def test_answered_alike_and_in_range(adb, pair, sql, opts, ranges):
    d, dm = PAIRS[pair].tables
    explains = [_explain_text(adb, sql.format(t=t), opts) for t in (d, dm)]
    assert explains[0] == explains[1]
    for _ in range(R):
        o_d = run(adb, sql, d, epsilon=EPS, delta=DELTA, **opts)
        o_m = run(adb, sql, dm, epsilon=EPS, delta=DELTA, **opts)
        for o in (o_d, o_m):
            assert o.status == "ok" and o.charged, o.short()
            for col, (lo, hi) in ranges.items():
                v = o.df[col].astype(float)
                assert ((v >= lo) & (v <= hi)).all(), (col, list(v))
        assert o_d.comparable(True) == o_m.comparable(True), f"SIDE CHANNEL\n  D : {o_d.short()}\n  D′: {o_m.short()}"
        assert _public_facts(o_d) == _public_facts(o_m)


@pytest.mark.parametrize("pair,sql,opts,delta", REFUSED)
def test_refused_alike_without_secrets(adb, pair, sql, opts, delta):
    d, dm = PAIRS[pair].tables
    o_d = run(adb, sql, d, epsilon=EPS, delta=delta, **opts)
    o_m = run(adb, sql, dm, epsilon=EPS, delta=delta, **opts)
    for o in (o_d, o_m):
        assert o.status == "rejected" and not o.charged, o.short()
        assert not harness.leaked_secrets(o.raw_message), o.raw_message
    assert o_d.comparable(True) == o_m.comparable(True), f"SIDE CHANNEL\n  D : {o_d.short()}\n  D′: {o_m.short()}"
