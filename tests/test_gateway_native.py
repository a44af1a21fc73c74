"""The native TCP protocol of the DP gateway (`dpch serve --tcp-port N`), driven by clickhouse-driver
against a real gateway process: handshake, metadata, DP queries and their charge, refusals as
ClickHouse exceptions, LZ4 compression, ping, cancel, concurrent clients and the protocol limits.
The column encoder is checked byte for byte against ClickHouse's own Native format."""
from __future__ import annotations

import json
import socket
import struct
import threading

import pytest

from dpch.gateway.native import columns
from dpch.gateway.native import protocol as p
from dpch.gateway.native.server import strip_format
from test_gateway import PASSWORD, Server, _cli, _free_port, demo_dir

clickhouse_driver = pytest.importorskip("clickhouse_driver")
from clickhouse_driver import Client  # noqa: E402
from clickhouse_driver.errors import ServerException  # noqa: E402

BOB = "bob-secret-22"


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    d = demo_dir(tmp_path_factory, "gw_native", 2000)
    _cli("users", "add", "alice", "--password-stdin", "--data-dir", str(d), stdin=PASSWORD + "\n")
    _cli("users", "add", "bob", "--password-stdin", "--data-dir", str(d), stdin=BOB + "\n")
    for analyst in ("alice", "bob"):
        _cli("budget", "set", "--data-dir", str(d), "--analyst", analyst, "--dataset", "demo.purchases",
             "--epsilon", "100", "--delta", "1e-3")
    tcp = _free_port()
    s = Server(d, "--tcp-port", str(tcp), "--max-connections-per-ip", "8").start()
    s.tcp = tcp
    yield s
    s.stop()
    out = s.proc.stdout.read()
    assert "dpch serve: stopped" in out, out


def client(gw, user="alice", password=PASSWORD, **kw):
    return Client("127.0.0.1", port=gw.tcp, user=user, password=password, connect_timeout=5,
                  send_receive_timeout=60, **kw)


def spent(gw, analyst="alice"):
    out = _cli("budget", "show", "--data-dir", str(gw.data_dir), "--analyst", analyst).stdout
    return float(out.splitlines()[2].split()[5])


# -- against a real gateway ------------------------------------------------------------------------

def test_handshake_and_metadata(gw):
    c = client(gw)
    assert c.execute("SELECT currentUser(), timezone()") == [("alice", "UTC")]
    info = c.connection.server_info
    assert (info.name, info.display_name, info.timezone) == ("ClickHouse", "dpch-gateway", "UTC")
    assert info.used_revision == p.SERVER_REVISION  # the driver's revision is newer: negotiated down
    assert c.execute("SHOW TABLES FROM demo") == [("purchases",)]
    rows, types = c.execute("SELECT database, name FROM system.tables WHERE database = 'demo'", with_column_types=True)
    assert rows == [("demo", "purchases")] and [t[0] for t in types] == ["database", "name"]
    assert ("amount",) in c.execute("SELECT name FROM system.columns WHERE table = 'purchases'")
    assert c.connection.ping()
    c.execute("USE demo")  # the connection's database, as ClickHouse keeps it
    assert c.execute("SHOW TABLES") == [("purchases",)]
    with pytest.raises(ServerException) as e:
        c.execute("USE nosuch")
    assert e.value.code == 81
    c.disconnect()


@pytest.mark.parametrize("compression", [False, True])
def test_dp_query_charges_and_answers(gw, compression):
    c = client(gw, compression=compression)
    s0 = spent(gw)
    rows, types = c.execute("SELECT region, COUNT(*) AS n, AVG(amount) AS a FROM demo.purchases GROUP BY region "
                            "ORDER BY region FORMAT JSON", settings={"dpch_epsilon": 0.5}, with_column_types=True)
    assert [r[0] for r in rows] == ["centre", "east", "north", "south", "west"]
    assert [name for name, _ in types] == ["region", "n", "a"]
    assert all(isinstance(r[1], (int, float)) and isinstance(r[2], float) for r in rows)
    assert spent(gw) == pytest.approx(s0 + 0.5)
    # the SETTINGS clause and the dp_* functions take the same path; the charge is their sum
    rows = c.execute("SELECT dp_count(0.25) AS n, dp_sum(amount, 0, 500, 0.25) AS s FROM demo.purchases")
    assert len(rows) == 1 and len(rows[0]) == 2
    assert spent(gw) == pytest.approx(s0 + 1.0)
    c.disconnect()
    lines = [json.loads(line) for line in (gw.data_dir / "access.log").read_text().splitlines()]
    native = [r for r in lines if r.get("interface") == "native" and r.get("kind") == "dp_functions"]
    assert native and native[-1]["outcome"] == "accepted" and native[-1]["epsilon"] == pytest.approx(0.5)
    assert native[-1]["user"] == "alice" and native[-1]["format"] == "Native"


def test_refusals_are_clickhouse_exceptions(gw):
    c = client(gw)
    s0 = spent(gw)
    cases = [("SELECT COUNT(*) FROM demo.purchases", 9104),  # no ε
             ("SELECT amount FROM demo.purchases SETTINGS dpch_epsilon = 1", 9101),  # raw rows
             ("SELECT * FROM file('/etc/passwd')", 497),
             ("SELECT COUNT(*) FROM demo.purchases WHERE amount = 123.25 SETTINGS dpch_epsilon = 1e9", 9102)]
    for sql, code in cases:
        with pytest.raises(ServerException) as e:
            c.execute(sql)
        assert e.value.code == code, (sql, e.value)
        assert "123.25" not in str(e.value) and "Stack trace:\n\n" in str(e.value)
    assert spent(gw) == pytest.approx(s0)  # refused: nothing charged
    assert c.execute("SELECT 1") == [(1,)]  # the connection survives a refusal
    c.disconnect()


def test_external_tables_are_refused(gw):
    c = client(gw)
    s0 = spent(gw)
    with pytest.raises(ServerException) as e:
        c.execute("SELECT COUNT(*) FROM demo.purchases SETTINGS dpch_epsilon = 1",
                  external_tables=[{"name": "t", "structure": [("x", "Int32")], "data": [{"x": 1}]}])
    assert e.value.code == 48
    assert spent(gw) == pytest.approx(s0)  # refused before anything ran
    assert c.execute("SELECT 1") == [(1,)]  # the driver reconnects: the gateway closed the connection
    c.disconnect()


def test_wrong_password_is_516(gw):
    for user, password in [("alice", "wrong"), ("nobody", PASSWORD), ("", "")]:
        with pytest.raises(ServerException) as e:
            client(gw, user=user, password=password).execute("SELECT 1")
        assert e.value.code == 516 and "AUTHENTICATION_FAILED" in str(e.value)


def test_two_concurrent_clients(gw):
    out, errors = {}, []

    def work(user, password):
        try:
            c = client(gw, user=user, password=password, compression=user == "bob")
            out[user] = [c.execute("SELECT COUNT(*) AS n FROM demo.purchases", settings={"dpch_epsilon": 0.1})
                         for _ in range(3)]
            c.disconnect()
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
    s0 = spent(gw, "bob")
    threads = [threading.Thread(target=work, args=a) for a in [("alice", PASSWORD), ("bob", BOB)]]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert all(len(v) == 3 and all(len(r) == 1 for r in v) for v in out.values()) and set(out) == {"alice", "bob"}
    assert spent(gw, "bob") == pytest.approx(s0 + 0.3)


def test_cancel_ends_the_stream_and_keeps_the_charge(gw):
    c = client(gw)
    s0 = spent(gw)
    conn = c.connection
    conn.force_connect()
    conn.send_query("SELECT COUNT(*) FROM demo.purchases SETTINGS dpch_epsilon = 0.125")
    conn.send_external_tables(None)
    conn.send_cancel()
    kinds = []
    while not kinds or kinds[-1] not in (p.S_END_OF_STREAM, p.S_EXCEPTION):
        kinds.append(conn.receive_packet().type)
    assert kinds[-1] == p.S_END_OF_STREAM  # with or without the data: the Cancel may come after the answer
    assert spent(gw) == pytest.approx(s0 + 0.125)  # charged before it ran
    assert c.execute("SELECT 1") == [(1,)]
    c.disconnect()


def test_protocol_limits(gw):
    # an HTTP request on the TCP port is told where it is
    with socket.create_connection(("127.0.0.1", gw.tcp), timeout=10) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.0 400")
    # a string longer than its cap is refused before it is read
    with socket.create_connection(("127.0.0.1", gw.tcp), timeout=10) as s:
        s.sendall(p.varint(p.C_HELLO) + p.varint(1 << 30))
        data = s.recv(1000)
        assert data[0] == p.S_EXCEPTION and struct.unpack("<i", data[1:5])[0] == 307
    # connections per address: the 9th gets Exception 202 before its Hello
    held = [socket.create_connection(("127.0.0.1", gw.tcp), timeout=10) for _ in range(8)]
    try:
        with socket.create_connection(("127.0.0.1", gw.tcp), timeout=10) as s:
            data = s.recv(1000)
            assert data[0] == p.S_EXCEPTION and struct.unpack("<i", data[1:5])[0] == 202
    finally:
        for s in held:
            s.close()


# -- units -----------------------------------------------------------------------------------------

def test_strip_format():
    assert strip_format("SELECT 1 FORMAT JSON").split() == ["SELECT", "1"]
    assert strip_format("SELECT 1 FORMAT JSON SETTINGS a = 1;").split() == ["SELECT", "1", "SETTINGS", "a", "=", "1;"]
    for keep in ["SELECT format FROM t", "SELECT x AS format", "SELECT 'FORMAT JSON'",
                 "SELECT * FROM (SELECT 1 FORMAT JSON)", "SELECT a FROM t GROUP BY format SETTINGS a = 1"]:
        assert strip_format(keep) == keep


TYPES_SQL = """SELECT toInt8(-3) AS i8, toUInt64(2) AS u64, toInt128(-5) AS i128, toFloat32(1.5) AS f32, 2.25 AS f64,
    'a\\tb' AS s, toNullable('x') AS ns, CAST(NULL, 'Nullable(Int32)') AS ni, toDate('2024-02-03') AS d,
    toDateTime('2024-02-03 04:05:06') AS dt, toDateTime64('2024-02-03 04:05:06.789', 3, 'Asia/Tokyo') AS dt64,
    toDecimal64(12.345, 3) AS dec, toDecimal128(-1.5, 10) AS dec128, toUUID('0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0') AS u,
    true AS b, toFixedString('ab', 3) AS fs, [1, 2, number] AS arr, [NULL, 'z'] AS an, (1, 'p') AS tup,
    map('k', number) AS m, CAST('b', 'Enum8(\\'a\\' = 1, \\'b\\' = 2)') AS e, NULL AS nothing, toDate32('1960-01-01') AS d32
FROM numbers(3)"""


def test_columns_match_clickhouse_native(db):
    """RowBinaryWithNamesAndTypes regrouped by columns.py equals ClickHouse's Native rendering of the
    same rows, byte for byte (the Native format without block info is the TCP block body)."""
    backend = db.backend
    rowbinary = backend.query_formatted(TYPES_SQL, "RowBinaryWithNamesAndTypes").body
    native = backend.query_formatted(TYPES_SQL, "Native").body
    result = columns.parse(rowbinary)
    blocks = list(result.data_blocks())
    assert [n for n, _ in blocks] == [3] and blocks[0][1] == native
    assert result.header_block().startswith(p.varint(len(result.names)) + p.varint(0))


def test_columns_low_cardinality_is_sent_plain(db):
    rb = db.backend.query_formatted("SELECT toLowCardinality(toString(number)) AS s FROM numbers(2)",
                                    "RowBinaryWithNamesAndTypes").body
    plain = db.backend.query_formatted("SELECT toString(number) AS s FROM numbers(2)", "Native").body
    assert list(columns.parse(rb).data_blocks()) == [(2, plain)]


def test_columns_split_into_blocks(db):
    rb = db.backend.query_formatted("SELECT toUInt32(number) AS x FROM numbers(70000)",
                                    "RowBinaryWithNamesAndTypes").body
    blocks = list(columns.parse(rb).data_blocks())
    assert [n for n, _ in blocks] == [columns.BLOCK_ROWS, 70000 - columns.BLOCK_ROWS]
    head = p.varint(1) + p.varint(columns.BLOCK_ROWS) + p.string("x") + p.string("UInt32")
    assert blocks[0][1] == head + b"".join(struct.pack("<I", i) for i in range(columns.BLOCK_ROWS))


def test_columns_refuse_unknown_types():
    from dpch.gateway.errors import GatewayError

    for t in ["Dynamic", "JSON", "Variant(String, UInt8)", "Decimal(x, 2)", "Object('json')"]:
        with pytest.raises(GatewayError) as e:
            columns.codec(t)
        assert e.value.code == 48


def test_compressed_frame_roundtrip():
    import asyncio

    from dpch.gateway.native.compression import compress_frame, read_frame

    data = b"dpch" * 1000
    frame = compress_frame(data)
    assert asyncio.run(read_frame(p.buffer_source(frame), 1 << 16)) == data
    bad = frame[:20] + bytes([frame[20] ^ 1]) + frame[21:]
    with pytest.raises(p.ProtocolError) as e:
        asyncio.run(read_frame(p.buffer_source(bad), 1 << 16))
    assert e.value.code in (40, 307)
    with pytest.raises(p.ProtocolError) as e:
        asyncio.run(read_frame(p.buffer_source(frame), 100))
    assert e.value.code == 307
