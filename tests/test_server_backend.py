"""The controller against a real ClickHouse server (the repository's Dockerfile/docker-compose image,
started with testcontainers). Skips, with the reason, where no Docker engine answers."""
from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _docker_reason() -> str | None:
    try:
        import docker
    except ImportError:
        return "the docker SDK is not installed (pip install '.[test]')"
    try:
        client = docker.from_env(timeout=5)
        client.ping()
    except Exception as exc:  # no socket, daemon down, permission denied, ...
        return f"no Docker engine is reachable ({type(exc).__name__}: {str(exc)[:120]})"
    try:
        import testcontainers  # noqa: F401
    except ImportError:
        return "testcontainers is not installed (pip install '.[test]')"
    return None


_REASON = _docker_reason()
pytestmark = pytest.mark.skipif(_REASON is not None, reason=f"server tests need Docker: {_REASON}")


@pytest.fixture(scope="module")
def server_url(tmp_path_factory):
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.image import DockerImage
    from testcontainers.core.waiting_utils import wait_for_logs

    with DockerImage(path=str(REPO), tag="dpch-clickhouse:test") as image:
        container = (DockerContainer(str(image)).with_exposed_ports(8123)
                     .with_volume_mapping(str(REPO / "clickhouse_config/config.d/dpch.xml"),
                                          "/etc/clickhouse-server/config.d/dpch.xml", "ro")
                     .with_volume_mapping(str(REPO / "clickhouse_config/users.d/dpch_users.xml"),
                                          "/etc/clickhouse-server/users.d/dpch_users.xml", "ro")
                     .with_volume_mapping(str(REPO / "clickhouse_config/udf"), "/etc/clickhouse-server/dpch/udf", "ro"))
        with container as c:
            wait_for_logs(c, "Ready for connections", timeout=120)
            yield f"http://{c.get_container_host_ip()}:{c.get_exposed_port(8123)}"


def test_query_on_server(server_url, tmp_path):
    import dpch

    db = dpch.connect(server_url, user="dpch_admin", password="change-me-admin", analyst="srv",
                      ledger_path=tmp_path / "ledger.sqlite")
    try:
        db.backend.install_sql_functions()
        db.command("CREATE DATABASE IF NOT EXISTS t_server")
        db.command("CREATE TABLE IF NOT EXISTS t_server.purchases (user_id UInt64, region String, amount Float64) "
                   "ENGINE = MergeTree ORDER BY user_id")
        db.command("INSERT INTO t_server.purchases SELECT number % 500, ['EU', 'US'][number % 2 + 1], number % 300 "
                   "FROM numbers(5000)")
        db.catalog.register("t_server.purchases", privacy_unit="user_id", bounds={"amount": (0, 500)},
                            max_rows_per_unit=10, public_keys={"region": ["EU", "US", "ASIA"]})
        db.ledger.set_budget("srv", "t_server.purchases", epsilon=10)
        df = db.query("SELECT region, COUNT(*) AS n, SUM(amount) AS s, AVG(amount) AS a FROM t_server.purchases "
                      "GROUP BY region", epsilon=1.0)
        assert sorted(df["region"]) == ["ASIA", "EU", "US"]
        assert df.attrs["dpch"]["epsilon"] == pytest.approx(1.0)
        ex = db.explain("SELECT COUNT(DISTINCT user_id) FROM t_server.purchases", epsilon=1.0)
        assert "dpch_laplace_int" in ex.sql
        with pytest.raises(dpch.QueryRejected):
            db.query("SELECT MAX(amount) FROM t_server.purchases", epsilon=1.0)
        assert db.ledger.remaining("srv", "t_server.purchases").spent.epsilon == pytest.approx(1.0)
        acc = db.accelerate("t_server.purchases", ["region"])  # per-unit projection on the server
        assert [(a.name, a.current) for a in db.accelerations("t_server.purchases")] == [(acc.name, True)]
        df = db.query("SELECT region, COUNT(*) AS n FROM t_server.purchases GROUP BY region", epsilon=1.0)
        assert sorted(df["region"]) == ["ASIA", "EU", "US"]
        assert db.drop_accelerations("t_server.purchases") == [acc.name]
    finally:
        db.close()
