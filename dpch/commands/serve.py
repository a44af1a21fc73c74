"""`dpch serve`: run the DP gateway (ClickHouse HTTP interface) in the foreground; logs to stderr.

    dpch serve [--data-dir DIR] [--host 127.0.0.1] [--port 8123]
               [--backend URL --backend-user U --backend-password-file F]

The data directory holds the ledger, the user store (``dpch users``) and, for the embedded engine,
the store itself. See docs/GATEWAY.md.
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
    p.set_defaults(func=_run)


def _run(args) -> int:
    from ..config import default_data_dir
    from ..gateway import GatewayConfig, serve

    data_dir = Path(args.data_dir).resolve() if args.data_dir else default_data_dir().resolve()
    password = os.environ.get("DPCH_BACKEND_PASSWORD", "")
    if args.backend_password_file:
        password = Path(args.backend_password_file).read_text().rstrip("\r\n")
    cfg = GatewayConfig(data_dir=data_dir, backend_url=args.backend, backend_user=args.backend_user,
                        backend_password=password, max_body_bytes=args.max_body_bytes,
                        body_timeout=args.body_timeout, access_log=args.access_log)
    from ..gateway.limits import HttpLimits

    lim = HttpLimits(header_timeout=args.header_timeout, keep_alive_timeout=args.keep_alive_timeout,
                     max_connections_per_ip=args.max_connections_per_ip, max_connections=args.max_connections)
    return serve(cfg, host=args.host, port=args.port, http_limits=lim)
