"""A run longer than a partition lets a job last, split into a chain of jobs: how many, what
each holds, the script's part in it, and the clock a job of the chain may start. The chain
itself, submitted to SLURM and stopped by it, is tested in tests/cluster/test_chain_of_jobs.py."""

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from automlperf.config import Config
from automlperf.errors import RunFailure
from automlperf.runner.chain import chain_limit, plan_chain, slurm_duration, submit_chain
from automlperf.runner.joblimits import (CHAIN_ENV, CHAIN_FILE, MIN_LINK_RUN_S, OVER_FILE,
                                         batch_job_limit)
from automlperf.runner.resubmit import resume_job
from automlperf.runner.sbatch import ScriptOptions, write_job
from automlperf.runner.session import prepare
from automlperf.runner.slurm import JobLimit, SlurmError
from helpers import cli


def test_a_chain_holds_the_run_and_its_grace_with_a_job_to_spare():
    # 4 h of run and 1 h of grace in jobs of 2 h: 2 h - 5 min - 7.5 min - 1 min = 106.5 min
    # of run each, three jobs, and a spare.
    plan = plan_chain(5 * 3600, 2 * 3600, 300, 450)
    assert plan.run_per_link_s == 7200 - 300 - 450 - 60
    assert plan.links == 4
    assert "a chain of 4 jobs of 2:00:00" in plan.describe()
    # A limit in seconds is cut to SLURM's whole minutes, never rounded up past it.
    assert plan_chain(600, 7259, 300, 120).limit_s == 7200
    # One job's run that holds the whole run still gets its spare.
    assert plan_chain(600, 7200, 300, 120).links == 2


def test_a_limit_that_leaves_a_chains_jobs_no_run_is_refused_in_one_line():
    with pytest.raises(SlurmError) as info:
        plan_chain(3600, 8 * 60, 300, 120)
    text = str(info.value)
    assert "leaves 0 s of run in each job" in text and "\n" not in text
    assert f"at least 0:{(300 + 180 + int(MIN_LINK_RUN_S)) // 60:02d}:00" in text


def test_slurm_times_as_sinfo_prints_them():
    assert slurm_duration("30") == 1800  # minutes
    assert slurm_duration("30:15") == 1815  # minutes:seconds
    assert slurm_duration("2:00:00") == 7200
    assert slurm_duration("1-00:00:00") == 86400
    assert slurm_duration("2-12") == 2.5 * 86400  # days-hours
    assert slurm_duration("infinite") is None and slurm_duration("UNLIMITED") is None


STANDINS = Path(__file__).resolve().parents[1] / "standins"


def test_the_chains_limit_is_the_partitions_maximum_unless_given(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{STANDINS}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SINFO_STANDIN", "debug* infinite\nshort 4:00:00\nlong 2-00:00:00")
    assert chain_limit(None, "short") == 4 * 3600
    assert chain_limit(None, "long") == 2 * 86400
    assert chain_limit("90m", "short") == 5400
    with pytest.raises(SlurmError, match="partition debug sets no maximum time .* leave out --chain"):
        chain_limit(None, None)
    with pytest.raises(SlurmError, match="sinfo shows no partition gpu: give --partition"):
        chain_limit(None, "gpu")
    # A login node whose SLURM is not set up: sinfo's last word, on one line.
    monkeypatch.setenv("SINFO_STANDIN_FAIL", "sinfo: error: fetch_config: DNS SRV lookup failed\n"
                       "sinfo: fatal: Could not establish a configuration source")
    with pytest.raises(SlurmError) as info:
        chain_limit(None, None)
    assert str(info.value) == ("sinfo failed (sinfo: fatal: Could not establish a configuration "
                               "source): give --time-limit, the partition's maximum time, with "
                               "--chain")


def _script(tmp_path, **options):
    return write_job(ScriptOptions(tmp_path / "run", nodes=2, duration_s=4 * 3600,
                                   store_url=f"sqlite:///{tmp_path}/store.db", **options))


def test_a_chains_script_has_the_jobs_limit_and_ends_the_chain_when_the_run_ends(tmp_path):
    written = _script(tmp_path, time_limit_s=2 * 3600, chain=True)
    assert written.chain is not None and written.time_limit_s == 7200
    text = written.script.read_text()
    assert "#SBATCH --time=2:00:00" in text
    assert "# automlperf: start-up allowance 300 s" in text
    assert f'if [ -n "${{{CHAIN_ENV}:-}}" ] && [ -f "$RUN_DIR/{OVER_FILE}" ]' in text
    assert f'"$RUN_DIR/{CHAIN_FILE}"' in text
    # Without --chain, the same limit is refused with the way out.
    with pytest.raises(SlurmError, match="or pass --chain to split the run into jobs"):
        _script(tmp_path / "other", time_limit_s=2 * 3600)


def test_the_script_of_a_chains_job_does_nothing_once_the_run_is_over(tmp_path):
    """The script's own lines, run by bash: a job of a chain that starts after the run ended
    (its predecessor finished it and could not cancel it in time) exits at once; a job
    outside a chain ignores the mark."""
    script = _script(tmp_path, time_limit_s=2 * 3600, chain=True).script
    (script.parent / OVER_FILE).write_text("ended in job 7 with status 0\n")
    env = {**os.environ, "SLURM_JOB_ID": "8", CHAIN_ENV: "1"}
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0
    assert "automlperf job 8: nothing left to run (ended in job 7 with status 0)" in done.stdout
    assert not (script.parent / "postgres").exists() or not any((script.parent / "postgres").iterdir())


def test_a_chain_is_submitted_each_job_after_the_last(tmp_path):
    script = _script(tmp_path, time_limit_s=2 * 3600, chain=True)
    (script.script.parent / OVER_FILE).write_text("an earlier chain's\n")
    asked = []

    def sbatch(path, options):
        asked.append(options)
        return str(100 + len(asked))

    jobs = submit_chain(script.script, script.chain, ["--partition=short"], sbatch)
    assert jobs == ["101", "102", "103", "104"]
    # Each job's signal comes its lead before its limit: what writing the result takes
    # (nothing measured yet: the floor), not a share of the whole run.
    assert asked[0] == ["--time=2:00:00", "--signal=B:TERM@120",
                        f"--export=ALL,{CHAIN_ENV}=1,AUTOMLPERF_LINK_MARGIN_S=180",
                        "--partition=short"]
    assert asked[2][-2:] == ["--dependency=afterany:102", "--kill-on-invalid-dep=yes"]
    assert (script.script.parent / CHAIN_FILE).read_text() == "101\n102\n103\n104\n"
    assert not (script.script.parent / OVER_FILE).exists()

    def refuses_the_third(path, options):
        if len(asked) == 6:
            raise SlurmError("sbatch refused: QOSMaxSubmitJobPerUserLimit")
        asked.append(options)
        return str(100 + len(asked))

    with pytest.raises(SlurmError, match=r"the chain's first 2 job\(s\) are queued \(105, 106\)"):
        submit_chain(script.script, script.chain, [], refuses_the_third)
    assert (script.script.parent / CHAIN_FILE).read_text() == "105\n106\n"


def test_a_run_that_never_started_resumes_as_a_chain_of_the_whole_duration(tmp_path):
    script = _script(tmp_path, time_limit_s=2 * 3600, chain=True).script
    again = resume_job(script.parent, time_limit="2h", chain=True, partition="short")
    assert again.chain is not None and again.left_s == 4 * 3600
    assert again.options == ["--partition=short"] and not again.needs.measured
    assert again.chain.startup_s == 300 and again.chain.links == 4
    # A script from before chains cannot run as one.
    script.write_text(script.read_text().replace(CHAIN_ENV, "SOMETHING_ELSE"))
    with pytest.raises(SlurmError, match="knew no chains"):
        resume_job(script.parent, time_limit="2h", chain=True)


def test_a_job_of_a_chain_starts_a_clock_it_holds_a_minute_of(tmp_path):
    """A job of a chain runs what it can of the run; outside a chain, or with less than a
    minute to run, the clock is not started."""
    config = Config.parse({"run": {"duration_s": 600}, "data": {"dataset": "digits"}})
    now = time.time()
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_START_TIME": str(int(now - 60)),
           "SLURM_JOB_END_TIME": str(int(now + 400)), CHAIN_ENV: "1"}
    linked = batch_job_limit(env)
    assert linked.chain_link and linked.describe()["chain_link"] is True
    plain = batch_job_limit({k: v for k, v in env.items() if k != CHAIN_ENV})
    assert not plain.chain_link and "chain_link" not in plain.describe()
    with pytest.raises(RunFailure, match="the clock was not started"):
        prepare(config, tmp_path / "plain", None, False, {}, limit=plain)
    too_short = JobLimit(now - 60, now + 180 + MIN_LINK_RUN_S - 5, 180, chain_link=True)
    with pytest.raises(RunFailure, match="the clock was not started"):
        prepare(config, tmp_path / "short", None, False, {}, limit=too_short)
    # The chain's list of jobs, written at submission, is no run already there.
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / CHAIN_FILE).write_text("7\n8\n")
    session = prepare(config, tmp_path / "run", None, False, {}, limit=linked)
    # The clock is the run's own: the job's signal stops it, the next job goes on.
    assert session.deadline_at - session.started_at == 600
    session.store.close()


def test_the_cli_plans_a_chain_and_says_how_to_submit_it(tmp_path):
    done = cli("slurm", "--nodes", 2, "--small-task", "--duration", "4h", "--time-limit", "2h", "--chain",
               "--store", f"sqlite:///{tmp_path}/store.db", "--run-dir", tmp_path / "run")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "a chain of 4 jobs of 2:00:00" in done.stdout
    assert "automlperf slurm --resume --chain --time-limit 120m" in done.stdout
    done = cli("slurm", "--nodes", 2, "--small-task", "--duration", "4h", "--time-limit", "2h",
               "--store", f"sqlite:///{tmp_path}/store.db", "--run-dir", tmp_path / "other")
    assert done.returncode == 2 and "pass --chain" in done.stderr


@pytest.mark.parametrize("primary, goes_on", [(130, True), (75, True), (3, True), (0, False),
                                              (1, False), (2, False)])
def test_a_chains_job_hands_on_after_a_stop_it_can_resume_and_ends_the_chain_otherwise(
        tmp_path, primary, goes_on):
    """The script's own lines after its primary ends, run by bash with the primary's status:
    a stop the next job can resume from (its signal: 130; a store or run directory that
    failed: 75; no clock started: 3) ends the job as a success and leaves the chain queued;
    the run's end or a failure marks the chain over and cancels the jobs after this one."""
    script = _script(tmp_path, time_limit_s=2 * 3600, chain=True).script
    text = script.read_text()
    tail = text[text.index('echo "automlperf primary finished'):text.rindex('exit "$status"')]
    (script.parent / CHAIN_FILE).write_text("7\n8\n9\n")
    env = {**os.environ, "SLURM_JOB_ID": "8", CHAIN_ENV: "1", "RUN_DIR": str(script.parent)}
    # scancel as a shell function: what the job would cancel, said.
    done = subprocess.run(["bash", "-c", 'scancel() { echo "scancel $*"; }\nstatus=$1\n' + tail
                           + 'exit "$status"', "job", str(primary)], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == (0 if goes_on else primary), done.stdout + done.stderr
    if goes_on:
        assert "the next one goes on with the run" in done.stdout
        assert "scancel" not in done.stdout and not (script.parent / OVER_FILE).exists()
    else:
        assert "scancel 9" in done.stdout and "scancel 7" not in done.stdout
        assert (script.parent / OVER_FILE).read_text() == f"ended in job 8 with status {primary}\n"


STANDIN = """#!/bin/bash
# Stands in for the job's python and for srun: each call logged, in order; the private
# PostgreSQL server starts unless $HELD names the job that holds it.
echo "$(basename "$0") $*" >> "$CALLS"
if [ "$(basename "$0")" = srun ]; then exit 0; fi
case "$*" in
    *pgserver\\ start*) [ -z "${HELD:-}" ] || { echo "job $HELD still runs" >&2; exit 1; }
                        echo "postgresql://u@127.0.0.1:1/x" ;;
    *"cli run"*) exit 130 ;;
esac
"""


@pytest.mark.parametrize("held", [False, True])
def test_each_job_of_a_chain_takes_the_store_before_it_stages_anything(tmp_path, held):
    """The script of a staged chain's job, run by bash with its python and srun standing in:
    the private store starts first, then the health sweep, then the staging and the run; a
    job that may not start the store (another job of the run holds it) stages nothing."""
    from trees import make_tree

    data = make_tree(tmp_path / "imagenet", per_class=(1, 1))
    settings = Config.parse({"run": {"duration_s": 4 * 3600, "official": False},
                             "data": {"dataset": "imagenet", "data_dir": str(data)}})
    script = write_job(ScriptOptions(tmp_path / "run", nodes=2, duration_s=4 * 3600,
                                     settings=settings, stage_to=tmp_path / "local",
                                     time_limit_s=2 * 3600, chain=True)).script
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("python", "srun"):
        (bin_dir / name).write_text(STANDIN)
        (bin_dir / name).chmod(0o755)
    text = re.sub(r"^PYTHON=.*$", f"PYTHON={bin_dir / 'python'}", script.read_text(), flags=re.M)
    calls = tmp_path / "calls"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "CALLS": str(calls),
           "SLURM_JOB_ID": "8", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "n[1-2]",
           CHAIN_ENV: "1", **({"HELD": "7"} if held else {})}
    done = subprocess.run(["bash", "-c", text], env=env, capture_output=True, text=True,
                          timeout=60)
    said = calls.read_text().splitlines()
    if held:
        assert done.returncode == 1 and "could not start the private PostgreSQL" in done.stdout
        assert len(said) == 1 and "pgserver start" in said[0]
        return
    assert done.returncode == 0, done.stdout + done.stderr
    order = [next(i for i, line in enumerate(said) if what in line)
             for what in ("pgserver start", "cli sweep", "cli stage", "cli run", "pgserver stop")]
    assert order == sorted(order), said
    # The chain goes on: the copy stays on the nodes for the next job.
    assert not any("--clean" in line for line in said)
