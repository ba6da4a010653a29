"""The input pipeline as a run's rank has it: its own loader (transform, decoding workers,
threads, per-rank batch, device) in a process set up as a rank, alone and feeding training
steps (``train/loadprobe.py``). Alone against what training consumes gives the headroom;
beside training, the data share the run will see."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from automlperf.runner.doctor.common import Check, Node, Shape
from automlperf.runner.doctor.official import dataset_dir

# The loader alone over what training consumes: below 1 the devices starve; below this they
# would starve on a node a little busier than now.
HEADROOM_FAIL, HEADROOM_WARN = 1.0, 1.2
# A predicted data share above which the run's training waits too long for its data.
DATA_SHARE_WARN = 0.10


def run_probe(request: Any, timeout: float = 900) -> dict[str, Any]:
    """The rank-like process's measurement (``train.loadprobe``)."""
    cmd = [sys.executable, "-m", "automlperf.train.loadprobe", json.dumps(asdict(request))]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or ["no output"]
        # A DataError's own line says what to repair; keep it whole.
        last = next((line for line in reversed(lines) if "DataError" in line), lines[-1])
        raise RuntimeError(f"the loader probe failed: {last[:400]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def probe_request(node: Node, shape: Shape, root: Path) -> Any:
    """What a run's rank on this node loads, and the seed it trains."""
    from automlperf.config import load_config
    from automlperf.hardware import accelerator_memory_gib
    from automlperf.train.loadprobe import ProbeRequest
    from automlperf.train.spec import DataArgs

    cfg = load_config(None, "imagenet", {"data": {"data_dir": str(root),
                                                  "image_size": shape.image_size}})
    data = DataArgs.from_config(cfg.data, node.threads)
    per_rank = 16 if node.req.quick else cfg.train.per_device_batch(accelerator_memory_gib())
    quick = node.req.quick
    expected = node.train_images_per_s / len(node.devices) if node.train_images_per_s else None
    return ProbeRequest(data=data.__dict__, device=node.devices[0], threads=node.threads,
                        world=len(node.devices), per_rank=per_rank, model=shape.model,
                        precision=node.req.precision, channels_last=node.channels_last,
                        alone_s=2.0 if quick else 8.0, beside_s=2.0 if quick else 15.0,
                        expected_images_per_s=expected)


def verdict(alone: float, need: float | None, share: float,
            accelerated: bool = True) -> tuple[str, str]:
    """(status, advice) from the loader's rate alone against what training consumes (per
    rank) and the data share measured beside training."""
    more = ("give each device more cores (data.workers) or decode on the GPU "
            "(data.gpu_decode, the nvjpeg extra)" if accelerated else
            "decoding and training share this node's cores: more cores, or smaller files")
    if need and alone < HEADROOM_FAIL * need:
        return "fail", f"the loader alone cannot feed training (the data side limits): {more}"
    if need and alone < HEADROOM_WARN * need:
        return "warn", (f"less than {HEADROOM_WARN}x headroom: a busier node will starve the "
                        f"devices; {more}")
    if share > DATA_SHARE_WARN:
        return "warn", (f"training waits for data {share:.0%} of its time beside the loader "
                        f"(the data side limits): {more}")
    return "pass", ""


def pipeline(node: Node, shape: Shape) -> Check:
    from automlperf.train.data import shm_free

    from automlperf.train.data import prepare_index

    root = dataset_dir(node, shape)
    req = probe_request(node, shape, root)
    # Scanned here, once: a folder that cannot be used fails in its own words, and the
    # probe's rank maps the saved index as a run's ranks do.
    index = node.req.out / "index"
    prepare_index(str(root), str(index))
    req.data["index_dir"] = str(index)
    measured = run_probe(req)
    ranks = len(node.devices)
    alone = measured["alone"]["images_per_s"]
    beside = measured["beside"]
    need = node.train_images_per_s / ranks if node.train_images_per_s else None
    headroom = alone / need if need else None
    figures: dict[str, Any] = {"data_dir": str(root), **measured,
                               "needed_images_per_s_per_rank": need, "headroom": headroom,
                               "predicted_data_share": beside["data_share"],
                               "shm_free_bytes": shm_free()}
    summary = (f"rank loader ({measured['decode_path'] or 'cpu'}, {measured['workers']} "
               f"worker(s), {req.threads} threads, batch {req.per_rank}, {req.device}): alone "
               f"{alone:.1f} img/s" + (f", {headroom:.2f}x what training consumes "
                                        f"({need:.1f})" if need else "")
               + f"; beside training {beside['images_per_s']:.1f} img/s, data share "
               f"{beside['data_share']:.2f} (device {beside['device_share']:.2f}): the run's "
               "will be about that")
    status, advice = verdict(alone, need, beside["data_share"], node.accelerated)
    return Check("input pipeline", status, summary, advice, figures)
