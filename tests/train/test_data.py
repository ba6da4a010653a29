import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from automlperf.train import data as datasets
from automlperf.train.data import DataError, random_resized_crop_box, step_plan
from helpers import data_section

CPU = torch.device("cpu")


def collect(ds, split, world=1, batch=16, epoch=0):
    xs, ys = [], []
    for rank in range(world):
        for x, y in ds.batches(split, rank, world, batch, epoch, 0, CPU):
            xs.append(x)
            ys.append(y)
    return torch.cat(xs), torch.cat(ys)


def test_builtin_mnist_sample_ships_with_the_package():
    ds = datasets.load(data_section("builtin"))
    assert (ds.train_size, ds.val_size, ds.num_classes, ds.input_shape) == (4000, 1000, 10, (1, 12, 12))
    x, y = collect(ds, "val", batch=500)
    assert x.shape == (1000, 1, 12, 12) and torch.bincount(y).tolist() == [100] * 10
    assert abs(float(x.mean())) < 0.3 and 0.6 < float(x.std()) < 1.4  # normalised
    tx, ty = collect(ds, "train", batch=500)
    assert torch.bincount(ty).tolist() == [400] * 10
    full = datasets.load(data_section("builtin", image_size=28))
    assert full.input_shape == (1, 28, 28)
    # Validation and training images are disjoint (no image counted twice).
    vx, _ = collect(full, "val", batch=500)
    train_rows = {bytes(r) for r in full._train[0].numpy().reshape(4000, -1)}
    assert not any(bytes(r) in train_rows for r in full._val[0].numpy().reshape(1000, -1))
    assert vx.shape == (1000, 1, 28, 28)


def test_digits_ship_with_the_package():
    ds = datasets.load(data_section("digits", image_size=16))
    assert (ds.train_size, ds.val_size, ds.num_classes, ds.input_shape) == (1437, 360, 10, (1, 16, 16))
    x, y = collect(ds, "val")
    assert x.shape == (360, 1, 16, 16) and torch.bincount(y).tolist() == [36] * 10
    assert abs(float(x.mean())) < 0.3 and 0.6 < float(x.std()) < 1.4  # normalised
    assert datasets.load(data_section("digits")).input_shape == (1, 8, 8)


@pytest.mark.parametrize("world", [1, 2, 3])
def test_step_plans_cover_every_image_once(world):
    for split in ("train", "val"):
        plans = [step_plan(101, r, world, 8, split, epoch=4, seed=1) for r in range(world)]
        assert len({len(p) for p in plans}) == 1  # the same number of steps on every rank
        assert sorted(torch.cat([s for p in plans for s in p]).tolist()) == list(range(101))
        for step in zip(*plans):
            assert max(map(len, step)) - min(map(len, step)) <= 1
    first, second = (torch.cat(step_plan(101, 0, 1, 8, "train", e, 1)) for e in (0, 1))
    assert not torch.equal(first, second)


def write_cifar(folder, binary, per_batch=20):
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        images = rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, per_batch)
        if binary:
            rec = np.concatenate([labels[:, None].astype(np.uint8), images], axis=1)
            (folder / f"{name}.bin").write_bytes(rec.tobytes())
        else:
            (folder / name).write_bytes(pickle.dumps({b"data": images, b"labels": labels.tolist()},
                                                     protocol=2))


@pytest.mark.parametrize("binary", [True, False])
def test_cifar10_batches(tmp_path, binary):
    write_cifar(tmp_path / "cifar-10-batches-x", binary)
    if binary:
        (tmp_path / "cifar-10-batches-x").rename(tmp_path / "cifar-10-batches-bin")
        ds = datasets.load(data_section("cifar10", data_dir=tmp_path))
    else:
        ds = datasets.load(data_section("cifar10", data_dir=tmp_path / "cifar-10-batches-x"))
    assert (ds.train_size, ds.val_size, ds.input_shape) == (100, 20, (3, 32, 32))
    x, y = collect(ds, "train", world=2)
    assert x.shape == (100, 3, 32, 32) and y.max() < 10


def test_cifar10_python_batches_are_never_unpickled_into_objects(tmp_path):
    write_cifar(tmp_path / "c", binary=False)

    class Evil:
        def __reduce__(self):
            return (subprocess.call, (["touch", str(tmp_path / "owned")],))

    (tmp_path / "c" / "data_batch_3").write_bytes(pickle.dumps({b"data": Evil(), b"labels": []}))
    with pytest.raises(DataError, match="data_batch_3: not a CIFAR-10 python batch"):
        datasets.load(data_section("cifar10", data_dir=tmp_path / "c"))
    assert not (tmp_path / "owned").exists()


def test_cifar10_errors(tmp_path):
    with pytest.raises(DataError, match="cifar10 needs --data-dir"):
        datasets.load(data_section("cifar10"))
    with pytest.raises(DataError, match="no CIFAR-10 batches found"):
        datasets.load(data_section("cifar10", data_dir=tmp_path))
    write_cifar(tmp_path / "b", binary=True)
    (tmp_path / "b" / "test_batch.bin").write_bytes(b"\x00" * 100)
    with pytest.raises(DataError, match="not a multiple of 3073-byte records"):
        datasets.load(data_section("cifar10", data_dir=tmp_path / "b"))


def make_image_folder(root, classes=("cat", "dog"), per_class=5, corrupt=True):
    rng = np.random.default_rng(1)
    for split in ("train", "val"):
        for c, cls in enumerate(classes):
            folder = root / split / cls
            folder.mkdir(parents=True)
            for i in range(per_class):
                w, h = int(rng.integers(40, 90)), int(rng.integers(40, 90))
                pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
                pixels[..., c] = 255  # a class-dependent colour
                Image.fromarray(pixels).save(folder / f"{i}.JPEG", quality=85)
    if corrupt:
        good = (root / "train" / classes[0] / "0.JPEG").read_bytes()
        (root / "train" / classes[0] / "broken.JPEG").write_bytes(good[: len(good) // 3])
        (root / "train" / classes[1] / "empty.JPEG").write_bytes(b"")
        (root / "train" / classes[1] / "notes.txt").write_text("not an image")


@pytest.mark.parametrize("workers", [0, 2])
def test_imagenet_folders_skip_and_count_corrupt_images(tmp_path, workers):
    make_image_folder(tmp_path)
    ds = datasets.load(data_section("imagenet", data_dir=tmp_path, image_size=32, workers=workers))
    assert ds.num_classes == 2 and ds.train_size == 12 and ds.val_size == 10
    assert not ds.official  # two classes are not ImageNet-1k
    x, y = collect(ds, "train", batch=4)
    assert x.shape[1:] == (3, 32, 32) and x.dtype == torch.float32
    assert len(y) + ds.skipped == 12 and ds.skipped == 2
    xv, yv = collect(ds, "val", world=2, batch=3)
    assert len(yv) == 10 and sorted(yv.tolist()) == [0] * 5 + [1] * 5
    ds.release()  # a trial's end: its decoding workers go


def test_imagenet_folder_errors(tmp_path):
    with pytest.raises(DataError, match="imagenet needs --data-dir"):
        datasets.load(data_section("imagenet"))
    with pytest.raises(DataError, match="train not found"):
        datasets.load(data_section("imagenet", data_dir=tmp_path))
    (tmp_path / "train" / "a").mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(tmp_path / "train" / "a" / "x.JPEG")
    (tmp_path / "val" / "b").mkdir(parents=True)
    with pytest.raises(DataError, match="class 'b' is not in train/"):
        datasets.load(data_section("imagenet", data_dir=tmp_path))


class Importable:
    """A GPU decoder that imports here (it is never asked to decode)."""

    name = "importable"

    def versions(self):
        return {"lib": "1"}


def test_dali_and_gpu_decoding_not_installed_say_how_to_get_them(tmp_path, monkeypatch):
    from automlperf import hardware
    from automlperf.train.data import gpudecode

    make_image_folder(tmp_path, corrupt=False)

    def folder(**settings):
        return data_section("imagenet", data_dir=tmp_path, image_size=32, **settings)

    monkeypatch.setitem(sys.modules, "nvidia.dali", None)  # as if not installed
    with pytest.raises(DataError, match=r"data.dali needs NVIDIA DALI: pip install 'automlperf\[dali\]'"):
        datasets.load(folder(dali=True))
    monkeypatch.setattr(gpudecode, "DECODERS", ())  # neither torchcodec nor torchvision
    with pytest.raises(DataError, match=r"gpu_decode needs an nvJPEG decoder: pip install "
                                        r"'automlperf\[nvjpeg\]'"):
        datasets.load(folder(gpu_decode=True), device_type="cuda")
    with pytest.raises(DataError, match="gpu_decode needs the ranks to train on NVIDIA GPUs"):
        datasets.load(folder(gpu_decode=True))
    # Unset, GPU ranks keep the CPU workers where a decoder imports but the doctor never
    # compared the paths on this node; set, it decides.
    monkeypatch.setattr(gpudecode, "DECODERS", (Importable,))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(hardware, "device_name", lambda torch, device: "NVIDIA H200")
    assert gpudecode.gpu_decoder() is not None
    for setting in (None, False):
        ds = datasets.load(folder(gpu_decode=setting), device_type="cuda")
        assert type(ds) is datasets.ImageFolderDataset and ds.decode_path.startswith("cpu-pillow ")
    assert "never compared on this node" in datasets.load(folder(), device_type="cuda").decode_choice
    ds = datasets.load(folder(gpu_decode=True), device_type="cuda")
    assert type(ds) is datasets.GpuImageFolderDataset  # asked for: the GPU path
    assert ds.notes()["decode_path"] == "set: data.gpu_decode = true"
    assert datasets.load(folder()).decode_choice == "automatic: the ranks have no NVIDIA GPU"
    from automlperf.config import DataConfig

    assert DataConfig().gpu_decode is None


def test_unset_the_path_the_doctor_measured_faster_on_this_node_decodes(tmp_path, monkeypatch):
    from automlperf import hardware
    from automlperf.train.data import decodechoice, gpudecode

    make_image_folder(tmp_path, corrupt=False)
    data = data_section("imagenet", data_dir=tmp_path, image_size=32, workers=3)

    monkeypatch.setattr(gpudecode, "DECODERS", (Importable,))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(hardware, "device_name", lambda torch, device: "NVIDIA H200")
    key = decodechoice.key_for("importable lib 1", 3)
    assert key == decodechoice.PathKey("NVIDIA H200", torch.__version__, "importable lib 1", 3)
    decodechoice.save(key, 4_300.0, 6_100.0, str(tmp_path))
    ds = datasets.load(data, device_type="cuda")
    assert type(ds) is datasets.GpuImageFolderDataset
    assert ds.decode_choice.startswith("automatic: beside training, the GPU path fed 6,100 "
                                       "img/s and the CPU workers 4,300 (+41.9%, beyond an "
                                       "assumed spread of 3.0%) (automlperf doctor, ")
    # Measured slower: the CPU workers; on other workers, another GPU or another decoder
    # the measurement does not apply.
    decodechoice.save(key, 4_300.0, 3_900.0, str(tmp_path))
    assert type(datasets.load(data, device_type="cuda")) is datasets.ImageFolderDataset
    decodechoice.save(key, 4_300.0, 6_100.0, str(tmp_path))
    other = data_section("imagenet", data_dir=tmp_path, image_size=32, workers=2)
    assert "never compared" in datasets.load(other, device_type="cuda").decode_choice
    # A file that cannot be read is no measurement.
    decodechoice.cache_path().write_text("{not json")
    assert "never compared" in datasets.load(data, device_type="cuda").decode_choice


def test_random_resized_crop_box_stays_inside():
    import random

    rng = random.Random(0)
    for w, h in [(500, 375), (64, 400), (1000, 30)]:
        for _ in range(50):
            left, top, right, bottom = random_resized_crop_box(w, h, rng)
            assert 0 <= left < right <= w and 0 <= top < bottom <= h


def test_synthetic_data():
    ds = datasets.load(data_section("synthetic", image_size=24, synthetic_images=50, synthetic_classes=7))
    x, y = collect(ds, "train", world=2, batch=8)
    assert x.shape == (50, 3, 24, 24) and y.max() < 7 and ds.val_size == 12
