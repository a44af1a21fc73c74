"""The shared vocabulary of the mechanisms: a privacy guarantee (``PrivacyLoss``) and the
parameter checks and float rendering every mechanism uses."""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from dpch.errors import InvalidParameter


@dataclass(frozen=True)
class PrivacyLoss:
    """A privacy guarantee: pure/approximate DP ``(epsilon, delta)`` and/or zCDP ``rho``.
    A field is None when the statement does not give it."""

    epsilon: float | None = None
    delta: float | None = None
    rho: float | None = None


def _up(x: Fraction) -> float:
    """The least float >= x (the rounding direction that never understates a privacy loss)."""
    f = float(x)
    if Fraction(f) < x:
        f = math.nextafter(f, math.inf)
    return f


def _check_integer_flag(integer: object) -> bool:
    if not isinstance(integer, bool):
        raise InvalidParameter("integer must be a bool")
    return integer


def _check_value_sql(value_sql: object) -> str:
    if not isinstance(value_sql, str) or not value_sql.strip():
        raise InvalidParameter("value_sql must be a non-empty SQL expression")
    return value_sql


def _float_literal(x: float) -> str:
    """repr() of a finite float: the shortest decimal that parses back to exactly x (ClickHouse
    parses Float64 literals with correct rounding)."""
    return repr(float(x))
