"""Output formats, rendered by ClickHouse's own formatters: the released DataFrame (or a metadata
answer built by the gateway) is read back through ``SELECT * FROM Python(df) FORMAT <fmt>`` in chDB.
No encoder is written by hand, and the only input is a DataFrame of released values.

With an in-process embedded backend its own chDB session renders (under the backend's lock); the
gateway (engine worker or server backend) renders in a private in-memory chDB session of its own,
which holds no data, under a lock: the engine threads render one at a time (a rendering reads only
released values, so it is short next to the query that produced them).
"""
from __future__ import annotations

import re
import threading

import pandas as pd

from ..rewrite.base import ANSWER_ONLY_SETTINGS
from .errors import BAD_ARGUMENTS, UNKNOWN_FORMAT, GatewayError

# Output formats that only write the result (no files, schemas or templates read or written).
_FORMATS = [
    "TabSeparated", "TabSeparatedRaw", "TabSeparatedWithNames", "TabSeparatedWithNamesAndTypes",
    "TabSeparatedRawWithNames", "TabSeparatedRawWithNamesAndTypes",
    "TSV", "TSVRaw", "TSVWithNames", "TSVWithNamesAndTypes", "TSVRawWithNames", "TSVRawWithNamesAndTypes",
    "CSV", "CSVWithNames", "CSVWithNamesAndTypes",
    "JSON", "JSONStrings", "JSONCompact", "JSONCompactStrings", "JSONEachRow", "JSONStringsEachRow",
    "JSONCompactEachRow", "JSONCompactEachRowWithNames", "JSONCompactEachRowWithNamesAndTypes",
    "JSONCompactStringsEachRow", "JSONColumns", "JSONCompactColumns", "JSONObjectEachRow", "NDJSON", "JSONLines",
    "Native", "Arrow", "ArrowStream", "Parquet", "ORC", "RowBinary", "RowBinaryWithNames",
    "RowBinaryWithNamesAndTypes", "Values", "Vertical", "Pretty", "PrettyCompact", "PrettyCompactMonoBlock",
    "PrettySpace", "PrettyNoEscapes", "PrettyCompactNoEscapes", "PrettySpaceNoEscapes", "Markdown", "XML",
    "Null",
]
FORMATS = {f.lower(): f for f in _FORMATS}
DEFAULT_FORMAT = "TabSeparated"

# Output settings passed to the formatter (value validated; everything else is not sent).
OUTPUT_SETTINGS = {
    "output_format_json_quote_64bit_integers": r"^[01]$",
    "output_format_json_quote_64bit_floats": r"^[01]$",
    "output_format_json_quote_denormals": r"^[01]$",
    "output_format_json_quote_decimals": r"^[01]$",
    "output_format_json_named_tuples_as_objects": r"^[01]$",
    "output_format_json_escape_forward_slashes": r"^[01]$",
    "output_format_json_validate_utf8": r"^[01]$",
    "output_format_decimal_trailing_zeros": r"^[01]$",
    "output_format_csv_crlf_end_of_line": r"^[01]$",
    "output_format_tsv_crlf_end_of_line": r"^[01]$",
    "output_format_arrow_string_as_string": r"^[01]$",
    "output_format_arrow_low_cardinality_as_dictionary": r"^[01]$",
    "output_format_native_encode_types_in_binary_format": r"^[01]$",
    "output_format_pretty_max_rows": r"^[0-9]{1,9}$",
    "output_format_pretty_color": r"^([01]|auto)$",
    "format_csv_delimiter": r"^.$",
}
# Never from the client: statistics and row counts describe the engine's work on private rows
# (DESIGN.md invariant 11); every rendering forces them off (dpch.rewrite.base.ANSWER_ONLY_SETTINGS).
MIME = {"json": "application/json; charset=UTF-8", "jsoncompact": "application/json; charset=UTF-8",
        "jsonstrings": "application/json; charset=UTF-8", "jsoncompactstrings": "application/json; charset=UTF-8",
        "jsoneachrow": "application/x-ndjson; charset=UTF-8", "csv": "text/csv; charset=UTF-8",
        "csvwithnames": "text/csv; charset=UTF-8", "xml": "application/xml; charset=UTF-8"}


def resolve_format(name: str | None) -> str:
    if name is None or name == "":
        return DEFAULT_FORMAT
    canon = FORMATS.get(str(name).lower())
    if canon is None or not re.match(r"^[A-Za-z]+$", str(name)):
        raise GatewayError(UNKNOWN_FORMAT, f"Unknown or unsupported output format {str(name)[:64]!r}")
    return canon


def content_type(fmt: str) -> str:
    low = fmt.lower()
    if low in MIME:
        return MIME[low]
    if low.startswith(("tabseparated", "tsv", "pretty", "vertical", "markdown", "values")):
        return "text/tab-separated-values; charset=UTF-8" if low.startswith(("tab", "tsv")) else "text/plain; charset=UTF-8"
    if low.startswith("json"):
        return "application/json; charset=UTF-8"
    return "application/octet-stream"


def output_settings(params: dict[str, str]) -> dict[str, str]:
    out = {}
    for k, v in params.items():
        rx = OUTPUT_SETTINGS.get(k)
        if rx is None:
            continue
        if not re.match(rx, str(v)):
            raise GatewayError(BAD_ARGUMENTS, f"invalid value for setting {k}")
        out[k] = str(v)
    return out


def _sql_string(v: str) -> str:
    return "'" + v.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _prepare(df: pd.DataFrame) -> pd.DataFrame:
    """Column names as strings; object columns of str stay String; the index is dropped."""
    df = df.reset_index(drop=True)
    df.columns = [str(c) for c in df.columns]
    df.attrs = {}
    return df


class Renderer:
    """ClickHouse renders the released DataFrame: the embedded backend's own engine, or (for a
    server backend, whose results are already local) a private in-memory chDB session."""

    def __init__(self, backend):
        if getattr(backend, "kind", "") == "embedded":
            self._render = backend.render_data
        else:
            from chdb import session as chdb_session

            # engine threads render one at a time: one chDB session runs its queries one after another
            # anyway (measured), and chDB resolves ``Python(dpch_source)`` from the caller's frames
            session, lock = chdb_session.Session(), threading.Lock()

            def render(sql, data, fmt):
                dpch_source = data  # noqa: F841  (chDB resolves Python(name) from this frame)
                with lock:
                    return session.query(sql, fmt).bytes()
            self._render = render

    def render(self, df: pd.DataFrame, fmt: str, settings: dict[str, str] | None = None) -> bytes:
        sql = "SELECT * FROM Python(dpch_source) SETTINGS " + ", ".join(
            f"{k} = {_sql_string(v)}" for k, v in {**(settings or {}), **ANSWER_ONLY_SETTINGS}.items())
        try:
            return self._render(sql, _prepare(df), fmt)
        except Exception as exc:  # noqa: BLE001 - the formatter saw only released values
            names = re.findall(r"\(([A-Z][A-Z0-9_]+)\)", str(exc))
            raise GatewayError(BAD_ARGUMENTS, f"cannot render the result as {fmt} "
                               f"({names[-1] if names else type(exc).__name__})") from None
