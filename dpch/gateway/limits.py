"""Request limits of the gateway (issue 27, item 5): every cap on what one request may ask for, and
the checks that enforce the caps on the request's text and parameters.

Each check runs on the event loop before the request reaches the engine thread, so a refused
request runs nothing and charges nothing, and its refusal depends on the request alone (its size,
its characters), never on data. The transport limits (header timeout, connections per client) are
in ``dpch.gateway.transport``; the defaults are listed in docs/GATEWAY.md "Request limits".
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import BAD_ARGUMENTS, SYNTAX_ERROR, GatewayError

#: bytes of SQL text (URL ``query`` + body), ClickHouse's ``max_query_size`` default
MAX_QUERY_BYTES = 262_144
#: lexical tokens of one query, ClickHouse's ``max_ast_elements`` default
MAX_QUERY_TOKENS = 50_000
#: parenthesis nesting of one query, ClickHouse's ``max_parser_depth`` default
MAX_QUERY_DEPTH = 1_000
#: Σ (length of a whitespace run)² over a query: the router's trailing-FORMAT regex
#: (``\s+FORMAT…$``, searched at every position) costs about that many steps, and holds the GIL
#: while it runs; 2·10^7 is well under 1 s (a 20 000-space run took 10 s). Ordinary indentation
#: (5 000 lines of 40 spaces: 8·10^6) stays below it.
MAX_WHITESPACE_WORK = 20_000_000
#: columns of an answer the gateway computes itself (constant SELECT, system.* tables, SHOW)
MAX_RESULT_COLUMNS = 1_000
#: cells (rows × columns) of such an answer
MAX_RESULT_CELLS = 1_000_000
#: characters of a LIKE/ILIKE pattern in a metadata query
MAX_LIKE_PATTERN = 1_000
#: character comparisons all LIKE/ILIKE of one metadata query may make (under 0.5 s of Python)
MAX_LIKE_WORK = 2_000_000
#: nodes of a WHERE clause on the gateway's system tables
MAX_METADATA_WHERE_NODES = 2_000
#: characters of an echoed parameter (query_id, session_id, database, quota_key, …)
MAX_PARAM_CHARS = 128
#: characters of any other parameter value (settings, transport options)
MAX_OTHER_PARAM_CHARS = 4_096


@dataclass(frozen=True)
class HttpLimits:
    """Transport limits of ``dpch serve`` (uvicorn + dpch.gateway.transport)."""

    header_timeout: float = 10.0  # s from a connection (or the end of a response) to a request's full headers
    keep_alive_timeout: float = 5.0  # s an idle keep-alive connection stays open
    max_connections_per_ip: int = 64  # open connections from one client address
    max_connections: int = 1_024  # open connections in all (uvicorn limit_concurrency: 503 beyond)
    max_header_bytes: int = 65_536  # request line + headers (h11 max incomplete event size)
    backlog: int = 512


# one token: a quoted string/identifier (possibly unterminated), a word, or one other character.
# The alternatives of each quoted form are disjoint, so the scan is linear.
_SPACE = re.compile(r"\s{2,}")
_TOKEN = re.compile(r"'(?:[^'\\]|\\.)*'?|\"(?:[^\"\\]|\\.)*\"?|`(?:[^`\\]|\\.)*`?|\w+|\S", re.S)


def check_query_text(sql: str, what: str = "query") -> None:
    """Refuse (62 SYNTAX_ERROR, as ClickHouse does for ``max_query_size``) SQL text over the size,
    token or nesting caps, before any parser sees it: sqlglot and the planner are linear or worse
    in these."""
    n = len(sql.encode("utf-8"))
    if n > MAX_QUERY_BYTES:
        raise GatewayError(SYNTAX_ERROR, f"Max query size exceeded: the {what} has {n} bytes; "
                           f"the limit is {MAX_QUERY_BYTES}")
    work = sum((m.end() - m.start()) ** 2 for m in _SPACE.finditer(sql))
    if work > MAX_WHITESPACE_WORK:
        raise GatewayError(SYNTAX_ERROR, f"the {what} has too much consecutive whitespace; shorten its runs of "
                           "spaces and line breaks")
    tokens = depth = deepest = 0
    for m in _TOKEN.finditer(sql):
        tokens += 1
        t = m.group()
        if t == "(" or t == "[":
            depth += 1
            deepest = max(deepest, depth)
        elif t == ")" or t == "]":
            depth -= 1
    if tokens > MAX_QUERY_TOKENS:
        raise GatewayError(SYNTAX_ERROR, f"the {what} is too large: {tokens} tokens; the limit is {MAX_QUERY_TOKENS}")
    if deepest > MAX_QUERY_DEPTH:
        raise GatewayError(SYNTAX_ERROR, f"the {what} is nested too deeply: {deepest} levels of parentheses; "
                           f"the limit is {MAX_QUERY_DEPTH}")


# values echoed in a response header: visible ASCII, inner spaces allowed (RFC 9110 field-value)
_ECHOED = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?")
_FORMAT = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
#: parameters (and their header forms) checked as echoed values
ECHOED_PARAMS = ("query_id", "session_id", "quota_key", "role", "session_check", "session_timeout",
                 "client_protocol_version")


def _bad(name: str, rule: str) -> GatewayError:
    # never echo the value: it may hold anything, including CR/LF
    return GatewayError(BAD_ARGUMENTS, f"invalid value of {name}: {rule}")


def check_echoed(name: str, value: str) -> str:
    """A value the response may echo (query_id, session_id, …): 1-128 visible ASCII characters,
    no leading/trailing space; else 36 BAD_ARGUMENTS without the value."""
    if len(value) > MAX_PARAM_CHARS or not _ECHOED.fullmatch(value):
        raise _bad(name, f"1 to {MAX_PARAM_CHARS} visible ASCII characters expected")
    return value


def check_database(value: str) -> str:
    if not value or len(value) > MAX_PARAM_CHARS or _CONTROL.search(value) or value != value.strip():
        raise _bad("database", f"a database name of 1 to {MAX_PARAM_CHARS} characters without control characters "
                   "expected")
    return value


def check_format_name(value: str) -> str:
    if not _FORMAT.fullmatch(value):
        raise _bad("default_format", "a format name (letters, digits, _) expected")
    return value


def check_params(params: dict[str, str]) -> None:
    """Every URL parameter: echoed ones as check_echoed, ``database``/``default_format`` by their
    own rule, every other value (but the SQL in ``query``) free of control characters and at most
    4096 characters. Names: at most 128 characters, no control characters."""
    for k, v in params.items():
        if len(k) > MAX_PARAM_CHARS or _CONTROL.search(k):
            raise GatewayError(BAD_ARGUMENTS, "invalid URL parameter name")
        if k in ECHOED_PARAMS:
            check_echoed(k, v)
        elif k == "database":
            if v:
                check_database(v)
        elif k == "default_format":
            if v:
                check_format_name(v)
        elif k in ("user", "password"):
            if len(v) > MAX_OTHER_PARAM_CHARS or _CONTROL.search(v):
                raise _bad(k, "no control characters expected")
        elif k != "query":
            if len(v) > MAX_OTHER_PARAM_CHARS or _CONTROL.search(v):
                raise _bad(k, f"at most {MAX_OTHER_PARAM_CHARS} characters without control characters expected")


#: request headers that carry parameters, with their check
HEADER_PARAMS = {"x-clickhouse-query-id": lambda v: check_echoed("X-ClickHouse-Query-Id", v),
                 "x-clickhouse-database": check_database,
                 "x-clickhouse-format": check_format_name,
                 "x-clickhouse-quota": lambda v: check_echoed("X-ClickHouse-Quota", v),
                 "x-clickhouse-session-id": lambda v: check_echoed("X-ClickHouse-Session-Id", v)}


def check_headers(headers) -> None:
    """The parameter-carrying headers, as their URL forms; user and key: no control characters.
    (h11 already refuses CR/LF in any header; these rules also refuse other control bytes.)"""
    for name, check in HEADER_PARAMS.items():
        v = headers.get(name)
        if v is not None:
            check(v)
    for name in ("x-clickhouse-user", "x-clickhouse-key"):
        v = headers.get(name)
        if v is not None and (len(v) > MAX_OTHER_PARAM_CHARS or _CONTROL.search(v)):
            raise _bad(name, "no control characters expected")


#: simultaneous queries (running or waiting for an engine thread) of one user, when not configured
DEFAULT_QUERIES_PER_USER = 16


@dataclass(frozen=True)
class UserQueryCaps:
    """ClickHouse's ``max_concurrent_queries_for_user``: how many queries one user may have in the
    gateway at once (running on an engine thread or waiting for one). One more is refused at once
    with 202 TOO_MANY_SIMULTANEOUS_QUERIES, before anything runs or is charged; the refusal depends
    on the user's own requests in flight only. ``per_user`` overrides ``default`` by user name;
    0 means no cap for that user (the gateway's ``max_queued`` still bounds every request)."""

    default: int = DEFAULT_QUERIES_PER_USER
    per_user: tuple[tuple[str, int], ...] = ()

    def __post_init__(self):
        for name, n in (("default", self.default), *self.per_user):
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise ValueError(f"max concurrent queries for {name}: a whole number >= 0 expected")

    def for_user(self, user: str) -> int:
        return dict(self.per_user).get(user, self.default)

    @classmethod
    def parse(cls, values: list[str] | None) -> "UserQueryCaps":
        """From ``--max-concurrent-queries-for-user`` values: ``N`` (everyone) or ``USER=N`` (one user)."""
        default, per = DEFAULT_QUERIES_PER_USER, {}
        for v in values or ():
            name, sep, n = v.rpartition("=")
            if not n.strip().isdigit() or (sep and not name):
                raise ValueError(f"--max-concurrent-queries-for-user: N or USER=N expected, got {v!r}")
            if sep:
                per[name] = int(n)
            else:
                default = int(n)
        return cls(default, tuple(sorted(per.items())))
