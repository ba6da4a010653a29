"""Weight inheritance: initial weights of a morphed child that compute the parent's function.

Works from the two graphs alone, for a child any number of morphs away:

* A layer the parent has keeps its weights. Where its channels grew, channel ``j`` of the child
  is a copy of parent channel ``j % C`` (Net2WiderNet replication), and every reader of a grown
  tensor splits its incoming weights among the copies with random shares that sum to one, so
  the sum is unchanged while the copies learn apart.
* A new convolution followed by a new BN and a ReLU is a deepen block: it starts as the
  identity (centre tap 1) and its BN passes values through.
* Any other new convolution is a skip branch: zero weights, or a zero-scale BN after it.
"""

from __future__ import annotations

import torch
from torch import nn

from automlperf.graph.graph import INPUT, Graph

BN_EPS = 1e-5  # torch.nn.BatchNorm2d's default, which the builder uses


class InheritError(ValueError):
    """The child is not reachable from the parent by morphs."""


def _base_channels(parent: Graph, child: Graph) -> dict[str, int]:
    """For every child tensor: the channel count it had in the parent (new tensors: the count
    of the tensor they were grown from), which defines the ``j % C`` replication."""
    base: dict[str, int] = {INPUT: child.input_shape[0]}
    for layer in child.layers:
        if layer.name in parent:
            base[layer.name] = parent.shapes[layer.name][0]
        elif layer.kind in ("batchnorm", "relu", "add", "maxpool"):
            base[layer.name] = base[layer.inputs[0]]
        elif layer.kind == "conv2d":
            base[layer.name] = base[layer.inputs[0]]  # a deepen block keeps its input's width
        else:
            raise InheritError(f"layer {layer.name!r} ({layer.kind}) is new in the child; "
                               "morphs only add convolutions, BN, ReLU and add layers")
    return base


def _shares(n: int, base: int, generator: torch.Generator) -> torch.Tensor:
    """Per-channel factors for ``n`` input channels replicated from ``base``: the factors of
    each original channel's copies are positive and sum to 1."""
    groups = torch.arange(n) % base
    raw = 1.0 + 0.2 * (torch.rand(n, generator=generator, dtype=torch.float64) - 0.5)
    sums = torch.zeros(base, dtype=torch.float64).index_add_(0, groups, raw)
    return raw / sums[groups]


def _expand(t: torch.Tensor, dim: int, n: int) -> torch.Tensor:
    """Replicate ``t`` along ``dim`` to ``n`` entries, entry ``j`` copying ``j % size``."""
    size = t.shape[dim]
    if n == size:
        return t.clone()
    if n < size:
        raise InheritError(f"a tensor shrank from {size} to {n} channels; morphs only grow")
    return t.index_select(dim, torch.arange(n, device=t.device) % size)


def _is_branch(child: Graph, name: str, readers: dict[str, list[str]]) -> bool:
    """Whether ``name`` is a skip branch: skip() appends the branch as an add's last input,
    after the tensor it joins. A later skip onto the branch puts an add in between, with the
    branch as that add's first input, so follow such adds."""
    while True:
        after = readers[name]
        if any(child[r].kind == "add" and name in child[r].inputs[1:] for r in after):
            return True
        if len(after) == 1 and child[after[0]].kind == "add" and child[after[0]].inputs[0] == name:
            name = after[0]
            continue
        return False


def new_blocks(parent_graph: Graph, child_graph: Graph) -> dict[str, str]:
    """Each convolution the child adds, and its BN if any, by role: ``deepen`` (starts as the
    identity), ``branch`` (a skip branch, starts silent)."""
    readers = child_graph.consumers()
    roles: dict[str, str] = {}
    for layer in child_graph.layers:
        if layer.kind != "conv2d" or layer.name in parent_graph:
            continue
        after = readers[layer.name]
        bn = after[0] if len(after) == 1 and child_graph[after[0]].kind == "batchnorm" else None
        if bn is not None and not _is_branch(child_graph, bn, readers):
            if layer.stride != 1:
                raise InheritError(f"new convolution {layer.name!r} has stride {layer.stride}; "
                                   "a deepen block has stride 1")
            roles[layer.name] = roles[bn] = "deepen"
        elif bn is not None or _is_branch(child_graph, layer.name, readers):
            roles[layer.name] = "branch"
            if bn is not None:
                roles[bn] = "branch"
        else:
            raise InheritError(f"new convolution {layer.name!r} is neither a deepen block nor "
                               "a skip branch")
    return roles


def inherit(parent_graph: Graph, parent_state_dict: dict[str, torch.Tensor], child_graph: Graph,
            seed: int = 0) -> dict[str, torch.Tensor]:
    """A state dict for ``child_graph`` (as built by ``build_module``) whose module computes the
    same function as the parent's in eval mode."""
    gen = torch.Generator().manual_seed(seed)
    state = {k.removeprefix("layers."): v.detach().cpu() for k, v in parent_state_dict.items()}
    base = _base_channels(parent_graph, child_graph)
    readers = child_graph.consumers()
    roles = new_blocks(parent_graph, child_graph)
    out: dict[str, torch.Tensor] = {}
    for layer in child_graph.layers:
        name = layer.name
        cin = child_graph.in_shape(layer)[0]
        cout = child_graph.shapes[name][0]
        in_base = base[layer.inputs[0]]
        if layer.kind == "conv2d":
            key = f"{name}.weight"
            if name in parent_graph:
                if parent_graph[name].kernel != layer.kernel:
                    raise InheritError(f"layer {name!r} changed kernel size; morphs never do")
                w = state[key].to(torch.float64)
                w = _expand(w, 0, cout)
                if cin != w.shape[1]:
                    w = _expand(w, 1, cin) * _shares(cin, w.shape[1], gen)[None, :, None, None]
            else:
                w = torch.zeros(cout, cin, layer.kernel, layer.kernel, dtype=torch.float64)
                after = readers[name]
                bn = after[0] if child_graph[after[0]].kind == "batchnorm" else None
                if roles[name] == "deepen":
                    # The identity (on replicated channels, with split shares).
                    c = layer.kernel // 2
                    same = (torch.arange(cout)[:, None] % in_base) == (torch.arange(cin) % in_base)
                    w[:, :, c, c] = same * _shares(cin, in_base, gen)
                elif bn is not None:
                    # A projected skip: a zero-scale BN silences it; random weights let it learn.
                    nn.init.kaiming_normal_(w, mode="fan_out", nonlinearity="relu", generator=gen)
            out[key] = w
        elif layer.kind == "batchnorm":
            keys = ("weight", "bias", "running_mean", "running_var")
            if name in parent_graph:
                for k in keys:
                    out[f"{name}.{k}"] = _expand(state[f"{name}.{k}"].to(torch.float64), 0, cout)
                out[f"{name}.num_batches_tracked"] = state[f"{name}.num_batches_tracked"].clone()
            else:
                role = roles.get(name)
                if role is None:
                    raise InheritError(f"new batchnorm {name!r} does not follow a new "
                                       "convolution; it is not a morph block")
                one = torch.ones(cout, dtype=torch.float64)
                out[f"{name}.weight"] = one.clone() if role == "deepen" else torch.zeros_like(one)
                out[f"{name}.bias"] = torch.zeros_like(one)
                out[f"{name}.running_mean"] = torch.zeros_like(one)
                # Eval-mode BN divides by sqrt(var + eps): this makes it exactly 1.
                out[f"{name}.running_var"] = one * (1.0 - BN_EPS) if role == "deepen" else one
                out[f"{name}.num_batches_tracked"] = torch.tensor(0, dtype=torch.long)
        elif layer.kind == "dense":
            if name not in parent_graph:
                raise InheritError(f"dense layer {name!r} is new in the child")
            w = state[f"{name}.weight"].to(torch.float64)
            if cin != w.shape[1]:
                w = _expand(w, 1, cin) * _shares(cin, w.shape[1], gen)[None, :]
            out[f"{name}.weight"] = w
            out[f"{name}.bias"] = state[f"{name}.bias"].to(torch.float64).clone()
    dtype = next((v.dtype for v in parent_state_dict.values() if v.is_floating_point()),
                 torch.float32)
    return {f"layers.{k}": (v.to(dtype) if v.is_floating_point() else v) for k, v in out.items()}
