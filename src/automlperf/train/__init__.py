"""The torch side: building modules from graphs, weight inheritance, data and training."""

from automlperf.train.builder import GraphModule, build_module
from automlperf.train.inherit import inherit

__all__ = ["GraphModule", "build_module", "inherit"]
