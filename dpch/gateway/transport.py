"""The HTTP transport's own limits, below the application: a header-read timeout and a cap on open
connections per client address (issue 27: 520 half-open connections made uvicorn answer 503 to
everyone).

uvicorn's h11 protocol has a keep-alive timeout, which starts only after a response and stops at
the first byte of the next request, so a connection that sends nothing, or sends its headers one
byte at a time, stays open for ever. ``guarded_protocol`` returns an ``H11Protocol`` subclass that

- closes a connection whose request headers are not complete ``header_timeout`` seconds after the
  connection opened or after its previous response (a request in progress is the application's:
  body timeout, request deadline);
- answers ``503`` (code 202 TOO_MANY_SIMULTANEOUS_QUERIES) and closes a connection from an address
  that already holds ``max_connections_per_ip`` open connections, before reading anything.

All of it runs on the event loop (asyncio protocols are single-threaded), so the counters need no
lock. Nothing here sees a request's content: no data dependence.
"""
from __future__ import annotations

from collections import Counter

from uvicorn.protocols.http.h11_impl import H11Protocol

from .limits import HttpLimits

_BUSY = (b"Code: 202. DB::Exception: too many open connections from your address; "
         b"close idle ones and try again. (TOO_MANY_SIMULTANEOUS_QUERIES)\n")
REFUSAL = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=UTF-8\r\n"
           b"X-ClickHouse-Exception-Code: 202\r\nConnection: close\r\n"
           b"Content-Length: " + str(len(_BUSY)).encode() + b"\r\n\r\n" + _BUSY)


def guarded_protocol(limits: HttpLimits) -> type[H11Protocol]:
    """An H11Protocol class enforcing ``limits.header_timeout`` and
    ``limits.max_connections_per_ip``; one counter per server (per call)."""
    open_per_ip: Counter[str] = Counter()

    class GuardedH11Protocol(H11Protocol):
        _ip: str | None = None
        _header_timer = None

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            ip = self.client[0] if self.client else None
            if ip is not None and open_per_ip[ip] >= limits.max_connections_per_ip:
                transport.write(REFUSAL)
                transport.close()
                return
            self._ip = ip
            if ip is not None:
                open_per_ip[ip] += 1
            self._arm()

        def connection_lost(self, exc) -> None:
            self._disarm()
            if self._ip is not None:
                open_per_ip[self._ip] -= 1
                if open_per_ip[self._ip] <= 0:
                    del open_per_ip[self._ip]
                self._ip = None
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._in_request():
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and not self._in_request():
                self._arm()

        # -- the header timer ------------------------------------------------------------------
        def _in_request(self) -> bool:
            return self.cycle is not None and not self.cycle.response_complete

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(limits.header_timeout, self._header_timeout)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _header_timeout(self) -> None:
            self._header_timer = None
            if not self._in_request() and not self.transport.is_closing():
                self.transport.close()

    return GuardedH11Protocol
