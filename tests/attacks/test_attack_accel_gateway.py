"""The per-unit table (`catalog accelerate --method table`, issue 33) attacked through the REAL
gateway process (`dpch serve`), as an analyst with a valid login would: with budget and without.

The table `dpch_accel.<name>` holds every unit's raw counts and clipped sums (one row per unit, and
a total row), and its materialized view's DDL holds the keyed-hash salt. The gateway must answer
nothing of it: not read directly, in a subquery, a join, a CTE, a table function, through the
metadata statements or the system tables, nor through the JSON routes' `where`. The oracle
checked is existence: each case is sent with the real table's name and with a name that does not
exist, and the two answers must be identical (status, exception code, body with the name masked),
so an analyst cannot even learn that the structure exists. Nothing is ever charged, and a DP answer
served from the table says nothing of where it was read from.

tests/test_accelerate_table.py checks the same rules in process (router.answer); this module runs
them through HTTP against the process a user starts.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from test_gateway import demo_dir  # a copy of the demo data directory (tests/test_gateway.py)

from .test_gateway_leaks import POOR, RICH, _charges, _post, serving_rich_and_poor

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
FAKE = "demo__purchases__units2_0000000000000000"  # the real name's shape, no such table


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    d = demo_dir(tmp_path_factory, "accel_gw")
    # the owner builds the per-unit table in a process of its own (this one may hold the test
    # session's embedded store: one store per process), as `dpch catalog accelerate` would
    r = subprocess.run([PY, "-m", "dpch.cli", "catalog", "accelerate", "demo.purchases", "--group-by", "region",
                        "--method", "table", "--data-dir", str(d)], capture_output=True, text=True, cwd=ROOT,
                       timeout=180)
    assert r.returncode == 0, r.stderr
    name = r.stdout.split("dpch_accel.", 1)[1].split()[0]
    assert name.startswith("demo__purchases__units2_") and len(name) == len(FAKE), name
    with serving_rich_and_poor(d) as url:
        yield url, d, name


def _seen(r: httpx.Response, name: str) -> tuple:
    """What the analyst sees, with the table's name masked (an error may quote the SQL as typed)."""
    return (r.status_code, r.headers.get("x-clickhouse-exception-code"), r.content.replace(name.encode(), b"<T>"))


# {t}: the per-unit table's name (or the fake one); every read an analyst could try
READS = {
    "direct": "SELECT count() FROM dpch_accel.{t}",
    "merge_states": "SELECT region, countMerge(a0) FROM dpch_accel.{t} GROUP BY region",
    "with_epsilon": "SELECT count() FROM dpch_accel.{t} SETTINGS dpch_epsilon = 1",
    "the_view": "SELECT count() FROM dpch_accel.{t}__mv",
    "in_subquery": "SELECT COUNT(*) AS n FROM demo.purchases WHERE user_id IN (SELECT user_id FROM dpch_accel.{t}) "
                   "SETTINGS dpch_epsilon = 0.1",
    "join": "SELECT COUNT(*) AS n FROM demo.purchases AS p JOIN dpch_accel.{t} AS u ON p.user_id = u.user_id "
            "SETTINGS dpch_epsilon = 0.1",
    "cte": "WITH x AS (SELECT * FROM dpch_accel.{t}) SELECT COUNT(*) AS n FROM x SETTINGS dpch_epsilon = 0.1",
    "scalar": "SELECT COUNT(*) AS n FROM demo.purchases WHERE amount > (SELECT count() FROM dpch_accel.{t}) "
              "SETTINGS dpch_epsilon = 0.1",
    "merge_function": "SELECT count() FROM merge('dpch_accel', '{t}')",
    "describe": "DESCRIBE TABLE dpch_accel.{t}",
    "show_create": "SHOW CREATE TABLE dpch_accel.{t}",
    "exists": "EXISTS TABLE dpch_accel.{t}",
    "columns": "SELECT name, type FROM system.columns WHERE database = 'dpch_accel' AND table = '{t}'",
    "tables": "SELECT name, create_table_query FROM system.tables WHERE name = '{t}'",
}


@pytest.mark.parametrize("case", list(READS))
@pytest.mark.parametrize("who", ["rich", "poor"])
def test_no_read_of_the_per_unit_table_and_no_existence_oracle(gw, case, who):
    url, d, name = gw
    auth = RICH if who == "rich" else POOR
    before = _charges(d)
    real = _post(url, auth, READS[case].format(t=name))
    fake = _post(url, auth, READS[case].format(t=FAKE))
    assert _seen(real, name) == _seen(fake, FAKE), (real.status_code, real.text[:300], fake.text[:300])
    # refused, or (the metadata readers) answered from the catalog's view: never the table's rows
    # or its view's DDL with the salt
    assert real.status_code != 200 or not real.content.strip() or real.content.strip() == b"0", real.text[:300]
    assert b"sipHash" not in real.content and b"xxh3" not in real.content and b"countState" not in real.content
    assert _charges(d) == before


@pytest.mark.parametrize("who", ["rich", "poor"])
def test_listings_do_not_show_the_structure(gw, who):
    url, d, name = gw
    auth = RICH if who == "rich" else POOR
    for sql in ("SHOW DATABASES", "SHOW TABLES FROM dpch_accel", "SELECT name FROM system.databases",
                "SELECT database, name FROM system.tables", "SHOW TABLES FROM demo"):
        r = _post(url, auth, sql)
        assert b"dpch_accel" not in r.content and name.encode() not in r.content, (sql, r.text[:300])


def test_json_routes_where_cannot_read_it(gw):
    url, d, name = gw
    before = _charges(d)
    out = []
    for t in (name, FAKE):
        where = f"user_id IN (SELECT user_id FROM dpch_accel.{t})"
        ptr = {"statistic": "median", "dataset": "demo.purchases", "column": "amount", "epsilon": 1.0,
               "delta": 1e-6, "bound": 10.0, "where": where}
        svt = {"dataset": "demo.purchases", "threshold": 10, "epsilon": 1.0, "max_positives": 1,
               "queries": [f"SELECT COUNT(*) FROM demo.purchases WHERE {where}"]}
        out.append((httpx.post(url + "/dpch/ptr", json=ptr, auth=RICH, timeout=120),
                    httpx.post(url + "/dpch/svt", json=svt, auth=RICH, timeout=120)))
    (ptr_real, svt_real), (ptr_fake, svt_fake) = out
    assert ptr_real.status_code != 200 and _seen(ptr_real, name) == _seen(ptr_fake, FAKE), ptr_real.text[:300]
    # its only query is refused, so the whole request is (SparseVector.refuse_if_none_answerable)
    assert svt_real.status_code != 200 and _seen(svt_real, name) == _seen(svt_fake, FAKE), svt_real.text[:300]
    assert _charges(d) == before


def test_a_dp_answer_served_from_it_says_nothing_of_it(gw):
    """The grouped query the table serves: answered and charged once; neither the body nor a header
    names the structure or where the answer was read from."""
    url, d, name = gw
    before = _charges(d)
    r = _post(url, RICH, "SELECT region, COUNT(*) AS n, SUM(amount) AS s FROM demo.purchases GROUP BY region "
                         "SETTINGS dpch_epsilon = 1 FORMAT JSON")
    assert r.status_code == 200, r.text[:300]
    assert len(r.json()["data"]) >= 1
    seen = r.content + "".join(f"{k}: {v}\n" for k, v in r.headers.items()).encode()
    for word in (name.encode(), b"dpch_accel", b"per_unit", b"units2"):
        assert word not in seen, word
    assert _charges(d) == before + 1
