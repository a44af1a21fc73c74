"""One rule set for every expression, and nothing the analyst controls evaluated before the budget
check (DESIGN.md invariant 10; issue 27 items 1-2, issue 26 item 4).

Generated, not enumerated: every function that reads state outside the query's tables is placed in
every position the query stages accept (outer SELECT/WHERE/GROUP BY/HAVING/ORDER BY, aggregate
arguments, public and protected IN/EXISTS subqueries, CTEs, derived tables, per-unit subqueries,
INNER/LEFT JOIN ON), and wrapped in allowed functions. Each must be refused by the parse stage,
which reads nothing, so the refusal depends on the query text only; and through the controller the
engine never sees the query and nothing is charged. A second set checks the order: an analyst with
no budget gets the budget refusal before any analysis, so an analysis error cannot be an oracle.
"""
from __future__ import annotations

import itertools

import pytest

from dpch.connection import Connection
from dpch.errors import BudgetExceeded, QueryRejected
from dpch.function_rules import FUNCTION_RULES, STATE_READERS, reads_state
from dpch.parse import parse

from . import harness

T = f"{harness.DB}.d"
T2 = f"{harness.DB}.d_rules2"
PUB = f"{harness.DB}.zones"

# Calls that read a file, a URL, a setting, a dictionary, another table, the server, or throw/sleep.
READERS = [
    "file('/etc/passwd', 'LineAsString')", "url('http://127.0.0.1:1/x', 'CSV')", "dictGet('db.d', 'a', toUInt64(1))",
    "dictGetFloat64('db.cust_dict', 'bal', toUInt64(0))", "dictHas('db.d', toUInt64(1))",
    "joinGet('db.j', 'v', 1)", "getSetting('max_threads')", "getSettingOrDefault('x', 1)",
    "hasColumnInTable('system', 'one', 'dummy')", "sleep(1)", "sleepEachRow(1)", "throwIf(1)",
    "currentProfiles()", "currentUser()", "version()", "hostName()", "getMacro('x')", "filesystemFree()",
    "rand()", "randUniform(0, 1)", "generateUUIDv4()", "s3('http://127.0.0.1:1/x')", "uptime()",
    "currentDatabase()", "rowNumberInAllBlocks()", "runningDifference(1)", "queryID()", "timezone()",
    "addressToSymbol(1)", "materialize(1)",
]
# Each reader wrapped so the expression is allowed around it (the check walks every node).
WRAPS = ["{f}", "length(toString({f}))", "if(1 = 1, toString({f}), 'x')"]

POSITIONS = {
    "select": "SELECT COUNT(*) AS n, length(toString({e})) AS z FROM {T}",
    "where": "SELECT COUNT(*) AS n FROM {T} WHERE toString({e}) != ''",
    "group_by": "SELECT toString({e}) AS g, COUNT(*) AS n FROM {T} GROUP BY g",
    "having": "SELECT region, COUNT(*) AS n FROM {T} GROUP BY region HAVING COUNT(*) > length(toString({e}))",
    "order_by": "SELECT region, COUNT(*) AS n FROM {T} GROUP BY region ORDER BY length(toString({e}))",
    "aggregate": "SELECT SUM(length(toString({e}))) AS s FROM {T}",
    "count_if": "SELECT countIf(toString({e}) = 'x') AS s FROM {T}",
    "public_in_where": "SELECT COUNT(*) AS n FROM {T} WHERE region IN (SELECT region FROM {PUB} WHERE toString({e}) != '')",
    "public_in_select": "SELECT COUNT(*) AS n FROM {T} WHERE region IN (SELECT toString({e}) FROM {PUB})",
    "protected_in": "SELECT COUNT(*) AS n FROM {T} WHERE user_id IN (SELECT user_id FROM {T2} WHERE toString({e}) != '')",
    "protected_in_having": "SELECT COUNT(*) AS n FROM {T} WHERE user_id IN (SELECT user_id FROM {T2} GROUP BY user_id "
                           "HAVING COUNT(*) > length(toString({e})))",
    "exists": "SELECT COUNT(*) AS n FROM {T} t WHERE EXISTS (SELECT 1 FROM {T2} s WHERE s.user_id = t.user_id AND "
              "toString({e}) != '')",
    "cte": "WITH c AS (SELECT user_id, region FROM {T} WHERE toString({e}) != '') SELECT COUNT(*) AS n FROM c",
    "derived": "SELECT COUNT(*) AS n FROM (SELECT user_id, toString({e}) AS z FROM {T}) s",
    "per_unit": "SELECT COUNT(*) AS n FROM (SELECT user_id, COUNT(*) AS c FROM {T} WHERE toString({e}) != '' "
                "GROUP BY user_id) s",
    "inner_join_on": "SELECT COUNT(*) AS n FROM {T} a JOIN {PUB} p ON a.region = p.region AND toString({e}) != ''",
    "left_join_on": "SELECT COUNT(*) AS n FROM {T} a LEFT JOIN {PUB} p ON a.region = p.region AND toString({e}) != ''",
    "table_function": "SELECT COUNT(*) AS n FROM {T} WHERE region IN (SELECT c1 FROM file('/etc/passwd') WHERE {e} = 1)",
}


def _sql(position: str, expression: str) -> str:
    return POSITIONS[position].format(T=T, T2=T2, PUB=PUB, e=expression)


@pytest.mark.parametrize("position", sorted(POSITIONS))
@pytest.mark.parametrize("wrap", WRAPS, ids=["bare", "length", "if"])
def test_every_state_reader_is_refused_in_every_position_by_the_parse_stage(position, wrap):
    """The parse stage reads nothing: a refusal there depends on the text only."""
    for reader in READERS:
        sql = _sql(position, wrap.format(f=reader))
        with pytest.raises(QueryRejected) as info:
            parse(sql)
        msg = str(info.value).lower().replace("_", "")  # sqlglot spells some names its own way
        name = reader.split("(")[0].lower()
        assert name in msg or "table function" in msg, (sql, msg)


def test_state_readers_are_never_on_the_allow_list():
    assert [n for n in FUNCTION_RULES if reads_state(n)] == []
    for reader in READERS:
        assert reads_state(reader.split("(")[0]), reader
    assert {"file", "url", "getsetting", "hascolumnintable", "joinget", "throwif"} <= STATE_READERS


def test_unknown_functions_are_refused_in_subqueries_too():
    for position, fn in itertools.product(["public_in_where", "cte", "per_unit", "exists"],
                                          ["arrayJoin([1])", "bar(1, 0, 10)", "visitParamExtractRaw('a', 'b')"]):
        with pytest.raises(QueryRejected, match="not"):
            parse(_sql(position, fn))


@pytest.fixture(scope="module")
def rdb(adb):
    adb.command(f"DROP TABLE IF EXISTS {T2}")
    adb.command(f"CREATE TABLE {T2} AS {T}")
    adb.command(f"INSERT INTO {T2} SELECT * FROM {T}")
    adb.catalog.register(T2, privacy_unit="user_id", bounds=dict(harness.BOUNDS), max_rows_per_unit=5)
    adb.command(f"DROP TABLE IF EXISTS {PUB}")
    adb.command(f"CREATE TABLE {PUB} (region String, label String) ENGINE = MergeTree ORDER BY region")
    adb.command(f"INSERT INTO {PUB} VALUES ('EU', 'e'), ('US', 'u'), ('ASIA', 'a'), ('AFRICA', 'f')")
    adb.catalog.register(PUB, public=True)
    return adb


class _Spy:
    """Records every SQL text the engine receives (the catalog's own reads included)."""

    def __init__(self, backend):
        self.backend, self.seen = backend, []

    def __getattr__(self, name):
        attr = getattr(self.backend, name)
        if name in ("query_df", "query_formatted", "command"):
            def spy(sql, *a, **kw):
                self.seen.append(sql)
                return attr(sql, *a, **kw)
            return spy
        return attr


def _conn(rdb, analyst: str, budget: float | None) -> tuple[Connection, _Spy]:
    spy = _Spy(rdb.backend)
    conn = Connection(spy, analyst=analyst, data_dir=rdb.data_dir, ledger_path=rdb.ledger_path)
    conn._ledger = rdb.ledger
    if budget is not None:
        for t in (T, T2):
            rdb.ledger.set_budget(analyst, t, epsilon=budget)
    return conn, spy


@pytest.mark.parametrize("position", sorted(set(POSITIONS) - {"table_function"}))
def test_refused_reader_reaches_no_engine_and_charges_nothing(rdb, position):
    conn, spy = _conn(rdb, "rules_rich", 100.0)
    sql = _sql(position, "file('/etc/passwd', 'LineAsString')")
    before = len(rdb.ledger.history("rules_rich"))
    with pytest.raises(QueryRejected, match="file"):
        conn.query(sql, epsilon=0.1)
    assert not any("passwd" in s for s in spy.seen)
    assert len(rdb.ledger.history("rules_rich")) == before


# Queries the rules accept whose ANALYSIS fails (an invalid constant, a type mismatch in a public
# subquery): for an analyst without budget, the budget refusal must come first, and the engine
# must not see the query at all.
ANALYSIS_ERRORS = [
    f"SELECT COUNT(*) AS n FROM {T} WHERE region IN (SELECT region FROM {PUB} WHERE toDecimal32(label, 100) > 0)",
    f"SELECT COUNT(*) AS n FROM {T} WHERE region IN (SELECT region FROM {PUB} WHERE label + 1 > 0)",
    f"SELECT COUNT(*) AS n FROM {T} WHERE amount + region > 0",
    f"SELECT COUNT(*) AS n FROM {T} a JOIN {PUB} p ON a.region = p.region WHERE p.label > now()",
]


@pytest.mark.parametrize("sql", ANALYSIS_ERRORS)
@pytest.mark.parametrize("budget", ["none", "spent", "too_small"])
def test_budget_is_checked_before_anything_is_analysed(rdb, sql, budget):
    analyst = f"rules_poor_{budget}"
    conn, spy = _conn(rdb, analyst, {"none": None, "spent": 0.1, "too_small": 0.05}[budget])
    if budget == "spent" and not rdb.ledger.history(analyst):
        conn.query(f"SELECT COUNT(*) AS n FROM {T}", epsilon=0.1)  # the whole budget, on a valid query
    before = len(rdb.ledger.history(analyst))
    spy.seen.clear()
    with pytest.raises(BudgetExceeded):
        conn.query(sql, epsilon=0.1)
    analysed = [s for s in spy.seen if PUB in s or "amount + region" in s or "DESCRIBE" in s]
    assert analysed == [], analysed
    assert len(rdb.ledger.history(analyst)) == before


@pytest.mark.parametrize("sql", ANALYSIS_ERRORS)
def test_with_budget_an_analysis_error_is_refused_free(rdb, sql):
    conn, _ = _conn(rdb, "rules_rich2", 100.0)
    with pytest.raises(QueryRejected):
        conn.query(sql, epsilon=0.1)
    assert rdb.ledger.history("rules_rich2") == []


def test_precheck_matches_the_charge_for_basic_composition(rdb):
    """Basic composition: a query costs exactly its declared ε, so the precheck refuses exactly the
    queries the charge would refuse (and accepts spending the budget to the last ε)."""
    conn, _ = _conn(rdb, "rules_exact", None)
    rdb.ledger.set_budget("rules_exact", T, epsilon=0.3)
    for _ in range(3):
        conn.query(f"SELECT COUNT(*) AS n FROM {T}", epsilon=0.1)
    with pytest.raises(BudgetExceeded, match="Nothing was analysed"):
        conn.query(f"SELECT COUNT(*) AS n FROM {T}", epsilon=0.1)
    assert len(rdb.ledger.history("rules_exact")) == 3


@pytest.mark.parametrize("sub", [
    f"SELECT a.region FROM {PUB} a, {PUB} b, {PUB} c, {PUB} d",
    f"SELECT a.region FROM {PUB} a CROSS JOIN {PUB} b",
    f"SELECT a.region FROM {PUB} a JOIN {PUB} b ON a.region = b.region",
])
def test_public_subquery_joins_and_cross_products_are_refused_free(rdb, sub):
    """A 13-way cross product of a public table inside IN (SELECT …) held the engine for minutes
    (issue 27): a public subquery reads one table."""
    conn, spy = _conn(rdb, "rules_rich3", 100.0)
    with pytest.raises(QueryRejected, match="one table"):
        conn.query(f"SELECT COUNT(*) AS n FROM {T} WHERE region IN ({sub})", epsilon=0.1)
    assert not any("CROSS" in s.upper() or " b," in s for s in spy.seen if PUB in s)
    assert rdb.ledger.history("rules_rich3") == []


def test_engine_statements_from_analyst_sql_are_read_only(rdb):
    """Defence in depth (issue 27 item 3): every statement built from analyst SQL carries
    readonly = 2, so even a write that slipped past every check would be refused by the engine."""
    from dpch.engine import with_settings

    rdb.command(f"CREATE TABLE IF NOT EXISTS {harness.DB}.ro_probe (x UInt8) ENGINE = Memory")
    with pytest.raises(Exception, match="READONLY|readonly"):
        rdb.backend.command(with_settings(f"INSERT INTO {harness.DB}.ro_probe SELECT 1"))
    assert int(rdb.raw_query(f"SELECT count() AS n FROM {harness.DB}.ro_probe")["n"].iloc[0]) == 0
    from dpch.controller import prepare

    assert "readonly = 2" in prepare(rdb, f"SELECT COUNT(*) AS n FROM {T}", epsilon=0.1).rewritten.sql
