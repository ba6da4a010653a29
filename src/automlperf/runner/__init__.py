"""Processes: the primary, replicas, local and SLURM launchers, a private PostgreSQL."""
