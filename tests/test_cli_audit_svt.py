"""`dpch audit --svt` (dpch/commands/audit.py): the sparse-vector audit of dpch.audit.svt from the
command line (docs/AUDIT.md §10), and the SVT audit at ε = 0.5 and 2 (fast path).

False alarms: every audit here runs at confidence 1 − 1e-7 (all c + 2 certificates of one audit
hold together with probability ≥ 1 − 1e-7, union bound; dpch.audit.svt) and the fast-path
agreement check, where it runs, is asserted at p ≥ 1e-8 per side; 4 audits of the correct session
fail by chance with probability < 4·(1e-7 + 2e-8) < 1e-6.
"""
from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout

import pytest

from dpch.audit.svt import audit_svt, build_svt_design, svt_design
from dpch.svt import default_split, svt_epsilons

CONF = 1 - 1e-7


def _cli(args: list[str]) -> tuple[int, str, str]:
    from dpch.cli import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(args)
    return code, out.getvalue(), err.getvalue()


def test_cli_design_prints_classes_and_settled_epsilons(db):
    code, out, err = _cli(["audit", "--svt", "--design", "--epsilon", "1", "--max-positives", "2",
                           "--samples", "40000", "--real-sessions", "10", "--confidence", repr(CONF),
                           "--database", "cli_svt_design", "--data-dir", str(db.data_dir)])
    assert code == 0, out + err
    e1 = default_split(2)
    settled = svt_epsilons(e1, 1.0 - e1, 2)
    assert f"settled ε per class: {', '.join(f'{e:.3f}' for e in settled)}" in out
    for label in ("overall:", "class c′ = 0:", "class c′ = 1:", "class c′ = 2:"):
        assert label in out
    assert "verdict: consistent" in out and "fast path vs 10 real sessions" in out


def test_cli_queries_file_json(db, tmp_path):
    design = svt_design(1.0, 1)
    d, dp, queries = build_svt_design(db, design, database="cli_svt_file")
    qfile = tmp_path / "queries.sql"
    qfile.write_text("-- one test query per line\n" + "\n".join(queries) + "\n")
    code, out, err = _cli(["audit", "--svt", "--d", d, "--dprime", dp, "--queries", str(qfile),
                           "--threshold", str(design.threshold), "--epsilon", "1", "--samples", "20000",
                           "--real-sessions", "0", "--confidence", repr(CONF), "--json",
                           "--analyst", db.analyst, "--data-dir", str(db.data_dir)])
    assert code == 0, out + err
    r = json.loads(out)
    assert r["violation"] is False and r["max_positives"] == 1 and r["samples"] == 20000
    assert [c["class"] for c in r["certificates"]] == [None, 0, 1]
    assert r["settled_epsilon_per_class"] == pytest.approx(list(svt_epsilons(default_split(1), 1 - default_split(1), 1)))
    assert all(c["epsilon_lb"] <= c["claimed"] for c in r["certificates"])


@pytest.mark.parametrize("extra,needle", [
    (["SELECT 1"], "give no SQL"),
    ([], "--d, --dprime, --queries, --threshold"),
    (["--design", "--queries", "x.sql"], "--design builds"),
    (["--max-positives", "0", "--design"], "--max-positives"),
    (["--d", "a.b", "--dprime", "a.c", "--queries", "/nonexistent/q.sql", "--threshold", "5"], "--queries"),
])
def test_cli_bad_arguments(db, extra, needle):
    code, out, err = _cli(["audit", "--svt", "--epsilon", "1", "--data-dir", str(db.data_dir)] + extra)
    assert code == 2 and needle in err and out == ""


@pytest.mark.parametrize("eps", [0.5, 2.0])
def test_svt_audit_at_other_epsilons(db, eps):
    """The correct session at ε = 0.5 and 2 (c = 1) is consistent overall and per class, and the
    settled claims are the session's svt_epsilons (the fast path is checked against real sessions
    in tests/test_audit_svt.py)."""
    des = svt_design(eps, 1)
    d, dp, qs = build_svt_design(db, des, database=f"cli_svt_eps_{str(eps).replace('.', '_')}")
    r = audit_svt(db, d, dp, qs, des.threshold, eps, 1, samples=60_000, real_sessions=0, confidence=CONF)
    assert not r.violation, r.summary()
    e1 = eps * default_split(1)
    assert r.claims == pytest.approx(svt_epsilons(e1, eps - e1, 1), rel=1e-12)
