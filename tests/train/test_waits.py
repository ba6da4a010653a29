"""Where a training epoch's time goes: waiting for data and the device's side are different
figures. Each case makes one side slow by construction: a step or an image moves the clock
the trainer reads on by ten seconds, without sleeping, so the shares hold however slowly a
crowded machine runs the rest (a real tenth of a second of sleep did not, beside steps that
took tenths of a second themselves)."""

import time

import pytest
import torch

from automlperf.graph import seeds
from automlperf.train import trainer
from automlperf.train.data import ImageFolderDataset, digits, transform
from automlperf.train.trainer import RankContext, TrialSpec, train_on_rank
from imagefolder import make_image_folder

CPU = torch.device("cpu")
SLOW = 10.0  # seconds the clock moves on in the slow side, per step or per image


class Clock:
    """``time.perf_counter`` with time added by hand: what the trainer times is real time
    plus what the slow side `spend`s."""

    def __init__(self) -> None:
        self.real = time.perf_counter
        self.added = 0.0

    def __call__(self) -> float:
        return self.real() + self.added

    def spend(self, seconds: float) -> None:
        self.added += seconds


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(time, "perf_counter", clock)
    return clock


@pytest.fixture(autouse=True)
def one_thread():
    """The steps in one thread: two OpenMP threads on a crowded machine wait for each other
    at every barrier, which would make the fast side slow by chance, not construction."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("waits")
    make_image_folder(root, classes=2, train_per_class=12, val_per_class=2, corrupt=0)
    return root


def _epochs(ds, batch=8, epochs=1):
    graph = seeds.resnet_small(num_classes=ds.num_classes, image_size=ds.image_size,
                               in_channels=ds.channels)
    spec = TrialSpec("t", graph.to_dict(), epochs=epochs, batch_size=batch, patience=5)
    events = []
    try:
        out = train_on_rank(spec, RankContext(0, 1, CPU, ds),
                            lambda kind, e: events.append((kind, e)))
    finally:
        ds.release()
    assert out.status == "completed", out.reason
    return [e for kind, e in events if kind == "epoch"]


def test_a_slow_device_is_the_devices_share_not_datas(folder, monkeypatch, clock):
    """The simulated device takes ten seconds more per step; the workers decode ahead."""
    real = trainer._Run._step

    def slow_step(self, x, y):
        clock.spend(SLOW)
        return real(self, x, y)

    monkeypatch.setattr(trainer._Run, "_step", slow_step)
    epoch = _epochs(ImageFolderDataset(folder, image_size=16, workers=2), epochs=2)[-1]
    assert epoch["data_share"] < 0.25
    assert epoch["device_share"] > 0.7
    assert epoch["data_share"] + epoch["device_share"] <= 1.0 + 1e-9


def test_a_slow_loader_is_datas_share(folder, monkeypatch, clock):
    """Every image takes ten seconds more to decode, in the rank (no workers)."""
    real = transform.decode_file

    def slow_decode(*args, **kwargs):
        clock.spend(SLOW)
        return real(*args, **kwargs)

    monkeypatch.setattr("automlperf.train.data.ring.decode_file", slow_decode)
    # The second epoch: the first's first step also sets the network's kernels up.
    epoch = _epochs(ImageFolderDataset(folder, image_size=16, workers=0), epochs=2)[-1]
    assert epoch["data_share"] > 0.8
    assert epoch["device_share"] < 0.2


def test_a_loader_waiting_for_the_device_is_booked_to_the_device(clock):
    """A loader that waits for the device to free its memory (a slot's copy) before it
    hands a batch over: that wait is the device's, though it happens while asking for data."""

    class WaitsForTheDevice(type(digits())):  # type: ignore[misc]
        def batches(self, *args, **kwargs):
            for batch in super().batches(*args, **kwargs):
                began = time.perf_counter()
                clock.spend(SLOW)
                self.device_wait_s += time.perf_counter() - began
                yield batch

    ds = digits()
    ds.__class__ = WaitsForTheDevice
    epoch = _epochs(ds, batch=256, epochs=2)[-1]
    assert epoch["data_share"] < 0.25
    assert epoch["device_share"] > 0.7
