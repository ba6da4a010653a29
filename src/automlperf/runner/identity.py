"""Which replica this process is, from the environment of whatever launcher started it.

Every launcher sets a rank variable. The launchers that start processes directly come
first: ``mpiexec`` run inside a SLURM allocation leaves the batch step's ``SLURM_PROCID``
(0 in every process) in the environment, while its own rank variable is the true one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from automlperf.errors import UserError

# (variable, launcher) in the order they are trusted.
RANK_VARIABLES: list[tuple[str, str]] = [
    ("PMIX_RANK", "PMIx (Open MPI 5, srun --mpi=pmix, PBS Pro)"),
    ("OMPI_COMM_WORLD_RANK", "Open MPI mpiexec"),
    ("PMI_RANK", "MPICH / Intel MPI mpiexec (Hydra)"),
    ("PALS_RANKID", "HPE PALS mpiexec (PBS Pro on Cray EX)"),
    ("FLUX_TASK_RANK", "Flux"),
    ("JOB_COMPLETION_INDEX", "Kubernetes Indexed Job"),
]


class IdentityError(UserError, ValueError):
    """A rank variable holds something other than a non-negative integer."""


def _rank(env: Mapping[str, str], name: str) -> int:
    value = env[name].strip()
    if not value.isdigit():
        raise IdentityError(f"{name}={env[name]!r} is not a replica number: unset it or pass "
                            "--replica-index")
    return int(value)


def replica_identity(env: Mapping[str, str] | None = None) -> tuple[int, str]:
    """(index, where it came from): the first rank variable set, else SLURM's numbering
    (task rank, or the node's position in the job), else 0 for a lone replica."""
    env = os.environ if env is None else env
    for name, _ in RANK_VARIABLES:
        if name in env:
            return _rank(env, name), name
    if "SLURM_JOB_ID" in env:
        from automlperf.runner.slurm import replica_index

        return replica_index(env), "SLURM"
    return 0, "default (no launcher variable set)"


# A process's rank among those its launcher started on the same node.
LOCAL_RANK_VARIABLES = ["OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PALS_LOCAL_RANKID",
                        "FLUX_TASK_LOCAL_ID", "SLURM_LOCALID"]


# How many processes its launcher started on the same node.
LOCAL_SIZE_VARIABLES = ["AUTOMLPERF_LOCAL_REPLICAS", "OMPI_COMM_WORLD_LOCAL_SIZE",
                        "MPI_LOCALNRANKS", "SLURM_STEP_TASKS_PER_NODE"]


def local_size(env: Mapping[str, str] | None = None) -> int:
    """Replicas on this node as far as the launcher says (1 when none does)."""
    env = os.environ if env is None else env
    for name in LOCAL_SIZE_VARIABLES:
        first = env.get(name, "").split("(")[0].split(",")[0].strip()
        if first.isdigit():
            return max(1, int(first))
    return 1


def local_rank(env: Mapping[str, str] | None = None) -> int:
    """0 for the first process on its node (or when no launcher says), else its position."""
    env = os.environ if env is None else env
    for name in LOCAL_RANK_VARIABLES:
        if env.get(name, "").strip().isdigit():
            return int(env[name])
    return 0
