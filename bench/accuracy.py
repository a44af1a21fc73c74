"""Accuracy of released values against the truth, and DPCH's noise variance against the optimum.

numpy only (the peers' virtualenvs import this module too).

For each (system, query, ε) the harness feeds every repetition's released values into an
`Accumulator`, keyed per group. Reported per statistic:
- `rmse`: sqrt of the mean squared error over all repetitions and released keys (total error:
  noise + any bias from contribution bounding or clipping);
- `rel_err`: mean of |error| / |truth| over keys whose truth is non-zero;
- `noise_var`: the per-key sample variance across repetitions, averaged over keys (a
  deterministic per-key bias, e.g. rows removed by DPCH's keyed-hash bounding, does not count);
- `bias_rms`: root mean square over keys of the per-key mean error;
- `released`: fraction of (key, repetition) pairs with a value (SmartNoise omits empty keys);
- `mse_se`: standard error of the MSE estimate (used to tell a real RMSE difference from noise:
  errors are i.i.d. across repetitions, approximately independent across keys).

Theoretical noise variance (`theory_*`):
- continuous Laplace with scale b = Δ/ε: 2b²;
- discrete Laplace on the integers with scale b (pmf ∝ exp(-|k|/b)): 2e^{-1/b}/(1-e^{-1/b})²,
  slightly below 2b². DPCH samples the discrete Laplace (CKS20 Alg. 2), on integers for counts
  and on a 2^-11 fixed-point grid for `dp_sum(x, 0, 500, ε)` (docs/NOISE.md).
The *optimum* we compare DPCH to is the discrete Laplace at exactly b = Δ/ε on DPCH's own output
grid — the least-variance Laplace-family noise for that ε and sensitivity on that grid. DPCH's
actual scale is b·(1 + O(2^-39)) (calibration absorbs the grid rounding), so the ratio should be
1 up to sampling error.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def laplace_var(b: float) -> float:
    return 2.0 * b * b


def discrete_laplace_var(b: float) -> float:
    """Variance of the discrete Laplace with pmf ∝ exp(-|k|/b) on the integers (CKS20 §2.2)."""
    q = math.exp(-1.0 / b)
    return 2.0 * q / (1.0 - q) ** 2


def dpch_sum_grid(lo: float, hi: float) -> float:
    """The fixed-point grid of `dp_sum` (`dpch_fixed_grid(max(|lo|, |hi|))`): 2^(floor(log2 m)+1-20)."""
    m = max(abs(lo), abs(hi), 1e-290)
    return 2.0 ** (math.floor(math.log2(m)) + 1 - 20)


def dpch_optimum_var(stat: str, sensitivity: float, eps: float, grid: float = 1.0) -> float:
    """Discrete Laplace at exactly Δ/ε on a grid of `grid` (in output units)."""
    b_units = (sensitivity / grid) / eps
    return grid * grid * discrete_laplace_var(b_units)


@dataclass
class StatSummary:
    rmse: float
    rel_err: float
    noise_var: float
    bias_rms: float
    released: float
    reps: int
    keys: int
    mse_se: float  # standard error of the MSE estimate (from the 4th moment of the errors)

    def as_dict(self) -> dict:
        return dict(self.__dict__)


class Accumulator:
    def __init__(self, truth: dict[str, list[float]]):
        self.truth = {s: np.asarray(v, dtype=float) for s, v in truth.items()}
        k = {s: len(v) for s, v in self.truth.items()}
        self.n = {s: np.zeros(k[s]) for s in self.truth}
        self.s1 = {s: np.zeros(k[s]) for s in self.truth}
        self.s2 = {s: np.zeros(k[s]) for s in self.truth}
        self.s4 = {s: 0.0 for s in self.truth}
        self.abs_rel = {s: 0.0 for s in self.truth}
        self.abs_rel_n = {s: 0 for s in self.truth}
        self.reps = 0

    def add(self, released: dict[str, list[float]]) -> None:
        self.reps += 1
        for s, t in self.truth.items():
            v = np.asarray(released[s], dtype=float)
            ok = ~np.isnan(v)
            err = np.where(ok, v - t, 0.0)
            self.n[s] += ok
            self.s1[s] += err
            self.s2[s] += err * err
            self.s4[s] += float(np.sum(err ** 4))
            nz = ok & (t != 0)
            self.abs_rel[s] += float(np.sum(np.abs(err[nz]) / np.abs(t[nz])))
            self.abs_rel_n[s] += int(nz.sum())

    def summary(self) -> dict[str, dict]:
        out = {}
        for s in self.truth:
            n, s1, s2 = self.n[s], self.s1[s], self.s2[s]
            tot = n.sum()
            rmse = math.sqrt(s2.sum() / tot) if tot else math.nan
            have = n >= 2
            mean = np.where(n > 0, s1 / np.maximum(n, 1), 0.0)
            var = np.where(have, (s2 - n * mean * mean) / np.maximum(n - 1, 1), 0.0)
            noise_var = float(var[have].mean()) if have.any() else math.nan
            bias_rms = float(np.sqrt(np.mean(mean[n > 0] ** 2))) if (n > 0).any() else math.nan
            rel = self.abs_rel[s] / self.abs_rel_n[s] if self.abs_rel_n[s] else math.nan
            released = float(tot / (self.reps * len(n))) if self.reps else math.nan
            mse = s2.sum() / tot if tot else math.nan
            mse_se = math.sqrt(max(self.s4[s] / tot - mse * mse, 0.0) / tot) if tot else math.nan
            out[s] = StatSummary(rmse, rel, noise_var, bias_rms, released, self.reps, len(n), mse_se).as_dict()
        return out
