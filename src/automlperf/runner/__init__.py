"""Processes: the primary and its session's steps, replicas and their wiring, the local,
SLURM and external launchers, the SLURM batch script, and the PostgreSQL command line that
batch scripts of earlier versions call (pgserver.py). The local SLURM cluster that tests and
benchmarks start is automlperf.testing."""
