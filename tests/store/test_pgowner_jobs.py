"""A private store's folder names the batch job that started its server, under every batch
system automlperf runs on (SLURM, PBS, LSF, Flux), and a later start on another host asks
that system whether the job still runs: a `qdel`, a `bkill` or the walltime then needs no
human to release the store. PBS, LSF and Flux have no Debian 12 packages: their commands are
the stand-ins in tests/standins/, which answer from a file of job states as the real ones
print them. The folder's PostgreSQL is not started (tests/store/test_pgowner.py starts real
servers); what is tested is the claim on the folder."""

from __future__ import annotations

import json
import logging
import os
import socket
from pathlib import Path

import pytest

from automlperf.store import pgowner

STANDINS = Path(__file__).resolve().parents[1] / "standins"


@pytest.fixture
def standins(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", f"{STANDINS}{os.pathsep}{os.environ['PATH']}")
    for name in ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "FLUX_JOB_ID", "FLUX_URI",
                 "FLUX_STANDIN_JOBID", pgowner.FENCE_ENV):
        monkeypatch.delenv(name, raising=False)
    jobs = tmp_path / "jobs"
    for variable in ("PBS_STANDIN_JOBS", "LSF_STANDIN_JOBS", "FLUX_STANDIN_JOBS"):
        monkeypatch.setenv(variable, str(jobs))
    return jobs


def _owned_elsewhere(folder: Path, scheduler: str, job: str, stale_pid: bool = True) -> None:
    """The folder as a server started on another node by ``job`` left it: its owner record,
    and (killed with the job) its postmaster.pid."""
    (folder / "pgdata").mkdir(parents=True)
    record = {"host": "node-17", "node": None, "job": job, "pid": 4242, "started_at": 1.0,
              "scheduler": scheduler}
    (folder / pgowner.OWNER_FILE).write_text(json.dumps(record) + "\n")
    if stale_pid:
        (folder / "pgdata" / "postmaster.pid").write_text("4242\n/data\n")


def test_the_owner_names_the_job_of_every_batch_system(standins, monkeypatch):
    assert pgowner.batch_job({"SLURM_JOB_ID": "12"}) == ("slurm", "12")
    assert pgowner.batch_job({"PBS_JOBID": "12.pbs01"}) == ("pbs", "12.pbs01")
    assert pgowner.batch_job({"LSB_JOBID": "12"}) == ("lsf", "12")
    assert pgowner.batch_job({"FLUX_JOB_ID": "f2xyz"}) == ("flux", "f2xyz")
    # A `flux batch` script's own instance has no FLUX_JOB_ID: it asks the instance.
    env = dict(os.environ, FLUX_URI="local:///tmp/flux-x", FLUX_STANDIN_JOBID="f3abc")
    assert pgowner.batch_job(env) == ("flux", "f3abc")
    assert pgowner.batch_job({}) == (None, None)
    owner = pgowner.here({"PBS_JOBID": "12.pbs01"})
    assert (owner.scheduler, owner.job, owner.node) == ("pbs", "12.pbs01", None)
    assert owner.where() == f"host {socket.gethostname()}, PBS job 12.pbs01"
    # A record written before the batch system was recorded is SLURM's.
    legacy = pgowner.Owner(host="h", node="n1", job="5", pid=1, started_at=0.0)
    assert legacy.system == "slurm" and legacy.where() == "host h, node n1, SLURM job 5"


@pytest.mark.parametrize("scheduler, job, running, ended, stop", [
    ("pbs", "42.pbs01", "R", "F", "qsig -s TERM 42.pbs01"),
    ("lsf", "4242", "RUN", "EXIT", "bkill -s TERM 4242"),
    ("flux", "f2Gnq", "RUN", "INACTIVE", "flux job kill --signal=TERM f2Gnq"),
])
def test_another_hosts_store_is_refused_while_its_job_runs_and_taken_once_it_ended(
        standins, tmp_path, caplog, scheduler, job, running, ended, stop):
    folder = tmp_path / "postgres"
    _owned_elsewhere(folder, scheduler, job)
    name = pgowner.SCHEDULER_NAMES[scheduler]
    standins.write_text(f"{job} {running}\n")
    with pytest.raises(pgowner.StoreInUse) as refused:
        pgowner.claim(folder, sleep=lambda s: pytest.fail("no pause while it runs"))
    text = str(refused.value)
    assert f"{name} job {job} still runs" in text and "would corrupt it" in text
    assert f"({stop})" in text and "\n" not in text
    assert pgowner.read_owner(folder).host == "node-17"
    assert (folder / "pgdata" / "postmaster.pid").exists()

    # The job ended (a qdel, bkill, the walltime): its server's lock file is removed, and the
    # start pauses (logged) for a postmaster still running there to find it gone.
    standins.write_text(f"{job} {ended}\n")
    paused = []
    with caplog.at_level(logging.WARNING, logger="automlperf"):
        me = pgowner.claim(folder, sleep=paused.append)
    assert me.host == socket.gethostname() and pgowner.read_owner(folder) == me
    assert not (folder / "pgdata" / "postmaster.pid").exists()
    assert paused == [pgowner.FENCE_S]
    said = caplog.text
    assert f"removed the postmaster.pid left by host node-17, {name} job {job}" in said
    assert f"{name} job {job} has ended" in said and "waiting 70 s" in said
    assert len(list(folder.glob(pgowner.OWNER_FILE + ".gone-*"))) == 1


@pytest.mark.parametrize("scheduler, job", [("pbs", "43.pbs01"), ("lsf", "4343"),
                                            ("flux", "f2Gnr")])
def test_a_job_the_batch_system_has_forgotten_has_ended(standins, tmp_path, scheduler, job):
    """A job finished long ago drops out of qstat, bjobs and flux jobs ("Unknown Job Id",
    "is not found", "unknown job id"): ended. No postmaster.pid left, no pause."""
    folder = tmp_path / "postgres"
    _owned_elsewhere(folder, scheduler, job, stale_pid=False)
    standins.write_text("1 R\n")
    assert pgowner.job_running(job, scheduler) is False
    pgowner.claim(folder, sleep=lambda s: pytest.fail("no lock file was removed"))


def test_a_host_the_scheduler_lost_touch_with_proves_nothing(standins, tmp_path, monkeypatch):
    """LSF's UNKWN (and ZOMBI): the host's processes may still run. Not proven gone, so the
    start refuses, naming the release an operator makes once that host is known down."""
    folder = tmp_path / "postgres"
    _owned_elsewhere(folder, "lsf", "77")
    standins.write_text("77 UNKWN\n")
    with pytest.raises(pgowner.StoreInUse, match="LSF cannot say whether job 77 still runs.*"
                       "pgserver release --force"):
        pgowner.claim(folder)
    # Without the scheduler's commands on this host, neither.
    monkeypatch.setenv("PATH", "/nonexistent")
    assert pgowner.job_running("77", "lsf") is None and pgowner.job_running("1", "pbs") is None


def test_flux_is_asked_in_the_instance_that_ran_the_job(standins, monkeypatch):
    """A job of the system instance, asked from inside a batch job's own instance, is asked
    of the parent instance (`flux --parent jobs`); from the login node, of its own."""
    standins.write_text("f2Gnq RUN\n")
    assert pgowner.job_running("f2Gnq", "flux") is True
    monkeypatch.setenv("FLUX_STANDIN_JOBID", "f9zzz")  # this process runs inside a job
    calls = []
    real = pgowner._run

    def spy(command, env=None):
        calls.append(command)
        return real(command, env)

    monkeypatch.setattr(pgowner, "_run", spy)
    assert pgowner.job_running("f2Gnq", "flux") is True
    assert ["flux", "--parent", "jobs", "-n", "-o", "{state}", "f2Gnq"] in calls


def test_the_fencing_pause_is_set_in_the_environment_or_refused(monkeypatch):
    assert pgowner.fence_s({}) == pgowner.FENCE_S == 70.0
    assert pgowner.fence_s({pgowner.FENCE_ENV: "2.5"}) == 2.5
    for wrong in ("soon", "-1", "nan", "99999"):
        with pytest.raises(pgowner.UserError, match=f"{pgowner.FENCE_ENV}=.* is not a number"):
            pgowner.fence_s({pgowner.FENCE_ENV: wrong})
