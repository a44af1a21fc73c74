"""The gateway's engine in a separate, confined process (DESIGN.md invariants 8 and 10).

``WorkerBackend`` (in the gateway) starts ``python -m dpch.engine_worker`` with a clean environment
and one socket. The worker

1. confines itself with Landlock (`dpch.confine`) BEFORE chDB starts any thread: it may read the
   Python installation, the dpch package, /usr and /lib*, a few system information files in /proc and
   /sys (its own /proc/<pid> only) and /dev/null, /dev/urandom; read and execute the UDF directory,
   the Python binary, /bin/sh and the dynamic loader; read and write ``<data dir>/store`` and
   ``<data dir>/engine_tmp`` only. It may list directory names anywhere (chDB's UDF loader walks
   the UDF path from ``/``: Poco::Glob), but it reads no file outside these grants: not /etc, not the
   data directory's users.json, ledger.sqlite or access.log, not the gateway's /proc entry. It opens
   no TCP connection and cannot signal processes outside its sandbox;
2. opens the chDB store with the DPCH functions, and then answers one request at a time.

Every statement runs under `EngineLimits` (ClickHouse's ``max_execution_time``, ``max_memory_usage``,
``max_rows_to_read``, ``max_result_rows``, ``max_bytes_to_read``, overflow mode ``throw``): a breach
fails with ClickHouse's own code (159, 241, 158, 396, 307). A statement that names one of these
settings itself is refused, so a query cannot lift its own limits. As a backstop, the gateway kills
the worker's whole process group when no answer arrives within ``max_execution_time + margin`` and
starts a fresh worker; the request fails with TIMEOUT_EXCEEDED (a ledger charge made before stays).

Nothing is unpickled from the worker: answers come back as Arrow IPC (DataFrames), raw bytes
(formatted results) or text (errors), so a compromised engine cannot run code in the gateway by
answering. This module adds no privacy computation; it only confines and limits what runs.
"""
from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
from dataclasses import dataclass, fields, replace
from multiprocessing.connection import Connection
from pathlib import Path

import pandas as pd

from .errors import BackendError

STORE, ENGINE_TMP, UDF_DIR = "store", "engine_tmp", "udf"
#: data-directory files the engine must never read (checked against every grant before confining)
PRIVATE_FILES = ("users.json", "ledger.sqlite", "access.log")
#: environment variables passed to the worker; everything else (e.g. DPCH_BACKEND_PASSWORD) is not
ENV_KEEP = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "PYTHONPATH", "DPCH_CLICKHOUSE_CONFIG")


# -------------------------------------------------------------------------------------------------
# limits
# -------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class EngineLimits:
    """Per-statement engine limits (ClickHouse settings of the same names; 0 = no limit, except
    ``max_execution_time``, which must be positive). The defaults stop runaway queries without
    touching the repository's benchmarks (1e8-row tables): 30 s, 4 GiB, 1e11 rows read, 1e9 result
    rows (ClickHouse also checks max_result_rows on subqueries, hence the large default)."""

    max_execution_time: float = 30.0
    max_memory_usage: int = 4 << 30
    max_rows_to_read: int = 100_000_000_000
    max_result_rows: int = 1_000_000_000
    max_bytes_to_read: int = 0

    def __post_init__(self):
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or v != v:
                raise ValueError(f"engine limit {f.name} must be a non-negative number")
        if not self.max_execution_time > 0:
            raise ValueError("engine limit max_execution_time must be positive")

    def settings(self) -> dict[str, str]:
        out = {f.name: repr(float(getattr(self, f.name))) if f.name == "max_execution_time"
               else str(int(getattr(self, f.name))) for f in fields(self)}
        out.update(timeout_overflow_mode="'throw'", read_overflow_mode="'throw'", result_overflow_mode="'throw'")
        return out

    def with_overrides(self, overrides: dict | None) -> "EngineLimits":
        """These limits with some replaced (a user's record, a command line); unknown names raise."""
        if not overrides:
            return self
        names = {f.name for f in fields(self)}
        bad = sorted(set(overrides) - names)
        if bad:
            raise ValueError(f"unknown engine limit(s): {', '.join(bad)}")
        return replace(self, **overrides)


# a statement naming any of these could change its own limits (SETTINGS clause, SET)
_LIMIT_NAME_RE = re.compile(
    r"(max_execution_time|max_memory_usage|max_rows_to_read|max_result_rows|max_bytes_to_read|overflow_mode|"
    r"max_result_bytes|max_execution_time_leaf|max_estimated_execution_time|timeout_before_checking|"
    r"max_rows_to_read_leaf|max_bytes_to_read_leaf|memory_overcommit|max_memory_usage_for_user)", re.I)


# -------------------------------------------------------------------------------------------------
# the worker process
# -------------------------------------------------------------------------------------------------

def grants(data_dir: Path, pid: int) -> dict[str, list[Path]]:
    """The Landlock grants of the worker for ``data_dir`` (see the module docstring). Found by
    experiment with strace: chDB needs its /proc/<pid> (pthread_getattr_np reads maps), cgroup and
    CPU topology files, and a writable temporary directory for its start-up session."""
    import site

    import dpch

    def real(p) -> Path:
        return Path(p).resolve()

    py_dirs = {real(sys.prefix), real(sys.base_prefix), *(real(p) for p in site.getsitepackages())}
    read_only = sorted(py_dirs) + [real(Path(dpch.__file__).parent)] + [Path(p) for p in (
        "/usr", "/lib", "/lib64", "/lib32", "/dev/null", "/dev/urandom", "/dev/zero", f"/proc/{pid}",
        "/proc/stat", "/proc/meminfo", "/proc/cpuinfo", "/proc/sys/vm/overcommit_memory",
        "/proc/sys/kernel/pid_max", "/sys/fs/cgroup", "/sys/devices/system/cpu", "/sys/devices/system/node",
        "/sys/kernel/mm/transparent_hugepage")]
    executable = [data_dir / UDF_DIR, real(sys.executable), real(shutil.which("sh") or "/bin/sh")]
    executable += sorted({real(p) for p in Path("/lib64").glob("ld-linux*.so*")} |
                         {real(p) for p in Path("/lib").glob("ld-linux*.so*")})
    return {"read_only": read_only, "executable": executable, "list_only": [Path("/")],
            "read_write": [data_dir / STORE, data_dir / ENGINE_TMP]}


def check_grants(data_dir: Path, g: dict[str, list[Path]]) -> None:
    """Refuse to confine when a readable grant would cover a private file of the data directory
    (e.g. a data directory inside the Python installation)."""
    for kind in ("read_only", "executable", "read_write"):
        for p in g[kind]:
            for name in PRIVATE_FILES:
                f = data_dir / name
                if f == p or p in f.parents:
                    raise BackendError(f"the engine worker cannot be confined: {f} lies inside {p}, which the "
                                       "engine must read; move the data directory")


def _send_error(conn: Connection, exc: BaseException) -> None:
    conn.send_bytes(b"E" + str(exc).encode("utf-8", "replace"))


def _df_to_ipc(df: pd.DataFrame) -> bytes:
    import pyarrow as pa

    table = pa.Table.from_pandas(df, preserve_index=False)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def worker_main(fd: int, spec: dict) -> int:
    """The worker's body: confine, open the store, then serve requests until EOF or "close"."""
    from .config import sql_function_definitions
    from .confine import confine

    conn = Connection(fd)
    data_dir = Path(spec["data_dir"])
    try:
        (data_dir / STORE).mkdir(parents=True, exist_ok=True)
        (data_dir / ENGINE_TMP).mkdir(parents=True, exist_ok=True)
        functions = sql_function_definitions()  # read clickhouse_config while it is readable
        import pyarrow.ipc  # noqa: F401  (imported before confinement: it loads many modules)

        report = None
        if not spec.get("unconfined"):
            g = grants(data_dir, os.getpid())
            check_grants(data_dir, g)
            r = confine(**g)
            report = {"abi": r.abi, "skipped": list(r.skipped)}
        os.environ["TMPDIR"] = str(data_dir / ENGINE_TMP)  # chDB's start-up session lives there
        from chdb import session as chdb_session

        from .backends import MAX_QUERY_SIZE

        session = chdb_session.Session(f"{data_dir / STORE}?udf_path={data_dir / UDF_DIR}")
        for _name, statement in functions:
            session.query(statement.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1), "CSV")
        session.query(f"SET max_query_size = {MAX_QUERY_SIZE}", "CSV")
    except Exception as exc:  # noqa: BLE001 - reported to the gateway, which fails the start
        _send_error(conn, exc)
        return 1
    conn.send_bytes(b"R" + json.dumps({"confined": report is not None, "report": report}).encode())
    current: dict[str, str] | None = None
    while True:
        try:
            op, sql, fmt, limits = pickle.loads(conn.recv_bytes())  # from the gateway (trusted)
        except EOFError:
            break
        if op == "close":
            break
        try:
            if _LIMIT_NAME_RE.search(sql):
                raise BackendError("Code: 452. DB::Exception: a statement may not change the engine limits. "
                                   "(SETTING_CONSTRAINT_VIOLATION)")
            if limits != current:
                session.query("SET " + ", ".join(f"{k} = {v}" for k, v in limits.items()), "CSV")
                current = limits
            if op == "df":
                reply = b"D" + _df_to_ipc(session.query(sql, "DataFrame"))
            elif op == "fmt":
                res = session.query(sql, fmt)
                reply = b"F" + struct.pack(">q", int(res.rows_read())) + res.bytes()
            else:
                session.query(sql, "CSV")
                reply = b"O"
        except Exception as exc:  # noqa: BLE001 - the engine's message goes back as text
            reply = b"E" + str(exc).encode("utf-8", "replace")
        conn.send_bytes(reply)
    session.close()
    return 0


# -------------------------------------------------------------------------------------------------
# the gateway side
# -------------------------------------------------------------------------------------------------

class WorkerBackend:
    """The embedded engine of ``data_dir`` in a confined worker process, with the interface of
    `dpch.backends.EmbeddedBackend` that the gateway uses (``query_df``, ``query_formatted``,
    ``command``, ``close``). ``kind`` is "worker": results are rendered by the gateway's private
    in-memory chDB session (dpch.gateway.formats.Renderer), never by the engine that holds data.

    ``confined=False`` runs the worker without Landlock (the gateway's explicit ``--unconfined``);
    otherwise a worker that cannot confine itself fails the start."""

    kind = "worker"

    def __init__(self, data_dir: Path, limits: EngineLimits | None = None, *, confined: bool = True,
                 margin: float = 10.0, start_timeout: float = 180.0):
        from .config import prepare_embedded_udf_dir

        self.data_dir = Path(data_dir).resolve()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        prepare_embedded_udf_dir(self.data_dir)
        self.limits = limits or EngineLimits()
        self.confined = confined
        self.margin = margin
        self.start_timeout = start_timeout
        self.restarts = 0
        self.report: dict | None = None
        self._lock = threading.RLock()
        self._proc: subprocess.Popen | None = None
        self._conn: Connection | None = None
        self._closed = False
        self._start()

    # -- process management ------------------------------------------------------------------------
    def _start(self) -> None:
        parent, child = socket.socketpair()
        env = {k: os.environ[k] for k in ENV_KEEP if k in os.environ}
        spec = {"data_dir": str(self.data_dir), "unconfined": not self.confined}
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "dpch.engine_worker", str(child.fileno()), json.dumps(spec)],
                pass_fds=(child.fileno(),), env=env, start_new_session=True, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, cwd=str(self.data_dir / UDF_DIR))
        finally:
            child.close()
        self._conn = Connection(parent.detach())
        if not self._conn.poll(self.start_timeout):
            self._kill()
            raise BackendError(f"the engine worker did not start within {self.start_timeout:g} s")
        try:
            msg = self._conn.recv_bytes()
        except (EOFError, OSError):
            self._kill()
            raise BackendError("the engine worker exited during its start") from None
        if msg[:1] != b"R":
            self._kill()
            raise BackendError(f"the engine worker failed to start: {msg[1:].decode('utf-8', 'replace')}")
        self.report = json.loads(msg[1:])

    def _kill(self) -> None:
        """SIGKILL the worker's process group (the worker and its UDF programs), then reap it."""
        proc, self._proc = self._proc, None
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if proc is None:
            return
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    # -- calls ---------------------------------------------------------------------------------------
    def _call(self, op: str, sql: str, fmt: str, limits: EngineLimits | None) -> bytes:
        limits = limits or self.limits
        with self._lock:
            if self._closed:
                raise BackendError("the engine worker is closed")
            if self._proc is None or self._proc.poll() is not None:
                self._kill()
                self._start()
                self.restarts += 1
            deadline = limits.max_execution_time + self.margin
            try:
                self._conn.send_bytes(pickle.dumps((op, sql, fmt, limits.settings())))
                answered = self._conn.poll(deadline)
                reply = self._conn.recv_bytes() if answered else None
            except (EOFError, OSError):
                self._restart()
                raise BackendError("the engine worker exited while running the statement; it was restarted "
                                   "(UNKNOWN_EXCEPTION)") from None
            if reply is None:
                self._restart()
                raise BackendError(f"Code: 159. DB::Exception: the engine did not answer within {deadline:g} s; "
                                   "it was stopped and restarted. (TIMEOUT_EXCEEDED)")
        tag, body = reply[:1], reply[1:]
        if tag == b"E":
            raise BackendError(body.decode("utf-8", "replace"))
        return reply

    def _restart(self) -> None:
        self._kill()
        self.restarts += 1
        try:
            self._start()
        except BackendError:
            pass  # retried on the next call; this request fails either way

    def query_df(self, sql: str, *, limits: EngineLimits | None = None) -> pd.DataFrame:
        import pyarrow as pa

        reply = self._call("df", sql, "DataFrame", limits)
        if reply[:1] != b"D":
            raise BackendError("the engine worker sent an unexpected answer")
        return pa.ipc.open_stream(reply[1:]).read_all().to_pandas()

    def query_formatted(self, sql: str, fmt: str, *, limits: EngineLimits | None = None):
        from .backends import Formatted

        reply = self._call("fmt", sql, fmt, limits)
        if reply[:1] != b"F" or len(reply) < 9:
            raise BackendError("the engine worker sent an unexpected answer")
        return Formatted(reply[9:], struct.unpack(">q", reply[1:9])[0])

    def command(self, sql: str, *, limits: EngineLimits | None = None) -> None:
        self._call("cmd", sql, "CSV", limits)

    def insert_df(self, table: str, df: pd.DataFrame) -> None:
        raise BackendError("the gateway's engine worker does not load data; use `dpch load` while the gateway "
                           "is stopped")

    def with_limits(self, limits) -> "LimitedBackend":
        """A view of this worker whose statements run under ``limits`` (one analyst's): an
        EngineLimits, or a callable returning the current one (read again on every statement)."""
        return LimitedBackend(self, limits)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._conn is not None:
                try:
                    self._conn.send_bytes(pickle.dumps(("close", "", "", {})))
                    self._proc.wait(timeout=10)
                except (OSError, subprocess.TimeoutExpired):
                    pass
            self._kill()


class LimitedBackend:
    """One worker seen with other limits: the same engine (and catalog cache), other settings."""

    kind = "worker"

    def __init__(self, worker: WorkerBackend, limits):
        self.worker, self._limits = worker, limits

    @property
    def limits(self) -> EngineLimits:
        return self._limits() if callable(self._limits) else self._limits

    @property
    def _dpch_catalog_cache(self):  # dpch.catalog caches entries on the backend: share the worker's
        return getattr(self.worker, "_dpch_catalog_cache", None)

    @_dpch_catalog_cache.setter
    def _dpch_catalog_cache(self, value):
        self.worker._dpch_catalog_cache = value

    def query_df(self, sql: str) -> pd.DataFrame:
        return self.worker.query_df(sql, limits=self.limits)

    def query_formatted(self, sql: str, fmt: str):
        return self.worker.query_formatted(sql, fmt, limits=self.limits)

    def command(self, sql: str) -> None:
        self.worker.command(sql, limits=self.limits)

    def insert_df(self, table: str, df: pd.DataFrame) -> None:
        self.worker.insert_df(table, df)

    def close(self) -> None:
        """The gateway closes the worker itself; a per-user view has nothing of its own."""


if __name__ == "__main__":
    sys.exit(worker_main(int(sys.argv[1]), json.loads(sys.argv[2])))
