"""Infrastructure for automlperf's own tests and benchmarks, shipped so that both can use it
(as ``optuna.testing`` is): nothing in the product imports it. ``testing.slurm`` runs a real
SLURM cluster of many slurmd daemons on one host."""
