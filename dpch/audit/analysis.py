"""From two samples of mechanism outputs (on D and on D′) to certified ε lower bounds.

Protocol (the holdout argument; cf. DP-Sniper's separate threshold/estimation samples and StatDP's
separate event-selection and hypothesis-test runs):

1. Split each side's N samples in two: the selection half A and the certification half B. The
   draws are i.i.d., so A and B are independent.
2. On A only, every method picks ONE event (ranked by the CP-based ε the selection counts would
   certify, at the level min(α/m, 1e-3)):
   - "search": the best threshold/interval event over every output feature, both directions;
   - each learned distinguisher: trained on the first half of A, its score-threshold event
     ({score ≥ t} for D, {score ≤ t} for D′) chosen on the second half of A.
   The feature set itself (which coordinates get a lowbit/presence feature) is decided on A too.
3. On B, each of the m chosen events is certified with Clopper–Pearson bounds at level
   1 − α/(2m) per side (`stats.certify`). By the union bound over the 2m one-sided intervals, all
   m certificates hold simultaneously with probability ≥ 1 − α, so the reported ε_LB = max over
   methods satisfies Pr[ε_LB > ε_true] ≤ α whatever happened in step 2.
4. Verdict: VIOLATION iff ε_LB > ε_claimed. If the mechanism really is (ε_claimed, δ)-DP this
   happens with probability ≤ α = 1 − confidence.

The membership-inference accuracy uses one more event, chosen on A to maximise |p̂_D − p̂_D′|,
evaluated on B with its own CP bound; it is reported, not part of the verdict.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .learned import make_distinguishers
from .stats import (Certificate, FeatureSpec, IntervalEvent, MembershipInference, certify,
                    membership_inference, search_intervals)

DEFAULT_METHODS = ("search", "logistic", "boosting")
SELECTION_ALPHA = 1e-3
METHOD_LABELS = {"search": "threshold/interval search", "logistic": "logistic regression",
                 "boosting": "gradient boosting"}


@dataclass
class Analysis:
    epsilon: float
    delta: float
    confidence: float
    n_d: int
    n_dprime: int
    names: list[str]
    certificates: list[Certificate]
    membership: MembershipInference | None
    curve_sizes: list[int] = field(default_factory=list)
    curves: dict[str, list[float]] = field(default_factory=dict)

    @property
    def best(self) -> Certificate | None:
        return max(self.certificates, key=lambda c: c.epsilon_lb, default=None)

    @property
    def epsilon_lb(self) -> float:
        return self.best.epsilon_lb if self.best else 0.0

    @property
    def violation(self) -> bool:
        return self.epsilon_lb > self.epsilon


@dataclass
class _Chosen:
    method: str
    description: str
    favours: str
    score: float
    indicator: object  # callable: (raw features of B) -> bool array


def _as_matrix(x) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim == 1:
        a = a[:, None]
    if a.ndim != 2:
        raise ValueError("mechanism outputs must be a vector or an (n samples × k) matrix")
    return a


def analyse(out_d, out_dprime, *, epsilon: float, delta: float = 0.0, confidence: float = 0.95,
            names: list[str] | None = None, methods=DEFAULT_METHODS, seed: int = 0,
            curve_points: int = 6, progress=None) -> Analysis:
    """Run the protocol above on two output samples (n × k arrays; NaN = coordinate absent)."""
    if not 0 < confidence < 1:
        raise ValueError("confidence must be in (0, 1)")
    if epsilon < 0 or not 0 <= delta < 1:
        raise ValueError("need epsilon >= 0 and 0 <= delta < 1")
    d, dp = _as_matrix(out_d), _as_matrix(out_dprime)
    if d.shape[1] != dp.shape[1]:
        raise ValueError("outputs on D and D′ have different numbers of coordinates")
    if min(len(d), len(dp)) < 8:
        raise ValueError("need at least 8 samples per side")
    names = list(names) if names is not None else [f"out{j}" for j in range(d.shape[1])]
    methods = list(methods)
    alpha = 1.0 - confidence
    alpha_each = alpha / len(methods)
    # Selection ranks events by the CP bound they would certify at a level at least as strict as
    # 1e-3: a strict level penalises narrow, low-count events whose apparent ratio is noise (the
    # maximum over ~10^5 candidate events is biased upwards), and steers the search to events with
    # enough mass to certify well on the held-out half. Only the ranking depends on it.
    alpha_sel = min(alpha_each, SELECTION_ALPHA)

    half_d, half_dp = len(d) // 2, len(dp) // 2
    a_d, b_d = d[:half_d], d[half_d:]
    a_dp, b_dp = dp[:half_dp], dp[half_dp:]
    n_cert = min(len(b_d), len(b_dp))

    spec = FeatureSpec.fit([a_d, a_dp], names)
    fa_d, fnames = spec.transform(a_d)
    fa_dp, _ = spec.transform(a_dp)
    fb_d, _ = spec.transform(b_d)
    fb_dp, _ = spec.transform(b_dp)

    chosen: list[_Chosen] = []
    mi_candidates: list[tuple[float, _Chosen]] = []

    def step(label):
        if progress is not None:
            progress(label)

    for method in methods:
        if method == "search":
            step("event search")
            cand = search_intervals(fa_d, fa_dp, fnames, alpha=alpha_sel, delta=delta)
            adv = search_intervals(fa_d, fa_dp, fnames, alpha=alpha_sel, delta=delta,
                                   objective="advantage")
            for c, target in ((cand, chosen), (adv, None)):
                if c is None:
                    continue
                col = fnames.index(c.event.feature)
                ch = _Chosen(METHOD_LABELS[method], c.event.describe(), c.event.favours, c.score,
                             (lambda ev, col: lambda fd: ev.contains(fd[:, col]))(c.event, col))
                if target is chosen:
                    chosen.append(ch)
                else:
                    mi_candidates.append((c.score, ch))
            if cand is None:  # no finite output at all: certify the empty event (ε_LB = 0)
                chosen.append(_Chosen(METHOD_LABELS[method], "(no finite outputs)", "D", 0.0,
                                      lambda fd: np.zeros(len(fd), dtype=bool)))
        elif fa_d.shape[1] == 0:  # no output coordinate at all (e.g. no group released in any
            # run on either side): nothing to learn from; certify the empty event (ε_LB = 0)
            chosen.append(_Chosen(METHOD_LABELS[method], "(no outputs)", "D", 0.0,
                                  lambda fd: np.zeros(len(fd), dtype=bool)))
        else:
            (model,) = make_distinguishers([method], seed=seed)
            step(f"training {model.name}")
            t_d, s_d = fa_d[: len(fa_d) // 2], fa_d[len(fa_d) // 2:]
            t_dp, s_dp = fa_dp[: len(fa_dp) // 2], fa_dp[len(fa_dp) // 2:]
            model.fit(t_d, t_dp)
            sc_d, sc_dp = model.score(s_d)[:, None], model.score(s_dp)[:, None]
            label = f"score({model.name})"
            for objective in ("epsilon", "advantage"):
                c = search_intervals(sc_d, sc_dp, [label], alpha=alpha_sel, delta=delta,
                                     objective=objective, thresholds_only=True)
                ev = c.event if c else IntervalEvent(label, 2.0, 2.0, "D")  # empty event
                ch = _Chosen(METHOD_LABELS[method], ev.describe(), ev.favours,
                             c.score if c else 0.0,
                             (lambda ev, m: lambda fd: ev.contains(m.score(fd)))(ev, model))
                if objective == "epsilon":
                    chosen.append(ch)
                else:
                    mi_candidates.append((ch.score, ch))

    step("certification")
    certificates = []
    for ch in chosen:
        in_d, in_dp = ch.indicator(fb_d), ch.indicator(fb_dp)
        certificates.append(certify(ch.method, ch.description, ch.favours, in_d, in_dp,
                                    alpha=alpha_each, delta=delta, selection_score=ch.score))

    membership = None
    if mi_candidates:
        _, ch = max(mi_candidates, key=lambda t: t[0])
        membership = membership_inference(ch.method, ch.description, ch.favours, ch.indicator(fb_d),
                                          ch.indicator(fb_dp), alpha=alpha, epsilon=epsilon,
                                          delta=delta)

    # ε_LB against the number of certification samples (prefixes of B), one line per method.
    sizes = sorted({max(8, int(n_cert / 2 ** i)) for i in range(curve_points)})
    curves: dict[str, list[float]] = {}
    for ch in chosen:
        in_d, in_dp = ch.indicator(fb_d), ch.indicator(fb_dp)
        curves[ch.method] = [certify(ch.method, "", ch.favours, in_d[:n], in_dp[:n], alpha=alpha_each,
                                     delta=delta).epsilon_lb for n in sizes]

    return Analysis(epsilon, delta, confidence, len(d), len(dp), names, certificates, membership,
                    sizes, curves)
