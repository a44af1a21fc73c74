"""Propose-test-release (Dwork & Lei 2009; odp_privacy_accounting.md §4.2): a robust median, the
interquartile range (M_IQR) and the α-trimmed mean, at the unit level, charged by output DP.

``db.robust_median``, ``db.robust_iqr``, ``db.trimmed_mean`` and ``dpch ptr``; docs/PTR.md."""
from .calibration import NoisyTest, dlap_tail, iqr_cells, log_bin_width, log_bins, pass_threshold, ptr_cells
from .run import STATISTICS, PtrResult, PtrRun, run_ptr

__all__ = ["NoisyTest", "PtrResult", "PtrRun", "STATISTICS", "dlap_tail", "iqr_cells", "log_bin_width", "log_bins",
           "pass_threshold", "ptr_cells", "run_ptr"]
