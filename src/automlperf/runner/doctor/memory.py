"""Memory: the peak of a training step at the default batch per device and at the top of
TPE's batch range, each in a process of its own (on a CPU, extrapolated from two small
batches)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from automlperf.runner.doctor.common import Check, Node, Shape


def probe(shape: Shape, batch: int, device: str, node: Node) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "automlperf.train.memprobe", "--model", shape.model,
           "--image-size", str(shape.image_size), "--classes", str(shape.classes),
           "--batch", str(batch), "--device", device, "--precision", node.req.precision,
           "--threads", str(node.threads)] + (["--channels-last"] if node.channels_last else [])
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"the memory probe at batch {batch} failed: {tail[:300]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def memory(node: Node, shape: Shape) -> Check:
    import psutil

    from automlperf.config import load_config
    from automlperf.hardware import accelerator_memory_gib

    cfg = load_config(None, "imagenet" if shape.official else "synthetic", {})
    default = cfg.train.per_device_batch(accelerator_memory_gib())
    top = int(default * cfg.search.batch_size_factors[1])
    gib = 2**30
    if node.accelerated:
        device = node.devices[0]
        at = {b: probe(shape, b, device, node) for b in (default, top)}
        total = (accelerator_memory_gib() or 0) * gib
        figures = {"device": device, "default_batch": default, "top_batch": top,
                   "total_bytes": total, "measured": at}
        words = ", ".join(f"batch {b}: " + ("out of memory" if r["oom"] else
                                           f"{r['peak_bytes'] / gib:.1f} GiB")
                          for b, r in at.items())
        summary = f"{device}, {words} of {total / gib:.0f} GiB"
        if at[default]["oom"]:
            return Check("memory", "fail", summary, f"the default batch does not fit: set "
                         f"train.batch_size below {default}", figures)
        if at[top]["oom"]:
            return Check("memory", "warn", summary, "TPE's largest batches will run out of "
                         "memory and be retried smaller (time lost): lower "
                         "search.batch_size_factors' top", figures)
        return Check("memory", "pass", summary, figures=figures)
    # On a CPU the default batch of ResNet-50 at 224 holds gigabytes for minutes: two small
    # batches in fresh processes give the per-image cost and the fixed part.
    small = (4, 8)
    at = {b: probe(shape, b, "cpu", node) for b in small}
    per_image = max(0.0, (at[small[1]]["peak_bytes"] - at[small[0]]["peak_bytes"]) / (small[1] - small[0]))
    fixed = at[small[0]]["peak_bytes"] - per_image * small[0]
    need = {b: fixed + per_image * b for b in (default, top)}
    ranks = len(node.devices)
    available = psutil.virtual_memory().available / ranks
    figures = {"device": "cpu", "default_batch": default, "top_batch": top,
               "measured": at, "per_image_bytes": per_image, "estimated_bytes": need,
               "available_bytes_per_rank": available}
    summary = (f"estimated from batches {small[0]} and {small[1]}: batch {default} "
               f"{need[default] / gib:.1f} GiB, batch {top} {need[top] / gib:.1f} GiB, "
               f"{available / gib:.1f} GiB available per rank")
    if need[default] > available:
        return Check("memory", "fail", summary, f"the default batch does not fit: set "
                     f"train.batch_size to about {int(available / max(per_image, 1))}", figures)
    if need[top] > available:
        return Check("memory", "warn", summary, "TPE's largest batches will run out of "
                     "memory and be retried smaller (time lost)", figures)
    return Check("memory", "pass", summary, figures=figures)
