"""`automlperf status RUN_DIR`: a run's standing from any host that sees its run directory,
read from its records as `check` would count them. Here on a run's own SQLite store, its
session open and its records made by the store's own calls (a running SLURM job's status,
read through its store service: tests/cluster/test_chain_of_jobs.py); and the live line of
the primary, which says the same."""

import json
import time

import pytest
from typer.testing import CliRunner

from automlperf.cli import app
from automlperf.config import Config
from automlperf.runner.session import blockers, prepare
from automlperf.runner.status import JOB_FILE, run_status, staged_nodes, write_job
from automlperf.store import TrialStatus
from helpers import epoch_of, new_claim


@pytest.fixture
def running(tmp_path):
    """A 10-minute run of three replicas, 4 minutes in: replica 0 trained two epochs (the
    best 0.72), replica 1 holds a trial and went silent 2 minutes ago, replica 2 retired;
    two of its three nodes staged the data, and the health sweep found the third bad."""
    run_dir = tmp_path / "run"
    config = Config.parse({"run": {"duration_s": 600, "lease_timeout_s": 60},
                           "data": {"dataset": "digits"}})
    session = prepare(config, run_dir, None, False, {})
    store, run_id, now = session.store, session.run_id, session.started_at + 240
    seg = session.segment
    reps = [store.register_replica(run_id, i, seg, f"node{i}", 100 + i, [], session.started_at)
            for i in range(3)]
    first = store.claim_trial(new_claim(run_id=run_id, replica_id=reps[0], replica_index=0,
                                        graph_hash="a", now=session.started_at))
    for n, accuracy in enumerate((0.6, 0.72)):
        record = epoch_of(run_id, first, n, ended=session.started_at + 60 * (n + 1))
        record.val_accuracy = accuracy
        store.record_epoch(record)
    store.finish_trial(first, TrialStatus.COMPLETED, session.started_at + 130)
    store.claim_trial(new_claim(run_id=run_id, replica_id=reps[1], replica_index=1,
                                graph_hash="b", now=session.started_at))
    store.heartbeat(reps[0], now - 1, 60)
    store.heartbeat(reps[1], now - 120, 60)
    store.end_replica(reps[2], TrialStatus.FAILED, session.started_at + 5,
                      "the dataset is not on this node (node2)")
    store.touch_segment(run_id, seg, now)
    store.close()
    (run_dir / "staging").mkdir()
    for node in ("n1", "n2"):
        (run_dir / "staging" / f"{node}.json").write_text(json.dumps({"node": node, "at": 1}))
    (run_dir / "staging" / "n3-5.json").write_text(json.dumps({"node": "n3", "removed_at": 9}))
    (run_dir / "health").mkdir()
    for node, problems in (("n1", []), ("n2", []), ("n3", ["no data"])):
        (run_dir / "health" / f"{node}.json").write_text(json.dumps(
            {"node": node, "job": "77", "problems": problems}))
    write_job(run_dir, {"scheduler": "slurm", "job": "77", "nodes": ["n1", "n2", "n3"],
                        "ends_at": now + 3600, "started_at": session.started_at - 30})
    return run_dir, now


def test_a_running_run_is_told_from_its_records(running):
    run_dir, now = running
    status = run_status(run_dir, now=now)
    assert status.state == "running" and status.source.startswith("the run's store")
    assert status.elapsed_s == pytest.approx(240) and status.remaining_s == pytest.approx(360)
    assert status.replicas == {"running": 1, "silent": 1, "retired": 1}
    assert status.trials == {"completed": 1, "running": 1} and status.epochs == 2
    assert status.best_accuracy == pytest.approx(0.72) and status.score > 0
    # Valid if it ended now? The accuracy would do (error 28 %); the digits and a run under
    # an hour never are.
    assert not status.valid_so_far
    assert any(why.startswith("dataset: trained on digits") for why in status.not_valid)
    assert "duration: ran 4.0 min; the minimum is 1 h" in status.not_valid
    assert not any("max_error" in why or "best error" in why for why in status.not_valid)
    assert status.staged == ["n1", "n2"] and status.unstaged == ["n3"]
    assert status.bad_nodes == {"n3": ["no data"]}
    lines = status.lines(now=now)
    assert lines[0] == f"{run_dir}: running (the run's store (no store service answers))"
    assert lines[1].startswith("job       slurm job 77 on 3 node(s), ends ") and "(in 1:00:00)" in lines[1]
    assert "clock     elapsed 0:04:00 of 0:10:00, remaining 0:06:00" in lines
    assert "replicas  1 running, 1 silent, 1 retired" in lines
    assert "trials    1 completed, 1 running; 2 epoch(s)" in lines
    assert "staged    on 2 of 3 node(s); reading the shared copy: n3" in lines
    assert "health    1 node(s) cannot train: n3 (no data)" in lines
    valid = next(x for x in lines if x.startswith("valid     no, so far: "))
    assert "; duration: ran 4.0 min; the minimum is 1 h" in valid


def test_the_command_prints_it_and_its_json(running):
    run_dir, _ = running
    done = CliRunner().invoke(app, ["status", str(run_dir), "--json"])
    assert done.exit_code == 0, done.output
    found = json.loads(done.output)
    assert found["job"]["job"] == "77" and found["epochs"] == 2 and found["staged"] == ["n1", "n2"]
    done = CliRunner().invoke(app, ["status", str(run_dir)])
    assert done.exit_code == 0 and "score" in done.output and "valid" in done.output


def test_a_run_not_yet_started_and_a_folder_that_is_none(tmp_path):
    from automlperf.runner.sbatch import ScriptOptions, write_job as write_script

    write_script(ScriptOptions(tmp_path / "queued", nodes=2, duration_s=600,
                               store_url=f"sqlite:///{tmp_path}/s.db"))
    status = run_status(tmp_path / "queued")
    assert status.state == "not started" and status.lines()[0].endswith("(no clock started yet)")
    done = CliRunner().invoke(app, ["status", str(tmp_path)])
    assert done.exit_code == 2
    assert "is not a run directory (run.json is missing)" in " ".join(done.output.split())


def test_the_live_line_says_whether_the_result_would_be_valid_and_the_jobs_end(running):
    from automlperf.report.console import LiveView
    from automlperf.store import open_store

    run_dir, now = running
    store = open_store(run_dir=run_dir)

    class Watched:
        pass

    session = Watched()
    session.store, session.run_id, session.path = store, 1, run_dir
    segment = store.segments(1)[-1]
    session.started_at, session.deadline_at, session.elapsed_before = (
        segment.started_at, segment.deadline_at, 0.0)
    job = json.loads((run_dir / JOB_FILE).read_text())
    config = Config.load(run_dir / "config.toml")
    view = LiveView(session, context={"job_ends_at": job["ends_at"], "staged": (2, 3)},
                    blockers=blockers(config, store.run(1)))
    line = view.line(now, ["up", "up", "exited"])
    store.close()
    assert "best accuracy 0.72, valid so far no (not imagenet, under 1 h)" in line
    assert line.endswith(", job ends in 1:00:00, staged 2/3 nodes")
    clean = LiveView(session, context={}, blockers=[])
    clean.best = 0.69
    assert clean.valid_so_far() == "no (best error 31.0 % > 30 %)"
    clean.best = 0.71
    assert clean.valid_so_far() == "yes" and clean.notes(time.time()) == ""


def test_a_removed_copy_is_not_a_staged_node(tmp_path):
    (tmp_path / "staging").mkdir()
    (tmp_path / "staging" / "a.json").write_text(json.dumps({"node": "a"}))
    (tmp_path / "staging" / "b-3.json").write_text(json.dumps({"node": "b", "removed_at": 4}))
    (tmp_path / "staging" / "c.json").write_text("{cut sh")
    assert staged_nodes(tmp_path) == ["a"]
