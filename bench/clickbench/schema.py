"""The hits-like table of the ClickBench-style workload (issue 17): schema, synthetic data, catalog.

The columns are the ones the public ClickBench queries read, with the types of ClickBench's
`clickhouse/create.sql` (github.com/ClickHouse/ClickBench; BIGINT -> Int64, INTEGER -> Int32,
SMALLINT -> Int16, TEXT -> String, TIMESTAMP -> DateTime) and its sorting key
(CounterID, EventDate, UserID, EventTime, WatchID). The rows are generated inside ClickHouse
from `numbers(N)` with keyed hashes (deterministic, no `rand()`): a Zipf-distributed user per row
(UserID is the privacy unit), per-user attributes (region, screen, phone, IP), Zipf URLs, titles,
referers and search phrases, event times over July 2013. Nothing here is private or secret: it is
benchmark data. The catalog declares UserID as the unit with k = 5 groups and M = 100 rows per unit.
"""
from __future__ import annotations

DB = "clickbench"
TABLE = f"{DB}.hits"

COLUMNS = (
    "WatchID Int64, Title String, EventTime DateTime, EventDate Date, CounterID Int32, ClientIP Int32, "
    "RegionID Int32, UserID Int64, URL String, Referer String, IsRefresh Int16, ResolutionWidth Int16, "
    "MobilePhone Int16, MobilePhoneModel String, TraficSourceID Int16, SearchEngineID Int16, "
    "SearchPhrase String, AdvEngineID Int16, WindowClientWidth Int16, WindowClientHeight Int16, "
    "DontCountHits Int16, IsLink Int16, IsDownload Int16, URLHash Int64, RefererHash Int64"
)
SORTING_KEY = "(CounterID, EventDate, UserID, EventTime, WatchID)"

# Contribution bounds of the issue: k groups and M rows per unit (user).
MAX_GROUPS = 5
MAX_ROWS = 100

# Declared value bounds (the data owner's knowledge of the columns, not read from the data).
BOUNDS = {
    "AdvEngineID": (0, 31),          # advertising engine ids (0 = none)
    "ResolutionWidth": (0, 8192),    # screen width in pixels
    "IsRefresh": (0, 1),
    "DontCountHits": (0, 1),
    "IsLink": (0, 1),
    "IsDownload": (0, 1),
    "TraficSourceID": (-1, 9),       # traffic source ids
    "SearchEngineID": (0, 63),       # search engine ids (0 = none)
    "MobilePhone": (0, 255),         # phone vendor ids
    "RegionID": (0, 9999),           # region ids
    "UserID": (0, 2**63 - 1),        # the unit's identifier, non-negative Int64
    "EventDate": ("2013-07-01", "2013-07-31"),  # the month the data covers
    "EventTime": ("2013-07-01 00:00:00", "2013-08-01 00:00:00"),
    "length(URL)": (0, 2048),        # URL length in bytes (the usual limit of browsers and servers)
    "length(Referer)": (0, 2048),
}

# Zipf exponents and domain sizes of the synthetic columns.
USER_ZIPF = 0.9
URL_ZIPF = 1.1
URLS = 200_000
PHRASES = 50_000
COUNTERS = 2_000
REFERER_DOMAINS = 5_000


def _uniform(seed: int) -> str:
    """A uniform value in [0, 1) per row, from a keyed hash of the row number."""
    return f"(cityHash64(number, {seed}) % 4294967296) / 4294967296.0"


def _zipf_rank(n: int, s: float, seed: int) -> str:
    """A rank in [0, n) with P(rank = r) roughly proportional to (r + 1)^-s (the continuous inverse
    CDF of the density x^-s on [1, n + 1])."""
    a = 1.0 - s
    return (f"least({n - 1}, toUInt64(floor(pow(1 + {_uniform(seed)} * (pow({n + 1}, {a}) - 1), "
            f"{1.0 / a}))) - 1)")


def insert_sql(rows: int, units: int) -> str:
    """INSERT ... SELECT that generates ``rows`` hits of about ``units`` users (Zipf)."""
    u = _zipf_rank(units, USER_ZIPF, 1)
    url = _zipf_rank(URLS, URL_ZIPF, 2)
    phrase = _zipf_rank(PHRASES, URL_ZIPF, 3)
    counter = _zipf_rank(COUNTERS, 1.2, 4)
    ref = _zipf_rank(REFERER_DOMAINS, URL_ZIPF, 5)
    return f"""
INSERT INTO {TABLE}
SELECT
    toInt64(cityHash64(number, 99) % 9223372036854775807) AS WatchID,
    concat('Title ', if(url_r % 37 = 0, 'Google ', ''), toString(url_r)) AS Title,
    toDateTime('2013-07-01 00:00:00', 'UTC') + toUInt32({_uniform(6)} * 31 * 86400) AS EventTime,
    toDate(EventTime) AS EventDate,
    toInt32(if(counter_r < 3, [62, 1143, 34][counter_r + 1], counter_r)) AS CounterID,
    toInt32(cityHash64(user_r, 11) % 2147483647) AS ClientIP,
    toInt32(cityHash64(user_r, 12) % 1000) AS RegionID,
    toInt64(cityHash64(user_r, 13) % 9223372036854775807) AS UserID,
    concat('https://', if(url_r % 23 = 0, 'www.google.com', concat('site', toString(url_r % 3000), '.ru')),
           '/page/', toString(url_r)) AS URL,
    if({_uniform(7)} < 0.4, '', concat('https://', if(ref_r % 11 = 0, 'www.', ''), 'ref', toString(ref_r),
           '.com/', toString(cityHash64(number, 8) % 100))) AS Referer,
    toInt16({_uniform(9)} < 0.1) AS IsRefresh,
    toInt16([1024, 1280, 1366, 1440, 1600, 1920, 2560, 0][cityHash64(user_r, 14) % 8 + 1]) AS ResolutionWidth,
    toInt16(if(cityHash64(user_r, 15) % 10 < 3, cityHash64(user_r, 16) % 200, 0)) AS MobilePhone,
    if(MobilePhone = 0, '', concat('Model-', toString(cityHash64(user_r, 17) % 500))) AS MobilePhoneModel,
    toInt16(toInt32(cityHash64(number, 18) % 11) - 1) AS TraficSourceID,
    toInt16(if(SearchPhrase = '', 0, 1 + cityHash64(number, 19) % 20)) AS SearchEngineID,
    if({_uniform(10)} < 0.8, '', concat('phrase ', toString(phrase_r))) AS SearchPhrase,
    toInt16(if({_uniform(20)} < 0.95, 0, 1 + cityHash64(number, 21) % 30)) AS AdvEngineID,
    toInt16(cityHash64(user_r, 22) % 2000) AS WindowClientWidth,
    toInt16(cityHash64(user_r, 23) % 1200) AS WindowClientHeight,
    toInt16({_uniform(24)} < 0.05) AS DontCountHits,
    toInt16({_uniform(25)} < 0.1) AS IsLink,
    toInt16({_uniform(26)} < 0.02) AS IsDownload,
    toInt64(cityHash64(URL) % 9223372036854775807) AS URLHash,
    toInt64(cityHash64(Referer) % 9223372036854775807) AS RefererHash
FROM (SELECT number, {u} AS user_r, {url} AS url_r, {phrase} AS phrase_r, {counter} AS counter_r,
             {ref} AS ref_r FROM numbers({rows}))
"""


def build(db, rows: int, units: int) -> None:
    """Create and fill the table (one merged part), register it in the privacy catalog, give the
    analyst a large budget (the benchmark measures time, not budget)."""
    db.command(f"CREATE DATABASE IF NOT EXISTS {DB}")
    db.command(f"DROP TABLE IF EXISTS {TABLE}")
    db.command(f"CREATE TABLE {TABLE} ({COLUMNS}) ENGINE = MergeTree ORDER BY {SORTING_KEY}")
    db.command(insert_sql(rows, units))
    db.command(f"OPTIMIZE TABLE {TABLE} FINAL")
    register(db)


def register(db) -> None:
    db.catalog.register(TABLE, privacy_unit="UserID", bounds=BOUNDS,
                        max_groups_contributed=MAX_GROUPS, max_rows_per_unit=MAX_ROWS)
    db.ledger.set_budget(db.analyst, TABLE, epsilon=1e12, delta=0.5)
