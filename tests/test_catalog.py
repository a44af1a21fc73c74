"""The privacy catalog: registration, validation, persistence in the engine, salt secrecy."""
from __future__ import annotations

import pytest

from dpch.catalog import META_TABLE, Catalog
from dpch.errors import CatalogError

DB = "t_catalog"


@pytest.fixture(scope="module")
def cat(db):
    db.command(f"CREATE DATABASE IF NOT EXISTS {DB}")
    db.command(f"CREATE TABLE IF NOT EXISTS {DB}.sales (uid UInt64, region String, amount Float64, "
               "n Nullable(Int32), d Date) ENGINE = MergeTree ORDER BY uid")
    return db.catalog


def test_register_get_list_drop(cat):
    e = cat.register(f"{DB}.sales", privacy_unit="uid", bounds={"amount": (0, 500)}, max_groups_contributed=2,
                     max_rows_per_unit=10, max_rows_per_group=4, public_keys={"region": ["EU", "US", "EU"]})
    assert e.table == f"{DB}.sales" and e.privacy_unit == "uid" and e.neighbour == "add_remove"
    assert e.bounds["amount"] == (0.0, 500.0)
    assert e.public_keys["region"] == ("EU", "US")  # de-duplicated, order kept
    assert e.max_groups_contributed == 2 and e.max_rows_per_unit == 10 and e.rows_per_group == 4
    assert set(e.columns) == {"uid", "region", "amount", "n", "d"} and e.columns["n"] == "Nullable(Int32)"
    assert cat.get(f"{DB}.sales").bounds == e.bounds
    assert f"{DB}.sales" in cat and f"{DB}.sales" in [x.table for x in cat.list()]
    cat.drop(f"{DB}.sales")
    assert f"{DB}.sales" not in cat
    with pytest.raises(CatalogError, match="not in the privacy catalog"):
        cat.get(f"{DB}.sales")


def test_persisted_in_the_engine(cat, db):
    cat.register(f"{DB}.sales", privacy_unit="uid", bounds={"amount": (1, 2)})
    fresh = Catalog(db.backend)
    fresh.refresh()  # drop the shared cache: read back from dpch_meta.catalog
    assert fresh.get(f"{DB}.sales").bounds["amount"] == (1.0, 2.0)
    rows = db.raw_query(f"SELECT count() AS c FROM {META_TABLE} WHERE table_name = '{DB}.sales'")
    assert int(rows["c"].iloc[0]) >= 1


def test_a_write_is_newer_than_every_stored_version_even_with_the_clock_behind(cat, db):
    """The version of a write is the clock in ns unless the table already has a later one (a clock
    set back, another host ahead): then one above it, so the write still wins argMax on reload."""
    table = f"{DB}.clock"
    db.command(f"CREATE TABLE IF NOT EXISTS {table} (uid UInt64, amount Float64) ENGINE = MergeTree ORDER BY uid")
    cat.register(table, privacy_unit="uid", bounds={"amount": (0, 1)}, replace=True)
    ahead = 2 ** 63  # far beyond any clock
    db.command(f"INSERT INTO {META_TABLE} (table_name, version, deleted, spec, salt) SELECT table_name, {ahead}, "
               f"deleted, spec, salt FROM {META_TABLE} WHERE table_name = '{table}' ORDER BY version DESC LIMIT 1")
    cat.update(table, bounds={"amount": (0, 2)})
    versions = db.raw_query(f"SELECT version FROM {META_TABLE} WHERE table_name = '{table}' ORDER BY version")
    assert [int(v) for v in versions["version"]][-2:] == [ahead, ahead + 1]
    fresh = Catalog(db.backend)
    fresh.refresh()
    assert fresh.get(table).bounds["amount"] == (0.0, 2.0)
    cat.drop(table)
    fresh.refresh()
    assert table not in fresh


def test_salt_is_secret_and_stable(cat):
    e1 = cat.register(f"{DB}.sales", privacy_unit="uid", replace=True)
    assert len(e1.salt) == 32 and e1.salt not in repr(e1) and e1.salt not in str(e1.to_dict())
    assert e1.salt not in e1.describe()
    e2 = cat.register(f"{DB}.sales", privacy_unit="uid", bounds={"amount": (0, 1)}, replace=True)
    assert e2.salt == e1.salt  # re-registration keeps the salt
    e3 = cat.register(f"{DB}.sales", privacy_unit="uid", bounds={"amount": (0, 1)}, rotate_salt=True)
    assert e3.salt != e1.salt


def test_columns_restriction_and_row_level(cat):
    e = cat.register(f"{DB}.sales", columns=["region", "amount"], bounds={"amount": (0, 10)}, replace=True)
    assert e.row_level and set(e.columns) == {"region", "amount"}
    assert e.max_groups_contributed == 1 and e.max_rows_per_unit == 1


@pytest.mark.parametrize("kwargs,match", [
    (dict(privacy_unit="nope"), "privacy unit column"),
    (dict(privacy_unit="uid", neighbour="swap"), "neighbour must be one of"),
    (dict(privacy_unit="uid", bounds={"region": (0, 1)}), "not numeric"),
    (dict(privacy_unit="uid", bounds={"missing": (0, 1)}), "not a registered column"),
    (dict(privacy_unit="uid", bounds={"amount": (5, 1)}), "lower bound must not exceed"),
    (dict(privacy_unit="uid", bounds={"amount": (0, float("inf"))}), "finite"),
    (dict(privacy_unit="uid", bounds={"amount": (0,)}), "pair"),
    (dict(privacy_unit="uid", bounds={"amount": (0, 1e299)}), r"at most 2\^900"),
    (dict(privacy_unit="uid", bounds={"amount": (-1e300, 0)}), r"at most 2\^900"),
    (dict(privacy_unit="uid", max_groups_contributed=0), "max_groups_contributed"),
    (dict(privacy_unit="uid", max_rows_per_unit=1.5), "max_rows_per_unit"),
    (dict(privacy_unit="uid", max_rows_per_group=-1), "max_rows_per_group"),
    (dict(max_groups_contributed=2), "row-level table"),
    (dict(privacy_unit="uid", public_keys={"region": []}), "must not be empty"),
    (dict(privacy_unit="uid", public_keys={"region": "EU"}), "not a string"),
    (dict(privacy_unit="uid", public_keys={"uid": [1]}), "privacy unit column cannot"),
    (dict(privacy_unit="uid", public_keys={"region": [object()]}), "public key values"),
    (dict(privacy_unit="uid", columns=["nope"]), "not a column"),
])
def test_register_validation(cat, kwargs, match):
    with pytest.raises(CatalogError, match=match):
        cat.register(f"{DB}.sales", **kwargs)


def test_unknown_table_and_bad_names(cat):
    with pytest.raises(CatalogError, match="does not exist"):
        cat.register(f"{DB}.nosuch", privacy_unit="uid")
    with pytest.raises(CatalogError, match="invalid table name"):
        cat.register("a.b.c")
    with pytest.raises(CatalogError, match="invalid table name"):
        cat.get("x; DROP TABLE y")


def test_unqualified_names_use_the_default_database(cat, db):
    db.command("CREATE TABLE IF NOT EXISTS default.t_catalog_plain (u UInt64) ENGINE = Memory")
    e = cat.register("t_catalog_plain", privacy_unit="u")
    assert e.table == "default.t_catalog_plain" and "default.t_catalog_plain" in cat
    cat.drop("t_catalog_plain")


def test_own_writes_update_the_cached_catalog_without_a_reload(cat, db, monkeypatch):
    """A write patches this process's cached catalog (a reload reads every version ever written):
    register, update and drop are seen at once, with no read of dpch_meta.catalog, and the cache
    equals what a reload from the engine gives."""
    cat.get(f"{DB}.sales") if f"{DB}.sales" in cat else None  # the cache is warm
    reads = []
    real = db.backend.query_formatted  # the catalog's reads: dpch.backends.query_records

    def spy(sql, *a, **kw):
        if "argMax(spec, version)" in sql:
            reads.append(sql)
        return real(sql, *a, **kw)

    monkeypatch.setattr(db.backend, "query_formatted", spy)
    cat.register(f"{DB}.sales", privacy_unit="uid", bounds={"amount": (0, 7)}, replace=True)
    assert cat.get(f"{DB}.sales").bounds["amount"] == (0.0, 7.0)
    cat.update(f"{DB}.sales", bounds={"amount": (0, 9)})
    cached = cat.get(f"{DB}.sales")
    assert cached.bounds["amount"] == (0.0, 9.0)
    assert reads == []
    reloaded = Catalog(db.backend)
    reloaded.refresh()
    again = reloaded.get(f"{DB}.sales")
    assert (again.to_dict(), again.salt, again.version) == (cached.to_dict(), cached.salt, cached.version)
    assert len(reads) == 1
    cat.drop(f"{DB}.sales")
    assert f"{DB}.sales" not in cat and len(reads) == 1
