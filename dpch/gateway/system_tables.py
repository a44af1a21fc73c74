"""The gateway's virtual system tables, built from the privacy catalog and the function rule set
(dpch.gateway.metadata answers queries on them). They carry the columns that BI clients read when
they reflect a database (clickhouse-connect's SQLAlchemy dialect, Superset, Grafana's plugin,
DBeaver/JDBC, Metabase, ibis), with values that say nothing about the data: every size, row count,
part count and modification time is NULL, and the engine is ``DPCH`` (no ``engine_full``, keys,
paths or storage policy). Only catalogued tables exist for analysts, with their registered columns
and bounds (never the salt).
"""
from __future__ import annotations

import pandas as pd

from ..dp_functions import DP_FUNCTIONS
from ..function_rules import DP_AGGREGATES, FUNCTION_RULES

ZERO_UUID = "00000000-0000-0000-0000-000000000000"
# columns that in ClickHouse describe the data (rows, bytes, parts, times): always NULL here
TABLE_SIZE_COLUMNS = ("total_rows", "total_bytes", "total_bytes_uncompressed", "parts", "active_parts",
                      "total_marks", "lifetime_rows", "lifetime_bytes")
COLUMN_SIZE_COLUMNS = ("data_compressed_bytes", "data_uncompressed_bytes", "marks_bytes")
COLUMN_NUMERIC_INFO = ("character_octet_length", "numeric_precision", "numeric_precision_radix", "numeric_scale",
                       "datetime_precision")


def _nulls(n: int, dtype: str = "UInt64") -> pd.Series:
    return pd.Series(pd.array([None] * n, dtype=dtype))


def _frame(rows: list[dict], columns: list[str], null_columns=(), null_dtype: str = "UInt64") -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=columns)
    for c in null_columns:
        df[c] = _nulls(len(df), null_dtype)
    return df


def column_comment(entry, col: str) -> str:
    parts = []
    if entry.privacy_unit == col:
        parts.append("privacy unit (cannot be grouped by or released)")
    b = entry.bounds.get(col)
    if b is not None:
        parts.append(f"bounds [{b[0]:g}, {b[1]:g}]")
    keys = entry.public_keys.get(col)
    if keys:
        parts.append(f"public keys ({len(keys)} values)")
    return "; ".join(parts)


def _table_comment(e) -> str:
    unit = e.privacy_unit or "(row level)"
    return (f"DP table: privacy unit {unit}, neighbour {e.neighbour}, k={e.max_groups_contributed}, "
            f"max rows per unit={e.max_rows_per_unit}")


TABLES_COLUMNS = ["database", "name", "uuid", "engine", "is_temporary", "data_paths", "metadata_path",
                  "create_table_query", "engine_full", "as_select", "partition_key", "sorting_key", "primary_key",
                  "sampling_key", "storage_policy", "comment", "has_own_data", "is_dpch"]


def tables_df(entries) -> pd.DataFrame:
    rows = []
    for e in entries:
        db, name = e.table.split(".", 1)
        rows.append({"database": db, "name": name, "uuid": ZERO_UUID, "engine": "DPCH", "is_temporary": 0,
                     "data_paths": "", "metadata_path": "", "create_table_query": "", "engine_full": "",
                     "as_select": "", "partition_key": "", "sorting_key": "", "primary_key": "", "sampling_key": "",
                     "storage_policy": "", "comment": _table_comment(e), "has_own_data": 0, "is_dpch": 1})
    return _frame(rows, TABLES_COLUMNS, TABLE_SIZE_COLUMNS)


def databases_df(entries) -> pd.DataFrame:
    names = sorted({e.table.split(".", 1)[0] for e in entries} | {"default"})
    n = len(names)
    return pd.DataFrame({"name": names, "engine": ["Atomic"] * n, "data_path": [""] * n, "metadata_path": [""] * n,
                         "uuid": [ZERO_UUID] * n, "engine_full": ["Atomic"] * n, "comment": [""] * n})


COLUMNS_COLUMNS = ["database", "table", "name", "type", "position", "default_kind", "default_expression", "comment",
                   "is_in_partition_key", "is_in_sorting_key", "is_in_primary_key", "is_in_sampling_key",
                   "compression_codec", "dpch_lower_bound", "dpch_upper_bound", "dpch_privacy_unit"]


def columns_df(entries) -> pd.DataFrame:
    rows = []
    for e in entries:
        db, name = e.table.split(".", 1)
        for pos, (col, typ) in enumerate(e.columns.items(), start=1):
            b = e.bounds.get(col)
            rows.append({"database": db, "table": name, "name": col, "type": typ, "position": pos,
                         "default_kind": "", "default_expression": "", "comment": column_comment(e, col),
                         "is_in_partition_key": 0, "is_in_sorting_key": 0, "is_in_primary_key": 0,
                         "is_in_sampling_key": 0, "compression_codec": "",
                         "dpch_lower_bound": None if b is None else float(b[0]),
                         "dpch_upper_bound": None if b is None else float(b[1]),
                         "dpch_privacy_unit": int(e.privacy_unit == col)})
    df = _frame(rows, COLUMNS_COLUMNS, COLUMN_SIZE_COLUMNS + COLUMN_NUMERIC_INFO)
    for c in ("dpch_lower_bound", "dpch_upper_bound"):
        df[c] = df[c].astype("Float64")
    return df


def functions_df() -> pd.DataFrame:
    """The functions an analyst may call: the rule set's accepted scalar functions, the DP
    aggregates (noised by DPCH) and the dp_* SQL functions. Refused functions are not listed."""
    rows = [(n, 0, "scalar function (dpch rule: " + r.kind + ")") for n, r in sorted(FUNCTION_RULES.items())
            if r.kind != "reject"]
    rows += [(n, 1, "aggregate, answered with DP noise (SETTINGS dpch_epsilon)") for n in sorted(DP_AGGREGATES)]
    rows += [(n, 1, "DP aggregate function with its own ε") for n in sorted(DP_FUNCTIONS)]
    n = len(rows)
    return pd.DataFrame({"name": [r[0] for r in rows], "is_aggregate": [r[1] for r in rows],
                         "case_insensitive": [0] * n, "alias_to": [""] * n, "create_query": [""] * n,
                         "origin": ["System"] * n, "description": [r[2] for r in rows], "syntax": [""] * n,
                         "arguments": [""] * n, "returned_value": [""] * n, "examples": [""] * n,
                         "categories": [""] * n})


def information_schema(name: str, entries) -> pd.DataFrame:
    """``information_schema.schemata|tables|columns`` in ClickHouse's column names (lower case)."""
    if name == "schemata":
        dbs = databases_df(entries)["name"]
        return pd.DataFrame({"catalog_name": dbs, "schema_name": dbs, "schema_owner": "default",
                             "default_character_set_catalog": None, "default_character_set_schema": None,
                             "default_character_set_name": None, "sql_path": None})
    if name == "tables":
        t = tables_df(entries)
        return pd.DataFrame({"table_catalog": t["database"], "table_schema": t["database"], "table_name": t["name"],
                             "table_type": "BASE TABLE", "table_rows": _nulls(len(t)), "data_length": _nulls(len(t)),
                             "table_collation": None, "table_comment": t["comment"]})
    c = columns_df(entries)
    return pd.DataFrame({"table_catalog": c["database"], "table_schema": c["database"], "table_name": c["table"],
                         "column_name": c["name"], "ordinal_position": c["position"], "column_default": "",
                         "is_nullable": c["type"].str.startswith("Nullable(").map({True: "YES", False: "NO"}),
                         "data_type": c["type"], "character_maximum_length": _nulls(len(c)),
                         "character_octet_length": _nulls(len(c)), "numeric_precision": _nulls(len(c)),
                         "numeric_precision_radix": _nulls(len(c)), "numeric_scale": _nulls(len(c)),
                         "datetime_precision": _nulls(len(c)), "column_comment": c["comment"],
                         "column_type": c["type"]})
