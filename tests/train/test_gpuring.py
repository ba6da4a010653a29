"""The GPU path's host stage in worker processes (train/data/gpuring.py) and its device stage
on views of the ring (gpudecode.decode_slot), on the CPU with the Pillow stand-in behind the
decoder seam: the batches are the step plan's and the images the thread-based loader's
(bench/legacy_gpu_loader.py) bit for bit, boxes and flips are the reference's, refused
files are decoded by the CPU reference in the workers, unreadable files are counted, a dead
worker fails the pass in one line, and the device stage reads nothing back from the device."""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from automlperf.train.data import gpuring, step_plan
from automlperf.train.data.gpudecode import GpuImageFolderDataset, decode_slot
from automlperf.train.data.gpuring import CPU as ON_CPU
from automlperf.train.data.gpuring import GPU, NONE, GpuRing, stage_chunk
from automlperf.train.data.ring import WorkerDied
from automlperf.train.data.transform import decode_file, train_params, val_params
from imagefolder import make_image_folder, photo
from test_gpudecode import PillowStandInDecoder

CPU = torch.device("cpu")


def _legacy():
    path = Path(__file__).resolve().parents[2] / "bench" / "legacy_gpu_loader.py"
    spec = importlib.util.spec_from_file_location("legacy_gpu_loader", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """make_image_folder's photos and corrupt files, plus files the GPU decoder is refused:
    a CMYK, a PNG and an EXIF-rotated one; and a progressive one it takes."""
    root = tmp_path_factory.mktemp("gpuring")
    counts = make_image_folder(root, classes=3, train_per_class=8, val_per_class=3,
                               corrupt=2, size=40)
    src = photo().crop((100, 100, 160, 150))
    cls = root / "train" / "n00000001"
    src.convert("CMYK").save(cls / "cmyk.JPEG")
    src.save(cls / "png.JPEG", "PNG")
    exif = Image.Exif()
    exif[0x0112] = 6
    src.save(cls / "rotated.JPEG", exif=exif.tobytes())
    src.save(cls / "progressive.JPEG", progressive=True)
    counts["train"] += 4
    return root, counts


def _passes(ds, split, epoch, rank=0, world=1, per_rank=5, seed=5):
    loader = ds.loader(rank, world, per_rank, seed, CPU)
    return [(x.clone(), y.clone(), bad) for x, y, bad, _ in loader.passes(split, epoch)]


def test_workers_give_the_step_plans_batches_and_the_thread_loaders_images_bit_for_bit(folder):
    root, _ = folder
    new = GpuImageFolderDataset(root, 24, workers=2, decoder=PillowStandInDecoder(),
                                chunk_images=2)
    old = _legacy().LegacyGpuImageFolderDataset(root, 24, workers=2,
                                                decoder=PillowStandInDecoder())
    try:
        for rank, world in ((0, 1), (1, 2)):
            for split, epoch in (("train", 0), ("val", 0), ("train", 1)):
                got = _passes(new, split, epoch, rank, world)
                want = _passes(old, split, epoch, rank, world)
                base = 0 if split == "train" else new.index.train_size
                plan = step_plan(len(new.index.rows(split)), rank, world, 5, split, epoch, 5)
                assert len(got) == len(want) == len(plan)
                for (x, y, bad), (wx, wy, wbad), rows in zip(got, want, plan):
                    assert torch.equal(y, wy) and bad == wbad and torch.equal(x, wx)
                    readable = [int(new.index.labels[r]) for r in (rows + base).tolist()
                                if "_bad_" not in new.index.path(r)]
                    assert y.tolist() == readable
        assert new.cpu_decoded == old.cpu_decoded > 0
    finally:
        new.release()
        old.release()


def _staged(root, train, size=24, epoch=3, seed=7, chunk=4):
    ds = GpuImageFolderDataset(root, size, workers=0, decoder=PillowStandInDecoder())
    rows = np.arange(ds.index.train_size) if train else \
        ds.index.train_size + np.arange(ds.index.val_size)
    ring = GpuRing(1, len(rows), size, shared=False)
    ring.rows[0] = rows
    for start in range(0, len(rows), chunk):
        stage_chunk(ring, ds.reader, seed, (0, 0, start, min(len(rows), start + chunk), train,
                                           epoch), 0)
    return ds, ring, rows


@pytest.mark.parametrize("train", [True, False])
def test_the_host_stage_draws_the_references_boxes_and_routes_by_the_header(folder, train):
    root, _ = folder
    ds, ring, rows = _staged(root, train)
    size = ring.size
    for place, row in enumerate(rows.tolist()):
        path = ds.index.path(row)
        name = os.path.basename(path)
        route = int(ring.route[0, place])
        if "_bad_" in name:
            assert route == NONE and ring.labels[0, place] == -1
            continue
        assert ring.labels[0, place] == ds.index.labels[row]
        want = np.zeros((size, size, 3), np.uint8)
        assert decode_file(path, size, train, 7, 3, row, want) is None
        if name in ("cmyk.JPEG", "png.JPEG", "rotated.JPEG"):
            assert route == ON_CPU
            at = int(ring.offset[0, place])
            got = ring.files[0, at:at + size * size * 3].reshape(size, size, 3)
            assert np.array_equal(got, want)  # the CPU path's own pixels
            continue
        assert route == GPU
        at, n = int(ring.offset[0, place]), int(ring.length[0, place])
        assert bytes(ring.files[0, at:at + n]) == Path(path).read_bytes()
        with Image.open(path) as img:
            w, h = img.size
        assert (ring.width[0, place], ring.height[0, place]) == (w, h)
        box, flip = train_params(7, 3, row, w, h) if train else (val_params(w, h, size), False)
        assert tuple(ring.box[0, place]) == tuple(box) and bool(ring.flip[0, place]) == flip
    ds.release()


def test_files_beyond_their_chunks_room_and_steep_downscales_go_to_the_cpu_reference(
        folder, monkeypatch):
    """A chunk's places share their bytes, each later place keeping room for its pixels: a
    file that does not fit is decoded by the CPU reference; so is a box that needs more
    taps than the ring's bands hold. Every image still equals the CPU path's."""
    root, _ = folder
    size = 16  # 40-px photos: downscales of up to 2.5
    monkeypatch.setattr(gpuring, "FILE_BYTES", 1500)
    ds, ring, rows = _staged(root, True, size=size, chunk=3)
    lengths = np.array([os.path.getsize(ds.index.path(r)) for r in rows.tolist()])
    routes = ring.route[0]
    assert (routes[(lengths > 3 * 1500) & (routes != NONE)] == ON_CPU).all()
    assert (routes == GPU).any() and (routes == ON_CPU).sum() > 3
    monkeypatch.setattr(gpuring, "FILE_BYTES", 2**20)
    monkeypatch.setattr(gpuring, "TAPS", 5)  # downscales of 2 at most
    _, steep, _ = _staged(root, True, size=size)
    scale = np.maximum(steep.box[0, :, 2] - steep.box[0, :, 0],
                       steep.box[0, :, 3] - steep.box[0, :, 1]) / size
    gpu = steep.route[0] == GPU
    assert (scale[gpu] <= 2.0).all() and gpu.any() and (scale[steep.route[0] == ON_CPU] > 2).any()
    for r in (ring, steep):
        step = decode_slot(r, 0, len(rows), PillowStandInDecoder(), CPU)
        kept = [p for p in range(len(rows)) if r.route[0, p] != NONE]
        for n, place in enumerate(kept):
            # The GPU route resamples the whole file; the CPU route is the CPU path's own.
            on_gpu = r.route[0, place] == GPU
            want = np.zeros((size, size, 3), np.uint8)
            row = int(rows[place])
            decode_file(ds.index.path(row), size, True, 7, 3, row, want, reduced=not on_gpu)
            assert np.abs(step.images[n].numpy().astype(int) - want).max() <= int(on_gpu)
    ds.release()


def test_the_decoder_reads_the_ring_in_place_and_nothing_is_read_back_from_the_device(folder):
    """The files the decoder gets are views of the slot (no copy), and the whole device
    stage runs on the meta device, where reading a value back would raise: it makes no
    hidden host-device waits."""
    root, _ = folder
    _, ring, rows = _staged(root, True)
    seen = []

    class Recording(PillowStandInDecoder):
        def decode(self, files, device):
            seen.extend(f.data_ptr() for f in files)
            out = super().decode(files, CPU)
            return [torch.empty(o.shape, dtype=torch.uint8, device=device) for o in out]

    start = ring.files.ctypes.data
    step = decode_slot(ring, 0, len(rows), Recording(), torch.device("meta"))
    assert seen and all(start <= p < start + ring.files.nbytes for p in seen)
    assert step.images.device.type == "meta"
    assert len(step.images) == len(step.labels) == int((ring.route[0] != NONE).sum())


def test_unreadable_files_are_counted_and_one_is_kept_as_an_example(folder):
    root, counts = folder
    ds = GpuImageFolderDataset(root, 16, workers=2, decoder=PillowStandInDecoder())
    try:
        seen = sum(len(y) for _, y in ds.batches("train", 0, 1, 6, 0, 0, CPU))
        assert seen == counts["train"] and ds.skipped == 2
        assert "train_bad_" in ds.unreadable
        assert sum(len(y) for _, y in ds.batches("val", 0, 1, 6, 0, 0, CPU)) == counts["val"]
        assert ds.skipped == 4 and ds.cpu_decoded == 3  # CMYK, PNG, rotated
    finally:
        ds.release()


def test_a_worker_killed_mid_pass_fails_the_pass_in_one_line(folder):
    root, _ = folder
    ds = GpuImageFolderDataset(root, 16, workers=1, decoder=PillowStandInDecoder())
    try:
        loader = ds.loader(0, 1, 2, 0, CPU)
        passes = loader.passes("train", 0)
        next(passes)
        os.kill(loader.pool.pids[0], signal.SIGKILL)
        loader.pool.procs[0].join(60)
        with pytest.raises(WorkerDied, match=r"^decoding worker automlperf-decode0 \(pid \d+\) "
                                             r"exited with code -9$"):
            for _ in passes:  # more steps than the ring's slots hold
                pass
    finally:
        ds.release()


def test_the_devices_weights_are_the_references_bit_for_bit():
    """resample.device_bands (torch, float64, any device) against triangle_bands (numpy):
    the same weights after Pillow's 22-bit rounding, for boxes of every kind, flipped or not,
    including downscales whose bands need more than 8 taps (where numpy sums pairwise)."""
    from automlperf.train.data.resample import device_bands, triangle_bands, windows

    rng = np.random.default_rng(4)
    n, size = 200, 224
    widths = rng.integers(8, 4000, n).astype(np.float64)
    heights = rng.integers(8, 4000, n).astype(np.float64)
    boxes = []
    for k in range(n):
        w, h = int(widths[k]), int(heights[k])
        boxes.append(train_params(1, 2, k, w, h)[0] if k % 2 else val_params(w, h, size))
    box = np.array(boxes, dtype=np.float64)
    flips = rng.random(n) < 0.5
    window, taps = windows(box, widths, heights, size)
    cols, weights = device_bands(torch.from_numpy(box), torch.from_numpy(np.stack([widths, heights], 1)),
                                 torch.from_numpy(flips), torch.from_numpy(window), size, int(taps))
    for axis, (a, b, extent) in enumerate(((0, 2, widths), (1, 3, heights))):
        want = triangle_bands(box[:, a], box[:, b], extent, size)
        assert np.array_equal(window[:, 2 * axis], want.first)
        assert np.array_equal(window[:, 2 * axis + 1], want.length)
        assert int(taps) >= want.band.shape[2] > 8
        got_cols, got = cols[:, axis].numpy().copy(), weights[:, axis].numpy().copy()
        if axis == 0:  # the reference's unflipped rows
            got_cols[flips], got[flips] = got_cols[flips, ::-1], got[flips, ::-1]
        at = want.lo[:, :, None] + np.arange(want.band.shape[2]) - want.first[:, None, None]
        inside = at < want.length[:, None, None]
        ref = np.zeros_like(got)
        ref[:, :, :want.band.shape[2]] = np.where(inside, want.band, 0.0)
        assert np.array_equal(got, ref)
        used = got[:, :, :want.band.shape[2]] != 0
        assert np.array_equal(got_cols[:, :, :want.band.shape[2]][used], at[used])


def test_a_slot_is_written_again_only_once_the_device_has_read_it(folder, monkeypatch):
    """Events that finish only when waited for (a stand-in for a GPU still resampling): the
    host stage never writes a slot whose step the device may still read, and the rank's
    time waiting for one is booked to the device."""
    from automlperf.train.data import gpudecode

    class Event:
        def __init__(self):
            self.done = False

        def query(self):
            return self.done

        def synchronize(self):
            self.done = True

    pending: dict[int, Event] = {}  # the latest step of each slot
    made: list[Event] = []
    real_decode, real_stage = gpudecode.decode_slot, gpuring.stage_chunk

    def decode(ring, slot, *args, **kw):
        step = real_decode(ring, slot, *args, **kw)
        step.event = pending[slot] = Event()
        made.append(step.event)
        return step

    def stage(ring, index, seed, task, worker):
        assert task[1] not in pending or pending[task[1]].done
        return real_stage(ring, index, seed, task, worker)

    monkeypatch.setattr(gpudecode, "decode_slot", decode)
    monkeypatch.setattr(gpudecode.GpuFolderLoader, "job", staticmethod(stage))
    root, counts = folder
    ds = GpuImageFolderDataset(root, 16, workers=0, decoder=PillowStandInDecoder())
    try:
        loader = ds.loader(0, 1, 4, 0, CPU)
        loader.passes = lambda split, epoch: gpudecode.FolderLoader.passes(loader, split, epoch)
        assert loader.plan.slots == 1
        got = sum(len(y) for _, y, _, _ in loader.passes("train", 0))
        assert got == counts["train"]
        # One slot: each step but the first waited for the one before it.
        assert sum(e.done for e in made) == len(made) - 1 and loader.stats.device_wait_s > 0
    finally:
        ds.release()


def test_the_host_stage_reads_the_official_archives_as_it_reads_their_folder(folder, tmp_path):
    """The same images as the folder, from its archives (each read with one pread from the
    descriptor the rank opened, straight into the ring): the same routes, bytes and boxes,
    and the device stage's same batches, with workers as without."""
    from automlperf.testing.archives import write_archives

    root, _ = folder
    # The archive's flat validation tar needs distinct names: the folder's are per class.
    write_archives(root, tmp_path / "archives")
    for train in (True, False):
        ds_f, ring_f, rows = _staged(root, train)
        archive = GpuImageFolderDataset(tmp_path / "archives", 24, workers=0,
                                        decoder=PillowStandInDecoder())
        assert archive.index.source == "archives"
        assert [archive.index.relative(r) for r in rows.tolist()] == \
            [ds_f.index.relative(r) for r in rows.tolist()]
        ring_a = GpuRing(1, len(rows), 24, shared=False)
        ring_a.rows[0] = rows
        for start in range(0, len(rows), 4):
            stage_chunk(ring_a, archive.reader, 7, (0, 0, start, min(len(rows), start + 4),
                                                    train, 3), 0)
        for name in ("route", "labels", "offset", "length", "width", "height", "box", "flip"):
            assert np.array_equal(getattr(ring_a, name), getattr(ring_f, name)), name
        assert np.array_equal(ring_a.files, ring_f.files)
    new = GpuImageFolderDataset(tmp_path / "archives", 24, workers=2,
                                decoder=PillowStandInDecoder(), chunk_images=2)
    old = GpuImageFolderDataset(root, 24, workers=2, decoder=PillowStandInDecoder(),
                                chunk_images=2)
    try:
        for (x, y, bad), (wx, wy, wbad) in zip(_passes(new, "train", 0), _passes(old, "train", 0),
                                               strict=True):
            assert torch.equal(y, wy) and bad == wbad and torch.equal(x, wx)
    finally:
        new.release()
        old.release()
