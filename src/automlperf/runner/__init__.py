"""Processes: the primary and its session's steps, replicas and their wiring, the local,
SLURM and external launchers, a local SLURM cluster for tests and benchmarks, and the
PostgreSQL command line that batch scripts of earlier versions call (pgserver.py)."""
