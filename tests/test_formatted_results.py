"""The engine-rendered answer path (controller.run_query_formatted, used by the gateway): the query
that computes the released values renders them in a ClickHouse output format, with the same charge
and the same checks as run_query; no internal noisy column leaves; CI columns are refused there."""
from __future__ import annotations

import io
import json

import pandas as pd
import pytest

from dpch.controller import run_query_formatted
from dpch.errors import InvalidParameter, QueryRejected
from dpch.users import UserStore
from test_controller_fixtures import ANALYST, DB, setup_controller_data


@pytest.fixture(scope="module")
def fdb(db):
    setup_controller_data(db)
    return db


SQL = f"SELECT region, COUNT(*) AS n, AVG(age) AS a FROM {DB}.purchases GROUP BY region ORDER BY region DESC"


def _charges(db):
    return db.ledger.history(ANALYST, f"{DB}.purchases")


def test_formatted_matches_dataframe_path_and_charges_the_same(fdb):
    before = len(_charges(fdb))
    df = fdb.query(SQL, epsilon=1.0)
    out = run_query_formatted(fdb, SQL, "CSVWithNames", epsilon=1.0)
    got = pd.read_csv(io.BytesIO(out.body))
    assert list(got.columns) == list(df.columns) == ["region", "n", "a"]  # no __dp_* column
    assert out.rows == len(got) == len(df)
    assert list(got["region"]) == sorted(got["region"], reverse=True)  # ORDER BY applied by the engine
    assert set(got["region"]) == set(df["region"])
    charges = _charges(fdb)
    assert len(charges) == before + 2
    assert charges[-1].epsilon == pytest.approx(charges[-2].epsilon) == pytest.approx(1.0)
    assert charges[-1].outcome == "executed"
    assert (out.epsilon, out.delta, out.dataset) == (pytest.approx(1.0), 0.0, f"{DB}.purchases")
    assert out.receipt == charges[-1].id


def test_formatted_json_types_are_the_engines(fdb):
    out = run_query_formatted(fdb, SQL, "JSON", epsilon=1.0)
    doc = json.loads(out.body)
    assert [m["name"] for m in doc["meta"]] == ["region", "n", "a"]
    assert doc["rows"] == out.rows == len(doc["data"])


def test_formatted_refuses_ci_columns_and_bad_queries_without_charging(fdb):
    before = len(_charges(fdb))
    with pytest.raises(InvalidParameter, match="CI columns"):
        run_query_formatted(fdb, SQL, "CSV", epsilon=1.0, with_ci=True)
    with pytest.raises(QueryRejected):
        run_query_formatted(fdb, f"SELECT region FROM {DB}.purchases", "CSV", epsilon=1.0)
    assert len(_charges(fdb)) == before


def test_verified_before_only_for_the_exact_correct_password(tmp_path):
    store = UserStore(tmp_path)
    store.add("ana", "correct horse")
    assert not store.verified_before("ana", "correct horse")  # nothing verified yet
    assert store.verify("ana", "correct horse")
    assert store.verified_before("ana", "correct horse")
    assert not store.verified_before("ana", "correct horsf")
    assert not store.verified_before("bob", "correct horse")
    store.add("ana", "another password", replace=True)  # a new hash invalidates the cache
    assert not store.verified_before("ana", "correct horse")
    assert not store.verify("ana", "correct horse")
