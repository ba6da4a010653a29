"""Analytical operation counting (pure; no torch here)."""

from automlperf.ops.count import WEIGHTS, KindCount, OpCount, count, epoch_ops, layer_table

__all__ = ["WEIGHTS", "KindCount", "OpCount", "count", "epoch_ops", "layer_table"]
