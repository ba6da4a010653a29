"""Validation accuracy: the pass the trainer validates every epoch with, and the same pass
over a trial's saved weights, to re-measure the accuracy a run recorded."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from automlperf.graph.graph import Graph
from automlperf.train.builder import build_module
from automlperf.train.data import Dataset


class WeightsError(ValueError):
    """Saved weights that are not the weights of the architecture given; says what differs."""


def precision_context(precision: str, device: torch.device) -> Any:
    """Set the device up for ``precision`` and return the autocast context it runs in
    (a no-op context for fp32 and tf32)."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        torch.backends.cudnn.allow_tf32 = precision == "tf32"
        torch.backends.cudnn.benchmark = True
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    return torch.autocast(device.type, dtype=amp_dtype) if amp_dtype else contextlib.nullcontext()


@torch.inference_mode()  # not no_grad: no autograd bookkeeping at all (versions, views)
def evaluate(module: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
             autocast: Any, memory_format: torch.memory_format,
             loss_fn: nn.Module | None = None) -> tuple[int, int, float]:
    """(correctly classified, images, summed loss) of ``batches``, the module in evaluation
    mode; the loss is 0 without a ``loss_fn`` (a mean over its batch, weighted back here)."""
    module.eval()
    correct: torch.Tensor | None = None
    loss_sum: torch.Tensor | None = None
    seen = 0
    for x, y in batches:
        with autocast:
            logits = module(x.contiguous(memory_format=memory_format))
        hits = (logits.argmax(1) == y).sum()
        correct = hits if correct is None else correct + hits
        if loss_fn is not None:
            # One host sync per validation, not per batch: summed on the device.
            loss = loss_fn(logits.float(), y).double() * len(y)
            loss_sum = loss if loss_sum is None else loss_sum + loss
        seen += len(y)
    return ((0 if correct is None else int(correct)), seen,
            0.0 if loss_sum is None else float(loss_sum))


def count_correct(module: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
                  autocast: Any, memory_format: torch.memory_format) -> tuple[int, int]:
    """(correctly classified, images) of ``batches``, the module in evaluation mode."""
    correct, seen, _ = evaluate(module, batches, autocast, memory_format)
    return correct, seen


def load_weights(graph: Graph, path: Path) -> nn.Module:
    """The module of ``graph`` holding the weights saved at ``path`` (safetensors); every
    tensor must be there, in the architecture's shape, and no other."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    module = build_module(graph, seed=0)
    try:
        state = load_file(str(path))
    except (SafetensorError, OSError) as exc:
        raise WeightsError(f"{path.name} is not a safetensors file ({exc})") from None
    expected = module.state_dict()
    missing = sorted(set(expected) - set(state))
    extra = sorted(set(state) - set(expected))
    shapes = sorted(k for k in set(expected) & set(state) if expected[k].shape != state[k].shape)
    if missing or extra or shapes:
        parts = [f"{what}: {', '.join(names[:3])}{' …' if len(names) > 3 else ''}"
                 for what, names in (("missing", missing), ("not in the architecture", extra),
                                     ("of another shape", shapes)) if names]
        raise WeightsError(f"{path.name} does not hold the weights of this architecture "
                           f"({'; '.join(parts)})")
    module.load_state_dict(state)
    return module


def remeasure(graph: Graph, weights: Path, data: Dataset, precision: str, world: int,
              per_rank: int, device: torch.device,
              channels_last: bool | None = None) -> tuple[int, int]:
    """(correct, images) of the saved weights on the validation set, in the precision the run
    trained in and over the images and batches its ranks validated: rank r of ``world`` took
    its shard in batches of ``per_rank``, so each rank's shard is passed here in turn."""
    module = load_weights(graph, weights)
    channels_last = device.type == "cuda" if channels_last is None else channels_last
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    module = module.to(device, memory_format=memory_format)  # type: ignore[call-overload]
    autocast = precision_context(precision, device)
    correct = seen = 0
    try:
        for rank in range(world):
            c, n = count_correct(module, data.batches("val", rank, world, per_rank, 0, 0, device),
                                 autocast, memory_format)
            correct, seen = correct + c, seen + n
    finally:
        data.release()
    return correct, seen
