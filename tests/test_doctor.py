"""`automlperf doctor`: the node checklist end to end (shortened with --quick), its JSON, and
the one-line failure of a node whose data cannot be read."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from automlperf.runner import doctor
from automlperf.runner.doctor import STATUSES, DoctorRequest

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
    # The pipeline is sized from the run's own layout: channels_last, the default here.
    default = checks["train channels_last"]["figures"]["images_per_s"]
    assert checks["input pipeline"]["figures"]["needed_images_per_s"] == default
    run = checks["official run"]["figures"]
    assert run["check_ok"] and run["epochs"] >= 1
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
    monkeypatch.setattr(doctor, "_probe", lambda shape, b, device, node: {
        "batch": b, "oom": False, "peak_bytes": peaks[b]})
    node = doctor._Node(DoctorRequest(tmp_path, quick=True))
    if node.accelerated:
        pytest.skip("the estimate is the CPU path")
    check = doctor._memory(node, doctor.Shape("resnet_small", 32, 4, False))
    figures = check.figures
    assert figures["per_image_bytes"] == 50
    assert figures["estimated_bytes"][figures["default_batch"]] == 1000 + 50 * figures["default_batch"]
    assert check.status == "pass"


def _node(tmp_path, accelerated, eager):
    node = doctor._Node(DoctorRequest(tmp_path))
    node.accelerated, node.train_images_per_s = accelerated, eager
    return node


def test_a_slower_layout_or_compilation_is_named_with_what_to_set(tmp_path):
    node = _node(tmp_path, False, 10.0)
    node.rates = {"train eager": 10.0, "train channels_last": 12.0}
    node.channels_last = True  # the default on CPUs and CUDA GPUs
    assert "train.compile = false" in doctor._layout_advice(node, 11.0, True, True)
    assert doctor._layout_advice(node, 13.0, True, True) == ""
    assert doctor._layout_advice(node, 12.0, True, False) == ""  # faster: the default stands
    assert "train.channels_last = false" in doctor._layout_advice(node, 9.0, True, False)
    node.channels_last = False  # a device whose default is the standard layout
    assert "train.channels_last = true" in doctor._layout_advice(node, 12.0, True, False)
    assert "train.compile = false" in doctor._layout_advice(node, 9.0, False, True)


def test_a_clear_gain_from_compilation_is_named_with_its_cost(tmp_path):
    node = _node(tmp_path, False, 10.0)
    node.rates = {"train eager": 10.0, "train channels_last": 12.0}
    node.channels_last = True
    said = doctor._compile_gain(node, 13.2, 58.0)
    assert "10% faster" in said and "train.compile = true" in said and "58 s" in said
    assert doctor._compile_gain(node, 12.3, 58.0) == ""  # within 5 %: not worth a word
    node.rates = {}
    assert doctor._compile_gain(node, 13.2, 58.0) == ""  # nothing to compare with


def test_a_low_share_of_the_ceiling_is_judged_in_the_runs_own_layout(tmp_path):
    node = _node(tmp_path, False, 10.0)
    node.channels_last = True
    limit = doctor.TRAIN_FRACTION_WARN["cpu"]
    assert "below" in doctor._low_fraction_advice(node, limit - 0.01, True)
    assert doctor._low_fraction_advice(node, limit + 0.01, True) == ""
    assert doctor._low_fraction_advice(node, limit - 0.01, False) == ""  # only compared
    assert doctor._low_fraction_advice(node, None, True) == ""  # no ceiling measured


def test_the_generated_folder_and_the_short_run_are_sized_from_the_measured_rate(tmp_path):
    from automlperf.train.data.generate import write_photo_folder

    slow, fast = _node(tmp_path, False, 4.5), _node(tmp_path, True, 3000.0)
    classes, train, val = doctor._generated_size(slow)
    assert (classes, train) == (doctor.CLASSES, doctor.MIN_PER_CLASS) and val == train // 4
    assert doctor._generated_size(fast)[1] == doctor.MAX_PER_CLASS
    middle = _node(tmp_path, False, 10.0)  # 30 s an epoch: 300 images, 30 a class
    assert doctor._generated_size(middle)[1] == 30
    write_photo_folder(tmp_path / "data", 2, 8, 2, size=(64, 48))  # 16 + 4 images
    # 16 + 4/3 images at 0.1 img/s, two epochs after the start: longer than the default 150 s.
    assert doctor._run_seconds(_node(tmp_path, False, 0.1), tmp_path / "data") == pytest.approx(
        doctor.RUN_START_S + doctor.RUN_EPOCHS * (16 + 4 / 3) / 0.1)
    assert doctor._run_seconds(slow, tmp_path / "data") == 150.0  # never below the request
