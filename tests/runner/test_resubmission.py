"""`automlperf slurm --resume` on a run that started its clock: what it sizes, what it passes
to the job, and that the login node writes nothing to the run. An extension
(`--duration`) is made by the job's primary when its clock starts (a job cancelled in the
queue leaves the run as it was); `--stage-time` reaches the job; a chain's jobs each get the
lead the run measured for writing its result, not a share of the whole run."""

import json
from pathlib import Path

import pytest

from automlperf.config import Config
from automlperf.runner.chain import link_options, plan_chain
from automlperf.runner.joblimits import (EXTEND_ENV, FINISH_LOG, LEAD_FLOOR_S, STAGE_ENV,
                                         link_lead, margins, measured_finish, record_finish)
from automlperf.runner.resubmit import resume_job
from automlperf.runner.sbatch import ScriptOptions, write_job
from automlperf.runner.session import prepare
from automlperf.runner.slurm import SlurmError
from automlperf.store import open_store


def _started(tmp_path: Path, done_s: float, **options) -> Path:
    """A run whose script was written (duration 10 minutes) and whose first session ran
    ``done_s`` of it."""
    run_dir = tmp_path / "run"
    url = f"sqlite:///{run_dir}/history.db"
    write_job(ScriptOptions(run_dir, nodes=2, duration_s=600, store_url=url, **options))
    config = Config.parse({"run": {"duration_s": 600}, "data": {"dataset": "digits"}})
    session = prepare(config, run_dir, url, False, {})
    session.store.end_segment(session.run_id, session.segment, session.started_at + done_s)
    session.store.close()
    return run_dir


def _stored(run_dir: Path) -> tuple[float, str, str]:
    store = open_store(f"sqlite:///{run_dir}/history.db")
    try:
        duration = store.run(1)["duration_s"]
    finally:
        store.close()
    return duration, (run_dir / "config.toml").read_text(), (run_dir / "system.json").read_text()


def test_an_extension_is_sized_here_and_made_by_the_job(tmp_path):
    run_dir = _started(tmp_path, 200)
    before = _stored(run_dir)
    again = resume_job(run_dir, duration="20m")
    # 1,200 s less the 200 run: 1,000 left, and the grace of a 20-minute run (5 min).
    assert again.left_s == pytest.approx(1000, abs=0.01)
    assert again.needs.grace_s == 300
    assert again.exports == {EXTEND_ENV: "1200"}
    assert f"--export=ALL,{EXTEND_ENV}=1200" in again.options
    assert _stored(run_dir) == before  # nothing written: the store, config.toml, system.json
    script = (run_dir / "automlperf.sbatch").read_text()
    assert f'--duration "${{{EXTEND_ENV}}}s"' in script
    # Refused in one line, before anything queues.
    with pytest.raises(Exception, match="does not extend this run, which lasts 0:10:00"):
        resume_job(run_dir, duration="10m")


def test_the_job_makes_the_extension_once_however_many_jobs_carry_it(tmp_path):
    """Every job of a chain (or a requeued job) is given the extension: the first makes it,
    the others find the run already that long."""
    run_dir = _started(tmp_path, 200)
    for expect in (True, False):
        session = prepare(None, run_dir, None, True, {}, extend_to=1200.0)
        assert session.extended is expect and session.config.run.duration_s == 1200
        session.store.end_segment(session.run_id, session.segment, session.started_at + 1)
        session.store.close()
    system = json.loads((run_dir / "system.json").read_text())
    assert [(e["from_s"], e["to_s"]) for e in system["extensions"]] == [(600, 1200)]


def test_a_staging_allowance_given_on_resume_reaches_the_job(tmp_path):
    from trees import make_tree

    data = make_tree(tmp_path / "imagenet", per_class=(1, 1))
    settings = Config.parse({"run": {"duration_s": 600, "official": False},
                             "data": {"dataset": "imagenet", "data_dir": str(data)}})
    run_dir = tmp_path / "staged"
    write_job(ScriptOptions(run_dir, nodes=2, duration_s=600, settings=settings,
                            store_url=f"sqlite:///{tmp_path}/s.db", stage_to=tmp_path / "local"))
    again = resume_job(run_dir, stage_time="1h")
    assert again.needs.startup_s == 300 + 3600 and again.exports == {STAGE_ENV: "3600"}
    script = (run_dir / "automlperf.sbatch").read_text()
    assert f'stage_s="${{{STAGE_ENV}:-1200}}"' in script and '--time="$stage_minutes"' in script
    run_dir = _started(tmp_path, 100)  # a run that stages nothing
    with pytest.raises(SlurmError, match="stages no data: --stage-time is for a run written "
                                         "with --stage-to"):
        resume_job(run_dir, stage_time="1h")


def test_a_chains_lead_is_twice_the_stop_the_run_measured(tmp_path):
    assert link_lead(None) == LEAD_FLOOR_S == 120
    assert link_lead(30.0) == 120 and link_lead(100.4) == 201
    assert measured_finish(tmp_path) is None
    record_finish(tmp_path, 1, 41.5, 16)
    record_finish(tmp_path, 2, 93.25, 16)
    with open(tmp_path / "logs" / FINISH_LOG, "a") as f:
        f.write('{"segment": 3, "fini')  # a line cut short by a crash
    assert measured_finish(tmp_path) == 93.25
    # A 24-hour run (6 h of grace) in 8-hour jobs: 55 minutes of lead and result per job
    # when the lead was 3 % of the whole run; 3 minutes from the floor.
    whole = margins(30 * 3600)[1]
    before = plan_chain(30 * 3600, 8 * 3600, 1500, whole)
    after = plan_chain(30 * 3600, 8 * 3600, 1500, link_lead(None))
    assert whole == 3240 and (before.reserved_s, before.links) == (1500 + whole + 60, 6)
    assert (after.reserved_s, after.links) == (1500 + 120 + 60, 5)
    assert link_options(after)[:2] == ["--time=8:00:00", "--signal=B:TERM@120"]


def test_a_resubmitted_chain_is_given_the_lead_its_run_measured(tmp_path):
    run_dir = _started(tmp_path, 100, time_limit_s=600, chain=True)
    record_finish(run_dir, 1, 95.0, 2)
    again = resume_job(run_dir, time_limit="20m", chain=True, duration="15m")
    assert again.chain is not None and again.chain.lead_s == 190
    assert again.exports == {EXTEND_ENV: "900"}
    opts = link_options(again.chain, again.exports)
    assert opts[1] == "--signal=B:TERM@190"
    assert opts[2] == (f"--export=ALL,AUTOMLPERF_CHAIN_LINK=1,AUTOMLPERF_LINK_MARGIN_S=250,"
                       f"{EXTEND_ENV}=900")
