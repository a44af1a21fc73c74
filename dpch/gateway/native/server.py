"""The native TCP interface of ``dpch serve --tcp-port N``: an asyncio server in the gateway's event
loop, sharing its ``Gateway`` (dpch.gateway.server): the same user store and password check, the
same engine thread pool with its per-user and queue limits, the same router (``Gateway.run`` →
dpch.gateway.router.answer → controller and ledger) and the same access log. Only the transport
differs: the answer is asked for as ``RowBinaryWithNamesAndTypes`` and regrouped into Native
blocks (dpch.gateway.native.columns).

One connection: Hello (user and password checked, or Exception 516 and close) → server Hello →
packets: Ping → Pong; Query + the empty external-tables Data block → the header block, the data
blocks, Progress (all zero), EndOfStream, or one Exception (ClickHouse's code, a data-free
message); Cancel while a query runs → EndOfStream without data (a DP query's charge stays: it
was made before the query ran). A protocol violation → Exception, then the connection closes.

Limits: the Hello within ``hello_timeout``; a packet, once begun, within ``packet_timeout``; an
idle connection closes after ``idle_timeout``; connections per client address and in all are
capped (Exception 202 before the Hello); the query text is capped like an HTTP body and then
checked like one (dpch.gateway.limits); strings, settings and compressed frames are capped before
they are read (dpch.gateway.native.protocol).
"""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import time
import uuid
from collections import Counter
from dataclasses import dataclass

from .. import limits
from ..auth import auth_failed
from ..errors import TOO_MANY_SIMULTANEOUS_QUERIES, UNKNOWN_DATABASE, UNKNOWN_EXCEPTION, GatewayError, from_dpch
from ..metadata import SERVER_VERSION
from ..router import DP_SETTING_NAMES
from . import columns, protocol as p
from .compression import compress_frame, read_frame

log = logging.getLogger("dpch.gateway.native")
RENDER_FORMAT = "RowBinaryWithNamesAndTypes"
_VERSION = tuple(int(x) for x in SERVER_VERSION.split(".")[:3])
_USE = re.compile(r"(?is)\s*use\s+(`[^`]{1,128}`|\"[^\"]{1,128}\"|[A-Za-z_][A-Za-z0-9_]{0,127})\s*;?\s*")


@dataclass(frozen=True)
class NativeConfig:
    """Where and under which limits the native interface listens (docs/GATEWAY.md "Native protocol")."""

    port: int
    host: str = "127.0.0.1"
    hello_timeout: float = 10.0  # s from the connection to the whole Hello
    packet_timeout: float = 10.0  # s for the rest of a packet once its first byte came
    idle_timeout: float = 300.0  # s a connection may wait between packets (and a send may block)
    max_connections_per_ip: int = 64
    max_connections: int = 1_024
    max_query_bytes: int = 1 << 20  # the query text as sent (then checked like an HTTP query)


class NativeServer:
    def __init__(self, gw, cfg: NativeConfig):
        self.gw, self.cfg = gw, cfg
        self.per_ip: Counter[str] = Counter()  # event loop only: no lock needed
        self.tasks: set[asyncio.Task] = set()
        self.server = None

    async def start(self) -> "NativeServer":
        self.server = await asyncio.start_server(self._accept, self.cfg.host, self.cfg.port)
        log.info("native protocol on %s:%d (revision %d)", self.cfg.host, self.cfg.port, p.SERVER_REVISION)
        return self

    async def stop(self) -> None:
        self.server.close()
        for t in list(self.tasks):
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername") or ("?", 0)
        ip = peer[0]
        task = asyncio.current_task()
        if self.per_ip[ip] >= self.cfg.max_connections_per_ip or len(self.tasks) >= self.cfg.max_connections:
            writer.write(p.exception_packet(TOO_MANY_SIMULTANEOUS_QUERIES[0], TOO_MANY_SIMULTANEOUS_QUERIES[1],
                                            "too many open connections; close idle ones and try again"))
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.drain(), 1.0)
            writer.close()
            return
        self.per_ip[ip] += 1
        self.tasks.add(task)
        conn = Connection(self, reader, writer, f"{ip}:{peer[1]}")
        try:
            await conn.run()
        except p.ProtocolError as err:  # out of step: say why, then close
            await conn.send_error(err)
        except GatewayError as err:  # refused Hello (authentication, revision, database)
            await conn.send_error(err)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.TimeoutError, asyncio.CancelledError):
            pass  # the client left, was idle too long, or the server stops
        except Exception as exc:  # noqa: BLE001 - a fault of ours: logged by type, never by content
            log.error("native connection from %s failed: %s", conn.remote, type(exc).__name__)
        finally:
            self.tasks.discard(task)
            self.per_ip[ip] -= 1
            if self.per_ip[ip] <= 0:
                del self.per_ip[ip]
            writer.close()


class Connection:
    def __init__(self, server: NativeServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, remote: str):
        self.gw, self.cfg = server.gw, server.cfg
        self.reader, self.writer, self.remote = reader, writer, remote
        self.src = p.Source(reader.readexactly)
        self.rev = p.SERVER_REVISION
        self.user: str | None = None
        self.database = "default"

    # -- sending -------------------------------------------------------------------------------------
    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await asyncio.wait_for(self.writer.drain(), self.cfg.idle_timeout)

    async def send_error(self, err: GatewayError) -> None:
        with contextlib.suppress(Exception):
            await self.send(p.exception_packet(err.code, err.name, err.message))

    def data_packet(self, block: bytes, compress: bool) -> bytes:
        out = p.varint(p.S_DATA) + (p.string("") if self.rev >= p.REV_TEMPORARY_TABLES else b"")
        block = p.block_info(self.rev) + block
        return out + (compress_frame(block) if compress else block)

    # -- the connection ------------------------------------------------------------------------------
    async def run(self) -> None:
        async with asyncio.timeout(self.cfg.hello_timeout):  # one deadline for the whole Hello
            first = await self.reader.readexactly(1)
            if first[0] >= 0x41:  # an ASCII letter: an HTTP request on the TCP port
                self.writer.write(b"HTTP/1.0 400 Bad Request\r\n\r\nPort %d is for the ClickHouse native protocol "
                                  b"(clickhouse-client, clickhouse-driver).\r\nUse the HTTP port for HTTP.\r\n"
                                  % self.cfg.port)
                return
            if first[0] != p.C_HELLO:
                raise p.ProtocolError(p.UNEXPECTED_PACKET_FROM_CLIENT, "expected Hello as the first packet")
            await self.handshake()
        while True:
            try:
                kind = await asyncio.wait_for(self.src.varint(), self.cfg.idle_timeout)
            except asyncio.TimeoutError:
                return  # idle too long: close quietly, as ClickHouse does
            if kind == p.C_PING:
                await self.send(p.varint(p.S_PONG))
            elif kind == p.C_CANCEL:
                continue  # a Cancel that crossed the query's end: nothing to stop
            elif kind == p.C_QUERY:
                if not await self.query():
                    return
            elif kind in (p.C_HELLO, p.C_DATA, p.C_TABLES_STATUS):
                raise p.ProtocolError(p.UNEXPECTED_PACKET_FROM_CLIENT, f"unexpected packet (type {kind}) between "
                                      "queries")
            else:
                raise p.ProtocolError(p.UNKNOWN_PACKET_FROM_CLIENT, f"unknown packet type {kind}")

    async def handshake(self) -> None:
        hello = await p.read_hello(self.src)
        if hello.revision < p.MIN_CLIENT_REVISION:
            raise GatewayError(p.NOT_IMPLEMENTED, f"clients older than protocol revision {p.MIN_CLIENT_REVISION} "
                               "are not supported")
        self.rev = min(hello.revision, p.SERVER_REVISION)
        user = hello.user or "default"
        self.database = limits.check_database(hello.database) if hello.database else "default"
        users = self.gw.users
        ok = users.verified_before(user, hello.password) or await asyncio.get_running_loop().run_in_executor(
            self.gw.auth_pool, users.verify, user, hello.password)
        if not ok:
            err = auth_failed(user)
            self.gw.access.write(user=None, kind="error", outcome="rejected", code=err.code, error=err.name,
                                 remote=self.remote, interface="native")
            raise err
        self.user = user
        await self.send(p.server_hello(self.rev, "ClickHouse", _VERSION, "UTC", "dpch-gateway"))

    async def read_query(self) -> p.Query:
        """The Query packet and the Data packet that ends its (empty) external tables."""
        q = await p.read_query(self.src, self.rev, self.cfg.max_query_bytes)
        if await self.src.varint() != p.C_DATA:
            raise p.ProtocolError(p.UNEXPECTED_PACKET_FROM_CLIENT, "expected the empty Data packet after the query")
        if self.rev >= p.REV_TEMPORARY_TABLES:
            await self.src.string(cap=128, what="external table name")
        src = p.buffer_source(await read_frame(self.src, 1 << 16)) if q.compression else self.src
        await p.read_empty_block(src, self.rev)
        return q

    async def query(self) -> bool:
        """Answer one query; False when the connection must close."""
        t0 = time.perf_counter()
        q = await asyncio.wait_for(self.read_query(), self.cfg.packet_timeout)
        query_id, sql_hash, kind, stop = None, None, "error", None
        try:
            query_id = limits.check_echoed("query_id", q.query_id) if q.query_id else str(uuid.uuid4())
            if q.stage != p.STAGE_COMPLETE:
                raise GatewayError(p.NOT_IMPLEMENTED, "only complete query processing is served (stage Complete)")
            limits.check_query_text(q.text)
            sql_hash = hashlib.sha256(q.text.encode("utf-8")).hexdigest()[:16]
            use = _USE.fullmatch(q.text)
            if use:  # the session's database, as ClickHouse keeps it per TCP connection
                await self.use(use.group(1).strip("`\""))
                self.log(t0, query_id, "metadata", "accepted", sql_hash)
                await self.send(p.varint(p.S_END_OF_STREAM))
                return True
            dp_settings = {k.lower(): v for k, v in q.settings.items() if k.lower() in DP_SETTING_NAMES}
            run = asyncio.ensure_future(self.gw.on_engine(self.gw.run, self.user, strip_format(q.text), dp_settings,
                                                          {}, self.database, RENDER_FORMAT, user=self.user))
            stop = await self.watch(run)
            ans = await run  # the engine thread cannot be interrupted: a cancelled query still ends
            kind = ans.kind
            if stop == -1:  # the client left while its query ran
                self.log(t0, query_id, kind, "rejected", sql_hash, ans=ans, code="client_disconnect")
                return False
            if stop == p.C_CANCEL:
                self.log(t0, query_id, kind, "cancelled", sql_hash, ans=ans)
                await self.send(p.varint(p.S_END_OF_STREAM))
                return True
            if stop is None:
                if ans.fmt != RENDER_FORMAT:
                    raise GatewayError(UNKNOWN_EXCEPTION, "internal error (answer format)")
                rows = await self.send_result(ans.body, q.compression)
                self.log(t0, query_id, kind, "accepted", sql_hash, ans=ans, rows=rows)
                return True
        except (ConnectionError, asyncio.TimeoutError):  # sending failed: the client is gone or stuck
            raise
        except Exception as exc:  # noqa: BLE001
            err = from_dpch(exc)
            if err.code == UNKNOWN_EXCEPTION[0]:
                log.error("internal error answering native query %s: %s", query_id, type(exc).__name__)
            self.log(t0, query_id, kind, "rejected", sql_hash, err=err)
            if stop in (None, p.C_CANCEL):
                await self.send(p.exception_packet(err.code, err.name, err.message))
                return True
            if stop == -1:
                return False
        raise p.ProtocolError(p.UNEXPECTED_PACKET_FROM_CLIENT, "only Cancel may be sent while a query runs")

    async def use(self, name: str) -> None:
        entries = await self.gw.on_engine(self.gw.catalog_entries, user=self.user)
        if name not in {"default"} | {e.table.split(".", 1)[0] for e in entries}:
            raise GatewayError(UNKNOWN_DATABASE, f"Database {name[:64]} does not exist or has no catalogued table")
        self.database = name

    async def watch(self, run: asyncio.Future):
        """While the query runs, read what the client sends: None when the query ended first, else the
        packet type (Cancel, or another packet: a violation), or -1 when the client left."""
        reading = asyncio.ensure_future(self.src.varint())
        done, _ = await asyncio.wait({run, reading}, return_when=asyncio.FIRST_COMPLETED)
        if reading not in done:
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reading
            return None
        if reading.exception() is not None:
            return -1
        return reading.result()

    async def send_result(self, body: bytes, compress: bool) -> int:
        def encode():  # about 80 000 rows of 4 columns a second: off the event loop
            result = columns.parse(body)
            blocks = list(result.data_blocks())
            out = [self.data_packet(result.header_block(), compress)]
            out += [self.data_packet(block, compress) for _, block in blocks]
            return b"".join(out), sum(n for n, _ in blocks)
        try:
            packets, rows = await asyncio.to_thread(encode)
        except columns.Malformed:
            raise GatewayError(UNKNOWN_EXCEPTION, "internal error (the answer cannot be encoded)") from None
        await self.send(packets + p.progress_packet(self.rev) + p.varint(p.S_END_OF_STREAM))
        return rows

    def log(self, t0, query_id, kind, outcome, sql_hash, ans=None, rows=None, err=None, code=None) -> None:
        meta = ans.meta if ans is not None else {}
        self.gw.access.write(user=self.user, query_id=query_id, kind=kind, outcome=outcome,
                             format="Native" if ans is not None else None, epsilon=meta.get("epsilon"),
                             delta=meta.get("delta"), dataset=meta.get("dataset"), receipt=meta.get("receipt"),
                             rows=rows, code=err.code if err else code, error=err.name if err else None,
                             duration_ms=round((time.perf_counter() - t0) * 1e3, 3), remote=self.remote,
                             query_sha256=sql_hash, interface="native")


def strip_format(sql: str) -> str:
    """The statement without its ``FORMAT name`` clauses at the top level (before SETTINGS or at the
    end): over the native protocol the client formats, the server sends blocks (as ClickHouse)."""
    toks = list(limits._TOKEN.finditer(sql))
    cut, depth = [], 0
    for i, m in enumerate(toks):
        t = m.group()
        depth += (t in "([") - (t in ")]")
        if depth or t.upper() != "FORMAT" or i + 1 >= len(toks) or not toks[i + 1].group().isidentifier():
            continue
        after = toks[i + 2].group() if i + 2 < len(toks) else ""
        if after in ("", ";") or after.upper() == "SETTINGS":
            cut.append((m.start(), toks[i + 1].end()))
    for start, end in reversed(cut):
        sql = sql[:start] + " " + sql[end:]
    return sql


async def start(gw, cfg: NativeConfig) -> NativeServer:
    """Listen for the native protocol in the running loop, answering through ``gw`` (a started
    dpch.gateway.server.Gateway). Every answer is the HTTP interface's answer to the same query by
    the same user: the same DP release, charge and refusals (DESIGN.md invariants 2, 5, 11)."""
    return await NativeServer(gw, cfg).start()
