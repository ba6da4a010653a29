"""Validation decoded once per trial and replayed from the device: the same batches bit for
bit, the same unreadable counts, and decoding every epoch where the shard does not fit."""

import io

import numpy as np
import pytest
import torch
from PIL import Image

from automlperf.train.data import GpuImageFolderDataset, ImageFolderDataset, load
from automlperf.train.data import valcache
from helpers import data_section
from imagefolder import make_image_folder

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("valcache")
    make_image_folder(root, classes=3, train_per_class=6, val_per_class=4, corrupt=2)
    return root


class StandInDecoder:
    """Pillow behind the GPU path's decoder seam: the path's own logic, on a CPU."""

    name = "stand-in"

    def versions(self):
        return {}

    def decode(self, files, device):
        out = []
        for f in files:
            with Image.open(io.BytesIO(f.numpy().tobytes())) as image:
                pixels = np.array(image.convert("RGB"))
            out.append(torch.from_numpy(pixels).permute(2, 0, 1).contiguous().to(device))
        return out


def dataset(path, folder, **kw):
    if path == "gpu":
        return GpuImageFolderDataset(folder, 20, workers=2, decoder=StandInDecoder())
    return ImageFolderDataset(folder, image_size=20, workers=2, chunk_images=3)


def epochs(ds, n, rank=0, world=1, per_rank=4, seed=3):
    """Each epoch's validation batches (copied) and the unreadable counts after it, as a
    trial asks for them: training, then validation."""
    out = []
    for epoch in range(n):
        list(ds.batches("train", rank, world, per_rank, epoch, seed, CPU))
        if epoch == n - 1:
            ds.expect_next(None)
        val = [(x.clone(), y.clone()) for x, y in ds.batches("val", rank, world, per_rank, 0,
                                                              seed, CPU)]
        out.append((val, ds.skipped, ds.unreadable))
    return out


@pytest.mark.parametrize("path,rank,world", [("cpu", 0, 1), ("cpu", 1, 2), ("gpu", 1, 2)])
def test_replayed_validation_is_bitwise_a_new_pass_with_the_same_counts(folder, path, rank,
                                                                        world):
    kept, fresh = dataset(path, folder), dataset(path, folder)
    fresh.val_cache = False
    try:
        got, want = epochs(kept, 3, rank, world), epochs(fresh, 3, rank, world)
        assert kept.val_cache_note == "kept on the device" and kept._val.replays == 2
        assert fresh.val_cache_note == "off (data.val_cache)" and fresh._val.replays == 0
        for (val, skipped, example), (wval, wskipped, wexample) in zip(got, want):
            assert skipped == wskipped and example == wexample
            assert len(val) == len(wval) and val
            for (x, y), (wx, wy) in zip(val, wval):
                assert torch.equal(y, wy) and torch.equal(x, wx)  # bit for bit
        # The corrupt validation file is still counted each epoch, as a new pass counts it.
        assert got[2][1] - got[1][1] == want[2][1] - want[1][1] > 0
        if path == "gpu":
            return  # its loader keeps no counts
        # The cached run's workers decoded its validation shard once, the other's three times.
        readable = sum(len(y) for _, y in want[0][0])
        assert 0 < readable <= valcache.shard_images(fresh.val_size, rank, world, 4, 3)
        assert fresh._loader.stats.images - kept._loader.stats.images == 2 * readable
    finally:
        kept.release()
        fresh.release()


def test_with_validation_kept_the_workers_decode_the_next_epoch_and_nothing_after_the_last(folder):
    ds = ImageFolderDataset(folder, image_size=16, workers=1, chunk_images=4)
    try:
        loader = ds.loader(0, 1, 4, 0, CPU)
        list(ds.batches("train", 0, 1, 4, 0, 0, CPU))
        list(ds.batches("val", 0, 1, 4, 0, 0, CPU))  # decoded and kept
        assert loader._queue[0].key == ("train", 1)
        list(ds.batches("train", 0, 1, 4, 1, 0, CPU))
        # Validation needs no decoding now: the next training epoch is planned instead.
        assert loader._queue[0].key == ("train", 2) and loader._queue[0].slot is not None
        list(ds.batches("val", 0, 1, 4, 0, 0, CPU))
        list(ds.batches("train", 0, 1, 4, 2, 0, CPU))
        ds.expect_next(None)  # the trial's last epoch: what was planned ahead is dropped
        assert not loader._queue
        list(ds.batches("val", 0, 1, 4, 0, 0, CPU))
        assert ds._val.replays == 2
    finally:
        ds.release()
    assert ds._val.key is None  # a trial's end frees the kept shard


def test_a_shard_that_does_not_fit_is_decoded_every_epoch_and_says_why(folder, monkeypatch):
    monkeypatch.setattr(valcache, "HOST_SHARE", 1e-12)
    ds = ImageFolderDataset(folder, image_size=16, workers=0)
    try:
        epochs(ds, 2)
        assert ds._val.replays == 0 and ds._val.key is None
        assert ds.val_cache_note.startswith("the shard needs ")
        assert "GiB" in ds.val_cache_note
    finally:
        ds.release()


def test_a_pass_abandoned_half_way_is_not_kept(folder):
    ds = ImageFolderDataset(folder, image_size=16, workers=0)
    try:
        passes = ds.batches("val", 0, 1, 2, 0, 0, CPU)
        next(passes)
        passes.close()
        assert ds._val.key is None
        whole = list(ds.batches("val", 0, 1, 2, 0, 0, CPU))
        assert ds._val.key is not None and len(ds._val.batches) == len(whole)
    finally:
        ds.release()


def test_the_configuration_switches_it_off(folder):
    on = load(data_section(dataset="imagenet", data_dir=folder, image_size=16))
    off = load(data_section(dataset="imagenet", data_dir=folder, image_size=16, val_cache=False))
    assert on.val_cache is True and off.val_cache is False


def test_a_trial_records_whether_its_validation_was_kept(folder):
    from automlperf.graph import seeds
    from automlperf.train.spec import TrialSpec
    from automlperf.train.trainer import RankContext, train_on_rank

    ds = ImageFolderDataset(folder, image_size=16, workers=0)
    ds.max_unreadable = 0.5  # the folder's two corrupt files per split
    graph = seeds.resnet_small(num_classes=3, image_size=16)
    spec = TrialSpec("t", graph.to_dict(), epochs=2, batch_size=8, patience=2)
    outcome = train_on_rank(spec, RankContext(0, 1, CPU, ds))
    assert outcome.status == "completed", outcome.reason
    assert outcome.extra["validation"] == "kept on the device"
    assert ds._val.key is None  # released with the trial


def test_a_device_that_runs_out_of_memory_keeping_it_serves_the_pass_and_gives_up(monkeypatch):
    cache = valcache.ValidationCache()

    class Full:
        """A batch whose copy finds the device full."""

        def clone(self):
            raise torch.OutOfMemoryError("CUDA out of memory")

    batches = [(Full(), torch.zeros(2), 0, ""), (Full(), torch.ones(2), 1, "a: bad")]
    key = (0, 1, 2, 0, CPU)
    served = list(cache.fill(key, 1, CPU, 1, iter(batches)))
    assert served == batches and not cache.holds(key)
    assert cache.refused == "cpu ran out of memory keeping it"
    # The trial's later passes are not tried again; the next trial tries.
    assert list(cache.fill(key, 1, CPU, 1, iter(batches))) == batches and cache.gave_up == key
    cache.clear()
    assert cache.gave_up is None and cache.refused == ""


def test_a_trials_only_validation_is_not_kept(folder):
    ds = ImageFolderDataset(folder, image_size=16, workers=0)
    try:
        list(ds.batches("train", 0, 1, 4, 0, 0, CPU))
        ds.expect_next(None)  # a trial of one epoch: nothing would replay it
        assert list(ds.batches("val", 0, 1, 4, 0, 0, CPU))
        assert ds._val.key is None and ds.val_cache_note == ""
        list(ds.batches("val", 0, 1, 4, 0, 0, CPU))  # asked again all the same: kept now
        assert ds._val.key is not None
    finally:
        ds.release()
