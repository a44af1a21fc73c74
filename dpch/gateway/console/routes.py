"""The console's routes, registered by ``dpch.gateway.server.build_app``:

| route | answer |
|---|---|
| ``GET /play`` | the console page (``/`` too, for a browser: dpch.gateway.console.middleware) |
| ``GET /dashboard`` | a redirect to ``/play`` |
| ``GET /play/static/<name>`` | the page's script and style sheet (package data) |
| ``GET /dpch/budget`` | the authenticated analyst's budgets (JSON) |
| ``GET /dpch/history`` | the authenticated analyst's own charges (JSON) |
| ``GET /dpch/catalog`` | the privacy catalog's declared metadata (JSON) |
| ``POST /dpch/explain`` | the plan and cost of the SQL in the body, nothing run or charged (JSON) |

The JSON routes authenticate like the query route (Basic, ``X-ClickHouse-User``/``Key``, URL
parameters), run on an engine thread, and answer errors in ClickHouse's shape."""
from __future__ import annotations

import json
import time
import uuid

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from .. import limits
from ..errors import CANNOT_PARSE_INPUT, GatewayError, from_dpch
from ..router import DP_SETTING_NAMES
from . import views
from .static import asset, asset_headers, console_page

NOT_FOUND = (0, "NOT_FOUND", 404)


def _raw(body: bytes, headers: list[tuple[bytes, bytes]]) -> Response:
    r = Response(body)
    r.raw_headers = headers + [(b"content-length", str(len(body)).encode())]
    return r


async def play(request: Request) -> Response:
    return _raw(*console_page())


async def dashboard(request: Request) -> Response:
    return RedirectResponse("/play", status_code=302)


def routes(gw, authenticate, *, params_of, read_body, error_response) -> list[Route]:
    """The console's routes for gateway ``gw``, built from the gateway's own request helpers
    (dpch.gateway.server): ``authenticate(request, params)`` returns the verified user name or
    raises, ``params_of(request)`` parses the URL parameters, ``read_body(request, cfg)`` reads a
    size- and time-limited body, ``error_response(err)`` renders a GatewayError."""

    async def static_asset(request: Request) -> Response:
        name = request.path_params["name"]
        body = asset(name) if name != "index.html" else None
        if body is None:
            return error_response(GatewayError(NOT_FOUND, "there is no such console asset"))
        return _raw(body, asset_headers(name))

    def json_route(kind: str, compute, *, with_body: bool = False):
        async def handler(request: Request) -> Response:
            t0 = time.perf_counter()
            user = None
            try:
                params = params_of(request)
                limits.check_params(params)
                limits.check_headers(request.headers)
                user = await authenticate(request, params)
                body = await read_body(request, gw.cfg) if with_body else b""
                out = await gw.on_engine(compute, user, params, body, user=user)
                if kind == "explain":  # the others only read: the access log records query-like requests
                    gw.access.write(user=user, query_id=str(uuid.uuid4()), kind=kind, outcome="accepted",
                                    duration_ms=round((time.perf_counter() - t0) * 1e3, 3))
                return Response(json.dumps(out, allow_nan=False).encode(), media_type="application/json")
            except Exception as exc:  # noqa: BLE001 - mapped to a data-free message
                err = from_dpch(exc)
                if kind == "explain":
                    gw.access.write(user=user, query_id=str(uuid.uuid4()), kind=kind, outcome="rejected",
                                    code=err.code, error=err.name,
                                    duration_ms=round((time.perf_counter() - t0) * 1e3, 3))
                return error_response(err)

        return handler

    def budget(user, params, body):
        return views.budgets(gw.connection(user).ledger, user)

    def history(user, params, body):
        return views.history(gw.connection(user).ledger, user)

    def catalog(user, params, body):
        return views.catalog(gw.catalog_entries())

    def explain(user, params, body):
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            raise GatewayError(CANNOT_PARSE_INPUT, "the query is not valid UTF-8") from None
        q = params.get("query", "")
        sql = q + ("\n" if q and text else "") + text
        limits.check_query_text(sql)
        settings = {k.lower(): v for k, v in params.items() if k.lower() in DP_SETTING_NAMES}
        return views.explain(gw.connection(user), sql, settings)

    return [Route("/play", play, methods=["GET"]),
            Route("/dashboard", dashboard, methods=["GET"]),
            Route("/play/static/{name}", static_asset, methods=["GET"]),
            Route("/dpch/budget", json_route("budget", budget), methods=["GET"]),
            Route("/dpch/history", json_route("history", history), methods=["GET"]),
            Route("/dpch/catalog", json_route("catalog", catalog), methods=["GET"]),
            Route("/dpch/explain", json_route("explain", explain, with_body=True), methods=["POST"])]
