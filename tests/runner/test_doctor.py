"""`automlperf doctor`: the node checklist end to end (shortened with --quick), its JSON, and
the one-line failure of a node whose data cannot be read."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from automlperf.runner import doctor
from automlperf.runner.doctor import STATUSES, DoctorRequest, memory, official, pipeline, training

ITEMS = ["devices", "ceiling", "train eager", "train channels_last", "train compiled",
         "memory", "input pipeline", "energy", "official run"]


def _doctor(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "automlperf.cli", "doctor", "--quick",
                           *map(str, args)], capture_output=True, text=True, timeout=1800)


@pytest.mark.slow
def test_the_quick_doctor_passes_on_this_machine_and_writes_every_item(tmp_path):
    done = _doctor("--out", tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "doctor.json").read_text())
    checks = {c["name"]: c for c in report["checks"]}
    assert list(checks) == ITEMS and report["passed"]
    assert all(c["status"] in STATUSES and c["status"] != "fail" for c in checks.values())
    assert checks["ceiling"]["figures"]["ceiling_ops"] > 0
    eager = checks["train eager"]["figures"]
    assert eager["images_per_s"] > 0 and eager["fraction_of_ceiling"] > 0
    assert checks["train channels_last"]["figures"]["channels_last"] is True
    # The pipeline is judged against the run's own layout: channels_last, the default here.
    default = checks["train channels_last"]["figures"]["images_per_s"]
    loader = checks["input pipeline"]["figures"]
    assert loader["needed_images_per_s_per_rank"] == default
    # The rank's own loader, alone and beside training, with the run's workers and batch.
    assert loader["alone"]["images_per_s"] > 0 and loader["training"]["steps"] >= 3
    assert 0 <= loader["predicted_data_share"] <= 1 and loader["per_rank"] == 8
    assert loader["workers"] == max(0, checks["devices"]["figures"]["threads_per_rank"] - 1)
    assert loader["decode_path"].startswith("cpu-pillow ")
    # Which path the node's runs decode with, and why, in the item's own line.
    why = "automatic: the ranks have no NVIDIA GPU"
    assert loader["decode_choice"] == {"path": "cpu", "why": why}
    assert f"decode path: cpu ({why})" in checks["input pipeline"]["summary"]
    run = checks["official run"]["figures"]
    assert run["check_ok"] and run["epochs"] >= 1
    assert run["speed"]["ratio"] > 0 and set(run["speed"]["lost_s"]) == {
        "start-up", "data", "validation", "device", "between trials"}
    assert (tmp_path / "run" / "result.json").exists()
    assert "automlperf doctor (quick)" in done.stdout


@pytest.mark.slow
def test_a_folder_that_cannot_be_read_fails_the_doctor_in_one_line_per_item(tmp_path):
    data = tmp_path / "data"
    (data / "train" / "n00000000").mkdir(parents=True)
    (data / "train" / "n00000000" / "a.JPEG").write_bytes(b"not a jpeg")
    done = _doctor("--out", tmp_path / "out", "--data-dir", data)
    assert done.returncode == 1
    assert "Traceback" not in done.stdout + done.stderr
    checks = {c["name"]: c for c in json.loads((tmp_path / "out" / "doctor.json").read_text())["checks"]}
    assert checks["input pipeline"]["status"] == "fail"
    assert "val" in checks["input pipeline"]["summary"]
    assert checks["official run"]["status"] == "fail"
    assert checks["train eager"]["status"] != "fail"  # the rest of the node is still checked


def test_an_item_that_raises_is_a_failure_and_the_others_still_run(tmp_path, monkeypatch):
    def broken(node, shape):
        raise OSError("the device vanished")

    def fine(node, shape):
        return doctor.Check("energy", "pass", "ok")

    monkeypatch.setattr(doctor, "ITEMS", [("broken", broken), ("energy", fine)])
    seen: list[str] = []
    report = doctor.run_doctor(DoctorRequest(tmp_path, quick=True), lambda c: seen.append(c.name))
    assert seen == ["broken", "energy"]
    assert [c.status for c in report.checks] == ["fail", "pass"]
    assert "OSError: the device vanished" in report.checks[0].summary
    assert json.loads(Path(report.path).read_text())["passed"] is False


def test_the_cpu_memory_estimate_extrapolates_two_measured_batches(tmp_path, monkeypatch):
    peaks = {4: 1000 + 4 * 50, 8: 1000 + 8 * 50}
    monkeypatch.setattr(memory, "probe", lambda shape, b, device, node: {
        "batch": b, "oom": False, "peak_bytes": peaks[b]})
    node = doctor.Node(DoctorRequest(tmp_path, quick=True))
    if node.accelerated:
        pytest.skip("the estimate is the CPU path")
    check = memory.memory(node, doctor.Shape("resnet_small", 32, 4, False))
    figures = check.figures
    assert figures["per_image_bytes"] == 50
    assert figures["estimated_bytes"][figures["default_batch"]] == 1000 + 50 * figures["default_batch"]
    assert check.status == "pass"


def _node(tmp_path, accelerated, eager):
    node = doctor.Node(DoctorRequest(tmp_path))
    node.accelerated, node.train_images_per_s = accelerated, eager
    return node


def test_a_slower_layout_or_compilation_is_named_with_what_to_set(tmp_path):
    node = _node(tmp_path, False, 10.0)
    node.rates = {"train eager": 10.0, "train channels_last": 12.0}
    node.channels_last = True  # the default on CPUs and CUDA GPUs
    assert "train.compile unset or false" in training.layout_advice(node, 11.0, True, True)
    assert training.layout_advice(node, 13.0, True, True) == ""
    assert training.layout_advice(node, 12.0, True, False) == ""  # faster: the default stands
    assert "train.channels_last = false" in training.layout_advice(node, 9.0, True, False)
    node.channels_last = False  # a device whose default is the standard layout
    assert "train.channels_last = true" in training.layout_advice(node, 12.0, True, False)
    assert "train.compile unset or false" in training.layout_advice(node, 9.0, False, True)


def test_the_compile_figures_come_from_the_first_epochs_and_give_the_rules_decision(tmp_path):
    from automlperf.config import load_config
    from automlperf.train.compiling import CompileFigures

    node = _node(tmp_path, False, 10.0)
    node.channels_last = True
    assert training.compile_figures(node, 177) is None  # nothing measured yet
    node.step_ops = {"train channels_last": 2e11, "train compiled": 2.4e11}
    # The compiled first epoch took 40 s beyond its steady steps, the eager one 5 s.
    node.first_overheads = {"train channels_last": 5.0, "train compiled": 45.0}
    figures = training.compile_figures(node, 177)
    assert figures == CompileFigures(40.0, 177, 2e11, 2.4e11, f"automlperf doctor, {node.devices[0]}")
    said = training.compile_advice(node, figures, doctor.Shape("resnet50", 224, 1000, True))
    # 15 epochs of ImageNet's 1,281,167 images at ~23 GOPs each: compiling pays.
    assert "+20% against eager" in said and "it pays" in said
    toml = said[said.index("train.compile_figures"):]
    cfg = load_config(None, "imagenet", {"train": {"compile_figures": figures.to_dict()}})
    assert CompileFigures(**cfg.train.compile_figures.model_dump()) == figures
    assert "compile_s = 40.0" in toml and "layers = 177" in toml
    slow = CompileFigures(4e5, 177, 2e11, 2.4e11)  # a compilation of days never pays
    assert "does not pay" in training.compile_advice(node, slow, doctor.Shape("resnet50", 224, 1000, True))


def test_a_low_share_of_the_ceiling_is_judged_in_the_runs_own_layout(tmp_path):
    node = _node(tmp_path, False, 10.0)
    node.channels_last = True
    limit = training.TRAIN_FRACTION_WARN["cpu"]
    assert "below" in training.low_fraction_advice(node, limit - 0.01, True)
    assert training.low_fraction_advice(node, limit + 0.01, True) == ""
    assert training.low_fraction_advice(node, limit - 0.01, False) == ""  # only compared
    assert training.low_fraction_advice(node, None, True) == ""  # no ceiling measured


def test_the_generated_folder_and_the_short_run_are_sized_from_the_measured_rate(tmp_path):
    from automlperf.train.data.generate import write_photo_folder

    slow, fast = _node(tmp_path, False, 4.5), _node(tmp_path, True, 3000.0)
    classes, train, val = official.generated_size(slow)
    assert (classes, train) == (official.CLASSES, official.MIN_PER_CLASS) and val == train // 4
    assert official.generated_size(fast)[1] == official.MAX_PER_CLASS
    middle = _node(tmp_path, False, 10.0)  # 30 s an epoch: 300 images, 30 a class
    assert official.generated_size(middle)[1] == 30
    write_photo_folder(tmp_path / "data", 2, 8, 2, size=(64, 48))  # 16 + 4 images
    # 16 + 4/3 images at 0.1 img/s, two epochs after the start: longer than the default 150 s.
    assert official.run_seconds(_node(tmp_path, False, 0.1), tmp_path / "data") == pytest.approx(
        official.RUN_START_S + official.RUN_EPOCHS * (16 + 4 / 3) / 0.1)
    assert official.run_seconds(slow, tmp_path / "data") == 150.0  # never below the request


def test_the_input_item_fails_below_1x_headroom_and_warns_below_1_2x_or_a_large_data_share():
    status, advice = pipeline.verdict(9.0, 10.0, 0.0)
    assert status == "fail" and "data side" in advice and "gpu_decode" in advice
    assert "share this node's cores" in pipeline.verdict(9.0, 10.0, 0.0, accelerated=False)[1]
    status, advice = pipeline.verdict(11.0, 10.0, 0.0)
    assert status == "warn" and "1.2x" in advice
    assert pipeline.verdict(13.0, 10.0, 0.02) == ("pass", "")
    status, advice = pipeline.verdict(13.0, 10.0, 0.3)
    assert status == "warn" and "30%" in advice and "data side" in advice
    assert pipeline.verdict(13.0, None, 0.0) == ("pass", "")  # no training rate to compare


def test_the_loader_is_judged_against_compiled_training_when_a_first_round_trial_compiles(
        tmp_path, monkeypatch):
    # An H200's figures (bench/gpu/h200-2026-11-26c): eager 111 TOPS, compiled 158, 75 s to
    # compile. A first-round ImageNet-1k trial compiles, so its steps consume 6,852 img/s;
    # the loader's 5,282 img/s kept up with eager steps (4,821) but starves compiled ones.
    from automlperf.train.compiling import CompileFigures
    from automlperf.train.data.generate import write_photo_folder

    shape = doctor.Shape("resnet50", 224, 1000, True)
    figures = CompileFigures(74.9, 175, 1.109e14, 1.576e14)
    assert training.first_round_decision(figures, shape, 1).compile
    assert not training.first_round_decision(CompileFigures(4e5, 175, 1.109e14, 1.576e14),
                                              shape, 1).compile
    write_photo_folder(tmp_path / "data", 2, 8, 2, size=(64, 48))
    node = doctor.Node(DoctorRequest(tmp_path / "out", data_dir=tmp_path / "data"))
    node.devices, node.accelerated = ["cuda:0"], True
    node.train_images_per_s = 4821.0
    # No GPU decoder to compare with here (test_doctor_choice.py covers the comparison), and
    # the GPU's name as a CUDA node reports it.
    from automlperf import hardware
    from automlperf.train.data import gpudecode

    monkeypatch.setattr(gpudecode, "DECODERS", ())
    monkeypatch.setattr(hardware, "device_name", lambda torch, device: "NVIDIA H200")
    monkeypatch.setattr(pipeline, "probe", lambda *a, **k: {
        "alone": {"images_per_s": 5282.0}, "decode_path": "cpu-pillow", "workers": 15,
        "rank_threads": 1, "per_rank": 256, "device": "cuda:0",
        "training": {"steps": 373, "passes": 3, "images_per_s": 4815.0, "data_share": 0.04,
                     "device_share": 0.96}})
    eager = pipeline.pipeline(node, shape)
    assert eager.status == "warn" and "1.10x what training consumes (4821.0)" in eager.summary
    node.trial_images_per_s = 6852.0
    compiled = pipeline.pipeline(node, shape)
    assert compiled.status == "fail" and "data side" in compiled.advice
    assert "0.77x what compiled training consumes (6852.0)" in compiled.summary
    assert compiled.figures["need_compiled"] and "beside eager training" in compiled.summary
    assert compiled.summary.startswith("cpu path, chosen (cpu-pillow, 15 worker(s)")


@pytest.mark.slow
def test_the_input_item_measures_the_ranks_loader_on_the_official_archives(tmp_path):
    """`automlperf doctor --data-dir` given the official archives: the pipeline item indexes
    them (one pass) and measures the rank's own loader reading them, alone and beside
    training, as it does a folder."""
    from automlperf.testing.archives import write_archives
    from automlperf.train.data.generate import write_photo_folder

    write_photo_folder(tmp_path / "folder", 2, 8, 2, size=(64, 48))
    write_archives(tmp_path / "folder", tmp_path / "archives")
    node = doctor.Node(DoctorRequest(tmp_path / "out", quick=True, data_dir=tmp_path / "archives"))
    node.train_images_per_s = 40.0
    check = pipeline.pipeline(node, doctor.Shape("resnet_small", 32, 2, False))
    assert check.status in ("pass", "warn"), check.summary + check.advice
    assert check.figures["alone"]["images_per_s"] > 0 and check.figures["training"]["steps"] >= 3
    assert check.figures["decode_path"].startswith("cpu-pillow ")
    assert (tmp_path / "out" / "index" / "at.npy").exists()


def _result(images, **parts):
    total = {"session_s": 100.0, "start_to_first_epoch_s": 0.0, "training_s": 0.0,
             "data_wait_s": 0.0, "validation_s": 0.0, "between_trials_s": 0.0,
             "candidate_wait_s": 0.0, "lost_at_deadline_s": 0.0, **parts}
    return {"train_images": images, "time_breakdown": {"total": total}}


def test_a_slow_whole_run_names_the_side_that_limits():
    # The training item ran at 10 img/s: 1,000 images in the 100 s session would be 1.0.
    fast = official.judge_speed(_result(900, training_s=95.0, start_to_first_epoch_s=5.0), 10.0)
    assert fast["ratio"] == pytest.approx(0.9) and fast["limit"] is None
    data = official.judge_speed(_result(500, training_s=80.0, data_wait_s=30.0,
                                        start_to_first_epoch_s=10.0, validation_s=10.0), 10.0)
    assert data["limit"] == "data" and "0.50" in data["advice"] and "30%" in data["advice"]
    start = official.judge_speed(_result(500, training_s=50.0, start_to_first_epoch_s=40.0), 10.0)
    assert start["limit"] == "start-up"
    val = official.judge_speed(_result(400, training_s=45.0, validation_s=50.0), 10.0)
    assert val["limit"] == "validation"
    # Steps of 90 s for 500 images: 40 s beyond the item's rate (grown models).
    device = official.judge_speed(_result(500, training_s=90.0, validation_s=5.0), 10.0)
    assert device["limit"] == "device" and device["lost_s"]["device"] == pytest.approx(40.0)
    assert official.judge_speed(_result(500), None) == {"ratio": None}


def test_a_quick_doctor_after_a_full_one_makes_its_own_folder_and_sizes_its_model_to_any(
        tmp_path, monkeypatch):
    """`automlperf doctor` then `automlperf doctor --quick` in the same folder: the quick one
    found the full one's 10-class folder and probed it with its 4-class model (`IndexError:
    Target 8 is out of bounds`). Each mode has its own folder, made again where its note is
    absent or says otherwise; a site's folder of more classes than the shape's gets a model
    with an output for each."""
    from automlperf.train.data import generate
    from automlperf.train.data.generate import write_photo_folder
    from automlperf.train.data.index import scan_image_folder

    made = []

    def small(root, classes, train, val, **kw):
        made.append((root.name, classes))
        write_photo_folder(root, classes, 2, 1, size=(40, 30))

    monkeypatch.setattr(generate, "write_photo_folder", small)
    out = tmp_path / "out"
    write_photo_folder(out / "data", 10, 2, 1, size=(40, 30))  # a full doctor's, noted by none
    quick = doctor.Node(DoctorRequest(out, quick=True))
    shape = doctor.Shape("resnet_small", 32, 4, False)
    root = official.dataset_dir(quick, shape)
    assert root == out / "data-quick" and len(scan_image_folder(root).classes) == 4
    assert official.dataset_dir(quick, shape) == root and made == [("data-quick.partial", 4)]
    full = _node(out, False, 10.0)
    assert official.dataset_dir(full, shape) == out / "data"  # no note: made again
    assert made[-1] == ("data.partial", official.CLASSES)
    assert official.dataset_dir(full, shape) == out / "data" and len(made) == 2
    (out / "data.json").write_text('{"quick": true, "classes": 4}')  # says otherwise
    official.dataset_dir(full, shape)
    assert len(made) == 3 and not (out / "data.partial").exists()
    # A site's folder of 10 classes probed for the 4-class quick shape.
    asked = []
    monkeypatch.setattr(pipeline, "probe", lambda *a, **k: asked.append(k.get("classes")) or {
        "alone": {"images_per_s": 50.0}, "decode_path": "cpu-pillow", "workers": 1,
        "rank_threads": 1, "per_rank": 8, "device": "cpu",
        "training": {"steps": 3, "passes": 1, "images_per_s": 40.0, "data_share": 0.0,
                     "device_share": 1.0, "busy_cores": 1.0}})
    site = doctor.Node(DoctorRequest(tmp_path / "o2", quick=True, data_dir=out / "data"))
    site.train_images_per_s = 10.0
    check = pipeline.pipeline(site, shape)
    assert asked == [official.CLASSES] and check.status == "pass", check.summary
