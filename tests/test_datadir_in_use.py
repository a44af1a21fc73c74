"""A second process opening an embedded data directory that another process holds gets a clear
DPCHError naming the directory and the holding process, and pointing to `dpch serve`; chDB alone
says only "Error initializing EmbeddedServer". Both sides are real processes."""
from __future__ import annotations

import subprocess
import sys
import textwrap

HOLD = textwrap.dedent("""
    import sys, dpch
    db = dpch.connect(sys.argv[1])
    print("ready", flush=True)
    sys.stdin.read()   # hold the store until the test closes stdin
    db.close()
""")


def test_second_process_gets_a_clear_error(tmp_path):
    data = tmp_path / "data"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(data)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        r = subprocess.run([sys.executable, "-m", "dpch.cli", "catalog", "list", "--data-dir", str(data)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 2
        err = r.stderr
        assert f"the data directory {data} is in use by process {holder.pid}" in err
        assert "dpch serve" in err and "Traceback" not in err
        # from Python: the error type
        code = ("import sys, dpch\n"
                "try:\n    dpch.connect(sys.argv[1])\n"
                "except dpch.errors.DataDirInUse as e:\n    print('DataDirInUse', e)\n")
        r = subprocess.run([sys.executable, "-c", code, str(data)], capture_output=True, text=True, timeout=120)
        assert r.stdout.startswith("DataDirInUse the data directory"), r.stdout + r.stderr
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    # once the holder is gone, the directory opens again
    r = subprocess.run([sys.executable, "-m", "dpch.cli", "catalog", "list", "--data-dir", str(data)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_no_false_alarm_on_a_stale_status_file(tmp_path):
    from dpch.datadir import store_in_use_error

    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "status").write_text("PID: 999999999\nStarted at: x\n")
    assert store_in_use_error(tmp_path) is None
    assert store_in_use_error(tmp_path / "nothing") is None
