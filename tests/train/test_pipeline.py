"""The image-folder input pipeline: one loader per trial with persistent workers, equal step
counts on every rank, small chunks within a byte budget, draft decoding, NHWC output, and
the file index scanned once and shared as arrays. Real JPEG files, real worker processes."""

import numpy as np
import psutil
import pytest
import torch
from PIL import JpegImagePlugin

from automlperf.train import data as datasets
from automlperf.dataset.folder import index_folder
from automlperf.train.data import (ImageFolderDataset, plan_loader, plan_steps, prepare_index,
                                   step_plan)
from helpers import data_section
from imagefolder import make_image_folder, photo

CPU = torch.device("cpu")


@pytest.mark.parametrize("n,world,per_rank", [(1437, 2, 359), (1437, 2, 32), (65, 2, 32),
                                              (101, 3, 7), (50, 2, 8), (16, 4, 2), (9, 1, 4)])
def test_every_rank_takes_the_same_steps_and_every_image_is_used_once(n, world, per_rank):
    for split in ("train", "val"):
        plans = [step_plan(n, r, world, per_rank, split, epoch=3, seed=1) for r in range(world)]
        assert {len(p) for p in plans} == {plan_steps(n, world, per_rank)}
        rows = torch.cat([torch.cat(p) for p in plans])
        assert sorted(rows.tolist()) == list(range(n))
        # Each step gives every rank at least two images (BatchNorm), at most two over the
        # configured batch, and ranks' shares differ by at most one.
        for step in zip(*plans):
            sizes = [len(s) for s in step]
            assert min(sizes) >= 2 and max(sizes) <= per_rank + 2 and max(sizes) - min(sizes) <= 1


def test_uneven_shards_give_in_memory_datasets_equal_batch_counts():
    # 1437 images over 2 ranks at 359 per rank: shards of 719 and 718 images would take 3 and
    # 2 steps, leaving one rank alone in an all-reduce.
    ds = datasets.load(data_section("digits"))
    counts = [len(list(ds.batches("train", r, 2, 359, 0, 0, CPU))) for r in range(2)]
    assert counts == [2, 2]
    seen = sum(len(y) for r in range(2) for _, y in ds.batches("train", r, 2, 359, 0, 0, CPU))
    assert seen == 1437


def test_memory_stays_within_the_byte_budget_at_an_h100_batch():
    image = 224 * 224 * 3
    plan = plan_loader(1112, 8, image, pinned=True)
    assert plan.shared_bytes <= datasets.SHARED_BUDGET
    assert plan.chunk <= datasets.CHUNK_IMAGES < 1112
    # The ring is the memory: whole batch slots, page-locked where they lie on a GPU (not a
    # pinned copy beside them), made once per trial.
    assert plan.slots == 3 and plan.pinned_bytes == plan.shared_bytes == 3 * 1114 * (image + 16)
    # A budget of one slot still decodes (one batch at a time); every worker gets chunks.
    tight = plan_loader(1112, 8, image, pinned=False, budget=1114 * (image + 16))
    assert tight.slots == 1 and tight.pinned_bytes == 0 and tight.chunk == datasets.CHUNK_IMAGES
    assert plan_loader(16, 2, image, pinned=False, chunk=32).chunk == 9
    # Without workers: one slot of the rank's own memory (two on a GPU), nothing shared.
    alone = plan_loader(16, 0, image, pinned=True)
    assert (alone.slots, alone.shared_bytes, alone.pinned_bytes) == (2, 0, 2 * 18 * (image + 16))


def worker_pids(ds):
    return set(ds._loader.pool.pids)


@pytest.mark.slow
def test_one_loader_per_trial_serves_every_epoch_and_validation(tmp_path):
    counts = make_image_folder(tmp_path, classes=4, train_per_class=10, val_per_class=3)
    ds = ImageFolderDataset(tmp_path, image_size=32, workers=2, chunk_images=4)
    me = psutil.Process()
    before = {c.pid for c in me.children()}
    first = [(x, y) for x, y in ds.batches("train", 0, 1, 16, 0, 7, CPU)]
    pids = worker_pids(ds)
    assert len(pids) == 2 and pids <= {c.pid for c in me.children()} - before
    again = [(x, y) for x, y in ds.batches("train", 0, 1, 16, 0, 7, CPU)]
    second = [(x, y) for x, y in ds.batches("train", 0, 1, 16, 1, 7, CPU)]
    val = [(x, y) for x, y in ds.batches("val", 0, 1, 16, 0, 7, CPU)]
    assert worker_pids(ds) == pids  # the same workers, no new ones per pass
    # Epoch-aware although the workers persist: an epoch repeats exactly, the next differs.
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(first, again))
    assert not torch.equal(torch.cat([y for _, y in first]), torch.cat([y for _, y in second]))
    n_train = sum(len(y) for _, y in first)
    assert n_train == counts["train"] and sum(len(y) for _, y in val) == counts["val"]
    assert ds.skipped == 3 * 2 + 2  # every pass met its split's two corrupt files
    # Batches of 16 assembled from chunks of 4; NHWC underneath, so channels-last is free.
    x = max((x for x, _ in first), key=len)
    assert x.shape == (16, 3, 32, 32) and x.dtype == torch.float32
    assert x.is_contiguous(memory_format=torch.channels_last)
    ds.release()
    assert ds._loader is None
    gone = psutil.wait_procs([psutil.Process(p) for p in pids if psutil.pid_exists(p)], timeout=60)
    assert not gone[1]


@pytest.mark.slow
def test_a_new_trial_shape_gets_a_new_loader(tmp_path):
    make_image_folder(tmp_path, classes=2, train_per_class=6, val_per_class=2, corrupt=0)
    ds = ImageFolderDataset(tmp_path, image_size=24, workers=1)
    list(ds.batches("train", 0, 1, 4, 0, 0, CPU))
    old = ds._loader
    list(ds.batches("train", 0, 1, 2, 0, 0, CPU))  # a retry at half the batch
    assert ds._loader is not old and old.pool is None
    ds.release()


def test_jpegs_decode_at_reduced_scale_when_the_crop_allows(tmp_path, monkeypatch):
    folder = tmp_path / "train" / "n0"
    folder.mkdir(parents=True)
    photo().resize((2000, 1500)).save(folder / "big.JPEG", quality=90)
    (tmp_path / "val" / "n0").mkdir(parents=True)
    photo().resize((1600, 1200)).save(tmp_path / "val" / "n0" / "big.JPEG", quality=90)
    sizes = []
    real = JpegImagePlugin.JpegImageFile.draft

    def spy(self, mode, size):
        result = real(self, mode, size)
        sizes.append(self.size)
        return result

    monkeypatch.setattr(JpegImagePlugin.JpegImageFile, "draft", spy)
    ds = ImageFolderDataset(tmp_path, image_size=32, workers=0)
    x, y = next(ds.batches("val", 0, 1, 2, 0, 0, CPU))
    assert sizes and sizes[-1][0] <= 1600 // 8 and min(sizes[-1]) >= round(32 / 0.875)
    assert x.shape == (1, 3, 32, 32) and torch.isfinite(x).all()
    xt, _ = next(ds.batches("train", 0, 1, 2, 0, 0, CPU))
    assert len(sizes) == 2 and sizes[-1][0] < 2000  # decoded smaller than the file
    assert xt.shape == (1, 3, 32, 32)


def test_the_index_is_arrays_scanned_once_and_mapped_by_every_rank(tmp_path):
    counts = make_image_folder(tmp_path / "d", classes=3, train_per_class=4, val_per_class=2,
                               corrupt=0)
    index = prepare_index(tmp_path / "d", tmp_path / "index")
    assert isinstance(index.blob, np.ndarray) and index.labels.dtype == np.int32
    # New files after the scan are not seen by a dataset built from the saved index.
    (tmp_path / "d" / "train" / "n00000000" / "late.JPEG").write_bytes(
        (tmp_path / "d" / "train" / "n00000000" / "train_0_0.JPEG").read_bytes())
    ds = datasets.load(data_section("imagenet", data_dir=tmp_path / "d", image_size=16, workers=0),
                       index_dir=str(tmp_path / "index"))
    assert (ds.train_size, ds.val_size) == (counts["train"], counts["val"])
    assert isinstance(ds.index.blob, np.memmap) and not hasattr(ds, "_items")
    assert ds.index.items("val") == index_folder(tmp_path / "d").items("val")
    with pytest.raises(datasets.DataError, match="image index cannot be read"):
        datasets.load(data_section("imagenet", data_dir=tmp_path / "d"), index_dir=str(tmp_path / "missing"))
