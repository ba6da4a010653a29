"""Predicting where a short training would have ended (the warm-up rounds' ranking signal).

Rounds 0-2 train a fraction of the epoch budget, so their accuracy is under-trained. The
search ranks them by a *predicted* accuracy: a saturating learning curve
``a - b * (epoch + 1) ** -c`` fitted to the running best, extrapolated to the full budget,
and taken only halfway (conservative), never below what was measured and never more than
halfway to 100 %. The score always uses measured accuracy.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np


def _curve(epoch: np.ndarray, a: float, b: float, c: float) -> np.ndarray:
    return a - b * np.power(epoch + 1.0, -c)


def predict_final(accuracies: Sequence[float], target_epochs: int) -> float | None:
    """The conservative prediction of accuracy after ``target_epochs`` epochs."""
    if not accuracies:
        return None
    best_so_far = np.maximum.accumulate(np.asarray(accuracies, dtype=np.float64))
    best = float(best_so_far[-1])
    if len(best_so_far) < 3 or target_epochs <= len(best_so_far):
        return best
    from scipy.optimize import curve_fit

    x = np.arange(len(best_so_far), dtype=np.float64)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            params, _ = curve_fit(_curve, x, best_so_far, p0=(min(1.0, best + 0.1), 0.5, 0.5),
                                  bounds=([0.0, 0.0, 0.01], [1.0, 5.0, 3.0]), maxfev=2000)
    except (RuntimeError, ValueError):
        return best
    fitted = float(_curve(np.array([target_epochs - 1.0]), *params)[0])
    if not np.isfinite(fitted):
        return best
    gain = max(0.0, fitted - best) / 2
    return min(best + gain, best + (1.0 - best) / 2)
