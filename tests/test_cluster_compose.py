"""The cluster of docker-compose.yml (profile "cluster": 2 shards x 2 replicas, ClickHouse Keeper,
the UDF config on every node) answers as the embedded engine does (issue 32). Started with
testcontainers where a Docker engine answers; skipped, with the reason, where none does (these
development machines have none: DESIGN.md, "Facts checked here").

On the cluster: a ReplicatedMergeTree local table ON CLUSTER and a Distributed table over it,
sharded by cityHash64(user_id), registered with its cluster, local table and key; the corpus queries
on it run two-phase (dpch.rewrite.shards.cluster_rewrite) with the noise on, and with the noise off
(the initiator query over cluster(..., view(shard query))) they equal the single-node rewrite over
the same rows in the embedded engine."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from test_server_backend import _REASON as _DOCKER_REASON

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(_DOCKER_REASON is not None,
                                reason=f"the cluster test needs Docker (compose): {_DOCKER_REASON}")

QUERIES = [
    "SELECT region, COUNT(*) AS n, SUM(amount) AS s FROM t_cluster.purchases GROUP BY region",
    "SELECT COUNT(*) AS n, AVG(age) AS a FROM t_cluster.purchases",
    "SELECT category, COUNT(DISTINCT user_id) AS u FROM t_cluster.purchases GROUP BY category",
    "SELECT region, median(amount) AS m FROM t_cluster.purchases GROUP BY region",
]
ROWS = ("SELECT number % 500 AS user_id, ['EU', 'US', 'ASIA'][number % 3 + 1] AS region, "
        "concat('c', toString(number % 17)) AS category, toFloat64(number % 700) AS amount, "
        "toUInt8(18 + number % 70) AS age FROM numbers(20000)")
SCHEMA = "(user_id UInt64, region String, category String, amount Float64, age UInt8)"


@pytest.fixture(scope="module")
def cluster_url():
    from testcontainers.compose import DockerCompose

    os.environ.setdefault("DPCH_CLUSTER_SECRET", "test-cluster-secret")
    with DockerCompose(str(REPO), profiles=["cluster"], build=True, wait=True) as compose:
        host = compose.get_service_host("ch-s1r1", 8123)
        port = compose.get_service_port("ch-s1r1", 8123)
        yield f"http://{host}:{port}"


def test_cluster_answers_as_the_embedded_engine(cluster_url, db, tmp_path):
    import dpch
    from dpch.controller import prepare
    from dpch.rewrite import rewrite_for_sensitivity_check
    from dpch.rewrite.shards import initiator_sql, shard_sql, two_phase

    srv = dpch.connect(cluster_url, user="dpch_admin", password="change-me-admin", analyst="cluster",
                       ledger_path=tmp_path / "ledger.sqlite")
    try:
        srv.command("CREATE DATABASE IF NOT EXISTS t_cluster ON CLUSTER dpch")
        srv.command(f"CREATE TABLE IF NOT EXISTS t_cluster.purchases_local ON CLUSTER dpch {SCHEMA} "
                    "ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/t_cluster/purchases', '{replica}') "
                    "ORDER BY user_id")
        srv.command("CREATE TABLE IF NOT EXISTS t_cluster.purchases ON CLUSTER dpch AS t_cluster.purchases_local "
                    "ENGINE = Distributed('dpch', 't_cluster', 'purchases_local', cityHash64(user_id))")
        srv.command(f"INSERT INTO t_cluster.purchases SETTINGS insert_distributed_sync = 1 {ROWS}")
        srv.catalog.register("t_cluster.purchases", privacy_unit="user_id", bounds={"amount": (0, 500), "age": (18, 100)},
                             max_groups_contributed=1, max_rows_per_unit=10,
                             distributed={"cluster": "dpch", "local_table": "t_cluster.purchases_local",
                                          "sharding_key": "cityHash64(user_id)"})
        srv.ledger.set_budget("cluster", "t_cluster.purchases", epsilon=100, delta=1e-3)
        db.command("CREATE DATABASE IF NOT EXISTS t_cluster")
        db.command(f"CREATE TABLE IF NOT EXISTS t_cluster.purchases {SCHEMA} ENGINE = MergeTree ORDER BY user_id")
        db.command(f"INSERT INTO t_cluster.purchases {ROWS}")
        for sql in QUERIES:
            explained = str(srv.explain(sql, epsilon=1.0, delta=1e-6))
            assert "two-phase on cluster dpch" in explained
            answer = srv.query(sql, epsilon=1.0, delta=1e-6)  # noise on, on the initiator
            assert len(answer) > 0
            plan = prepare(srv, sql, epsilon=1.0, delta=1e-6).plan
            assert two_phase(plan)
            partials = f"cluster('dpch', view({shard_sql(plan).rsplit(chr(10) + 'SETTINGS ', 1)[0]}))"
            merged = srv.backend.query_df(initiator_sql(plan, partials, noise=False))
            local = dataclasses.replace(plan, entry=dataclasses.replace(plan.entry, distributed=None))
            single = db.backend.query_df(rewrite_for_sensitivity_check(local).sql)
            assert merged.astype(str).values.tolist() == single.astype(str).values.tolist(), sql
    finally:
        srv.close()
