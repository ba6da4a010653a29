"""Nodes lost on a real SLURM cluster of slurmd daemons on this host, in one job of three
nodes (simulated accelerators on an ImageNet-layout folder): n3 cannot see the data folder
(its slurmd runs in a mount namespace where the folder is empty), so the health sweep before
the clock names it, and the job (`--exclude-bad-nodes`) leaves it out; n2 dies mid-run as a
machine does (its slurmd and its job step killed, outright, the node marked down after
SlurmdTimeout). The job survives it (--no-kill), runs to its deadline on n1, and the run
verifies. (Without the option, n3's replica would start and retire, naming the same cause:
tests/e2e/test_examples.py, for the other launchers.)"""

import json
import re
import time

import pytest

from automlperf.testing.slurm import fail_node, node_state
from automlperf.store.opening import run_store
from helpers import cli, sim_config, wait_for
from trees import WNIDS, make_tree
from helpers import opened
from test_slurm import wait_job

pytestmark = [pytest.mark.slow, pytest.mark.slurm]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from automlperf.testing.slurm import SlurmError, start_slurm, stop_slurm

    data = make_tree(tmp_path_factory.mktemp("data") / "imagenet", per_class=(4, 2),
                     classes=WNIDS[:10])
    try:
        env = start_slurm(tmp_path_factory.mktemp("slurm3loss"), 3, "amploss",
                          slurmd_timeout_s=20, hidden={"n3": [data]})
    except SlurmError as exc:
        pytest.fail(str(exc))
    yield env, data
    stop_slurm(env)


def test_a_dead_node_and_a_node_without_data_cost_one_replica_each(cluster, tmp_path):
    env, data = cluster
    # The node is marked down about 40 s into the run on an idle machine (SlurmdTimeout and
    # a ping after the kill): the deadline leaves room for a loaded one. The epoch in flight
    # there gets a short grace, which is not what this test is about.
    (tmp_path / "sim.toml").write_text(sim_config(sustained_ops=2e14, time_compression=100.0,
                                                  lease_timeout_s=10, stop_grace_s=10,
                                                  deadline_grace_s=2))
    run_dir = tmp_path / "run"
    done = cli("slurm", "--nodes", 3, "--duration", "80s", "--dataset", "imagenet", "--data-dir",
               data, "--config", tmp_path / "sim.toml", "--run-dir", run_dir,
               "--exclude-bad-nodes", "--submit", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    job = re.search(r"submitted job (\d+)", done.stdout).group(1)
    store = opened(run_dir)

    wait_for(lambda: any(t.replica_index == 1 and t.epochs_done >= 1 for t in store.trials(1)),
             600, "replica 1 to finish an epoch")
    assert sorted(r.index for r in store.replicas(1)) == [0, 1]  # none on n3
    store.close()  # the job stops its private server at its end
    killed_at = time.time()
    fail_node(env, "n2")
    gone_at = time.time()  # the node's processes are killed by now
    wait_for(lambda: node_state(env, "n2").startswith("down"), 300, "n2 to be marked down")
    assert wait_job(job, env) == "COMPLETED"  # the job outlived its node (--no-kill)

    out = (run_dir / "logs" / f"slurm-{job}.out").read_text()
    assert "automlperf primary finished with status 0" in out, out
    # Named before the clock, with why, and left out.
    assert ("health sweep: 1 of 3 node(s) cannot train (left out of the run): n3\n"
            f"  n3: the dataset is not on this node (n3): {data}/train not found") in out, out
    assert json.loads((run_dir / "job.json").read_text())["excluded"] == ["n3"]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["replicas"] == 2 and not result["retired"] and not result["failures"]
    assert result["elapsed_s"] >= 80 and not result["interrupted"] and result["score"] > 0
    with run_store(run_dir) as store:
        trials = store.trials(1)
    assert all(t.created_at <= gone_at for t in trials if t.replica_index == 1)
    assert any(t.replica_index == 0 and t.created_at > killed_at for t in trials)
    assert not any(t.status == "running" for t in trials)
    done = cli("check", run_dir, timeout=300)
    assert done.returncode == 0 and "verified" in done.stdout, done.stdout + done.stderr
