"""Data faults a site's copy of a dataset throws at a run: files that are not images, cut
short, empty, of another format or depth than their name says, vanishing or unreadable after
the index was built, a class or a split without images. Each is either read correctly or
counted as unreadable with an example; too many unreadable images fail the trial for its
data, and an epoch that read no image is never a completed one."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from automlperf.graph import seeds
from automlperf.measure.score import violations
from automlperf.train import data as datasets
from automlperf.train.data import folders
from automlperf.train.trainer import RankContext, TrialSpec, train_on_rank
from helpers import cli, data_section, folder_config, marked_env, wait_no_strays, write_config
from imagefolder import make_image_folder, photo

CPU = torch.device("cpu")


def _unreadable(path, kind):
    good = photo().resize((40, 30))
    if kind == "random bytes":
        path.write_bytes(np.random.default_rng(0).integers(0, 256, 600, dtype=np.uint8).tobytes())
    elif kind == "zero bytes":
        path.write_bytes(b"")
    elif kind == "truncated JPEG":
        good.save(path, format="JPEG")
        path.write_bytes(path.read_bytes()[:300])


def _readable(path, kind):
    good = photo().resize((40, 30))
    if kind == "PNG named .JPEG":
        good.save(path, format="PNG")
    elif kind == "greyscale":
        good.convert("L").save(path, format="JPEG")
    elif kind == "CMYK":
        good.convert("CMYK").save(path, format="JPEG")
    elif kind == "16-bit greyscale PNG":
        wide = (np.asarray(good.convert("L"), dtype=np.uint16) * 257)
        Image.fromarray(wide).save(path, format="PNG")


def _one_class_folder(root, per_class=4):
    for split in ("train", "val"):
        folder = root / split / "n00000000"
        folder.mkdir(parents=True)
        for i in range(per_class):
            photo().resize((40, 30)).save(folder / f"{split}_{i}.JPEG", quality=90)
    return root / "train" / "n00000000"


def _all_corrupt(root, classes=2, per_class=3):
    """An ImageNet-layout tree in which no file is an image."""
    rng = np.random.default_rng(1)
    for split in ("train", "val"):
        for c in range(classes):
            folder = root / split / f"n{c:08d}"
            folder.mkdir(parents=True)
            for i in range(per_class):
                (folder / f"{split}_{c}_{i}.JPEG").write_bytes(
                    rng.integers(0, 256, 500, dtype=np.uint8).tobytes())


def _read_all(ds, split="train"):
    return sum(len(y) for _, y in ds.batches(split, 0, 1, 8, 0, 0, CPU))


@pytest.mark.parametrize("kind", ["random bytes", "zero bytes", "truncated JPEG"])
def test_an_unreadable_file_is_counted_with_an_example(tmp_path, kind):
    folder = _one_class_folder(tmp_path)
    _unreadable(folder / "bad.JPEG", kind)
    ds = datasets.ImageFolderDataset(tmp_path, image_size=16, workers=0)
    assert _read_all(ds) == 4
    assert ds.skipped == 1
    assert ds.unreadable.startswith(str(folder / "bad.JPEG") + ": ")


@pytest.mark.parametrize("kind", ["PNG named .JPEG", "greyscale", "CMYK", "16-bit greyscale PNG"])
def test_another_format_or_depth_than_the_name_says_is_read(tmp_path, kind):
    folder = _one_class_folder(tmp_path, per_class=1)
    (folder / "train_0.JPEG").unlink()
    _readable(folder / "odd.JPEG", kind)
    ds = datasets.ImageFolderDataset(tmp_path, image_size=16, workers=0)
    (x, y), = list(ds.batches("val", 0, 1, 8, 0, 0, CPU))  # centre crop: no randomness
    assert ds.skipped == 0 and len(y) == 1
    odd = ds.index.rows("train")[0]
    pixels = np.zeros((16, 16, 3), dtype=np.uint8)
    assert folders._FolderChunks(ds.reader, 16, 0)._decode(odd, False, 0, pixels) is None
    # The photo's mid-tones, not clipped to white (Pillow's own 16-bit conversion) nor black.
    assert 40 < pixels.mean() < 215


def test_a_file_that_vanishes_after_the_index_was_built_is_counted(tmp_path):
    folder = _one_class_folder(tmp_path)
    ds = datasets.ImageFolderDataset(tmp_path, image_size=16, workers=1)
    (folder / "train_2.JPEG").unlink()
    assert _read_all(ds) == 3
    assert ds.skipped == 1 and str(folder / "train_2.JPEG") in ds.unreadable
    ds.release()


def _read_as_nobody(root, queue):
    """In a forked child: drop root (who reads any file), then read the training split."""
    if os.geteuid() == 0:
        os.setgid(65534)
        os.setuid(65534)
    ds = datasets.ImageFolderDataset(root, image_size=16, workers=0)
    queue.put((_read_all(ds), ds.skipped, ds.unreadable))


def test_a_file_that_loses_read_permission_is_counted(tmp_path):
    root = Path(tempfile.mkdtemp(prefix="automlperf-perm-"))  # outside the private pytest tree
    try:
        folder = _one_class_folder(root)
        for path in [root, *root.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        (folder / "train_1.JPEG").chmod(0)
        ctx = multiprocessing.get_context("fork")
        queue = ctx.Queue()
        child = ctx.Process(target=_read_as_nobody, args=(root, queue))
        child.start()
        read, skipped, example = queue.get(timeout=300)
        child.join(timeout=300)
        assert (read, skipped) == (3, 1)
        assert example.startswith(str(folder / "train_1.JPEG")) and "Permission denied" in example
    finally:
        shutil.rmtree(root)


def test_a_missing_validation_folder_is_refused_in_one_line(tmp_path):
    _one_class_folder(tmp_path)
    for f in (tmp_path / "val" / "n00000000").iterdir():
        f.unlink()
    (tmp_path / "val" / "n00000000").rmdir()
    (tmp_path / "val").rmdir()
    with pytest.raises(datasets.DataError, match=r"val not found: an imagenet data dir needs"):
        datasets.ImageFolderDataset(tmp_path)


def test_a_class_folder_without_images_still_defines_its_class(tmp_path):
    _one_class_folder(tmp_path)
    (tmp_path / "train" / "n00000001").mkdir()
    ds = datasets.ImageFolderDataset(tmp_path, image_size=16, workers=0)
    assert ds.num_classes == 2 and ds.train_size == 4 and _read_all(ds) == 4


def _trial(root, max_unreadable=0.05, epochs=1):
    ds = datasets.load(data_section("imagenet", data_dir=str(root), image_size=16, workers=0,
                                    max_unreadable=max_unreadable))
    graph = seeds.resnet_small(num_classes=ds.num_classes, image_size=16)
    spec = TrialSpec("t", graph.to_dict(), epochs=epochs, batch_size=8, patience=5)
    events = []
    out = train_on_rank(spec, RankContext(0, 1, CPU, ds), lambda kind, e: events.append((kind, e)))
    return out, [e for kind, e in events if kind == "epoch"]


def test_an_epoch_that_read_no_image_fails_the_trial_for_its_data(tmp_path):
    """Every training file corrupt: never a completed epoch of nothing."""
    _all_corrupt(tmp_path, per_class=2)
    out, epochs = _trial(tmp_path)
    assert out.status == "failed" and out.extra["failure"] == "data"
    assert out.reason.startswith("data: no training image of imagenet could be read in epoch 0: "
                                 "all 4 were unreadable")
    assert "(e.g. " + str(tmp_path / "train") in out.reason
    assert epochs == [] and out.epochs == 0


def test_unreadable_validation_images_past_the_limit_fail_the_trial(tmp_path):
    make_image_folder(tmp_path, classes=2, train_per_class=6, val_per_class=2, corrupt=0)
    for i in range(2):
        (tmp_path / "val" / f"n{i:08d}" / f"val_{i}_0.JPEG").write_bytes(b"not a jpeg")
    out, epochs = _trial(tmp_path, max_unreadable=0.4)
    assert out.status == "failed" and out.extra["failure"] == "data"
    assert "2 of 4 validation images (50.0%) could not be read in epoch 0, more than " \
           "data.max_unreadable (40.0%)" in out.reason
    assert epochs == []


def test_a_few_unreadable_images_below_the_limit_train_and_are_counted(tmp_path):
    make_image_folder(tmp_path, classes=2, train_per_class=25, val_per_class=3, corrupt=0)
    (tmp_path / "train" / "n00000000" / "train_0_3.JPEG").write_bytes(b"")  # 1 of 50: 2 %
    out, epochs = _trial(tmp_path, epochs=2)
    assert out.status == "completed", out.reason
    assert [(e["train_images"], e["skipped_images"], e["val_skipped"]) for e in epochs] == \
        [(49, 1, 0), (49, 1, 0)]
    # The same share past a lower limit fails the trial, naming count, share and limit.
    out, _ = _trial(tmp_path, max_unreadable=0.01)
    assert out.status == "failed"
    assert "1 of 50 training images (2.0%) could not be read in epoch 0, more than " \
           "data.max_unreadable (1.0%)" in out.reason


def test_any_unreadable_image_makes_an_official_run_not_valid():
    official = dict(dataset="imagenet", dataset_official=True, fixed_changes=[],
                    elapsed_s=7200, precisions=["bf16"], error=0.2)
    assert violations(**official)[:2] == (True, True)
    _, valid, found = violations(**official, unreadable=3)
    assert not valid
    assert [v["rule"] for v in found] == ["unreadable_images"]
    assert found[0]["detail"].startswith("3 images of the counted epochs could not be read")


@pytest.mark.slow
def test_a_run_on_a_folder_where_no_image_decodes_stops_in_one_line(tmp_path):
    """The run ends with exit 1 and one line naming the dataset problem (no traceback);
    everything it recorded is kept and the result says why."""
    root = tmp_path / "data"
    _all_corrupt(root)
    run_dir = tmp_path / "run"
    env, mark = marked_env()
    config = write_config(tmp_path, folder_config(root, workers=1, duration_s=900))
    done = cli("run", "--config", config, "--run-dir", run_dir, env=env, timeout=900)
    assert done.returncode == 1, done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in done.stderr
    assert "3 trials in a row failed with \"data: no training image of imagenet could be read" \
        in errors[0]
    assert "check the dataset" in errors[0]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["epochs"] == 0 and result["score"] == 0 and not result["valid"]
    assert result["trial_status"] == {"failed": 3}
    assert [v["rule"] for v in result["violations"]].count("run_failed") == 1
    wait_no_strays(mark)


@pytest.mark.slow
def test_a_run_with_a_few_unreadable_images_trains_and_reports_them(tmp_path):
    """2 % of the training images and none of the validation ones are corrupt: the run
    trains, and result.json, check and the report say how many images it skipped."""
    root = tmp_path / "data"
    make_image_folder(root, classes=2, train_per_class=25, val_per_class=4, corrupt=0)
    (root / "train" / "n00000001" / "train_1_7.JPEG").write_bytes(b"\xff\xd8\xff")
    run_dir = tmp_path / "run"
    config = write_config(tmp_path, folder_config(root, workers=0, duration_s=900, max_rounds=1,
                                                  max_unreadable=0.05))
    done = cli("run", "--config", config, "--run-dir", run_dir, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads((run_dir / "result.json").read_text())
    assert result["epochs"] >= 1
    assert result["unreadable_images"] == {"train": result["epochs"], "val": 0}
    assert result["train_images"] == 49 * result["epochs"]
    checked = cli("check", run_dir)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"skipped: {result['epochs']} training and 0 validation images could not be read" \
        in checked.stdout
    report = (run_dir / "report.html").read_text()
    assert f"{result['epochs']} training + 0 validation images could not be read" in report
    # An edited count is named by check.
    result["unreadable_images"]["train"] = 0
    (run_dir / "result.json").write_text(json.dumps(result))
    edited = cli("check", run_dir)
    assert edited.returncode == 1 and "unreadable_images" in edited.stdout


@pytest.mark.slow
def test_a_run_whose_every_trial_failed_before_the_rule_could_fire_exits_1(tmp_path):
    """Too many unreadable images and a round limit of one trial: the run ends before three
    failures in a row, having trained nothing; it says so and exits 1."""
    root = tmp_path / "data"
    make_image_folder(root, classes=2, train_per_class=10, val_per_class=2, corrupt=0)
    for k in range(4):  # 4 of 24 training images: 17 %, over the 5 % default
        (root / "train" / f"n{k % 2:08d}" / f"bad_{k}.JPEG").write_bytes(b"\x00" * 100)
    run_dir = tmp_path / "run"
    config = write_config(tmp_path, folder_config(root, workers=0, duration_s=900, max_rounds=1,
                                                  max_unreadable=0.05))
    done = cli("run", "--config", config, "--run-dir", run_dir, timeout=900)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "error: the run cannot train: no trial completed an epoch: 1 trial(s) failed, the " \
           "last with \"data: 4 of 24 training images (16.7%) could not be read" in done.stderr
    assert "Traceback" not in done.stderr
    assert json.loads((run_dir / "result.json").read_text())["epochs"] == 0


@pytest.mark.slow
def test_a_run_without_a_validation_folder_stops_in_one_line_and_verifies(tmp_path):
    root = tmp_path / "data"
    make_image_folder(root, classes=2, train_per_class=4, val_per_class=1, corrupt=0)
    shutil.rmtree(root / "val")
    run_dir = tmp_path / "run"
    config = write_config(tmp_path, folder_config(root, workers=0, duration_s=900))
    done = cli("run", "--config", config, "--run-dir", run_dir, timeout=900)
    assert done.returncode == 1, done.stdout + done.stderr
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("error:")]
    assert f"{root / 'val'} not found: an imagenet data dir needs" in line
    # The run recorded that its data could not be read; check finds the same, no mismatch.
    checked = cli("check", run_dir)
    assert checked.returncode == 0, checked.stdout + checked.stderr
