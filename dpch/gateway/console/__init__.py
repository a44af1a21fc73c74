"""The gateway's web console (issue 30 item 5): a page at ``/play`` (and at ``/`` for a browser's
GET without a query), its assets served from this package (no external CDN), the read-only JSON
routes it uses (``/dpch/budget``, ``/dpch/history``, ``/dpch/catalog``, ``POST /dpch/explain``),
and ClickHouse's CORS behaviour (``add_http_cors_header``, OPTIONS preflights).

``dpch.gateway.server.build_app`` registers ``routes(...)`` and wraps the app in
``ConsoleMiddleware``. Privacy: the console is a client like any other; it sends analyst SQL to
``/`` with the analyst's credentials, and the JSON routes show only the authenticated analyst's own
budgets and charges, and catalog metadata that the administrator declared (docs/GATEWAY.md
"Web console")."""
from .middleware import ConsoleMiddleware
from .routes import routes

__all__ = ["ConsoleMiddleware", "routes"]
