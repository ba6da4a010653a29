"""Resource faults in real training runs: /dev/shm smaller than the image loader wants, and
the run directory's file system turning read-only mid-run, a training process killed by the
kernel's out-of-memory killer. Each either carries on with a one-line warning or stops with
a one-line error: never a traceback, never silent loss. (A trial whose allocation fails:
tests/e2e/test_run.py, test_trials_that_keep_failing_alike_stop_the_run.)"""

import logging
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from automlperf.train.data import folders
from automlperf.train.data import SHARED_BUDGET, DataError, fit_shared_budget, plan_loader
from helpers import (KERNEL_OOM_CONFIG, MemoryCgroup, cli, cli_args, folder_config, marked_env,
                     wait_for, wait_no_strays)

IMAGE = 32 * 32 * 3  # bytes of one decoded 32 px image


@pytest.fixture
def unwarned(monkeypatch):
    monkeypatch.setattr(folders, "_shm_warned", False)


def test_the_loader_fits_its_shared_memory_to_what_is_free(unwarned, caplog):
    assert fit_shared_budget(SHARED_BUDGET, 16, 2, 1, IMAGE, None) == SHARED_BUDGET
    assert fit_shared_budget(SHARED_BUDGET, 16, 2, 1, IMAGE, 8 * SHARED_BUDGET) == SHARED_BUDGET
    assert fit_shared_budget(SHARED_BUDGET, 16, 0, 1, IMAGE, 0) == SHARED_BUDGET  # no workers
    with caplog.at_level(logging.WARNING, logger="automlperf.data"):
        small = fit_shared_budget(SHARED_BUDGET, 16, 2, 2, IMAGE, 1 << 20)
        again = fit_shared_budget(SHARED_BUDGET, 16, 2, 2, IMAGE, 1 << 20)
    assert small == again and 2 * IMAGE <= small < SHARED_BUDGET
    plan = plan_loader(16, 2, IMAGE, False, small)
    # What is in flight, and a batch beside it, fit in this rank's half of the free space.
    assert plan.shared_bytes + 18 * IMAGE <= (1 << 20) // 2
    (warning,) = caplog.records  # once per process, not per trial
    assert "/dev/shm has 1.0 MiB free" in warning.getMessage()
    with pytest.raises(DataError) as refused:
        fit_shared_budget(SHARED_BUDGET, 16, 2, 1, IMAGE, 32 * 1024)
    message = str(refused.value)
    assert "\n" not in message and "enlarge /dev/shm" in message
    assert "data.workers = 0" in message


def needs_root(*tools):
    if os.geteuid() != 0:
        pytest.skip("needs root to mount file systems")
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    from imagefolder import make_image_folder

    root = tmp_path_factory.mktemp("photos")
    make_image_folder(root, classes=4, train_per_class=12, val_per_class=4, corrupt=2)
    return root


@pytest.mark.slow
@pytest.mark.parametrize("shm, stops", [("256k", False), ("32k", True)],
                         ids=["small-carries-on", "tiny-stops"])
def test_a_small_dev_shm(tmp_path, photos, shm, stops):
    """/dev/shm (a tmpfs of ``shm`` in a mount namespace of the run's own) far below the
    loader's budget: a smaller budget and one warning; too small for one batch: one error."""
    needs_root("unshare", "mount")
    run_dir = tmp_path / "run"
    config = tmp_path / "run.toml"
    config.write_text(folder_config(photos, workers=1, image_size=32, duration_s=900,
                                    max_rounds=3))
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c",
         f'mount -t tmpfs -o size={shm} tmpfs /dev/shm && exec "$@"', "sh",
         *cli_args("run", "--config", config, "--run-dir", run_dir)],
        capture_output=True, text=True, timeout=900)
    log = (run_dir / "logs" / "replica-0.log").read_text()
    assert "Traceback" not in done.stderr + log
    if stops:
        assert done.returncode == 1, done.stdout + done.stderr
        line = done.stderr.strip().splitlines()[-1]
        assert line.startswith("error: the run cannot train: replica 0")
        assert "enlarge /dev/shm" in line
        # A data failure, with the data's fix; no traceback to look for.
        assert 'failed with "data: /dev/shm has' in line and "traceback" not in line
    else:
        assert done.returncode == 0, done.stdout + done.stderr
        warned = [line for line in log.splitlines() if "/dev/shm has" in line]
        assert len(warned) == 1 and "enlarge /dev/shm" in warned[0]
    assert cli("check", run_dir).returncode == 0


def records(run_dir):
    from automlperf.store import open_store

    store = open_store(f"sqlite:///{run_dir / 'history.db'}")
    try:
        return ({("epoch", e.trial_id, e.epoch) for e in store.epochs(1)}
                | {("trial", t.id) for t in store.trials(1)})
    finally:
        store.close()


@pytest.mark.slow
def test_the_run_directory_turning_read_only(tmp_path, photos):
    """The run directory on a small ext4 file system (a loop device) mounted with
    errors=remount-ro; once an epoch is recorded, an ext4 error turns it read-only under the
    open files, as a failing disk would. The run stops in one line with exit status 1, and
    everything recorded before is there when the file system is mounted again."""
    needs_root("mkfs.ext4", "mount", "findmnt")
    image, mount = tmp_path / "fs.img", tmp_path / "mnt"
    subprocess.run(["truncate", "-s", "256M", image], check=True)
    subprocess.run(["mkfs.ext4", "-q", image], check=True)
    mount.mkdir()

    def mount_it():
        subprocess.run(["mount", "-o", "loop,errors=remount-ro", image, mount], check=True)

    mount_it()
    try:
        run_dir = mount / "run"
        config = tmp_path / "run.toml"
        config.write_text(folder_config(photos, workers=1, image_size=32, duration_s=900))
        env, mark = marked_env()
        with open(tmp_path / "run.err", "w") as err:
            primary = subprocess.Popen(cli_args("run", "--config", config, "--run-dir", run_dir),
                                       stdout=subprocess.DEVNULL, stderr=err, env=env)

        def an_epoch():
            try:
                return any(kind == "epoch" for kind, *_ in records(run_dir))
            except Exception:  # the store is being created
                return False

        wait_for(an_epoch, 600, "an epoch")
        before = records(run_dir)
        device = subprocess.run(["findmnt", "-n", "-o", "SOURCE", mount], capture_output=True,
                                text=True, check=True).stdout.strip()
        Path(f"/sys/fs/ext4/{Path(device).name}/trigger_fs_error").write_text("test\n")
        assert primary.wait(timeout=600) == 75  # resumable once the disk takes writes
        stderr = (tmp_path / "run.err").read_text()
        assert "Traceback" not in stderr
        line = stderr.strip().splitlines()[-1]
        assert line.startswith("error: ") and "read-only file system" in line, stderr
        assert f"--resume --run-dir {run_dir}" in line
        wait_no_strays(mark)  # the replica and its training processes ended with the run
        subprocess.run(["umount", mount], check=True)
        # The loop device outlives the unmount for a moment; mounted again before it is let
        # go, the image would come back with the same, still read-only, file system.
        wait_for(lambda: not subprocess.run(["losetup", "-j", str(image)], capture_output=True,
                                            text=True).stdout.strip(),
                 120, "the loop device to be released")
        mount_it()
        assert before <= records(run_dir)
    finally:
        subprocess.run(["umount", mount], check=False)


# A killed process returns its memory a moment after the kernel stops counting it as the
# victim; an allocation by the primary in that moment has the kernel take a second process,
# the replica (unprivileged, no process can lower its own score below 0 to be spared).
SECOND_VICTIM = "every replica exited with an error before the deadline (replica 0: -9, " \
    "the kernel's out-of-memory killer ended it"


def run_out_of_memory(tmp_path, attempt):
    """One run in a memory cgroup of 1.5 GiB: (its outcome, the group's kill count, its run
    directory)."""
    group, why = MemoryCgroup.make(1536 << 20)
    if group is None:
        pytest.skip(why)
    config = tmp_path / "oom.toml"
    # One failed trial (and its retry) is enough to stop the run here.
    config.write_text(KERNEL_OOM_CONFIG.replace("[run]\n", "[run]\nmax_repeated_failures = 1\n"))
    run_dir = tmp_path / f"run-{attempt}"
    env, mark = marked_env()
    try:
        done = subprocess.run(cli_args("run", "--config", config, "--run-dir", run_dir),
                              capture_output=True, text=True, timeout=900, env=env,
                              preexec_fn=group.enter)
        kills = group.kills()
        wait_no_strays(mark)
    finally:
        group.remove()
    return done, kills, run_dir


@pytest.mark.slow
def test_a_rank_killed_by_the_kernels_oom_killer(tmp_path):
    """The run in a memory cgroup of 1.5 GiB, as a batch job's limit: the kernel's OOM
    killer ends the training process (signal 9; no allocation fails in Python). The trial
    is an `oom` failure, retried once at half the batch, and the run stops in one line with
    the advice for memory; the primary and the replica survive to say so. Where the kernel
    takes the replica as well, the line says that, with the same advice, and the scenario
    is run again (the kernel's own report decides, not a clock); so it is where the kernel
    takes the primary as well as a training process (SIGKILL, with two kills or more in the
    group's count), since nothing is then left to say it."""
    for attempt in range(3):
        done, kills, run_dir = run_out_of_memory(tmp_path, attempt)
        if done.returncode == -signal.SIGKILL and kills is not None and kills >= 2:
            continue
        assert done.returncode == 1, f"{done.returncode}, {kills} kills: {done.stdout + done.stderr}"
        assert "Traceback" not in done.stderr
        line = done.stderr.strip().splitlines()[-1]
        if SECOND_VICTIM not in line:
            break
        assert "give each replica more memory" in line
    else:
        pytest.fail("the kernel took more than a training process in each of 3 runs")
    assert line.startswith("error: the run cannot train: replica 0")
    assert "out-of-memory killer" in line and "give each replica more memory" in line
    assert kills >= 2  # the trial, and its retry at half the batch
    from automlperf.store import open_store

    store = open_store(run_dir=run_dir)
    try:
        (trial,) = store.trials(1)
    finally:
        store.close()
    assert trial.status == "failed" and trial.reason.startswith("oom: training process 0")
    assert trial.extra["failure"] == "oom" and trial.extra["oom_kill"]
    assert trial.extra["oom_retry"]["first_batch_size"] == 4096
    assert cli("check", run_dir).returncode == 0
