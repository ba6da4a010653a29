"""Analytical operation counting (pure; no torch here)."""

from automlperf.ops.count import WEIGHTS, KindCount, OpCount, count, epoch_ops

__all__ = ["WEIGHTS", "KindCount", "OpCount", "count", "epoch_ops"]
