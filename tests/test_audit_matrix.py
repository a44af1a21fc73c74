"""The audit's matrices (dpch.audit.sampling.to_matrix): its fast path for one result row per run
and no keys gives exactly the general pivot's matrices and coordinate names, generated over
random run counts, missing runs (a suppressed or empty output is a NaN row), NaN values and
integer, float and boolean output columns."""
from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from dpch.audit.sampling import REP, SampleSet, _pivot, to_matrix

DTYPES = {"int": np.int64, "float": np.float64, "bool": np.bool_, "uint8": np.uint8}


@st.composite
def sides(draw):
    n = draw(st.integers(1, 12))
    names = draw(st.lists(st.sampled_from(["v", "b", "n", "Z", "a1"]), min_size=0, max_size=4, unique=True))
    kinds = {c: draw(st.sampled_from(sorted(DTYPES))) for c in names}
    out = []
    for _ in range(2):
        reps = sorted(draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=n)))
        data = {REP: reps}
        for c, kind in kinds.items():
            if kind == "bool":
                data[c] = draw(st.lists(st.booleans(), min_size=len(reps), max_size=len(reps)))
            elif kind == "float":
                data[c] = draw(st.lists(st.floats(allow_nan=True, allow_infinity=True, width=64),
                                        min_size=len(reps), max_size=len(reps)))
            elif kind == "uint8":
                data[c] = draw(st.lists(st.integers(0, 255), min_size=len(reps), max_size=len(reps)))
            else:
                data[c] = draw(st.lists(st.integers(-2 ** 53, 2 ** 53), min_size=len(reps), max_size=len(reps)))
        frame = pd.DataFrame(data).astype({c: DTYPES[k] for c, k in kinds.items()})
        out.append(SampleSet(frame.sample(frac=1, random_state=draw(st.integers(0, 99))), n))  # any row order
    return out, names


@settings(max_examples=120, deadline=None, derandomize=True)
@given(sides())
def test_one_row_per_run_equals_the_general_pivot(case):
    pair, names = case
    (fast_d, fast_dp), fast_names = to_matrix(pair, [], names)
    (slow_d, slow_dp), slow_names = _pivot(pair, [], names)
    assert fast_names == slow_names
    for fast, slow in ((fast_d, slow_d), (fast_dp, slow_dp)):
        assert fast.shape == slow.shape and fast.dtype == slow.dtype == np.float64
        np.testing.assert_array_equal(fast, slow)  # NaN where the other has NaN, equal elsewhere
    # a run missing from a side is a row of NaN there
    for s, m in zip(pair, (fast_d, fast_dp)):
        missing = sorted(set(range(s.n)) - set(s.frame[REP]))
        assert np.isnan(m[missing]).all()


def test_several_rows_per_run_take_the_general_path():
    """Two rows in one run (no keys): the row number within the run is a coordinate (v, v#1)."""
    frame = pd.DataFrame({REP: [0, 0, 1], "v": [1.0, 2.0, 3.0]})
    (d, dp), names = to_matrix([SampleSet(frame, 2), SampleSet(frame, 2)], [], ["v"])
    assert names == ["v", "v#1"]
    np.testing.assert_array_equal(d, [[1.0, 2.0], [3.0, np.nan]])
