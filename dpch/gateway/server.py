"""The gateway process: a Starlette app served by uvicorn.

- The event loop does HTTP only: parameters, body (size- and time-limited), credentials.
- Password checks run on a small thread pool (argon2 is slow on purpose).
- Everything that touches the engine (the catalog, the controller with its ledger charge, the
  formatters) runs on a pool of ``engine_sessions`` engine threads (default 4), as many as the
  engine worker has engine connections (dpch.engine_worker): analysts' queries run in parallel, one
  analyst holds at most ``engine_sessions - 1`` of them (more wait their turn on the event loop),
  so a slow query of one user keeps neither another user's query nor ``/ping`` waiting.
- What the engine threads share is thread-safe: the per-user connections (created under a lock),
  the catalog cache and probe tables (dpch.catalog._backend_lock), the type-check cache
  (dpch.typecheck), the ledger (dpch.ledger: threads and processes), the access log and the
  renderer (each under its own lock).
- The ledger and the user store live in the data directory; the identity charged is the
  authenticated user, through a per-user ``Connection`` that shares the one backend and ledger path.
"""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from ..engine_worker import DEFAULT_SESSIONS, EngineLimits
from ..errors import GATEWAY, interface, set_process_interface
from ..users import UserStore
from . import formats
from . import limits
from .accesslog import AccessLog
from .limits import UserQueryCaps
from .auth import auth_failed, credentials
from .errors import (BAD_ARGUMENTS, CANNOT_PARSE_INPUT, TIMEOUT, TOO_LARGE_REQUEST, TOO_MANY_SIMULTANEOUS_QUERIES,
                     UNSUPPORTED_METHOD, GatewayError, from_dpch)
from .router import DP_SETTING_NAMES, answer, bias_headers

log = logging.getLogger("dpch.gateway")

# URL parameters that are not settings (transport), or settings the gateway accepts and ignores
TRANSPORT_PARAMS = {"query", "user", "password", "database", "default_format", "query_id", "session_id",
                    "session_timeout", "session_check", "compress", "decompress", "wait_end_of_query",
                    "buffer_size", "enable_http_compression", "send_progress_in_http_headers",
                    "http_headers_progress_interval_ms", "client_protocol_version", "quota_key", "role",
                    "http_zlib_compression_level", "max_result_rows", "max_result_bytes", "result_overflow_mode",
                    "extremes", "readonly", "max_execution_time", "date_time_input_format",
                    "cast_string_to_dynamic_use_inference", "date_time_output_format", "log_comment"}


@dataclass
class GatewayConfig:
    data_dir: Path
    backend_url: str | None = None
    backend_user: str = "default"
    backend_password: str = ""
    max_body_bytes: int = 1 << 20
    body_timeout: float = 10.0
    max_queued: int = 64
    access_log: str | None = None  # path, "-" for stderr; default <data dir>/access.log
    # the embedded engine runs in a Landlock-confined worker process (dpch.engine_worker) under these
    # limits (a user's record may override them); ``unconfined`` skips Landlock, explicitly and logged
    limits: EngineLimits = field(default_factory=EngineLimits)
    unconfined: bool = False
    engine_margin: float = 10.0  # seconds past max_execution_time before the worker is killed and restarted
    # engine connections in the worker = engine threads in the gateway: queries that run in parallel
    engine_sessions: int = DEFAULT_SESSIONS
    # the native TCP interface (dpch.gateway.native.NativeConfig; None: HTTP only)
    native: object | None = None
    # the ledger: None for <data dir>/ledger.sqlite, or a file or postgresql:// URL (several gateways)
    ledger: str | None = None
    # queries one user may have in flight (running or waiting); one more is refused with 202
    user_queries: UserQueryCaps = field(default_factory=UserQueryCaps)

    @property
    def ledger_target(self):
        return self.ledger or self.data_dir / "ledger.sqlite"


class Gateway:
    """State shared by requests. Engine-bound methods must run on an engine thread (``on_engine``);
    several run at once, so everything they share is locked or thread-safe by design."""

    def __init__(self, cfg: GatewayConfig):
        self.cfg = cfg
        n = max(1, int(cfg.engine_sessions))
        self.engine = ThreadPoolExecutor(max_workers=n, thread_name_prefix="dpch-engine")
        # one analyst holds at most n - 1 engine threads: another analyst always finds one free
        self.per_user = max(1, n - 1)
        self._user_slots: dict[str, asyncio.Semaphore] = {}  # event-loop only: no lock needed
        self._in_flight: dict[str, int] = {}  # user -> queries running or waiting (event loop only)
        self.auth_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="dpch-auth")
        self.users = UserStore(cfg.data_dir)
        self.access = AccessLog(cfg.access_log if cfg.access_log else str(cfg.data_dir / "access.log"))
        self.backend = None
        self.renderer = None
        self.ledger = None
        self._conns: dict = {}
        self._conns_lock = threading.Lock()  # two engine threads of one user must not make two Connections
        self._catalog = None
        self.queued = 0

    # -- engine thread -----------------------------------------------------------------------
    def _open(self) -> None:
        from ..backends import ServerBackend
        from ..catalog import Catalog
        from ..ledger import Ledger

        cfg = self.cfg
        cfg.data_dir.mkdir(parents=True, exist_ok=True)
        if cfg.backend_url:
            import clickhouse_connect.common

            # the engine threads share one client: without a session id its queries may run concurrently
            # (a server session runs one query at a time); DPCH sends its settings with every query
            clickhouse_connect.common.set_setting("autogenerate_session_id", False)
            self.backend = ServerBackend(cfg.backend_url, user=cfg.backend_user, password=cfg.backend_password)
        else:
            from ..engine_worker import WorkerBackend

            if cfg.unconfined:
                log.warning("the engine worker runs UNCONFINED (--unconfined): an engine function that slips past "
                            "the allow-list can read every file this user can, including the user store and ledger")
            self.backend = WorkerBackend(cfg.data_dir, cfg.limits, confined=not cfg.unconfined,
                                         margin=cfg.engine_margin, sessions=cfg.engine_sessions)
            log.info("engine worker pid %s, %d engine sessions: %s", self.backend.pid, cfg.engine_sessions,
                     f"Landlock ABI {self.backend.report['report']['abi']}" if self.backend.report["confined"]
                     else "unconfined")
        self.ledger = Ledger(cfg.ledger_target)  # verifies; fails the start if broken
        self.renderer = formats.Renderer(self.backend)
        self._catalog = Catalog(self.backend)
        self._catalog.list()

    def _close(self) -> None:
        with self._conns_lock:
            conns, self._conns = list(self._conns.values()), {}
        for c in conns:
            if c._ledger is not None:
                c._ledger.close()
        if self.ledger is not None:
            self.ledger.close()
        if self.backend is not None:
            self.backend.close()

    def catalog_entries(self):
        return self._catalog.list()

    def connection(self, user: str):
        from ..connection import Connection

        with self._conns_lock:
            conn = self._conns.get(user)
            if conn is None:
                backend = self.backend
                if hasattr(backend, "with_limits"):  # the engine worker: this analyst's limits
                    backend = backend.with_limits(lambda: self.cfg.limits.with_overrides(self.users.limits(user)))
                conn = Connection(backend, analyst=user, data_dir=self.cfg.data_dir,
                                  ledger_path=self.cfg.ledger_target)
                _ = (conn.catalog, conn.ledger)  # made now, under the lock: the lazy properties are not thread-safe
                self._conns[user] = conn
        return conn

    async def on_engine(self, fn, *args, user: str | None = None):
        """Run ``fn(*args)`` on an engine thread. Waiting requests are capped (``max_queued``, 202);
        ``user``'s requests beyond ``per_user`` wait here, on the event loop, not on an engine thread;
        beyond the user's ``max_concurrent_queries_for_user`` (cfg.user_queries) they are refused (202)."""
        cap = self.cfg.user_queries.for_user(user) if user is not None else 0
        if cap and self._in_flight.get(user, 0) >= cap:
            raise GatewayError(TOO_MANY_SIMULTANEOUS_QUERIES, f"too many simultaneous queries for user {user}: "
                               f"the maximum is {cap}; wait for one to finish")
        if self.queued >= self.cfg.max_queued:
            raise GatewayError(TOO_MANY_SIMULTANEOUS_QUERIES, "too many queries are waiting; try again later")
        self.queued += 1
        if user is not None:
            self._in_flight[user] = self._in_flight.get(user, 0) + 1
        try:
            slots = contextlib.nullcontext()
            if user is not None:
                slots = self._user_slots.setdefault(user, asyncio.Semaphore(self.per_user))
            async with slots:
                return await asyncio.get_running_loop().run_in_executor(self.engine, fn, *args)
        finally:
            self.queued -= 1
            if user is not None:
                left = self._in_flight[user] - 1
                if left:
                    self._in_flight[user] = left
                else:
                    del self._in_flight[user]

    async def startup(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self.engine, self._open)

    async def shutdown(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self.engine, self._close)
        self.engine.shutdown(wait=True)
        self.auth_pool.shutdown(wait=True)
        self.access.close()

    # -- one query, on an engine thread ---------------------------------------------------------
    def run(self, user, sql, dp_settings, out_settings, database, default_format, query_params=None):
        ans = answer(self, user, sql, dp_settings, database, default_format, out_settings, query_params)
        if ans.body is None:  # metadata, or a DataFrame with CI columns: ClickHouse renders it now
            ans.body = self.renderer.render(ans.df, ans.fmt, out_settings)
            ans.rows = len(ans.df)
        return ans


def _params(request: Request) -> dict[str, str]:
    raw = request.scope.get("query_string", b"")
    try:
        text = raw.decode("ascii")
        pairs = parse_qsl(text, keep_blank_values=True, encoding="utf-8", errors="strict", max_num_fields=1000)
    except (UnicodeDecodeError, ValueError):
        raise GatewayError(CANNOT_PARSE_INPUT, "the URL parameters are not valid (percent-encoded UTF-8 expected)") from None
    out: dict[str, str] = {}
    for k, v in pairs:
        out[k] = v
    return out


async def _read_body(request: Request, cfg: GatewayConfig) -> bytes:
    cl = request.headers.get("content-length")
    if cl is not None:
        try:
            n = int(cl)
        except ValueError:
            raise GatewayError(BAD_ARGUMENTS, "invalid Content-Length") from None
        if n > cfg.max_body_bytes:
            raise GatewayError(TOO_LARGE_REQUEST, f"request body too large ({n} bytes; the limit is {cfg.max_body_bytes})")
    if request.headers.get("content-encoding", "identity").lower() not in ("identity", ""):
        raise GatewayError(BAD_ARGUMENTS, "compressed request bodies are not supported")
    chunks, size = [], 0

    async def read():
        nonlocal size
        async for chunk in request.stream():
            size += len(chunk)
            if size > cfg.max_body_bytes:
                raise GatewayError(TOO_LARGE_REQUEST, f"request body too large (limit {cfg.max_body_bytes} bytes)")
            chunks.append(chunk)

    try:
        await asyncio.wait_for(read(), timeout=cfg.body_timeout)
    except asyncio.TimeoutError:
        raise GatewayError(TIMEOUT, f"the request body did not arrive within {cfg.body_timeout:g} s") from None
    return b"".join(chunks)


def _error_response(err: GatewayError, query_id: str | None = None) -> Response:
    headers = err.headers()
    if query_id:
        headers["X-ClickHouse-Query-Id"] = query_id
    return Response(err.body(), status_code=err.status, headers=headers, media_type="text/plain; charset=UTF-8")


def build_app(cfg: GatewayConfig) -> Starlette:
    gw = Gateway(cfg)

    async def authenticate(request: Request, params: dict[str, str]) -> str:
        """The verified user of a request (argon2 off the event loop); raises auth_failed, and the
        caller's access log then records no user name."""
        user, password = credentials(request.headers, params)
        ok = gw.users.verified_before(user, password) or \
            await asyncio.get_running_loop().run_in_executor(gw.auth_pool, gw.users.verify, user, password)
        if not ok:
            raise auth_failed(user)
        return user

    async def ping(request: Request) -> Response:
        return Response(b"Ok.\n", media_type="text/plain; charset=UTF-8")

    async def query(request: Request) -> Response:
        t0 = time.perf_counter()
        query_id = None
        user = None
        kind = "error"
        sql_hash = None
        try:
            params = _params(request)
            limits.check_params(params)  # before anything runs: nothing unsafe is echoed or logged
            limits.check_headers(request.headers)
            query_id = params.get("query_id") or request.headers.get("x-clickhouse-query-id") or str(uuid.uuid4())
            if request.method not in ("GET", "POST"):
                raise GatewayError(UNSUPPORTED_METHOD, f"HTTP method {request.method} is not supported")
            body = await _read_body(request, cfg) if request.method == "POST" else b""
            user = await authenticate(request, params)
            try:
                body_text = body.decode("utf-8")
            except UnicodeDecodeError:
                raise GatewayError(CANNOT_PARSE_INPUT, "the query is not valid UTF-8") from None
            q = params.get("query", "")
            sql = q + ("\n" if q and body_text else "") + body_text
            sql_hash = hashlib.sha256(sql.encode("utf-8")).hexdigest()[:16]
            limits.check_query_text(sql)
            dp_settings = {k.lower(): v for k, v in params.items() if k.lower() in DP_SETTING_NAMES}
            out_settings = formats.output_settings(params)
            database = params.get("database") or request.headers.get("x-clickhouse-database") or "default"
            default_format = params.get("default_format") or request.headers.get("x-clickhouse-format") or None
            query_params = {k[6:]: v for k, v in params.items() if k.startswith("param_")}  # {name:Type} values
            ans = await gw.on_engine(gw.run, user, sql, dp_settings, out_settings, database, default_format,
                                     query_params, user=user)
            kind, fmt, out = ans.kind, ans.fmt, ans.body
            elapsed = time.perf_counter() - t0
            summary = {"read_rows": "0", "read_bytes": "0", "written_rows": "0", "written_bytes": "0",
                       "total_rows_to_read": "0", "result_bytes": str(len(out)), "elapsed_ns": str(int(elapsed * 1e9))}
            if ans.rows is not None:
                summary["result_rows"] = str(ans.rows)
            headers = {"X-ClickHouse-Query-Id": query_id, "X-ClickHouse-Format": fmt,
                       "X-ClickHouse-Summary": json.dumps(summary, separators=(",", ":")),
                       "X-ClickHouse-Timezone": "UTC", "X-ClickHouse-Server-Display-Name": "dpch-gateway"}
            if ans.meta.get("epsilon") is not None:
                headers["X-DPCH-Epsilon"] = repr(float(ans.meta["epsilon"]))
                headers["X-DPCH-Delta"] = repr(float(ans.meta.get("delta") or 0.0))
                headers.update(bias_headers(ans.meta.get("bias")))
            gw.access.write(user=user, query_id=query_id, kind=kind, outcome="accepted", format=fmt,
                            epsilon=ans.meta.get("epsilon"), delta=ans.meta.get("delta"),
                            dataset=ans.meta.get("dataset"), receipt=ans.meta.get("receipt"), rows=ans.rows,
                            duration_ms=round(elapsed * 1e3, 3), remote=_remote(request), query_sha256=sql_hash)
            return Response(out, headers=headers, media_type=formats.content_type(fmt))
        except ClientDisconnect:
            gw.access.write(user=user, query_id=query_id, kind=kind, outcome="rejected", code="client_disconnect",
                            duration_ms=round((time.perf_counter() - t0) * 1e3, 3), remote=_remote(request))
            return Response(b"", status_code=400)
        except Exception as exc:  # noqa: BLE001
            err = from_dpch(exc)
            if err.code == 1002:
                log.error("internal error answering query %s: %s", query_id, type(exc).__name__)
            gw.access.write(user=user, query_id=query_id, kind=kind, outcome="rejected", code=err.code,
                            error=err.name, duration_ms=round((time.perf_counter() - t0) * 1e3, 3),
                            remote=_remote(request), query_sha256=sql_hash)
            return _error_response(err, query_id)

    def json_route(kind: str, parse, run, dataset_and_epsilon):
        """A POST route whose JSON body is one whole DP session (sparse vector, PTR): parse →
        run on an engine thread as the authenticated analyst → JSON, with the ε charged in
        X-DPCH-Epsilon/X-DPCH-Delta and one access-log line either way."""

        async def handler(request: Request) -> Response:
            t0 = time.perf_counter()
            query_id = str(uuid.uuid4())
            user = None
            try:
                params = _params(request)
                limits.check_params(params)
                limits.check_headers(request.headers)
                user = await authenticate(request, params)
                body = await _read_body(request, cfg)
                try:
                    req = parse(json.loads(body.decode("utf-8")))
                except (UnicodeDecodeError, ValueError, RecursionError):  # bad JSON, nesting, huge ints
                    raise GatewayError(CANNOT_PARSE_INPUT, "the body is not a JSON object") from None
                out = await gw.on_engine(lambda: run(gw.connection(user), req), user=user)
                dataset, eps, dlt, rows = dataset_and_epsilon(req, out)
                gw.access.write(user=user, query_id=query_id, kind=kind, outcome="accepted", format="JSON",
                                epsilon=eps, delta=dlt, dataset=dataset, receipt=out["receipt"], rows=rows,
                                duration_ms=round((time.perf_counter() - t0) * 1e3, 3), remote=_remote(request))
                return Response(json.dumps(out).encode(), media_type="application/json",
                                headers={"X-DPCH-Epsilon": repr(float(eps)), "X-DPCH-Delta": repr(float(dlt))})
            except Exception as exc:  # noqa: BLE001
                err = from_dpch(exc)
                gw.access.write(user=user, query_id=query_id, kind=kind, outcome="rejected", code=err.code,
                                error=err.name, duration_ms=round((time.perf_counter() - t0) * 1e3, 3),
                                remote=_remote(request))
                return _error_response(err, query_id)

        return handler

    from . import ptr as gw_ptr
    from . import svt as gw_svt

    # POST /dpch/svt: one sparse-vector session carrying its queries (dpch.gateway.svt)
    svt = json_route("svt", gw_svt.parse_request, gw_svt.run_session,
                     lambda req, out: (req["dataset"], out["epsilon_spent"], 0.0, len(out["answers"])))
    # POST /dpch/ptr: one propose-test-release statistic (dpch.gateway.ptr, docs/PTR.md)
    ptr = json_route("ptr", gw_ptr.parse_request, gw_ptr.run_request,
                     lambda req, out: (req["dataset"], out["epsilon_charged"], out["delta"],
                                       int(out["value"] is not None)))

    async def not_found(request: Request) -> Response:
        return _error_response(GatewayError((0, "NOT_FOUND", 404), f"there is no handler for {request.url.path[:64]}; "
                                            "send queries to / and health checks to /ping"))

    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app):
        await gw.startup()
        native = None
        if cfg.native is not None:  # the native protocol shares gw (docs/GATEWAY.md "Native protocol")
            from .native import start as start_native

            native = await start_native(gw, cfg.native)
        print(f"dpch serve: ready ({'server ' + cfg.backend_url if cfg.backend_url else 'embedded engine'}, "
              f"data dir {cfg.data_dir})", file=sys.stderr, flush=True)
        try:
            yield
        finally:
            if native is not None:
                await native.stop()
            await gw.shutdown()
            print("dpch serve: stopped", file=sys.stderr, flush=True)

    routes = [Route("/ping", ping, methods=["GET", "HEAD"]),
              Route("/replicas_status", ping, methods=["GET", "HEAD"]),
              Route("/", query, methods=["GET", "POST", "PUT", "DELETE", "PATCH"]),
              Route("/query", query, methods=["GET", "POST"]),
              Route("/dpch/svt", svt, methods=["POST"]),
              Route("/dpch/ptr", ptr, methods=["POST"])]
    from . import console  # the web console, its JSON routes and CORS (docs/GATEWAY.md "Web console")

    routes += console.routes(gw, authenticate, params_of=_params, read_body=_read_body, error_response=_error_response)
    app = Starlette(routes=routes, lifespan=lifespan)
    app.add_middleware(console.ConsoleMiddleware)
    app.add_route("/{path:path}", not_found, methods=["GET", "POST", "HEAD", "PUT", "DELETE"])
    app.state.gateway = gw
    return app


def _remote(request: Request) -> str | None:
    c = request.client
    return f"{c.host}:{c.port}" if c else None


def serve(cfg: GatewayConfig, host: str = "127.0.0.1", port: int = 8123,
          http_limits: limits.HttpLimits | None = None) -> int:
    """Run the gateway in the foreground. Transport limits (docs/GATEWAY.md "Request limits"):
    header and keep-alive timeouts, connections per client address and in all, header size."""
    import uvicorn

    from .transport import guarded_protocol

    lim = http_limits or limits.HttpLimits()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    app = build_app(cfg)
    config = uvicorn.Config(app, host=host, port=port, loop="asyncio", http=guarded_protocol(lim), lifespan="on",
                            access_log=False, log_level="warning", limit_concurrency=lim.max_connections,
                            backlog=lim.backlog, timeout_keep_alive=lim.keep_alive_timeout,
                            timeout_graceful_shutdown=15, h11_max_incomplete_event_size=lim.max_header_bytes,
                            server_header=False)
    server = uvicorn.Server(config)
    set_process_interface(GATEWAY)  # errors advise in the gateway's words, in every thread (dpch.errors)
    with interface(GATEWAY):
        server.run()
    return 0 if server.started else 1
