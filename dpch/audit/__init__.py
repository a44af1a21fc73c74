"""Empirical privacy audit on neighbouring datasets (`dpch audit`; dpch_paper.md, component 3).

Runs a mechanism many times on a dataset D and on a neighbour D′, chooses output events on one
half of the samples (threshold/interval search and learned distinguishers, after StatDP and
DP-Sniper), certifies them on the other half with Clopper–Pearson bounds, and reports the
empirical lower bound ε_LB = ln((p̲_D(S) − δ)/p̄_D′(S)) with a verdict. See docs/AUDIT.md.
"""
from .analysis import Analysis, analyse
from .api import audit, audit_samplers, audit_samples, controller_sql
from .designs import (QuantileDesign, SelectionDesign, TopKDesign, quantile_design, selection_design,
                      top_k_design)
from .neighbours import KINDS as NEIGHBOUR_KINDS
from .report import AuditReport
from .svt import SvtAudit, audit_svt, build_svt_design, svt_design
from .ptr import PtrAudit, audit_ptr
from .early_stop import EarlyStopAudit, audit_early_stop, build_early_stop_design, early_stop_design
from .stats import cp_lower, cp_upper, epsilon_lower_bound, mi_accuracy_bound

__all__ = ["audit", "audit_samples", "audit_samplers", "controller_sql", "AuditReport", "Analysis",
           "analyse", "NEIGHBOUR_KINDS", "cp_lower", "cp_upper", "epsilon_lower_bound",
           "mi_accuracy_bound", "QuantileDesign", "quantile_design", "SelectionDesign",
           "selection_design", "TopKDesign", "top_k_design", "audit_svt", "SvtAudit",
           "svt_design", "build_svt_design", "audit_ptr", "PtrAudit", "audit_early_stop",
           "EarlyStopAudit", "early_stop_design", "build_early_stop_design"]
