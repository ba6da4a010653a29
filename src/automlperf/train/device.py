"""What a trial asks of the device it trains on: the precision it runs in, its default memory
layout, waiting for its queued work (so that a clock read after it includes that work), and
telling its out-of-memory errors from other failures."""

from __future__ import annotations

import torch

from automlperf import rules

ALLOWED_PRECISIONS = rules.CURRENT.allowed_precisions


def resolve_precision(requested: str, device: torch.device) -> str:
    """The precision a trial runs in: ``auto`` is bf16 on GPUs that have it, fp16 on other
    GPUs, fp32 on CPUs (where 16-bit autocast is far slower)."""
    if requested not in ("auto", *ALLOWED_PRECISIONS):
        raise ValueError(f"precision {requested!r} is not allowed: the minimum is 16-bit "
                         "floating point (bf16, fp16, tf32, fp32)")
    if requested != "auto":
        return requested
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "fp32"


def channels_last_default(device_type: str) -> bool:
    """Whether a trial trains channels-last unless configured: on NVIDIA and AMD GPUs (their
    convolution libraries' native layout) and on CPUs (oneDNN's: ResNet-50 at 224 trains
    about a fifth faster, the built-in task's small seed a quarter; bench/RESULTS.md)."""
    return device_type in ("cuda", "cpu")


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("out of memory" in text
                                              or "can't allocate memory" in text)


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so a clock read after it includes that work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type != "cpu":
        torch.accelerator.synchronize(device.index)
