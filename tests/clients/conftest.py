"""One real `dpch serve` for the client tests: the demo data set (20 000 rows, privacy unit
user_id), analyst alice with a budget, driven by each client library as a user would."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from test_gateway import PASSWORD, Server, _cli, demo_dir  # the real `dpch serve` process of tests/test_gateway.py

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
USER = "alice"


@pytest.fixture(scope="session")
def gateway(tmp_path_factory):
    d = demo_dir(tmp_path_factory, "clients", 20000)
    _cli("users", "add", USER, "--password-stdin", "--data-dir", str(d), stdin=PASSWORD + "\n")
    _cli("budget", "set", "--data-dir", str(d), "--analyst", USER, "--dataset", "demo.purchases",
         "--epsilon", "1000", "--delta", "1e-3")
    s = Server(d, start_timeout=90).start()
    yield s
    s.stop()


def charges(gateway) -> int:
    """Queries charged to alice on demo.purchases (the CLI reads the ledger)."""
    r = subprocess.run([PY, "-m", "dpch.cli", "budget", "show", "--data-dir", str(gateway.data_dir), "--analyst", USER,
                        "--dataset", "demo.purchases"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    m = re.search(r"(\d+) quer(?:y|ies) charged", r.stdout + r.stderr)
    assert m, r.stdout + r.stderr
    return int(m.group(1))


def assert_clickhouse_error(text: str, code: int) -> None:
    """``text`` carries a ClickHouse exception with ``code`` (``Code: N. DB::Exception: …``)."""
    assert re.search(rf"Code: {code}\b", text), text
    assert "DB::Exception" in text, text
