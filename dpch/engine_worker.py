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
2. opens N connections to the chDB store (``--engine-sessions``, default 4) with the DPCH functions,
   and serves requests on N threads, one connection each: requests carry an id and are answered in
   the order they finish, so a long query of one analyst does not hold the others' (measured here:
   a fast query answered in 0.02 s while a slow one ran 11.7 s on another connection of the same
   store; one connection runs its queries one after another).

Every statement runs under `EngineLimits` (ClickHouse's ``max_execution_time``, ``max_memory_usage``,
``max_rows_to_read``, ``max_result_rows``, ``max_bytes_to_read``, overflow mode ``throw``): a breach
fails with ClickHouse's own code (159, 241, 158, 396, 307). A statement that names one of these
settings itself is refused, so a query cannot lift its own limits. As a backstop, the gateway kills
the worker's whole process group when no answer arrives within ``max_execution_time + margin`` and
starts a fresh worker; every request then in flight fails with TIMEOUT_EXCEEDED (a ledger charge made
before stays) and later requests go to the fresh worker.

Nothing is unpickled on either side: requests are JSON; answers come back as Arrow IPC (DataFrames),
raw bytes (formatted results) or text (errors), so a compromised engine cannot run code in the gateway by
answering. This module adds no privacy computation; it only confines and limits what runs.
"""
from __future__ import annotations

import itertools
import json
import os
import queue
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
from dataclasses import dataclass, field, fields, replace
from multiprocessing.connection import Connection
from pathlib import Path

import pandas as pd

from .errors import BackendError

STORE, ENGINE_TMP, UDF_DIR = "store", "engine_tmp", "udf"
#: data-directory files the engine must never read (checked against every grant before confining)
PRIVATE_FILES = ("users.json", "ledger.sqlite", "access.log")
#: environment variables passed to the worker; everything else (e.g. DPCH_BACKEND_PASSWORD) is not
ENV_KEEP = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "PYTHONPATH", "DPCH_CLICKHOUSE_CONFIG")
#: engine connections (and threads) of one worker: queries on different ones run concurrently
DEFAULT_SESSIONS, MAX_SESSIONS = 4, 64


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


_RID = struct.Struct(">Q")  # every answer starts with the id of the request it answers


@dataclass
class _EngineSession:
    """One chDB connection of the worker and the limits last SET on it (SET is per connection:
    checked here, a SET on one connection does not change another's)."""

    session: object
    current: dict | None = None

    def run(self, op: str, sql: str, fmt: str, limits: dict) -> bytes:
        """One statement under ``limits``; the answer (tag + body), errors as text."""
        try:
            if _LIMIT_NAME_RE.search(sql):
                raise BackendError("Code: 452. DB::Exception: a statement may not change the engine limits. "
                                   "(SETTING_CONSTRAINT_VIOLATION)")
            if limits != self.current:
                self.session.query("SET " + ", ".join(f"{k} = {v}" for k, v in limits.items()), "CSV")
                self.current = limits
            if op == "df":
                return b"D" + _df_to_ipc(self.session.query(sql, "DataFrame"))
            if op == "fmt":
                res = self.session.query(sql, fmt)
                return b"F" + struct.pack(">q", int(res.rows_read())) + res.bytes()
            self.session.query(sql, "CSV")
            return b"O"
        except Exception as exc:  # noqa: BLE001 - the engine's message goes back as text
            return b"E" + str(exc).encode("utf-8", "replace")


def worker_main(fd: int, spec: dict) -> int:
    """The worker's body: confine, open ``spec["sessions"]`` connections to the store, then serve
    requests until EOF or "close": the main thread reads requests and queues them, one thread per
    connection runs them, and answers go back tagged with the request's id, in completion order."""
    from .config import sql_function_definitions
    from .confine import confine

    conn = Connection(fd)
    data_dir = Path(spec["data_dir"])
    n_sessions = max(1, int(spec.get("sessions", 1)))
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

        from .backends import MAX_QUERY_SIZE, install_store_functions

        # N connections to the one store, opened after confinement (chDB starts its threads here):
        # queries on different connections run concurrently, one connection runs one at a time
        sessions = [chdb_session.Session(f"{data_dir / STORE}?udf_path={data_dir / UDF_DIR}")
                    for _ in range(n_sessions)]
        # functions belong to the store: created once, and only if it does not hold them already
        install_store_functions(lambda sql: sessions[0].query(sql, "CSV"), data_dir / STORE, functions)
        for s in sessions:
            s.query(f"SET max_query_size = {MAX_QUERY_SIZE}", "CSV")
    except Exception as exc:  # noqa: BLE001 - reported to the gateway, which fails the start
        _send_error(conn, exc)
        return 1
    conn.send_bytes(b"R" + json.dumps({"confined": report is not None, "report": report,
                                       "sessions": n_sessions}).encode())
    jobs: queue.SimpleQueue = queue.SimpleQueue()
    send_lock = threading.Lock()  # answers of several threads share the socket: one message at a time

    def serve(engine: _EngineSession) -> None:
        while (job := jobs.get()) is not None:
            rid, op, sql, fmt, limits = job
            reply = engine.run(op, sql, fmt, limits)
            try:
                with send_lock:
                    conn.send_bytes(_RID.pack(rid) + reply)
            except OSError:  # the gateway is gone
                return

    threads = [threading.Thread(target=serve, args=(_EngineSession(s),), name=f"dpch-engine-{i}", daemon=True)
               for i, s in enumerate(sessions)]
    for t in threads:
        t.start()
    while True:
        try:
            req = json.loads(conn.recv_bytes())  # from the gateway (trusted); JSON, never pickle
        except (EOFError, OSError):
            break
        if req["op"] == "close":
            break
        jobs.put((int(req["id"]), req["op"], req["sql"], req["fmt"], req["limits"]))
    for _ in threads:
        jobs.put(None)
    for t in threads:
        t.join()  # a running statement ends within its max_execution_time (else the gateway kills us)
    for s in sessions:
        s.close()
    return 0


# -------------------------------------------------------------------------------------------------
# the gateway side
# -------------------------------------------------------------------------------------------------

_EXITED = ("the engine worker exited while running the statement; it was restarted (UNKNOWN_EXCEPTION)")


@dataclass
class _Call:
    """One request in flight: the reader thread fills ``reply`` or ``error`` and sets ``done``."""

    done: threading.Event = field(default_factory=threading.Event)
    reply: bytes | None = None
    error: str | None = None


class _Process:
    """One running worker process: its socket, its requests in flight by id, and the thread that
    reads its answers and hands each to the caller waiting for it."""

    def __init__(self, proc: subprocess.Popen, conn: Connection, report: dict):
        self.proc, self.conn, self.report = proc, conn, report
        self.lock = threading.Lock()  # guards pending and dead (callers, the reader, a restart)
        self.send_lock = threading.Lock()  # callers of several threads share the socket
        self.pending: dict[int, _Call] = {}
        self.dead: str | None = None  # why no more answers will come
        self.reader = threading.Thread(target=self._read, name=f"dpch-worker-reader-{proc.pid}", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while True:
            try:
                msg = self.conn.recv_bytes()
            except (EOFError, OSError):
                self.fail_all(_EXITED)
                return
            if len(msg) <= _RID.size:
                self.fail_all("the engine worker sent an unexpected answer (UNKNOWN_EXCEPTION)")
                return
            (rid,) = _RID.unpack_from(msg)
            with self.lock:
                call = self.pending.pop(rid, None)
            if call is not None:  # None: its caller gave up (a restart failed it already)
                call.reply = msg[_RID.size:]
                call.done.set()

    def submit(self, rid: int, request: bytes) -> _Call:
        call = _Call()
        with self.lock:
            if self.dead is not None:
                raise BackendError(self.dead)
            self.pending[rid] = call
        try:
            with self.send_lock:
                self.conn.send_bytes(request)
        except OSError:
            self.fail_all(_EXITED)
        return call

    def fail_all(self, message: str) -> None:
        """No answer will come: every request in flight fails with ``message``."""
        with self.lock:
            if self.dead is None:
                self.dead = message
            calls, self.pending = list(self.pending.values()), {}
        for call in calls:
            call.error = message
            call.done.set()

    def kill(self) -> None:
        """SIGKILL the worker's process group (the worker and its UDF programs), then reap it."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        # the socket is closed only once the reader has seen its end: a descriptor closed under a
        # reader that is still between two reads could be reused by the next worker's socket
        self.reader.join(timeout=10)
        if not self.reader.is_alive():
            self.conn.close()


class WorkerBackend:
    """The embedded engine of ``data_dir`` in a confined worker process, with the interface of
    `dpch.backends.EmbeddedBackend` that the gateway uses (``query_df``, ``query_formatted``,
    ``command``, ``close``). ``kind`` is "worker": results are rendered by the gateway's private
    in-memory chDB session (dpch.gateway.formats.Renderer), never by the engine that holds data.

    Thread-safe: up to ``sessions`` calls run at once, each on its own engine connection in the
    worker (more wait for a free one, so a request's deadline counts its own run only). A call
    whose answer does not come within its ``max_execution_time + margin`` kills the worker: every
    call in flight then fails with TIMEOUT_EXCEEDED, and a fresh worker answers the next calls.

    ``confined=False`` runs the worker without Landlock (the gateway's explicit ``--unconfined``);
    otherwise a worker that cannot confine itself fails the start."""

    kind = "worker"

    def __init__(self, data_dir: Path, limits: EngineLimits | None = None, *, confined: bool = True,
                 margin: float = 10.0, start_timeout: float = 180.0, sessions: int = DEFAULT_SESSIONS):
        from .config import prepare_embedded_udf_dir

        if isinstance(sessions, bool) or not isinstance(sessions, int) or not 1 <= sessions <= MAX_SESSIONS:
            raise ValueError(f"engine sessions must be an integer from 1 to {MAX_SESSIONS}")
        self.data_dir = Path(data_dir).resolve()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        prepare_embedded_udf_dir(self.data_dir)
        self.limits = limits or EngineLimits()
        self.confined = confined
        self.margin = margin
        self.start_timeout = start_timeout
        self.sessions = sessions
        self.restarts = 0
        self._lock = threading.Lock()  # starting, replacing and closing the process: one thread at a time
        self._slots = threading.BoundedSemaphore(sessions)  # calls in flight <= engine connections
        self._ids = itertools.count(1)  # next() is atomic in CPython: ids are unique across threads
        self._closed = False
        self._dpch_probe_tables: dict = {}  # dpch.probe_db: the probe tables made in this store
        self._process: _Process | None = self._start()

    @property
    def report(self) -> dict | None:
        p = self._process
        return p.report if p is not None else None

    # -- process management ------------------------------------------------------------------------
    def _start(self) -> _Process:
        parent, child = socket.socketpair()
        env = {k: os.environ[k] for k in ENV_KEEP if k in os.environ}
        spec = {"data_dir": str(self.data_dir), "unconfined": not self.confined, "sessions": self.sessions}
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "dpch.engine_worker", str(child.fileno()), json.dumps(spec)],
                pass_fds=(child.fileno(),), env=env, start_new_session=True, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, cwd=str(self.data_dir / UDF_DIR))
        finally:
            child.close()
        conn = Connection(parent.detach())

        def fail(message: str) -> BackendError:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            conn.close()
            return BackendError(message)

        if not conn.poll(self.start_timeout):
            raise fail(f"the engine worker did not start within {self.start_timeout:g} s")
        try:
            msg = conn.recv_bytes()
        except (EOFError, OSError):
            raise fail("the engine worker exited during its start") from None
        if msg[:1] != b"R":
            raise fail(f"the engine worker failed to start: {msg[1:].decode('utf-8', 'replace')}")
        return _Process(proc, conn, json.loads(msg[1:]))

    def _running(self) -> _Process:
        """The live worker, started (again) if it is missing or has died."""
        with self._lock:
            if self._closed:
                raise BackendError("the engine worker is closed")
            p = self._process
            if p is not None and p.dead is None and p.proc.poll() is None:
                return p
            if p is not None:
                p.fail_all(_EXITED)
                p.kill()
                self.restarts += 1
            self._process = None
            self._process = self._start()
            return self._process

    def _replace(self, p: _Process, message: str, late: _Call | None = None) -> None:
        """Kill ``p`` (if still the current worker), fail its requests in flight with ``message``
        and start a fresh worker (a failed start is retried by the next call). Nothing is done if
        ``late``, the call whose deadline passed, was answered meanwhile."""
        with self._lock:
            if self._process is not p or (late is not None and late.done.is_set()):
                return  # another caller replaced it already, or the answer came after all
            p.fail_all(message)
            p.kill()
            self.restarts += 1
            self._process = None
            if not self._closed:
                try:
                    self._process = self._start()
                except BackendError:
                    pass

    @property
    def pid(self) -> int | None:
        p = self._process
        return p.proc.pid if p is not None else None

    # -- calls ---------------------------------------------------------------------------------------
    def _call(self, op: str, sql: str, fmt: str, limits: EngineLimits | None) -> bytes:
        limits = limits or self.limits
        deadline = limits.max_execution_time + self.margin
        with self._slots:
            p = self._running()
            rid = next(self._ids)
            call = p.submit(rid, json.dumps({"id": rid, "op": op, "sql": sql, "fmt": fmt,
                                             "limits": limits.settings()}).encode())
            if not call.done.wait(deadline):
                self._replace(p, f"Code: 159. DB::Exception: the engine did not answer within {deadline:g} s; "
                                 "it was stopped and restarted. (TIMEOUT_EXCEEDED)", late=call)
                call.done.wait()  # set by now: answered in the meantime, or failed by the restart
            if call.error is not None:
                if call.error == _EXITED:
                    self._replace(p, _EXITED)  # restart now, not on the next call
                raise BackendError(call.error)
        reply = call.reply
        if reply[:1] == b"E":
            raise BackendError(reply[1:].decode("utf-8", "replace"))
        return reply

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
            p, self._process = self._process, None
        if p is None:
            return
        try:
            with p.send_lock:
                p.conn.send_bytes(json.dumps({"op": "close"}).encode())
            p.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            pass
        p.fail_all("the engine worker is closed")
        p.kill()


class LimitedBackend:
    """One worker seen with other limits: the same engine (and catalog cache), other settings."""

    kind = "worker"

    def __init__(self, worker: WorkerBackend, limits):
        self.worker, self._limits = worker, limits

    @property
    def limits(self) -> EngineLimits:
        return self._limits() if callable(self._limits) else self._limits

    @property
    def state_owner(self) -> WorkerBackend:
        """The engine whose lock and caches this view shares (dpch.catalog._backend_lock): every
        analyst's view creates the same probe tables and reads the same catalog."""
        return self.worker

    @property
    def _dpch_catalog_cache(self):  # dpch.catalog caches entries on the backend: share the worker's
        return getattr(self.worker, "_dpch_catalog_cache", None)

    @_dpch_catalog_cache.setter
    def _dpch_catalog_cache(self, value):
        self.worker._dpch_catalog_cache = value

    @property
    def _dpch_probe_tables(self):  # dpch.probe_db's made-tables map: one per engine, like the tables
        return self.worker._dpch_probe_tables

    @_dpch_probe_tables.setter
    def _dpch_probe_tables(self, value):
        self.worker._dpch_probe_tables = value

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
