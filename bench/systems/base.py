"""What every benchmarked system shares: the interface, the timer and the peak-memory probe.

Only the standard library and numpy are imported here: the peers' virtualenvs import this too.

Peak memory: before each timed run the probe resets the kernel's resident-set high-water mark
(`echo 5 > /proc/self/clear_refs`, Linux ≥ 4.0) and reads `VmHWM` after it, so the peak is the
largest RSS the process reached *during that run* (the data already loaded is included, since it
is resident). `delta` is that peak minus the RSS just before the run: the working memory the
query itself needed. Where clear_refs is not writable the probe falls back to `ru_maxrss`
(peak over the process lifetime) and says so.
"""
from __future__ import annotations

import math
import resource
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Callable


class System:
    name = "?"
    CONFIG: dict[str, str] = {}      # qid -> how the query is expressed/configured (documentation)
    UNSUPPORTED: dict[str, str] = {}  # qid -> reason

    def supports(self, qid: str) -> str | None:
        """None when the system runs query `qid`, else the reason it does not."""
        return self.UNSUPPORTED.get(qid)

    def run(self, qid: str, eps: float) -> dict[str, list[float]]:
        raise NotImplementedError

    def close(self) -> None:
        pass


def align(keys: list[int], got_keys, columns: dict[str, object]) -> dict[str, list[float]]:
    """Reorder released per-key values onto the query's key list; a key the system did not
    release becomes NaN (so accuracy can tell 'not released' from 'released as 0')."""
    pos = {int(k): i for i, k in enumerate(got_keys)}
    out = {}
    for stat, vals in columns.items():
        vals = list(vals)
        out[stat] = [float(vals[pos[k]]) if k in pos else math.nan for k in keys]
    return out


# -- memory ----------------------------------------------------------------------------------
class EngineSqlSystem(System):
    """A system that answers each query with one SQL statement on the shared chDB engine (plain
    ClickHouse and the DPCH SQL functions); subclasses only say which SQL."""

    def __init__(self, db, wl, queries):
        self.db, self.wl, self.queries = db, wl, queries

    def sql(self, qid: str, eps: float) -> str:
        raise NotImplementedError

    def run(self, qid: str, eps: float):
        q = self.queries[qid]
        df = self.db.raw_query(self.sql(qid, eps))
        if q.group is None:
            return {"avg": [float(df["avg"][0])]}
        return align(q.keys, df["key"], {"count": df["count"], "sum": df["sum"]})


def _status_kib(field_name: str) -> int | None:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


PEAK_METHOD = "VmHWM after clear_refs=5" if _reset_peak() else "ru_maxrss (process lifetime)"


@dataclass
class Timing:
    times_s: list[float] = field(default_factory=list)
    peak_rss_mib: list[float] = field(default_factory=list)
    delta_rss_mib: list[float] = field(default_factory=list)

    def add(self, seconds: float, peak_kib: float, before_kib: float) -> None:
        self.times_s.append(seconds)
        self.peak_rss_mib.append(peak_kib / 1024)
        self.delta_rss_mib.append(max(0.0, peak_kib - before_kib) / 1024)

    def summary(self) -> dict:
        t = self.times_s
        return {
            "runs": len(t),
            "median_s": statistics.median(t) if t else math.nan,
            "min_s": min(t) if t else math.nan,
            "max_s": max(t) if t else math.nan,
            "times_s": t,
            "peak_rss_mib": statistics.median(self.peak_rss_mib) if t else math.nan,
            "delta_rss_mib": statistics.median(self.delta_rss_mib) if t else math.nan,
            "peak_method": PEAK_METHOD,
        }


def timed_call(fn: Callable[[], object], timing: Timing | None = None):
    """Run fn once; record wall time and peak memory into `timing` (if given)."""
    reset = _reset_peak()
    before = _status_kib("VmRSS") or 0
    t0 = time.perf_counter()
    result = fn()
    elapsed = time.perf_counter() - t0
    if reset:
        peak = _status_kib("VmHWM") or 0
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if timing is not None:
        timing.add(elapsed, peak, before)
    return result


def asdict_safe(obj) -> dict:
    return asdict(obj)
