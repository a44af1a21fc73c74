"""The accepted/rejected query corpus (tests/corpus/). Every accepted query plans, runs and is
charged; every rejected query raises with the expected text, executes nothing and charges nothing."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from dpch.catalog import TABLE_NAMES_SQL
from dpch.errors import InvalidParameter, QueryRejected
from test_controller_fixtures import ANALYST, DB, setup_controller_data

CORPUS = Path(__file__).parent / "corpus"


def _accepted():
    out = []
    for line in (CORPUS / "accepted.sql").read_text().splitlines():
        if not line.strip() or line.startswith("--"):
            continue
        sql, _, opt = line.partition(" -- ")
        delta = 0.0 if opt.strip() == "delta=0" else 1e-6
        out.append(pytest.param(sql.strip(), delta, id=sql.strip()[:70]))
    return out


def _rejected():
    out = []
    for line in (CORPUS / "rejected.tsv").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split("\t")
        expected, sql = parts[0], parts[1]
        delta = 0.0 if len(parts) > 2 and parts[2] == "delta=0" else 1e-6
        out.append(pytest.param(expected, sql, delta, id=sql[:70]))
    return out


ACCEPTED = _accepted()
REJECTED = _rejected()


def test_corpus_sizes():
    assert len(ACCEPTED) >= 50
    assert len(REJECTED) >= 50


@pytest.fixture(scope="module")
def cdb(db):
    setup_controller_data(db)
    return db


class _Recorder:
    """Records every statement sent to the engine (to prove rejected queries run nothing)."""

    def __init__(self, backend):
        self.backend = backend
        self.calls: list[str] = []

    def install(self, monkeypatch):
        for name in ("query_df", "command", "insert_df"):
            orig = getattr(self.backend, name)

            def wrapper(*args, _orig=orig, **kwargs):
                self.calls.append(str(args[0]) if args else "")
                return _orig(*args, **kwargs)

            monkeypatch.setattr(self.backend, name, wrapper)


def _charges(db) -> int:
    return len(db.ledger.history(ANALYST))


@pytest.mark.parametrize("sql,delta", ACCEPTED)
def test_accepted(cdb, sql, delta):
    before = _charges(cdb)
    df = cdb.query(sql, epsilon=1.0, delta=delta)
    assert _charges(cdb) == before + 1
    meta = df.attrs["dpch"]
    assert list(df.columns) == list(meta["columns"])
    assert meta["epsilon"] <= 1.0 + 1e-9
    assert meta["delta"] <= delta + 1e-15
    for name, info in meta["columns"].items():
        if info["kind"] == "aggregate" and info.get("rank_ci") is not None:
            # a quantile (MIN/MAX are levels 0/1): a rank interval, no value interval (docs/CONTROLLER.md)
            assert info["ci_low"] is None and "rank_ci" in info["ci_note"]
        elif info["kind"] == "aggregate":
            assert len(info["ci_low"]) == len(df)
            assert all(lo <= hi for lo, hi in zip(info["ci_low"], info["ci_high"]))
            assert set(info["mechanism"].split("+")) <= {"laplace", "gaussian", "exponential", "optimal_selection"}
    if "GROUP BY" not in sql:
        assert len(df) == 1


@pytest.mark.parametrize("expected,sql,delta", REJECTED)
def test_rejected(cdb, monkeypatch, expected, sql, delta):
    cdb.catalog.list()  # warm the catalog cache: a rejection must not need the engine at all
    before = _charges(cdb)
    rec = _Recorder(cdb.backend)
    rec.install(monkeypatch)
    with pytest.raises(QueryRejected) as info:
        cdb.query(sql, epsilon=1.0, delta=delta)
    msg = str(info.value)
    assert expected.lower() in msg.lower(), msg
    # nothing but the constant table-name list ("does not exist", "did you mean"; no analyst text, no rows)
    assert [c for c in rec.calls if c != TABLE_NAMES_SQL] == [], "a rejected query must not touch the engine"
    monkeypatch.undo()
    assert _charges(cdb) == before, "a rejected query must not be charged"
    # explain rejects identically
    with pytest.raises(QueryRejected):
        cdb.explain(sql, epsilon=1.0, delta=delta)


@pytest.mark.parametrize("epsilon,delta,expected", [
    (0, 0, "epsilon"), (-1, 0, "epsilon"), (math.inf, 0, "epsilon"), (math.nan, 0, "epsilon"),
    ("1", 0, "epsilon"), (True, 0, "epsilon"), (1, -1e-9, "delta"), (1, 1, "delta"), (1, 1.5, "delta"),
    (1, math.nan, "delta"), (1, math.inf, "delta"), (1, "0", "delta"),
])
def test_rejected_budget_parameters(cdb, epsilon, delta, expected):
    before = _charges(cdb)
    with pytest.raises(InvalidParameter) as info:
        cdb.query(f"SELECT COUNT(*) FROM {DB}.purchases", epsilon=epsilon, delta=delta)
    assert expected in str(info.value)
    assert _charges(cdb) == before


def test_rejected_options(cdb):
    before = _charges(cdb)
    with pytest.raises(InvalidParameter, match="unknown option"):
        cdb.query(f"SELECT COUNT(*) FROM {DB}.purchases", epsilon=1, noise=False)
    with pytest.raises(InvalidParameter, match="mechanism"):
        cdb.query(f"SELECT COUNT(*) FROM {DB}.purchases", epsilon=1, mechanism="exponential")
    with pytest.raises(InvalidParameter, match="needs delta"):
        cdb.query(f"SELECT COUNT(*) FROM {DB}.purchases", epsilon=1, mechanism="gaussian")
    with pytest.raises(InvalidParameter, match="weights"):
        cdb.query(f"SELECT COUNT(*) AS n FROM {DB}.purchases", epsilon=1, weights={"nope": 1})
    assert _charges(cdb) == before
