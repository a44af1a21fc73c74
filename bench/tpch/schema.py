"""TPC-H schema, loading and privacy catalog for bench/bench_tpch.py (issue 14).

Every bound below comes from the TPC-H specification (v3.0.1, clause 4.2.3, "Test Database Data
Generation"), never from the generated data. Quotations in the comments are that clause.
"""
from __future__ import annotations

from pathlib import Path

from .spec_model import ORDERS_PER_CUSTOMER, quantile

DB = "tpch"

# The spec's DECIMAL columns (loaded as Decimal(15, 2), or as Float64 with --types float).
DECIMAL_COLUMNS = {"c_acctbal", "o_totalprice", "l_quantity", "l_extendedprice", "l_discount", "l_tax",
                   "p_retailprice", "s_acctbal", "ps_supplycost"}

# Column types of the spec (clause 1.4): identifiers Int32 (enough up to SF 300 here), dates Date,
# fixed and variable text String, DECIMAL -> {decimal}. Sorting keys are the primary keys.
TABLES = {
    "region": ("r_regionkey Int32, r_name String, r_comment String", "r_regionkey"),
    "nation": ("n_nationkey Int32, n_name String, n_regionkey Int32, n_comment String", "n_nationkey"),
    "part": (("p_partkey Int32, p_name String, p_mfgr String, p_brand String, p_type String, p_size Int32, "
             "p_container String, p_retailprice {decimal}, p_comment String"), "p_partkey"),
    "supplier": (("s_suppkey Int32, s_name String, s_address String, s_nationkey Int32, s_phone String, "
                 "s_acctbal {decimal}, s_comment String"), "s_suppkey"),
    "partsupp": (("ps_partkey Int32, ps_suppkey Int32, ps_availqty Int32, ps_supplycost {decimal}, "
                 "ps_comment String"), "(ps_partkey, ps_suppkey)"),
    "customer": (("c_custkey Int32, c_name String, c_address String, c_nationkey Int32, c_phone String, "
                 "c_acctbal {decimal}, c_mktsegment String, c_comment String"), "c_custkey"),
    "orders": (("o_orderkey Int32, o_custkey Int32, o_orderstatus String, o_totalprice {decimal}, "
               "o_orderdate Date, o_orderpriority String, o_clerk String, o_shippriority Int32, "
               "o_comment String"), "o_orderkey"),
    "lineitem": (("l_orderkey Int32, l_partkey Int32, l_suppkey Int32, l_linenumber Int32, l_quantity {decimal}, "
                 "l_extendedprice {decimal}, l_discount {decimal}, l_tax {decimal}, l_returnflag String, "
                 "l_linestatus String, l_shipdate Date, l_commitdate Date, l_receiptdate Date, "
                 "l_shipinstruct String, l_shipmode String, l_comment String"), "(l_orderkey, l_linenumber)"),
}

PUBLIC_TABLES = ("region", "nation", "part", "supplier", "partsupp")

# --- value bounds (clause 4.2.3) ----------------------------------------------------------------
# P_RETAILPRICE = (90000 + ((P_PARTKEY/10) modulo 20001) + 100 * (P_PARTKEY modulo 1000)) / 100,
# so 900.00 <= p_retailprice <= (90000 + 20000 + 99900) / 100 = 2099.00.
RETAILPRICE = (900.0, 2099.0)
# L_QUANTITY random [1 .. 50]; L_EXTENDEDPRICE = L_QUANTITY * P_RETAILPRICE.
QUANTITY = (1.0, 50.0)
EXTENDEDPRICE = (QUANTITY[0] * RETAILPRICE[0], QUANTITY[1] * RETAILPRICE[1])  # [900, 104950]
DISCOUNT = (0.0, 0.10)  # L_DISCOUNT random [0.00 .. 0.10]
TAX = (0.0, 0.08)  # L_TAX random [0.00 .. 0.08]
# O_TOTALPRICE = sum(L_EXTENDEDPRICE * (1 + L_TAX) * (1 - L_DISCOUNT)) over the order's 1..7 lineitems
LINES_PER_ORDER = (1, 7)  # "for each row in the ORDERS table, a random number of rows within [1 .. 7]"
TOTALPRICE = (LINES_PER_ORDER[0] * EXTENDEDPRICE[0] * (1 + TAX[0]) * (1 - DISCOUNT[1]),   # 810
              LINES_PER_ORDER[1] * EXTENDEDPRICE[1] * (1 + TAX[1]) * (1 - DISCOUNT[0]))   # 793,422
ACCTBAL = (-999.99, 9999.99)  # C_ACCTBAL and S_ACCTBAL random [-999.99 .. 9,999.99]
SUPPLYCOST = (1.0, 1000.0)  # PS_SUPPLYCOST random [1.00 .. 1,000.00]

# --- public domains of low-cardinality protected columns (clause 4.2.2.13 / 4.2.3) ----------------
PUBLIC_KEYS = {
    "customer": {
        "c_mktsegment": ["AUTOMOBILE", "BUILDING", "FURNITURE", "MACHINERY", "HOUSEHOLD"],  # Segments
        "c_nationkey": list(range(25)),  # random [0 .. 24]
    },
    "orders": {
        "o_orderpriority": ["1-URGENT", "2-HIGH", "3-MEDIUM", "4-NOT SPECIFIED", "5-LOW"],  # Priorities
        "o_orderstatus": ["F", "O", "P"],  # F if all lineitems are F, O if all are O, else P
        "o_shippriority": [0],  # O_SHIPPRIORITY set to 0
    },
    "lineitem": {
        "l_returnflag": ["A", "N", "R"],  # R or A if L_RECEIPTDATE <= CURRENTDATE, else N
        "l_linestatus": ["F", "O"],  # O if L_SHIPDATE > CURRENTDATE, else F
        "l_shipmode": ["REG AIR", "AIR", "RAIL", "SHIP", "TRUCK", "MAIL", "FOB"],  # Modes
        "l_shipinstruct": ["DELIVER IN PERSON", "COLLECT COD", "NONE", "TAKE BACK RETURN"],  # Instructions
    },
}

# --- contribution bounds (k = max_groups_contributed, M = max_rows_per_unit, C = max_rows_per_group)
# The unit is the customer. A joined query is bounded with k, M, C = the maxima over the protected
# tables it reads (docs/CONTROLLER.md, "Joins"), so lineitem's values govern every query that reads it.
# M is the (1 - 1e-5)-quantile of a customer's rows by the spec's data model (bench/tpch/spec_model.py).
#
# customer: one row per customer (C_CUSTKEY is its key): k = M = 1.
# orders: an ordering customer has Poisson(15) orders: M = quantile(15 orders) = 34.
#   k = 5: the largest GROUP BY domain over orders in the workload is o_orderpriority (Q4, 5
#   priorities), and a customer's orders can have every priority.
# lineitem: 1..7 lineitems per order (uniform) of Poisson(15) orders: M = 149 (mean 60).
#   k = 7: the largest GROUP BY domain over lineitem in the workload is l_shipmode (Q12, 7 modes).
# C (rows per group) is left unset (= M) everywhere: one group may hold all of a customer's rows
#   (e.g. Q5/Q10 group by the customer's nation, so all its rows fall in one group).
CONTRIBUTION = {
    "customer": {"max_groups_contributed": 1, "max_rows_per_unit": 1},
    "orders": {"max_groups_contributed": 5, "max_rows_per_unit": quantile(ORDERS_PER_CUSTOMER, p=None)},
    "lineitem": {"max_groups_contributed": 7, "max_rows_per_unit": quantile(ORDERS_PER_CUSTOMER)},
}

BOUNDS = {
    "customer": {"c_acctbal": ACCTBAL, "c_nationkey": (0, 24)},
    "orders": {"o_totalprice": TOTALPRICE, "o_shippriority": (0, 0)},
    "lineitem": {"l_quantity": QUANTITY, "l_extendedprice": EXTENDEDPRICE, "l_discount": DISCOUNT, "l_tax": TAX,
                 "l_linenumber": (1, 7)},
}

REFERENCES = {
    "orders": {"o_custkey": f"{DB}.customer.c_custkey"},
    "lineitem": {"l_orderkey": f"{DB}.orders.o_orderkey"},
}


def create_and_load(db, parquet_dir: Path, types: str) -> dict[str, int]:
    """(Re)create database ``tpch`` and load every table from ``parquet_dir/<table>.parquet``.
    ``types``: ``decimal`` (the spec's DECIMAL as Decimal(15, 2)) or ``float`` (Float64).
    Returns the row count of each table."""
    decimal = {"decimal": "Decimal(15, 2)", "float": "Float64"}[types]
    db.command(f"DROP DATABASE IF EXISTS {DB}")
    db.command(f"CREATE DATABASE {DB}")
    counts = {}
    for name, (cols, order_by) in TABLES.items():
        db.command(f"CREATE TABLE {DB}.{name} ({cols.format(decimal=decimal)}) ENGINE = MergeTree ORDER BY {order_by}")
        path = (parquet_dir / f"{name}.parquet").resolve()
        # a trusted load (charges nothing): the parquet columns are cast to the declared types
        db.command(f"INSERT INTO {DB}.{name} SELECT * FROM file('{path}', 'Parquet')")
        db.command(f"OPTIMIZE TABLE {DB}.{name} FINAL")
        counts[name] = int(db.raw_query(f"SELECT count() AS n FROM {DB}.{name}")["n"][0])
    return counts


def register(db, contribution: dict | None = None) -> None:
    """The privacy catalog: customer is the unit, orders and lineitem reach it through references,
    the rest is public. ``contribution`` ({max_rows_per_unit: ..., ...}) replaces the contribution
    bounds of orders and lineitem (to emulate one query's bounds while db.query does not take them)."""
    cat = db.catalog
    if contribution is None:
        for name in PUBLIC_TABLES:
            cat.register(f"{DB}.{name}", public=True)
        cat.register(f"{DB}.customer", privacy_unit="c_custkey", bounds=BOUNDS["customer"],
                     public_keys=PUBLIC_KEYS["customer"], **CONTRIBUTION["customer"])
    for name in ("orders", "lineitem"):  # orders first: lineitem's reference points to it
        cat.register(f"{DB}.{name}", references=REFERENCES[name], bounds=BOUNDS[name],
                     public_keys=PUBLIC_KEYS[name], **{**CONTRIBUTION[name], **(contribution or {})})
