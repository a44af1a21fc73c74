"""Where the deployable ClickHouse configuration lives, and how the embedded engine loads it.

`clickhouse_config/` is the single source for servers and for the embedded engine:
- `udf/*.xml`: the executable UDFs (`dpch_laplace`, ...), run by the `dpch-udf` launcher;
- `user_defined/function_*.sql`: the SQL functions (`dp_count`, `dp_sum`, ...).
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent
DEFAULT_DATA_DIR_ENV = "DPCH_DATA_DIR"
UDF_LAUNCHER = "dpch-udf"


def config_dir() -> Path:
    """The clickhouse_config directory: the repository copy in a source checkout, else the copy
    shipped inside the wheel (setup.py copies it to dpch/_clickhouse_config)."""
    override = os.environ.get("DPCH_CLICKHOUSE_CONFIG")
    candidates = [Path(override)] if override else []
    candidates += [_PACKAGE_DIR.parent / "clickhouse_config", _PACKAGE_DIR / "_clickhouse_config"]
    for candidate in candidates:
        if (candidate / "udf").is_dir() and (candidate / "user_defined").is_dir():
            return candidate
    raise FileNotFoundError("clickhouse_config not found; reinstall dpch or set DPCH_CLICKHOUSE_CONFIG")


def default_data_dir() -> Path:
    """The embedded engine's data directory: $DPCH_DATA_DIR, else ./.dpch_data."""
    return Path(os.environ.get(DEFAULT_DATA_DIR_ENV, ".dpch_data")).resolve()


def sql_function_definitions() -> list[tuple[str, str]]:
    """(name, CREATE FUNCTION statement) for every SQL function, helpers first so that the public
    functions that call them are created after them."""
    files = sorted((config_dir() / "user_defined").glob("function_*.sql"))
    defs = [(f.stem.removeprefix("function_"), f.read_text().strip().rstrip(";")) for f in files]
    return sorted(defs, key=lambda d: (not d[0].startswith("dpch_"), d[0]))


def prepare_embedded_udf_dir(data_dir: Path) -> Path:
    """Copy the UDF XML next to a launcher that runs this very interpreter, so the embedded
    engine's child processes import the same dpch installation as the caller."""
    udf_dir = data_dir / "udf"
    udf_dir.mkdir(parents=True, exist_ok=True)
    for xml in (config_dir() / "udf").glob("*.xml"):
        shutil.copyfile(xml, udf_dir / xml.name)
    launcher = udf_dir / UDF_LAUNCHER
    launcher.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m dpch.udf_entry "$@"\n')
    launcher.chmod(0o755)
    return udf_dir
