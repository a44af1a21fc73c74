"""Results read well: CI columns as ordinary columns when asked, a flat documented df.attrs next to
the nested df.attrs["dpch"], and `dpch query` printing the table plus a one-line spend summary."""
from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout

import pytest

from dpch.postprocess import FLAT_KEYS, spend_summary
from test_controller_fixtures import ANALYST, DB, setup_controller_data


@pytest.fixture(scope="module")
def adb(db):
    setup_controller_data(db)
    return db


SQL = f"SELECT region, COUNT(*) AS n, AVG(age) AS a FROM {DB}.purchases GROUP BY region"


def test_flat_attrs_match_nested_metadata(adb):
    df = adb.query(SQL, epsilon=1.0)
    a = df.attrs
    assert set(FLAT_KEYS) <= set(a)
    nested = a["dpch"]  # still there for existing readers
    assert a["epsilon_spent"] == pytest.approx(1.0) == pytest.approx(nested["epsilon"])
    assert a["delta_spent"] == nested["delta"] == 0.0
    assert a["dataset"] == f"{DB}.purchases" and a["receipt"] == nested["receipt"]
    assert a["mechanism"] == {"n": "laplace", "a": "laplace"}
    assert a["noise_scale"]["n"] == nested["columns"]["n"]["noise_scale"]
    assert set(a["noise_scale"]["a"]) == {"count", "sum"}  # AVG: one scale per component
    assert a["ci_level"] == 0.95
    assert len(a["ci_low"]["n"]) == len(df) and all(lo <= hi for lo, hi in zip(a["ci_low"]["n"], a["ci_high"]["n"]))
    line = spend_summary(df)
    assert line.startswith(f"DP answer on {DB}.purchases: spent ε = 1 (receipt ")
    assert "n: laplace" in line


def test_ci_columns_are_ordinary_columns(adb):
    df = adb.query(SQL, epsilon=1.0, with_ci=True)
    assert list(df.columns) == ["region", "n", "n_lo", "n_hi", "a", "a_lo", "a_hi"]
    assert (df["n_lo"] <= df["n"]).all() and (df["n"] <= df["n_hi"]).all()
    assert list(df["n_lo"]) == df.attrs["ci_low"]["n"]


def test_cli_query_prints_table_and_summary(adb):
    from dpch.cli import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["query", SQL, "--epsilon", "0.5", "--data-dir", str(adb.data_dir), "--analyst", ANALYST,
                     "--ledger", str(adb.ledger_path)])
    assert code == 0
    lines = out.getvalue().strip().splitlines()
    assert lines[0].split() == ["region", "n", "a"]
    assert lines[-1].startswith(f"DP answer on {DB}.purchases: spent ε = 0.5 (receipt ")
    assert "intervals: add --ci" in lines[-1]
    assert "attrs" not in out.getvalue() + err.getvalue()
    assert f"budget of {ANALYST} on {DB}.purchases: remaining ε = " in err.getvalue()
