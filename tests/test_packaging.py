"""The slim server image: the `udf` extra lists what the UDF program needs at run time (nothing
beyond the package: checked by running it), the Dockerfile installs only that, and `dpch --version`
reports the package metadata."""
from __future__ import annotations

import ast
import re
import struct
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _extras() -> dict:
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "extras_require":
            return ast.literal_eval(node.value)
    raise AssertionError("setup.py has no extras_require")


def test_udf_program_imports_only_the_udf_extra():
    check_udf_program_imports(sys.executable)


def check_udf_program_imports(python: str, env: dict | None = None) -> None:
    """Run the UDF program under ``python`` on one real RowBinary block and check the third-party
    modules it loaded (tests/test_system_python.py runs it under the system's python3 too)."""
    code = ("import sys, runpy\n"
            "sys.argv = ['dpch-udf', 'laplace']\n"
            "try:\n    runpy.run_module('dpch.udf_entry', run_name='__main__')\n"
            "except SystemExit:\n    pass\n"
            "mods = {m.split('.')[0] for m in sys.modules} - set(sys.stdlib_module_names)\n"
            "sys.stderr.write('MODS ' + ' '.join(sorted(mods)) + '\\n')\n")
    block = b"1\n" + struct.pack("<dd", 10.0, 1.0)
    r = subprocess.run([python, "-c", code], input=block, capture_output=True, timeout=60, env=env)
    assert len(r.stdout) == 8, r.stderr  # one Float64 result
    # what the interpreter loads on its own (site hooks: Debian's sitecustomize/apport) is not the
    # project's import: judge only what the UDF program adds
    bare = subprocess.run([python, "-c", "import sys; print(' '.join(m.split('.')[0] for m in sys.modules))"],
                          capture_output=True, text=True, timeout=60, env=env)
    mods = set(r.stderr.decode().split("MODS ", 1)[1].split()) - set(bare.stdout.split())
    allowed = {"dpch", "__main__", "_distutils_hack", "cython_runtime"} | {m for m in mods if m.startswith(("_cython", "__editable__"))}
    extra = {re.split(r"[<>=\[ ]", req)[0].replace("-", "_") for req in _extras()["udf"]}
    assert mods - allowed <= extra, f"the UDF program imports {sorted(mods - allowed - extra)}, not in the udf extra"


def test_dockerfile_installs_only_the_udf_extra():
    docker = (ROOT / "Dockerfile").read_text()
    installs = [line for line in docker.splitlines() if "pip install" in line]
    assert installs and all("--no-deps" in line and "[udf]" in line for line in installs)
    for heavy in ("chdb", "scikit-learn", "matplotlib", "pandas"):
        assert heavy not in " ".join(installs)
    assert ".venv" in (ROOT / ".dockerignore").read_text().split()


def test_version_from_package_metadata():
    from importlib.metadata import version

    r = subprocess.run([sys.executable, "-m", "dpch.cli", "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == f"dpch {version('dpch')}"


def test_every_command_takes_data_dir():
    from dpch.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    missing = []
    for name, p in sub.choices.items():
        leaves = [p]
        nested = [a for a in p._actions if a.__class__.__name__ == "_SubParsersAction"]
        if nested:
            leaves = list(nested[0].choices.values())
        for leaf in leaves:
            if not any("--data-dir" in a.option_strings for a in leaf._actions):
                missing.append(f"{name} {leaf.prog}")
    assert not missing, f"commands without --data-dir: {missing}"
