"""The image-folder loader's ring of batch slots and its shared queue of chunks: the batches are
the step plan's, image for image, whatever order the workers finish in; unreadable files are
counted; the next pass is decoded ahead; a full /dev/shm and a dead worker are one-line
errors; every worker ends with its loader. Real JPEG files, real worker processes."""

import errno
import os
from collections import deque
import signal

import numpy as np
import psutil
import pytest
import torch

from automlperf.train.data import ImageFolderDataset, step_plan
from automlperf.train.data import ring as ring_module
from automlperf.train.data.base import DataError
from automlperf.train.data.handoff import HostHandoff
from automlperf.train.data.ring import WorkerDied
from automlperf.train.data.transform import decode_file
from helpers import data_section
from imagefolder import make_image_folder

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("loader")
    make_image_folder(root, classes=3, train_per_class=9, val_per_class=3, corrupt=2)
    return root


def reference(ds, split, rank, world, per_rank, epoch, seed):
    """Each step's images and labels decoded one by one in the step plan's order, unreadable
    files left out: what the loader gave before its workers shared a queue."""
    base = 0 if split == "train" else ds.index.train_size
    size = ds.image_size
    out = []
    for rows in step_plan(len(ds.index.rows(split)), rank, world, per_rank, split, epoch, seed):
        images, labels = [], []
        for row in (rows + base).tolist():
            pixels = np.zeros((size, size, 3), dtype=np.uint8)
            if decode_file(ds.index.path(row), size, split == "train", seed, epoch, row,
                           pixels) is None:
                images.append(pixels)
                labels.append(int(ds.index.labels[row]))
        out.append((np.stack(images), labels))
    return out


def raw(loader, split, epoch):
    """A pass's (images, labels) as arrays, copied out of the ring."""
    return [(x.numpy().copy(), y.tolist()) for x, y, _, _ in loader.passes(split, epoch)]


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_are_the_step_plans_image_for_image(folder, workers):
    ds = ImageFolderDataset(folder, image_size=24, workers=workers, chunk_images=3)
    try:
        for rank, world in ((0, 1), (1, 2)):
            loader = ds.loader(rank, world, 5, 11, CPU)
            # The usual order (train, val, next train), then one out of it (epoch 0 again).
            for split, epoch in (("train", 0), ("val", 0), ("train", 1), ("train", 0)):
                got = raw(loader, split, epoch)
                want = reference(ds, split, rank, world, 5, epoch, 11)
                assert len(got) == len(want)
                for (x, y), (wx, wy) in zip(got, want):
                    assert y == wy and np.array_equal(x, wx)
    finally:
        ds.release()


def test_unreadable_files_are_counted_as_before_with_workers(folder):
    ds = ImageFolderDataset(folder, image_size=16, workers=2, chunk_images=2)
    try:
        for epoch in range(2):
            seen = sum(len(y) for _, y in ds.batches("train", 0, 1, 6, epoch, 0, CPU))
            assert seen == 27
        assert ds.skipped == 4  # the split's two corrupt files, in each epoch
        assert "train_bad_" in ds.unreadable and ds.unreadable.count(": ") >= 1
        assert sum(len(y) for _, y in ds.batches("val", 0, 1, 6, 0, 0, CPU)) == 9
        assert ds.skipped == 6
    finally:
        ds.release()


def test_the_next_pass_is_decoded_while_this_one_drains(folder):
    ds = ImageFolderDataset(folder, image_size=16, workers=1, chunk_images=4)
    try:
        loader = ds.loader(0, 1, 4, 0, CPU)
        assert loader.plan.slots >= 3
        for _ in loader.passes("train", 0):
            pass
        # Validation's first batches have slots and chunks posted before it is asked for.
        head = loader._queue[0]
        assert head.key == ("val", 0) and head.step == 0 and head.slot is not None
        for _ in loader.passes("val", 0):
            pass
        assert loader._queue[0].key == ("train", 1)
        # The trial's last validation: nothing is decoded after it.
        ds.expect_next(None)
        list(ds.batches("train", 0, 1, 4, 1, 0, CPU))
        ds.expect_next(None)
        list(ds.batches("val", 0, 1, 4, 0, 0, CPU))
        assert not loader._queue
        # A pass abandoned half way and another asked for: what was planned is dropped, and
        # every slot comes back once the workers have answered.
        passes = loader.passes("train", 2)
        _, first, _, _ = next(passes)
        passes.close()
        assert len(raw(loader, "val", 0)) == 3
        assert loader.stats.images == 27 * 2 + 9 * 3 + len(first)
        assert sorted(loader._free) == list(range(loader.plan.slots)) or loader._queue
    finally:
        ds.release()


def test_the_rank_waits_for_a_slot_still_being_copied_as_a_wait_for_the_device(folder):
    """A device whose copies finish only when told (a stand-in for a GPU's copy stream): no
    slot is written while its copy runs, and the time waiting for one is the device's."""

    class SlowCopies(HostHandoff):
        def __init__(self, ring, device):
            super().__init__(ring, device)
            self.copying, self.waited = [], 0

        @property
        def busy(self):
            return bool(self.copying)

        def release(self, slot):
            self.copying.append(slot)
            return []

        def wait_oldest(self):
            self.waited += 1
            return [self.copying.pop(0)]

    ds = ImageFolderDataset(folder, image_size=16, workers=1, chunk_images=2)
    try:
        loader = ds.loader(0, 1, 3, 0, CPU)
        loader.handoff = SlowCopies(loader.ring, CPU)
        got = raw(loader, "train", 0)
        assert [y for _, y in got] == [y for _, y in reference(ds, "train", 0, 1, 3, 0, 0)]
        # Every slot beyond the ring's size had to wait for a copy: booked to the device.
        assert loader.handoff.waited >= len(got) - loader.plan.slots
        assert loader.stats.device_wait_s > 0 and ds.device_wait_s == loader.stats.device_wait_s
    finally:
        ds.release()


def test_a_worker_that_dies_fails_the_pass_in_one_line(folder):
    ds = ImageFolderDataset(folder, image_size=16, workers=2, chunk_images=2)
    try:
        loader = ds.loader(0, 1, 4, 0, CPU)
        os.kill(loader.pool.pids[0], signal.SIGKILL)
        loader.pool.procs[0].join(60)
        with pytest.raises(WorkerDied, match=r"decoding worker automlperf-decode0 \(pid \d+\) "
                                             r"exited with code -9"):
            for _ in range(3):
                raw(loader, "train", 0)
    finally:
        ds.release()


def test_workers_end_with_their_loader(folder):
    ds = ImageFolderDataset(folder, image_size=16, workers=2)
    next(ds.batches("train", 0, 1, 4, 0, 0, CPU))  # a pass left half way
    pids = ds._loader.pool.pids
    assert len(pids) == 2 and all(psutil.pid_exists(p) for p in pids)
    ds.release()
    gone, alive = psutil.wait_procs([psutil.Process(p) for p in pids if psutil.pid_exists(p)],
                                    timeout=60)
    assert not alive


def test_a_dev_shm_too_small_for_the_ring_is_a_one_line_error(monkeypatch):
    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ring_module.os, "posix_fallocate", full)
    with pytest.raises(DataError) as refused:
        ring_module.Ring(2, 10, 32, shared=True)
    message = str(refused.value)
    assert "\n" not in message and "enlarge /dev/shm" in message and "data.workers = 0" in message


def test_the_ring_is_shared_memory_in_dev_shm_that_forked_workers_write(tmp_path):
    ring = ring_module.Ring(2, 3, 8, shared=os.path.isdir("/dev/shm"))
    pid = os.fork()
    if pid == 0:  # a worker writes in place
        ring.images[1, 2] = 7
        ring.labels[1, 2] = 5
        os._exit(0)
    os.waitpid(pid, 0)
    assert (ring.images[1, 2] == 7).all() and ring.labels[1, 2] == 5
    ring.close()


def test_the_ranks_own_loader_is_probed_alone_and_beside_training(folder):
    """What the doctor runs: a process set up as a rank, the run's data arguments, the
    loader alone (delivered against its workers' decoding) and beside a few real steps
    (the data and device shares a run's epochs record)."""
    from automlperf.graph import seeds
    from automlperf.train.loaderprobe import ProbeError, probe_in_rank_process

    data = data_section("imagenet", data_dir=folder, image_size=16, workers=1)
    graph = seeds.resnet_small(num_classes=3, image_size=16).to_dict()
    out = probe_in_rank_process(data, "cpu", threads=1, per_rank=4, graph=graph, train_steps=4)
    alone, training = out["alone"], out["training"]
    assert out["workers"] == 1 and out["rank_threads"] == 1 and out["loader"]["slots"] >= 2
    assert alone["images"] == 27 and alone["decode_images_per_s"] > 0
    assert 0 < alone["delivered_over_decoded"] and 0 <= alone["worker_rate_spread"] <= 1
    assert out["validation"]["images"] == 9
    assert training["steps"] == 4 and training["images"] > 0
    assert 0 <= training["data_share"] <= 1 and 0 <= training["device_share"] <= 1
    assert training["data_share"] + training["device_share"] <= 1 + 1e-9
    # The host cores busy over the timed steps (CPU seconds counted in clock ticks: a few
    # tiny steps may show none), and no spread from too few progress reports.
    assert training["busy_cores"] is not None and training["busy_cores"] >= 0
    assert training["spread"] is None or training["spread"] >= 0
    with pytest.raises(ProbeError, match="train not found"):
        probe_in_rank_process(data_section("imagenet", data_dir=folder / "nowhere", workers=1),
                              "cpu", threads=1, per_rank=4)


@pytest.mark.parametrize("per_rank, passes, steps", [(16, 3, 4), (8, 2, 6)])
def test_a_probe_longer_than_a_pass_goes_on_as_the_runs_epochs_do(folder, per_rank, passes,
                                                                   steps):
    """A folder whose training pass holds fewer steps than the probe's untimed and timed ones
    (29 files, 27 readable: two steps of 16 a pass, or four of 8) still gets timed steps
    beside training: the probe goes on as a run's epochs do, a validation pass then the next
    epoch's training pass, and times whole passes once it spans them."""
    from automlperf.graph import seeds
    from automlperf.train.loaderprobe import WARM_STEPS, beside_training
    from automlperf.train.spec import TrialSpec
    from automlperf.train.trainer import RankContext, _Run

    ds = ImageFolderDataset(folder, image_size=16, workers=1)
    asked, batches = [], ds.batches

    def recorded(split, rank, world, batch_size, epoch, seed, device):
        asked.append((split, epoch))
        return batches(split, rank, world, batch_size, epoch, seed, device)

    ds.batches = recorded
    graph = seeds.resnet_small(num_classes=3, image_size=16)
    spec = TrialSpec("probe", graph.to_dict(), epochs=1, batch_size=per_rank, patience=1)
    run = _Run(spec, RankContext(0, 1, CPU, ds), graph)
    try:
        assert run.steps_per_epoch < WARM_STEPS + 3
        out = beside_training(run, 3)
        delivered = ds._loader.stats.images
    finally:
        ds.release()
    expected = [("train", 0)]
    for epoch in range(1, passes):
        expected += [("val", 0), ("train", epoch)]
    assert asked == expected
    assert out["passes"] == passes and out["steps"] == steps
    # Whole passes, each image once; validation decoded once and replayed after that, as in
    # a run (train/data/valcache.py).
    assert delivered == passes * 27 + 9
    assert 27 < out["images"] <= 2 * 27  # the warm-up steps are not counted
    if per_rank == 16:  # the first pass warmed up; the next two are timed whole
        assert out["images"] == 2 * 27
    assert out["seconds"] > 0 and out["images_per_s"] > 0
    assert 0 <= out["data_share"] <= 1 and 0 <= out["device_share"] <= 1
    assert out["data_share"] + out["device_share"] <= 1 + 1e-9


def test_a_probes_spread_compares_the_rates_of_its_two_halves():
    from automlperf.train.loaderprobe import halves_spread

    # Pass 1: 10 steps a second for two intervals, then 8 (pass 2 starts its own count).
    marks = [(1, 0.0, 2), (1, 1.0, 12), (1, 2.0, 22), (2, 5.0, 1), (2, 6.0, 9), (2, 7.0, 17)]
    assert halves_spread(marks) == pytest.approx(2 / 9)
    assert halves_spread(marks[:4]) is None  # two intervals only
    assert halves_spread([(1, 0.0, 1), (1, 1.0, 5), (1, 2.0, 9), (1, 3.0, 13), (1, 4.0, 17)]) == 0


def test_a_pinned_slot_is_free_again_only_once_its_copy_has_finished():
    """The CUDA hand-off's bookkeeping, with events that finish when the test says so: a
    slot whose copy runs is held back, freed in order once done, or waited for."""
    from automlperf.train.data.handoff import PinnedHandoff

    class Event:
        def __init__(self):
            self.done = False
            self.waited = False

        def query(self):
            return self.done

        def synchronize(self):
            self.waited = self.done = True

    handoff = object.__new__(PinnedHandoff)  # no CUDA here: only the slot bookkeeping
    handoff.copying, handoff._last = deque(), {}
    events = {slot: Event() for slot in range(3)}
    handoff._last.update(events)
    assert [handoff.release(s) for s in range(3)] == [[], [], []] and handoff.busy
    assert handoff.reclaim() == []
    events[1].done = True
    assert handoff.reclaim() == []  # in order: slot 0 is still being copied
    events[0].done = True
    assert handoff.reclaim() == [0, 1]
    assert handoff.wait_oldest() == [2] and events[2].waited and not handoff.busy
    handoff._last[0] = Event()
    handoff._last[0].done = True
    assert handoff.release(0) == [0]  # its copy had finished: free at once
