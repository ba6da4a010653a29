"""How much counting a deepen block at the TPE kernel size (instead of the 3x3 it trained)
inflates a ResNet-50 trial's operations: for every place a deepen block can go, the count
with the block at k = 5 and k = 7 over the count at k = 3 (what was trained)."""

from __future__ import annotations

import json
from collections import Counter

from automlperf.graph import seeds
from automlperf.ops import count
from automlperf.search.morph import deepen, deepen_targets


def main() -> None:
    g = seeds.resnet50(num_classes=1000, image_size=224)
    over: dict[int, list[float]] = {5: [], 7: []}
    for target in deepen_targets(g):
        trained = count(deepen(g, target, 3).graph, batch_size=1).total
        for k in over:
            over[k].append(count(deepen(g, target, k).graph, batch_size=1).total / trained - 1)
    places = len(over[5])
    print(f"{'k':>3} {'mean':>8} {'min':>8} {'max':>8}   (over {places} deepen places)")
    for k, values in over.items():
        print(f"{k:>3} {100 * sum(values) / places:7.2f}% {100 * min(values):7.2f}% "
              f"{100 * max(values):7.2f}%")
    print("by place (k=5/k=7):", dict(Counter(f"{100 * a:.1f}%/{100 * b:.1f}%"
                                              for a, b in zip(over[5], over[7], strict=True))))
    print(json.dumps({"bench": "kernel_count", "places": places,
                      **{f"k{k}_mean": sum(v) / places for k, v in over.items()},
                      **{f"k{k}_min": min(v) for k, v in over.items()},
                      **{f"k{k}_max": max(v) for k, v in over.items()}}))


if __name__ == "__main__":
    main()
