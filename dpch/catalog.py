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
import secrets
import threading
import time
from types import MappingProxyType
from typing import Callable, Iterable, Mapping

from .backends import query_records
from .catalog_model import (  # noqa: F401 - re-exported: the records moved to dpch.catalog_model
    META_DATABASE, META_TABLE, NEIGHBOURS, MAX_PUBLIC_KEYS, _NAME_RE, _INTEGER_TYPES, _FLOAT_TYPES,
    quote_ident, quote_string, base_type, is_nullable, is_integer_type, is_numeric_type, MAX_ABS_BOUND,
    _LENGTH_KEY_RE, length_bound_key, date_kind, date_bound_number, is_string_type, literal_sql, TableEntry,
    DistributedSpec, sharding_columns, parse_distributed_engine,
)
from .errors import GATEWAY, CatalogError, DPCHError, current_interface, unknown_table


def _spec_json(entry: TableEntry) -> str:
    return json.dumps(entry.to_dict(), sort_keys=True)


#: what defines a dataset's unit (and so what its recorded charges were accounted under)
UNIT_FIELDS = ("privacy_unit", "public", "neighbour", "references")


def changed_fields(old: TableEntry, new: TableEntry) -> list[str]:
    """The entry fields that differ between ``old`` and ``new`` (the salt and version aside)."""
    a, b = old.to_dict(), new.to_dict()
    return [k for k in a if json.dumps(a[k], sort_keys=True) != json.dumps(b.get(k), sort_keys=True)]


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
            distributed=DistributedSpec(**spec["distributed"]) if spec.get("distributed") else None,
            auto=tuple(spec.get("auto", ())),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise CatalogError(f"the catalog entry of {table} is corrupt ({type(exc).__name__}); "
                           "re-register the table") from None


# ------------------------------------------------------------------------------------------------
# The catalog
# ------------------------------------------------------------------------------------------------

# the engine's table names, for "does not exist" / "did you mean" (a constant statement: no analyst
# text, no rows; the only engine read a rejected query may make)
TABLE_NAMES_SQL = ("SELECT database || '.' || name AS t FROM system.tables WHERE database NOT IN "
                   f"('system', 'INFORMATION_SCHEMA', 'information_schema', '{META_DATABASE}')")


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
        # under the load lock: a load that read the table before this write cannot store its stale copy after
        with _backend_lock(self.backend):
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
                rows = query_records(self.backend, read)
            except DPCHError:
                self._ensure_meta()
                rows = query_records(self.backend, read)
            entries: dict[str, TableEntry] = {}
            for row in rows:
                if int(row["t_deleted"]):
                    continue
                entries[row["t_name"]] = _entry_from_row(row["t_name"], row["t_spec"], row["t_salt"],
                                                         int(row["t_version"]))
            try:
                self.backend._dpch_catalog_cache = (time.monotonic(), entries)
            except AttributeError:  # pragma: no cover
                pass
            return entries

    def _write(self, table: str, spec: str, salt: str, deleted: bool) -> None:
        """Append a version of ``table``'s entry. The version is the clock in ns, or one above the
        table's latest version if the clock is behind it (argMax must see every write as newer),
        chosen by the INSERT itself: one statement, no read first. The cached copy takes the clock's
        value; only if the clock was behind does it differ from the stored one, and the version
        only keys the plan cache, so that costs at most a re-plan after the next reload."""
        self._ensure_meta()
        version = time.time_ns()
        self.backend.command(
            f"INSERT INTO {META_TABLE} (table_name, version, deleted, spec, salt) "
            f"SELECT {quote_string(table)}, greatest(toUInt64({version}), "
            f"(SELECT max(version) + 1 FROM {META_TABLE} WHERE table_name = {quote_string(table)})), "
            f"{1 if deleted else 0}, {quote_string(spec)}, {quote_string(salt)}")
        self._written(table, None if deleted else _entry_from_row(table, spec, salt, version))

    def _written(self, table: str, entry: TableEntry | None) -> None:
        """Put this process's own write into its cached catalog instead of dropping the cache (a reload
        reads every version ever written). Under the load lock, after the INSERT: a load that read
        the table before the write has stored its copy by then, and the patch makes it current."""
        with _backend_lock(self.backend):
            cached = getattr(self.backend, "_dpch_catalog_cache", None)
            if cached is None:
                return
            stamp, entries = cached
            entries = {k: v for k, v in entries.items() if k != table}
            if entry is not None:
                entries[table] = entry
            try:
                self.backend._dpch_catalog_cache = (stamp, entries)
            except AttributeError:  # pragma: no cover
                pass

    def _describe(self, table: str) -> dict[str, str]:
        db, name = table.split(".", 1)
        try:
            rows = query_records(self.backend, f"DESCRIBE TABLE {quote_ident(db)}.{quote_ident(name)}")
        except DPCHError:
            raise CatalogError(f"table {table} does not exist (or cannot be described); create it first") from None
        cols: dict[str, str] = {}
        for row in rows:
            if (row.get("default_type") or "") in ("ALIAS", "EPHEMERAL"):
                continue
            cols[str(row["name"])] = str(row["type"])
        if not cols:
            raise CatalogError(f"table {table} has no columns")
        return cols

    # -- public API ---------------------------------------------------------------------------
    def register(self, table: str, *, privacy_unit: str | None = None, neighbour: str = "add_remove",
                 bounds: Mapping[str, tuple[float, float]] | None = None,
                 max_groups_contributed: int | str = 1, max_rows_per_unit: int | str = 1,
                 max_rows_per_group: int | None = None,
                 public_keys: Mapping[str, Iterable] | None = None,
                 columns: Iterable[str] | None = None, rotate_salt: bool = False,
                 public: bool = False, references: Mapping[str, str] | None = None,
                 replace: bool = False, distributed: Mapping[str, str] | None = None) -> TableEntry:
        """Register ``table``. Reads its schema now; ``columns`` restricts the columns analysts
        may use (default: all). ``public=True``: a public table (nothing protected).
        ``references``: foreign keys ``{column: "db.table.column"}`` to registered tables, each to
        a key (unique values, checked now); a table without ``privacy_unit`` reaches its unit
        through them (checked now: the chain must end at a unit). ``distributed``: the table is a
        ``Distributed`` table, ``{"cluster": ..., "local_table": "db.t_local", "sharding_key":
        "cityHash64(user_id)"}``, checked now against the engine's definition of the table; a key
        that is a function of the unit alone lets the rewrite run the per-unit and group stages on
        each shard (dpch.rewrite.shards). ``max_groups_contributed``/``max_rows_per_unit`` = "auto"
        and ``bounds={column: "auto"}``: every query chooses them from the data, privately, with a
        share of its ε (dpch.plan.profile), unless it gives its own. Returns the stored entry.

        A registered table is not replaced by accident: registering it again with the same entry
        changes nothing; a different entry is refused unless ``replace=True`` (a register call
        states the WHOLE entry, so bounds and public keys it does not name would be dropped; use
        ``update`` to change only what you name). Re-registering keeps the salt unless
        ``rotate_salt``. Changing what defines a unit (privacy_unit, public, neighbour,
        references) of a dataset with charges on record in the current budget generation is
        refused: its past answers were accounted under the old unit (reset the budgets, or
        register the data under a new name)."""
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
                raise CatalogError(f"{name} must be an integer >= 1" + (" or 'auto'" if name in (
                    "max_groups_contributed", "max_rows_per_unit") else ""))
            return int(value)

        # 'auto': every query chooses the bound from the data (dpch.plan.profile) unless it gives
        # its own; the stored integer (1) is what a query that turns auto off (auto_share=0) uses
        auto = [n for n, v in (("max_groups_contributed", max_groups_contributed),
                               ("max_rows_per_unit", max_rows_per_unit)) if v == "auto"]
        k = 1 if "max_groups_contributed" in auto else _positive_int(max_groups_contributed, "max_groups_contributed")
        m = 1 if "max_rows_per_unit" in auto else _positive_int(max_rows_per_unit, "max_rows_per_unit")
        c = None if max_rows_per_group is None else _positive_int(max_rows_per_group, "max_rows_per_group")
        checked_refs = self._check_references(qualified, registered, references or {}, public)
        via_reference = any(not self._load()[t].public for t, _ in checked_refs.values())
        if privacy_unit is None and not via_reference and (k != 1 or m != 1 or c not in (None, 1) or auto):
            raise CatalogError("a row-level table (no privacy_unit) has one row per unit: "
                               "max_groups_contributed, max_rows_per_unit and max_rows_per_group must be 1")

        checked_bounds: dict[str, tuple[float, float]] = {}
        for col, pair in (bounds or {}).items():
            if pair == "auto":
                if col not in registered or not is_numeric_type(registered[col]):
                    raise CatalogError(f"bounds 'auto' given for {col!r}, which is not a registered numeric column "
                                       f"of {qualified}")
                auto.append(f"bounds:{col}")
                continue
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
            references=MappingProxyType(checked_refs),
            distributed=None if distributed is None else self._check_distributed(qualified, registered, distributed),
            auto=tuple(auto))
        if not public:
            from .units import unit_path  # the chain must end at a unit (or there is none: row level)

            unit_path(entry, {**self._load(), qualified: entry}.get)
        if previous is not None:
            changed = changed_fields(previous, entry)
            if not changed and not rotate_salt:
                return previous  # the same entry (a setup script run again): nothing to write
            if changed and not replace:
                raise CatalogError(
                    f"{qualified} is registered already; this register call would replace its whole entry and "
                    f"change {', '.join(changed)}. Change only what you name with db.catalog.update({qualified!r}, "
                    f"...) (CLI: dpch catalog update), or pass replace=True (CLI: --replace) to replace the entry")
            self._check_unit_change(previous, entry, changed)
        self._write(qualified, _spec_json(entry), salt, deleted=False)
        return self.get(qualified)

    def update(self, table: str, *, bounds: Mapping[str, tuple[float, float] | None] | None = None,
               public_keys: Mapping[str, Iterable | None] | None = None, **changes) -> TableEntry:
        """Change only what is named, keep the rest of ``table``'s entry (and its salt).
        ``bounds`` and ``public_keys`` are merged per column (a column mapped to None loses its
        bounds / public keys); any other register argument (privacy_unit, neighbour,
        max_groups_contributed, max_rows_per_unit, max_rows_per_group, columns, public,
        references, rotate_salt) replaces the old value. The same checks as ``register`` apply,
        including the refusal to change the unit of a dataset with charges on record."""
        allowed = {"privacy_unit", "neighbour", "max_groups_contributed", "max_rows_per_unit",
                   "max_rows_per_group", "columns", "public", "references", "rotate_salt", "distributed"}
        unknown = sorted(set(changes) - allowed)
        if unknown:
            raise CatalogError(f"update: unknown argument(s) {', '.join(unknown)}; allowed: bounds, public_keys, "
                               f"{', '.join(sorted(allowed))}")
        old = self.get(table)
        spec = old.to_dict()
        merged_bounds = {k: tuple(v) for k, v in spec["bounds"].items()}
        merged_bounds.update({a.split(":", 1)[1]: "auto" for a in old.auto if a.startswith("bounds:")})
        for col, pair in (bounds or {}).items():
            if pair is None:
                merged_bounds.pop(col, None)
            else:
                merged_bounds[col] = pair
        merged_keys = dict(spec["public_keys"])
        for col, values in (public_keys or {}).items():
            if values is None:
                merged_keys.pop(col, None)
            else:
                merged_keys[col] = values
        kwargs = {"privacy_unit": spec["privacy_unit"], "neighbour": spec["neighbour"],
                  "max_groups_contributed": "auto" if "max_groups_contributed" in old.auto
                  else spec["max_groups_contributed"],
                  "max_rows_per_unit": "auto" if "max_rows_per_unit" in old.auto else spec["max_rows_per_unit"],
                  "max_rows_per_group": spec["max_rows_per_group"],
                  "columns": list(spec["columns"]), "public": spec["public"], "references": spec["references"],
                  "distributed": spec.get("distributed")}
        kwargs.update(changes)
        return self.register(old.table, bounds=merged_bounds, public_keys=merged_keys, replace=True, **kwargs)

    #: set by the owner of a ledger (dpch.connection): dataset -> charges on record in the current
    #: budget generations; the catalog itself does not read the ledger (a layer of its own)
    charges_on_record: Callable[[str], int] | None = None

    def _check_distributed(self, qualified: str, registered: Mapping[str, str],
                           distributed: Mapping[str, str]) -> DistributedSpec:
        """The declared Distributed table, checked: cluster, local table and sharding key given;
        the key one ClickHouse expression over registered columns; and the engine's definition of
        ``qualified`` (system.tables.engine_full) the same Distributed table with the same key. The
        rows must still be written through the Distributed table (docs/DEPLOY.md, "A cluster")."""
        if not isinstance(distributed, Mapping) or set(distributed) != {"cluster", "local_table", "sharding_key"} \
                or not all(isinstance(v, str) and v.strip() for v in distributed.values()):
            raise CatalogError('distributed must be {"cluster": ..., "local_table": "db.table", "sharding_key": ...}')
        cols, _ = sharding_columns(distributed["sharding_key"])
        if not cols <= set(registered):
            raise CatalogError(f"the sharding key of {qualified} reads columns that are not registered columns")
        spec = DistributedSpec(cluster=distributed["cluster"], local_table=self.qualify(distributed["local_table"]),
                               sharding_key=distributed["sharding_key"].strip())
        db, name = qualified.split(".", 1)
        rows = query_records(self.backend, f"SELECT engine, engine_full FROM system.tables WHERE database = "
                                           f"{quote_string(db)} AND name = {quote_string(name)}")
        engine = (str(rows[0]["engine"]), str(rows[0]["engine_full"])) if rows else ("", "")
        if engine[0] != "Distributed":
            raise CatalogError(f"{qualified} is not a Distributed table (engine {engine[0] or 'unknown'}); "
                               "register the Distributed table, not a local one")
        if parse_distributed_engine(engine[1], db) != spec.normalized():
            raise CatalogError(f"the declared cluster, local table or sharding key of {qualified} differs from its "
                               "Distributed engine definition (SHOW CREATE TABLE)")
        return spec

    def _check_unit_change(self, previous: TableEntry, entry: TableEntry, changed: list[str]) -> None:
        unit_changes = [f for f in changed if f in UNIT_FIELDS]
        if not unit_changes or self.charges_on_record is None:
            return
        n = self.charges_on_record(previous.table)
        if n:
            raise CatalogError(
                f"{previous.table} has {n} charge(s) on record under its current privacy unit; changing "
                f"{', '.join(unit_changes)} would account its next answers under another unit. Reset the budgets "
                f"first (dpch budget reset, or db.ledger.reset(analyst, dataset, confirm=True) for each analyst), or "
                f"register the data under a new table name")

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
        [row] = query_records(self.backend, f"SELECT count() AS n_rows, uniqExact({col}) AS n_keys FROM {entry.table_sql}")
        if int(row["n_rows"]) != int(row["n_keys"]):
            raise CatalogError(f"{entry.table}.{column} is not a key (its values are not unique), so it cannot "
                               "be referenced: a referencing row must belong to exactly one referenced row")

    def get(self, table: str) -> TableEntry:
        """The entry of ``table``; CatalogError if it is not registered."""
        qualified = self.qualify(table)
        entry = self._load().get(qualified)
        if entry is None:
            raise self._not_registered(qualified)
        return entry

    def _not_registered(self, qualified: str) -> CatalogError:
        """"does not exist" or "is not in the privacy catalog", with close names from the catalog
        and the engine (table names only; issue 31)."""
        names, exists = set(self._load()), None
        if current_interface() == GATEWAY:  # an analyst behind the gateway learns nothing of other tables
            return unknown_table(qualified, None, names)
        try:
            names |= {row["t"] for row in query_records(self.backend, TABLE_NAMES_SQL)}
            exists = qualified in names
        except DPCHError:  # the engine could not be asked: say only what the catalog knows
            pass
        return unknown_table(qualified, exists, names)

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
    """The lock of ``backend``'s engine: catalog loads and probe-table creation take it. Views of one
    engine (the gateway's per-analyst `dpch.engine_worker.LimitedBackend`) name it as ``state_owner``
    and share its lock, so two analysts' threads never create the same probe table at once."""
    backend = getattr(backend, "state_owner", backend)
    with _LOCKS_GUARD:
        lock = _LOCKS.get(id(backend))
        if lock is None:
            lock = _LOCKS[id(backend)] = threading.Lock()
        return lock
