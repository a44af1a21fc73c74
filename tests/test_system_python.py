"""README's two commands (`make demo`, `make test`) with the system's python3 first on PATH (issue 31
item 1): a stock Debian/Ubuntu interpreter refuses `pip install` outside a virtualenv (PEP 668) and
loads its own `sitecustomize` (the apport hook) at start.

A fresh install takes minutes, so it is checked in parts: make's dry run creates the virtualenv with
`python3` from PATH and installs and runs everything inside it; that `python3 -m venv` really works
with the system interpreter (with pip, so the install step can run); and the UDF program's import
check (tests/test_packaging.py) passes under that interpreter, site hooks included. Skipped where
there is no /usr/bin/python3 of this interpreter's version (the compiled extensions are built for it).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_packaging import check_udf_program_imports

ROOT = Path(__file__).resolve().parents[1]
SYSTEM_PY = Path("/usr/bin/python3")


def _system_env() -> dict:
    """This environment with /usr/bin first on PATH, no virtualenv active, and not inside a make
    (`make test` runs this test: an inherited MAKELEVEL/MAKEFLAGS makes make print "Entering directory")."""
    drop = ("VIRTUAL_ENV", "PYTHONHOME", "PYTHONPATH", "MAKELEVEL", "MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PATH"] = "/usr/bin:/bin:" + env.get("PATH", "")
    return env


def _system_version() -> tuple[int, int] | None:
    if not SYSTEM_PY.exists():
        return None
    r = subprocess.run([str(SYSTEM_PY), "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True,
                       text=True, timeout=60)
    return tuple(map(int, r.stdout.split())) if r.returncode == 0 else None


needs_system_python = pytest.mark.skipif(_system_version() != sys.version_info[:2],
                                         reason="no /usr/bin/python3 of this interpreter's version")


@pytest.mark.parametrize("target,runs", [("demo", "/bin/dpch demo"), ("test", "/bin/python -m pytest")])
def test_make_uses_python3_from_path_and_installs_into_the_virtualenv(tmp_path, target, runs):
    venv = tmp_path / "venv"
    r = subprocess.run(["make", "-n", target, f"VENV={venv}"], cwd=ROOT, env=_system_env(), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"python3 -m venv {venv} "), lines[0]  # python3 as PATH finds it
    assert f"{venv}/bin/python -m pip install -q -e '.[test]'" in lines
    pip = [line for line in lines if "pip install" in line]
    assert pip and all(line.startswith(f"{venv}/bin/python -m pip") for line in pip), pip  # never the system's
    assert any(line.startswith(str(venv) + runs) for line in lines), lines


@pytest.fixture(scope="module")
def system_venv(tmp_path_factory) -> Path:
    """`python3 -m venv` as the Makefile runs it, with /usr/bin/python3 first on PATH."""
    venv = tmp_path_factory.mktemp("system_venv") / "venv"
    r = subprocess.run(["python3", "-m", "venv", str(venv)], env=_system_env(), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return venv


@needs_system_python
def test_system_python3_creates_the_virtualenv_with_pip(system_venv):
    py = str(system_venv / "bin" / "python")
    r = subprocess.run([py, "-c", "import sys; print(sys.base_prefix, sys.prefix != sys.base_prefix)"],
                       capture_output=True, text=True, timeout=60)
    assert r.stdout.split() == ["/usr", "True"], r.stdout + r.stderr  # Debian's interpreter, inside a venv
    r = subprocess.run([py, "-m", "pip", "--version"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and str(system_venv) in r.stdout, r.stdout + r.stderr


@needs_system_python
def test_udf_program_imports_under_the_system_interpreter(system_venv):
    """The packaging check judges the project's imports, not the interpreter's site hooks (Debian's
    sitecustomize is loaded here: the test would have failed before b6b6c84)."""
    py = str(system_venv / "bin" / "python")
    env = {**_system_env(), "PYTHONPATH": str(ROOT)}
    hooks = subprocess.run([py, "-c", "import sys; print('sitecustomize' in sys.modules)"], capture_output=True,
                           text=True, timeout=60, env=env)
    if hooks.stdout.strip() != "True":
        pytest.skip("this system interpreter loads no sitecustomize")
    check_udf_program_imports(py, env)
