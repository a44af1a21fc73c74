"""The privacy catalog: what the controller needs to know about a table before it can answer
queries on it with differential privacy.

Per table (qualified as ``database.table``):

- ``privacy_unit``: the column identifying the protected individual (e.g. ``user_id``), or ``None``
  for row-level privacy (every row is its own unit);
- ``neighbour``: ``"add_remove"`` (default: D' adds or removes one unit with all its rows) or
  ``"substitute"`` (D' replaces one unit's rows by arbitrary other rows). Sensitivities follow from
  it (docs/CONTROLLER.md, "Sensitivity");
- ``bounds``: per-column clipping bounds ``(lo, hi)``. Columns may be registered without bounds;
  an aggregate that needs one is then rejected with a message naming the bound to declare. A key
  ``"length(col)"`` of a String column declares bounds of its length in bytes (``AVG(length(URL))``);
  bounds of a Date/DateTime column are dates (``('2013-07-01', '2013-07-31')``), kept as days /
  seconds since the epoch (MIN/MAX/median/quantile of the column return its type);
- ``max_groups_contributed`` (k): how many GROUP BY groups one unit may contribute to;
- ``max_rows_per_unit`` (m): how many rows of one unit reach the aggregation, over all its groups
  (a unit with more rows has its contribution scaled down to m rows' worth: a per-unit clamp);
- ``max_rows_per_group`` (C, optional): a tighter cap per (unit, group);
- ``public_keys``: optional public key sets for GROUP BY columns (every key is released, even with
  no rows; keys outside the set are dropped);
- ``columns``: the registered columns and their ClickHouse types (read from the table at
  registration; a query may use no other column);
- ``public``: a public table (e.g. a dimension such as ``tpch.nation``): nothing about it is
  protected, it joins freely with other tables and a query that reads only public tables is refused
  (there is nothing to protect; query it without DPCH). Its bare columns are group keys with a
  public domain (their distinct values);
- ``references``: foreign keys, ``{column: "db.table.column"}``; the referenced column must be a
  key of the referenced table (checked at registration: unique values). A table without its own
  ``privacy_unit`` gets its unit through exactly one reference to a protected table (and so on,
  along the chain); ``dpch.relation`` uses the references to join tables and find the unit;
- ``salt``: a per-table secret (``secrets.token_hex``) keying the hash that chooses which groups and
  rows of a unit are kept. It is never shown in ``repr``, explanations or error messages.

The catalog is persisted in the engine itself, in ``dpch_meta.catalog`` (an append-only MergeTree:
every registration or drop is a new version, the latest wins), so the same code serves the
embedded engine (the table lives in its data directory) and ClickHouse servers.
"""
from __future__ import annotations

import json
import math
import re
import secrets
import threading
import time
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Iterable, Mapping

from .errors import CatalogError, DPCHError

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
        lines.append(f"  max_groups_contributed: {self.max_groups_contributed}")
        lines.append(f"  max_rows_per_unit: {self.max_rows_per_unit}")
        if self.max_rows_per_group is not None:
            lines.append(f"  max_rows_per_group: {self.max_rows_per_group}")
        lines.append("  columns:")
        for name, typ in self.columns.items():
            extra = ""
            if name in self.bounds:
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


def _spec_json(entry: TableEntry) -> str:
    return json.dumps(entry.to_dict(), sort_keys=True)


def _entry_from_row(table: str, spec_text: str, salt: str, version: int) -> TableEntry:
    try:
        spec = json.loads(spec_text)
        return TableEntry(
            table=table,
            privacy_unit=spec["privacy_unit"],
            neighbour=spec["neighbour"],
            bounds=MappingProxyType({k: (float(v[0]), float(v[1])) for k, v in spec["bounds"].items()}),
            max_groups_contributed=int(spec["max_groups_contributed"]),
            max_rows_per_unit=int(spec["max_rows_per_unit"]),
            max_rows_per_group=(None if spec.get("max_rows_per_group") is None
                                else int(spec["max_rows_per_group"])),
            public_keys=MappingProxyType({k: tuple(v) for k, v in spec["public_keys"].items()}),
            columns=MappingProxyType(dict(spec["columns"])),
            salt=salt,
            version=version,
            public=bool(spec.get("public", False)),
            references=MappingProxyType({k: tuple(v.rsplit(".", 1)) for k, v in spec.get("references", {}).items()}),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise CatalogError(f"the catalog entry of {table} is corrupt ({type(exc).__name__}); "
                           "re-register the table") from None


# ------------------------------------------------------------------------------------------------
# The catalog
# ------------------------------------------------------------------------------------------------

class Catalog:
    """The privacy catalog of one engine (embedded or server).

    Reads are cached on the backend object (shared by every Catalog over it) and invalidated by
    register/drop through any of them; for servers, where other clients may change the catalog,
    the cache expires after ``ttl`` seconds. A stale entry is still self-consistent: the rewriter
    bounds contributions with exactly the parameters it calibrates with."""

    def __init__(self, backend, *, ttl: float | None = None):
        self.backend = backend
        if ttl is None:
            ttl = math.inf if getattr(backend, "kind", "") == "embedded" else 5.0
        self.ttl = ttl
        self._ensured = False

    # -- names --------------------------------------------------------------------------------
    @property
    def default_database(self) -> str:
        return getattr(self.backend, "database", None) or "default"

    def qualify(self, table: str) -> str:
        """``db.table`` for ``table`` or ``db.table`` (plain identifiers only)."""
        if not isinstance(table, str):
            raise CatalogError("table name must be a string")
        parts = table.split(".")
        if len(parts) == 1:
            parts = [self.default_database, parts[0]]
        if len(parts) != 2 or not all(_NAME_RE.match(p) for p in parts):
            raise CatalogError(f"invalid table name {table!r}: use name or database.name with plain identifiers")
        return ".".join(parts)

    # -- storage ------------------------------------------------------------------------------
    def _ensure_meta(self) -> None:
        if self._ensured:
            return
        self.backend.command(f"CREATE DATABASE IF NOT EXISTS {META_DATABASE}")
        self.backend.command(
            f"CREATE TABLE IF NOT EXISTS {META_TABLE} (table_name String, version UInt64, deleted UInt8, "
            "spec String, salt String, updated_at DateTime64(3) DEFAULT now64(3)) "
            "ENGINE = MergeTree ORDER BY (table_name, version)")
        self._ensured = True

    def _cache(self) -> dict | None:
        cached = getattr(self.backend, "_dpch_catalog_cache", None)
        if cached is None:
            return None
        stamp, entries = cached
        if time.monotonic() - stamp > self.ttl:
            return None
        return entries

    def _invalidate(self) -> None:
        try:
            self.backend._dpch_catalog_cache = None
        except AttributeError:  # pragma: no cover - backends are plain objects
            pass

    def _load(self) -> dict[str, TableEntry]:
        cached = self._cache()
        if cached is not None:
            return cached
        lock = _backend_lock(self.backend)
        with lock:
            cached = self._cache()
            if cached is not None:
                return cached
            read = (f"SELECT table_name AS t_name, argMax(spec, version) AS t_spec, argMax(salt, version) AS t_salt, "
                    f"argMax(deleted, version) AS t_deleted, max(version) AS t_version "
                    f"FROM {META_TABLE} GROUP BY table_name")
            try:  # read first: a read-only analyst on a server cannot create the table
                df = self.backend.query_df(read)
            except DPCHError:
                self._ensure_meta()
                df = self.backend.query_df(read)
            entries: dict[str, TableEntry] = {}
            for row in df.itertuples(index=False):
                if int(row.t_deleted):
                    continue
                entries[str(row.t_name)] = _entry_from_row(str(row.t_name), str(row.t_spec),
                                                           str(row.t_salt), int(row.t_version))
            try:
                self.backend._dpch_catalog_cache = (time.monotonic(), entries)
            except AttributeError:  # pragma: no cover
                pass
            return entries

    def _write(self, table: str, spec: str, salt: str, deleted: bool) -> None:
        self._ensure_meta()
        version = time.time_ns()
        existing = self._load_uncached_version(table)
        if existing is not None and existing >= version:
            version = existing + 1
        self.backend.command(
            f"INSERT INTO {META_TABLE} (table_name, version, deleted, spec, salt) VALUES "
            f"({quote_string(table)}, {version}, {1 if deleted else 0}, {quote_string(spec)}, {quote_string(salt)})")
        self._invalidate()

    def _load_uncached_version(self, table: str) -> int | None:
        df = self.backend.query_df(
            f"SELECT max(version) AS max_v, count() AS n_rows FROM {META_TABLE} WHERE table_name = {quote_string(table)}")
        if df.empty or int(df["n_rows"].iloc[0]) == 0:
            return None
        return int(df["max_v"].iloc[0])

    def _describe(self, table: str) -> dict[str, str]:
        db, name = table.split(".", 1)
        try:
            df = self.backend.query_df(f"DESCRIBE TABLE {quote_ident(db)}.{quote_ident(name)}")
        except DPCHError:
            raise CatalogError(f"table {table} does not exist (or cannot be described); create it first") from None
        cols: dict[str, str] = {}
        for row in df.itertuples(index=False):
            default_kind = str(getattr(row, "default_type", "") or "")
            if default_kind in ("ALIAS", "EPHEMERAL"):
                continue
            cols[str(row.name)] = str(row.type)
        if not cols:
            raise CatalogError(f"table {table} has no columns")
        return cols

    # -- public API ---------------------------------------------------------------------------
    def register(self, table: str, *, privacy_unit: str | None = None, neighbour: str = "add_remove",
                 bounds: Mapping[str, tuple[float, float]] | None = None,
                 max_groups_contributed: int = 1, max_rows_per_unit: int = 1,
                 max_rows_per_group: int | None = None,
                 public_keys: Mapping[str, Iterable] | None = None,
                 columns: Iterable[str] | None = None, rotate_salt: bool = False,
                 public: bool = False, references: Mapping[str, str] | None = None) -> TableEntry:
        """Register (or re-register) ``table``. Reads its schema now; ``columns`` restricts the
        columns analysts may use (default: all). Re-registering keeps the salt unless
        ``rotate_salt``. ``public=True``: a public table (nothing protected). ``references``:
        foreign keys ``{column: "db.table.column"}`` to registered tables, each to a key (unique
        values, checked now); a table without ``privacy_unit`` reaches its unit through them
        (checked now: the chain must end at a unit). Returns the stored entry."""
        qualified = self.qualify(table)
        schema = self._describe(qualified)
        if not isinstance(public, bool):
            raise CatalogError("public must be True or False")
        if public and privacy_unit is not None:
            raise CatalogError("a public table has no privacy unit: drop privacy_unit or public=True")

        if columns is not None:
            cols = list(columns)
            for c in cols:
                if c not in schema:
                    raise CatalogError(f"column {c!r} is not a column of {qualified}")
            registered = {c: schema[c] for c in cols}
        else:
            registered = dict(schema)

        if privacy_unit is not None:
            if not isinstance(privacy_unit, str) or privacy_unit not in schema:
                raise CatalogError(f"privacy unit column {privacy_unit!r} is not a column of {qualified}")
            registered.setdefault(privacy_unit, schema[privacy_unit])

        if neighbour not in NEIGHBOURS:
            raise CatalogError(f"neighbour must be one of {', '.join(NEIGHBOURS)}")

        def _positive_int(value, name):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise CatalogError(f"{name} must be an integer >= 1")
            return int(value)

        k = _positive_int(max_groups_contributed, "max_groups_contributed")
        m = _positive_int(max_rows_per_unit, "max_rows_per_unit")
        c = None if max_rows_per_group is None else _positive_int(max_rows_per_group, "max_rows_per_group")
        checked_refs = self._check_references(qualified, registered, references or {}, public)
        via_reference = any(not self._load()[t].public for t, _ in checked_refs.values())
        if privacy_unit is None and not via_reference and (k != 1 or m != 1 or c not in (None, 1)):
            raise CatalogError("a row-level table (no privacy_unit) has one row per unit: "
                               "max_groups_contributed, max_rows_per_unit and max_rows_per_group must be 1")

        checked_bounds: dict[str, tuple[float, float]] = {}
        for col, pair in (bounds or {}).items():
            length_of = _LENGTH_KEY_RE.match(col) if isinstance(col, str) else None
            if length_of is not None:
                # bounds of a derived value: length(<String column>) in bytes (AVG(length(URL)))
                target = length_of.group(1)
                if target not in registered or not is_string_type(registered[target]):
                    raise CatalogError(f"bounds given for {col!r}: {target!r} is not a registered String column "
                                       f"of {qualified}")
                col = length_bound_key(target)
            elif col not in registered:
                raise CatalogError(f"bounds given for {col!r}, which is not a registered column of {qualified}")
            elif not is_numeric_type(registered[col]) and date_kind(registered[col]) is None:
                raise CatalogError(f"bounds given for {col!r}, which is not numeric ({registered[col]})")
            kind = None if length_of is not None else date_kind(registered[col])
            try:
                lo, hi = pair
                if kind is not None:  # Date/DateTime: kept as days / seconds since the epoch
                    lo, hi = date_bound_number(lo, kind), date_bound_number(hi, kind)
                lo_f, hi_f = float(lo), float(hi)
            except (TypeError, ValueError):
                what = "dates ('2013-07-01') or numbers" if kind == "date" else \
                    "date-times ('2013-07-01 00:00:00', UTC) or numbers" if kind == "datetime" else "numbers"
                raise CatalogError(f"bounds of {col!r} must be a pair (lo, hi) of {what}") from None
            if isinstance(lo, bool) or isinstance(hi, bool) or not (math.isfinite(lo_f) and math.isfinite(hi_f)):
                raise CatalogError(f"bounds of {col!r} must be finite numbers")
            if lo_f > hi_f:
                raise CatalogError(f"bounds of {col!r}: the lower bound must not exceed the upper bound")
            if length_of is not None and lo_f < 0:
                raise CatalogError(f"bounds of {col!r}: a length is not negative")
            if max(abs(lo_f), abs(hi_f)) > MAX_ABS_BOUND:
                raise CatalogError(f"bounds of {col!r}: |lo| and |hi| must be at most 2^900 (≈ 8.5e270), so that a "
                                   f"sum of up to 2^63 fixed-point units stays a finite Float64; rescale the column")
            checked_bounds[col] = (lo_f, hi_f)

        checked_keys: dict[str, tuple] = {}
        for col, values in (public_keys or {}).items():
            if col not in registered:
                raise CatalogError(f"public keys given for {col!r}, which is not a registered column of {qualified}")
            if col == privacy_unit:
                raise CatalogError("the privacy unit column cannot have public keys (grouping by it would "
                                   "release per-unit values)")
            if isinstance(values, (str, bytes)):
                raise CatalogError(f"public keys of {col!r} must be a list of values, not a string")
            vals = []
            seen = set()
            for v in values:
                literal_sql(v)  # validates the type
                marker = (type(v).__name__, v)
                if marker not in seen:
                    seen.add(marker)
                    vals.append(v)
            if not vals:
                raise CatalogError(f"public keys of {col!r} must not be empty")
            if len(vals) > MAX_PUBLIC_KEYS:
                raise CatalogError(f"public keys of {col!r}: at most {MAX_PUBLIC_KEYS} keys")
            checked_keys[col] = tuple(vals)

        previous = self._load().get(qualified)
        salt = secrets.token_hex(16) if (previous is None or rotate_salt) else previous.salt
        entry = TableEntry(
            table=qualified, privacy_unit=privacy_unit, neighbour=neighbour,
            bounds=MappingProxyType(checked_bounds), max_groups_contributed=k, max_rows_per_unit=m,
            max_rows_per_group=c, public_keys=MappingProxyType(checked_keys),
            columns=MappingProxyType(registered), salt=salt, public=public,
            references=MappingProxyType(checked_refs))
        if not public:
            from .units import unit_path  # the chain must end at a unit (or there is none: row level)

            unit_path(entry, {**self._load(), qualified: entry}.get)
        self._write(qualified, _spec_json(entry), salt, deleted=False)
        return self.get(qualified)

    def _check_references(self, qualified: str, registered: Mapping[str, str], references: Mapping[str, str],
                          public: bool) -> dict[str, tuple[str, str]]:
        if references and public:
            raise CatalogError("a public table declares no references (join it on any key instead)")
        if not isinstance(references, Mapping):
            raise CatalogError('references must be a mapping {column: "db.table.column"}')
        out: dict[str, tuple[str, str]] = {}
        for col, target in references.items():
            if col not in registered:
                raise CatalogError(f"reference from {col!r}, which is not a registered column of {qualified}")
            if not isinstance(target, str) or target.count(".") not in (1, 2):
                raise CatalogError(f'reference of {col!r} must be "db.table.column" (got {target!r})')
            t_table, t_col = target.rsplit(".", 1)
            t_qualified = self.qualify(t_table)
            t_entry = self._load().get(t_qualified)
            if t_entry is None:
                raise CatalogError(f"reference of {col!r}: {t_qualified} is not in the privacy catalog; "
                                   "register the referenced table first")
            if t_col not in t_entry.columns:
                raise CatalogError(f"reference of {col!r}: {t_col!r} is not a registered column of {t_qualified}")
            if t_qualified == qualified:
                raise CatalogError(f"reference of {col!r}: a table cannot reference itself")
            self._check_key(t_entry, t_col)
            out[col] = (t_qualified, t_col)
        return out

    def _check_key(self, entry: "TableEntry", column: str) -> None:
        """A referenced column must be a key (unique values): a row that references it then belongs
        to exactly one referenced row, hence to exactly one unit (docs/CONTROLLER.md, "Joins")."""
        col = quote_ident(column)
        df = self.backend.query_df(f"SELECT count() AS n_rows, uniqExact({col}) AS n_keys FROM {entry.table_sql}")
        if int(df["n_rows"].iloc[0]) != int(df["n_keys"].iloc[0]):
            raise CatalogError(f"{entry.table}.{column} is not a key (its values are not unique), so it cannot "
                               "be referenced: a referencing row must belong to exactly one referenced row")

    def get(self, table: str) -> TableEntry:
        """The entry of ``table``; CatalogError if it is not registered."""
        qualified = self.qualify(table)
        entry = self._load().get(qualified)
        if entry is None:
            raise CatalogError(f"table {qualified} is not in the privacy catalog; register it first, e.g. "
                               f"db.catalog.register({qualified!r}, privacy_unit=..., bounds={{...}})")
        return entry

    def lookup(self, qualified: str) -> TableEntry | None:
        """The entry for an already-qualified name, or None."""
        return self._load().get(qualified)

    def __contains__(self, table: str) -> bool:
        try:
            return self.qualify(table) in self._load()
        except CatalogError:
            return False

    def list(self) -> list[TableEntry]:
        return [self._load()[k] for k in sorted(self._load())]

    def drop(self, table: str) -> None:
        """Remove ``table`` from the catalog (queries on it are then rejected)."""
        entry = self.get(table)
        self._write(entry.table, "{}", "", deleted=True)

    def refresh(self) -> None:
        self._invalidate()


_LOCKS: dict[int, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


def _backend_lock(backend) -> threading.Lock:
    with _LOCKS_GUARD:
        lock = _LOCKS.get(id(backend))
        if lock is None:
            lock = _LOCKS[id(backend)] = threading.Lock()
        return lock
