"""One module per benchmarked system. Each exposes a class with the same small interface
(`systems.base.System`): `prepare(...)`, `run(qid, eps) -> {stat: [values aligned with the
query's keys]}`, `supports(qid) -> reason or None`, and `CONFIG` (the documented configuration).

The in-process systems (plain ClickHouse, DPCH SQL functions, DPCH controller) run in the harness
process on the embedded store. The peers (SmartNoise SQL, PipelineDP, OpenDP Polars) run in their
own virtualenvs (see run_all.py: their pins conflict with DPCH's core dependencies) through
`bench/peer_worker.py`; their modules import only the standard library and numpy at import time.
"""
INPROC = ("plain", "dpch_sql", "dpch_controller", "dpch_accel")
PEERS = ("smartnoise", "pipelinedp", "opendp_polars")
ALL = INPROC + PEERS

LABELS = {
    "plain": "plain ClickHouse",
    "dpch_sql": "DPCH SQL functions",
    "dpch_controller": "DPCH controller",
    "dpch_accel": "DPCH controller + per-unit projection",
    "smartnoise": "SmartNoise SQL (pandas)",
    "pipelinedp": "PipelineDP (LocalBackend)",
    "opendp_polars": "OpenDP (Polars context)",
}
