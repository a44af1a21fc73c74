"""Shared fixtures. chDB holds one store per process, so every test that needs the embedded
engine shares the session-scoped `db` connection (tables are namespaced per test module)."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def db(tmp_path_factory):
    import dpch

    conn = dpch.connect(tmp_path_factory.mktemp("dpch_engine"), analyst="tester")
    yield conn
    conn.close()
