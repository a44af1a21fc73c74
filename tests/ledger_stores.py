"""The ledger's two stores as pytest fixtures: SQLite (a file in tmp_path) and PostgreSQL (a real
server that this module starts; no mocks).

- `pg_server` (session): initdb into a temporary directory and start Debian's postgres 15 on a free
  loopback port, its unix socket in that directory too, stopped by its PID at the end. As root,
  initdb and postgres run as the `postgres` system user (postgres refuses root), through setpriv so
  that the PID started is the server's own. Under pytest-xdist every worker runs its own server.
  Skipped, with the reason, only when the binaries are absent.
- `ledger_target` (parametrized: sqlite, postgresql): a fresh, empty ledger target: an SQLite file
  path, or a PostgreSQL URL whose `search_path` is a new schema (one per test: no test sees
  another's ledger).

Test modules import what they use: `from ledger_stores import ledger_target, pg_server  # noqa: F401`.
"""
from __future__ import annotations

import itertools
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest

PG_BIN = Path(os.environ.get("DPCH_PG_BIN", "/usr/lib/postgresql/15/bin"))
_SCHEMAS = itertools.count(1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_server_user(argv: list[str]) -> list[str]:
    """postgres refuses to run as root: drop to the `postgres` user, exec'ing (same PID)."""
    if os.geteuid() != 0:
        return argv
    return ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--", *argv]


@dataclass
class PgServer:
    port: int
    pid: int
    database: str = "dpch"

    def url(self, schema: str | None = None) -> str:
        base = f"postgresql://postgres@127.0.0.1:{self.port}/{self.database}"
        if schema is None:
            return base
        return base + "?options=" + quote(f"-c search_path={schema}")

    def admin(self):
        import psycopg

        return psycopg.connect(self.url(), autocommit=True)

    def new_schema(self, prefix: str = "t") -> str:
        """A new empty schema and the URL of a ledger in it."""
        name = f"{prefix}_{os.getpid()}_{next(_SCHEMAS)}"
        with self.admin() as conn:
            conn.execute(f"CREATE SCHEMA {name}")
        return self.url(name)


def start_pg_server(base: Path, tag: str) -> PgServer:
    """initdb + postgres in ``base`` (module docstring); the caller stops it with stop_pg_server."""
    import psycopg

    data, sock = base / "data", base / "sock"
    sock.mkdir(parents=True)
    if os.geteuid() == 0:
        uid, gid = pwd.getpwnam("postgres")[2:4]
        for p in (base, sock):
            os.chown(p, uid, gid)
    subprocess.run(_as_server_user([str(PG_BIN / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
                                    "-E", "UTF8", "--no-sync"]), check=True, capture_output=True)
    port = _free_port()
    log = open(base / f"postgres-{tag}.log", "wb")
    proc = subprocess.Popen(_as_server_user([
        str(PG_BIN / "postgres"), "-D", str(data), "-p", str(port), "-k", str(sock),
        "-c", "listen_addresses=127.0.0.1", "-c", "max_connections=200", "-c", "shared_buffers=32MB",
        "-c", "max_pred_locks_per_transaction=256"]), stdout=log, stderr=subprocess.STDOUT)
    server = PgServer(port, proc.pid)
    deadline = time.monotonic() + 60
    while True:
        try:
            with psycopg.connect(f"postgresql://postgres@127.0.0.1:{port}/postgres", autocommit=True,
                                 connect_timeout=2) as conn:
                conn.execute(f"CREATE DATABASE {server.database}")
            return server
        except psycopg.OperationalError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"postgres did not start: {(base / f'postgres-{tag}.log').read_text()[-2000:]}")
            time.sleep(0.1)


def stop_pg_server(server: PgServer) -> None:
    """Fast shutdown of the postmaster by its PID, then wait for it to exit."""
    try:
        os.kill(server.pid, signal.SIGINT)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(server.pid, os.WNOHANG)
        except ChildProcessError:
            return
        if pid:
            return
        time.sleep(0.05)
    os.kill(server.pid, signal.SIGKILL)


def pg_available() -> str | None:
    """None, or why PostgreSQL tests cannot run here."""
    for name in ("initdb", "postgres"):
        if not (PG_BIN / name).exists():
            return f"PostgreSQL binaries not found in {PG_BIN} (install Debian's postgresql-15, or set DPCH_PG_BIN)"
    if os.geteuid() == 0 and (shutil.which("setpriv") is None or not _has_user("postgres")):
        return "running as root without setpriv or a `postgres` system user to run the server as"
    return None


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


@pytest.fixture(scope="session")
def pg_server():
    reason = pg_available()
    if reason:
        pytest.skip(reason)
    tag = os.environ.get("PYTEST_XDIST_WORKER", "main")
    base = Path(tempfile.mkdtemp(prefix=f"dpch-pg-{tag}-"))
    server = start_pg_server(base, tag)
    try:
        yield server
    finally:
        stop_pg_server(server)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_target(request, tmp_path):
    """A fresh ledger target in each store: an SQLite path, or a PostgreSQL URL (new schema)."""
    if request.param == "sqlite":
        return tmp_path / "ledger.sqlite"
    return request.getfixturevalue("pg_server").new_schema()
