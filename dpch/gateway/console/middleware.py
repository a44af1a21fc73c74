"""What ClickHouse's HTTP handler does before routing, for browsers:

- ``OPTIONS`` (a CORS preflight, any path): ``204 No Content`` with the headers of ClickHouse's
  documented ``http_options_response`` example (Allow-Origin ``*``, Allow-Headers, Allow-Methods,
  Max-Age 86400); no credentials are asked for and nothing runs.
- ``GET``/``HEAD /`` with no query string: ClickHouse's ``http_server_default_response``, "Ok.\\n";
  the console page instead when the request's Accept header prefers ``text/html`` (a browser).
- ``add_http_cors_header=1`` as a URL parameter, on a request that carries an ``Origin`` header:
  ``Access-Control-Allow-Origin: *`` on the response (ClickHouse adds it only then), errors included,
  and ``Access-Control-Expose-Headers`` so that a page can read the charged cost.

Nothing here reads a body, a credential or the engine: no data dependence."""
from __future__ import annotations

from urllib.parse import parse_qsl

from .static import console_page

PREFLIGHT_HEADERS = [
    (b"access-control-allow-origin", b"*"),
    (b"access-control-allow-headers", b"origin, x-requested-with, x-clickhouse-format, x-clickhouse-user, "
                                      b"x-clickhouse-key, x-clickhouse-database, x-clickhouse-query-id, "
                                      b"authorization, content-type"),
    (b"access-control-allow-methods", b"POST, GET, OPTIONS"),
    (b"access-control-max-age", b"86400"),
]
CORS_HEADERS = [
    (b"access-control-allow-origin", b"*"),
    (b"access-control-expose-headers", b"X-ClickHouse-Query-Id, X-ClickHouse-Format, X-ClickHouse-Summary, "
                                       b"X-ClickHouse-Exception-Code, X-DPCH-Epsilon, X-DPCH-Delta"),
]
DEFAULT_RESPONSE = b"Ok.\n"


def prefers_html(accept: str) -> bool:
    """True when an Accept header ranks ``text/html`` (or ``text/*``) at least as high as anything
    else and above zero: a browser's navigation ("text/html,…,*/*;q=0.8"), not curl's ``*/*`` nor a
    client's ``application/json``."""
    html_q, other_q = 0.0, 0.0
    for part in accept.split(",")[:64]:
        fields = [f.strip() for f in part.split(";")]
        media = fields[0].lower()
        if not media:
            continue
        q = 1.0
        for f in fields[1:]:
            name, _, value = f.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        if media in ("text/html", "application/xhtml+xml", "text/*"):
            html_q = max(html_q, q)
        else:
            other_q = max(other_q, q)
    return html_q > 0 and html_q >= other_q


def _header(scope, name: bytes) -> str:
    for k, v in scope.get("headers", ()):
        if k == name:
            return v.decode("latin-1")
    return ""


def _cors_requested(scope) -> bool:
    qs = scope.get("query_string", b"")
    if b"add_http_cors_header" not in qs or not _header(scope, b"origin"):
        return False
    try:
        params = dict(parse_qsl(qs.decode("ascii"), keep_blank_values=True, max_num_fields=1000))
    except (UnicodeDecodeError, ValueError):
        return False  # the query route answers the malformed parameters
    return params.get("add_http_cors_header", "0").strip().lower() in ("1", "true")


async def _send(send, status: int, headers: list, body: bytes, head: bool) -> None:
    headers = headers + [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": b"" if head else body})


class ConsoleMiddleware:
    """Pure ASGI middleware in front of the gateway's routes (see the module docstring)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        method = scope["method"]
        if method == "OPTIONS":
            return await _send(send, 204, list(PREFLIGHT_HEADERS), b"", True)
        if scope["path"] == "/" and method in ("GET", "HEAD") and not scope.get("query_string"):
            if prefers_html(_header(scope, b"accept")):
                body, headers = console_page()
            else:
                body, headers = DEFAULT_RESPONSE, [(b"content-type", b"text/plain; charset=UTF-8")]
            return await _send(send, 200, headers, body, method == "HEAD")
        if not _cors_requested(scope):
            return await self.app(scope, receive, send)

        async def send_with_cors(message):
            if message["type"] == "http.response.start":
                names = {k.lower() for k, _ in CORS_HEADERS}
                kept = [(k, v) for k, v in message.get("headers", []) if k.lower() not in names]
                message = {**message, "headers": kept + CORS_HEADERS}
            await send(message)

        return await self.app(scope, receive, send_with_cors)
