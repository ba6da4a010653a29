"""A batch job's clock: the session starts only when the run fits in what the job's time
limit leaves after its start-up and before the result must be written."""

import time

import pytest

from automlperf.config import Config
from automlperf.errors import RunFailure
from automlperf.runner.session import prepare
from automlperf.runner.slurm import MARGIN_ENV, JobLimit, _slurm_time, job_limit


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
    # The session needs its 600 s and the grace (a quarter) in which epochs in flight finish.
    assert "leaves 320 s for a session that needs 750 s" in text
    assert "the clock was not started" in text and "sbatch --time=0:23:00" in text
    assert not (tmp_path / "run" / "run.json").exists()  # nothing of a run was written
    room = JobLimit(started_at=now - 60, ends_at=now + 1000, margin_s=180)
    session = prepare(config, tmp_path / "run", None, False, {}, limit=room, process_start=now - 30)
    assert session.deadline_at - session.started_at == 600
    assert session.startup["before_clock_s"] >= 30
    session.store.close()
