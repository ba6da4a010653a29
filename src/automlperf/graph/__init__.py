"""The framework-neutral architecture graph (no torch here)."""

from automlperf.graph.graph import INPUT, SCHEMA_VERSION, Graph, GraphError, Layer
from automlperf.graph import seeds

__all__ = ["INPUT", "SCHEMA_VERSION", "Graph", "GraphError", "Layer", "seeds"]
