"""The memory one training step takes: a seed model at a batch size, in a process of its own
(``python -m automlperf.train.memprobe``) so that the peak is this step's and nothing else's.
On a GPU it is the device allocator's peak; on a CPU the process's peak resident memory,
which includes the interpreter and libraries (a fit over two batch sizes removes them)."""

from __future__ import annotations

import argparse
import json
import resource
from typing import Any


def step_peak(model: str, image_size: int, classes: int, batch: int, device: str,
              precision: str, channels_last: bool) -> dict[str, Any]:
    """Peak bytes of two SGD steps of ``model`` at ``batch`` on ``device``; ``oom`` when the
    batch does not fit."""
    import torch

    from automlperf.graph import seeds
    from automlperf.train.builder import build_module
    from automlperf.train.rankenv import keep_host_memory
    from automlperf.train.device import is_oom, resolve_precision
    from automlperf.train.optim import sgd

    dev = torch.device(device)
    if dev.type == "cpu":
        keep_host_memory()  # as a CPU rank does: its peak is what it keeps
    resolved = resolve_precision(precision, dev)
    amp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(resolved)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    graph = seeds.seed(model, classes, image_size, 3)
    module = build_module(graph, seed=0).to(dev, memory_format=fmt)  # type: ignore[call-overload]
    opt = sgd(module.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, 3, image_size, image_size, device=dev).contiguous(memory_format=fmt)
    y = torch.randint(0, classes, (batch,), device=dev)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    try:
        for _ in range(2):  # the second step holds the optimiser's momentum too
            with torch.autocast(dev.type, dtype=amp) if amp else torch.autocast(dev.type, enabled=False):
                loss = torch.nn.functional.cross_entropy(module(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    except Exception as exc:  # noqa: BLE001 - an out-of-memory error is the answer
        if not is_oom(exc):
            raise
        return {"batch": batch, "device": device, "precision": resolved, "oom": True}
    if dev.type == "cuda":
        peak = torch.cuda.max_memory_allocated(dev)
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    return {"batch": batch, "device": device, "precision": resolved, "oom": False,
            "peak_bytes": int(peak)}


def main() -> None:
    parser = argparse.ArgumentParser(description="Peak memory of one training step.")
    parser.add_argument("--model", required=True)
    parser.add_argument("--image-size", type=int, required=True)
    parser.add_argument("--classes", type=int, required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    print(json.dumps(step_peak(args.model, args.image_size, args.classes, args.batch,
                               args.device, args.precision, args.channels_last)))


if __name__ == "__main__":
    main()
