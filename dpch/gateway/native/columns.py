"""The answer as native columns: ``RowBinaryWithNamesAndTypes`` (rendered by ClickHouse's own formatter
through the same router path as HTTP) regrouped into Native blocks.

RowBinary writes a row's values one after another; Native writes each column in bulk. For the
types below a value's bytes are the same in both (fixed-width little-endian numbers, dates, UUIDs;
strings as varint length + bytes), so only the grouping changes and no value is re-encoded:

- fixed width: (U)Int8…256, Float32/64, BFloat16, Bool, Date, Date32, DateTime, DateTime64,
  Decimal(P, S), Enum8/16, UUID, IPv4/6, FixedString(N), Interval*;
- String; Nullable(T) (RowBinary: a null flag before each value; Native: the null map, then the
  values with a default where null); Array(T) (a length before each; Native: cumulative UInt64
  offsets, then the elements); Tuple(…) (each element column); Map(K, V) (as Array(Tuple(K, V)));
- LowCardinality(T) is sent as T (RowBinary writes the plain value; the header names T).

Any other type is refused (48 NOT_IMPLEMENTED) with its name only. The input holds released
values only (it is the answer the HTTP interface would send), so nothing private is handled here.
"""
from __future__ import annotations

import re
import struct
from dataclasses import dataclass

from ..errors import GatewayError
from .protocol import NOT_IMPLEMENTED, string, varint

BLOCK_ROWS = 65_536  # rows per Data packet (ClickHouse's max_block_size)

_WIDTH = {"Int8": 1, "UInt8": 1, "Bool": 1, "Enum8": 1, "Int16": 2, "UInt16": 2, "Date": 2, "Enum16": 2,
          "BFloat16": 2, "Int32": 4, "UInt32": 4, "Float32": 4, "Date32": 4, "DateTime": 4, "IPv4": 4,
          "Decimal32": 4, "Int64": 8, "UInt64": 8, "Float64": 8, "DateTime64": 8, "Decimal64": 8,
          "Int128": 16, "UInt128": 16, "UUID": 16, "IPv6": 16, "Decimal128": 16, "Int256": 32, "UInt256": 32,
          "Decimal256": 32}
_TYPE = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?:\((.*)\))?\s*", re.S)
_NAMED = re.compile(r"\s*(`(?:[^`\\]|\\.)*`|[A-Za-z_][A-Za-z0-9_]*)\s+(\S.*)", re.S)


class Malformed(Exception):
    """The rendered answer does not parse (an internal fault, never the analyst's)."""


def _varint_at(buf: bytes, pos: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise Malformed("truncated varint")
        b = buf[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            return n, pos
        shift += 7


def _split_args(s: str) -> list[str]:
    """Top-level comma-separated arguments, quotes and nesting respected."""
    out, depth, quote, start, i = [], 0, None, 0, 0
    while i < len(s):
        c = s[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = None
        elif c in "'`\"":
            quote = c
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "," and depth == 0:
            out.append(s[start:i])
            start = i + 1
        i += 1
    out.append(s[start:])
    return [a.strip() for a in out if a.strip()]


# -- codecs: one per type, each making per-block column builders ----------------------------------------

@dataclass
class Fixed:
    width: int
    header: str

    def builder(self):
        return _FixedCol(self.width)


@dataclass
class Str:
    header: str = "String"

    def builder(self):
        return _StrCol()


@dataclass
class Nothing:
    header: str = "Nothing"

    def builder(self):
        return _NothingCol()


@dataclass
class Nullable:
    inner: object

    @property
    def header(self):
        return f"Nullable({self.inner.header})"

    def builder(self):
        return _NullableCol(self.inner.builder())


@dataclass
class Array:
    inner: object
    is_map: bool = False  # Map(K, V): read and written as Array(Tuple(K, V))

    @property
    def header(self):
        if self.is_map:
            return f"Map({self.inner.elems[0].header}, {self.inner.elems[1].header})"
        return f"Array({self.inner.header})"

    def builder(self):
        return _ArrayCol(self.inner.builder())


@dataclass
class Tuple:
    elems: list
    names: list  # element names ('' when unnamed)

    @property
    def header(self):
        return "Tuple(" + ", ".join(f"{n} {e.header}" if n else e.header for n, e in zip(self.names, self.elems)) + ")"

    def builder(self):
        return _TupleCol([e.builder() for e in self.elems])


def codec(type_name: str):
    """The codec of a ClickHouse type name; GatewayError 48 for a type the gateway cannot send."""
    m = _TYPE.fullmatch(type_name)
    if m is None:
        raise GatewayError(NOT_IMPLEMENTED, "a result type cannot be sent over the native protocol")
    name, args = m.group(1), m.group(2)
    if name == "LowCardinality" and args:
        return codec(args)
    if name == "Nullable" and args:
        return Nullable(codec(args))
    if name == "Array" and args:
        return Array(codec(args))
    if name == "Map" and args and len(_split_args(args)) == 2:
        k, v = _split_args(args)
        return Array(Tuple([codec(k), codec(v)], ["", ""]), is_map=True)
    if name == "Tuple" and args:
        elems, names = [], []
        for a in _split_args(args):
            named = _NAMED.fullmatch(a)
            if named and "(" not in named.group(1) and _TYPE.fullmatch(named.group(2)):
                names.append(named.group(1))
                elems.append(codec(named.group(2)))
            else:
                names.append("")
                elems.append(codec(a))
        return Tuple(elems, names)
    if name == "String":
        return Str()
    if name == "Nothing":
        return Nothing()
    if name == "FixedString" and args and args.strip().isdigit():
        return Fixed(int(args), type_name.strip())
    if name == "Decimal" and args:
        precision = _split_args(args)[0]
        if precision.isdigit():
            p = int(precision)
            return Fixed(4 if p <= 9 else 8 if p <= 18 else 16 if p <= 38 else 32, type_name.strip())
    if name in _WIDTH:
        return Fixed(_WIDTH[name], type_name.strip())
    if name.startswith("Interval") and not args:
        return Fixed(8, name)
    raise GatewayError(NOT_IMPLEMENTED, f"the result type {name[:64]} cannot be sent over the native protocol")


# -- column builders: add(buf, pos) -> pos reads one RowBinary value; default() adds a filler -------------

class _FixedCol:
    def __init__(self, width):
        self.width, self.out = width, bytearray()

    def add(self, buf, pos):
        end = pos + self.width
        if end > len(buf):
            raise Malformed("truncated value")
        self.out += buf[pos:end]
        return end

    def default(self):
        self.out += bytes(self.width)

    def data(self):
        return bytes(self.out)


class _StrCol:
    def __init__(self):
        self.out = bytearray()

    def add(self, buf, pos):
        n, start = _varint_at(buf, pos)
        if start + n > len(buf):
            raise Malformed("truncated string")
        self.out += buf[pos:start + n]
        return start + n

    def default(self):
        self.out.append(0)

    def data(self):
        return bytes(self.out)


class _NothingCol:
    def __init__(self):
        self.out = bytearray()

    def add(self, buf, pos):
        raise Malformed("a value of type Nothing")

    def default(self):
        self.out.append(0x30)  # ClickHouse's filler for Nothing: the character '0'

    def data(self):
        return bytes(self.out)


class _NullableCol:
    def __init__(self, inner):
        self.nulls, self.inner = bytearray(), inner

    def add(self, buf, pos):
        if pos >= len(buf):
            raise Malformed("truncated null flag")
        is_null = buf[pos]
        self.nulls.append(1 if is_null else 0)
        if is_null:
            self.inner.default()
            return pos + 1
        return self.inner.add(buf, pos + 1)

    def default(self):
        self.nulls.append(1)
        self.inner.default()

    def data(self):
        return bytes(self.nulls) + self.inner.data()


class _ArrayCol:
    def __init__(self, inner):
        self.offsets, self.total, self.inner = bytearray(), 0, inner

    def add(self, buf, pos):
        n, pos = _varint_at(buf, pos)
        if n > len(buf):
            raise Malformed("array longer than the answer")
        for _ in range(n):
            pos = self.inner.add(buf, pos)
        self.total += n
        self.offsets += struct.pack("<Q", self.total)
        return pos

    def default(self):
        self.offsets += struct.pack("<Q", self.total)

    def data(self):
        return bytes(self.offsets) + self.inner.data()


class _TupleCol:
    def __init__(self, elems):
        self.elems = elems

    def add(self, buf, pos):
        for e in self.elems:
            pos = e.add(buf, pos)
        return pos

    def default(self):
        for e in self.elems:
            e.default()

    def data(self):
        return b"".join(e.data() for e in self.elems)


# -- the answer ------------------------------------------------------------------------------------------

@dataclass
class Result:
    names: list[str]
    codecs: list
    body: bytes
    start: int  # where the rows begin in body

    def header_block(self) -> bytes:
        """Column count, 0 rows, then each column's name and type (no data)."""
        out = varint(len(self.names)) + varint(0)
        for n, c in zip(self.names, self.codecs):
            out += string(n) + string(c.header)
        return out

    def data_blocks(self):
        """(rows, column count + rows + columns) of each block of at most BLOCK_ROWS rows."""
        pos, end = self.start, len(self.body)
        while pos < end:
            cols = [c.builder() for c in self.codecs]
            rows = 0
            while pos < end and rows < BLOCK_ROWS:
                for col in cols:
                    pos = col.add(self.body, pos)
                rows += 1
            out = bytearray(varint(len(cols)) + varint(rows))
            for n, c, col in zip(self.names, self.codecs, cols):
                out += string(n) + string(c.header) + col.data()
            yield rows, bytes(out)


def parse(body: bytes) -> Result:
    """The header of a RowBinaryWithNamesAndTypes answer: names and types (codecs)."""
    try:
        count, pos = _varint_at(body, 0)
        fields = []
        for _ in range(2 * count):
            n, start = _varint_at(body, pos)
            if start + n > len(body):
                raise Malformed("truncated header")
            fields.append(body[start:start + n].decode("utf-8"))
            pos = start + n
    except (Malformed, UnicodeDecodeError) as exc:
        raise Malformed("the answer's header does not parse") from exc
    return Result(fields[:count], [codec(t) for t in fields[count:]], body, pos)
