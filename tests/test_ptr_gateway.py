"""dpch.gateway.ptr: the request/response of `POST /dpch/ptr` (propose-test-release in the gateway).

What is checked: every malformed field is refused with a message naming it (nothing runs); a
well-formed request runs dpch.ptr on the analyst's connection and answers the branch, the value
and the charge; a request the run refuses (bad statistic, bound and rows_hint together) charges
nothing. Branches are certain as in tests/test_ptr.py (constant column of 3000 rows, a ⊥ has
probability < 1e-9 per run).
"""
from __future__ import annotations

import pytest

from dpch.connection import Connection
from dpch.errors import InvalidParameter
from dpch.gateway.errors import GatewayError
from dpch.gateway.ptr import parse_request, run_request

T = "ptr_gw.flat"
OK = {"statistic": "median", "dataset": T, "column": "x", "epsilon": 3.0, "delta": 1e-9, "bound": 1.0}


@pytest.fixture(scope="module")
def gdb(db):
    db.command("CREATE DATABASE IF NOT EXISTS ptr_gw")
    db.command(f"DROP TABLE IF EXISTS {T}")
    db.command(f"CREATE TABLE {T} (user_id UInt64, x Float64) ENGINE = MergeTree ORDER BY user_id")
    db.command(f"INSERT INTO {T} SELECT number, 40 FROM numbers(3000)")
    db.catalog.register(T, privacy_unit="user_id", bounds={"x": (0, 100)}, max_groups_contributed=1,
                        max_rows_per_unit=1)
    c = Connection(db.backend, analyst="gw_analyst", data_dir=db.data_dir, ledger_path=db.ledger_path)
    c._ledger = db.ledger
    c.ledger.set_budget("gw_analyst", T, epsilon=100.0, delta=1e-3, accountant="odp")
    return c


@pytest.mark.parametrize("change,needle", [
    ({"statistic": 3}, "statistic"), ({"dataset": ""}, "dataset"), ({"column": None}, "column"),
    ({"epsilon": "1"}, "epsilon"), ({"delta": float("inf")}, "delta"), ({"bound": True}, "bound"),
    ({"rows_hint": 2.5}, "rows_hint"), ({"where": 1}, "where"), ({"nosuch": 1}, "nosuch"),
    ({"max_rows_per_unit": "2"}, "max_rows_per_unit")])
def test_malformed_requests_are_refused(change, needle):
    body = {**OK, **change}
    if change.get("column", "") is None:
        del body["column"]
    with pytest.raises(GatewayError) as info:
        parse_request(body)
    assert needle in str(info.value)
    with pytest.raises(GatewayError, match="JSON object"):
        parse_request([OK])
    with pytest.raises(GatewayError, match="epsilon is required"):
        parse_request({k: v for k, v in OK.items() if k != "epsilon"})


def test_request_runs_and_settles(gdb):
    out = run_request(gdb, parse_request(OK))
    assert out["branch"] == "released" and abs(out["value"] - 40.0) < 30.0  # noise scale ≈ 0.67
    assert out["epsilon_charged"] == pytest.approx(3.0) and out["epsilon_reserved"] == pytest.approx(3.0)
    (rec,) = [r for r in gdb.ledger.history("gw_analyst", T) if r.id == out["receipt"]]
    assert rec.outcome == "settled"


@pytest.mark.parametrize("change", [{"statistic": "mode"}, {"rows_hint": 10}])
def test_refused_run_charges_nothing(gdb, change):
    before = len(gdb.ledger.history("gw_analyst", T))
    with pytest.raises(InvalidParameter):
        run_request(gdb, parse_request({**OK, **change}))
    assert len(gdb.ledger.history("gw_analyst", T)) == before
