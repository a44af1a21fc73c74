"""Who holds an embedded data directory.

chDB keeps one store per directory and per process: the engine takes an exclusive lock on
``<data dir>/store/status`` and writes its PID there ("PID: 1234", then the start time). A second
process that opens the same directory gets only "Error initializing EmbeddedServer" from chDB; this
module turns that into a message naming the directory, the process that holds it and the way to
share one store between processes (``dpch serve``).
"""
from __future__ import annotations

import errno
import os
import re
from pathlib import Path

from .errors import Advice, DataDirInUse


def status_file(data_dir: Path) -> Path:
    return Path(data_dir) / "store" / "status"


def _locked_by_other(path: Path) -> bool | None:
    """True if another open file description holds ClickHouse's flock on ``path``; None if unknown."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        return exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def holder_pid(data_dir: Path) -> int | None:
    """The PID written in the store's status file, if that process is still alive."""
    try:
        text = status_file(data_dir).read_text(errors="replace")
    except OSError:
        return None
    m = re.search(r"^PID:\s*(\d+)", text, re.MULTILINE)
    if not m:
        return None
    pid = int(m.group(1))
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:  # alive, owned by another user
        return pid
    return pid


def _describe_process(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return f"process {pid}"
    cmd = " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part)
    if len(cmd) > 120:
        cmd = cmd[:117] + "..."
    return f"process {pid} ({cmd})" if cmd else f"process {pid}"


def store_in_use_error(data_dir: Path) -> DataDirInUse | None:
    """The error to raise when opening ``data_dir`` failed because another process holds it, or
    None when that is not the reason (then the caller reports chDB's own error)."""
    path = status_file(data_dir)
    if not path.exists():
        return None
    locked = _locked_by_other(path)
    pid = holder_pid(data_dir)
    if locked is False or (locked is None and pid is None):
        return None
    if pid == os.getpid():
        who = "this process (close its other connection first)"
    elif pid is not None:
        who = _describe_process(pid)
    else:
        who = "another process"
    return DataDirInUse(
        f"the data directory {Path(data_dir)} is in use by {who}. An embedded engine belongs to one "
        "process at a time: stop that process, or use another directory.", advice=Advice(
            python="Connect to another directory (dpch.connect(DIR) or $DPCH_DATA_DIR), or run `dpch serve` "
                   "on this one and connect to that server (dpch.connect('http://HOST:PORT')).",
            cli="Use another directory (--data-dir DIR or $DPCH_DATA_DIR), or run `dpch serve` on this one "
                "and send queries to that server.",
            gateway="The gateway's administrator must stop the other process that holds its data directory."))


def check_store_free(data_dir: Path) -> None:
    """Raise DataDirInUse before opening the store when another process holds its lock: chDB
    would print its own "Cannot lock file" line to stderr before DPCH could explain (issue 31).
    Only a lock seen held counts; any doubt is left to the open itself."""
    path = status_file(data_dir)
    if path.exists() and _locked_by_other(path):
        error = store_in_use_error(data_dir)
        if error is not None:
            raise error
