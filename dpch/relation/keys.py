"""Join and semi-join keys whose comparison is total: the two key types must be comparable by
ClickHouse without a conversion that can throw for one row's value.

ClickHouse compares ``a.x = b.y`` (ON, IN) after casting both to a common supertype. That cast is
lossless for integers, strings and equal-scale Decimals, but it throws for some values when the
scales differ (Decimal(18, 0) vs Decimal(18, 2): 10^17 · 100 overflows, DECIMAL_OVERFLOW even with
``decimal_check_overflow = 0``; DateTime64(3) vs DateTime64(9): a year after 2262 overflows), and
a float against a 64-bit integer has no supertype at all (NO_COMMON_TYPE, found only when the join
runs). An error that depends on one unit's value, after the charge, is a side channel (DESIGN.md
invariant 7), so such keys are refused before anything runs or is charged: the rule below reads
only the catalogued types, never a row.
"""
from __future__ import annotations

import re

from ..catalog_model import base_type  # Nullable/LowCardinality do not change how keys compare
from .syntax import _reject

_INTS = re.compile(r"^U?Int(8|16|32|64|128|256)$")
_STRINGS = re.compile(r"^(String|FixedString\(\d+\))$")
_FLOATS = ("Float32", "Float64")
_DECIMAL = re.compile(r"^Decimal(?:32|64|128|256)?\(\s*(?:\d+\s*,\s*)?(\d+)\s*\)$")
_DT64 = re.compile(r"^DateTime64\(\s*(\d+)\s*(?:,.*)?\)$")
_DATETIME = re.compile(r"^DateTime(?:\(.*\))?$")


def comparable(a: str, b: str) -> bool:
    """True when ClickHouse compares keys of types ``a`` and ``b`` without a cast that can throw:
    the same type; integers (any widths); strings; Float32/Float64; Decimals of one scale (the
    common type only widens the precision); DateTime64 of one precision; DateTime with any zone."""
    a, b = base_type(a), base_type(b)
    if a == b:
        return True
    if _INTS.match(a) and _INTS.match(b):
        return True
    if _STRINGS.match(a) and _STRINGS.match(b):
        return True
    if a in _FLOATS and b in _FLOATS:
        return True
    da, db = _DECIMAL.match(a), _DECIMAL.match(b)
    if da and db:
        return da.group(1) == db.group(1)
    ta, tb = _DT64.match(a), _DT64.match(b)
    if ta and tb:
        return ta.group(1) == tb.group(1)
    return bool(_DATETIME.match(a) and _DATETIME.match(b))


def check_key_types(what: str, left: tuple[str, str | None], right: tuple[str, str | None]) -> None:
    """Refuse (QueryRejected, before the charge) a key pair whose comparison could throw.
    ``left``/``right`` are (name as the analyst wrote it, ClickHouse type or None if unknown: an
    unknown type is refused too, the rule fails closed). The message names types, never values."""
    (ln, lt), (rn, rt) = left, right
    if lt is None or rt is None or not comparable(lt, rt):
        raise _reject(f"{what}: the keys {ln} ({lt or 'unknown type'}) and {rn} ({rt or 'unknown type'}) cannot be "
                      "compared without a conversion that may fail for some values (different Decimal scales or "
                      "DateTime64 precisions, a float against an integer, or unrelated types); join only keys of "
                      "comparable types")
