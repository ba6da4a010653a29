"""The benchmark run end to end: real primary, real replica processes, real training on real
files. Runs end by their round limit or their deadline, and every assertion is about what
happened, never about how much happened in some wall time."""

import contextlib
import json
import os
import resource
import signal
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from automlperf.config import Config
from automlperf.graph import Graph
from automlperf.measure.score import counted_epochs
from automlperf.ops import count, epoch_ops
from automlperf.store import open_store
from helpers import (OOM_CONFIG, cli, cli_args, default_sigint, fast_config, folder_config,
                     marked_env, outcome_logged, sim_config, stopped, wait_for, wait_no_strays,
                     write_config)
from imagefolder import make_image_folder

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """An ImageNet-layout folder of real JPEG photos with two corrupt files per split."""
    root = tmp_path_factory.mktemp("photos")
    counts = make_image_folder(root, classes=4, train_per_class=12, val_per_class=4, corrupt=2)
    return root, counts


def start(tmp_path, config, run_dir, env, *extra):
    log = open(tmp_path / f"primary-{run_dir.name}.log", "ab")
    return subprocess.Popen(cli_args("run", "--config", config, "--run-dir", run_dir, *extra),
                            stdout=log, stderr=subprocess.STDOUT, env=env,
                            preexec_fn=default_sigint)


def primary_log(tmp_path, run_dir):
    return (tmp_path / f"primary-{run_dir.name}.log").read_text()


def check_ops_are_consistent(store):
    """Every recorded epoch's operations follow from its graph and image counts."""
    graphs = {t.id: Graph.from_json(t.graph_json) for t in store.trials(1)}
    for e in store.epochs(1):
        ops = count(graphs[e.trial_id], batch_size=e.batch_size)
        assert e.ops == epoch_ops(ops, e.train_images, e.steps, e.val_images)


def session_seconds(store):
    return sum(s.end - s.started_at for s in store.segments(1))


def has_epoch(run_dir, replica=None):
    def probe():
        if not (run_dir / "history.db").exists():
            return False
        try:
            store = open_store(run_dir=run_dir)
        except Exception:  # the schema is being created
            return False
        return any(t.epochs_done >= 1 and (replica is None or t.replica_index == replica)
                   and t.status == "running" for t in store.trials(1))
    return probe


def test_a_short_run_searches_morphs_and_tunes(tmp_path):
    """Two replicas, four rounds each: warm-up rounds 0-2, then a TPE round."""
    run_dir = tmp_path / "run"
    config = write_config(tmp_path, fast_config(duration_s=900, replicas=2, max_rounds=4))
    done = cli("run", "--config", config, "--run-dir", run_dir)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "score" in done.stdout and "regulated score" in done.stdout and "best accuracy" in done.stdout
    result = json.loads((run_dir / "result.json").read_text())
    # Well above the 10 classes' chance (0.1) at any speed: which parents and hyperparameters
    # the rounds take depends on when the other replica's trials finish, and beside two CPU
    # burners the best of the 8 trials ranged 0.43-0.91 (0.90-0.94 idle).
    assert result["score"] > 0 and result["best_accuracy"] > 0.3 and result["regulated_score"] > 0
    assert not result["official"] and not result["valid"]
    assert {v["rule"] for v in result["violations"]} >= {"dataset", "duration"}
    for name in ("config.toml", "system.json", "run.json", "history.db"):
        assert (run_dir / name).exists()

    store = open_store(run_dir=run_dir)
    assert result["elapsed_s"] == pytest.approx(session_seconds(store), abs=1e-6)
    trials = store.trials(1)
    assert [sum(t.replica_index == r for t in trials) for r in (0, 1)] == [4, 4]
    assert all(t.status == "completed" for t in trials)
    by_id = {t.id: t for t in trials}
    born = [t for t in trials if t.parent_id is not None and by_id[t.parent_id].status == "completed"]
    assert born and all(t.morphs for t in born)  # children of trained parents, by morphism
    for t in trials:
        assert (t.hparams["tpe_trial"] is not None) == (t.round >= 3)
        assert t.hparams["epochs"] == Config.load(run_dir / "config.toml").train.round_epochs(t.round)
        folder = run_dir / "trials" / str(t.id)
        assert Graph.from_json((folder / "graph.json").read_text()).content_hash() == t.graph_hash
    assert sorted(t.round for t in trials) == [0, 0, 1, 1, 2, 2, 3, 3]
    check_ops_are_consistent(store)
    counted = counted_epochs(store.epochs(1), store.segments(1))
    assert result["total_ops"] == sum(e.ops for _, e in counted)
    # Each replica's TPE study is a journal in the run directory.
    import optuna
    from optuna.storages.journal import JournalFileBackend

    studies = [s for i in (0, 1) for s in optuna.get_all_study_summaries(
        optuna.storages.JournalStorage(JournalFileBackend(str(run_dir / "tpe" / f"replica-{i}.journal"))))]
    assert sorted(s.study_name for s in studies) == ["run-1-replica-0", "run-1-replica-1"]


def test_an_image_folder_on_two_ranks(tmp_path, photos):
    """The official input path (JPEG files decoded by worker processes) through the code
    that scores a run, on a replica of two data-parallel ranks."""
    root, counts = photos
    run_dir = tmp_path / "run"
    env, mark = marked_env()
    config = write_config(tmp_path, folder_config(root, workers=1, duration_s=900, max_rounds=2))
    done = cli("run", "--config", config, "--run-dir", run_dir, "--devices-per-replica", 2,
               env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads((run_dir / "result.json").read_text())
    assert result["score"] > 0 and result["devices"] == 2 and result["epochs"] >= 2
    store = open_store(run_dir=run_dir)
    epochs = store.epochs(1)
    assert all(e.world_size == 2 for e in epochs)
    assert all(e.train_images == counts["train"] and e.val_images == counts["val"] for e in epochs)
    assert all(e.skipped_images == 2 for e in epochs)  # the corrupt training files, every epoch
    # What decoded each epoch, and that none ran compiled (a CPU without figures stays eager).
    paths = {e.decode_path for e in epochs}
    assert len(paths) == 1 and paths.pop().startswith("cpu-pillow ")
    assert not any(e.compiled for e in epochs)
    # Why that path decoded, as every trial recorded it: no GPU here, so the CPU workers.
    trials = store.trials(1)
    why = "automatic: the ranks have no NVIDIA GPU"
    assert all(t.extra["decode_path"] == why for t in trials)
    assert result["decoding"] == {"paths": {epochs[0].decode_path: len(epochs)},
                                  "cpu_decoded_images": 0, "compiled_epochs": 0,
                                  "chosen": {why: len(trials)}}
    # Where the ranks ran, in the node's description: CPU ranks are left to the scheduler.
    assert result["node_descriptions"][0]["binding"] == [
        {"cpus": "", "numa": None, "why": "not bound: CPU ranks"}] * 2
    # Validation decoded once per trial, then replayed: each epoch still counts every image.
    assert all(t.extra["validation"] == "kept on the device" for t in trials if t.epochs_done > 1)
    assert cli("check", run_dir).returncode == 0
    wait_no_strays(mark)


def test_killing_a_replica_leaves_the_run_going(tmp_path, photos):
    """kill -9 of a replica takes its training ranks and their data-loading workers with it;
    the other replica goes on and the run completes, counting what the dead one finished."""
    root, _ = photos
    run_dir = tmp_path / "run"
    env, mark = marked_env()
    config = write_config(tmp_path, folder_config(root, workers=1, duration_s=900, replicas=2,
                                                  max_rounds=4))
    primary = start(tmp_path, config, run_dir, env)
    wait_for(has_epoch(run_dir, replica=1), 600, "replica 1 to finish an epoch")
    store = open_store(run_dir=run_dir)
    pid = next(r.pid for r in store.replicas(1) if r.index == 1)
    victim = None

    def held_mid_trial() -> bool:
        # Held (SIGSTOP: the replica, its ranks and their workers) while its running trial is
        # picked and it is killed, so that trial cannot finish in between on a loaded machine;
        # nor after, by its logged outcome (helpers.outcome_logged).
        nonlocal victim
        freeze_between_writes(run_dir / "history.db", pid)
        victim = next((t for t in store.trials(1) if t.replica_index == 1 and t.status == "running"
                       and t.epochs_done >= 1 and not outcome_logged(run_dir, t.id)), None)
        if victim is None:
            os.killpg(pid, signal.SIGCONT)  # between two trials: wait for the next one's epoch
        return victim is not None

    wait_for(held_mid_trial, 600, "replica 1 held in a trial past its first epoch")
    assert victim is not None
    replica = psutil.Process(pid)
    family = replica.children(recursive=True)
    assert family  # its training rank (and sampler) at least
    killed_at = time.time()
    replica.kill()
    os.killpg(pid, signal.SIGCONT)  # what it started runs again, to find its replica gone
    gone, alive = psutil.wait_procs(family, timeout=120)
    assert not alive, f"outlived their replica: {[p.pid for p in alive]}"
    assert primary.wait(timeout=900) == 0, primary_log(tmp_path, run_dir)
    wait_no_strays(mark)
    dead = store.trial(victim.id)
    assert dead.status == "failed" and "heart-beating" in dead.reason
    assert dead.epochs_done >= 1
    result = json.loads((run_dir / "result.json").read_text())
    counted = {(e.trial_id, e.epoch) for _, e in counted_epochs(store.epochs(1), store.segments(1))}
    assert {(victim.id, n) for n in range(dead.epochs_done)} <= counted
    assert result["score"] > 0 and not result["failures"]
    assert any(t.replica_index == 0 and t.created_at > killed_at for t in store.trials(1))
    assert sum(e.skipped_images for e in store.epochs(1)) > 0
    assert cli("check", run_dir).returncode == 0


def test_kill_the_primary_and_resume(tmp_path, photos):
    """kill -9 of the primary mid-trial: its replica notices the silence and stops with
    everything it started; a resumed run keeps every record and goes on. The replica is held
    (SIGSTOP) from its first epoch until the primary is dead and its lease has lapsed, so it
    is stopped with most of its rounds still to train, however fast the machine."""
    root, _ = photos
    run_dir = tmp_path / "run"
    env, mark = marked_env()
    # Four rounds of 1 to 4 epochs, three of them searched for: work left after the first
    # epoch for seconds on any machine, against a tenth of a second between polls.
    config = write_config(tmp_path, folder_config(root, workers=1, duration_s=900, max_rounds=4))
    primary = start(tmp_path, config, run_dir, env)
    wait_for(has_epoch(run_dir), 600, "an epoch", every=0.1)
    store = open_store(run_dir=run_dir)
    (replica,) = store.replicas(1)
    freeze_between_writes(run_dir / "history.db", replica.pid)  # with its ranks and workers
    primary.send_signal(signal.SIGKILL)
    primary.wait()
    lease = Config.load(run_dir / "config.toml").run.lease_timeout_s
    wait_for(lambda: time.time() > store.segments(1)[0].last_seen + lease + 1, 120,
             "the primary's lease to lapse")
    os.killpg(replica.pid, signal.SIGCONT)
    # The orphaned replica notices the silent primary and stops by itself, with everything
    # it started.
    wait_no_strays(mark)
    assert all(r.status != "running" for r in store.replicas(1))
    before = {(e.trial_id, e.epoch): e for e in store.epochs(1)}
    started = time.time()
    done = cli("run", "--resume", "--run-dir", run_dir, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    wait_no_strays(mark)
    after = {(e.trial_id, e.epoch): e for e in store.epochs(1)}
    assert set(before) < set(after)  # kept everything, added more
    assert all(after[k] == v for k, v in before.items())  # rewrote nothing
    segs = store.segments(1)
    assert len(segs) == 2 and all(s.ended_at is not None for s in segs)
    result = json.loads((run_dir / "result.json").read_text())
    # Charged for the time the run ran, not for the time it was down.
    assert result["elapsed_s"] == pytest.approx(session_seconds(store), abs=1e-6)
    assert segs[1].started_at >= started and segs[0].end <= segs[1].started_at
    counted = counted_epochs(store.epochs(1), segs)
    assert result["total_ops"] == sum(e.ops for _, e in counted)
    assert len(counted) == len(set((e.trial_id, e.epoch) for _, e in counted))
    assert not any(t.status == "running" for t in store.trials(1))
    assert sum(t.status == "completed" for t in store.trials(1)) >= 2
    again = cli("run", "--resume", "--run-dir", run_dir, env=env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert json.loads((run_dir / "result.json").read_text())["total_ops"] == result["total_ops"]
    wait_no_strays(mark)


def gone(pid):
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@contextlib.contextmanager
def write_lock(db: Path) -> Iterator[None]:
    """Hold a SQLite store's write lock: taken once the write in flight, if any, has
    committed; while it is held, no other process is inside a write."""
    conn = sqlite3.connect(db, timeout=600, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        yield
        conn.execute("ROLLBACK")
    finally:
        conn.close()


def freeze_between_writes(db: Path, group: int) -> None:
    """Freeze (SIGSTOP) process group ``group`` while holding ``db``'s write lock, so between
    two of its writes: frozen inside one, it would keep SQLite's lock, and the test's own
    reads of the store would wait for it for the store's whole retry time. The lock is held
    until the group's leader has stopped, which is after ``killpg`` returns."""
    with write_lock(db):
        os.killpg(group, signal.SIGSTOP)
        wait_for(lambda: stopped(group), 60, f"process group {group} to stop")


def test_a_frozen_primary(tmp_path):
    """The primary frozen (SIGSTOP) mid-run, as a hung process is: its replicas hear no
    heartbeat for a lease, stop by themselves and exit with everything they recorded; once
    it is killed, --resume goes on, the logs and the store hold the same epochs, and the run
    verifies. Two simulated replicas, held from the first epoch until the primary is frozen,
    so that both have most of their rounds still to train, however fast the machine; the
    resumed session ends with their rounds. The processes are frozen while the test holds
    the store's write lock, so the primary stops between two of its writes: frozen inside one,
    it would keep SQLite's lock, and every replica's write would wait on it."""
    from automlperf.store.ledger import compare, read_logs
    from automlperf.store.rundir import RunDir

    run_dir = tmp_path / "run"
    env, mark = marked_env()
    config = write_config(tmp_path, sim_config(replicas=2, lease_timeout_s=6, duration_s=900,
                                               max_rounds=10))
    primary = start(tmp_path, config, run_dir, env)
    store = None

    def both_up_and_an_epoch():
        nonlocal store
        if has_epoch(run_dir)():
            store = store or open_store(run_dir=run_dir)
            return len(store.replicas(1)) == 2
        return False

    wait_for(both_up_and_an_epoch, 600, "both replicas and an epoch", every=0.1)
    try:
        replicas = store.replicas(1)
        with write_lock(run_dir / "history.db"):
            for r in replicas:
                os.killpg(r.pid, signal.SIGSTOP)
            primary.send_signal(signal.SIGSTOP)
        for r in replicas:
            os.killpg(r.pid, signal.SIGCONT)
        wait_for(lambda: all(gone(r.pid) for r in replicas), 300,
                 "the replicas to stop by themselves")
        for r in replicas:
            log = (run_dir / "logs" / f"replica-{r.index}.log").read_text()
            assert "the primary has been silent for" in log and "Traceback" not in log
        primary.send_signal(signal.SIGKILL)
        primary.wait()
        assert all(r.status == "stopped" for r in store.replicas(1))
        before = {(e.trial_id, e.epoch) for e in store.epochs(1)}
        done = cli("run", "--resume", "--run-dir", run_dir, env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        wait_no_strays(mark)
        epochs, trials = store.epochs(1), store.trials(1)
        assert before < {(e.trial_id, e.epoch) for e in epochs}
        assert len(store.segments(1)) == 2
    finally:
        if store is not None:
            store.close()
    both = compare(epochs, trials, read_logs(RunDir(run_dir).trial, (t.id for t in trials)))
    assert both.lost == 0 and not both.repeated and both.logged == both.stored == len(epochs)
    assert cli("check", run_dir).returncode == 0


def test_ctrl_c_stops_the_run_and_its_processes(tmp_path, photos):
    root, _ = photos
    run_dir = tmp_path / "run"
    env, mark = marked_env()
    config = write_config(tmp_path, folder_config(root, workers=1, duration_s=900))
    primary = start(tmp_path, config, run_dir, env)
    wait_for(has_epoch(run_dir), 600, "an epoch")
    primary.send_signal(signal.SIGINT)
    assert primary.wait(timeout=300) == 130
    assert "interrupted: continue with" in primary_log(tmp_path, run_dir)
    wait_no_strays(mark)
    result = json.loads((run_dir / "result.json").read_text())
    assert result["interrupted"] and result["epochs"] >= 1
    assert cli("check", run_dir).returncode == 0


def test_a_refused_official_run_leaves_its_run_dir_to_the_unofficial_one(tmp_path):
    """A folder the scan can index but that is not ImageNet: the refusal takes back the index
    it saved, so the same command declared unofficial starts in the same --run-dir."""
    root = tmp_path / "data"
    make_image_folder(root, classes=2, train_per_class=4, val_per_class=2, corrupt=0, size=32)
    run_dir = tmp_path / "run"
    env, mark = marked_env()
    command = ("run", "--dataset", "imagenet", "--data-dir", root, "--duration", "2s",
               "--run-dir", run_dir)
    done = cli(*command, env=env)
    assert done.returncode == 2 and "official run refused: " in done.stderr
    assert "is not imagenet" in done.stderr and not run_dir.exists()
    (run_dir / "logs").mkdir(parents=True)  # prepared beforehand (as sbatch does): kept
    assert cli(*command, env=env).returncode == 2 and os.listdir(run_dir) == ["logs"]
    done = cli(*command, "--unofficial", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    wait_no_strays(mark)
    result = json.loads((run_dir / "result.json").read_text())
    assert not result["official"] and (run_dir / "dataset-index").is_dir()


def test_the_deadline_ends_everything(tmp_path, photos):
    root, _ = photos
    run_dir = tmp_path / "run"
    env, mark = marked_env()
    config = write_config(tmp_path, folder_config(root, workers=1, duration_s=12))
    done = cli("run", "--config", config, "--run-dir", run_dir, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    wait_no_strays(mark)
    result = json.loads((run_dir / "result.json").read_text())
    assert not result["interrupted"] and result["elapsed_s"] == pytest.approx(12, abs=1e-6)
    # The node's ceiling measured again once the time was over, beside the start's.
    moved = result["interference"]
    assert moved["ceiling_start_ops"] > 0 and moved["ceiling_end_ops"] > 0
    assert cli("check", run_dir).returncode == 0


def test_a_run_without_its_data_fails_loudly(tmp_path):
    run_dir = tmp_path / "run"
    env, mark = marked_env()
    # With the official settings, the missing data is refused before anything starts ...
    done = cli("run", "--dataset", "imagenet", "--data-dir", tmp_path / "missing",
               "--duration", "10m", "--run-dir", run_dir, env=env)
    assert done.returncode == 2 and not (run_dir / "run.json").exists()
    assert done.stderr.startswith("error: official run refused: ") and "--unofficial" in done.stderr
    # ... and a run declared unofficial starts, its replica naming what is missing.
    done = cli("run", "--dataset", "imagenet", "--data-dir", tmp_path / "missing",
               "--duration", "10m", "--run-dir", run_dir, "--unofficial", env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("error: the run cannot train: replica 0")
    assert "missing/train not found" in line and "train/<class>/*.JPEG" in line
    wait_no_strays(mark)
    result = json.loads((run_dir / "result.json").read_text())
    assert not result["valid"] and result["failures"][0]["replica"] == 0
    assert "run_failed" in {v["rule"] for v in result["violations"]}
    assert "The run could not train" in (run_dir / "report.html").read_text()
    assert cli("check", run_dir).returncode == 0


def test_trials_that_keep_failing_alike_stop_the_run(tmp_path):
    """A batch no device can hold: every trial runs out of memory, even at half the batch.
    Three in a row for the same reason end the run with what to change; the failed trials
    stay recorded. (A 6 GiB address-space limit makes the allocation fail on any host.)"""
    run_dir = tmp_path / "run"
    config = write_config(tmp_path, OOM_CONFIG)
    env, mark = marked_env()

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (6 * 2**30, resource.getrlimit(resource.RLIMIT_AS)[1]))

    done = subprocess.run(cli_args("run", "--config", config, "--run-dir", run_dir),
                          capture_output=True, text=True, timeout=900, env=env, preexec_fn=limit)
    assert done.returncode == 1, done.stdout + done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert "3 trials in a row failed" in line and "oom:" in line
    assert "lower train.batch_size" in line
    wait_no_strays(mark)
    store = open_store(run_dir=run_dir)
    trials = store.trials(1)
    assert len(trials) == 3 and all(t.status == "failed" and t.reason.startswith("oom:") for t in trials)
    assert all(t.extra["oom_retry"]["first_batch_size"] == 4096 for t in trials)
    assert cli("check", run_dir).returncode == 0


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
