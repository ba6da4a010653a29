"""Function-preserving network morphs on the architecture graph (pure; no torch).

* deepen: after a ReLU, insert conv k x k (C -> C, stride 1) -> BN -> ReLU. Initialised to the
  identity, so the child computes what the parent did.
* widen: multiply the filters of a convolution. Channels are tied through BN, ReLU, max-pool and
  add, so every convolution producing the same *channel group* widens with it, and every
  convolution or dense layer reading the group gets wider inputs (Net2WiderNet).
* skip: add a branch from a ReLU output to a later BN output: a 1x1 convolution, followed by a
  BN when stride or channels differ, initialised so that the branch contributes zero.

The weights that make each morph function-preserving are set by ``automlperf.train.inherit``;
this module only changes structure, and refuses targets that do not fit.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from automlperf.config import SearchConfig
from automlperf.graph.graph import INPUT, Graph, GraphError, Layer, conv, simple

_SEARCH = SearchConfig()  # the one source of the default limits

OPS = ("deepen", "widen", "skip")
WIDEN_FACTORS = (1.5, 2.0)
_CHANNEL_PRESERVING = ("batchnorm", "relu", "maxpool", "add", "global_avgpool")


class MorphError(ValueError):
    """A morph that cannot be applied to the chosen target."""


@dataclass(frozen=True)
class Limits:
    """Bounds on children; morphs that exceed them are refused."""

    max_layers: int = _SEARCH.max_layers
    max_params: int = _SEARCH.max_params


@dataclass(frozen=True)
class MorphRecord:
    op: str
    target: str
    detail: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "target": self.target, **self.detail}


class MorphResult(NamedTuple):
    graph: Graph
    record: MorphRecord


def param_count(graph: Graph) -> int:
    """Trainable parameters (convolution and dense weights, dense bias, BN scale and shift)."""
    total = 0
    for layer in graph.layers:
        if layer.kind == "conv2d":
            total += layer.kernel * layer.kernel * graph.in_shape(layer)[0] * layer.out_channels
        elif layer.kind == "dense":
            total += (graph.in_shape(layer)[0] + 1) * layer.out_channels
        elif layer.kind == "batchnorm":
            total += 2 * graph.shapes[layer.name][0]
    return total


def _insert_after(layers: list[Layer], anchor: str, block: list[Layer]) -> list[Layer]:
    """Insert ``block`` right after ``anchor``, keeping the list in topological order."""
    at = next(i for i, layer in enumerate(layers) if layer.name == anchor) + 1
    return layers[:at] + block + layers[at:]


def _fresh_prefix(graph: Graph) -> str:
    numbers = [int(m.group(1)) for layer in graph.layers
               if (m := re.match(r"m(\d+)_", layer.name))]
    return f"m{max(numbers, default=0) + 1}"


def _rebuild(graph: Graph, layers: list[Layer], limits: Limits, what: str) -> Graph:
    if len(layers) > limits.max_layers:
        raise MorphError(f"{what}: child would have {len(layers)} layers, over the limit of "
                         f"{limits.max_layers}")
    try:
        child = Graph.build(graph.input_shape, layers)
    except GraphError as exc:
        raise MorphError(f"{what}: {exc}") from None
    params = param_count(child)
    if params > limits.max_params:
        raise MorphError(f"{what}: child would have {params:,} parameters, over the limit of "
                         f"{limits.max_params:,}")
    return child


def _rewire(layers: list[Layer], old: str, new: str, skip: set[str]) -> list[Layer]:
    """Point every reader of ``old`` (except the layers in ``skip``) at ``new``."""
    out = []
    for layer in layers:
        if layer.name not in skip and old in layer.inputs:
            layer = layer.with_inputs(*(new if s == old else s for s in layer.inputs))
        out.append(layer)
    return out


# --- deepen ---------------------------------------------------------------------------------
def deepen_targets(graph: Graph) -> list[str]:
    return [layer.name for layer in graph.layers if layer.kind == "relu"]


def deepen(graph: Graph, target: str, kernel_size: int = 3, limits: Limits = Limits()) -> MorphResult:
    """Insert conv k x k -> BN -> ReLU after the ReLU ``target``."""
    if target not in graph or graph[target].kind != "relu":
        raise MorphError(f"deepen: {target!r} is not a ReLU of this graph")
    if kernel_size < 1 or kernel_size % 2 == 0:
        raise MorphError(f"deepen: kernel size must be odd, got {kernel_size}")
    channels, h, w = graph.shapes[target]
    p = _fresh_prefix(graph)
    block = [conv(f"{p}_conv", target, channels, kernel_size, 1),
             simple(f"{p}_bn", "batchnorm", f"{p}_conv"),
             simple(f"{p}_relu", "relu", f"{p}_bn")]
    layers = _insert_after(_rewire(list(graph.layers), target, f"{p}_relu", skip=set()),
                           target, block)
    child = _rebuild(graph, layers, limits, f"deepen after {target!r}")
    return MorphResult(child, MorphRecord("deepen", target, {"kernel": kernel_size,
                                                             "layers": [b.name for b in block]}))


# --- widen ----------------------------------------------------------------------------------
def channel_group(graph: Graph, conv_name: str) -> tuple[list[str], list[str]]:
    """Convolutions that produce the channel group of ``conv_name``'s output, and the
    convolution/dense layers that read it. Raises MorphError if the group reaches the image."""
    readers = graph.consumers()
    seen: set[str] = set()
    producers: list[str] = []
    consumers: list[str] = []
    stack = [conv_name]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        layer = graph[name]
        if layer.kind == "conv2d":
            producers.append(name)
        elif layer.kind in _CHANNEL_PRESERVING:
            for src in layer.inputs:
                if src == INPUT:
                    raise MorphError(f"widen: the channels of {conv_name!r} are tied to the "
                                     "input image")
                stack.append(src)
        for reader in readers[name]:
            if graph[reader].kind in ("conv2d", "dense"):
                if reader not in consumers:
                    consumers.append(reader)
            else:
                stack.append(reader)
    order = {layer.name: i for i, layer in enumerate(graph.layers)}
    return sorted(producers, key=order.__getitem__), sorted(consumers, key=order.__getitem__)


def widen_targets(graph: Graph) -> list[str]:
    return [layer.name for layer in graph.layers if layer.kind == "conv2d"]


def widen(graph: Graph, target: str, factor: float = 2.0, limits: Limits = Limits()) -> MorphResult:
    """Widen ``target`` (and every convolution tied to its channels) by ``factor``."""
    if target not in graph or graph[target].kind != "conv2d":
        raise MorphError(f"widen: {target!r} is not a convolution of this graph")
    if factor <= 1:
        raise MorphError(f"widen: factor must be > 1, got {factor}")
    producers, consumers = channel_group(graph, target)
    old = graph[target].out_channels
    new = max(old + 1, math.ceil(old * factor))
    wide = set(producers)
    layers = [Layer(x.name, x.kind, x.inputs, new, x.kernel, x.stride, x.padding)
              if x.name in wide else x for x in graph.layers]
    child = _rebuild(graph, layers, limits, f"widen {target!r}")
    return MorphResult(child, MorphRecord("widen", target, {"from": old, "to": new,
                                                            "convs": producers,
                                                            "readers": consumers}))


# --- skip -----------------------------------------------------------------------------------
def _descendants(graph: Graph, name: str) -> set[str]:
    readers = graph.consumers()
    seen: set[str] = set()
    stack = [name]
    while stack:
        for reader in readers[stack.pop()]:
            if reader not in seen:
                seen.add(reader)
                stack.append(reader)
    return seen


def _skip_stride(src: tuple[int, ...], dst: tuple[int, ...]) -> int | None:
    if dst[1] > src[1] or dst[2] > src[2]:
        return None
    stride = math.ceil(src[1] / dst[1])
    ok = (src[1] - 1) // stride + 1 == dst[1] and (src[2] - 1) // stride + 1 == dst[2]
    return stride if ok else None


def _joined(graph: Graph, source: str, target: str, readers: dict[str, list[str]]) -> bool:
    """Whether an add already sums ``target`` with a 1x1 branch (conv, optional BN) or an
    identity read of ``source``: a second such skip would duplicate it."""
    for add in readers[target]:
        if graph[add].kind != "add":
            continue
        for other in graph[add].inputs:
            node = other
            if node != source and graph[node].kind == "batchnorm":
                node = graph[node].inputs[0]
            if node == source or (graph[node].kind == "conv2d" and graph[node].inputs[0] == source):
                if other != target:
                    return True
    return False


def _skip_ok(graph: Graph, source: str, target: str, readers: dict[str, list[str]]) -> bool:
    return (_skip_stride(graph.shapes[source], graph.shapes[target]) is not None
            and not _joined(graph, source, target, readers))


def skip_targets(graph: Graph) -> list[tuple[str, str]]:
    """Every (ReLU, later BN) pair a skip could join."""
    readers = graph.consumers()
    pairs = []
    for relu in (x.name for x in graph.layers if x.kind == "relu"):
        after = _descendants(graph, relu)
        pairs += [(relu, x.name) for x in graph.layers if x.kind == "batchnorm"
                  and x.name in after and _skip_ok(graph, relu, x.name, readers)]
    return pairs


def _random_skip_target(graph: Graph, rng: random.Random) -> tuple[str, str]:
    readers = graph.consumers()
    relus = [x.name for x in graph.layers if x.kind == "relu"]
    rng.shuffle(relus)
    for relu in relus[:8]:
        after = _descendants(graph, relu)
        bns = [x.name for x in graph.layers if x.kind == "batchnorm" and x.name in after]
        rng.shuffle(bns)
        for bn in bns[:8]:
            if _skip_ok(graph, relu, bn, readers):
                return relu, bn
    raise MorphError("skip: found no ReLU/BN pair that can take another skip")


def skip(graph: Graph, source: str, target: str, limits: Limits = Limits()) -> MorphResult:
    """Add ``source`` (a ReLU) to the output of the later BN ``target`` through a
    zero-initialised 1x1 branch."""
    if source not in graph or graph[source].kind != "relu":
        raise MorphError(f"skip: source {source!r} is not a ReLU of this graph")
    if target not in graph or graph[target].kind != "batchnorm":
        raise MorphError(f"skip: target {target!r} is not a batchnorm of this graph")
    if target not in _descendants(graph, source):
        raise MorphError(f"skip: {target!r} does not come after {source!r}")
    if _joined(graph, source, target, graph.consumers()):
        raise MorphError(f"skip: {source!r} -> {target!r} exists already")
    src_shape, dst_shape = graph.shapes[source], graph.shapes[target]
    stride = _skip_stride(src_shape, dst_shape)
    if stride is None:
        raise MorphError(f"skip: {source!r} {src_shape} cannot reach {target!r} {dst_shape} "
                         "with a strided 1x1 convolution")
    p = _fresh_prefix(graph)
    block = [conv(f"{p}_conv", source, dst_shape[0], 1, stride, padding=0)]
    projected = stride != 1 or src_shape[0] != dst_shape[0]
    if projected:
        block.append(simple(f"{p}_bn", "batchnorm", f"{p}_conv"))
    block.append(simple(f"{p}_add", "add", target, block[-1].name))
    layers = _insert_after(_rewire(list(graph.layers), target, f"{p}_add", skip={f"{p}_add"}),
                           target, block)
    child = _rebuild(graph, layers, limits, f"skip {source!r} -> {target!r}")
    return MorphResult(child, MorphRecord("skip", target, {"source": source, "stride": stride,
                                                           "projection": projected,
                                                           "layers": [b.name for b in block]}))


# --- random choice --------------------------------------------------------------------------
def morph(graph: Graph, op: str = "random", rng: random.Random | int | None = None,
          kernel_size: int = 3, limits: Limits = Limits(), attempts: int = 20) -> MorphResult:
    """Apply one morph (``deepen``, ``widen``, ``skip`` or ``random``) at a target drawn with
    ``rng``; returns the child graph and a record of what changed."""
    if not isinstance(rng, random.Random):
        rng = random.Random(rng)
    if op not in (*OPS, "random"):
        raise MorphError(f"unknown morph {op!r}; choose one of {', '.join(OPS)} or random")
    last: MorphError | None = None
    for _ in range(attempts):
        chosen = rng.choice(OPS) if op == "random" else op
        try:
            if chosen == "deepen":
                return deepen(graph, rng.choice(deepen_targets(graph)), kernel_size, limits)
            if chosen == "widen":
                targets = widen_targets(graph)
                if not targets:
                    raise MorphError("widen: no convolution can be widened")
                return widen(graph, rng.choice(targets), rng.choice(WIDEN_FACTORS), limits)
            return skip(graph, *_random_skip_target(graph, rng), limits=limits)
        except MorphError as exc:
            last = exc
    assert last is not None
    raise last
