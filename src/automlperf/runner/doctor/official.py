"""The short official-shape run: a generated ImageNet-layout folder sized for this node (or
the site's), `automlperf run` through the real command, `automlperf check`, and the run's
speed against the training item's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from automlperf.runner.doctor.common import Check, Node, Shape

# The generated folder holds about this long an epoch at the node's measured training rate,
# so that the short run completes epochs on any node; at least MIN_PER_CLASS training images
# a class give the decoding measurement a few hundred files, at most MAX_PER_CLASS keep its
# generation under a minute on a GPU node.
EPOCH_TARGET_S = 30.0
CLASSES, MIN_PER_CLASS, MAX_PER_CLASS = 10, 16, 500
# The short run: time for the replica to start (process, ceiling, first candidate), then
# at least this many epochs; longer than MAX_RUN_S is refused (a site's whole dataset).
RUN_START_S, RUN_EPOCHS, MAX_RUN_S = 30.0, 2, 1800.0
# A whole run's training rate below this share of the training item's warns, naming the side
# that limits.
SPEED_WARN = 0.8


def dataset_dir(node: Node, shape: Shape) -> Path:
    """The site's folder, or one generated under the doctor's output folder: one per mode
    (``data``, ``data-quick``), each with a note of what it was made for beside it, and made
    again where that note is absent or says otherwise (a folder left by an earlier doctor of
    another version, or cut short)."""
    if node.req.data_dir is not None:
        return node.req.data_dir
    from automlperf.train.data.generate import write_photo_folder

    root = node.req.out / ("data-quick" if node.req.quick else "data")
    note = root.with_name(root.name + ".json")
    wanted = generated_size(node)
    if not (root / "val").exists() or _made_for(note) != (node.req.quick, wanted[0]):
        tmp = node.req.out / (root.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        note.unlink(missing_ok=True)
        write_photo_folder(tmp, *wanted)
        shutil.rmtree(root, ignore_errors=True)
        tmp.rename(root)
        note.write_text(json.dumps({"quick": node.req.quick, "classes": wanted[0],
                                    "train_per_class": wanted[1], "val_per_class": wanted[2]}))
    return root


def _made_for(note: Path) -> tuple[bool, int] | None:
    """(quick, classes) of a generated folder, from its note; None without a readable one."""
    try:
        made = json.loads(note.read_text())
        return bool(made["quick"]), int(made["classes"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def generated_size(node: Node) -> tuple[int, int, int]:
    """(classes, training and validation images per class) of the generated folder: an epoch
    of about EPOCH_TARGET_S at the training rate measured earlier."""
    if node.req.quick:
        return 4, 12, 4
    rate = node.train_images_per_s or 1.0
    per_class = int(min(MAX_PER_CLASS, max(MIN_PER_CLASS, rate * EPOCH_TARGET_S / CLASSES)))
    return CLASSES, per_class, max(2, per_class // 4)


def run_seconds(node: Node, root: Path) -> float:
    """How long the short run must last to train RUN_EPOCHS epochs of ``root`` at the
    measured rate (validation images cost a third of a training image)."""
    from automlperf.train.data import DataError
    from automlperf.train.data.index import scan_image_folder

    try:
        index = scan_image_folder(root)
    except DataError:
        return node.req.run_duration_s  # the run itself says what is wrong, in its words
    rate = node.train_images_per_s or 1.0
    epoch = (index.train_size + index.val_size / 3) / rate
    return max(node.req.run_duration_s, RUN_START_S + RUN_EPOCHS * epoch)


def official_run(node: Node, shape: Shape) -> Check:
    """A short `automlperf run` through the real command, then `automlperf check`."""
    from automlperf.submission.check import check_run

    root = dataset_dir(node, shape)
    run_dir = node.req.out / "run"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    # The official shape on data that is not ImageNet-1k (a folder generated for this node,
    # or a subset): an unofficial run, declared so, or it would be refused for its data.
    cmd = [sys.executable, "-m", "automlperf.cli", "run", "--dataset", "imagenet",
           "--data-dir", str(root), "--run-dir", str(run_dir), "--unofficial"]
    if node.req.devices:
        cmd += ["--devices-per-replica", str(node.req.devices)]
    if node.req.quick:
        config = node.req.out / "quick.toml"
        config.write_text(
            f'[data]\ndataset = "imagenet"\ndata_dir = "{root}"\nimage_size = {shape.image_size}\n'
            '[model]\nseed_model = "resnet_small"\n'
            '[train]\nbatch_size = 16\nmax_epochs = 4\n'
            '[run]\nduration_s = 1800\nmax_rounds = 1\n')
        cmd = [sys.executable, "-m", "automlperf.cli", "run", "--config", str(config),
               "--run-dir", str(run_dir)]
    else:
        seconds = run_seconds(node, root)
        if seconds > MAX_RUN_S:
            return Check("official run", "fail", f"{root}: {RUN_EPOCHS} epochs would take "
                         f"{seconds / 60:.0f} min at {node.train_images_per_s or 0:.3g} img/s",
                         "leave out --data-dir (the doctor generates a folder sized for this "
                         "node) or give a subset of the dataset")
        cmd += ["--duration", f"{seconds:.0f}s"]
    env = {**os.environ, "NO_COLOR": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    (node.req.out / "run.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        last = next((line for line in reversed((done.stdout + done.stderr).splitlines())
                     if line.strip()), "no output")
        return Check("official run", "fail", f"`automlperf run` exited {done.returncode}: "
                     f"{last[:300]}", f"read {node.req.out / 'run.log'}")
    result = json.loads((run_dir / "result.json").read_text())
    verdict = check_run(run_dir)
    figures = {"run_dir": str(run_dir), "score_ops": result.get("score"),
               "fraction_of_ceiling": result.get("fraction_of_ceiling"),
               "epochs": result.get("epochs"), "trials": result.get("trials"),
               "check_ok": verdict.ok, "check_mismatches": verdict.mismatches}
    fraction = result.get("fraction_of_ceiling")
    summary = (f"{'quick run' if node.req.quick else 'official shape'}: "
               f"{result.get('epochs')} epoch(s), {(result.get('score') or 0) / 1e9:.3g} GOPS"
               + (f" = {fraction:.2g} of the ceiling" if fraction else "")
               + f"; check {'passed' if verdict.ok else 'FAILED'}")
    if not verdict.ok:
        return Check("official run", "fail", summary, "; ".join(verdict.mismatches)[:300], figures)
    if not result.get("epochs"):
        return Check("official run", "fail", summary, "no epoch completed: lengthen "
                     "--run-duration", figures)
    speed = judge_speed(result, node.train_images_per_s)
    figures["speed"] = speed
    if speed.get("ratio") is not None:
        summary += (f"; {speed['images_per_s']:.3g} img/s over the whole run = "
                    f"{speed['ratio']:.2f} of the training item's")
    if speed.get("limit"):
        return Check("official run", "warn", summary, speed["advice"], figures)
    return Check("official run", "pass", summary, figures=figures)


def judge_speed(result: dict[str, Any], item_rate: float | None) -> dict[str, Any]:
    """The whole run's training images per second of session time against the training
    item's rate; below SPEED_WARN of it, the side whose time cost the run most: start-up,
    data (waiting for batches), validation, the device (steps slower than the item's: the
    search's grown models) or between trials (candidates, saving, the deadline)."""
    total = (result.get("time_breakdown") or {}).get("total") or {}
    session = total.get("session_s") or 0.0
    images = result.get("train_images") or 0
    if not item_rate or not session:
        return {"ratio": None}
    rate = images / session
    steps = max(0.0, total.get("training_s", 0.0) - total.get("data_wait_s", 0.0))
    lost = {"start-up": total.get("start_to_first_epoch_s", 0.0),
            "data": total.get("data_wait_s", 0.0),
            "validation": total.get("validation_s", 0.0),
            "device": max(0.0, steps - images / item_rate),
            "between trials": sum(total.get(k, 0.0) for k in (
                "between_trials_s", "candidate_wait_s", "lost_at_deadline_s"))}
    out: dict[str, Any] = {"images_per_s": rate, "item_images_per_s": item_rate,
                           "ratio": rate / item_rate, "lost_s": lost, "limit": None}
    if rate >= SPEED_WARN * item_rate:
        return out
    side = max(lost, key=lambda k: lost[k])
    out["limit"] = side
    share = lost[side] / session
    what = {"start-up": "starting the replica and its first trial (a longer run spreads it)",
            "data": "waiting for data (see the input pipeline item)",
            "validation": "validation passes",
            "device": "steps slower than the training item's (grown architectures)",
            "between trials": "between trials (building, saving, waiting for candidates)"}[side]
    out["advice"] = (f"the whole run trains at {rate / item_rate:.2f} of the training item's "
                     f"rate; {side} limits: {share:.0%} of the session went to {what}")
    return out

