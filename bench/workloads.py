"""Benchmark workloads: deterministic synthetic data per size, and the four benchmark queries.

The data is generated inside ClickHouse from hashes of the row number (no RNG, in the style of
`dpch.demo`), so every machine gets byte-identical tables. Each size is generated once into the
embedded store (database `bench`) and, for the peers that run outside ClickHouse, exported once to
Parquet under `bench/data/parquet/`. Both are reused by later runs (regenerated only if the row
count does not match).

Schema of `bench.events_<label>` (rows N, privacy units N/10):

| column  | type    | how |
|---|---|---|
| row_id  | UInt64  | the row number |
| user_id | UInt64  | `cityHash64(row, 'user') % units` (about 10 rows per unit, Poisson-like; max ~30) |
| region  | UInt16  | 100 regions; 80 % of a unit's rows are in its home region, 20 % anywhere |
| item    | UInt16  | 10 000 items, uniform per row (the public key set of query (d)) |
| amount  | Float64 | in [0, 500], skewed (500·u², cents) |

A row-level view `bench.events_<label>_rows` over the same table lets the controller's catalog
describe the same data once with a privacy unit (user-level) and once without (row-level); a
third, `bench.events_<label>_u10`, is user-level with ≤10 groups and ≤10 rows per unit (query (e)).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
DATA_DIR = BENCH_DIR / "data"
PARQUET_DIR = DATA_DIR / "parquet"
DB = "bench"
REGIONS = 100
ITEMS = 10_000
AMOUNT_BOUNDS = (0.0, 500.0)
MAX_GROUPS_PER_UNIT = 1
MAX_ROWS_PER_UNIT = 10


def size_label(rows: int) -> str:
    for div, suffix in ((1_000_000_000, "b"), (1_000_000, "m"), (1_000, "k")):
        if rows >= div and rows % div == 0:
            return f"{rows // div}{suffix}"
    return str(rows)


@dataclass(frozen=True)
class Workload:
    rows: int
    units: int = 0  # 0: rows // 10
    tag: str = ""   # namespace (e.g. "acc" for the accuracy data, "smoke" for tests)

    @property
    def n_units(self) -> int:
        return self.units or max(1, self.rows // 10)

    @property
    def label(self) -> str:
        return f"{self.tag}_{size_label(self.rows)}" if self.tag else size_label(self.rows)

    @property
    def table(self) -> str:
        return f"{DB}.events_{self.label}"

    @property
    def row_view(self) -> str:
        return f"{DB}.events_{self.label}_rows"

    @property
    def rows10_view(self) -> str:
        """Second user-level view, catalogued with ≤10 groups and ≤10 rows per unit (query (e))."""
        return f"{DB}.events_{self.label}_u10"

    def parquet_path(self, parquet_dir: Path = PARQUET_DIR) -> Path:
        return parquet_dir / f"events_{self.label}.parquet"


@dataclass(frozen=True)
class Query:
    qid: str
    title: str
    level: str                 # "row" or "user"
    group: str | None          # group-by column, None for a whole-table aggregate
    stats: tuple[str, ...]     # released statistics, in output order
    n_keys: int = 0            # public key set size (0 = scalar)
    notes: str = ""
    max_groups: int = MAX_GROUPS_PER_UNIT  # user-level: groups a unit may contribute to

    @property
    def keys(self) -> list[int]:
        return list(range(self.n_keys))


QUERIES: dict[str, Query] = {
    "a": Query("a", "row-level COUNT + SUM GROUP BY region", "row", "region", ("count", "sum"), REGIONS),
    "b": Query("b", "user-level COUNT + SUM GROUP BY region (≤1 group/user, ≤10 rows/user)", "user",
               "region", ("count", "sum"), REGIONS),
    "c": Query("c", "row-level AVG(amount) over the whole table", "row", None, ("avg",)),
    "d": Query("d", "row-level COUNT + SUM GROUP BY item, 10 000 public keys", "row", "item",
               ("count", "sum"), ITEMS),
    # Not one of the four queries: (b) with SmartNoise's kind of bound (≤10 rows per user,
    # in any number of groups) so that SmartNoise can be compared like with like. Same sensitivity
    # as (b) (a user changes the count vector by ≤10 in L1), less bounding bias. Run on request
    # (`--queries e`).
    "e": Query("e", "user-level COUNT + SUM GROUP BY region (≤10 rows/user, any groups: SmartNoise's bound)",
               "user", "region", ("count", "sum"), REGIONS, max_groups=10,
               notes="not one of the issue's four; accuracy only, to compare SmartNoise like with like"),
}


def _exists(db, table: str) -> bool:
    database, name = table.split(".")
    df = db.raw_query(f"SELECT count() AS n FROM system.tables WHERE database = '{database}' AND name = '{name}'")
    return bool(int(df["n"][0]))


def ensure_table(db, wl: Workload, log=print) -> bool:
    """Create `wl.table` (and its row-level view) unless it already holds `wl.rows` rows.
    Returns True if the data was (re)generated."""
    db.command(f"CREATE DATABASE IF NOT EXISTS {DB}")
    if _exists(db, wl.table):
        n = int(db.raw_query(f"SELECT count() AS n FROM {wl.table}")["n"][0])
        if n == wl.rows:
            for view in (wl.row_view, wl.rows10_view):
                db.command(f"CREATE VIEW IF NOT EXISTS {view} AS SELECT * FROM {wl.table}")
            return False
        db.command(f"DROP VIEW IF EXISTS {wl.rows10_view}")
        db.command(f"DROP VIEW IF EXISTS {wl.row_view}")
        db.command(f"DROP TABLE {wl.table}")
    log(f"generating {wl.rows:,} rows into {wl.table} ...")
    db.command(f"CREATE TABLE {wl.table} (row_id UInt64, user_id UInt64, region UInt16, item UInt16, "
               "amount Float64) ENGINE = MergeTree ORDER BY row_id")
    units = wl.n_units
    db.command(
        f"INSERT INTO {wl.table} SELECT number AS row_id, "
        f"cityHash64(number, 'user') % {units} AS user_id, "
        f"toUInt16(if(cityHash64(number, 'roam') % 5 = 0, cityHash64(number, 'region') % {REGIONS}, "
        f"cityHash64(user_id, 'home') % {REGIONS})) AS region, "
        f"toUInt16(cityHash64(number, 'item') % {ITEMS}) AS item, "
        "round(500 * pow((cityHash64(number, 'amount') % 1000001) / 1e6, 2), 2) AS amount "
        f"FROM numbers({wl.rows})")
    for view in (wl.row_view, wl.rows10_view):
        db.command(f"CREATE VIEW IF NOT EXISTS {view} AS SELECT * FROM {wl.table}")
    return True


def ensure_copy(db, wl: Workload, copy: str) -> None:
    """A copy of `wl.table` named `copy` (made once; remade if its row count differs)."""
    if _exists(db, copy):
        if int(db.raw_query(f"SELECT count() AS n FROM {copy}")["n"][0]) == wl.rows:
            return
        db.command(f"DROP TABLE {copy}")
    db.command(f"CREATE TABLE {copy} AS {wl.table}")
    db.command(f"INSERT INTO {copy} SELECT * FROM {wl.table}")


def ensure_parquet(db, wl: Workload, parquet_dir: Path = PARQUET_DIR, regenerated: bool = False,
                   log=print) -> Path:
    """Export the table to Parquet (once) for the peers, which run outside ClickHouse."""
    path = wl.parquet_path(parquet_dir)
    if path.exists() and not regenerated:
        try:
            import pyarrow.parquet as pq

            if pq.ParquetFile(path).metadata.num_rows == wl.rows:
                return path
        except Exception:
            pass
    path.parent.mkdir(parents=True, exist_ok=True)
    log(f"exporting {wl.table} to {path} ...")
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    db.command(f"SELECT row_id, user_id, region, item, amount FROM {wl.table} ORDER BY row_id "
               f"INTO OUTFILE '{tmp}' FORMAT Parquet")
    tmp.rename(path)
    return path


@dataclass
class Truth:
    """Exact (non-private) answers, for accuracy only. `keys` are the group keys in order; `raw`
    are the plain answers; `bounded` (user-level) is the answer after the contribution bounds if
    bounding kept the *first* rows — it is NOT what any system computes (each bounds with its own
    keyed hash or sample), it only shows how much bounding can remove."""
    keys: list[int]
    values: dict[str, list[float]] = field(default_factory=dict)


def truth(db, wl: Workload, q: Query) -> Truth:
    if q.group is None:
        df = db.raw_query(f"SELECT avg(amount) AS avg FROM {wl.table}")
        return Truth([0], {"avg": [float(df["avg"][0])]})
    keys = q.keys
    df = db.raw_query(f"SELECT {q.group} AS key, count() AS count, sum(amount) AS sum FROM {wl.table} "
                      f"GROUP BY key ORDER BY key")
    by = {int(k): (float(c), float(s)) for k, c, s in zip(df["key"], df["count"], df["sum"])}
    return Truth(keys, {"count": [by.get(k, (0.0, 0.0))[0] for k in keys],
                        "sum": [by.get(k, (0.0, 0.0))[1] for k in keys]})
