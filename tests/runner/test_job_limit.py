"""A batch job's clock: the session starts only when the run fits in what the job's time
limit leaves after its start-up and before the result must be written."""

import os
import re
import time
from pathlib import Path

import pytest

from automlperf.config import Config
from automlperf.errors import RunFailure, UserError
from automlperf.runner.joblimits import (JOB_END_ENV, SCHEDULERS, STARTUP_S, SchedulerLimit,
                                         batch_job_limit, job_time, lsf_times, margins,
                                         pbs_times, scheduler_time)
from automlperf.runner.session import prepare
from automlperf.runner.slurm import MARGIN_ENV, JobLimit, _slurm_time, job_limit
from helpers import cli


def test_the_jobs_limit_comes_from_slurm():
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_START_TIME": "1000", "SLURM_JOB_END_TIME": "5080",
           MARGIN_ENV: "180"}
    limit = job_limit(env)
    assert (limit.started_at, limit.ends_at, limit.must_end_by) == (1000, 5080, 4900)
    assert job_limit({}) is None
    assert _slurm_time("Unknown") is None
    assert _slurm_time("2026-01-01T12:00:00") == time.mktime((2026, 1, 1, 12, 0, 0, 0, 0, -1))


def test_a_session_the_limit_would_cut_short_is_not_started(tmp_path):
    config = Config.parse({"run": {"duration_s": 600}, "data": {"dataset": "digits"}})
    now = time.time()
    short = JobLimit(started_at=now - 400, ends_at=now + 500, margin_s=180)
    with pytest.raises(RunFailure) as info:
        prepare(config, tmp_path / "run", None, False, {}, limit=short, process_start=now - 30)
    text = str(info.value)
    # The session needs its 600 s and the grace (a quarter) in which epochs in flight finish;
    # 320 s are left when the check runs at once (its own reading of the clock comes later).
    left = re.search(r"leaves (\d+) s for a session that needs 750 s", text)
    assert left and 200 <= int(left.group(1)) <= 320, text
    assert "the clock was not started" in text and "sbatch --time=0:23:00" in text
    assert not (tmp_path / "run" / "run.json").exists()  # nothing of a run was written
    room = JobLimit(started_at=now - 60, ends_at=now + 1000, margin_s=180)
    session = prepare(config, tmp_path / "run", None, False, {}, limit=room, process_start=now - 30)
    assert session.deadline_at - session.started_at == 600
    assert session.startup["before_clock_s"] >= 30
    session.store.close()


STANDINS = Path(__file__).resolve().parents[1] / "standins"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def standin_env(**env):
    """The schedulers' own commands (tests/standins: qstat, bjobs, flux) on the PATH."""
    return {**os.environ, "PATH": f"{STANDINS}{os.pathsep}{os.environ['PATH']}", **env}


def test_the_limit_of_a_pbs_lsf_or_flux_job_is_asked_of_its_scheduler():
    """qstat -f (the walltime and the walltime used), bjobs -o (the run limit and the run
    time) and flux job timeleft, as the primary of an example script asks them."""
    now = time.time()
    for env, scheduler, left in (
            ({"PBS_JOBID": "42.pbs", "PBS_STANDIN_WALLTIME": "01:24:00",
              "PBS_STANDIN_USED": "00:02:00"}, "pbs", 82 * 60),
            ({"LSB_JOBID": "42", "LSF_STANDIN_RUNLIMIT": "01:24:00",
              "LSF_STANDIN_RUNTIME": "00:02:00"}, "lsf", 82 * 60),
            # A `flux batch` script: its instance's FLUX_URI, no FLUX_JOB_ID.
            ({"FLUX_URI": "local:///run/flux", "FLUX_STANDIN_TIMELEFT": "4920.5"}, "flux", 4920.5)):
        limit = batch_job_limit(standin_env(**env), process_start=now - 30)
        assert isinstance(limit, SchedulerLimit) and limit.scheduler == scheduler
        assert limit.ends_at - now == pytest.approx(left, abs=30)
        assert limit.must_end_by == limit.ends_at - 180
    # No limit, or no answer: nothing to hold the clock to.
    for env in ({"PBS_JOBID": "42.pbs"}, {"LSB_JOBID": "42"}, {"FLUX_JOB_ID": "f42"},
                {"FLUX_URI": "local:///run/flux", "FLUX_STANDIN_TIMELEFT": "inf"},
                {"PBS_JOBID": "42.pbs", "PATH": "/nonexistent"}, {}):
        assert batch_job_limit(standin_env(**env)) is None, env


def test_a_stated_end_holds_for_any_scheduler_and_a_wrong_one_is_named():
    limit = batch_job_limit({JOB_END_ENV: "1800000000", "SLURM_JOB_ID": "7"}, process_start=1000)
    assert (limit.started_at, limit.ends_at, limit.scheduler) == (1000, 1.8e9, "stated")
    for wrong in ("in an hour", "inf", "nan", "3600", "1795000000000"):  # ms, a duration
        with pytest.raises(UserError, match=f"{JOB_END_ENV}='{wrong}' is not the job's end in "
                                            "seconds since 1970"):
            batch_job_limit({JOB_END_ENV: wrong})
    with pytest.raises(UserError, match=f"{MARGIN_ENV}='soon' is not a number of seconds"):
        batch_job_limit({MARGIN_ENV: "soon", "PBS_JOBID": "1"})


def test_the_output_of_the_schedulers_is_read_as_they_print_it():
    qstat = ("Job Id: 7.pbs01\n    Job_Name = automlperf\n    resources_used.walltime = 00:10:30\n"
             "    Resource_List.walltime = 100:00:00\n    Resource_List.ncpus = 64\n")
    assert pbs_times(qstat) == (360000, 630)
    assert pbs_times("Job Id: 7\n    resources_used.walltime = 00:10:30\n") is None
    assert lsf_times("01:30:00 00:00:12\n") == (5400, 12)
    assert lsf_times("01:30:00/hostA 00:00:12") == (5400, 12)  # ABS_RUNLIMIT's host
    assert lsf_times("- 00:00:12") is None and lsf_times("") is None


def test_a_refusal_names_the_schedulers_option_with_the_time_it_needs(tmp_path):
    config = Config.parse({"run": {"duration_s": 600}, "data": {"dataset": "digits"}})
    now = time.time()
    for scheduler, option in (("pbs", "`qsub -l walltime=00:23:00`"), ("lsf", "`bsub -W 0:23`"),
                              ("flux", "`flux batch -t 23m`")):
        short = SchedulerLimit(now - 400, now + 500, 180, scheduler=scheduler)
        with pytest.raises(RunFailure, match=f"the clock was not started: submit it again with "
                                             f"{re.escape(option)} or more$"):
            prepare(config, tmp_path / "run", None, False, {}, limit=short)


def test_job_time_is_what_a_slurm_job_is_given_and_the_examples_ask_for_it():
    settings = Config.parse({"run": {"duration_s": 3600}})
    held = job_time(settings)
    assert held.limit_s == margins(3600 + 900)[0]  # the limit `automlperf slurm` sets
    assert (held.startup_s, held.duration_s, held.grace_s) == (STARTUP_S, 3600, 900)
    assert [scheduler_time(held.limit_s, s) for s in SCHEDULERS] == [
        "1:24:00", "01:24:00", "1:24", "84m"]
    assert job_time(settings, stage_s=1200).limit_s == held.limit_s + 1200
    # The example scripts' own limit: their default duration (1h) and 6 minutes to scan the
    # data inside the job.
    assert [scheduler_time(job_time(settings, scan_s=360).limit_s, s) for s in SCHEDULERS] == [
        "1:30:00", "01:30:00", "1:30", "90m"]
    lines = {"pbs": "#PBS -l walltime=01:30:00", "lsf": "#BSUB -W 1:30", "flux": "#flux: -t 90m"}
    for scheduler, line in lines.items():
        script = (EXAMPLES / scheduler / f"automlperf.{scheduler}").read_text()
        assert line in script.splitlines() and "DURATION=${DURATION:-1h}" in script


def test_the_job_time_command_prints_the_limit_alone():
    done = cli("job-time", "--duration", "4h", "--scheduler", "pbs")
    assert done.returncode == 0 and done.stdout == "05:15:00\n", done.stdout + done.stderr
    assert "run 240 min, epochs in flight 60 min" in done.stderr
    bad = cli("job-time", "--scheduler", "pbx")
    assert bad.returncode != 0 and "--scheduler pbx: one of slurm, pbs, lsf, flux" in bad.stderr


def test_a_replica_with_other_automlperf_code_than_the_runs_is_refused_before_it_trains():
    from automlperf.measure.provenance import software
    from automlperf.runner.worker import SoftwareMismatch, refuse_other_code

    mine = software()
    refuse_other_code({"source_hash": mine["source_hash"], "automlperf_version": "x"})
    refuse_other_code({})  # a run from before provenance was kept
    with pytest.raises(SoftwareMismatch, match=r"this node's automlperf \(.*\) is not the "
                                               r"run's \(0.1, sha256:000000000000\): install "
                                               "the run's automlperf here and in the image"):
        refuse_other_code({"source_hash": "sha256:" + "0" * 64, "automlperf_version": "0.1"})
