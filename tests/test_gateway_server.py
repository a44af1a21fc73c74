"""The gateway in front of a locked-down ClickHouse server (issue 12, "server lockdown"): the
repository's image with clickhouse_config/users.d/dpch_gateway.xml, started with testcontainers,
and `dpch serve --backend` against it. Skips, with the reason, where no Docker engine answers.

A test-only administrator (users.d/zz_test_admin.xml, written here) creates the data; the
lockdown file itself removes `default` and gives the gateway's user read access to the protected
database only (plus the catalog database)."""
from __future__ import annotations

import hashlib
import subprocess
import sys
import time

import pytest

from test_server_backend import _REASON, REPO  # the same Docker availability check

pytestmark = pytest.mark.skipif(_REASON is not None, reason=f"server tests need Docker: {_REASON}")

GATEWAY_PASSWORD = "change-me-gateway"  # the sha256 in dpch_gateway.xml
ADMIN_PASSWORD = "test-admin-only"


def _admin_xml() -> str:
    digest = hashlib.sha256(ADMIN_PASSWORD.encode()).hexdigest()
    return (f"<clickhouse><users><test_admin><password_sha256_hex>{digest}</password_sha256_hex>"
            "<networks><ip>::/0</ip></networks><profile>default</profile><quota>default</quota>"
            "<access_management>1</access_management></test_admin></users></clickhouse>")


@pytest.fixture(scope="module")
def locked_server(tmp_path_factory):
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.image import DockerImage
    from testcontainers.core.waiting_utils import wait_for_logs

    admin = tmp_path_factory.mktemp("admin") / "zz_test_admin.xml"
    admin.write_text(_admin_xml())
    cfg = REPO / "clickhouse_config"
    with DockerImage(path=str(REPO), tag="dpch-clickhouse:test") as image:
        container = (DockerContainer(str(image)).with_exposed_ports(8123)
                     .with_volume_mapping(str(cfg / "config.d/dpch.xml"), "/etc/clickhouse-server/config.d/dpch.xml", "ro")
                     .with_volume_mapping(str(cfg / "users.d/dpch_gateway.xml"),
                                          "/etc/clickhouse-server/users.d/dpch_gateway.xml", "ro")
                     .with_volume_mapping(str(admin), "/etc/clickhouse-server/users.d/zz_test_admin.xml", "ro")
                     .with_volume_mapping(str(cfg / "udf"), "/etc/clickhouse-server/dpch/udf", "ro"))
        with container as c:
            wait_for_logs(c, "Ready for connections", timeout=120)
            host, port = c.get_container_host_ip(), int(c.get_exposed_port(8123))
            import clickhouse_connect

            admin_client = clickhouse_connect.get_client(host=host, port=port, username="test_admin",
                                                         password=ADMIN_PASSWORD)
            admin_client.command("CREATE DATABASE IF NOT EXISTS demo")
            admin_client.command("CREATE TABLE IF NOT EXISTS demo.purchases (user_id UInt64, region String, "
                                 "amount Float64) ENGINE = MergeTree ORDER BY user_id")
            admin_client.command("INSERT INTO demo.purchases SELECT number % 500, ['EU', 'US'][number % 2 + 1], "
                                 "number % 300 FROM numbers(5000)")
            admin_client.command("CREATE DATABASE IF NOT EXISTS secret")
            admin_client.command("CREATE TABLE IF NOT EXISTS secret.t (x UInt8) ENGINE = Memory")
            yield host, port


def test_lockdown(locked_server):
    import clickhouse_connect

    host, port = locked_server
    with pytest.raises(Exception, match="(?i)authentication|password|516"):
        clickhouse_connect.get_client(host=host, port=port, username="default", password="").command("SELECT 1")
    gw = clickhouse_connect.get_client(host=host, port=port, username="dpch_gateway", password=GATEWAY_PASSWORD)
    assert gw.command("SELECT count() FROM demo.purchases") == 5000  # it reads the protected tables
    for statement in ("SELECT * FROM secret.t", "DROP TABLE demo.purchases",
                      "CREATE FUNCTION evil AS (x) -> x", "INSERT INTO demo.purchases VALUES (1, 'EU', 1)"):
        with pytest.raises(Exception, match="(?i)ACCESS_DENIED|Not enough privileges|497"):
            gw.command(statement)


def test_gateway_in_front_of_the_locked_server(locked_server, tmp_path):
    import clickhouse_connect

    host, port = locked_server
    url = f"http://{host}:{port}"
    pw_file = tmp_path / "backend_password"
    pw_file.write_text(GATEWAY_PASSWORD + "\n")
    data = tmp_path / "gw"

    def cli(*args, stdin=None):
        r = subprocess.run([sys.executable, "-m", "dpch.cli", *args], input=stdin, capture_output=True, text=True,
                           cwd=REPO, timeout=120)
        assert r.returncode == 0, r.stderr
        return r

    cli("catalog", "register", "demo.purchases", "--privacy-unit", "user_id", "--bounds", "amount=0:300",
        "--max-rows", "10", "--public-keys", "region=EU,US", "--server", url, "--user", "dpch_gateway",
        "--password", GATEWAY_PASSWORD)  # the catalog lives on the server (dpch_meta)
    cli("users", "add", "alice", "--password-stdin", "--data-dir", str(data), stdin="alice-pass\n")
    cli("budget", "set", "--data-dir", str(data), "--analyst", "alice", "--dataset", "demo.purchases", "--epsilon", "2")
    free = __import__("socket").socket()
    free.bind(("127.0.0.1", 0))
    gport = free.getsockname()[1]
    free.close()
    proc = subprocess.Popen([sys.executable, "-m", "dpch.cli", "serve", "--data-dir", str(data), "--port", str(gport),
                             "--backend", url, "--backend-user", "dpch_gateway", "--backend-password-file",
                             str(pw_file)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 60
        client = None
        while time.time() < deadline and client is None:
            try:
                client = clickhouse_connect.get_client(host="127.0.0.1", port=gport, username="alice",
                                                       password="alice-pass")
            except Exception:  # noqa: BLE001 - not up yet
                assert proc.poll() is None, proc.stdout.read()
                time.sleep(0.2)
        assert client is not None
        df = client.query_df("SELECT region, COUNT(*) AS n FROM demo.purchases GROUP BY region",
                             settings={"dpch_epsilon": 1})
        assert sorted(df["region"]) == ["EU", "US"]
        with pytest.raises(Exception, match="497|ACCESS_DENIED"):
            client.query_df("SELECT * FROM secret.t")
        from dpch.ledger import Ledger

        with Ledger(data / "ledger.sqlite", create=False) as led:  # one charge, to the authenticated user
            assert led.remaining("alice", "demo.purchases").queries == 1
    finally:
        proc.terminate()
        proc.wait(timeout=30)
