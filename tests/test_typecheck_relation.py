"""The pre-charge type check runs the REAL relation (issue 26, cause 2 / item 3; dpch.probe_db).

D = ``tcr``, D′ = ``tcrp`` (unit 42 and all its rows removed). Unit 42 holds the values that make
a lossy key conversion throw: Decimal(18,0) 10^17 (×100 overflows Decimal64), DateTime64(3) in
2290 (overflows DateTime64(9)), a String that is no element of an Enum. A join, semi-join or
reference-chain join whose key types do not fit must be refused before the charge (ledger
unchanged) on D and D′ with the same message, or be answered on both: never charged, then failed
on D only. Which layer refuses is not asserted: the relation's key rule (dpch.relation) may refuse
first, the probe catches the rest. The probe-level tests further down bypass that rule on purpose
(a hand-made relation) to show what the probe alone catches.
"""
from __future__ import annotations

from dataclasses import replace

import pytest
from sqlglot import exp, parse_one

from dpch import probe_db, typecheck
from dpch.controller import prepare, run_query_formatted
from dpch.catalog import quote_string as quote
from dpch.errors import CatalogError, DPCHError, QueryRejected
from dpch.rewrite import rewrite_probe

NAMES = ("tcr", "tcrp")  # D, D′
UNIT = 42
SECRETS = ("100000000000000000", "1e+17", "2290", "zzz")  # unit 42's values: never in a message


def _build(db, name: str, drop_unit: bool) -> dict:
    c = db.command
    keep = f"WHERE id != {UNIT}" if drop_unit else ""
    c(f"DROP DATABASE IF EXISTS {name}")
    c(f"CREATE DATABASE {name}")
    c(f"CREATE TABLE {name}.u (id UInt64, kd Decimal(18, 0), kt DateTime64(3, 'UTC'), kf Float64, ks String, "
      "ku UInt64) ENGINE = MergeTree ORDER BY id")
    c(f"INSERT INTO {name}.u SELECT * FROM (SELECT number AS id, "
      f"if(number = {UNIT}, toDecimal64('100000000000000000', 0), toDecimal64(number, 0)) AS kd, "
      f"if(number = {UNIT}, toDateTime64('2290-01-01 00:00:00', 3, 'UTC'), "
      "toDateTime64('2000-01-01 00:00:00', 3, 'UTC') + toIntervalDay(number)) AS kt, "
      f"if(number = {UNIT}, 1.5, toFloat64(number % 10)) AS kf, if(number = {UNIT}, 'zzz', if(number % 2 = 0, 'x', 'y')) "
      f"AS ks, number % 10 AS ku FROM numbers(60)) {keep}")
    c(f"CREATE TABLE {name}.p (kd2 Decimal(18, 2), kt9 DateTime64(9, 'UTC'), ku UInt64, kfp Float64, "
      "e Enum8('x' = 1, 'y' = 2), label String) ENGINE = MergeTree ORDER BY ku")
    c(f"INSERT INTO {name}.p SELECT toDecimal64(number, 2), toDateTime64('2000-01-01 00:00:00', 9, 'UTC') + "
      "toIntervalDay(number), number, toFloat64(number), if(number % 2 = 0, 'x', 'y'), toString(number) "
      "FROM numbers(10)")
    # children reaching the unit through a reference whose key types do not fit
    c(f"CREATE TABLE {name}.cf (cid UInt64, c_ref Float64) ENGINE = MergeTree ORDER BY cid")
    c(f"INSERT INTO {name}.cf SELECT number, toFloat64(number % 60) FROM numbers(120) "
      f"{f'WHERE number % 60 != {UNIT}' if drop_unit else ''}")
    c(f"CREATE TABLE {name}.cd (cid UInt64, c_dref Decimal(18, 2)) ENGINE = MergeTree ORDER BY cid")
    # (unit 42's key 10^17 does not fit Decimal(18, 2): it has no rows here, but its key is in u)
    c(f"INSERT INTO {name}.cd SELECT number, toDecimal64(number % 60, 2) FROM numbers(120) WHERE number % 60 != {UNIT}")
    # well-typed children for the fidelity test: orders of a unit, their items (two hops)
    c(f"CREATE TABLE {name}.o (oid UInt64, uid UInt64, amt Nullable(Float64), tag LowCardinality(String)) "
      "ENGINE = MergeTree ORDER BY oid")
    c(f"INSERT INTO {name}.o SELECT number, number % 60, if(number % 7 = 0, NULL, number % 10), "
      f"if(number % 2 = 0, 'a', 'b') FROM numbers(240) {f'WHERE number % 60 != {UNIT}' if drop_unit else ''}")
    c(f"CREATE TABLE {name}.li (lid UInt64, l_oid UInt64, q Decimal(10, 2)) ENGINE = MergeTree ORDER BY lid")
    c(f"INSERT INTO {name}.li SELECT number, number % 240, number % 9 FROM numbers(720) "
      f"{f'WHERE (number % 240) % 60 != {UNIT}' if drop_unit else ''}")
    cat = db.catalog
    cat.register(f"{name}.u", privacy_unit="id", bounds={"kf": (0, 10)}, max_rows_per_unit=1)
    cat.register(f"{name}.p", public=True)
    cat.register(f"{name}.o", references={"uid": f"{name}.u.id"}, bounds={"amt": (0, 10)}, max_rows_per_unit=4,
                 public_keys={"tag": ["a", "b"]})
    cat.register(f"{name}.li", references={"l_oid": f"{name}.o.oid"}, bounds={"q": (0, 10)}, max_rows_per_unit=12)
    refused = {}
    for table, refs in (("cf", {"c_ref": f"{name}.u.id"}), ("cd", {"c_dref": f"{name}.u.kd"})):
        try:  # the catalog may refuse a reference whose key types do not fit: that is a refusal too
            cat.register(f"{name}.{table}", references=refs, max_rows_per_unit=4)
        except CatalogError as exc:
            refused[table] = str(exc).replace(name + ".", "{d}.")
    db.ledger.set_budget(db.analyst, f"{name}.u", epsilon=1e9, delta=0.5)
    return refused


@pytest.fixture(scope="module")
def tdb(db):
    refused = [_build(db, name, drop_unit=name == "tcrp") for name in NAMES]
    assert refused[0] == refused[1], "registration must not depend on the data"
    db._tcr_refused = refused[0]
    return db


def _charges(db, name: str) -> int:
    return len(db.ledger.history(db.analyst, f"{name}.u"))


def _outcome(db, sql: str, name: str, formatted: bool = False):
    """("rejected", message) with nothing charged, ("answered", columns) charged once, or
    ("failed", error type) when the query was charged and then failed (a defect)."""
    before = _charges(db, name)
    try:
        if formatted:
            out = run_query_formatted(db, sql.replace("{d}", name), "JSONEachRow", epsilon=1.0)
            shape = ("answered", "JSONEachRow")
        else:
            df = db.query(sql.replace("{d}", name), epsilon=1.0)
            shape = ("answered", tuple(df.columns))
    except QueryRejected as exc:
        assert _charges(db, name) == before, "a rejected query was charged"
        msg = str(exc)
        assert not any(s in msg for s in SECRETS), msg
        return ("rejected", msg.replace(name + ".", "{d}."))
    except DPCHError as exc:
        assert _charges(db, name) == before + 1
        return ("failed", type(exc).__name__)
    assert _charges(db, name) == before + 1
    if formatted:
        assert out.body
    return shape


CASES = {
    "decimal_scale_join": "SELECT COUNT(*) AS n FROM {d}.u JOIN {d}.p ON u.kd = p.kd2",
    "datetime64_precision_join": "SELECT COUNT(*) AS n FROM {d}.u JOIN {d}.p ON u.kt = p.kt9",
    "float_uint_join": "SELECT COUNT(*) AS n FROM {d}.u JOIN {d}.p ON u.kf = p.ku",
    "uint_float_join": "SELECT COUNT(*) AS n FROM {d}.u JOIN {d}.p ON u.ku = p.kfp",
    "string_in_enum_semijoin": "SELECT COUNT(*) AS n FROM {d}.u WHERE ks IN (SELECT e FROM {d}.p)",
    "decimal_in_semijoin": "SELECT COUNT(*) AS n FROM {d}.u WHERE kd IN (SELECT kd2 FROM {d}.p)",
    "float_in_semijoin": "SELECT COUNT(*) AS n FROM {d}.u WHERE kf NOT IN (SELECT ku FROM {d}.p)",
    "chain_float_uint": "SELECT COUNT(*) AS n FROM {d}.cf",
    "chain_decimal_scale": "SELECT COUNT(*) AS n FROM {d}.cd",
}


@pytest.mark.parametrize("case", list(CASES))
def test_key_type_mismatch_same_outcome_on_d_and_d_prime(tdb, case):
    sql = CASES[case]
    table = {"chain_float_uint": "cf", "chain_decimal_scale": "cd"}.get(case)
    if table in tdb._tcr_refused:  # refused at registration, on D and D′ alike (checked by the fixture)
        assert not any(s in tdb._tcr_refused[table] for s in SECRETS)
        return
    d, d_prime = (_outcome(tdb, sql, name) for name in NAMES)
    assert d[0] != "failed" and d_prime[0] != "failed", (d, d_prime)
    assert d == d_prime


@pytest.mark.parametrize("case", ["float_uint_join", "string_in_enum_semijoin", "decimal_scale_join"])
def test_key_type_mismatch_on_the_gateway_path(tdb, case):
    """The engine-rendered path (the gateway's) runs the same probe before its charge."""
    d, d_prime = (_outcome(tdb, CASES[case], name, formatted=True) for name in NAMES)
    assert d[0] != "failed" and d == d_prime, (d, d_prime)


# ------------------------------------------------------------------------------------------------
# The probe alone: a hand-made relation that no key rule has looked at
# ------------------------------------------------------------------------------------------------

def _with_table(plan, old: str, new: str):
    """``plan`` whose relation reads table ``new`` where it read ``old`` (swapped on the tree)."""
    tree = parse_one(f"SELECT * FROM {plan.entry.table_sql}", read="clickhouse")
    for t in tree.find_all(exp.Table):
        if f"{t.db}.{t.name}" == old:
            t.set("this", exp.to_identifier(new.split(".")[1]))
            if not t.alias:
                t.set("alias", exp.TableAlias(this=exp.to_identifier(old.split(".")[1])))
    relation = tree.args["from_"].this.this.sql("clickhouse")  # the subquery's SELECT
    return replace(plan, entry=replace(plan.entry, relation_sql=relation))


@pytest.fixture(scope="module")
def swapped(tdb):
    """An accepted join (UInt64 = UInt64) and semi-join (String IN String), then the public table
    swapped for one whose key is Float64, String or Enum8: relations no key rule has seen."""
    for name, ku, label in (("pf", "Float64", "String"), ("ps", "String", "String"), ("pe", "UInt64", "Enum8('a' = 1)")):
        tdb.command(f"CREATE TABLE tcr.{name} (kd2 Decimal(18, 2), kt9 DateTime64(9, 'UTC'), ku {ku}, kfp Float64, "
                    f"e Enum8('x' = 1, 'y' = 2), label {label}) ENGINE = MergeTree ORDER BY tuple()")
        tdb.command(f"INSERT INTO tcr.{name} SELECT kd2, kt9, ku, kfp, e, {quote('a') if name == 'pe' else 'label'} "
                    "FROM tcr.p")
        tdb.catalog.register(f"tcr.{name}", public=True)
    join = prepare(tdb, "SELECT COUNT(*) AS n FROM tcr.u JOIN tcr.p ON u.ku = p.ku", epsilon=1.0).plan
    semi = prepare(tdb, "SELECT COUNT(*) AS n FROM tcr.u WHERE ks IN (SELECT label FROM tcr.p)", epsilon=1.0).plan
    return {"join": join, "semi": semi}


@pytest.mark.parametrize("shape,table,error", [
    ("join", "tcr.pf", "NO_COMMON_TYPE"),      # UInt64 = Float64: no common type, found when the join runs
    ("join", "tcr.ps", "NO_COMMON_TYPE"),      # UInt64 = String
    ("semi", "tcr.pe", "UNKNOWN_ELEMENT_OF_ENUM"),  # String IN (SELECT Enum8): '' is no element
])
def test_probe_runs_the_real_relation(tdb, swapped, monkeypatch, shape, table, error):
    """The old probe (the relation replaced by one row of its own columns) passes these; the new
    one runs the joins on the probe tables and refuses them, with a message that names no value."""
    monkeypatch.setattr(typecheck, "_PASSED", type(typecheck._PASSED)())
    plan = _with_table(swapped[shape], "tcr.p", table)
    old = rewrite_probe(plan)
    typecheck.check_runs(tdb.backend, plan.entry, plan.bound, old.sql)  # blind to the join: passes
    before = _charges(tdb, "tcr")
    with pytest.raises(QueryRejected, match=error) as info:
        probe_db.check_before_charge(tdb, plan)
    assert "nothing was charged" in str(info.value)
    assert not any(s in str(info.value) for s in SECRETS)
    assert _charges(tdb, "tcr") == before


def test_probe_reads_only_probe_tables(tdb, swapped):
    """Every table node of the probe query is a probe table: the probe never reads a real row."""
    for plan in swapped.values():
        sql = rewrite_probe(plan, probe_db.probe_tables(tdb)).sql
        tables = list(parse_one(sql.split("\nSETTINGS ")[0], read="clickhouse").find_all(exp.Table))
        assert tables and all(t.db == probe_db.PROBE_DATABASE for t in tables), [t.sql() for t in tables]


def test_probe_refuses_a_table_outside_the_catalog(tdb, swapped):
    tdb.command("CREATE TABLE IF NOT EXISTS tcr.unregistered (ku UInt64) ENGINE = Memory")
    plan = _with_table(swapped["join"], "tcr.p", "tcr.unregistered")
    before = _charges(tdb, "tcr")
    with pytest.raises(QueryRejected, match="outside the privacy catalog"):
        probe_db.check_before_charge(tdb, plan)
    assert _charges(tdb, "tcr") == before


def test_probe_tables_copy_the_catalogued_types(tdb):
    """One row per table; every catalogued column at its type (Nullable, LowCardinality, Enum,
    Decimal, DateTime64), a Nullable one at its inner type's default (not NULL), so keys match."""
    tdb.command("CREATE TABLE tcr.types (a Nullable(UInt64), b LowCardinality(Nullable(String)), c Enum16('p' = -3, "
                "'q' = 7), d Decimal(38, 10), e DateTime64(6, 'Asia/Tokyo'), f LowCardinality(String), "
                "g Array(Nullable(Int8)), h Int32 MATERIALIZED a + 1, i Int32 ALIAS 2) ENGINE = MergeTree ORDER BY tuple()")
    entry = tdb.catalog.register("tcr.types", public=True)
    name = probe_db.ensure_probe_table(tdb.backend, entry)
    desc = tdb.backend.query_df(f"DESCRIBE TABLE {probe_db.PROBE_DATABASE}.`{name}`")
    assert dict(zip(desc["name"], desc["type"])) == dict(entry.columns)
    rows = tdb.backend.query_df(f"SELECT isNull(a) AS na, isNull(b) AS nb FROM {probe_db.PROBE_DATABASE}.`{name}`")
    assert len(rows) == 1 and not rows["na"][0] and not rows["nb"][0]


def test_schema_change_gives_a_new_probe_table_and_a_new_cache_key(tdb):
    tdb.command("CREATE TABLE tcr.evolving (id UInt64, v UInt32) ENGINE = MergeTree ORDER BY id")
    first = tdb.catalog.register("tcr.evolving", public=True)
    tdb.command("ALTER TABLE tcr.evolving MODIFY COLUMN v Float64")
    second = tdb.catalog.update("tcr.evolving")  # re-reads the schema, keeps the rest
    assert second.columns["v"] == "Float64"
    a, b = (probe_db.ensure_probe_table(tdb.backend, e) for e in (first, second))
    assert a != b  # the probe query's text (the passed-check cache's key) changes with the schema
    desc = tdb.backend.query_df(f"DESCRIBE TABLE {probe_db.PROBE_DATABASE}.`{b}`")
    assert dict(zip(desc["name"], desc["type"]))["v"] == "Float64"


def test_a_dropped_probe_table_is_made_again(tdb, swapped, monkeypatch):
    monkeypatch.setattr(typecheck, "_PASSED", type(typecheck._PASSED)())
    plan = swapped["join"]
    probe_db.check_before_charge(tdb, plan)  # the probe tables exist now
    tdb.command(f"DROP TABLE {probe_db.PROBE_DATABASE}.`{probe_db.probe_table_name(tdb.catalog.get('tcr.p'))}`")
    monkeypatch.setattr(typecheck, "_PASSED", type(typecheck._PASSED)())
    probe_db.check_before_charge(tdb, plan)  # fails once, the tables are checked again, passes


def test_the_accepted_join_still_answers(tdb):
    for name in NAMES:
        before = _charges(tdb, name)
        df = tdb.query(f"SELECT COUNT(*) AS n FROM {name}.u JOIN {name}.p ON u.ku = p.ku", epsilon=1.0)
        assert list(df.columns) == ["n"] and _charges(tdb, name) == before + 1


def test_an_emptied_probe_table_gets_its_row_back(tdb, monkeypatch):
    """A server restart empties a Memory table: the next check (after RECHECK_SECONDS) refills it."""
    entry = tdb.catalog.get("tcr.p")
    name = probe_db.ensure_probe_table(tdb.backend, entry)
    tdb.command(f"TRUNCATE TABLE {probe_db.PROBE_DATABASE}.`{name}`")
    monkeypatch.setattr(probe_db, "RECHECK_SECONDS", 0.0)
    assert probe_db.ensure_probe_table(tdb.backend, entry) == name
    n = tdb.backend.query_df(f"SELECT count() AS n FROM {probe_db.PROBE_DATABASE}.`{name}`")["n"][0]
    assert n == 1


FIDELITY = [
    "SELECT COUNT(*) AS n, SUM(q) AS s FROM {d}.li",  # two chain hops
    "SELECT tag, COUNT(*) AS n FROM {d}.u LEFT JOIN {d}.o ON u.id = o.uid GROUP BY tag",
    "SELECT COUNT(*) AS n FROM {d}.o WHERE uid IN (SELECT ku FROM {d}.p WHERE label != 'x')",
    "SELECT COUNT(*) AS n FROM {d}.li l JOIN {d}.o o ON l.l_oid = o.oid JOIN {d}.p p ON o.uid = p.ku",
    "SELECT COUNT(*) AS n FROM {d}.o WHERE oid IN (SELECT l_oid FROM {d}.li WHERE q > 1)",
    "SELECT COUNT(*) AS n FROM (SELECT uid, COUNT(*) AS k FROM {d}.o GROUP BY uid) AS x WHERE k > 1",
]


@pytest.mark.parametrize("sql", FIDELITY)
def test_probe_relation_has_the_real_relations_types(tdb, sql, monkeypatch):
    """The swap is faithful: the relation over the probe tables has exactly the column types of the
    real relation (the engine's DESCRIBE of it at resolve time), the probe passes, and the query is
    answered on D and D′ alike."""
    monkeypatch.setattr(typecheck, "_PASSED", type(typecheck._PASSED)())
    try:
        plan = prepare(tdb, sql.replace("{d}", "tcr"), epsilon=1.0).plan
    except QueryRejected as exc:  # a rule of another stage refuses the shape: nothing to compare
        pytest.skip(f"refused before the probe: {exc}")
    swapped_sql = probe_db.swap_tables(plan.entry.table_sql, probe_db.probe_tables(tdb))
    desc = tdb.backend.query_df(f"DESCRIBE TABLE (SELECT * FROM {swapped_sql})")
    assert dict(zip(desc["name"], desc["type"])) == dict(plan.entry.columns)
    probe_db.check_before_charge(tdb, plan)
    d, d_prime = (_outcome(tdb, sql, name) for name in NAMES)
    assert d[0] == "answered" and d == d_prime
