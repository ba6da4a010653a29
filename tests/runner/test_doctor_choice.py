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


def probed(rate, spread=None, compiled=True):
    return {"workers": 15, "compiled": compiled,
            "training": {"images_per_s": rate, "spread": spread}}


def test_the_faster_path_beside_compiled_steps_is_kept_and_runs_use_it(tmp_path, gpu_node):
    decoder = pipeline.decoder_here(gpu_node)
    assert decoder == "importable lib 1"
    choice = pipeline.decode_choice(gpu_node, tmp_path, probed(4_300.0, 0.01),
                                    probed(6_100.0, 0.02), decoder)
    assert choice["path"] == "gpu" and choice["beside_compiled_steps"] is True
    assert choice["why"] == ("automatic: beside training, the GPU path fed 6,100 img/s and "
                             "the CPU workers 4,300 (+41.9%, beyond the probes' own spread of "
                             "2.0%)")
    assert choice["margin"] == pytest.approx(6_100 / 4_300 - 1) and choice["noise"] == 0.02
    assert choice["within_noise"] is False
    make_image_folder(tmp_path / "photos", corrupt=False)
    data = data_section("imagenet", data_dir=tmp_path / "photos", image_size=32, workers=15)
    ds = datasets.load(data, device_type="cuda")
    assert type(ds) is datasets.GpuImageFolderDataset
    assert "6,100 img/s and the CPU workers 4,300 (+41.9%" in ds.decode_choice
    assert "(automlperf doctor, " in ds.decode_choice
    # Measured again and slower, by less than the probes' spread: the runs go back to the
    # CPU workers, and the record says the two were within noise.
    choice = pipeline.decode_choice(gpu_node, tmp_path, probed(4_300.0, 0.03),
                                    probed(4_200.0, 0.01), decoder)
    assert choice["path"] == "cpu" and choice["within_noise"] is True
    assert "(-2.3%: within noise, the probes' own spread being 3.0%)" in choice["why"]
    assert type(datasets.load(data, device_type="cuda")) is datasets.ImageFolderDataset
    # Probes too short to measure their spread: an assumed one, said so.
    choice = pipeline.decode_choice(gpu_node, tmp_path, probed(4_300.0), probed(4_400.0), decoder)
    assert choice["path"] == "gpu" and choice["within_noise"] and not choice["noise_measured"]
    assert "within noise, an assumed spread being 3.0%" in choice["why"]


def test_a_choice_that_cannot_be_kept_says_the_runs_keep_the_cpu_workers(tmp_path, gpu_node,
                                                                        monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))  # not a folder
    choice = pipeline.decode_choice(gpu_node, tmp_path, probed(4_300.0), probed(6_100.0),
                                    pipeline.decoder_here(gpu_node))
    assert choice["path"] == "gpu"
    assert choice["why"].endswith("they decode with the CPU workers")


def test_without_a_gpu_decoder_there_is_no_choice_to_make(tmp_path, gpu_node, monkeypatch):
    monkeypatch.setattr(gpudecode, "DECODERS", ())
    assert pipeline.decoder_here(gpu_node) is None
    choice = pipeline.decode_choice(gpu_node, tmp_path, probed(1.0), None, None)
    assert choice["path"] == "cpu" and "no nvJPEG decoder" in choice["why"]


def _figures(alone, beside, share, busy, compiled=True):
    return {"alone": {"images_per_s": alone}, "decode_path": "x", "workers": 15,
            "rank_threads": 1, "per_rank": 256, "device": "cuda:0", "compiled": compiled,
            "training": {"steps": 300, "passes": 2, "images_per_s": beside, "data_share": share,
                         "device_share": 1 - share, "busy_cores": busy, "spread": 0.01}}


@pytest.mark.parametrize("gpu_rate, path", [(9_000.0, "gpu"), (3_000.0, "cpu")])
def test_the_input_item_judges_the_path_chosen_with_the_other_beside_it(
        tmp_path, gpu_node, monkeypatch, gpu_rate, path):
    """Given rates on an H100 with ImageNet-weight files (gpu-pipeline-3's figures): compiled
    trials consume 5,900 img/s; the CPU workers deliver 3,700 alone, the GPU path 9,000. The
    item judges the path the choice keeps: passing on the GPU path, failing on the CPU's."""
    from automlperf.runner.doctor import DoctorRequest, Node, Shape
    from automlperf.train.data.generate import write_photo_folder

    write_photo_folder(tmp_path / "data", 2, 8, 2, size=(64, 48))
    node = Node(DoctorRequest(tmp_path / "out", data_dir=tmp_path / "data"))
    node.devices, node.accelerated = ["cuda:0"], True
    node.train_images_per_s, node.trial_images_per_s = 4_200.0, 5_900.0
    rates = {False: _figures(3_700.0, 3_650.0, 0.35, 15.2),
             True: _figures(gpu_rate, min(gpu_rate, 5_450.0), 0.01, 1.4)}
    asked = []

    def probe(node, shape, root, index, gpu_decode=False, compile=False, classes=None):
        asked.append((gpu_decode, compile))
        return dict(rates[bool(gpu_decode)])

    monkeypatch.setattr(pipeline, "probe", probe)
    check = pipeline.pipeline(node, Shape("resnet50", 224, 1000, True))
    # Both paths beside compiled steps, and no eager probe of the CPU path.
    assert asked == [(False, True), (True, True)]
    figures = check.figures
    assert figures["chosen_path"] == path and figures["decode_choice"]["path"] == path
    # The folder's files, counted before the run (all plain photos here).
    assert figures["file_mix"]["files"] == 16 and figures["file_mix"]["gpu_path"]["batched"] == 1
    assert "16 training files: 0.0% progressive" in check.summary
    if path == "gpu":
        assert check.status == "pass", check.summary
        assert check.summary.startswith("gpu path, chosen (x, 15 worker(s)")
        assert "alone 9000.0 img/s, 1.53x what compiled training consumes (5900.0)" in check.summary
        assert "5450.0 img/s, data share 0.01 (device 0.99), 1.4 busy host cores" in check.summary
        assert "; the cpu path: alone 3700.0 img/s, beside compiled training" in check.summary
        assert figures["busy_host_cores"] == 1.4 and figures["other_path"]["path"] == "cpu"
        assert figures["predicted_data_share"] == 0.01
    else:
        assert check.status == "fail" and "data side" in check.advice
        assert check.summary.startswith("cpu path, chosen")
        assert "0.63x what compiled training consumes" in check.summary
        assert "; the gpu path: alone 3000.0 img/s" in check.summary
        assert figures["busy_host_cores"] == 15.2 and figures["other_path"]["path"] == "gpu"
