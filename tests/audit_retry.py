"""Shared by the audit tests' power checks (test_audit_python.py, test_audit_engine.py)."""
from __future__ import annotations


def best_of(k, run_audit, passes):
    """Run up to k independent audits and return the first that passes (else the last). If one
    audit fails with probability p, all k fail with probability p^k. Stopping early changes the
    running time only, not which outcome the test reports."""
    for _ in range(k):
        r = run_audit()
        if passes(r):
            break
    return r
