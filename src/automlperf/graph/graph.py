"""Framework-neutral architecture graph: layers, shape inference, JSON form, content hash.

A graph is an immutable DAG. Every layer names its inputs; the image enters through the
reserved name ``input``. Shapes are ``(C, H, W)`` for feature maps and ``(C,)`` after pooling.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import os
import re
from dataclasses import dataclass, field, replace
from typing import Any, Iterable

from automlperf.errors import UserError

SCHEMA_VERSION = 1
INPUT = "input"

Shape = tuple[int, ...]

# Layer kind -> parameters it must carry (besides name/kind/inputs).
KINDS: dict[str, tuple[str, ...]] = {
    "conv2d": ("out_channels", "kernel", "stride", "padding"),
    "batchnorm": (),
    "relu": (),
    "add": (),
    "maxpool": ("kernel", "stride", "padding"),
    "global_avgpool": (),
    "dense": ("out_channels",),
    "softmax": (),
}
_PARAMS = ("out_channels", "kernel", "stride", "padding")
# The fields a layer of each kind may have in JSON.
_FIELDS = {kind: frozenset({"name", "kind", "inputs", "in_channels", *params})
           for kind, params in KINDS.items()}
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")


class GraphError(UserError, ValueError):
    """An invalid graph; the message names the offending layer."""


@dataclass(frozen=True, slots=True)
class Layer:
    name: str
    kind: str
    inputs: tuple[str, ...]
    out_channels: int = 0
    kernel: int = 0
    stride: int = 1
    padding: int = 0

    def params(self) -> dict[str, int]:
        return {p: getattr(self, p) for p in KINDS[self.kind]}

    def with_inputs(self, *inputs: str) -> Layer:
        return replace(self, inputs=tuple(inputs))


def conv(name: str, src: str, out_channels: int, kernel: int, stride: int = 1,
         padding: int | None = None) -> Layer:
    """A bias-free convolution; padding defaults to "same" for odd kernels."""
    pad = kernel // 2 if padding is None else padding
    return Layer(name, "conv2d", (src,), out_channels=out_channels, kernel=kernel,
                 stride=stride, padding=pad)


def simple(name: str, kind: str, *inputs: str) -> Layer:
    return Layer(name, kind, tuple(inputs))


def maxpool(name: str, src: str, kernel: int, stride: int, padding: int) -> Layer:
    return Layer(name, "maxpool", (src,), kernel=kernel, stride=stride, padding=padding)


def dense(name: str, src: str, out_channels: int) -> Layer:
    return Layer(name, "dense", (src,), out_channels=out_channels)


@dataclass(frozen=True)
class Graph:
    """An architecture: input shape plus layers in topological order.

    Construct with :meth:`build` (which sorts, validates and infers shapes) or
    :meth:`from_json`; the plain constructor trusts its arguments.
    """

    input_shape: Shape
    layers: tuple[Layer, ...]
    shapes: dict[str, Shape] = field(compare=False, repr=False)
    _index: dict[str, Layer] = field(compare=False, repr=False)

    # --- construction -------------------------------------------------------------------
    @classmethod
    def build(cls, input_shape: Iterable[int], layers: Iterable[Layer]) -> Graph:
        shape = tuple(int(v) for v in input_shape)
        if len(shape) != 3 or min(shape) < 1:
            raise GraphError(f"input shape must be (channels, height, width) > 0, got {shape}")
        ordered = _toposort(list(layers))
        shapes = _infer_shapes(shape, ordered)
        _check_single_output(ordered)
        return cls(shape, tuple(ordered), shapes, {layer.name: layer for layer in ordered})

    def __getitem__(self, name: str) -> Layer:
        return self._index[name]

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def __len__(self) -> int:
        return len(self.layers)

    @property
    def output(self) -> Layer:
        return self.layers[-1]

    @property
    def num_classes(self) -> int:
        return self.shapes[self.output.name][0]

    def in_shape(self, layer: Layer) -> Shape:
        """Shape of a layer's (first) input."""
        src = layer.inputs[0]
        return self.input_shape if src == INPUT else self.shapes[src]

    def consumers(self) -> dict[str, list[str]]:
        """Map from a layer (or ``input``) to the layers that read it, in graph order."""
        out: dict[str, list[str]] = {INPUT: []}
        for layer in self.layers:
            out.setdefault(layer.name, [])
            for src in layer.inputs:
                out[src].append(layer.name)
        return out

    def count(self, kind: str) -> int:
        return sum(1 for layer in self.layers if layer.kind == kind)

    # --- serialisation ------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        layers = []
        for layer in self.layers:
            item: dict[str, Any] = {"name": layer.name, "kind": layer.kind,
                                    "inputs": list(layer.inputs)}
            item.update(layer.params())
            if layer.kind in ("conv2d", "dense"):
                # Derivable, but written so a reader can see (and we can verify) the wiring.
                item["in_channels"] = self.in_shape(layer)[0]
            layers.append(item)
        return {"schema_version": SCHEMA_VERSION, "input_shape": list(self.input_shape),
                "layers": layers}

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: Any) -> Graph:
        if not isinstance(data, dict):
            raise GraphError("graph JSON must be an object with 'schema_version', "
                             "'input_shape' and 'layers'")
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise GraphError(f"graph schema_version {version!r} is not supported "
                             f"(this version reads {SCHEMA_VERSION})")
        raw_layers = data.get("layers")
        shape = data.get("input_shape")
        if not isinstance(raw_layers, list) or not isinstance(shape, list):
            raise GraphError("graph JSON needs a list 'input_shape' and a list 'layers'")
        layers = [_layer_from_dict(i, item) for i, item in enumerate(raw_layers)]
        graph = cls.build(shape, layers)
        for item in raw_layers:
            declared = item.get("in_channels")
            if declared is not None:
                actual = graph.in_shape(graph[item["name"]])[0]
                if declared != actual:
                    raise GraphError(f"layer {item['name']!r}: in_channels is {declared} but "
                                     f"its input has {actual} channels")
        return graph

    @classmethod
    def from_json(cls, text: str | bytes) -> Graph:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise GraphError(f"graph file is not valid JSON: {exc}") from None
        return cls.from_dict(data)

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> Graph:
        """A graph JSON file; every problem is a :class:`GraphError` naming the file."""
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as exc:
            raise GraphError(f"cannot read graph file {path}: {exc.strerror}") from None
        try:
            return cls.from_json(text)
        except GraphError as exc:
            raise GraphError(f"{path}: {exc}") from None

    # --- identity -----------------------------------------------------------------------
    def content_hash(self) -> str:
        """Stable hash of the structure: independent of layer names and listing order."""
        cached = self.__dict__.get("_hash")
        if cached is None:
            digests: dict[str, str] = {INPUT: "input:" + ",".join(map(str, self.input_shape))}
            for layer in self.layers:
                parts = [digests[src] for src in layer.inputs]
                if layer.kind == "add":
                    parts.sort()  # addition commutes
                params = ",".join([f"{k}={getattr(layer, k)}" for k in KINDS[layer.kind]])
                token = f"{layer.kind}({params})[{'|'.join(parts)}]"
                digests[layer.name] = hashlib.sha256(token.encode()).hexdigest()
            cached = digests[self.output.name][:32]
            object.__setattr__(self, "_hash", cached)  # frozen dataclass: cache explicitly
        return cached


def _layer_from_dict(i: int, item: Any) -> Layer:
    if not isinstance(item, dict):
        raise GraphError(f"layers[{i}] must be an object")
    name = item.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise GraphError(f"layers[{i}]: name {name!r} must be a letter followed by letters, "
                         "digits or '_'")
    kind = item.get("kind")
    if kind not in KINDS:
        raise GraphError(f"layer {name!r}: unknown kind {kind!r} (known: {', '.join(KINDS)})")
    inputs = item.get("inputs")
    if not isinstance(inputs, list) or not inputs or not all(isinstance(s, str) for s in inputs):
        raise GraphError(f"layer {name!r}: 'inputs' must be a non-empty list of layer names")
    values: dict[str, int] = {}
    for param in KINDS[kind]:
        value = item.get(param)
        if isinstance(value, bool) or not isinstance(value, int):
            raise GraphError(f"layer {name!r}: {kind} needs an integer {param!r}, got {value!r}")
        values[param] = value
    if not item.keys() <= _FIELDS[kind]:
        extra = set(item) - _FIELDS[kind]
        raise GraphError(f"layer {name!r}: unknown field(s) {', '.join(sorted(extra))}")
    return Layer(name, kind, tuple(inputs), **values)


def _toposort(layers: list[Layer]) -> list[Layer]:
    by_name: dict[str, Layer] = {}
    for layer in layers:
        if layer.name == INPUT or not _NAME.match(layer.name):
            raise GraphError(f"layer {layer.name!r}: invalid or reserved name")
        if layer.name in by_name:
            raise GraphError(f"layer {layer.name!r}: name used twice")
        by_name[layer.name] = layer
    for layer in layers:
        for src in layer.inputs:
            if src != INPUT and src not in by_name:
                raise GraphError(f"layer {layer.name!r}: input {src!r} does not exist")
    seen = {INPUT}
    for layer in layers:
        if not all(src in seen for src in layer.inputs):
            break
        seen.add(layer.name)
    else:
        return layers  # already in topological order (the common case: our own output)
    # Kahn's algorithm, stable with respect to the listed order.
    pending = {layer.name: sum(1 for s in layer.inputs if s != INPUT) for layer in layers}
    readers: dict[str, list[str]] = {}
    for layer in layers:
        for src in layer.inputs:
            readers.setdefault(src, []).append(layer.name)
    ready = [layer.name for layer in layers if pending[layer.name] == 0]
    order: list[Layer] = []
    position = {layer.name: i for i, layer in enumerate(layers)}
    heap = [(position[n], n) for n in ready]
    heapq.heapify(heap)
    while heap:
        _, name = heapq.heappop(heap)
        order.append(by_name[name])
        for reader in readers.get(name, ()):
            pending[reader] -= 1
            if pending[reader] == 0:
                heapq.heappush(heap, (position[reader], reader))
    if len(order) != len(layers):
        stuck = next(layer.name for layer in layers if pending[layer.name] > 0)
        raise GraphError(f"layer {stuck!r}: part of a cycle")
    return order


def _infer_shapes(input_shape: Shape, layers: list[Layer]) -> dict[str, Shape]:
    shapes: dict[str, Shape] = {INPUT: input_shape}
    for layer in layers:
        ins = [shapes[s] for s in layer.inputs]
        shapes[layer.name] = _layer_shape(layer, ins)
    del shapes[INPUT]
    return shapes


def _spatial(layer: Layer, shape: Shape) -> tuple[int, int]:
    if len(shape) != 3:
        raise GraphError(f"layer {layer.name!r}: {layer.kind} needs a (C, H, W) input, "
                         f"got {shape}")
    if layer.kernel < 1 or layer.stride < 1 or layer.padding < 0:
        raise GraphError(f"layer {layer.name!r}: kernel and stride must be >= 1 and "
                         "padding >= 0")
    if layer.padding * 2 > layer.kernel:
        raise GraphError(f"layer {layer.name!r}: padding {layer.padding} is larger than "
                         f"half the kernel {layer.kernel}")
    h = (shape[1] + 2 * layer.padding - layer.kernel) // layer.stride + 1
    w = (shape[2] + 2 * layer.padding - layer.kernel) // layer.stride + 1
    if h < 1 or w < 1:
        raise GraphError(f"layer {layer.name!r}: input {shape[1]}x{shape[2]} is too small for "
                         f"kernel {layer.kernel}, stride {layer.stride}")
    return h, w


def _layer_shape(layer: Layer, ins: list[Shape]) -> Shape:
    kind = layer.kind
    if kind != "add" and len(ins) != 1:
        raise GraphError(f"layer {layer.name!r}: {kind} takes exactly one input, got {len(ins)}")
    first = ins[0]
    if kind == "conv2d":
        if layer.out_channels < 1:
            raise GraphError(f"layer {layer.name!r}: out_channels must be >= 1")
        return (layer.out_channels, *_spatial(layer, first))
    if kind == "maxpool":
        return (first[0], *_spatial(layer, first))
    if kind in ("batchnorm", "relu"):
        if len(first) != 3:
            raise GraphError(f"layer {layer.name!r}: {kind} needs a (C, H, W) input, got {first}")
        return first
    if kind == "add":
        if len(ins) < 2:
            raise GraphError(f"layer {layer.name!r}: add needs at least two inputs")
        for other, src in zip(ins[1:], layer.inputs[1:]):
            if other != first:
                raise GraphError(f"layer {layer.name!r}: shape mismatch, {layer.inputs[0]!r} "
                                 f"is {first} but {src!r} is {other}")
        return first
    if kind == "global_avgpool":
        if len(first) != 3:
            raise GraphError(f"layer {layer.name!r}: global_avgpool needs a (C, H, W) input")
        return (first[0],)
    if kind == "dense":
        if len(first) != 1:
            raise GraphError(f"layer {layer.name!r}: dense needs a flat (C,) input, got {first}; "
                             "put a global_avgpool before it")
        if layer.out_channels < 1:
            raise GraphError(f"layer {layer.name!r}: out_channels must be >= 1")
        return (layer.out_channels,)
    if kind == "softmax":
        if len(first) != 1:
            raise GraphError(f"layer {layer.name!r}: softmax needs a flat (C,) input, got {first}")
        return first
    raise GraphError(f"layer {layer.name!r}: unknown kind {kind!r}")


def _check_single_output(layers: list[Layer]) -> None:
    if not layers:
        raise GraphError("graph has no layers")
    used = {src for layer in layers for src in layer.inputs}
    if INPUT not in used:
        raise GraphError("no layer reads 'input'")
    outputs = [layer for layer in layers if layer.name not in used]
    if len(outputs) != 1:
        heads = [layer for layer in outputs if layer.kind in ("softmax", "dense")]
        dangling = [layer.name for layer in outputs if len(heads) != 1 or layer is not heads[0]]
        raise GraphError(f"layer {dangling[0]!r}: its output is never used "
                         f"(graph outputs: {', '.join(o.name for o in outputs)}; exactly one is allowed)")
