"""ClickHouse's compressed block frame (src/Compression/CompressedWriteBuffer.cpp, ICompressionCodec):

    checksum (16 bytes, CityHash128 v1.0.2 of what follows) | method (1 byte) |
    compressed size (UInt32 LE, these 9 header bytes included) | uncompressed size (UInt32 LE) | data

Methods: 0x82 LZ4 (the default of ``network_compression_method``) and 0x02 none. Blocks the server
sends are LZ4; frames the client sends may be either. The checksum is written as two UInt64, high
half first, the layout clickhouse-driver and ClickHouse agree on. A frame's sizes are checked
against a cap before anything is allocated or decompressed (a decompression bomb is refused).
"""
from __future__ import annotations

import struct

import lz4.block
from clickhouse_cityhash.cityhash import CityHash128

from .protocol import CANNOT_DECOMPRESS, CHECKSUM_DOESNT_MATCH, TOO_MANY_BYTES, UNKNOWN_COMPRESSION_METHOD, \
    ProtocolError, Source

METHOD_NONE = 0x02
METHOD_LZ4 = 0x82
_HEADER = 9  # method + two sizes
_MASK64 = (1 << 64) - 1


def _checksum(body: bytes) -> bytes:
    h = CityHash128(body)
    return struct.pack("<QQ", h >> 64, h & _MASK64)


def compress_frame(data: bytes) -> bytes:
    """One LZ4 frame holding ``data``."""
    packed = lz4.block.compress(data, store_size=False)
    body = struct.pack("<BII", METHOD_LZ4, _HEADER + len(packed), len(data)) + packed
    return _checksum(body) + body


async def read_frame(src: Source, cap: int) -> bytes:
    """One frame from the client, decompressed; at most ``cap`` bytes compressed or not."""
    checksum = await src.read_exact(16)
    header = await src.read_exact(_HEADER)
    method, size, raw_size = struct.unpack("<BII", header)
    if method not in (METHOD_NONE, METHOD_LZ4):
        raise ProtocolError(UNKNOWN_COMPRESSION_METHOD, f"unknown compression method 0x{method:02x}; the gateway "
                            "reads LZ4 (0x82) and none (0x02)")
    if size < _HEADER or size - _HEADER > cap or raw_size > cap:
        raise ProtocolError(TOO_MANY_BYTES, f"a compressed frame over the limit of {cap} bytes")
    payload = await src.read_exact(size - _HEADER)
    if _checksum(header + payload) != checksum:
        raise ProtocolError(CHECKSUM_DOESNT_MATCH, "the checksum of a compressed frame does not match")
    if method == METHOD_NONE:
        if len(payload) != raw_size:
            raise ProtocolError(CANNOT_DECOMPRESS, "an uncompressed frame's sizes disagree")
        return payload
    try:
        out = lz4.block.decompress(payload, uncompressed_size=raw_size)
    except lz4.block.LZ4BlockError:
        raise ProtocolError(CANNOT_DECOMPRESS, "an LZ4 frame cannot be decompressed") from None
    if len(out) != raw_size:
        raise ProtocolError(CANNOT_DECOMPRESS, "an LZ4 frame's sizes disagree")
    return out
