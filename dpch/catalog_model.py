"""Plain catalog records and the pure SQL type/quoting helpers (bottom layer: imports nothing of
dpch but errors). ``TableEntry`` is what a stage knows about a table; dpch.catalog (which stores
entries) re-exports everything here, so ``from dpch.catalog import TableEntry`` keeps working."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from .errors import CatalogError

META_DATABASE = "dpch_meta"
META_TABLE = f"{META_DATABASE}.catalog"
NEIGHBOURS = ("add_remove", "substitute")
MAX_PUBLIC_KEYS = 100_000
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

_INTEGER_TYPES = {"Int8", "Int16", "Int32", "Int64", "Int128", "Int256", "UInt8", "UInt16", "UInt32",
                  "UInt64", "UInt128", "UInt256", "Bool"}
_FLOAT_TYPES = {"Float32", "Float64", "BFloat16"}


# ------------------------------------------------------------------------------------------------
# SQL text helpers (shared with the rewriter)
# ------------------------------------------------------------------------------------------------

def quote_ident(name: str) -> str:
    """A ClickHouse identifier in backquotes (backquote and backslash escaped)."""
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


def quote_string(value: str) -> str:
    """A ClickHouse string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def base_type(ch_type: str) -> str:
    """Strip ``Nullable(...)`` and ``LowCardinality(...)`` wrappers from a ClickHouse type."""
    t = ch_type.strip()
    changed = True
    while changed:
        changed = False
        for wrapper in ("Nullable(", "LowCardinality("):
            if t.startswith(wrapper) and t.endswith(")"):
                t = t[len(wrapper):-1].strip()
                changed = True
    return t


def is_nullable(ch_type: str) -> bool:
    t = ch_type.strip()
    while t.startswith("LowCardinality(") and t.endswith(")"):
        t = t[len("LowCardinality("):-1].strip()
    return t.startswith("Nullable(")


def is_integer_type(ch_type: str) -> bool:
    return base_type(ch_type) in _INTEGER_TYPES


def is_numeric_type(ch_type: str) -> bool:
    t = base_type(ch_type)
    return t in _INTEGER_TYPES or t in _FLOAT_TYPES or t.startswith("Decimal")


# |bound| limit: a released sum is at most 2^63 grid units of g ≤ 2^(log2|bound| - 19), which must stay
# below 2^1024 (the largest Float64) with room for the noise: 900 + 63 - 19 < 1024.
MAX_ABS_BOUND = 2.0 ** 900


_LENGTH_KEY_RE = re.compile(r"^\s*length\s*\(\s*`?([A-Za-z_][A-Za-z0-9_]*)`?\s*\)\s*$", re.IGNORECASE)


def length_bound_key(column: str) -> str:
    """The ``bounds`` key under which the catalog keeps declared bounds of ``length(column)``
    (bytes) for a String column, e.g. ``bounds={"length(URL)": (0, 4096)}``."""
    return f"length({column})"


def date_kind(ch_type: str) -> str | None:
    """"date" for Date/Date32 (values in days since 1970-01-01), "datetime" for DateTime (seconds
    since the epoch), None otherwise (DateTime64 is a Decimal: not bounded)."""
    t = base_type(ch_type)
    if t in ("Date", "Date32"):
        return "date"
    if t == "DateTime" or t.startswith("DateTime("):
        return "datetime"
    return None


def date_bound_number(value: Any, kind: str) -> float:
    """A bound of a Date (days) or DateTime (seconds, UTC) column as a number: an ISO string
    ('2013-07-01', '2013-07-01 12:00:00'), a datetime.date/datetime, or already a number."""
    import datetime as dt

    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        value = dt.date.fromisoformat(text) if len(text) == 10 else dt.datetime.fromisoformat(text)
    if kind == "date" and isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        return float((value - dt.date(1970, 1, 1)).days)
    if kind == "datetime" and isinstance(value, dt.datetime):
        return float(value.replace(tzinfo=value.tzinfo or dt.timezone.utc).timestamp())
    if kind == "datetime" and isinstance(value, dt.date):
        return float(dt.datetime(value.year, value.month, value.day, tzinfo=dt.timezone.utc).timestamp())
    raise TypeError(value)


def is_string_type(ch_type: str) -> bool:
    t = base_type(ch_type)
    return t == "String" or t.startswith("FixedString(")


def literal_sql(value: Any) -> str:
    """SQL literal for a public key value (JSON types only: str, int, float, bool, None)."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise CatalogError("public key values must be finite numbers, strings, booleans or None")
        return repr(value)
    if isinstance(value, str):
        return quote_string(value)
    raise CatalogError("public key values must be strings, integers, floats, booleans or None")


# ------------------------------------------------------------------------------------------------
# Distributed tables (docs/DEPLOY.md, "A cluster")
# ------------------------------------------------------------------------------------------------

# Functions a sharding key may apply to the unit and still be a function of the unit alone:
# deterministic, stateless, reading nothing but their arguments (never rand(), now(), a dictionary).
_SHARDING_FUNCTIONS = frozenset("""
cityhash64 siphash64 xxhash32 xxhash64 xxh3 murmurhash2_32 murmurhash2_64 murmurhash3_32 murmurhash3_64
inthash32 inthash64 farmhash64 farmfingerprint64 javahash hivehash metrohash64 wyhash64 halfmd5
touint8 touint16 touint32 touint64 toint8 toint16 toint32 toint64 tostring modulo intdiv abs
""".split())


def sharding_columns(sharding_key: str) -> tuple[frozenset[str], bool]:
    """(the columns ``sharding_key`` reads, whether every function in it is on the deterministic
    allow-list), parsed with sqlglot; CatalogError when it is not one ClickHouse expression."""
    import sqlglot
    from sqlglot import exp

    try:
        tree = sqlglot.parse_one(sharding_key, dialect="clickhouse")
    except sqlglot.errors.ParseError:
        raise CatalogError("the sharding key is not a ClickHouse expression") from None
    if not isinstance(tree, exp.Expression) or isinstance(tree, (exp.Select, exp.Query)):
        raise CatalogError("the sharding key is not a ClickHouse expression")
    cols = frozenset(c.name for c in tree.find_all(exp.Column))
    pure = True
    for node in tree.walk():
        if isinstance(node, (exp.Subquery, exp.Select, exp.Placeholder, exp.Star)):
            pure = False
        elif isinstance(node, exp.Func) and not isinstance(node, (exp.Binary, exp.Paren, exp.Neg, exp.Cast)):
            name = (node.name if isinstance(node, exp.Anonymous) else node.sql_name()).lower()
            pure &= name.replace("_", "") in {f.replace("_", "") for f in _SHARDING_FUNCTIONS}
        elif isinstance(node, exp.Binary) and not isinstance(node, (exp.Add, exp.Sub, exp.Mul, exp.Mod, exp.BitwiseXor)):
            pure = False
    return cols, pure


@dataclass(frozen=True)
class DistributedSpec:
    """A catalogued ``Distributed`` table: its cluster, the local table on every shard
    (``database.table``) and the sharding key (a ClickHouse expression), as declared and checked
    at registration (dpch.catalog)."""

    cluster: str
    local_table: str
    sharding_key: str

    @property
    def local_table_sql(self) -> str:
        db, name = self.local_table.split(".", 1)
        return f"{quote_ident(db)}.{quote_ident(name)}"

    def by_unit(self, unit: str | None) -> bool:
        """Whether the key is a function of ``unit`` only (its only column, through allow-listed
        deterministic functions), so that every row of one unit is on one shard. ``unit`` None (row
        level: each row is its own unit): any placement keeps a unit on one shard."""
        if unit is None:
            return True
        cols, pure = sharding_columns(self.sharding_key)
        return pure and cols == {unit}

    def to_dict(self) -> dict:
        return {"cluster": self.cluster, "local_table": self.local_table, "sharding_key": self.sharding_key}

    def normalized(self) -> tuple[str, str, str]:
        """(cluster, local table, sharding key as sqlglot renders it): what the engine's
        definition must match (``parse_distributed_engine``)."""
        return self.cluster, self.local_table, _expression_text(self.sharding_key)


def _expression_text(sql: str) -> str:
    import sqlglot

    return sqlglot.parse_one(sql, dialect="clickhouse").sql("clickhouse")


def parse_distributed_engine(engine_full: str, database: str) -> tuple[str, str, str] | None:
    """(cluster, local db.table, sharding key) of a ``Distributed(cluster, db, table, key, ...)``
    engine definition (system.tables.engine_full), or None when it has no sharding key or does not
    parse. An empty database argument means the Distributed table's own."""
    import sqlglot
    from sqlglot import exp

    text = engine_full.strip()
    if not text.startswith("Distributed("):
        return None
    try:
        call = sqlglot.parse_one("SELECT " + text.split(" SETTINGS ", 1)[0], dialect="clickhouse").expressions[0]
    except sqlglot.errors.ParseError:
        return None
    args = list(call.expressions) if isinstance(call, exp.Anonymous) else []
    if len(args) < 4:
        return None

    def name(node: exp.Expression) -> str:
        return node.name if isinstance(node, (exp.Literal, exp.Column, exp.Identifier)) else node.sql("clickhouse")

    db = name(args[1]) or database
    return name(args[0]), f"{db}.{name(args[2])}", args[3].sql("clickhouse")


# ------------------------------------------------------------------------------------------------
# Entries
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class TableEntry:
    """One catalogued table. Immutable; ``salt`` is excluded from repr and to_dict()."""

    table: str  # database.table
    privacy_unit: str | None
    neighbour: str
    bounds: Mapping[str, tuple[float, float]]
    max_groups_contributed: int
    max_rows_per_unit: int
    max_rows_per_group: int | None
    public_keys: Mapping[str, tuple]
    columns: Mapping[str, str]  # name -> ClickHouse type
    salt: str = field(repr=False)
    version: int = 0
    public: bool = False
    references: Mapping[str, tuple[str, str]] = field(default_factory=lambda: MappingProxyType({}))
    # column -> (referenced db.table, referenced column)
    distributed: DistributedSpec | None = None  # a Distributed table (docs/DEPLOY.md, "A cluster")
    # bounds every query chooses from the data unless it gives its own (dpch.plan.profile):
    # "max_rows_per_unit", "max_groups_contributed", "bounds:<column>"
    auto: tuple[str, ...] = ()

    @property
    def shards_by_unit(self) -> bool:
        """A Distributed table whose rows of one unit are all on one shard (its sharding key is a
        function of the unit; row level, or a unit reached through references: see
        DistributedSpec.by_unit): the per-unit and group stages may then run on each shard."""
        d = self.distributed
        return d is not None and not self.references and d.by_unit(self.privacy_unit)

    def column_origin(self, column: str) -> tuple[str, str]:
        """(db.table, column) where ``column`` comes from (a joined relation maps its columns back)."""
        return self.table, column

    @property
    def database(self) -> str:
        return self.table.split(".", 1)[0]

    @property
    def name(self) -> str:
        return self.table.split(".", 1)[1]

    @property
    def table_sql(self) -> str:
        """The table as quoted SQL: database and name each quoted with ``quote_ident``."""
        return f"{quote_ident(self.database)}.{quote_ident(self.name)}"

    @property
    def row_level(self) -> bool:
        return self.privacy_unit is None

    @property
    def rows_per_group(self) -> int:
        """The effective per-(unit, group) row cap C = min(max_rows_per_group, max_rows_per_unit)."""
        if self.max_rows_per_group is None:
            return self.max_rows_per_unit
        return min(self.max_rows_per_group, self.max_rows_per_unit)

    def hash_key_sql(self) -> str:
        """The (k0, k1) UInt64 key of ``sipHash64Keyed`` derived from the salt. SQL text that
        contains the secret: only the rewriter's executable SQL may embed it."""
        k0 = int(self.salt[:16], 16)
        k1 = int(self.salt[16:32], 16)
        return f"(toUInt64({k0}), toUInt64({k1}))"

    def unit_salt_sql(self) -> str:
        """A second secret (UInt64) mixed into the unit's hash; derived from the salt."""
        k = int(self.salt[:16], 16) ^ int(self.salt[16:32], 16) ^ 0x9E3779B97F4A7C15
        return f"toUInt64({k})"

    def column_type(self, column: str) -> str | None:
        return self.columns.get(column)

    def to_dict(self) -> dict:
        """A JSON-able description (without the salt)."""
        return {
            "table": self.table,
            "privacy_unit": self.privacy_unit,
            "neighbour": self.neighbour,
            "bounds": {k: list(v) for k, v in self.bounds.items()},
            "max_groups_contributed": self.max_groups_contributed,
            "max_rows_per_unit": self.max_rows_per_unit,
            "max_rows_per_group": self.max_rows_per_group,
            "public_keys": {k: list(v) for k, v in self.public_keys.items()},
            "columns": dict(self.columns),
            "public": self.public,
            "references": {k: f"{t}.{c}" for k, (t, c) in self.references.items()},
            **({"distributed": self.distributed.to_dict()} if self.distributed is not None else {}),
            **({"auto": list(self.auto)} if self.auto else {}),
        }

    def describe(self) -> str:
        lines = [f"table {self.table}"]
        if self.public:
            lines.append("  public table (not protected; joins freely, never charged)")
        elif self.privacy_unit is None and self.references:
            lines.append("  privacy unit: through references (see below)")
        else:
            lines.append(f"  privacy unit: {self.privacy_unit or '(row level: each row is a unit)'}")
        lines.append(f"  neighbour relation: {self.neighbour}")
        if self.distributed is not None:
            d = self.distributed
            lines.append(f"  distributed: cluster {d.cluster}, local table {d.local_table}, sharding key {d.sharding_key}"
                         f" ({'by unit: two-phase' if self.shards_by_unit else 'not by unit: per-unit stage global'})")
        for name in ("max_groups_contributed", "max_rows_per_unit"):
            lines.append(f"  {name}: " + ("auto (chosen per query from the data)" if name in self.auto
                                          else str(getattr(self, name))))
        if self.max_rows_per_group is not None:
            lines.append(f"  max_rows_per_group: {self.max_rows_per_group}")
        lines.append("  columns:")
        for name, typ in self.columns.items():
            extra = ""
            if f"bounds:{name}" in self.auto:
                extra += "  bounds auto (chosen per query from the data)"
            elif name in self.bounds:
                lo, hi = self.bounds[name]
                extra += f"  bounds [{lo!r}, {hi!r}]"
            if length_bound_key(name) in self.bounds:
                lo, hi = self.bounds[length_bound_key(name)]
                extra += f"  length bounds [{lo!r}, {hi!r}]"
            if name in self.public_keys:
                extra += f"  public keys ({len(self.public_keys[name])})"
            if name == self.privacy_unit:
                extra += "  (privacy unit)"
            if name in self.references:
                extra += "  references {}.{}".format(*self.references[name])
            lines.append(f"    {name} {typ}{extra}")
        return "\n".join(lines)

    def __repr__(self) -> str:  # explicit: never the salt
        return (f"TableEntry(table={self.table!r}, privacy_unit={self.privacy_unit!r}, "
                f"neighbour={self.neighbour!r}, bounds={dict(self.bounds)!r}, "
                f"max_groups_contributed={self.max_groups_contributed}, "
                f"max_rows_per_unit={self.max_rows_per_unit}, max_rows_per_group={self.max_rows_per_group}, "
                f"public_keys={{{', '.join(f'{k!r}: <{len(v)} keys>' for k, v in self.public_keys.items())}}})")
