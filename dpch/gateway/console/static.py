"""The console's assets, read once from this package's ``static/`` directory (package data: an
installed wheel has them too). Only the names in ``ASSETS`` are served: no path from the request
reaches the file system. The page's Content-Security-Policy allows this origin only (no CDN, no
inline script) and no framing."""
from __future__ import annotations

from functools import lru_cache
from importlib import resources

ASSETS = {"console.js": b"text/javascript; charset=utf-8", "console.css": b"text/css; charset=utf-8",
          "index.html": b"text/html; charset=utf-8"}
SECURITY_HEADERS = [
    (b"content-security-policy", b"default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; "
                                 b"base-uri 'none'; form-action 'none'"),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-cache"),
]


@lru_cache(maxsize=None)
def asset(name: str) -> bytes | None:
    """The bytes of a known asset, else None."""
    if name not in ASSETS:
        return None
    return resources.files(__package__).joinpath("static", name).read_bytes()


def asset_headers(name: str) -> list[tuple[bytes, bytes]]:
    return [(b"content-type", ASSETS[name])] + SECURITY_HEADERS


def console_page() -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """(body, headers) of the console's HTML page."""
    return asset("index.html"), asset_headers("index.html")
