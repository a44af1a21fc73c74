"""Harness of the attack corpus: the neighbouring tables D and D′ and a comparable query outcome.

D′ is D without every row of privacy unit ``user_id = 42`` (the add_remove neighbour). D′ is
built from D by ``INSERT … SELECT … WHERE NOT (user_id = 42)``, so every other row is identical,
byte for byte, and in the same order.

User 42 has six rows with values that no other unit has and that partial functions choke on:
a name that parses as no number, date or regular expression and is longer than any other, a unit
string that is no date unit, a huge amount/qty/big (outside the declared bounds), a far-future day,
a NULL ``nregion``. ``SECRETS`` lists their distinctive substrings: no error message may contain
one of them (DESIGN.md invariant 5).

Everything here uses the public API only: ``db.command``/``db.raw_query`` to build tables (the
trusted owner's path), ``db.catalog.register``, ``db.ledger.set_budget``/``remaining`` and
``db.query``.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from dpch.errors import InvalidParameter, QueryRejected

DB = "attacks"
UNIT = 42

# Distinctive values of unit 42 (lower case; checked case-insensitively in every message).
SECRET_NAME = "abc[Zorblax"
SECRET_UNIT_S = "Zorblax"
SECRETS = ("zorblax", "abc[", "987654321", "7777777", "12345678901234", "9999.1234", "2099-12-31",
           "42424242-4242")

PUBLIC_REGIONS = ["EU", "US", "ASIA", "AFRICA"]
BOUNDS = {"amount": (0.0, 1000.0), "qty": (-100.0, 100.0), "big": (0.0, 100000.0), "price": (0.0, 100.0)}

SCHEMA = """(
    user_id UInt64,
    name String,
    unit_s String,
    region LowCardinality(String),
    nregion Nullable(String),
    amount Float64,
    qty Int64,
    big UInt64,
    price Decimal(18, 4),
    day Date,
    ts DateTime,
    uid UUID,
    kind Enum8('a' = 1, 'b' = 2),
    flag Bool
) ENGINE = MergeTree ORDER BY user_id"""

# 200 units of 10 rows each (user_id = 1 + number // 10), unit 42 replaced below. Every value is a
# deterministic function of `number`; names are 4-digit strings (they parse as integers and are
# exactly 4 characters long), unit_s is the valid date unit 'day'.
_OTHERS = f"""
SELECT
    1 + intDiv(number, 10) AS user_id,
    toString(1000 + number) AS name,
    'day' AS unit_s,
    ['EU', 'US', 'ASIA'][1 + number % 3] AS region,
    if(number % 17 = 0, NULL, ['EU', 'US', 'ASIA'][1 + number % 3]) AS nregion,
    toFloat64((number * 37) % 1000) AS amount,
    toInt64(number % 201) - 100 AS qty,
    toUInt64((number * 13) % 100000) AS big,
    toDecimal64(number % 100, 4) + toDecimal64('0.25', 4) AS price,
    toDate('2024-01-01') + toIntervalDay(number % 365) AS day,
    toDateTime('2024-01-01 00:00:00', 'UTC') + toIntervalHour(number) AS ts,
    toUUID(concat('00000000-0000-4000-8000-', leftPad(toString(number % 50), 12, '0'))) AS uid,
    if(number % 2 = 0, 'a', 'b') AS kind,
    number % 2 = 0 AS flag
FROM numbers(2000)
WHERE user_id != {UNIT}
"""

_UNIT42 = f"""
SELECT
    toUInt64({UNIT}) AS user_id,
    '{SECRET_NAME}' AS name,
    '{SECRET_UNIT_S}' AS unit_s,
    ['EU', 'US', 'ASIA'][1 + number % 3] AS region,
    CAST(NULL, 'Nullable(String)') AS nregion,
    987654321.25 AS amount,
    toInt64(7777777) AS qty,
    toUInt64(12345678901234) AS big,
    toDecimal64('9999.1234', 4) AS price,
    toDate('2099-12-31') AS day,
    toDateTime('2099-12-31 23:59:59', 'UTC') AS ts,
    toUUID('42424242-4242-4242-4242-424242424242') AS uid,
    'b' AS kind,
    true AS flag
FROM numbers(6)
"""

# Nullable privacy unit: about 1 row in 40 of the other units has a NULL unit (kept in D′). `grp`
# equals `region` but has no public keys (private partition selection).
NU_SCHEMA = """(
    user_id Nullable(UInt64),
    region String,
    grp String,
    amount Float64
) ENGINE = MergeTree ORDER BY tuple()"""


@dataclass(frozen=True)
class Pair:
    """A neighbouring pair: ``full`` (D) and ``minus`` (D′ = D without unit 42), both under DB."""

    full: str
    minus: str

    @property
    def tables(self) -> tuple[str, str]:
        return (f"{DB}.{self.full}", f"{DB}.{self.minus}")


PAIRS = {
    "k1": Pair("d", "d_minus"),  # max_groups_contributed = 1, max_rows_per_unit = 5
    "k3": Pair("d_k3", "d_k3_minus"),  # max_groups_contributed = 3, max_rows_per_unit = 10
    "nu1": Pair("nu", "nu_minus"),  # Nullable privacy unit, k = 1
    "nu3": Pair("nu_k3", "nu_k3_minus"),  # Nullable privacy unit, k = 3
}

# Very large bounds. Registration may refuse them with a clear message (a valid fix); if it accepts
# them, queries must be answered or rejected before charging (see test_attacks.py).
HUGE_PAIRS = {
    "hb": (Pair("d_hb", "d_hb_minus"), {"amount": (-1e300, 1e300), "qty": (-1e300, 1e300)}),
    "hb2": (Pair("d_hb2", "d_hb2_minus"), {"amount": (-1e250, 1e250), "qty": (-9.2e18, 9.2e18),
                                           "big": (0.0, 1.8e19)}),
}


def pair_tables(key: str) -> tuple[str, str]:
    """(D, D′) qualified names of a PAIRS or HUGE_PAIRS key."""
    pair = HUGE_PAIRS[key][0] if key in HUGE_PAIRS else PAIRS[key]
    return pair.tables


def _register(db, table: str, *, k: int, m: int, bounds=None, public_keys=None) -> None:
    db.catalog.register(table, privacy_unit="user_id",
                        bounds=dict(BOUNDS if bounds is None else bounds),
                        max_groups_contributed=k, max_rows_per_unit=m,
                        public_keys=public_keys if public_keys is not None else {"region": PUBLIC_REGIONS})
    db.ledger.set_budget(db.analyst, table, epsilon=1e6, delta=0.5)


def build(db) -> dict:
    """Create database ``attacks`` with every pair, register them and give them a large budget.
    Returns ``{"refused": {huge pair key: message}}`` for the HUGE_PAIRS whose registration was
    refused (an acceptable fix)."""
    db.command(f"CREATE DATABASE IF NOT EXISTS {DB}")
    for pair in [PAIRS["k1"], PAIRS["k3"]] + [p for p, _ in HUGE_PAIRS.values()]:
        for t in (pair.full, pair.minus):
            db.command(f"DROP TABLE IF EXISTS {DB}.{t}")
            db.command(f"CREATE TABLE {DB}.{t} {SCHEMA}")
        db.command(f"INSERT INTO {DB}.{pair.full} {_OTHERS} UNION ALL {_UNIT42}")
        db.command(f"INSERT INTO {DB}.{pair.minus} SELECT * FROM {DB}.{pair.full} WHERE NOT (user_id = {UNIT})")
    for key in ("nu1", "nu3"):
        pair = PAIRS[key]
        for t in (pair.full, pair.minus):
            db.command(f"DROP TABLE IF EXISTS {DB}.{t}")
            db.command(f"CREATE TABLE {DB}.{t} {NU_SCHEMA}")
        db.command(f"INSERT INTO {DB}.{pair.full} SELECT if(cityHash64(name) % 40 = 7 AND user_id != {UNIT}, NULL, user_id), "
                   f"region, region, least(amount, 1000.) FROM {DB}.d")
        db.command(f"INSERT INTO {DB}.{pair.minus} SELECT * FROM {DB}.{pair.full} "
                   f"WHERE user_id IS NULL OR NOT (user_id = {UNIT})")

    dup_keys = {"region": PUBLIC_REGIONS, "qty": [1, 1.0, 2]}  # 1 and 1.0 are one Int64 value
    for t in PAIRS["k1"].tables:
        _register(db, t, k=1, m=5, public_keys=dup_keys)
    for t in PAIRS["k3"].tables:
        _register(db, t, k=3, m=10, public_keys=dup_keys)
    for t in PAIRS["nu1"].tables:
        _register(db, t, k=1, m=5, bounds={"amount": (0.0, 1000.0)})
    for t in PAIRS["nu3"].tables:
        _register(db, t, k=3, m=10, bounds={"amount": (0.0, 1000.0)})
    refused = {}
    for key, (pair, bounds) in HUGE_PAIRS.items():
        for t in pair.tables:
            try:
                _register(db, t, k=1, m=5, bounds=bounds)
            except Exception as exc:  # noqa: BLE001 - refusing huge bounds at registration is a valid fix
                refused[key] = f"{type(exc).__name__}: {exc}"
    return {"refused": refused}


def check_neighbours(db) -> None:
    """Sanity of the construction: D′ is D minus exactly unit 42's rows."""
    for key, pair in PAIRS.items():
        full, minus = pair.tables
        n_full = int(db.raw_query(f"SELECT count() AS n FROM {full}")["n"].iloc[0])
        n_minus = int(db.raw_query(f"SELECT count() AS n FROM {minus}")["n"].iloc[0])
        n42 = int(db.raw_query(f"SELECT count() AS n FROM {full} WHERE user_id = {UNIT}")["n"].iloc[0])
        assert n42 == 6 and n_full - n_minus == n42, (key, n_full, n_minus, n42)
        assert int(db.raw_query(f"SELECT count() AS n FROM {minus} WHERE user_id = {UNIT}")["n"].iloc[0]) == 0


# ------------------------------------------------------------------------------------------------
# Outcomes
# ------------------------------------------------------------------------------------------------

_TABLE_RE = re.compile(r"`?" + DB + r"`?\s*\.\s*`?[A-Za-z0-9_]+`?")


def normalise(message: str) -> str:
    """The message with the (neighbour-specific) table name replaced by a placeholder."""
    return _TABLE_RE.sub("<table>", message)


def leaked_secrets(message: str) -> list[str]:
    low = message.lower()
    return [s for s in SECRETS if s in low]


def _keyval(v: Any) -> str:
    """A released key value as comparable text (every kind of missing value is "NULL")."""
    try:
        if pd.isna(v):
            return "NULL"
    except (TypeError, ValueError):  # array-like values
        pass
    return str(v)


@dataclass
class Outcome:
    status: str  # "ok" | "rejected" | "error"
    charged: bool  # the ledger's charge count for the dataset changed
    message: str = ""  # normalised (rejected / error)
    raw_message: str = ""  # as raised (for the leak check)
    error_class: str = ""
    columns: tuple = ()
    nrows: int | None = None
    keys: tuple | None = None  # sorted released key tuples, when keys are public or absent
    key_mode: str | None = None
    elapsed: float = 0.0
    df: Any = field(default=None, repr=False)

    def comparable(self, exact: bool) -> tuple:
        """What must be identical on D and D′. ``exact=False`` (private partition selection, whose
        released keys and row count are random) compares success/failure and columns only."""
        if self.status == "rejected":
            return ("rejected", self.message)
        if self.status == "error":
            return ("error", self.error_class, self.message)
        if exact:
            return ("ok", self.columns, self.nrows, self.keys)
        return ("ok", self.columns)

    def short(self) -> str:
        if self.status == "ok":
            return (f"ok(charged={self.charged}, key_mode={self.key_mode}, columns={list(self.columns)}, "
                    f"rows={self.nrows}, keys={self.keys if self.keys is None else list(self.keys)[:12]})")
        return f"{self.status}(charged={self.charged}, {self.error_class + ': ' if self.error_class else ''}{self.message})"


def charge_count(db, dataset: str) -> int:
    return db.ledger.remaining(db.analyst, dataset).queries


def run(db, sql: str, dataset: str, *, epsilon: Any = 1.0, delta: Any = 0.0, **options) -> Outcome:
    """Run ``sql`` (with ``{t}`` standing for ``dataset``) through ``db.query`` and classify it."""
    before = charge_count(db, dataset)
    text = sql.format(t=dataset)
    t0 = time.perf_counter()
    try:
        df = db.query(text, epsilon=epsilon, delta=delta, **options)
    except (QueryRejected, InvalidParameter) as exc:
        elapsed = time.perf_counter() - t0
        charged = charge_count(db, dataset) != before
        raw = str(exc)
        if not charged:
            return Outcome("rejected", False, normalise(raw), raw, type(exc).__name__, elapsed=elapsed)
        return Outcome("error", True, normalise(raw), raw, type(exc).__name__, elapsed=elapsed)
    except Exception as exc:  # noqa: BLE001 - every other failure is an outcome to compare
        elapsed = time.perf_counter() - t0
        charged = charge_count(db, dataset) != before
        raw = str(exc)
        return Outcome("error", charged, normalise(raw), raw, type(exc).__name__, elapsed=elapsed)
    elapsed = time.perf_counter() - t0
    charged = charge_count(db, dataset) != before
    meta = df.attrs.get("dpch", {}) if hasattr(df, "attrs") else {}
    key_mode = meta.get("key_mode")
    col_meta = meta.get("columns", {}) or {}
    key_cols = [c for c in df.columns if (col_meta.get(c) or {}).get("kind") == "key"]
    keys = None
    # a top-n query releases a random choice of groups, by peeling or by sorting noisy values (its
    # row count is fixed): keys not compared
    peeling = meta.get("top_k") is not None
    if key_mode in ("public", "none", None) and not peeling:
        keys = tuple(sorted(tuple(_keyval(v) for v in row) for row in df[key_cols].itertuples(index=False))) \
            if key_cols else ()
    return Outcome("ok", charged, columns=tuple(str(c) for c in df.columns), nrows=len(df), keys=keys,
                   key_mode=key_mode, elapsed=elapsed, df=df)
