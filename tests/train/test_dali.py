"""Image folders decoded by NVIDIA DALI, with its CPU decoders (the same pipeline runs its
decoder on the GPU when the rank has one): through `automlperf train` on one and two ranks,
and the loader's pipelines, counts and layout within a rank."""

import json

import pytest
import torch

from automlperf.graph import seeds
from automlperf.train import data as datasets
from automlperf.train.data import dali
from automlperf.train.trainer import RankContext, TrialSpec, train_on_rank
from helpers import TEST_MAX_UNREADABLE, cli, data_section, marked_env, wait_no_strays
from imagefolder import assert_every_image_counted, make_image_folder

pytestmark = [pytest.mark.dali, pytest.mark.slow]


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    root = tmp_path_factory.mktemp("photos")
    return root, make_image_folder(root, classes=3, train_per_class=10, val_per_class=4,
                                   corrupt=2)


@pytest.mark.parametrize("devices", [1, 2])
def test_train_decodes_with_dali_and_counts_corrupt_files(tmp_path, photos, devices):
    root, counts = photos
    env, mark = marked_env()
    config = tmp_path / "dali.toml"
    config.write_text(f"[data]\nworkers = 1\ndali = true\n"
                      f"max_unreadable = {TEST_MAX_UNREADABLE}\n")
    done = cli("train", "--config", config, "--epochs", 2, "--json", "--dataset", "imagenet",
               "--data-dir", root, "--model", "resnet_small", "--image-size", 32,
               "--devices", devices, "--batch-size", 8, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    epochs = [json.loads(line) for line in done.stdout.splitlines()]
    assert_every_image_counted(epochs, devices, counts)
    wait_no_strays(mark)


def test_one_pipeline_per_split_and_trial_with_nhwc_uint8_output(photos, monkeypatch):
    root, counts = photos
    ds = datasets.load(data_section("imagenet", data_dir=root, image_size=32, workers=1, dali=True))
    assert isinstance(ds, datasets.DaliImageFolderDataset)
    built: list[tuple[bool, int]] = []
    real_build = dali._DaliLoader._build

    def counting_build(self, train, batch):
        built.append((train, batch))
        return real_build(self, train, batch)

    monkeypatch.setattr(dali._DaliLoader, "_build", counting_build)
    cpu = torch.device("cpu")
    loader = ds.loader(0, 1, 8, 0, cpu)
    for epoch in range(3):
        seen = skipped = 0
        for images, labels, bad, _ in loader.passes("train", epoch):
            assert images.dtype == torch.uint8 and images.shape[1:] == (32, 32, 3)
            assert len(images) == len(labels)
            seen, skipped = seen + len(labels), skipped + bad
        assert (seen, skipped) == (counts["train"], 2)
        assert sum(len(y) for _, y, _, _ in loader.passes("val", epoch)) == counts["val"]
    # Training and validation pipelines, each built once for the trial's three epochs (the
    # corrupt files did not make them be built again), and one one-image pipeline that
    # tells corrupt files apart.
    assert sorted(built) == [(False, 1), (False, 10), (True, 10)]
    # The dataset's batches are the same bytes seen as NCHW: channels-last, no copy.
    x, _ = next(ds.batches("train", 0, 1, 8, 0, 0, cpu))
    assert x.shape[1:] == (3, 32, 32) and x.is_contiguous(memory_format=torch.channels_last)
    ds.release()
    assert ds._loader is None and not loader._pipes


def test_a_trial_on_dali_images_through_the_trainer(photos):
    root, counts = photos
    ds = datasets.load(data_section("imagenet", data_dir=root, image_size=32, workers=1, dali=True,
                                    max_unreadable=TEST_MAX_UNREADABLE))
    graph = seeds.resnet_small(num_classes=3, image_size=32)
    spec = TrialSpec("dali", graph.to_dict(), epochs=2, batch_size=8, patience=5)
    out = train_on_rank(spec, RankContext(0, 1, torch.device("cpu"), ds))
    assert out.status == "completed", out.reason
    assert out.epochs == 2 and ds.skipped == 8  # two corrupt files in every pass of 2 epochs
    assert ds._loader is None  # released with the trial


def test_dali_is_chosen_only_when_asked_and_labelled_a_different_function(photos, monkeypatch):
    from automlperf.train.data import gpudecode

    root, _ = photos
    monkeypatch.setattr(gpudecode, "DECODERS", ())  # no nvJPEG decoder: the CPU workers
    folder = data_section("imagenet", data_dir=root)
    assert type(datasets.load(folder, device_type="cuda")) is datasets.ImageFolderDataset
    assert type(datasets.load(folder, device_type="cpu")) is datasets.ImageFolderDataset
    ds = datasets.load(data_section("imagenet", data_dir=root, dali=True), device_type="cpu")
    assert isinstance(ds, datasets.DaliImageFolderDataset)
    assert ds.decode_path.startswith("dali-own-crops ") and "not the reference" in ds.decode_path
