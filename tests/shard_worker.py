"""One emulated shard for tests/test_shard_equivalence.py: its own chDB store (one per process),
no DPCH UDFs (a shard never calls one).

    python tests/shard_worker.py JOB.json

JOB: {"store": dir, "tables": [[local table, Native file of this shard's rows], ...],
"queries": [[name, shard SQL, the SQL without SETTINGS], ...], "out": dir, "shard": i}. Each
query's partial states go to OUT/<name>.s<i>.native (Native keeps AggregateFunction columns; an
empty file when the shard has no group), its column structure to OUT/<name>.structure, an engine
error to OUT/<name>.s<i>.error."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import chdb.session


def main(job_path: str) -> None:
    job = json.loads(Path(job_path).read_text())
    out, shard = Path(job["out"]), job["shard"]
    sess = chdb.session.Session(job["store"])
    for table, data in job["tables"]:
        sess.query(f"CREATE DATABASE IF NOT EXISTS {table.split('.')[0]}")
        sess.query(f"CREATE TABLE {table} ENGINE = MergeTree ORDER BY tuple() AS SELECT * FROM file('{data}', 'Native')")
    for name, sql, bare in job["queries"]:
        try:
            (out / f"{name}.s{shard}.native").write_bytes(sess.query(sql, "Native").bytes())
            if shard == 0:
                desc = sess.query(f"DESCRIBE ({bare})", "JSONEachRow").bytes().decode().splitlines()
                cols = [json.loads(line) for line in desc if line.strip()]
                (out / f"{name}.structure").write_text(", ".join(f"{c['name']} {c['type']}" for c in cols))
        except Exception as exc:  # test data only: the message is the test's diagnostic
            (out / f"{name}.s{shard}.error").write_text(str(exc))
    sess.close()


if __name__ == "__main__":
    main(sys.argv[1])
