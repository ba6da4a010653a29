"""Gaussian process regression on a precomputed distance matrix (pure NumPy/SciPy).

The kernel ``k(x, y) = exp(-d(x, y) / length)`` on an edit distance is not guaranteed to be
positive definite, so factorisation may fail. Then jitter grows tenfold and the factorisation
is retried; if that still fails, the matrix is projected onto the nearest positive
semi-definite one. Every observation is kept: nothing is dropped to make the numbers work.

Targets are standardised robustly: centred on their median and scaled by their median
absolute deviation, with values beyond ``clip`` such deviations held at that bound. A search's
history holds a few barely trained models (the seed after its first short round, far below
the rest): centred on the mean and scaled by the standard deviation, those few set the
process's prior scale, so its uncertainty far from the data, and the upper confidence bound's
exploration term with it, came out about eight times the spread among the models that
matter, outweighing any difference in predicted accuracy (bench/RESULTS.md, "Search
quality").
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class GPStats:
    jitter: float = 0.0
    retries: int = 0
    projected: bool = False
    length: float = 1.0


@dataclass
class DistanceGP:
    """Fit with :meth:`fit`, then :meth:`predict` from distances to the fitted points."""

    noise: float = 1e-3
    max_retries: int = 8
    clip: float = 3.0  # robust standard deviations beyond which a target is held
    stats: GPStats = field(default_factory=GPStats)

    def fit(self, distance_matrix: np.ndarray, y: np.ndarray) -> DistanceGP:
        d = np.asarray(distance_matrix, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        n = len(y)
        if d.shape != (n, n):
            raise ValueError(f"distance matrix {d.shape} does not match {n} targets")
        off = d[np.triu_indices(n, 1)]
        positive = off[off > 0]
        length = float(np.median(positive)) if len(positive) else 1.0
        self.stats = GPStats(length=length)
        self._length = length
        self._mean, self._scale = robust_location_scale(y)
        target = np.clip((y - self._mean) / self._scale, -self.clip, self.clip)
        k = np.exp(-d / length)
        self._chol = self._factor(k)
        # scipy.linalg is imported where it is used: processes that import the search
        # package without searching (the primary, `check`) do not pay for it.
        from scipy.linalg import cho_solve

        self._alpha = cho_solve((self._chol, True), target)
        return self

    def _factor(self, k: np.ndarray) -> np.ndarray:
        from scipy.linalg import cholesky

        n = len(k)
        jitter = self.noise
        for attempt in range(self.max_retries + 1):
            try:
                chol = cholesky(k + jitter * np.eye(n), lower=True, check_finite=False)
                self.stats.jitter, self.stats.retries = jitter, attempt
                return chol
            except np.linalg.LinAlgError:
                jitter *= 10.0
        # Nearest positive semi-definite matrix, then the base noise keeps it definite.
        values, vectors = np.linalg.eigh((k + k.T) / 2)
        fixed = (vectors * np.clip(values, 0.0, None)) @ vectors.T
        self.stats.projected, self.stats.retries = True, self.max_retries + 1
        self.stats.jitter = self.noise
        return cholesky(fixed + self.noise * np.eye(n), lower=True, check_finite=False)

    def predict(self, distances: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean and standard deviation at points given by their distances (m, n) to the
        fitted points."""
        from scipy.linalg import solve_triangular

        ks = np.exp(-np.atleast_2d(distances) / self._length)
        mean = ks @ self._alpha
        v = solve_triangular(self._chol, ks.T, lower=True, check_finite=False)
        var = np.clip(1.0 - np.einsum("ij,ij->j", v, v), 1e-12, None)
        return mean * self._scale + self._mean, np.sqrt(var) * self._scale


def robust_location_scale(y: np.ndarray) -> tuple[float, float]:
    """Median and the standard deviation implied by the median absolute deviation (1.4826
    times it, as for a normal sample), falling back on the standard deviation when more than
    half the values are equal, and on 1 when all are."""
    if not len(y):
        return 0.0, 1.0
    centre = float(np.median(y))
    scale = 1.4826 * float(np.median(np.abs(y - centre)))
    if scale <= 1e-12:
        scale = float(y.std())
    return centre, scale if scale > 1e-12 else 1.0


def ucb(mean: np.ndarray, std: np.ndarray, beta: float) -> np.ndarray:
    """Upper confidence bound acquisition."""
    return mean + beta * std
