"""The access log: one JSON object per line, per request, in ``<data dir>/access.log`` (and, with
``--access-log -``, on stderr). Fields: ``time`` (ISO 8601 UTC), ``user`` (authenticated name, or
null), ``query_id``, ``kind`` (dp, dp_functions, metadata, ping, error), ``outcome`` (accepted or
rejected), ``code`` (the ClickHouse/DPCH error code of a rejection), ``epsilon``/``delta`` charged,
``dataset``, ``receipt``, ``rows`` (released rows), ``format``, ``duration_ms``, ``remote``, and
``query_sha256`` (a hash of the query text; the text itself, any data value and the catalog salt
are never logged). Passwords are never logged."""
from __future__ import annotations

import datetime as _dt
import json
import os
import sys
import threading


class AccessLog:
    def __init__(self, path: str | None):
        self._lock = threading.Lock()
        self._fh = None
        self._stderr = path == "-"
        if path and path != "-":
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            self._fh = os.fdopen(fd, "a", encoding="utf-8", buffering=1)

    def write(self, **fields) -> None:
        rec = {"time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")}
        rec.update({k: v for k, v in fields.items() if v is not None})
        line = json.dumps(rec, separators=(",", ":"), default=str)
        with self._lock:
            if self._fh is not None:
                self._fh.write(line + "\n")
            if self._stderr:
                print(line, file=sys.stderr, flush=True)

    def close(self) -> None:
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None
