"""Seed architectures the search starts from.

``resnet50`` is the original ("v1") layout that the AIPerf paper counted: in each stage's first
block the stride sits on the first 1x1 convolution. ``resnet_small`` keeps the same bottleneck
block structure with fewer, narrower stages and a 3x3 stem, so it trains in seconds on a CPU.
"""

from __future__ import annotations

from collections.abc import Sequence

from automlperf.graph.graph import INPUT, Graph, Layer, conv, dense, maxpool, simple

SEEDS = ("resnet50", "resnet_small")


def _bottleneck(layers: list[Layer], src: str, prefix: str, width: int, stride: int,
                project: bool, expansion: int = 4) -> str:
    def cbr(tag: str, inp: str, out: int, k: int, s: int, relu: bool = True) -> str:
        layers.append(conv(f"{prefix}_conv{tag}", inp, out, k, s, padding=k // 2))
        layers.append(simple(f"{prefix}_bn{tag}", "batchnorm", f"{prefix}_conv{tag}"))
        if not relu:
            return f"{prefix}_bn{tag}"
        layers.append(simple(f"{prefix}_relu{tag}", "relu", f"{prefix}_bn{tag}"))
        return f"{prefix}_relu{tag}"

    main = cbr("1", src, width, 1, stride)
    main = cbr("2", main, width, 3, 1)
    main = cbr("3", main, width * expansion, 1, 1, relu=False)
    shortcut = src
    if project:
        shortcut = cbr("p", src, width * expansion, 1, stride, relu=False)
    layers.append(simple(f"{prefix}_add", "add", main, shortcut))
    layers.append(simple(f"{prefix}_out", "relu", f"{prefix}_add"))
    return f"{prefix}_out"


def _resnet(stem: list[Layer], src: str, blocks: Sequence[int], widths: Sequence[int],
            first_stride: int, num_classes: int, image_size: int, in_channels: int) -> Graph:
    layers = list(stem)
    expansion = 4
    channels = stem[0].out_channels
    for stage, (count, width) in enumerate(zip(blocks, widths), start=1):
        for block in range(1, count + 1):
            stride = (first_stride if stage == 1 else 2) if block == 1 else 1
            project = block == 1 and (stride != 1 or channels != width * expansion)
            src = _bottleneck(layers, src, f"s{stage}b{block}", width, stride, project)
            channels = width * expansion
    layers.append(simple("pool", "global_avgpool", src))
    layers.append(dense("fc", "pool", num_classes))
    layers.append(simple("softmax", "softmax", "fc"))
    return Graph.build((in_channels, image_size, image_size), layers)


def resnet50(num_classes: int = 1000, image_size: int = 224, in_channels: int = 3) -> Graph:
    """ResNet-50 v1: 7x7/2 stem, 3x3/2 max-pool, bottleneck stages 3-4-6-3, stride on the 1x1."""
    stem = [
        conv("stem_conv", INPUT, 64, 7, 2, padding=3),
        simple("stem_bn", "batchnorm", "stem_conv"),
        simple("stem_relu", "relu", "stem_bn"),
        maxpool("stem_pool", "stem_relu", 3, 2, 1),
    ]
    return _resnet(stem, "stem_pool", (3, 4, 6, 3), (64, 128, 256, 512), 1,
                   num_classes, image_size, in_channels)


def resnet_small(num_classes: int = 10, image_size: int = 32, in_channels: int = 3,
                 width: int = 1) -> Graph:
    """A CPU-sized seed for 32x32 inputs: 3x3 stem, one bottleneck block in each of three
    stages of widths 16-32-64 (times ``width``), stride on the first 1x1 as in ResNet-50 v1."""
    stem = [
        conv("stem_conv", INPUT, 32 * width, 3, 1, padding=1),
        simple("stem_bn", "batchnorm", "stem_conv"),
        simple("stem_relu", "relu", "stem_bn"),
    ]
    return _resnet(stem, "stem_relu", (1, 1, 1), (16 * width, 32 * width, 64 * width), 1,
                   num_classes, image_size, in_channels)


def seed(name: str, num_classes: int, image_size: int, in_channels: int = 3,
         width: int = 1) -> Graph:
    """A seed by name (``resnet50`` or ``resnet_small``); ``width`` multiplies the small
    seed's channels (ResNet-50 has its own)."""
    if name == "resnet50":
        if width != 1:
            raise ValueError("resnet50 keeps its own widths: a channel multiplier applies to "
                             "resnet_small only")
        return resnet50(num_classes, image_size, in_channels)
    if name == "resnet_small":
        return resnet_small(num_classes, image_size, in_channels, width)
    raise ValueError(f"unknown seed model {name!r}; choose one of {', '.join(SEEDS)}")
