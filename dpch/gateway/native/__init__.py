"""ClickHouse's native TCP protocol for the DP gateway (``dpch serve --tcp-port N``; docs/GATEWAY.md
"Native protocol"). Modules: ``protocol`` (wire primitives, Hello and Query packets), ``compression``
(CityHash128-checked LZ4 frames), ``columns`` (the answer as Native blocks), ``server`` (the asyncio
server sharing the HTTP gateway's authentication, engine threads, router and access log)."""
from .server import NativeConfig, start

__all__ = ["NativeConfig", "start"]
