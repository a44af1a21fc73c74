"""Power of the single-level quantile audits in tests/test_audit_quantiles.py, computed rather than
guessed: the exact output law of the design (QuantileMechanism.probabilities on the design's
window of buckets, the mechanism at its true ε), simulated selection halves of n draws per side, the
event the threshold/interval search selects on them (dpch.audit.stats, as dpch.audit.analysis runs
it), and for each selected event the exact probability (two binomials) that its certificate on n
held-out samples per side, at the audit's confidence, is at most `thr`.

    python tests/audit_power.py LEVEL CLAIMED_EPS TRUE_EPS N CONFIDENCE THRESHOLD SIMULATIONS

prints the mean and maximum of that probability over the simulations and the events selected. The
audit's ε_LB is the maximum over its three methods, so the search alone bounds its failure
probability from above. Not a test (no test_ prefix): it documents where the sample sizes of the
tests come from."""
from __future__ import annotations

import collections
import math
import sys

import numpy as np
from scipy.stats import binom

from dpch.audit import quantile_design
from dpch.audit.analysis import SELECTION_ALPHA
from dpch.audit.stats import FeatureSpec, cp_lower, cp_upper, search_intervals
from dpch.mechanisms import QuantileMechanism

METHODS = 3  # the audit's α is split over its three methods (dpch/audit/analysis.py)


def law(d, true_eps: float):
    """(output values, P_D, P_D′) over the design's window of buckets, exactly."""
    first, last = d.counts[0][0] - 1, d.counts[-1][0] + 1
    dense = [0] * (last - first + 1)
    for bucket, rows in d.counts:
        dense[bucket - first] = rows
    dense_p = list(dense)
    dense_p[d.removed_bucket - first] -= 1
    mech = QuantileMechanism(true_eps)
    laws = []
    for counts in (dense, dense_p):
        probs = mech.probabilities(counts, list(d.levels))
        values = np.array([d.midpoint(first + key[0]) for key in probs])
        p = np.array(list(probs.values()))
        laws.append((values, p / p.sum()))
    assert np.array_equal(laws[0][0], laws[1][0])
    return laws[0][0], laws[0][1], laws[1][1]


def certificate_misses(p_num: float, p_den: float, n: int, alpha_each: float, thr: float) -> float:
    """Pr[ln(CP_lower(k_num)/CP_upper(k_den)) <= thr] for k ~ Bin(n, p), each bound at
    alpha_each/2 (dpch.audit.stats.epsilon_lower_bound)."""
    ks = np.arange(n + 1)
    lower, upper = cp_lower(ks, n, alpha_each / 2), cp_upper(ks, n, alpha_each / 2)
    px, py = binom.pmf(ks, n, p_num), binom.pmf(ks, n, p_den)
    total = 0.0
    for k in ks:
        if px[k] < 1e-300:
            continue
        total += px[k] if lower[k] <= 0 else px[k] * py[upper >= lower[k] / math.exp(thr)].sum()
    return total


def simulate(level: float, eps_claim: float, eps_true: float, n: int, confidence: float, thr: float,
             sims: int, seed: int = 1):
    """The events selected (with their exact probabilities) and the mean and maximum of the
    probability that the selected event's certificate is at most `thr`."""
    d = quantile_design(level, 0.0, 100.0, eps_claim)
    values, p, q = law(d, eps_true)
    rng = np.random.default_rng(seed)
    alpha_each = (1 - confidence) / METHODS
    events, misses = collections.Counter(), []
    for _ in range(sims):
        sel_d = rng.choice(values, size=n, p=p)[:, None]
        sel_dp = rng.choice(values, size=n, p=q)[:, None]
        spec = FeatureSpec.fit([sel_d, sel_dp], ["out0"])
        feat_d, names = spec.transform(sel_d)
        feat_dp, _ = spec.transform(sel_dp)
        chosen = search_intervals(feat_d, feat_dp, names, alpha=min(alpha_each, SELECTION_ALPHA), delta=0.0)
        inside = chosen.event.contains(spec.transform(values[:, None])[0][:, names.index(chosen.event.feature)])
        p_num, p_den = p[inside].sum(), q[inside].sum()
        if chosen.event.favours != "D":
            p_num, p_den = p_den, p_num
        events[(chosen.event.describe(), round(float(p_num), 4), round(float(p_den), 4))] += 1
        misses.append(certificate_misses(p_num, p_den, n, alpha_each, thr))
    return events, float(np.mean(misses)), float(np.max(misses))


if __name__ == "__main__":
    level, claimed, true = (float(x) for x in sys.argv[1:4])
    n, confidence, thr, sims = int(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6]), int(sys.argv[7])
    events, mean, worst = simulate(level, claimed, true, n, confidence, thr, sims)
    print(f"level {level}, claimed ε {claimed}, true ε {true}, n = {n} per side, confidence {confidence}, "
          f"threshold {thr}, {sims} simulated selections: Pr[miss] mean {mean:.3g}, max {worst:.3g}")
    for (event, p_num, p_den), count in events.most_common(6):
        print(f"  {count} × {event} (P = {p_num}, P′ = {p_den})")
