"""README.md runs as written: every ```python and ```bash block, in order, on a fresh data
directory (DPCH_DATA_DIR in a temporary directory). The first is the demo that the others need
(`dpch demo --rows 100000`).

The blocks run as a newcomer would run them from the root of a clone with the project virtualenv
active: the working directory is a temporary directory holding a copy of `examples/` (so that
reports and files the blocks write do not land in the checkout), and `dpch`/`python` are this
interpreter's. Each Python block runs in its own process (one embedded store per process); each
bash block runs with `bash -e`, so any failing command fails the test.

A block is skipped only if the line before it is an HTML comment
`<!-- readme-test: skip (reason) -->`. Today that is one block: `make demo` / `make test`, which
installs DPCH and runs the whole test suite (this test runs inside that suite). Blocks that need a
ClickHouse server or Docker must carry the same marker, with that reason.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
FENCE = re.compile(r"^```(\w*)\s*$")
SKIP = re.compile(r"^<!--\s*readme-test:\s*skip\s*\((.+)\)\s*-->\s*$")
DEMO = "dpch demo --rows 100000"


def readme_blocks() -> list[tuple[int, str, str, str | None]]:
    """(line number, language, code, skip reason) for every fenced block of README.md."""
    lines = README.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        lang, start = m.group(1), i
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        prev = next((lines[k] for k in range(start - 1, -1, -1) if lines[k].strip()), "")
        skip = SKIP.match(prev.strip())
        blocks.append((start + 1, lang, "\n".join(lines[start + 1:j]) + "\n", skip.group(1) if skip else None))
        i = j + 1
    return blocks


def test_readme_parses_and_states_the_demo():
    blocks = readme_blocks()
    runnable = [b for b in blocks if b[1] in ("python", "bash") and b[3] is None]
    assert len(runnable) >= 3
    # the demo the other blocks need: the first block that runs
    assert runnable[0][1] == "bash" and runnable[0][2].startswith(DEMO), runnable[0]
    for _, lang, code, skip in blocks:
        if skip is not None:
            assert skip.strip(), "a skip marker needs a reason"
        if lang == "bash":
            for line in code.splitlines():
                # one command per line: no `a | b | c` that reads as a pipeline of DPCH commands
                assert not re.search(r"\|\s*dpch\b", line.split("#")[0]), line


@pytest.mark.slow
def test_readme_blocks_run_in_order(tmp_path):
    work = tmp_path / "clone"
    work.mkdir()
    shutil.copytree(ROOT / "examples", work / "examples")
    env = {k: v for k, v in os.environ.items() if k not in ("DPCH_LEDGER", "DPCH_CLICKHOUSE_CONFIG")}
    env["DPCH_DATA_DIR"] = str(tmp_path / "data")
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["MPLBACKEND"] = "Agg"

    def run(argv, what):
        r = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, f"{what} failed (exit {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        return r

    ran = 0
    for n, (line, lang, code, skip) in enumerate(readme_blocks()):
        if lang not in ("python", "bash") or skip is not None:
            continue
        script = tmp_path / f"block{n}.{'py' if lang == 'python' else 'sh'}"
        script.write_text(code)
        argv = [sys.executable, str(script)] if lang == "python" else ["bash", "-e", "-o", "pipefail", str(script)]
        run(argv, f"README.md block at line {line} ({lang})")
        ran += 1
    assert ran >= 3
