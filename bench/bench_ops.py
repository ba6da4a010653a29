"""How long the analytical counter takes on ResNet-50 (target: under 5 ms per count).

Run: python bench/bench_ops.py   (prints a table and one JSON line)
"""

from __future__ import annotations

import json
import statistics
import time

from automlperf.graph import Graph, seeds
from automlperf.ops import count

TARGET_MS = 5.0


def timed(fn, repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def main() -> None:
    graph = seeds.resnet50(num_classes=1000, image_size=224)
    text = graph.to_json()
    rows = {
        "count(resnet50)": timed(lambda: count(graph), 500),
        "seeds.resnet50() build": timed(lambda: seeds.resnet50(), 100),
        "Graph.from_json + count": timed(lambda: count(Graph.from_json(text)), 100),
    }
    result = {}
    print(f"{'what':<26}{'median ms':>10}{'p95 ms':>10}{'median/target':>15}")
    for name, times in rows.items():
        med = statistics.median(times)
        p95 = sorted(times)[int(0.95 * len(times)) - 1]
        result[name] = {"median_ms": round(med, 4), "p95_ms": round(p95, 4)}
        print(f"{name:<26}{med:>10.3f}{p95:>10.3f}{med / TARGET_MS:>15.3f}")
    ok = result["count(resnet50)"]["median_ms"] < TARGET_MS
    print(json.dumps({"bench": "ops", "target_ms": TARGET_MS, "ok": ok, **result}))


if __name__ == "__main__":
    main()
