"""The doctor's choice of decode path on an NVIDIA node, its logic on a CPU: both paths
probed beside the steps a run's trials take, the faster kept for the runs, which then load
it. The probes themselves need a GPU; here they answer with given rates."""

from types import SimpleNamespace

import pytest

from automlperf import hardware
from automlperf.runner.doctor import pipeline
from automlperf.train import data as datasets
from automlperf.train.data import gpudecode
from helpers import data_section
from imagefolder import make_image_folder


class Importable:
    name = "importable"

    def versions(self):
        return {"lib": "1"}


@pytest.fixture
def gpu_node(tmp_path, monkeypatch):
    monkeypatch.setattr(gpudecode, "DECODERS", (Importable,))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(hardware, "device_name", lambda torch, device: "NVIDIA H200")
    return SimpleNamespace(devices=["cuda:0"], trial_images_per_s=6_000.0)


def probes(monkeypatch, cpu_rate, gpu_rate):
    asked = []

    def probe(node, shape, root, index, gpu_decode=False, compile=False):
        asked.append((gpu_decode, compile))
        rate = gpu_rate if gpu_decode else cpu_rate
        return {"workers": 15, "training": {"images_per_s": rate}}

    monkeypatch.setattr(pipeline, "probe", probe)
    return asked


def test_the_faster_path_beside_compiled_steps_is_kept_and_runs_use_it(tmp_path, gpu_node,
                                                                       monkeypatch):
    asked = probes(monkeypatch, 4_300.0, 6_100.0)
    eager = {"workers": 15, "training": {"images_per_s": 5_000.0}}
    choice = pipeline.decode_choice(gpu_node, None, tmp_path, tmp_path, eager)
    # The trials compile, so both paths are measured beside compiled steps.
    assert asked == [(False, True), (True, True)]
    assert choice["path"] == "gpu" and choice["beside_compiled_steps"] is True
    assert choice["why"] == ("automatic: beside training, the GPU path fed 6,100 img/s and "
                             "the CPU workers 4,300")
    make_image_folder(tmp_path / "photos", corrupt=False)
    data = data_section("imagenet", data_dir=tmp_path / "photos", image_size=32, workers=15)
    ds = datasets.load(data, device_type="cuda")
    assert type(ds) is datasets.GpuImageFolderDataset
    assert "6,100 img/s and the CPU workers 4,300 (automlperf doctor, " in ds.decode_choice
    # Measured again and slower: the runs go back to the CPU workers.
    probes(monkeypatch, 4_300.0, 4_200.0)
    gpu_node.trial_images_per_s = None  # eager trials: the eager probe's rate is the CPU's
    assert pipeline.decode_choice(gpu_node, None, tmp_path, tmp_path, eager)["path"] == "cpu"
    assert type(datasets.load(data, device_type="cuda")) is datasets.ImageFolderDataset


def test_a_choice_that_cannot_be_kept_says_the_runs_keep_the_cpu_workers(tmp_path, gpu_node,
                                                                        monkeypatch):
    probes(monkeypatch, 4_300.0, 6_100.0)
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))  # not a folder
    choice = pipeline.decode_choice(gpu_node, None, tmp_path, tmp_path, {})
    assert choice["path"] == "gpu"
    assert choice["why"].endswith("they decode with the CPU workers")


def test_without_a_gpu_decoder_nothing_is_probed(tmp_path, gpu_node, monkeypatch):
    asked = probes(monkeypatch, 1.0, 2.0)
    monkeypatch.setattr(gpudecode, "DECODERS", ())
    choice = pipeline.decode_choice(gpu_node, None, tmp_path, tmp_path, {})
    assert asked == [] and choice["path"] == "cpu" and "no nvJPEG decoder" in choice["why"]
