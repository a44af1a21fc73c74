"""Measured seconds per test module, for the order in which `make test` hands modules to its
workers (tests/conftest.py): longest first, so that the run does not end with one long module on
one worker while the other idles.

Regenerate after a test module grows or shrinks a lot:

    .venv/bin/python -m pytest -q -n auto --dist loadfile --no-loadscope-reorder --durations=0 > /tmp/d.txt
    .venv/bin/python tests/module_seconds.py /tmp/d.txt     # rewrites tests/module_seconds.json
"""
from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path

FILE = Path(__file__).with_suffix(".json")
_LINE = re.compile(r"([\d.]+)s (?:setup|call|teardown)\s+(\S+?)::")


def load() -> dict[str, float]:
    """{module path as pytest names it: seconds} (empty when the file is missing)."""
    try:
        return json.loads(FILE.read_text())
    except (OSError, ValueError):
        return {}


def from_durations(text: str) -> dict[str, float]:
    """Per-module sums of a `pytest --durations=0` report."""
    seconds: Counter = Counter()
    for line in text.splitlines():
        m = _LINE.match(line)
        if m:
            seconds[m.group(2)] += float(m.group(1))
    return {k: round(v, 1) for k, v in sorted(seconds.items(), key=lambda kv: -kv[1])}


if __name__ == "__main__":
    FILE.write_text(json.dumps(from_durations(Path(sys.argv[1]).read_text()), indent=0) + "\n")
