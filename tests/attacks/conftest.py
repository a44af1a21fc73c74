"""Fixtures of the attack corpus: the neighbouring tables D / D′ (see harness.py)."""
from __future__ import annotations

import pytest

from . import harness


@pytest.fixture(scope="module")
def attack_setup(db):
    """Build database ``attacks`` (every neighbouring pair), register it, set large budgets.
    Returns what ``harness.build`` reports (e.g. whether huge bounds were refused)."""
    info = harness.build(db)
    harness.check_neighbours(db)
    return info


@pytest.fixture(scope="module")
def adb(db, attack_setup):
    """The session's connection (tests/conftest.py) once the attack tables exist."""
    return db
