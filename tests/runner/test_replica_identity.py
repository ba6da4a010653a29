"""A replica learns its number from whichever launcher started it."""

import pytest

from automlperf.runner.identity import RANK_VARIABLES, IdentityError, local_rank, replica_identity


@pytest.mark.parametrize("variable", [name for name, _ in RANK_VARIABLES])
def test_each_launchers_rank_variable_names_the_replica(variable):
    assert replica_identity({variable: "3"}) == (3, variable)


def test_an_mpi_rank_wins_over_the_slurm_batch_steps_procid():
    # mpiexec inside an sbatch script: every rank inherits the batch step's SLURM_PROCID=0.
    env = {"SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "1",
           "SLURM_NODEID": "0", "OMPI_COMM_WORLD_RANK": "5", "PMIX_RANK": "5"}
    assert replica_identity(env) == (5, "PMIX_RANK")


def test_slurm_task_rank_of_a_many_task_step():
    env = {"SLURM_JOB_ID": "7", "SLURM_PROCID": "2", "SLURM_STEP_NUM_TASKS": "4"}
    assert replica_identity(env) == (2, "SLURM")


def test_slurm_node_position_of_a_one_task_step():
    env = {"SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "1",
           "SLURM_NODEID": "1"}
    assert replica_identity(env) == (1, "SLURM")


def test_a_lone_replica_is_number_zero():
    index, source = replica_identity({})
    assert index == 0 and "no launcher variable" in source


def test_a_garbled_rank_is_refused_with_the_fix():
    with pytest.raises(IdentityError, match="FLUX_TASK_RANK='x1'.*--replica-index"):
        replica_identity({"FLUX_TASK_RANK": "x1"})


def test_the_first_process_on_a_node_is_local_rank_zero():
    assert local_rank({"OMPI_COMM_WORLD_LOCAL_RANK": "1"}) == 1
    assert local_rank({"FLUX_TASK_LOCAL_ID": "0", "OMPI_COMM_WORLD_RANK": "7"}) == 0
    assert local_rank({}) == 0
