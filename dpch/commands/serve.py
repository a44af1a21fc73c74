"""`dpch serve`: run the DP gateway (ClickHouse HTTP interface) in the foreground; logs to stderr.

    dpch serve [--data-dir DIR] [--host 127.0.0.1] [--port 8123]
               [--backend URL --backend-user U --backend-password-file F] [--ledger PATH|postgresql://…]
               [--tcp-port 9000 [--tcp-idle-timeout S]]
               [--max-execution-time S --max-memory-usage B --max-rows-to-read N
                --max-result-rows N --max-bytes-to-read B] [--engine-sessions N] [--unconfined]
               [--max-concurrent-queries-for-user [USER=]N ...]

The data directory holds the ledger, the user store (``dpch users``) and, for the embedded engine,
the store itself, which a Landlock-confined worker process owns (dpch.engine_worker): the gateway
refuses to start when the kernel cannot confine it, unless ``--unconfined`` (or
``DPCH_ENGINE_UNCONFINED=1``) says so explicitly. The engine limits apply to every statement the
worker runs (a user's record may override them). ``--engine-sessions`` engine connections run queries
in parallel (one analyst uses at most N - 1). See docs/GATEWAY.md, "Confinement and limits".
"""
from __future__ import annotations

import os
from pathlib import Path


def register(subparsers) -> None:
    p = subparsers.add_parser("serve", help="run the DP gateway (ClickHouse HTTP interface) in the foreground")
    p.add_argument("--data-dir", default=None, help="data directory (default $DPCH_DATA_DIR or ./.dpch_data)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8123)
    p.add_argument("--backend", default=None, metavar="URL",
                   help="a ClickHouse server (e.g. http://clickhouse:8123); default: the embedded engine in DIR")
    p.add_argument("--backend-user", default="default")
    p.add_argument("--ledger", default=None, metavar="PATH|URL",
                   help="the ledger: an SQLite file (default DIR/ledger.sqlite) or postgresql://… shared by "
                        "several gateways (docs/DEPLOY.md)")
    p.add_argument("--backend-password-file", default=None, metavar="FILE",
                   help="file holding the backend user's password (or $DPCH_BACKEND_PASSWORD)")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20)
    p.add_argument("--body-timeout", type=float, default=10.0, help="seconds to receive a request body")
    p.add_argument("--header-timeout", type=float, default=10.0,
                   help="seconds for a connection to send a request's headers (docs/GATEWAY.md 'Request limits')")
    p.add_argument("--keep-alive-timeout", type=float, default=5.0, help="seconds an idle connection stays open")
    p.add_argument("--max-connections-per-ip", type=int, default=64,
                   help="open connections from one client address (more are answered 503 and closed)")
    p.add_argument("--max-connections", type=int, default=1024, help="open connections in all")
    p.add_argument("--access-log", default=None, metavar="PATH",
                   help="JSON-lines access log (default DIR/access.log; '-' for stderr)")
    from ..engine_worker import EngineLimits

    d = EngineLimits()
    p.add_argument("--max-execution-time", type=float, default=d.max_execution_time, metavar="S",
                   help="engine limit: seconds per statement (the worker is restarted 10 s later if stuck)")
    p.add_argument("--max-memory-usage", type=int, default=d.max_memory_usage, metavar="BYTES")
    p.add_argument("--max-rows-to-read", type=int, default=d.max_rows_to_read, metavar="N")
    p.add_argument("--max-result-rows", type=int, default=d.max_result_rows, metavar="N",
                   help="engine limit on result rows (ClickHouse checks subqueries too)")
    p.add_argument("--max-bytes-to-read", type=int, default=d.max_bytes_to_read, metavar="BYTES", help="0: no limit")
    from ..engine_worker import DEFAULT_SESSIONS, MAX_SESSIONS

    p.add_argument("--engine-sessions", type=int, default=DEFAULT_SESSIONS, metavar="N",
                   help=f"engine connections (and threads) running queries in parallel, 1 to {MAX_SESSIONS}; "
                        "one analyst uses at most N - 1")
    from ..gateway.limits import DEFAULT_QUERIES_PER_USER

    p.add_argument("--max-concurrent-queries-for-user", action="append", default=None, metavar="[USER=]N",
                   help="queries one user may have running or waiting at once (default "
                        f"{DEFAULT_QUERIES_PER_USER}; 0: no cap); one more is refused with code 202. Repeat with "
                        "USER=N to set one user's cap")
    p.add_argument("--tcp-port", type=int, default=None, metavar="PORT",
                   help="also speak ClickHouse's native TCP protocol on PORT (e.g. 9000; docs/GATEWAY.md "
                        "'Native protocol')")
    p.add_argument("--tcp-idle-timeout", type=float, default=300.0, metavar="S",
                   help="seconds a native connection may stay idle between queries")
    p.add_argument("--unconfined", action="store_true",
                   help="run the embedded engine without Landlock confinement (not for production)")
    p.set_defaults(func=_run)


def _run(args) -> int:
    from ..config import default_data_dir
    from ..gateway import GatewayConfig, serve

    data_dir = Path(args.data_dir).resolve() if args.data_dir else default_data_dir().resolve()
    password = os.environ.get("DPCH_BACKEND_PASSWORD", "")
    if args.backend_password_file:
        password = Path(args.backend_password_file).read_text().rstrip("\r\n")
    from ..engine_worker import EngineLimits

    limits = EngineLimits(max_execution_time=args.max_execution_time, max_memory_usage=args.max_memory_usage,
                          max_rows_to_read=args.max_rows_to_read, max_result_rows=args.max_result_rows,
                          max_bytes_to_read=args.max_bytes_to_read)
    unconfined = args.unconfined or os.environ.get("DPCH_ENGINE_UNCONFINED", "") == "1"
    from ..gateway.limits import UserQueryCaps

    try:
        user_queries = UserQueryCaps.parse(args.max_concurrent_queries_for_user)
    except ValueError as exc:
        raise SystemExit(f"dpch serve: {exc}") from None
    cfg = GatewayConfig(data_dir=data_dir, backend_url=args.backend, backend_user=args.backend_user,
                        backend_password=password, max_body_bytes=args.max_body_bytes,
                        body_timeout=args.body_timeout, access_log=args.access_log, limits=limits,
                        unconfined=unconfined, engine_sessions=args.engine_sessions, ledger=args.ledger,
                        user_queries=user_queries)
    if args.tcp_port is not None:
        from ..gateway.native import NativeConfig

        # the native interface: the HTTP transport's limits, and the HTTP body's cap on the query text
        cfg.native = NativeConfig(port=args.tcp_port, host=args.host, hello_timeout=args.header_timeout,
                                  packet_timeout=args.body_timeout, idle_timeout=args.tcp_idle_timeout,
                                  max_connections_per_ip=args.max_connections_per_ip,
                                  max_connections=args.max_connections, max_query_bytes=args.max_body_bytes)
    from ..gateway.limits import HttpLimits

    lim = HttpLimits(header_timeout=args.header_timeout, keep_alive_timeout=args.keep_alive_timeout,
                     max_connections_per_ip=args.max_connections_per_ip, max_connections=args.max_connections)
    return serve(cfg, host=args.host, port=args.port, http_limits=lim)
