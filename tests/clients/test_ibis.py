"""ibis (``ibis.clickhouse.connect``) against a real `dpch serve`: list tables, a table's schema,
group_by().aggregate() as a DP query, and .order_by()/.limit()/.filter() on it (ibis wraps the
aggregate in ``SELECT * FROM (…) AS t1 …``: the gateway's post-processing wrapper), con.sql with a
schema, and CREATE VIEW refused with a ClickHouse error.

ibis subclasses sqlglot's generator, which the mypyc-compiled build that DPCH installs
(``sqlglot[c]``) does not allow ("interpreted classes cannot inherit from compiled"). A client
runs in its own environment anyway: the client script runs in a subprocess whose ``sqlglot`` is a
pure-Python copy of the installed one (same version, the ``.so`` files left out)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from .conftest import USER, charges
from test_gateway import PASSWORD

pytest.importorskip("ibis")

SCRIPT = r"""
import json, sys
import ibis
port, user, password = int(sys.argv[1]), sys.argv[2], sys.argv[3]
con = ibis.clickhouse.connect(host="127.0.0.1", port=port, user=user, password=password, database="demo",
                              settings={"dpch_epsilon": 1})
out = {"tables": con.list_tables()}
t = con.table("purchases")
out["schema"] = {k: str(v) for k, v in t.schema().items()}
agg = t.group_by("region").aggregate(n=t.count())
out["agg"] = sorted(agg.execute()["region"].tolist())
ordered = agg.order_by(ibis.desc("n")).execute()
out["ordered"] = ordered["n"].tolist()
out["limit"] = len(agg.limit(2).execute())
filt = agg.filter(agg.region.isin(["north", "south"])).order_by("region").execute()
out["filter"] = filt["region"].tolist()
sq = con.sql("SELECT region, count() AS n FROM demo.purchases GROUP BY region",
             schema={"region": "string", "n": "int64"})
out["sql_schema"] = sorted(sq.order_by("region").execute()["region"].tolist())
try:
    con.sql("SELECT region, count() AS n FROM demo.purchases GROUP BY region").execute()
    out["sql_no_schema"] = "answered"
except Exception as exc:
    out["sql_no_schema"] = str(exc)
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def pure_sqlglot(tmp_path_factory):
    import sqlglot

    d = tmp_path_factory.mktemp("puresqlglot")
    shutil.copytree(os.path.dirname(sqlglot.__file__), d / "sqlglot", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    return d


def test_ibis_end_to_end(gateway, pure_sqlglot):
    before = charges(gateway)
    env = {**os.environ, "PYTHONPATH": str(pure_sqlglot)}
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(gateway.port), USER, PASSWORD], capture_output=True,
                       text=True, timeout=300, env=env)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, r.stdout + r.stderr
    out = json.loads(line[len("RESULT "):])
    regions = ["centre", "east", "north", "south", "west"]
    assert out["tables"] == ["purchases"]
    assert out["schema"] == {"age": "!uint8", "amount": "!float64", "purchase_id": "!uint64", "region": "!string",
                             "user_id": "!uint64"}
    assert out["agg"] == regions
    assert len(out["ordered"]) == 5 and out["ordered"] == sorted(out["ordered"], reverse=True)
    assert out["limit"] == 2
    assert out["filter"] == ["north", "south"]
    assert out["sql_schema"] == regions
    assert "Code: 497" in out["sql_no_schema"] and "SELECT … FROM (<DP query>)" in out["sql_no_schema"]
    assert charges(gateway) == before + 5  # agg, order_by, limit, filter, con.sql: one charge each; CREATE VIEW none
