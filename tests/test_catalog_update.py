"""A catalog that cannot be downgraded by accident (issue 29, item 5): a register call on a
registered table is refused unless it repeats the entry or says replace=True; ``update`` changes
only what it names; the unit of a dataset with charges on record cannot change; the error that
asks for bounds shows ``update``, and doing what it shows works."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dpch.errors import CatalogError, QueryRejected

DB = "t_catalog_update"
T = f"{DB}.orders"
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def cdb(db):
    db.command(f"CREATE DATABASE IF NOT EXISTS {DB}")
    db.command(f"DROP TABLE IF EXISTS {T}")
    db.command(f"CREATE TABLE {T} (user_id UInt64, country String, amount Float64, minutes Float64) "
               "ENGINE = MergeTree ORDER BY user_id")
    db.command(f"INSERT INTO {T} SELECT number % 50, ['CA', 'US'][1 + number % 2], number % 100, number % 90 "
               "FROM numbers(500)")
    if T in db.catalog:
        db.catalog.drop(T)
    db.catalog.register(T, privacy_unit="user_id", bounds={"amount": (0, 100)}, max_rows_per_unit=10,
                        public_keys={"country": ["CA", "US"]})
    for analyst in {a.analyst for a in db.ledger.budgets() if a.dataset == T}:
        db.ledger.reset(analyst, T, confirm=True)
    return db


def test_register_again_with_the_same_entry_changes_nothing(cdb):
    before = cdb.catalog.get(T)
    again = cdb.catalog.register(T, privacy_unit="user_id", bounds={"amount": (0, 100)}, max_rows_per_unit=10,
                                 public_keys={"country": ["CA", "US"]})
    assert again.version == before.version and again.salt == before.salt


def test_a_different_register_is_refused_and_changes_nothing(cdb):
    before = cdb.catalog.get(T)
    with pytest.raises(CatalogError, match=r"update\(") as info:
        cdb.catalog.register(T, bounds={"minutes": (0, 120)})  # what the old "needs bounds" message showed
    msg = str(info.value)
    assert "privacy_unit" in msg and "bounds" in msg and "public_keys" in msg and "replace=True" in msg
    after = cdb.catalog.get(T)
    assert after.to_dict() == before.to_dict() and after.version == before.version


def test_update_changes_only_what_it_names(cdb):
    before = cdb.catalog.get(T)
    after = cdb.catalog.update(T, bounds={"minutes": (0, 120)})
    assert after.privacy_unit == "user_id" and after.max_rows_per_unit == 10
    assert dict(after.bounds) == {"amount": (0.0, 100.0), "minutes": (0.0, 120.0)}
    assert dict(after.public_keys) == dict(before.public_keys) and after.salt == before.salt
    after = cdb.catalog.update(T, bounds={"amount": None}, max_rows_per_unit=20, public_keys={"country": None})
    assert dict(after.bounds) == {"minutes": (0.0, 120.0)} and after.max_rows_per_unit == 20
    assert dict(after.public_keys) == {} and after.privacy_unit == "user_id"
    with pytest.raises(CatalogError, match="unknown argument"):
        cdb.catalog.update(T, privacy_units="x")


def test_replace_true_replaces_the_whole_entry(cdb):
    entry = cdb.catalog.register(T, privacy_unit="user_id", bounds={"minutes": (0, 120)}, replace=True)
    assert dict(entry.bounds) == {"minutes": (0.0, 120.0)} and dict(entry.public_keys) == {}


def test_the_needs_bounds_message_shows_update_and_it_works(cdb):
    cdb.ledger.set_budget(cdb.analyst, T, epsilon=10.0)
    sql = f"SELECT AVG(minutes) AS m FROM {T}"
    with pytest.raises(QueryRejected, match=r"db\.catalog\.update\(") as info:
        cdb.query(sql, epsilon=0.5)
    assert "register(" not in str(info.value)
    cdb.catalog.update(T, bounds={"minutes": (0, 120)})
    out = cdb.query(sql, epsilon=0.5)
    assert len(out) == 1
    entry = cdb.catalog.get(T)
    assert entry.privacy_unit == "user_id" and "amount" in entry.bounds  # nothing was downgraded


def test_the_unit_of_a_dataset_with_charges_cannot_change(cdb):
    cdb.ledger.set_budget(cdb.analyst, T, epsilon=10.0)
    cdb.query(f"SELECT COUNT(*) AS n FROM {T}", epsilon=0.5)
    for change in ({"privacy_unit": None, "max_rows_per_unit": 1}, {"neighbour": "substitute"}):
        with pytest.raises(CatalogError, match="charge"):
            cdb.catalog.update(T, **change)
        assert cdb.catalog.get(T).privacy_unit == "user_id"
    with pytest.raises(CatalogError, match="charge"):
        cdb.catalog.register(T, bounds={"amount": (0, 100)}, replace=True)  # row level, with replace
    # bounds and contribution limits may change: answers stay accounted under the same unit
    assert cdb.catalog.update(T, max_rows_per_unit=5).max_rows_per_unit == 5
    cdb.ledger.reset(cdb.analyst, T, confirm=True)
    assert cdb.catalog.update(T, neighbour="substitute").neighbour == "substitute"


def test_cli_update_and_register_replace(tmp_path):
    data = tmp_path / "data"
    setup = ("import dpch\n"
             f"db = dpch.connect({str(data)!r})\n"
             "db.command('CREATE DATABASE IF NOT EXISTS c')\n"
             "db.command('CREATE TABLE c.t (u UInt64, x Float64, y Float64) ENGINE = MergeTree ORDER BY u')\n"
             "db.catalog.register('c.t', privacy_unit='u', bounds={'x': (0, 1)}, max_rows_per_unit=3)\n"
             "db.close()\n")
    subprocess.run([sys.executable, "-c", setup], check=True, cwd=ROOT, timeout=120)

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "dpch.cli", "catalog", *args, "--data-dir", str(data)],
                              capture_output=True, text=True, cwd=ROOT, timeout=120)

    r = cli("register", "c.t", "--bounds", "y=0:5")
    assert r.returncode != 0 and "dpch catalog update" in r.stderr + r.stdout
    r = cli("update", "c.t", "--bounds", "y=0:5", "--max-rows", "4")
    assert r.returncode == 0, r.stderr
    r = cli("show", "c.t", "--json")
    import json

    spec = json.loads(r.stdout)
    assert spec["privacy_unit"] == "u" and spec["max_rows_per_unit"] == 4
    assert spec["bounds"] == {"x": [0.0, 1.0], "y": [0.0, 5.0]}
    r = cli("register", "c.t", "--privacy-unit", "u", "--replace")
    assert r.returncode == 0, r.stderr
    assert json.loads(cli("show", "c.t", "--json").stdout)["bounds"] == {}
