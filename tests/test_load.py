"""Loading one's own data (dpch.load, `db.load`, `dpch load`): DataFrames, Arrow tables, CSV and
Parquet files and globs, schema inference by ClickHouse, a non-Nullable ORDER BY, clear errors, a
progress bar, the fixed `insert_df`, and a first DP answer on a loaded CSV."""
from __future__ import annotations

import os
import subprocess
import sys

import pandas as pd
import pyarrow as pa
import pytest

from dpch.errors import InvalidParameter
from dpch.load import LoadError

DB = "t_load"


@pytest.fixture(scope="module")
def ldb(db):
    db.command(f"CREATE DATABASE IF NOT EXISTS {DB}")
    return db


def _csv(path, rows):
    path.write_text("user_id,region,amount\n" + "".join(f"{u},{r},{a}\n" for u, r, a in rows))
    return path


def test_csv_schema_inferred_and_order_by_not_nullable(ldb, tmp_path):
    f = _csv(tmp_path / "p.csv", [(1, "north", 3.5), (2, "south", ""), (3, "", 7)])
    res = ldb.load(f"{DB}.csv1", f, order_by="user_id")
    assert res.rows == 3 and res.order_by == ("user_id",)
    assert res.columns == {"user_id": "Int64", "region": "Nullable(String)", "amount": "Nullable(Float64)"}
    assert "3 rows" in str(res) and "ORDER BY user_id" in str(res)
    df = ldb.raw_query(f"SELECT * FROM {DB}.csv1 ORDER BY user_id")
    assert list(df["user_id"]) == [1, 2, 3]


def test_a_header_that_is_not_utf8_loads_and_is_reported_readably(ldb, tmp_path):
    """A CSV header in Latin-1 (b"na\\xefme") loads; the report shows the byte ClickHouse could not
    decode as U+FFFD instead of failing with a decoding traceback (metadata comes back as JSON)."""
    f = tmp_path / "latin1.csv"
    f.write_bytes(b"na\xefme,x\n1,2\n")
    res = ldb.load(f"{DB}.latin1", f)
    assert res.rows == 1 and res.columns == {"na\ufffdme": "Nullable(Int64)", "x": "Nullable(Int64)"}


def test_no_order_by_gives_tuple_key(ldb, tmp_path):
    f = _csv(tmp_path / "p.csv", [(1, "north", 3.5)])
    res = ldb.load(f"{DB}.nokey", str(f))
    assert res.rows == 1 and res.order_by == ()


def test_null_in_order_by_column_is_a_clear_error_and_leaves_no_table(ldb, tmp_path):
    f = _csv(tmp_path / "p.csv", [(1, "north", 3.5), ("", "south", 1)])
    with pytest.raises(LoadError, match="column 'user_id' .* empty \\(NULL\\) values"):
        ldb.load(f"{DB}.nullkey", f, order_by="user_id")
    assert ldb.raw_query(f"EXISTS TABLE {DB}.nullkey").iloc[0, 0] == 0


def test_errors_missing_file_glob_unknown_column(ldb, tmp_path):
    with pytest.raises(LoadError, match="file not found: .*nothere.csv"):
        ldb.load(f"{DB}.x", tmp_path / "nothere.csv")
    with pytest.raises(LoadError, match="no file matches"):
        ldb.load(f"{DB}.x", str(tmp_path / "*.parquet"))
    with pytest.raises(LoadError, match="is a directory"):
        ldb.load(f"{DB}.x", tmp_path)
    f = _csv(tmp_path / "p.csv", [(1, "north", 3.5)])
    with pytest.raises(LoadError, match=r"order_by column\(s\) 'uid' not in the data; its columns are: user_id, region, amount"):
        ldb.load(f"{DB}.x", f, order_by="uid")
    with pytest.raises(InvalidParameter, match="if_exists"):
        ldb.load(f"{DB}.x", f, if_exists="overwrite")
    with pytest.raises(InvalidParameter, match="table name"):
        ldb.load("a.b.c", f)


def test_parquet_glob_and_if_exists(ldb, tmp_path):
    for i in range(3):
        pd.DataFrame({"uid": [i * 10 + j for j in range(10)], "v": [float(j) for j in range(10)]}).to_parquet(
            tmp_path / f"part{i}.parquet")
    res = ldb.load(f"{DB}.pq", str(tmp_path / "part*.parquet"), order_by="uid")
    assert res.rows == 30 and res.columns["uid"] == "Int64"
    with pytest.raises(LoadError, match="already exists"):
        ldb.load(f"{DB}.pq", tmp_path / "part0.parquet", order_by="uid")
    assert ldb.load(f"{DB}.pq", tmp_path / "part0.parquet", if_exists="append").rows == 10
    assert ldb.raw_query(f"SELECT count() AS n FROM {DB}.pq")["n"][0] == 40
    # a failing replace keeps the old table
    _csv(tmp_path / "bad.csv", [("", "north", 1)])
    with pytest.raises(LoadError):
        ldb.load(f"{DB}.pq", tmp_path / "bad.csv", order_by="user_id", if_exists="replace")
    assert ldb.raw_query(f"SELECT count() AS n FROM {DB}.pq")["n"][0] == 40
    assert ldb.load(f"{DB}.pq", [tmp_path / "part1.parquet", tmp_path / "part2.parquet"], order_by="uid",
                    if_exists="replace").rows == 20
    assert ldb.raw_query(f"SELECT count() AS n FROM {DB}.pq")["n"][0] == 20


def test_dataframe_and_arrow(ldb):
    df = pd.DataFrame({"user_id": [3, 1, 2], "city": ["a", None, "c"], "x": [1.5, None, 2.0]})
    res = ldb.load(f"{DB}.frame", df, order_by=["user_id"])
    assert res.rows == 3 and res.columns["user_id"] == "Int64" and res.columns["city"] == "Nullable(String)"
    tbl = pa.table({"k": ["u1", "u2"], "n": [1, 2]})
    assert ldb.load(f"{DB}.arrow", tbl, order_by="k").columns["k"] == "String"
    with pytest.raises(LoadError, match="'nope' not in the data"):
        ldb.load(f"{DB}.frame2", df, order_by="nope")


def test_insert_df_works(ldb):
    """insert_df used a name-mangled frame variable (`__dpch_insert_df`) and always failed."""
    ldb.command(f"CREATE TABLE IF NOT EXISTS {DB}.ins (a Int64, b String) ENGINE = MergeTree ORDER BY a")
    ldb.insert_df(f"{DB}.ins", pd.DataFrame({"a": [1, 2], "b": ["x", "y"]}))
    assert ldb.raw_query(f"SELECT count() AS n FROM {DB}.ins")["n"][0] == 2


def test_progress_bar_for_files(ldb, tmp_path, capsys):
    f = _csv(tmp_path / "big.csv", [(i, "north", i / 3) for i in range(50_000)])
    ldb.load(f"{DB}.big", f, order_by="user_id", progress=True)
    err = capsys.readouterr().err
    assert f"loading {DB}.big" in err and "100%" in err


def test_csv_to_first_dp_answer(ldb, tmp_path):
    f = _csv(tmp_path / "visits.csv", [(u % 50, ["north", "south"][u % 2], u % 20) for u in range(500)])
    ldb.load(f"{DB}.visits", f, order_by="user_id")
    ldb.catalog.register(f"{DB}.visits", privacy_unit="user_id", bounds={"amount": (0, 20)},
                         max_groups_contributed=1, max_rows_per_unit=10,
                         public_keys={"region": ["north", "south"]})
    ldb.ledger.set_budget(ldb.analyst, f"{DB}.visits", epsilon=2.0)
    out = ldb.query(f"SELECT region, COUNT(*) AS n, SUM(amount) AS total FROM {DB}.visits GROUP BY region",
                    epsilon=1.0)
    assert sorted(out["region"]) == ["north", "south"] and out.attrs["epsilon_spent"] == pytest.approx(1.0)


def test_cli_load(tmp_path):
    """`dpch load` in its own process and data directory (one store per process)."""
    f = _csv(tmp_path / "p.csv", [(1, "north", 3.5), (2, "south", 1)])
    env = {**os.environ, "DPCH_DATA_DIR": str(tmp_path / "data")}
    run = lambda *a: subprocess.run([sys.executable, "-m", "dpch.cli", *a], capture_output=True, text=True, env=env,
                                    timeout=120)
    r = run("load", "shop.sales", str(f), "--order-by", "user_id")
    assert r.returncode == 0, r.stderr
    assert "loaded 2 rows into shop.sales (ORDER BY user_id)" in r.stdout
    r = run("load", "shop.sales", str(tmp_path / "missing.csv"), "--data-dir", str(tmp_path / "data"))
    assert r.returncode == 2 and "dpch: error: file not found" in r.stderr and "Traceback" not in r.stderr
