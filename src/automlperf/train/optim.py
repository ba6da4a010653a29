"""The trials' optimizer: torch's SGD, built so that a process that trains eagerly never
imports ``torch._dynamo``.

``torch.optim`` imports ``torch._dynamo`` (with sympy and Inductor's configuration: 1.4-1.8
CPU-s, more than a short trial's training; bench/bench_rank_start.py) when an optimizer
first adds a parameter group, and again at every step, only to mark those methods as ones
Dynamo must not trace. The trials never trace the optimizer (only the model is compiled,
``train.compiling``), so the marks do nothing here; on a digits trial the import took 1.7 s
of the rank's 5.3 (py-spy), and every rank, memory probe and doctor's training process paid
it before its first step.

:func:`sgd` calls the same methods of ``torch.optim.SGD`` without those wrappers (the step
under ``torch.no_grad``, as the wrapper runs it for a non-differentiable optimizer), so the
arithmetic is torch's own, bit for bit. Where a torch version has not these wrappers, it is
torch's SGD unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch.optim import SGD, Optimizer


def _unwrapped(cls: type, name: str, wrapper: str) -> Any:
    """The function under ``cls.name``'s Dynamo wrapper (a function named ``wrapper``), or
    None where torch wraps it otherwise or not at all: then nothing is bypassed."""
    method = getattr(cls, name, None)
    code = getattr(method, "__code__", None)
    if code is None or code.co_name != wrapper:
        return None
    return getattr(method, "__wrapped__", None)


_STEP = _unwrapped(SGD, "step", "_use_grad")  # torch.optim.optimizer._use_grad_for_differentiable
_METHODS = {name: _unwrapped(Optimizer, name, "inner")  # torch._disable_dynamo
            for name in ("add_param_group", "zero_grad", "state_dict", "load_state_dict")}


class _UntracedSGD(SGD):
    """SGD whose step and bookkeeping skip the wrappers that import ``torch._dynamo``."""

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        _METHODS["add_param_group"](self, param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        _METHODS["zero_grad"](self, set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return _METHODS["state_dict"](self)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        _METHODS["load_state_dict"](self, state_dict)

    def step(self, closure: Any = None) -> Any:
        with torch.no_grad():
            return _STEP(self, closure)


UNTRACED = _STEP is not None and all(fn is not None for fn in _METHODS.values())


def sgd(params: Iterable[Any], **options: Any) -> SGD:
    """``torch.optim.SGD(params, **options)``, without importing ``torch._dynamo`` where this
    torch allows (``UNTRACED``)."""
    if UNTRACED and not options.get("differentiable", False):
        return _UntracedSGD(params, **options)
    return SGD(params, **options)


def trial_optimizer(module: torch.nn.Module, lr: float, weight_decay: float, momentum: float,
                    nesterov: bool) -> SGD:
    """A trial's SGD: weight decay on the weights, none on batch norm's and the biases."""
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for p in module.parameters():
        (decay if p.ndim > 1 else no_decay).append(p)
    return sgd([{"params": decay, "weight_decay": weight_decay},
                {"params": no_decay, "weight_decay": 0.0}],
               lr=lr, momentum=momentum, nesterov=nesterov)
