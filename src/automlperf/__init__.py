"""automlperf: an AutoML benchmark that scores AI computers in operations per second."""

__version__ = "0.1.0"
