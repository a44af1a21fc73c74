"""`dpch serve`: the DP gateway. It speaks ClickHouse's HTTP interface, authenticates analysts
against a server-side user store and answers only differentially private queries (through the
controller, charging the server-side ledger) and metadata queries about the privacy catalog.

Modules, along the request pipeline: ``server`` (process, HTTP, threads), ``auth`` (credentials),
``router`` (one query: parse, FORMAT/SETTINGS, route), ``metadata`` (SHOW/DESCRIBE/system tables
from the catalog), ``dpch.dp_functions`` (dp_* calls → controller queries), ``formats``
(ClickHouse's own formatters), ``accesslog`` (JSON lines), ``errors`` (ClickHouse error shape,
DPCH codes). See docs/GATEWAY.md.
"""
from .server import GatewayConfig, build_app, serve

__all__ = ["GatewayConfig", "build_app", "serve"]
