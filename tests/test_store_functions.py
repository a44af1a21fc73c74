"""The dp_* SQL functions of an embedded store are created once, not at every open
(dpch.backends.install_store_functions), and re-created whenever the store does not hold exactly
what this installation created: a dropped function, an edited stored definition (say, the noise
taken out of dp_count) or a changed definition in clickhouse_config.

Each scenario runs in a process of its own: chDB holds one store per process, and this test
process may hold the session's store.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Opens the store (counting the installs of the functions), checks dp_count still adds noise: its
# value over 1 000 rows at ε = 0.01 is exactly 1 000 in all of 4 tries with probability
# ((1 - e^-0.01) / (1 + e^-0.01))^4 ≈ 6e-10 for the correct discrete Laplace (scale 100), and
# always for a noiseless definition. Prints JSON.
SCRIPT = textwrap.dedent("""\
    import json, sys
    import dpch.backends as b
    creates = []
    real = b._install_sql_functions
    def counting(run, definitions):
        creates.append(len(definitions))
        return real(run, definitions)
    b._install_sql_functions = counting
    if len(sys.argv) > 2:  # a changed definition in this installation
        defs = b.sql_function_definitions
        b.sql_function_definitions = lambda: [(n, s + " + 0" if n == "dp_count" else s) for n, s in defs()]
    import dpch
    db = dpch.connect(sys.argv[1])
    noisy = any(db.raw_query("SELECT dp_count(0.01) AS n FROM numbers(1000)")["n"][0] != 1000 for _ in range(4))
    db.close()
    print(json.dumps({"creates": creates, "noisy": bool(noisy)}))
    """)


def _open(data: Path, *extra: str) -> dict:
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(data), *extra], capture_output=True, text=True,
                       cwd=ROOT, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_functions_are_created_once_and_again_when_the_store_differs(tmp_path):
    data = tmp_path / "data"
    first = _open(data)
    assert len(first["creates"]) == 1 and first["creates"][0] >= 20 and first["noisy"]
    udf = data / "store" / "user_defined"
    assert (udf / ".dpch_functions.sha256").is_file()

    again = _open(data)
    assert again == {"creates": [], "noisy": True}  # nothing re-created on a plain re-open

    stored = udf / "function_dp_count.sql"
    original = stored.read_text()
    # an edited stored definition: the noise taken out of dp_count
    stored.write_text("CREATE FUNCTION dp_count AS eps -> toInt64(count())")
    tampered = _open(data)
    assert len(tampered["creates"]) == 1 and tampered["noisy"]
    assert stored.read_text() == original

    stored.unlink()  # a dropped function
    dropped = _open(data)
    assert len(dropped["creates"]) == 1 and stored.read_text() == original

    changed = _open(data, "changed-definition")  # this installation's definition changed
    assert len(changed["creates"]) == 1 and changed["noisy"]
    back = _open(data)  # and back to the shipped one
    assert len(back["creates"]) == 1 and back["noisy"]
    assert _open(data) == {"creates": [], "noisy": True}
