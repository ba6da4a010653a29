"""The training engine with real processes, real data and real PyTorch training."""

import functools
import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest

from automlperf.graph import seeds
from automlperf.ops import count, epoch_ops
from automlperf.events import EpochEvent, JsonlSink, TrialOutcome, read_jsonl
from automlperf.train.pool import DevicePool
from automlperf.train.pooltrainer import train_trial
from automlperf.train.spec import EarlyStopping
from automlperf.train.trainer import lr_factor
from helpers import SMALL8, WIDE, Recorder, data_section, pool_under_memory_limit, trial_spec

pytestmark = pytest.mark.slow

# The trainer's tests train three epochs unless they say otherwise.
spec = functools.partial(trial_spec, epochs=3)


@pytest.fixture(scope="module")
def pool():
    with DevicePool(["cpu"], data_section("digits"), threads_per_rank=2) as p:
        yield p


def test_short_training_beats_chance_and_keeps_best_weights(pool, tmp_path):
    rec = Recorder()
    out = train_trial(pool, spec("learn", epochs=4, weights_out=str(tmp_path / "w.safetensors")), rec)
    assert out.status == "completed" and out.epochs == 4 and out.precision == "fp32"
    assert out.best_accuracy > 0.6  # chance is 0.1
    assert [e["epoch"] for e in rec.epochs] == [0, 1, 2, 3]
    assert all(e["train_images"] == 1437 and e["val_images"] == 360 for e in rec.epochs)
    assert rec.epochs[-1]["train_loss"] < rec.epochs[0]["train_loss"]
    assert rec.progress and rec.progress[0]["steps"] == 23
    from safetensors.torch import load_file

    weights = load_file(out.weights)
    assert "layers.stem_conv.weight" in weights


def test_epoch_events_carry_exact_operation_sums(pool, tmp_path):
    rec = Recorder()
    train_trial(pool, spec("ops", epochs=2, batch_size=50), rec)
    ops = count(SMALL8, batch_size=50)
    for e in rec.epochs:
        assert e["steps"] == 29  # ceil(1437 / 50)
        assert e["ops"] == epoch_ops(ops, e["train_images"], e["steps"], e["val_images"])
        assert 0.0 <= e["data_share"] < 1.0 and e["images_per_s"] > 0
    sink = JsonlSink(tmp_path / "events.jsonl")
    for e in rec.epochs:
        sink.epoch(EpochEvent(**e))
    sink.trial(TrialOutcome(trial_id="ops", status="completed", epochs=2))
    sink.close()
    with open(tmp_path / "events.jsonl", "a") as f:
        f.write('{"type": "epoch", "trial_id": "torn"')  # a kill mid-write
    records = read_jsonl(tmp_path / "events.jsonl")
    assert [r["type"] for r in records] == ["epoch", "epoch", "trial"]
    assert sum(r["ops"] for r in records if r["type"] == "epoch") == sum(e["ops"] for e in rec.epochs)


def test_early_stopping(pool):
    rec = Recorder()
    out = train_trial(pool, spec("stop", epochs=12, patience=1, lr_per_256=1e-7), rec)
    assert out.status == "completed" and out.early_stopped and out.epochs < 12
    best = max(e["val_accuracy"] for e in rec.epochs)
    assert out.best_accuracy == best
    assert rec.epochs[-1]["val_accuracy"] <= best


def test_early_stopping_on_a_flat_validation_loss(pool):
    rec = Recorder()
    out = train_trial(pool, spec("flat-loss", epochs=12, patience=2, lr_per_256=1e-7,
                                 early_stop_metric="val_loss", early_stop_min_delta=0.001), rec)
    assert out.status == "completed" and out.early_stopped and out.epochs < 12
    losses = [e["val_loss"] for e in rec.epochs]
    assert all(math.isfinite(v) and v > 0 for v in losses)
    # The rule, replayed on the recorded losses, stops after the last recorded epoch.
    rule = EarlyStopping("val_loss", 2, 0.001)
    assert [rule.update(v, 0.0) for v in losses] == [False] * (len(losses) - 1) + [True]
    assert out.best_accuracy == max(e["val_accuracy"] for e in rec.epochs)


def test_early_stopping_watches_the_validation_loss_without_label_smoothing(pool, tmp_path):
    """Label smoothing is the site's (the paper's loss function is a default, not a rule);
    the early-stopping rule is fixed: the loss it watches is the plain cross-entropy of the
    validation set, whatever the training loss smooths."""
    import contextlib

    import torch
    from torch import nn

    from automlperf.train.data import load
    from automlperf.train.evaluate import evaluate, load_weights

    rec = Recorder()
    out = train_trial(pool, spec("smooth", epochs=1, label_smoothing=0.6,
                                 weights_out=str(tmp_path / "w.safetensors")), rec)
    assert out.status == "completed"
    (epoch,) = rec.epochs
    module = load_weights(SMALL8, tmp_path / "w.safetensors")
    data = load(data_section("digits"), None, "cpu")
    losses = {}
    for smoothing in (0.0, 0.6):
        batches = data.batches("val", 0, 1, 64, 0, 0, torch.device("cpu"))
        _, seen, total = evaluate(module, batches, contextlib.nullcontext(),
                                  torch.contiguous_format, nn.CrossEntropyLoss(label_smoothing=smoothing))
        losses[smoothing] = total / seen
    assert abs(losses[0.6] - losses[0.0]) > 0.1  # the two losses are far apart here
    assert epoch["val_loss"] == pytest.approx(losses[0.0], rel=1e-4)


def test_non_finite_loss_fails_the_trial_not_the_replica(pool):
    rec = Recorder()
    out = train_trial(pool, spec("nan", epochs=2, lr_per_256=1e9), rec)
    assert out.status == "failed" and out.reason.startswith("nan:")
    assert rec.epochs == []  # a diverged epoch is not a completed one
    again = train_trial(pool, spec("after-nan", epochs=1))
    assert again.status == "completed"


def test_a_killed_rank_is_a_recorded_crash_and_the_pool_recovers(pool):
    def kill_on_progress(kind, msg):
        if kind == "progress":
            os.kill(pool._ranks[0].process.pid, signal.SIGKILL)

    out = train_trial(pool, spec("crash", epochs=3), kill_on_progress)
    assert out.status == "failed" and out.reason.startswith("crash:") and "-9" in out.reason
    assert pool.restarts >= 1
    assert train_trial(pool, spec("after-crash", epochs=1)).status == "completed"


def test_deadline_keeps_completed_epochs(pool):
    rec = Recorder()
    out = train_trial(pool, spec("deadline", epochs=6), rec, should_stop=lambda: len(rec.epochs) >= 1)
    assert out.status == "stopped" and len(rec.epochs) == 1
    assert train_trial(pool, spec("after-deadline", epochs=1)).status == "completed"


def test_no_epoch_starts_after_the_deadline(pool):
    rec = Recorder()
    restarts = pool.restarts
    out = train_trial(pool, spec("late", epochs=3, finish_by=time.time() - 1), rec)
    assert out.status == "stopped" and out.reason == "deadline reached" and rec.epochs == []
    # The ranks stopped themselves, together, at an epoch's start: nothing to restart.
    assert pool.restarts == restarts
    assert train_trial(pool, spec("in-time", epochs=1, finish_by=time.time() + 3600)).status \
        == "completed"


def test_graph_must_fit_the_data(pool):
    out = train_trial(pool, spec("mismatch", graph=seeds.resnet_small(10, 16, 1)))
    assert out.status == "failed" and "does not match" in out.reason


def test_two_gloo_ranks_process_the_same_images_as_one():
    counts = {}
    for world in (1, 2):
        rec = Recorder()
        with DevicePool(["cpu"] * world, data_section("digits")) as p:
            out = train_trial(p, spec(f"dp{world}", epochs=2, batch_size=64), rec)
        assert out.status == "completed"
        counts[world] = [(e["train_images"], e["val_images"], e["steps"]) for e in rec.epochs]
        assert all(e["world_size"] == world for e in rec.epochs)
    assert [c[:2] for c in counts[1]] == [c[:2] for c in counts[2]] == [(1437, 360)] * 2
    # One rank: 1437 images in steps of 64. Two: 719 and 718 images in steps of 32 each.
    assert counts[1][0][2] == 23 and counts[2][0][2] == 23


def test_out_of_memory_retries_at_half_batch_then_recovers():
    p = pool_under_memory_limit(["cpu"])
    with p:
        out = train_trial(p, spec("oom", graph=WIDE, epochs=1, batch_size=2048))
        assert out.status == "failed" and out.extra["failure"] == "oom"
        assert out.extra["oom_retry"]["first_batch_size"] == 2048 and out.batch_size == 1024
        small = seeds.resnet_small(10, 16, 3)
        assert train_trial(p, spec("fits", graph=small, epochs=1, batch_size=256)).status == "completed"


def test_lr_schedule_warms_up_then_decays_to_zero():
    values = [lr_factor(s, 100, 10) for s in range(100)]
    assert values[0] == pytest.approx(0.1) and values[9] == pytest.approx(1.0)
    assert values[10] == pytest.approx(1.0) and values[-1] == pytest.approx(1 / 90)
    assert all(a >= b for a, b in zip(values[10:], values[11:]))


def test_train_command_json_and_errors(tmp_path):
    graph = tmp_path / "g.json"
    graph.write_text(SMALL8.to_json())
    exe = [sys.executable, "-m", "automlperf.cli"]
    done = subprocess.run(exe + ["train", "--graph", str(graph), "--dataset", "digits",
                                 "--image-size", "8", "--epochs", "2", "--batch-size", "128",
                                 "--json"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [e["epoch"] for e in lines] == [0, 1] and lines[0]["batch_size"] == 128
    assert "best val accuracy" in done.stderr and "OPS" in done.stderr
    bad = subprocess.run(exe + ["train", "--graph", str(graph), "--dataset", "cifar10"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "cifar10 needs --data-dir" in bad.stderr
    wrong = subprocess.run(exe + ["train", "--model", "resnet_small", "--image-size", "32",
                                  "--dataset", "builtin", "--graph", str(graph)],
                           capture_output=True, text=True, timeout=120)
    assert wrong.returncode == 2 and "--graph or --model" in wrong.stderr


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_paths_train_on_cpu(precision):
    """The autocast and gradient-scaler code GPUs use, exercised on a tiny CPU run."""
    import torch

    from automlperf.train.data import SyntheticDataset
    from automlperf.train.trainer import RankContext, train_on_rank as train_here

    data = SyntheticDataset(image_size=8, num_classes=10, train_images=48)
    graph = seeds.resnet_small(num_classes=10, image_size=8, in_channels=3)
    rec = Recorder()
    out = train_here(spec("amp", graph=graph, epochs=1, batch_size=16, precision=precision,
                          channels_last=True),
                     RankContext(0, 1, torch.device("cpu"), data), rec)
    assert out.status == "completed", out.reason
    assert out.precision == precision and rec.epochs[0]["precision"] == precision
    assert rec.epochs[0]["train_images"] == 48


def test_precision_rules():
    import torch

    from automlperf.train.device import resolve_precision

    cpu = torch.device("cpu")
    assert resolve_precision("auto", cpu) == "fp32"
    assert resolve_precision("tf32", cpu) == "tf32"
    with pytest.raises(ValueError, match="minimum is 16-bit"):
        resolve_precision("fp8", cpu)


def test_local_replicas_get_disjoint_gpus(monkeypatch):
    import torch

    from automlperf import hardware
    from automlperf.runner.launch import LaunchError, gpu_slices

    monkeypatch.setattr(hardware, "accelerator_nodes_present", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert gpu_slices(2, None) == ["0,1,2,3", "4,5,6,7"]
    assert gpu_slices(3, 2) == ["0,1", "2,3", "4,5"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert gpu_slices(2, None) == ["3", "5"]
    with pytest.raises(LaunchError, match="need 3 GPUs but 2 are visible"):
        gpu_slices(3, None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_slices(4, None) == []
