"""Build a torch module that executes an architecture graph exactly as counted."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from automlperf.graph.graph import INPUT, Graph


class GraphModule(nn.Module):
    """Runs the graph's layers in topological order.

    The module returns logits: the graph's final softmax is applied by the cross-entropy loss in
    training (and wherever probabilities are wanted), so it is computed once, not twice. Parameter
    names are ``<layer name>.<weight|bias|...>`` so that weights can be matched across graphs.
    """

    def __init__(self, graph: Graph) -> None:
        super().__init__()
        self.graph = graph
        self.layers = nn.ModuleDict()
        position = {INPUT: 0}
        steps: list[tuple[str, str, tuple[int, ...]]] = []
        for i, layer in enumerate(graph.layers, start=1):
            position[layer.name] = i
            module = _module_for(graph, layer.name)
            if module is not None:
                self.layers[layer.name] = module
            steps.append((layer.name, layer.kind, tuple(position[s] for s in layer.inputs)))
        if graph.output.kind == "softmax":
            steps.pop()
        # Free each activation after its last reader, to keep peak memory at what the graph needs.
        last_use: dict[int, int] = {}
        for step, (_, _, srcs) in enumerate(steps):
            for src in srcs:
                last_use[src] = step
        self._plan = [(name, kind, srcs, tuple(s for s in set(srcs) if last_use[s] == step))
                      for step, (name, kind, srcs) in enumerate(steps)]
        self._out = len(graph.layers) - 1 if graph.output.kind == "softmax" else len(graph.layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Slots are freed (set to None) after their last reader, so a read is always of a
        # live tensor: the plan guarantees what the type checker cannot see.
        values: list[Any] = [None] * (len(self.graph.layers) + 1)
        values[0] = x
        layers = self.layers
        for i, (name, kind, srcs, free) in enumerate(self._plan, start=1):
            if kind == "add":
                out = values[srcs[0]]
                for s in srcs[1:]:
                    out = out + values[s]
            elif kind == "relu":
                out = torch.relu(values[srcs[0]])
            elif kind == "global_avgpool":
                out = values[srcs[0]].mean(dim=(2, 3))
            else:
                out = layers[name](values[srcs[0]])
            values[i] = out
            for s in free:
                values[s] = None
        result: torch.Tensor = values[self._out]
        return result


def _module_for(graph: Graph, name: str) -> nn.Module | None:
    layer = graph[name]
    cin = graph.in_shape(layer)[0]
    if layer.kind == "conv2d":
        return nn.Conv2d(cin, layer.out_channels, layer.kernel, layer.stride, layer.padding,
                         bias=False)
    if layer.kind == "batchnorm":
        return nn.BatchNorm2d(cin)
    if layer.kind == "maxpool":
        return nn.MaxPool2d(layer.kernel, layer.stride, layer.padding)
    if layer.kind == "dense":
        return nn.Linear(cin, layer.out_channels)
    return None


def init_weights(module: nn.Module, method: str = "kaiming_normal",
                 generator: torch.Generator | None = None) -> None:
    """He initialisation for convolutions and the classifier; BN starts as identity."""
    for m in module.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            if method == "kaiming_normal":
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu",
                                        generator=generator)
            elif method == "kaiming_uniform":
                nn.init.kaiming_uniform_(m.weight, a=math.sqrt(5), generator=generator)
            else:
                raise ValueError(f"unknown initial_weights {method!r}")
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
            m.reset_running_stats()


def build_module(graph: Graph, init: str | None = "kaiming_normal",
                 seed: int | None = None) -> GraphModule:
    """A torch module for ``graph`` with freshly initialised weights; with ``init`` None, its
    memory as allocated, for a caller that loads every weight and buffer at once (a child's
    inherited state, by a strict ``load_state_dict``)."""
    # Made without memory and then initialised once: each layer's own initialisation, which
    # init_weights replaces, drew as many random numbers again, about half of building
    # ResNet-50 (bench/RESULTS.md, "layers initialised once").
    device = torch.get_default_device()  # the caller's (a `with torch.device(...)` block)
    with torch.device("meta"):
        module = GraphModule(graph)
    _allocate(module, device)
    if init is None:
        return module
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    init_weights(module, init, generator)
    return module


def _allocate(module: nn.Module, device: torch.device) -> None:
    """Give every parameter and buffer of a module made on the meta device its memory on
    ``device``, uninitialised. ``Module.to_empty`` does the same through ``torch.empty_like``,
    whose meta implementation imports torch's symbolic shapes and sympy, which every rank,
    memory probe and doctor's process then paid for once (bench/bench_rank_start.py), to keep
    a layout that is plain (contiguous) here anyway."""
    for owner in module.modules():
        for name, param in list(owner.named_parameters(recurse=False)):
            setattr(owner, name, nn.Parameter(
                torch.empty(param.shape, dtype=param.dtype, device=device),
                requires_grad=param.requires_grad))
        for name, buffer in list(owner.named_buffers(recurse=False)):
            # Assigning a registered buffer's name keeps it registered, persistent or not.
            setattr(owner, name, torch.empty(buffer.shape, dtype=buffer.dtype, device=device))
