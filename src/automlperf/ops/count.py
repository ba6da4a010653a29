"""Analytical operation count of a graph, per image, following the AIPerf paper (Tables 1-3).

Operation weights: multiply-accumulate 2, add/subtract/multiply/compare 1, divide/sqrt 4, exp 8.
Backward costs are split into the per-image gradient part and the per-optimiser-step parameter
update (one MAC per convolution or dense weight), so that a trainer can count exactly what it
ran: ``images * (forward + backward_grad) + steps * update_per_step``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from automlperf.graph.graph import INPUT, Graph, Layer, Shape

WEIGHTS = {"mac": 2, "add": 1, "mul": 1, "cmp": 1, "div": 4, "sqrt": 4, "exp": 8}
MAC, ADD, CMP, DIV, EXP = (WEIGHTS[k] for k in ("mac", "add", "cmp", "div", "exp"))

# The kinds in the order of the paper's Table 3.
KIND_ORDER = ("conv2d", "dense", "batchnorm", "relu", "maxpool", "global_avgpool", "add",
              "softmax")


@dataclass(frozen=True)
class KindCount:
    """Operations of one layer kind: per image (forward, backward gradient) and per step."""

    forward: int
    backward_grad: int
    update_per_step: int
    params: int
    layers: int

    def backward(self, batch_size: int) -> float:
        return self.backward_grad + self.update_per_step / batch_size


@dataclass(frozen=True)
class OpCount:
    """Operations per image of one architecture at one resolution."""

    forward: int
    backward_grad: int
    update_per_step: int
    params: int
    batch_size: int
    by_kind: dict[str, KindCount]
    params_by_layer: dict[str, int]

    @property
    def backward(self) -> float:
        """Backward operations per image, the update shared by ``batch_size`` images."""
        return self.backward_grad + self.update_per_step / self.batch_size

    @property
    def total(self) -> float:
        return self.forward + self.backward

    def to_dict(self) -> dict[str, Any]:
        by_kind = {}
        for kind, kc in self.by_kind.items():
            bp = _num(kc.backward(self.batch_size))
            by_kind[kind] = {"forward": kc.forward, "backward": bp,
                             "total": _num(kc.forward + bp), "params": kc.params,
                             "layers": kc.layers}
        return {"forward": self.forward, "backward": _num(self.backward),
                "total": _num(self.total), "params": self.params,
                "batch_size": self.batch_size, "update_per_step": self.update_per_step,
                "by_kind": by_kind}


def _num(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


def layer_ops(layer: Layer, in_shape: Shape, out_shape: Shape,
              reads_image: bool) -> tuple[int, int, int, int]:
    """(forward, backward gradient, update per step, parameters) of one layer, per image."""
    kind = layer.kind
    if kind == "conv2d":
        weights = layer.kernel * layer.kernel * in_shape[0] * layer.out_channels
        macs = weights * out_shape[1] * out_shape[2]
        # Only the weight gradient is needed for a convolution that reads the image itself.
        grad = macs if reads_image else 2 * macs
        return MAC * macs, MAC * grad, MAC * weights, weights
    if kind == "dense":
        ci, co = in_shape[0], layer.out_channels
        return MAC * ci * co, MAC * 2 * ci * co, MAC * (ci + 1) * co, (ci + 1) * co
    if kind == "batchnorm":
        n = in_shape[0] * in_shape[1] * in_shape[2]
        return (MAC + ADD + DIV) * n, 0, 0, 2 * in_shape[0]
    if kind == "relu":
        return CMP * _size(out_shape), 0, 0, 0
    if kind == "add":
        # One addition per element for every input after the first.
        return ADD * _size(out_shape) * (len(layer.inputs) - 1), 0, 0, 0
    if kind == "maxpool":
        return CMP * layer.kernel * layer.kernel * _size(out_shape), 0, 0, 0
    if kind == "global_avgpool":
        return ADD * _size(in_shape) + DIV * in_shape[0], 0, 0, 0
    if kind == "softmax":
        return (EXP + ADD + DIV) * out_shape[0], 0, 0, 0
    raise ValueError(f"layer {layer.name!r}: no operation count for kind {kind!r}")


def _size(shape: Shape) -> int:
    n = 1
    for v in shape:
        n *= v
    return n


def count(graph: Graph, batch_size: int = 1) -> OpCount:
    """Count operations per image; ``batch_size`` sets how many images share one update."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    totals: dict[str, list[int]] = {}
    per_layer: dict[str, int] = {}
    fp = bp = upd = params = 0
    for layer in graph.layers:
        f, b, u, p = layer_ops(layer, graph.in_shape(layer), graph.shapes[layer.name],
                               INPUT in layer.inputs)
        acc = totals.setdefault(layer.kind, [0, 0, 0, 0, 0])
        acc[0] += f
        acc[1] += b
        acc[2] += u
        acc[3] += p
        acc[4] += 1
        fp, bp, upd, params = fp + f, bp + b, upd + u, params + p
        if p:
            per_layer[layer.name] = p
    by_kind = {k: KindCount(*totals[k]) for k in KIND_ORDER if k in totals}
    return OpCount(fp, bp, upd, params, batch_size, by_kind, per_layer)


def epoch_ops(ops: OpCount, train_images: int, steps: int, val_images: int) -> int:
    """Exact operations of an epoch: training images (forward + backward), one update per
    optimiser step, and validation images (forward only)."""
    return (train_images * (ops.forward + ops.backward_grad) + steps * ops.update_per_step
            + val_images * ops.forward)


def layer_table(graph: Graph) -> str:
    """A readable table of a graph's layers with their output shapes and parameter counts."""
    ops = count(graph)
    per_layer = ops.params_by_layer
    rows = [f"{'layer':<24}{'kind':<15}{'config':<18}{'output':<16}{'params':>12}"]
    for layer in graph.layers:
        cfg = ""
        if layer.kind in ("conv2d", "maxpool"):
            cfg = f"{layer.kernel}x{layer.kernel}/{layer.stride}"
        elif layer.kind == "add":
            cfg = "+".join(layer.inputs)[:17]
        shape = "x".join(map(str, graph.shapes[layer.name]))
        rows.append(f"{layer.name:<24}{layer.kind:<15}{cfg:<18}{shape:<16}"
                    f"{per_layer.get(layer.name, 0):>12,}")
    rows.append(f"{len(graph.layers)} layers, {graph.count('conv2d')} convolutions, "
                f"{ops.params:,} parameters, {ops.forward / 1e9:.3f} G forward ops/image, "
                f"hash {graph.content_hash()}")
    return "\n".join(rows)
