"""The two-phase SQL of a Distributed table sharded by the unit (dpch.rewrite.shards) computes what
the single-node rewrite computes, on the real engine (issue 32, item 3).

Emulation: N shards (3; DPCH_SHARDS overrides), each a separate chDB store in its own process
(tests/shard_worker.py; chDB holds one store per process) holding the rows of its hash range
(``cityHash64(user_id) % N``: the declared sharding key, as a Distributed table places them). Each
shard runs ``shard_sql`` over its local table and writes its partial aggregate states in Native
format (which keeps AggregateFunction columns); the initiator (this process's engine) reads every
shard's file and runs ``initiator_sql`` with the noise off. The result must equal, row for row and
value for value, ``rewrite_for_sensitivity_check`` (the single-node rewrite, noise off) over the
whole table. Deterministic data, exact equality: the released values are computed from the same
Int64 sums. `make test` runs every fourth query of tests/corpus/accepted.sql (the corpus is ordered
by table and path, so the stride reaches every table) and a list of option variants the corpus does
not reach (k > 1, weighted selection, peeling top-n, bounded Laplace, per-query keys);
DPCH_SHARD_EQUIVALENCE_LONG=1 runs the whole corpus, and 2 and 5 shards as well.

The test has power: the same shards also hold the rows split by a key that is NOT the unit
(``cityHash64(category)``), and there the two-phase SQL must give a different answer (a unit whose
rows are on several shards is bounded once per shard).

This checks the rewrite's SQL, not a runtime: production runs the same shard query on every shard
through ``cluster(..., view(...))`` (``cluster_rewrite``), which this engine (no cluster) cannot.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dpch.backends import Formatted
from dpch.catalog import DistributedSpec, TableEntry, quote_string
from dpch.controller import prepare
from dpch.errors import DPCHError
from dpch.rewrite import rewrite_for_sensitivity_check
from dpch.rewrite.shards import cluster_rewrite, initiator_sql, placement, shard_sql, two_phase
from test_controller_fixtures import DB, setup_controller_data

CORPUS = Path(__file__).parent / "corpus" / "accepted.sql"
TABLES = ("purchases", "events", "rowlevel", "subst", "onerow")
KEY = "cityHash64(user_id)"
# option variants the corpus does not reach (each is a path of the per-unit or release stages)
VARIANTS = [
    (f"SELECT category, COUNT(*) AS n, AVG(amount) AS a FROM {DB}.events GROUP BY category",
     {"selection": "weighted_gaussian"}),
    (f"SELECT category, COUNT(*) AS n FROM {DB}.events GROUP BY category ORDER BY n DESC LIMIT 3",
     {"top_k": "peeling"}),
    (f"SELECT region, SUM(amount) AS s FROM {DB}.events GROUP BY region ORDER BY s DESC LIMIT 2",
     {"top_k": "peeling", "keys": {"region": ["EU", "US", "ASIA"]}}),
    (f"SELECT category, COUNT(*) AS n FROM {DB}.purchases GROUP BY category",
     {"max_groups_contributed": 4, "max_rows_per_group": 2}),
    (f"SELECT region, category, SUM(qty) AS q FROM {DB}.events GROUP BY region, category",
     {"keys": {"region": ["EU", "US"], "category": ["c1", "c2", "c3"]}}),
    (f"SELECT region, COUNT(*) AS n, SUM(amount) AS s, AVG(age) AS a FROM {DB}.purchases GROUP BY region",
     {"mechanism": "bounded_laplace", "output_range": (0, 100000)}),
    (f"SELECT region, quantile(0.3)(age) AS q, COUNT(DISTINCT category) AS c FROM {DB}.events GROUP BY region",
     {"keys": {"region": ["EU", "US", "ASIA", "MARS"]}}),
    (f"SELECT COUNT(*) AS n, SUM(amount) AS s FROM {DB}.events WHERE amount > 1000", {}),
    (f"SELECT region, COUNT(*) AS n FROM {DB}.events WHERE amount > 1000 GROUP BY region", {}),
]


LONG = bool(os.environ.get("DPCH_SHARD_EQUIVALENCE_LONG"))
# the negative control: rows split by a key that is not the unit
CONTROL = f"SELECT region, COUNT(*) AS n, SUM(amount) AS s FROM {DB}.purchases GROUP BY region"
NOT_UNIT_KEY = "cityHash64(category)"


def _queries() -> list[tuple[str, float, dict]]:
    out = []
    for line in CORPUS.read_text().splitlines():
        if line.strip() and not line.startswith("--"):
            sql, _, opt = line.partition(" -- ")
            out.append((sql.strip(), 0.0 if opt.strip() == "delta=0" else 1e-6, {}))
    return (out if LONG else out[::4]) + [(sql, 1e-6, opts) for sql, opts in VARIANTS]


def _distributed(plan, suffix: str = "_local"):
    """The plan on the same table declared Distributed, sharded by the unit (its local table on
    every shard: <table><suffix>); the salt, hence every hash, is the entry's."""
    spec = DistributedSpec(cluster="dpch", local_table=f"{plan.entry.table}{suffix}", sharding_key=KEY)
    return dataclasses.replace(plan, entry=dataclasses.replace(plan.entry, distributed=spec))


def _norm(v):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    if hasattr(v, "tolist"):
        v = v.tolist()
    if isinstance(v, (list, tuple)):
        return tuple(_norm(x) for x in v)
    return v if isinstance(v, (int, float, str, bool)) else str(v)


def _table(df) -> tuple[list, list[tuple]]:
    """(column names, rows) of a result."""
    return list(df.columns), [tuple(_norm(v) for v in row) for row in df.itertuples(index=False)]


def _start_shards(db, plans: dict, n: int, work: Path) -> list[subprocess.Popen]:
    """Every shard's partial states of every plan, into WORK: one worker process per shard, all
    started at once (wait for them with ``_wait``)."""
    procs = []
    for i in range(n):
        tables = []
        for t, suffix, key in [(t, "_local", KEY) for t in TABLES] + [("purchases", "_by_category", NOT_UNIT_KEY)]:
            data = work / f"{t}{suffix}.s{i}.rows.native"
            data.write_bytes(db.backend.query_formatted(
                f"SELECT * FROM {DB}.{t} WHERE {key} % {n} = {i}", "Native").body)
            tables.append([f"{DB}.{t}{suffix}", str(data)])
        queries = []
        for name, plan in plans.items():
            sql = shard_sql(plan)
            queries.append([name, sql, sql.rsplit("\nSETTINGS ", 1)[0]])
        job = work / f"job{i}.json"
        job.write_text(json.dumps({"store": str(work / f"store{i}"), "tables": tables, "queries": queries,
                                   "out": str(work), "shard": i}))
        procs.append(subprocess.Popen([sys.executable, str(Path(__file__).parent / "shard_worker.py"), str(job)],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    return procs


def _wait(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        out, _ = p.communicate(timeout=600)
        assert p.returncode == 0, out.decode()[-2000:]


def _check(db, tmp_path: Path, n: int) -> int:
    setup_controller_data(db)
    plans = {}
    for j, (sql, delta, opts) in enumerate(_queries()):
        try:
            plan = prepare(db, sql, epsilon=1.0, delta=delta, **opts).plan
        except DPCHError as exc:
            raise AssertionError(f"{sql}: no longer accepted ({exc})") from None
        if type(plan.entry) is TableEntry:  # a single catalogued table (all of these are)
            plans[f"q{j}"] = _distributed(plan)
    assert all(two_phase(p) for p in plans.values())
    plans["control"] = _distributed(prepare(db, CONTROL, epsilon=1.0, delta=1e-6).plan, "_by_category")
    procs = _start_shards(db, plans, n, tmp_path)
    # the single-node answers while the shards work
    single = {name: _table(db.backend.query_df(rewrite_for_sensitivity_check(plan).sql)) for name, plan in plans.items()}
    _wait(procs)
    sqls = dict(((f"q{j}", s) for j, (s, _, _) in enumerate(_queries())), control=CONTROL)
    results = {}
    for name, plan in plans.items():
        errors = sorted(tmp_path.glob(f"{name}.s*.error"))
        assert not errors, f"{sqls[name]}: shard error {errors[0].read_text()[:500]}"
        structure = (tmp_path / f"{name}.structure").read_text()
        partials = f"file({quote_string(str(tmp_path / f'{name}.s*.native'))}, 'Native', {quote_string(structure)})"
        results[name] = (_table(db.backend.query_df(initiator_sql(plan, partials, noise=False))), single[name])
    control = results.pop("control")
    assert control[0] != control[1], "rows split by a key that is not the unit must change the answer"
    for name, (merged, single) in results.items():
        assert merged == single, sqls[name]
    return len(results)


def test_two_phase_equals_single_node(db, tmp_path):
    count = _check(db, tmp_path, int(os.environ.get("DPCH_SHARDS", "3")))
    assert count == len(_queries())  # every query is accepted, on one table, and runs in two phases


@pytest.mark.skipif(not LONG, reason="long run: DPCH_SHARD_EQUIVALENCE_LONG=1")
@pytest.mark.parametrize("n", [2, 5])
def test_two_phase_equals_single_node_other_shard_counts(db, tmp_path, n):
    _check(db, tmp_path, n)


# -- the catalog, explain and the production query ----------------------------------------------

class _DistributedEngine:
    """The test engine, except that system.tables reports ``engine_full`` as the engine of table
    ``t_shard.p`` (chDB has no cluster to hold a real Distributed table)."""

    def __init__(self, backend, engine_full: str):
        self.backend, self.engine_full = backend, engine_full

    def query_formatted(self, sql: str, fmt: str):
        if sql.startswith("SELECT engine, engine_full FROM system.tables") and "'p'" in sql:
            assert fmt == "JSONEachRow", fmt  # the catalog reads metadata through dpch.backends.query_records
            row = {"engine": "Distributed", "engine_full": self.engine_full}
            return Formatted(json.dumps(row).encode() + b"\n", 1)
        return self.backend.query_formatted(sql, fmt)

    def __getattr__(self, name):
        return getattr(self.backend, name)


SPEC = {"cluster": "dpch", "local_table": "t_shard.p_local", "sharding_key": "cityHash64(user_id)"}


@pytest.fixture(scope="module")
def sdb(db):
    db.command("CREATE DATABASE IF NOT EXISTS t_shard")
    for t in ("p", "p_local"):
        db.command(f"DROP TABLE IF EXISTS t_shard.{t}")
        db.command(f"CREATE TABLE t_shard.{t} (user_id UInt64, region String, amount Float64) ENGINE = MergeTree "
                   "ORDER BY user_id")
        db.command(f"INSERT INTO t_shard.{t} SELECT number % 200, ['EU', 'US'][number % 2 + 1], number % 90 "
                   "FROM numbers(3000)")
    db.ledger.set_budget("tester", "t_shard.p", epsilon=1e6, delta=0.5)
    return db


def _register(db, engine_full: str, **spec):
    from dpch.catalog import Catalog

    entry = Catalog(_DistributedEngine(db.backend, engine_full)).register(
        "t_shard.p", privacy_unit="user_id", bounds={"amount": (0, 100)}, max_rows_per_unit=5,
        public_keys={"region": ["EU", "US", "ASIA"]}, distributed={**SPEC, **spec}, replace=True)
    db.catalog.refresh()
    return entry


def test_catalog_checks_the_declared_distributed_table(sdb):
    from dpch.errors import CatalogError

    with pytest.raises(CatalogError, match="is not a Distributed table"):
        sdb.catalog.register("t_shard.p", privacy_unit="user_id", distributed=SPEC, replace=True)
    engine = "Distributed('dpch', 't_shard', 'p_local', cityHash64(user_id))"
    with pytest.raises(CatalogError, match="differs from its Distributed engine definition"):
        _register(sdb, engine, sharding_key="cityHash64(region)")
    with pytest.raises(CatalogError, match="differs"):
        _register(sdb, engine, local_table="t_shard.other")
    with pytest.raises(CatalogError, match="not registered columns"):
        _register(sdb, engine, sharding_key="cityHash64(nope)")
    with pytest.raises(CatalogError, match="distributed must be"):
        _register(sdb, engine, cluster="")
    entry = _register(sdb, engine, sharding_key="cityHash64( user_id )")  # the same expression
    assert entry.shards_by_unit and sdb.catalog.get("t_shard.p").distributed == entry.distributed
    assert "by unit: two-phase" in entry.describe()
    # keys that are not a function of the unit alone: accepted, one global query
    for key in ("cityHash64(region)", "cityHash64(user_id, region)", "cityHash64(user_id) + rand()", "rand()"):
        entry = _register(sdb, f"Distributed('dpch', 't_shard', 'p_local', {key})", sharding_key=key)
        assert entry.distributed is not None and not entry.shards_by_unit, key


def test_explain_and_the_cluster_query(sdb):
    from dpch.rewrite import _Rewriter

    sql = "SELECT region, COUNT(*) AS n, SUM(amount) AS s FROM t_shard.p GROUP BY region"
    _register(sdb, "Distributed('dpch', 't_shard', 'p_local', cityHash64(region))", sharding_key="cityHash64(region)")
    explained = sdb.explain(sql, epsilon=1.0, delta=1e-6)
    assert "per-unit stage is global" in str(explained) and "cluster(" not in explained.sql
    plan = prepare(sdb, sql, epsilon=1.0, delta=1e-6).plan
    assert not two_phase(plan)  # the single-node query, unchanged, over the Distributed table
    assert prepare(sdb, sql, epsilon=1.0, delta=1e-6).rewritten.sql == _Rewriter(
        plan, noise=True, selection=True, table=None).build().sql

    _register(sdb, "Distributed('dpch', 't_shard', 'p_local', cityHash64(user_id))")
    explained = sdb.explain(sql, epsilon=1.0, delta=1e-6)
    assert "cluster: two-phase on cluster dpch" in str(explained)
    assert "cluster('dpch', view(" in explained.sql and "<secret salt>" in explained.sql
    prepared = prepare(sdb, sql, epsilon=1.0, delta=1e-6)
    assert two_phase(prepared.plan) and prepared.rewritten.sql == cluster_rewrite(prepared.plan).sql
    assert "two-phase" in placement(prepared.plan.entry)
    shard = shard_sql(prepared.plan)
    assert "dpch_" not in shard and "`p_local`" in shard  # no UDF on a shard; the local table
    assert "dpch_laplace_int" in prepared.rewritten.sql.split("cluster('dpch'")[0]  # noise on the initiator
    # the production query on the real engine: one local "shard" through remote() (chDB has no cluster)
    local = prepared.rewritten.sql.replace("cluster('dpch', view(", "remote('127.0.0.1', view(")
    noisy = sdb.backend.query_df(local)
    reference = sdb.backend.query_df(rewrite_for_sensitivity_check(prepared.plan).sql)
    assert list(noisy.columns) == list(reference.columns) and len(noisy) == 3  # every public key
    assert sorted(noisy["region"]) == ["ASIA", "EU", "US"]
