"""The benchmark run end to end: real primary, real replica processes, real training."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from automlperf.config import Config
from automlperf.measure.score import counted_epochs
from automlperf.ops import count, epoch_ops
from automlperf.graph import Graph
from automlperf.store import open_store
from helpers import cli, fast_config

pytestmark = pytest.mark.slow

def config_file(tmp_path, duration=40, replicas=2):
    path = tmp_path / "fast.toml"
    path.write_text(fast_config(duration_s=duration, replicas=replicas, stop_grace_s=15))
    return path


def cli_args(*args):
    return [sys.executable, "-m", "automlperf.cli", *map(str, args)]


def start_run(tmp_path, run_dir, **kw):
    log = open(tmp_path / f"primary-{run_dir.name}.log", "ab")
    return subprocess.Popen(cli_args("run", "--config", config_file(tmp_path, **kw), "--run-dir", run_dir),
                            stdout=log, stderr=subprocess.STDOUT)


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def worker_pids(run_dir):
    store = open_store(run_dir=run_dir)
    return {r.index: r.pid for r in store.replicas(1)}


def check_ops_are_consistent(store):
    """Every recorded epoch's operations follow from its graph and image counts."""
    graphs = {t.id: Graph.from_json(t.graph_json) for t in store.trials(1)}
    for e in store.epochs(1):
        ops = count(graphs[e.trial_id], batch_size=e.batch_size)
        assert e.ops == epoch_ops(ops, e.train_images, e.steps, e.val_images)


def test_a_short_run_searches_morphs_and_tunes(tmp_path):
    run_dir = tmp_path / "run"
    done = cli("run", "--config", config_file(tmp_path), "--run-dir", run_dir, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "score" in done.stdout and "regulated score" in done.stdout and "best accuracy" in done.stdout
    result = json.loads((run_dir / "result.json").read_text())
    assert result["score"] > 0 and result["best_accuracy"] > 0.5 and result["regulated_score"] > 0
    assert not result["official"] and not result["valid"]
    assert {v["rule"] for v in result["violations"]} >= {"dataset", "duration"}
    assert result["elapsed_s"] == pytest.approx(40, abs=1)
    for name in ("config.toml", "system.json", "run.json", "history.db"):
        assert (run_dir / name).exists()

    store = open_store(run_dir=run_dir)
    trials = store.trials(1)
    assert len(trials) >= 6 and {t.replica_index for t in trials} == {0, 1}
    by_id = {t.id: t for t in trials}
    born = [t for t in trials if t.parent_id is not None and by_id[t.parent_id].status == "completed"]
    assert born and all(t.morphs for t in born)  # children of trained parents, by morphism
    for t in trials:
        assert (t.hparams["tpe_trial"] is not None) == (t.round >= 3)
        assert t.hparams["epochs"] == Config.load(run_dir / "config.toml").train.round_epochs(t.round)
        folder = run_dir / "trials" / str(t.id)
        assert Graph.from_json((folder / "graph.json").read_text()).content_hash() == t.graph_hash
    assert any(t.round >= 3 for t in trials)
    warm = [t for t in trials if t.round < 3 and t.status == "completed" and t.epochs_done >= 3]
    assert all(t.predicted_accuracy >= t.best_accuracy for t in warm)
    check_ops_are_consistent(store)
    counted = counted_epochs(store.epochs(1), store.segments(1))
    assert result["total_ops"] == sum(e.ops for _, e in counted)
    import optuna

    studies = optuna.get_all_study_summaries(f"sqlite:///{run_dir / 'history.db'}")
    assert sorted(s.study_name for s in studies) == ["run-1-replica-0", "run-1-replica-1"]


def test_killing_a_replica_leaves_the_run_going(tmp_path):
    run_dir = tmp_path / "run"
    primary = start_run(tmp_path, run_dir, duration=32)
    store = None

    def replica1_has_an_epoch():
        nonlocal store
        if not (run_dir / "history.db").exists():
            return False
        store = store or open_store(run_dir=run_dir)
        return any(t.replica_index == 1 and t.status == "running" and t.epochs_done >= 1
                   for t in store.trials(1))

    wait_for(replica1_has_an_epoch, 120, "replica 1 to finish an epoch")
    victim = next(t for t in store.trials(1) if t.replica_index == 1 and t.status == "running")
    os.kill(worker_pids(run_dir)[1], signal.SIGKILL)
    assert primary.wait(timeout=240) == 0
    dead = store.trial(victim.id)
    assert dead.status == "failed" and "heart-beating" in dead.reason
    assert dead.epochs_done >= 1
    result = json.loads((run_dir / "result.json").read_text())
    counted = {(e.trial_id, e.epoch) for _, e in counted_epochs(store.epochs(1), store.segments(1))}
    assert {(victim.id, n) for n in range(dead.epochs_done)} <= counted
    assert result["score"] > 0
    assert any(t.replica_index == 0 and t.created_at > dead.finished_at for t in store.trials(1))


def test_kill_the_primary_and_resume(tmp_path):
    run_dir = tmp_path / "run"
    primary = start_run(tmp_path, run_dir, duration=40)
    wait_for(lambda: (run_dir / "history.db").exists()
             and len(open_store(run_dir=run_dir).epochs(1)) >= 3, 120, "three epochs")
    time.sleep(3)
    primary.send_signal(signal.SIGKILL)
    primary.wait()
    store = open_store(run_dir=run_dir)
    # Orphaned replicas notice the silent primary and stop by themselves.
    wait_for(lambda: all(r.status != "running" for r in store.replicas(1)), 60, "replicas to stop")
    before = {(e.trial_id, e.epoch): e for e in store.epochs(1)}
    done = cli("run", "--resume", "--run-dir", run_dir, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    after = {(e.trial_id, e.epoch): e for e in store.epochs(1)}
    assert set(before) < set(after)  # kept everything, added more
    assert all(after[k] == v for k, v in before.items())  # rewrote nothing
    segs = store.segments(1)
    assert len(segs) == 2 and all(s.ended_at is not None for s in segs)
    result = json.loads((run_dir / "result.json").read_text())
    # Charged for the time the run ran, not for the time it was down.
    assert result["elapsed_s"] == pytest.approx(40, abs=4)
    counted = counted_epochs(store.epochs(1), segs)
    assert result["total_ops"] == sum(e.ops for _, e in counted)
    assert len(counted) == len(set((e.trial_id, e.epoch) for _, e in counted))
    assert not any(t.status == "running" for t in store.trials(1))
    again = cli("run", "--resume", "--run-dir", run_dir, timeout=120)
    assert again.returncode == 0 and "whole duration" in again.stderr
    assert json.loads((run_dir / "result.json").read_text())["total_ops"] == result["total_ops"]


def test_run_directory_errors(tmp_path):
    from typer.testing import CliRunner

    from automlperf.cli import app

    def run(*args):
        return CliRunner().invoke(app, ["run", *map(str, args)])

    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").write_text("")
    done = run("--run-dir", busy, "--duration", "5s")
    assert done.exit_code == 2 and "exists and is not empty: pass --resume" in done.output
    done = run("--resume", "--run-dir", tmp_path / "none")
    assert done.exit_code == 2 and "is not a run directory" in done.output
    old = tmp_path / "old"
    old.mkdir()
    (old / "run.json").write_text(json.dumps({"schema_version": 99, "run_id": 1}))
    done = run("--resume", "--run-dir", old)
    assert done.exit_code == 2 and "schema version 99" in done.output
    done = run("--dataset", "imagenet", "--run-dir", tmp_path / "in")
    assert done.exit_code == 2 and "imagenet needs --data-dir" in done.output
    done = run("--duration", "soon", "--run-dir", tmp_path / "in")
    assert done.exit_code == 2 and "--duration: 'soon' is not a duration" in done.output
    assert not (tmp_path / "in").exists()
