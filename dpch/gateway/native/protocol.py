"""Wire primitives of ClickHouse's native TCP protocol (src/Core/Protocol.h, src/Core/ProtocolDefines.h,
src/Interpreters/ClientInfo.cpp): LEB128 varints, length-prefixed strings, little-endian integers,
packet type numbers, and the parsers of the client's Hello and Query packets.

Every read is bounded before anything is allocated: a string's announced length is checked against
its cap (307 TOO_MANY_BYTES), a varint has at most 10 bytes, a settings list at most 1000 entries.
A malformed packet raises ``ProtocolError``; the stream is then out of step and the server closes
the connection after sending the exception. Nothing here echoes a value the client sent.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

from ..errors import GatewayError

# -- revisions (ProtocolDefines.h): the server announces SERVER_REVISION; a connection uses
#    min(client's, server's), and every field below that revision is read and written ---------------
SERVER_REVISION = 54449  # DBMS_MIN_PROTOCOL_VERSION_WITH_INITIAL_QUERY_START_TIME
MIN_CLIENT_REVISION = 54032  # DBMS_MIN_REVISION_WITH_CLIENT_INFO: older clients are refused
REV_TEMPORARY_TABLES = 50264
REV_TOTAL_ROWS_IN_PROGRESS = 51554
REV_BLOCK_INFO = 51903
REV_CLIENT_INFO = 54032
REV_SERVER_TIMEZONE = 54058
REV_QUOTA_KEY_IN_CLIENT_INFO = 54060
REV_SERVER_DISPLAY_NAME = 54372
REV_VERSION_PATCH = 54401
REV_CLIENT_WRITE_INFO = 54420
REV_SETTINGS_AS_STRINGS = 54429
REV_INTERSERVER_SECRET = 54441
REV_OPENTELEMETRY = 54442
REV_X_FORWARDED_FOR = 54443
REV_REFERER = 54447
REV_DISTRIBUTED_DEPTH = 54448
REV_INITIAL_QUERY_START_TIME = 54449

# -- packet types ----------------------------------------------------------------------------------
C_HELLO, C_QUERY, C_DATA, C_CANCEL, C_PING, C_TABLES_STATUS = 0, 1, 2, 3, 4, 5
S_HELLO, S_DATA, S_EXCEPTION, S_PROGRESS, S_PONG, S_END_OF_STREAM = 0, 1, 2, 3, 4, 5
STAGE_COMPLETE = 2  # QueryProcessingStage::Complete
INTERFACE_TCP, INTERFACE_HTTP = 1, 2

# -- ClickHouse error codes of the protocol layer (src/Common/ErrorCodes.cpp) -------------------------
NOT_IMPLEMENTED = (48, "NOT_IMPLEMENTED", 400)
UNKNOWN_PACKET_FROM_CLIENT = (99, "UNKNOWN_PACKET_FROM_CLIENT", 400)
UNEXPECTED_PACKET_FROM_CLIENT = (101, "UNEXPECTED_PACKET_FROM_CLIENT", 400)
TOO_MANY_BYTES = (307, "TOO_MANY_BYTES", 400)
SOCKET_TIMEOUT = (209, "SOCKET_TIMEOUT", 400)
CHECKSUM_DOESNT_MATCH = (40, "CHECKSUM_DOESNT_MATCH", 400)
UNKNOWN_COMPRESSION_METHOD = (89, "UNKNOWN_COMPRESSION_METHOD", 400)
CANNOT_DECOMPRESS = (271, "CANNOT_DECOMPRESS", 400)
INCORRECT_DATA = (117, "INCORRECT_DATA", 400)

MAX_SHORT = 4_096  # bytes of a name, user, password, setting value, … (limits.MAX_OTHER_PARAM_CHARS)
MAX_SETTINGS = 1_000


class ProtocolError(GatewayError):
    """The client broke the protocol: answered with an Exception packet, then the connection closes."""


# -- writing ---------------------------------------------------------------------------------------

def varint(n: int) -> bytes:
    """Unsigned LEB128, ClickHouse's VarUInt."""
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def string(s: str | bytes) -> bytes:
    """A String: VarUInt byte length, then the UTF-8 bytes."""
    b = s.encode("utf-8") if isinstance(s, str) else s
    return varint(len(b)) + b


def u8(n: int) -> bytes:
    """One UInt8."""
    return struct.pack("<B", n)


def exception_packet(code: int, name: str, message: str) -> bytes:
    """Exception (code, name, message, empty stack trace, no nested exception) in ClickHouse's text
    shape ``DB::Exception: <message>. (<NAME>)``; ``message`` is a gateway message (no data)."""
    text = f"DB::Exception: {message.rstrip('.')}. ({name})"
    return varint(S_EXCEPTION) + struct.pack("<i", code) + string("DB::Exception") + string(text) + string("") + u8(0)


def progress_packet(revision: int) -> bytes:
    """Progress with every counter 0: engine statistics describe the work on private rows and are
    never released (DESIGN.md invariant 11)."""
    fields = 2 + (revision >= REV_TOTAL_ROWS_IN_PROGRESS) + 2 * (revision >= REV_CLIENT_WRITE_INFO)
    return varint(S_PROGRESS) + varint(0) * fields


# -- reading ---------------------------------------------------------------------------------------

class Source:
    """Reads from ``read_exact`` (an async callable returning exactly n bytes)."""

    def __init__(self, read_exact):
        self.read_exact = read_exact

    async def varint(self) -> int:
        n = shift = 0
        for _ in range(10):
            b = (await self.read_exact(1))[0]
            n |= (b & 0x7F) << shift
            if not b & 0x80:
                return n
            shift += 7
        raise ProtocolError(INCORRECT_DATA, "malformed variable-length integer")

    async def bytes_(self, cap: int, what: str) -> bytes:
        n = await self.varint()
        if n > cap:
            raise ProtocolError(TOO_MANY_BYTES, f"the {what} has {n} bytes; the limit is {cap}")
        return await self.read_exact(n) if n else b""

    async def string(self, cap: int = MAX_SHORT, what: str = "string") -> str:
        raw = await self.bytes_(cap, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError(INCORRECT_DATA, f"the {what} is not valid UTF-8") from None

    async def fixed(self, fmt: str):
        return struct.unpack(fmt, await self.read_exact(struct.calcsize(fmt)))[0]


def buffer_source(data: bytes) -> Source:
    """A Source over bytes already received (a decompressed frame)."""
    pos = 0

    async def read_exact(n: int) -> bytes:
        nonlocal pos
        if pos + n > len(data):
            raise ProtocolError(INCORRECT_DATA, "the block ends early")
        pos += n
        return data[pos - n:pos]
    return Source(read_exact)


@dataclass
class Hello:
    client_name: str
    version: tuple[int, int]
    revision: int
    database: str
    user: str
    password: str = field(repr=False)


async def read_hello(src: Source) -> Hello:
    """The client's Hello packet (its type already read)."""
    name = await src.string(what="client name")
    major, minor, rev = await src.varint(), await src.varint(), await src.varint()
    database = await src.string(what="database name")
    user = await src.string(what="user name")
    password = await src.string(what="password")
    return Hello(name, (major, minor), rev, database, user, password)


def server_hello(revision: int, name: str, version: tuple[int, int, int], timezone: str, display: str) -> bytes:
    out = varint(S_HELLO) + string(name) + varint(version[0]) + varint(version[1]) + varint(SERVER_REVISION)
    if revision >= REV_SERVER_TIMEZONE:
        out += string(timezone)
    if revision >= REV_SERVER_DISPLAY_NAME:
        out += string(display)
    if revision >= REV_VERSION_PATCH:
        out += varint(version[2])
    return out


@dataclass
class Query:
    query_id: str
    settings: dict[str, str]
    stage: int
    compression: bool
    text: str


async def _client_info(src: Source, rev: int) -> None:
    """ClientInfo::read: read and dropped (nothing in it is trusted or needed)."""
    kind = (await src.read_exact(1))[0]
    if kind == 0:  # NO_QUERY
        return
    for what in ("initial user", "initial query id", "initial address"):
        await src.string(what=what)
    if rev >= REV_INITIAL_QUERY_START_TIME:
        await src.read_exact(8)
    interface = (await src.read_exact(1))[0]
    if interface == INTERFACE_TCP:
        for what in ("os user", "client host name", "client name"):
            await src.string(what=what)
        for _ in range(3):
            await src.varint()
    elif interface == INTERFACE_HTTP:
        await src.read_exact(1)
        await src.string(what="user agent")
        if rev >= REV_X_FORWARDED_FOR:
            await src.string(what="forwarded-for")
        if rev >= REV_REFERER:
            await src.string(what="referer")
    if rev >= REV_QUOTA_KEY_IN_CLIENT_INFO:
        await src.string(what="quota key")
    if rev >= REV_DISTRIBUTED_DEPTH:
        await src.varint()
    if interface == INTERFACE_TCP and rev >= REV_VERSION_PATCH:
        await src.varint()
    if rev >= REV_OPENTELEMETRY and (await src.read_exact(1))[0]:
        await src.read_exact(16 + 8)
        await src.string(what="trace state")
        await src.read_exact(1)


async def _settings(src: Source, rev: int) -> dict[str, str]:
    out: dict[str, str] = {}
    for _ in range(MAX_SETTINGS + 1):
        name = await src.string(cap=128, what="setting name")
        if not name:
            return out
        if rev < REV_SETTINGS_AS_STRINGS:  # typed binary values: only an empty list can be read
            raise ProtocolError(NOT_IMPLEMENTED, "settings from a client older than protocol revision "
                                f"{REV_SETTINGS_AS_STRINGS} cannot be read; put them in the query's SETTINGS clause")
        await src.varint()  # flags (important, custom): every setting but dpch_* is ignored either way
        value = await src.string(what="setting value")
        if any(ord(c) < 32 or c == "\x7f" for c in name + value):
            raise ProtocolError(INCORRECT_DATA, "a setting name or value has control characters")
        out[name] = value
    raise ProtocolError(TOO_MANY_BYTES, f"more than {MAX_SETTINGS} settings")


async def read_query(src: Source, rev: int, max_query_bytes: int) -> Query:
    """The Query packet (its type already read): id, client info, settings, interserver secret,
    stage, compression flag, text."""
    query_id = await src.string(cap=128, what="query id")
    if rev >= REV_CLIENT_INFO:
        await _client_info(src, rev)
    settings = await _settings(src, rev)
    if rev >= REV_INTERSERVER_SECRET:
        await src.string(cap=128, what="interserver secret")
    stage = await src.varint()
    compression = await src.varint()
    text = await src.string(cap=max_query_bytes, what="query")
    return Query(query_id, settings, stage, bool(compression), text)


async def read_empty_block(src: Source, rev: int) -> None:
    """A Data block that must be empty (the end of the external tables): block info, then 0
    columns and 0 rows. External tables are not supported: a non-empty block is refused."""
    if rev >= REV_BLOCK_INFO:
        while True:
            num = await src.varint()
            if num == 0:
                break
            if num == 1:
                await src.read_exact(1)
            elif num == 2:
                await src.read_exact(4)
            else:
                raise ProtocolError(INCORRECT_DATA, "unknown block info field")
    columns, rows = await src.varint(), await src.varint()
    if columns or rows:
        raise ProtocolError(NOT_IMPLEMENTED, "external tables (data sent with a query) are not supported by the "
                            "DP gateway")


def block_info(rev: int) -> bytes:
    """BlockInfo: is_overflows = 0, bucket_num = -1, end."""
    return varint(1) + u8(0) + varint(2) + struct.pack("<i", -1) + varint(0) if rev >= REV_BLOCK_INFO else b""
