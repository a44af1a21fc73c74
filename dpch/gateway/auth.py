"""Who is asking: credentials from HTTP Basic, ``X-ClickHouse-User``/``X-ClickHouse-Key`` or the
``user``/``password`` URL parameters (what clickhouse-connect, curl and BI tools send), checked
against the user store (dpch.users). Unknown user, wrong password and missing credentials take the
same path (one argon2 verification) and get the same AUTHENTICATION_FAILED error."""
from __future__ import annotations

import base64
import binascii

from .errors import AUTH_FAILED_MESSAGE, AUTHENTICATION_FAILED, BAD_ARGUMENTS, GatewayError


def credentials(headers, params: dict[str, str]) -> tuple[str | None, str | None]:
    """(user, password) from the request; raises GatewayError for a malformed header or for
    conflicting methods (as ClickHouse does)."""
    found = []
    auth = headers.get("authorization")
    if auth is not None:
        scheme, _, value = auth.strip().partition(" ")
        if scheme.lower() != "basic":
            raise GatewayError(AUTHENTICATION_FAILED, "unsupported Authorization scheme: use Basic")
        try:
            raw = base64.b64decode(value.strip(), validate=True)
            text = raw.decode("utf-8")
        except (binascii.Error, ValueError, UnicodeDecodeError):
            raise GatewayError(BAD_ARGUMENTS, "malformed HTTP Basic Authorization header") from None
        user, sep, password = text.partition(":")
        if not sep:
            raise GatewayError(BAD_ARGUMENTS, "malformed HTTP Basic Authorization header (no ':')")
        found.append((user, password))
    if headers.get("x-clickhouse-user") is not None or headers.get("x-clickhouse-key") is not None:
        found.append((headers.get("x-clickhouse-user", ""), headers.get("x-clickhouse-key", "")))
    if "user" in params or "password" in params:
        found.append((params.get("user", ""), params.get("password", "")))
    if len(found) > 1:
        raise GatewayError(BAD_ARGUMENTS, "credentials given in more than one way (Basic header, "
                           "X-ClickHouse-User/Key headers, user/password parameters); use one")
    if not found:
        return None, None
    return found[0]


def auth_failed(user: str | None) -> GatewayError:
    shown = user if user and len(user) <= 64 and user.isprintable() else "default"
    return GatewayError(AUTHENTICATION_FAILED, AUTH_FAILED_MESSAGE.format(user=shown))
