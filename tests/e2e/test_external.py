"""Replicas started by another launcher: Open MPI's mpiexec from Debian (installed by
scripts/setup-system.sh) runs `automlperf worker`, the primary only keeps the clock."""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from automlperf.store import open_store
from automlperf.config import Config
from helpers import cli, cli_args, fast_config, marked_env, sim_config, wait_no_strays

pytestmark = pytest.mark.slow


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def mpiexec():
    path = shutil.which("mpiexec.openmpi") or shutil.which("mpiexec")
    if path is None:
        pytest.fail("mpiexec is not installed (run scripts/setup-system.sh)")
    return path


def test_replicas_started_by_mpiexec_complete_a_run_that_verifies(tmp_path):
    # Each replica trains 4 trials and exits; the session ends when all have.
    config = tmp_path / "fast.toml"
    config.write_text(fast_config(duration_s=900, replicas=2, max_rounds=4, stop_grace_s=15))
    run_dir = tmp_path / "run"
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_plm_rsh_agent="false")  # one node: no ssh
    with open(tmp_path / "primary.log", "wb") as log:
        primary = subprocess.Popen(
            [sys.executable, "-m", "automlperf.cli", "run", "--launcher", "external",
             "--config", config, "--run-dir", run_dir, "--small-task"], stdout=log,
            stderr=subprocess.STDOUT)
    try:
        # The workers may start before the primary has prepared the run: they wait for it.
        with open(tmp_path / "mpiexec.log", "wb") as log:
            workers = subprocess.Popen(
                [mpiexec(), "-n", "2", "--oversubscribe", "--bind-to", "none",
                 sys.executable, "-m", "automlperf.cli", "worker", "--run-dir", run_dir,
                 "--threads", "1", "--wait", "120"],
                stdout=log, stderr=subprocess.STDOUT, env=env)
        assert workers.wait(timeout=900) == 0, (tmp_path / "mpiexec.log").read_text()
        assert primary.wait(timeout=300) == 0, (tmp_path / "primary.log").read_text()
    finally:
        for p in (primary,):
            if p.poll() is None:
                p.kill()
                p.wait()
    primary_log = (tmp_path / "primary.log").read_text()
    assert "waiting for 2 replica(s)" in primary_log and "joined" not in primary_log
    worker_log = (tmp_path / "mpiexec.log").read_text()
    assert "replica 0 (from PMIX_RANK)" in worker_log or \
        "replica 0 (from OMPI_COMM_WORLD_RANK)" in worker_log
    result = json.loads((run_dir / "result.json").read_text())
    assert result["score"] > 0 and result["replicas"] == 2
    store = open_store(run_dir=run_dir)
    assert {t.replica_index for t in store.trials(1)} == {0, 1}
    assert {r.status for r in store.replicas(1)} == {"stopped"}
    # One resource sampler for the node: the replica mpiexec started first there.
    assert store.samples(1) and worker_log.count("sampling the node's resources") == 1
    done = cli("check", run_dir)
    assert done.returncode == 0 and "verified" in done.stdout, done.stdout + done.stderr
    # The MLPerf-style log written at the end passes mlperf-logging's checker with our rules.
    from mlperf_logging.compliance_checker import mlp_compliance

    from automlperf.submission.mlperf import rules_path

    checker = mlp_compliance.make_checker("training", "6.1.0", quiet=True, werror=False)
    assert checker.check_file(str(run_dir / "mllog.txt"), str(rules_path()))
    assert json.loads((run_dir / "system_desc.json").read_text())["number_of_nodes"] == "1"
    # The TPE studies, a journal per replica in the run directory, load with Optuna's own
    # API (what optuna-dashboard shows).
    import optuna
    from optuna.storages.journal import JournalFileBackend

    def journal(index):
        return optuna.storages.JournalStorage(
            JournalFileBackend(str(run_dir / "tpe" / f"replica-{index}.journal")))

    names = {s.study_name for i in (0, 1) for s in optuna.get_all_study_summaries(journal(i))}
    assert names == {"run-1-replica-0", "run-1-replica-1"}
    tuned = [t for t in store.trials(1) if t.hparams["tpe_trial"] is not None]
    for index in (0, 1):
        study = optuna.load_study(study_name=f"run-1-replica-{index}", storage=journal(index))
        numbers = {t.number for t in study.trials}
        assert {t.hparams["tpe_trial"] for t in tuned if t.replica_index == index} <= numbers
        assert all(set(t.params) == {"batch_size", "kernel_size"} for t in study.trials)


def test_a_session_nobody_joins_ends_at_its_deadline_and_says_so(tmp_path):
    config = tmp_path / "fast.toml"
    config.write_text(fast_config(duration_s=3, replicas=2, stop_grace_s=5))
    done = cli("run", "--launcher", "external", "--config", config, "--run-dir",
               tmp_path / "run", "--small-task", timeout=120)
    assert done.returncode == 1 and "only 0 of 2 replica(s) joined" in done.stderr
    assert json.loads((tmp_path / "run" / "result.json").read_text())["score"] == 0


def test_a_worker_without_a_run_gives_up_after_its_wait(tmp_path):
    done = cli("worker", "--run-dir", tmp_path / "none", "--wait", "1", timeout=60)
    assert done.returncode == 1 and "no open session" in done.stderr


def test_a_replica_reads_the_data_where_its_container_mounts_it(tmp_path):
    """A replica whose node sees the run's data folder at another path, as in a container
    that mounts it elsewhere (here a mount namespace: the run's path is an empty folder, the
    data is bound at VIEW): with --data-root VIEW it finds the data and runs; the primary's
    path stays the run's."""
    from trees import WNIDS, make_tree

    data = make_tree(tmp_path / "imagenet", per_class=(4, 2), classes=WNIDS[:10])
    (tmp_path / "empty").mkdir()
    view = tmp_path / "view"
    view.mkdir()
    config = tmp_path / "sim.toml"
    config.write_text(sim_config(sustained_ops=2e14, time_compression=100.0, max_rounds=1,
                                 stop_grace_s=10, image_folders=True, data_dir=data))
    run_dir = tmp_path / "run"
    env, mark = marked_env()
    with open(tmp_path / "primary.log", "wb") as log:
        primary = subprocess.Popen(cli_args("run", "--launcher", "external", "--config", config,
                                            "--run-dir", run_dir, "--unofficial"),
                                   stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        # The data bound at VIEW, then an empty folder over the run's path to it.
        hidden = 'mount --bind "$1" "$0" && mount --bind "$2" "$1" && shift 2 && exec "$@"'
        worker = subprocess.run(
            ["unshare", "--mount", "sh", "-c", hidden, str(view), str(data),
             str(tmp_path / "empty"), *cli_args("worker", "--run-dir", run_dir,
                                                     "--replica-index", "0", "--wait", "300",
                                                     "--data-root", view)],
            capture_output=True, text=True, timeout=600, env=env)
        assert worker.returncode == 0, worker.stdout + worker.stderr
        assert primary.wait(timeout=300) == 0, (tmp_path / "primary.log").read_text()
    finally:
        if primary.poll() is None:
            primary.kill()
            primary.wait()
    wait_no_strays(mark)
    assert f"reading the dataset at {view} (the run's {data})" in worker.stderr
    result = json.loads((run_dir / "result.json").read_text())
    assert result["score"] > 0 and not result["retired"] and not result["failures"]
    assert Config.load(run_dir / "config.toml").data.data_dir == data
