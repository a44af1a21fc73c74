"""Learned distinguishers (after DP-Sniper, Bichsel et al., IEEE S&P 2021).

A classifier is trained to tell outputs of D from outputs of D′; its probability p(D | output) is
a monotone proxy for the privacy-loss random variable ln(p_D(x)/p_D′(x)) (Neyman–Pearson: the
most powerful events are its super-level sets). The event S = {lo ≤ p(D | x) ≤ hi} is then chosen
on samples the classifier was NOT trained on, and certified on a third, held-out part
(`dpch.audit.stats.certify`). The classifier is a fixed function by the time S is certified, so
the certificate's confidence does not depend on how well (or badly) it was trained.

Two models: logistic regression on standardised values, their squares (two-sided regions such as
"far from the centre", which catch a changed noise scale) and the feature columns of
`stats.FeatureSpec`; and histogram gradient boosting on the raw features (it handles NaN for
groups missing from an output, and learns bit patterns of `lowbit`).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

_CLIP = 30.0


@dataclass
class _Standardiser:
    centre: np.ndarray
    spread: np.ndarray

    @staticmethod
    def fit(x: np.ndarray) -> "_Standardiser":
        # a coordinate absent from every run (all NaN) is handled below; numpy's "All-NaN slice"
        # warning comes through the warnings module, which errstate does not silence
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            centre = np.nanmedian(x, axis=0)
            q75, q25 = np.nanpercentile(x, [75, 25], axis=0)
            spread = q75 - q25
            std = np.nanstd(x, axis=0)
        spread = np.where(np.isfinite(spread) & (spread > 0), spread, np.where(std > 0, std, 1.0))
        centre = np.where(np.isfinite(centre), centre, 0.0)
        return _Standardiser(centre, spread)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        z = (x - self.centre) / self.spread
        return np.clip(np.nan_to_num(z, nan=0.0, posinf=_CLIP, neginf=-_CLIP), -_CLIP, _CLIP)


def _one_thread():
    """sklearn's OpenMP threads spin-wait; on a small shared machine (2 cores, other work) that
    makes histogram boosting 20x slower than one thread. The audit's data are small: use one."""
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1, user_api="openmp")


class Distinguisher:
    name = "distinguisher"

    def fit(self, x_d: np.ndarray, x_dp: np.ndarray) -> "Distinguisher":
        raise NotImplementedError

    def score(self, x: np.ndarray) -> np.ndarray:
        """Estimated Pr[output came from D | output], one value per row, rounded to 1e-10: BLAS
        may evaluate the same row to a different last bit in a different batch, and a score event
        must contain the same outputs on the selection and on the certification samples."""
        return np.round(self._raw_score(x), 10)

    def _raw_score(self, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError


def _labelled(x_d, x_dp):
    x = np.vstack([x_d, x_dp])
    y = np.concatenate([np.ones(len(x_d)), np.zeros(len(x_dp))])
    return x, y


class LogisticDistinguisher(Distinguisher):
    name = "logistic regression"

    def __init__(self, seed: int = 0):
        self.seed = seed

    def _design(self, x):
        z = self._std(x)
        return np.hstack([z, z * z / _CLIP])

    def fit(self, x_d, x_dp):
        from sklearn.linear_model import LogisticRegression

        x, y = _labelled(x_d, x_dp)
        self._std = _Standardiser.fit(x)
        self._model = LogisticRegression(C=10.0, max_iter=2000, random_state=self.seed)
        self._model.fit(self._design(x), y)
        return self

    def _raw_score(self, x):
        return self._model.predict_proba(self._design(x))[:, 1]


class BoostingDistinguisher(Distinguisher):
    name = "gradient boosting"

    def __init__(self, seed: int = 0, max_iter: int = 150):
        self.seed = seed
        self.max_iter = max_iter

    def fit(self, x_d, x_dp):
        from sklearn.ensemble import HistGradientBoostingClassifier

        x, y = _labelled(x_d, x_dp)
        # A column with no value in the training part (a group that appeared only in the other
        # half of the runs) carries nothing to learn, and sklearn's binning rejects it: drop it.
        self._columns = np.flatnonzero(~np.all(np.isnan(x), axis=0))
        if self._columns.size == 0:
            self._model = None  # nothing observed at all: a constant score
            return self
        x = x[:, self._columns]
        self._model = HistGradientBoostingClassifier(
            max_iter=self.max_iter, learning_rate=0.1, max_leaf_nodes=15, min_samples_leaf=40,
            l2_regularization=1.0, early_stopping=False, random_state=self.seed)
        with _one_thread():
            self._model.fit(x, y)
        return self

    def _raw_score(self, x):
        if self._model is None:
            return np.full(len(x), 0.5)
        with _one_thread():
            return self._model.predict_proba(x[:, self._columns])[:, 1]


def make_distinguishers(names: list[str], seed: int = 0) -> list[Distinguisher]:
    table = {"logistic": LogisticDistinguisher, "boosting": BoostingDistinguisher}
    unknown = [n for n in names if n not in table]
    if unknown:
        raise ValueError(f"unknown distinguisher(s) {unknown}; choose from {sorted(table)}")
    return [table[n](seed=seed) for n in names]
