"""The replicas of one SLURM job step as supervision sees them, from what the step leaves:
each task's exit status in the logs, srun's word that a node was lost, srun's own end. The
step here is a plain process standing in for srun; tests/cluster/test_slurm.py runs the
launcher's real step on a local SLURM cluster."""

import subprocess
import sys

import pytest

from automlperf.runner import slurm
from automlperf.runner.slurm import NODE_LOST, SlurmLauncher, StepTask


@pytest.fixture
def launcher(tmp_path, monkeypatch):
    monkeypatch.setattr(slurm, "REFRESH_S", 0.0)  # every look reads afresh
    (tmp_path / "logs").mkdir()
    made = SlurmLauncher(tmp_path, None, nodes=["n1", "n2", "n3"])
    made.procs = [StepTask(made, i) for i in range(3)]
    yield made
    if made.srun is not None and made.srun.poll() is None:
        made.srun.kill()
        made.srun.wait()


def test_each_replica_ends_by_its_own_status_or_its_lost_node(launcher):
    release = launcher.run_dir / "release"
    launcher.srun = subprocess.Popen([sys.executable, "-c", "import pathlib, time\n"
                                      f"while not pathlib.Path({str(release)!r}).exists(): "
                                      "time.sleep(0.05)"])
    logs = launcher.logs
    assert [p.poll() for p in launcher.procs] == [None, None, None]
    (logs / "replica-1.exit").write_text("3\n")
    assert launcher.states() == ["up", "exited", "up"]
    (logs / "srun.log").write_text("srun: error: n2: task 1: Exited with exit code 3\n"
                                   "srun: error: Node failure on n3\n")
    assert [p.poll() for p in launcher.procs] == [None, 3, NODE_LOST]
    assert launcher.states() == ["up", "exited", "node lost"]
    with pytest.raises(subprocess.TimeoutExpired):
        launcher.procs[0].wait(0.3)
    # The step ends with every task: one whose status is not seen (yet) takes srun's, here
    # 0, that of a step whose every task exited 0.
    release.touch()
    launcher.srun.wait()
    assert [p.wait(5) for p in launcher.procs] == [0, 3, NODE_LOST]
    assert launcher.alive() == [False, False, False]


def test_a_task_killed_with_its_shell_is_seen_gone_from_sruns_word(launcher):
    """A replica killed outright with the shell around it (its process group SIGKILLed, the
    kernel's OOM killer) writes no status: srun's line says it, before the step ends."""
    from automlperf.runner.session import gone

    launcher.srun = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    (launcher.logs / "srun.log").write_text("srun: error: n3: task 2: Killed\n"
                                            "srun: error: n2: task 1: Segmentation fault "
                                            "(core dumped)\n")
    assert [p.poll() for p in launcher.procs] == [None, -11, -9]
    assert launcher.states() == ["up", "exited", "exited"]
    announced = set()
    lines = gone(launcher, launcher.states(), announced, 60)
    assert [line.split(" ", 1)[1] for line in lines] == [
        "replica 1: killed by signal 11; its trial in flight fails when its lease lapses, "
        "and the run goes on",
        "replica 2: killed by signal 9; its trial in flight fails when its lease lapses, and "
        "the run goes on"]
    assert gone(launcher, launcher.states(), announced, 60) == []  # once each
    launcher.srun.kill()
    launcher.srun.wait()


def test_an_earlier_jobs_words_in_sruns_log_are_not_this_steps(tmp_path, monkeypatch):
    """srun's log is appended to by every job of a run: the tasks an earlier job's stop
    ended, and a node it lost, are nothing of this step's."""
    monkeypatch.setattr(slurm, "REFRESH_S", 0.0)
    monkeypatch.setattr(slurm, "node_names", lambda env=None: ["n1", "n2"])
    monkeypatch.setattr(slurm.SlurmLauncher, "command", lambda self, *a, **k: [
        sys.executable, "-c", "import time; time.sleep(60)"])
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "2")
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "srun.log").write_text("srun: error: n1: task 0: Terminated\n"
                                                "srun: error: Node failure on n2\n")
    launcher = SlurmLauncher(tmp_path, None)
    launcher.start()
    try:
        assert launcher.states() == ["up", "up"]
        with open(tmp_path / "logs" / "srun.log", "a") as log:
            log.write("srun: error: n2: task 1: Killed\n")
        assert launcher.states() == ["up", "exited"]
    finally:
        launcher.srun.kill()
        launcher.srun.wait()


def test_a_step_stopped_by_a_signal_ends_every_replica_without_a_status(launcher):
    launcher.srun = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    (launcher.logs / "replica-0.exit").write_text("0\n")
    launcher.stop(5)
    stopped = launcher.srun.returncode
    assert stopped != 0 and [p.poll() for p in launcher.procs] == [0, stopped, stopped]
