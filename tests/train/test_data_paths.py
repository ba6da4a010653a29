"""Every dataset through the device pool, as `automlperf train` runs it: real files, real
data-loading worker processes inside the rank processes, one and two ranks."""

import json
import os
import signal
import subprocess

import psutil
import pytest

from automlperf.graph import seeds
from automlperf.train.pool import DevicePool
from automlperf.train.pooltrainer import train_trial
from automlperf.train.trainer import TrialSpec
from helpers import (TEST_MAX_UNREADABLE, cli, cli_args, data_section, default_sigint, marked_env,
                     wait_no_strays)
from imagefolder import assert_every_image_counted, make_image_folder
from test_data import write_cifar

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    root = tmp_path_factory.mktemp("photos")
    return root, make_image_folder(root, classes=3, train_per_class=10, val_per_class=4,
                                   corrupt=2)


def train(tmp_path, *args, env=None, workers=1):
    config = tmp_path / "workers.toml"
    config.write_text(f"[data]\nworkers = {workers}\nmax_unreadable = {TEST_MAX_UNREADABLE}\n")
    done = cli("train", "--config", config, "--epochs", 2, "--json", *args, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


@pytest.mark.parametrize("devices", [1, 2])
def test_train_on_jpeg_folders_with_workers(tmp_path, photos, devices):
    root, counts = photos
    env, mark = marked_env()
    epochs = train(tmp_path, "--dataset", "imagenet", "--data-dir", root, "--model",
                   "resnet_small", "--image-size", 32, "--devices", devices, "--batch-size", 8,
                   env=env)
    assert_every_image_counted(epochs, devices, counts)
    wait_no_strays(mark)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "python"])
def test_train_on_cifar10_files(tmp_path, binary):
    folder = tmp_path / ("cifar-10-batches-bin" if binary else "cifar-10-batches-py")
    write_cifar(folder, binary, per_batch=40)
    epochs = train(tmp_path, "--dataset", "cifar10", "--data-dir", tmp_path, "--batch-size", 32)
    assert all(e["train_images"] == 200 and e["val_images"] == 40 for e in epochs)


def test_train_on_synthetic_data(tmp_path):
    config = tmp_path / "s.toml"
    config.write_text("[data]\nworkers = 1\nsynthetic_images = 64\nsynthetic_classes = 10\n")
    done = cli("train", "--config", config, "--dataset", "synthetic", "--model", "resnet_small",
               "--image-size", 16, "--epochs", 1, "--batch-size", 16, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    (epoch,) = [json.loads(line) for line in done.stdout.splitlines()]
    assert epoch["train_images"] == 64 and epoch["val_images"] == 16


def test_a_killed_rank_takes_its_data_loading_workers_with_it(photos):
    """A rank is killed while its workers decode; they end with it, the trial is a recorded
    crash, and the restarted pool trains the next trial."""
    root, _ = photos
    data = data_section("imagenet", data_dir=root, image_size=32, workers=2,
                        max_unreadable=TEST_MAX_UNREADABLE)
    graph = seeds.resnet_small(num_classes=3, image_size=32)
    spec = TrialSpec("crash", graph.to_dict(), epochs=2, batch_size=4, patience=5)
    workers: list[psutil.Process] = []
    with DevicePool(["cpu"], data) as pool:
        def kill_mid_epoch(kind, msg):
            if kind == "progress" and not workers:
                rank = psutil.Process(pool._ranks[0].process.pid)
                workers.extend(rank.children(recursive=True))
                rank.kill()

        out = train_trial(pool, spec, kill_mid_epoch)
        assert out.status == "failed" and out.reason.startswith("crash:")
        assert len(workers) == 2  # both were decoding when their rank died
        gone, alive = psutil.wait_procs(workers, timeout=60)
        assert not alive
        again = TrialSpec("after", graph.to_dict(), epochs=1, batch_size=4, patience=5)
        assert train_trial(pool, again).status == "completed"


def test_ctrl_c_stops_train_and_every_process_it_started(tmp_path, photos):
    root, _ = photos
    env, mark = marked_env()
    config = tmp_path / "workers.toml"
    config.write_text(f"[data]\nworkers = 1\nmax_unreadable = {TEST_MAX_UNREADABLE}\n")
    # Its own process group, as a terminal's foreground job: Ctrl-C reaches all of it.
    proc = subprocess.Popen(cli_args("train", "--config", config, "--dataset", "imagenet",
                                     "--data-dir", root, "--model", "resnet_small",
                                     "--image-size", 32, "--epochs", 1000, "--batch-size", 4,
                                     "--json"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True, preexec_fn=default_sigint)
    first = proc.stdout.readline()  # one epoch done: ranks and workers are at work
    assert json.loads(first)["epoch"] == 0
    os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=120) == 130
    assert "interrupted" in proc.stderr.read()
    wait_no_strays(mark)
