"""Post-processing over a DP answer through the gateway's router (dpch.gateway.postprocess_wrapper
and dpch.gateway.frame_query): ``SELECT … FROM (<DP query>) AS t [WHERE] [ORDER BY] [LIMIT]``.

The D/D′ test: the wrapper releases nothing the inner query did not. On D′ (D without unit 42)
the inner query is charged and run as usual, but its release is replaced by the release made on
D (the same noise draw, as if noise were off and both releases coincided): the wrapper's answer
on D′ is then identical to its answer on D, so the outer query depends on the released rows only,
never on the table. And the wrapper's answer equals the outer query computed by pandas over the
inner release."""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import pytest

import dpch.controller as controller
from dpch.gateway import router
from dpch.gateway.errors import GatewayError
from dpch.gateway.frame_query import Frame, select
import sqlglot

DB = "wrapper_t"
UNIT = 42
QUERY = "SELECT region, count() AS n, sum(amount) AS s FROM {t} GROUP BY region"


@dataclass
class FakeGateway:
    """What the router needs of dpch.gateway.server.Gateway, over the test's in-process connection."""

    conn: object

    def catalog_entries(self):
        return self.conn.catalog.list()

    def connection(self, user):
        return self.conn


@pytest.fixture(scope="module")
def wdb(db):
    db.command(f"CREATE DATABASE IF NOT EXISTS {DB}")
    for t in ("d", "d_minus"):
        db.command(f"DROP TABLE IF EXISTS {DB}.{t}")
        db.command(f"CREATE TABLE {DB}.{t} (user_id UInt64, region String, amount Float64) ENGINE = MergeTree "
                   "ORDER BY user_id")
    db.command(f"INSERT INTO {DB}.d SELECT 1 + intDiv(number, 5), ['a', 'b', 'c'][1 + number % 3], "
               f"toFloat64(number % 100) FROM numbers(500) WHERE 1 + intDiv(number, 5) != {UNIT}")
    db.command(f"INSERT INTO {DB}.d SELECT {UNIT}, 'a', 1e9 FROM numbers(5)")  # the unit D′ lacks
    db.command(f"INSERT INTO {DB}.d_minus SELECT * FROM {DB}.d WHERE user_id != {UNIT}")
    for t in ("d", "d_minus"):
        db.catalog.register(f"{DB}.{t}", privacy_unit="user_id", bounds={"amount": (0.0, 100.0)},
                            max_groups_contributed=1, max_rows_per_unit=5, public_keys={"region": ["a", "b", "c"]})
        db.ledger.set_budget(db.analyst, f"{DB}.{t}", epsilon=1e6, delta=0.5)
    return db


def ask(db, sql: str, **settings) -> pd.DataFrame:
    ans = router.answer(FakeGateway(db), db.analyst, sql, {"dpch_epsilon": "1", **settings}, DB)
    return ans.df


def charges(db, table: str) -> int:
    return db.ledger.remaining(db.analyst, f"{DB}.{table}").queries


def test_outer_query_is_a_function_of_the_release_only(wdb, monkeypatch):
    real = controller.run_query
    released = {}

    def record(conn, sql, **kw):
        released["d"] = real(conn, sql, **kw)
        return released["d"]

    outer = "SELECT region, n, s / 2 AS half FROM ({q}) AS t WHERE region != 'c' ORDER BY n DESC, region LIMIT 5"
    before = charges(wdb, "d")
    monkeypatch.setattr(controller, "run_query", record)
    on_d = ask(wdb, outer.format(q=QUERY.format(t=f"{DB}.d")))
    assert charges(wdb, "d") == before + 1  # the inner DP query, charged once

    inner = released["d"]
    want = inner[inner["region"] != "c"].assign(half=inner["s"] / 2).sort_values(
        ["n", "region"], ascending=[False, True], kind="stable").head(5)[["region", "n", "half"]]
    pd.testing.assert_frame_equal(on_d.reset_index(drop=True), want.reset_index(drop=True), check_dtype=False)

    def replay(conn, sql, **kw):  # D′ is charged and run, but releases what D released
        real(conn, sql, **kw)
        return inner.copy()

    before_minus = charges(wdb, "d_minus")
    monkeypatch.setattr(controller, "run_query", replay)
    on_d_minus = ask(wdb, outer.format(q=QUERY.format(t=f"{DB}.d_minus")))
    assert charges(wdb, "d_minus") == before_minus + 1
    pd.testing.assert_frame_equal(on_d.reset_index(drop=True), on_d_minus.reset_index(drop=True))


@pytest.mark.parametrize("outer, code", [
    ("SELECT amount FROM ({q}) AS t", 47),  # a raw column the inner query does not release
    ("SELECT t.n FROM ({q}) AS t WHERE user_id = 42", 47),
    ("SELECT x.n FROM ({q}) AS t", 47),  # a qualifier other than the subquery's alias
    # an aggregate in the outer query: not a wrapper; the normal path refuses the subquery
    ("SELECT n FROM ({q}) AS t WHERE n > (SELECT count() FROM wrapper_t.d)", 9101),
    ("SELECT n, file('/etc/passwd') AS f FROM ({q}) AS t", 9101),  # the same function rule set
    ("SELECT n, getSetting('max_threads') AS f FROM ({q}) AS t", 9101),
    ("SELECT region, n FROM ({q}) AS t JOIN wrapper_t.d AS d ON d.region = t.region", 9101),
])
def test_outer_refusals_charge_nothing(wdb, outer, code):
    before = charges(wdb, "d")
    with pytest.raises(GatewayError) as e:
        ask(wdb, outer.format(q=QUERY.format(t=f"{DB}.d")))
    assert e.value.code == code, e.value.message
    assert charges(wdb, "d") == before


def test_create_view_names_the_wrapper(wdb):
    with pytest.raises(GatewayError) as e:
        ask(wdb, f"CREATE VIEW v AS {QUERY.format(t=f'{DB}.d')}")
    assert e.value.code == 497 and "SELECT … FROM (<DP query>)" in e.value.message
    with pytest.raises(GatewayError) as e:
        ask(wdb, f"CREATE TEMPORARY VIEW v AS {QUERY.format(t=f'{DB}.d')}")
    assert e.value.code == 497


def test_ibis_shapes_and_nested_wrappers(wdb):
    """ibis qualifies the columns with the subquery's alias and nests wrappers."""
    before = charges(wdb, "d")
    q = QUERY.format(t=f"{DB}.d")
    df = ask(wdb, f'SELECT * FROM (SELECT * FROM ({q}) AS "t1" WHERE "t1"."region" IN (\'a\', \'b\')) AS "t2" '
                  'ORDER BY "t2"."region" ASC LIMIT 1')
    assert df["region"].tolist() == ["a"] and list(df.columns) == ["region", "n", "s"]
    assert charges(wdb, "d") == before + 1


def test_frame_query_expressions():
    df = pd.DataFrame({"k": ["x", "y", None, "z"], "v": [3, 1, 2, None]})
    frame = Frame(df, names={"t"}, what="the test frame")
    tree = sqlglot.parse_one("SELECT k, v * 2 AS w, if(v > 1, 'big', 'small') AS c, concat(k, '!') AS e FROM t "
                             "WHERE k IS NOT NULL ORDER BY 2 DESC LIMIT 2", read="clickhouse")
    out = select(tree, frame)
    assert out["k"].tolist() == ["x", "y"] and out["w"].tolist() == [6, 2] and out["c"].tolist() == ["big", "small"]
    assert out["e"].tolist() == ["x!", "y!"]
    with pytest.raises(GatewayError) as e:
        select(sqlglot.parse_one("SELECT nosuch FROM t", read="clickhouse"), frame)
    assert e.value.code == 47 and "nosuch" in e.value.message
