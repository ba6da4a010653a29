"""Candidate generation time as the history grows, edit-distance time per pair, and the
same candidates on an idle and a loaded machine.

The history is made of ResNet-50 (224x224, 1000 classes) descendants, each a random morph of
an earlier model at most 8 morphs from the seed, so model sizes stay alike at every history
size and the figures isolate the cost of a longer history. Models reach the searcher as a
replica gets them from the store: graph JSON plus content hash, parsed only when needed.
For each history size, several generations run with a warm searcher, on one core. Both the
wall-clock time and the process's CPU time are reported: on a shared, loaded machine the wall
clock includes time spent waiting for a core, the CPU time is what one core spends.

At the largest size the same generations run again, from the same history with a fresh
searcher, while ``--burners`` processes keep every core busy: the candidates must be the same
(nothing in the choice reads a clock), and the CPU time per candidate is reported beside.

Run: python bench/bench_search.py [--sizes 100,1000,10000] [--repeat 8] [--burners 2]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core, as the design budgets it
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from automlperf.graph import Graph, seeds  # noqa: E402
from automlperf.search import Model, MorphError, Searcher, morph  # noqa: E402
from automlperf.search.distance import describe, distances, pack  # noqa: E402


MAX_DEPTH = 8


def grow(history: list[Model], depth: dict[object, int], size: int, rng: random.Random) -> None:
    growable = [m for m in history if depth[m.id] < MAX_DEPTH]
    while len(history) < size:
        parent = rng.choice(growable)
        try:
            child, _ = morph(parent.graph, "random", rng, kernel_size=rng.choice((3, 5, 7)))
        except MorphError:
            continue
        acc = min(0.95, max(0.05, parent.accuracy + rng.gauss(0.005, 0.02)))
        model = Model(len(history), graph_json=child.to_json(indent=None),
                      content_hash=child.content_hash(), accuracy=acc)
        depth[model.id] = depth[parent.id] + 1
        history.append(model)
        if depth[model.id] < MAX_DEPTH:
            growable.append(model)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="100,1000,10000")
    ap.add_argument("--repeat", type=int, default=8)
    ap.add_argument("--burners", type=int, default=2, help="CPU burners beside the second "
                    "pass at the largest size (0: no second pass)")
    args = ap.parse_args()
    rng = random.Random(0)
    seed = seeds.resnet50()
    history = [Model(0, seed, 0.1)]
    depth = {0: 0}
    out: dict[str, object] = {"bench": "search", "budget_s": 2.0}

    # Edit distance per pair, batched as the search computes it (a candidate against a fit
    # set of 64).
    grow(history, depth, 200, rng)
    descs = [describe(m.graph) for m in history[:200]]
    packed = pack(descs[100:164])
    t0 = time.perf_counter()
    for a in descs[:40]:
        distances(a, packed)
    batch_us = (time.perf_counter() - t0) / (40 * 64) * 1e6
    out["distance_batched_per_pair_us"] = round(batch_us, 1)
    print(f"edit distance, ResNet-50 descendants: {batch_us:.0f} us per pair batched against 64")

    print(f"{'history':>8}{'median s':>10}{'p95 s':>8}{'max s':>8}{'CPU med s':>10}"
          f"{'CPU p95 s':>10}{'evaluated':>10}{'CPU p95/budget':>15}")
    sizes = [int(s) for s in args.sizes.split(",")]
    for size in sizes:
        grow(history, depth, size, rng)
        before = list(history)
        times, cpu, evaluated, chosen, first = generations(history, depth, seed, args.repeat)
        med, p95 = statistics.median(times), pct(times, 0.95)
        cpu_med, cpu_p95 = statistics.median(cpu), pct(cpu, 0.95)
        out[f"history_{size}"] = {"median_s": round(med, 3), "p95_s": round(p95, 3),
                                  "max_s": round(max(times), 3), "cold_s": round(first, 3),
                                  "cpu_median_s": round(cpu_med, 3),
                                  "cpu_p95_s": round(cpu_p95, 3),
                                  "evaluated_median": statistics.median(evaluated)}
        print(f"{size:>8}{med:>10.3f}{p95:>8.3f}{max(times):>8.3f}{cpu_med:>10.3f}"
              f"{cpu_p95:>10.3f}{statistics.median(evaluated):>10.0f}{cpu_p95 / 2.0:>15.2f}"
              f"   (cold: {first:.2f} s)")
        if size == sizes[-1] and args.burners:
            burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                       for _ in range(args.burners)]
            try:
                times_l, cpu_l, _, chosen_l, _ = generations(before, dict(depth), seed,
                                                              args.repeat)
            finally:
                for p in burners:
                    p.kill()
                    p.wait()
            same = sum(a == b for a, b in zip(chosen, chosen_l))
            out[f"history_{size}_loaded"] = {
                "burners": args.burners, "median_s": round(statistics.median(times_l), 3),
                "cpu_median_s": round(statistics.median(cpu_l), 3),
                "cpu_p95_s": round(pct(cpu_l, 0.95), 3),
                "same_candidates": same, "of": len(chosen)}
            print(f"{size:>8} beside {args.burners} CPU burners: median "
                  f"{statistics.median(times_l):.3f} s wall, CPU median "
                  f"{statistics.median(cpu_l):.3f} s, p95 {pct(cpu_l, 0.95):.3f} s; "
                  f"same candidate as idle: {same} of {len(chosen)}")
    print(json.dumps(out))


def generations(history: list[Model], depth: dict[object, int], seed: Graph,
                repeat: int) -> tuple[list[float], list[float], list[int], list[Any], float]:
    """``repeat`` + 1 generations with a fresh searcher, each candidate added to the history
    as a replica adds what it trained: wall and CPU seconds and the candidates scored of
    every generation after the first (cold caches), what each chose, and the first's time."""
    searcher = Searcher()
    times, cpu, evaluated, chosen = [], [], [], []
    first = 0.0
    for r in range(repeat + 1):
        t0, c0 = time.perf_counter(), time.process_time()
        cand = searcher.next_candidate(history, seed, random.Random(r), kernel_size=3)
        elapsed, used = time.perf_counter() - t0, time.process_time() - c0
        chosen.append((cand.graph.content_hash(), cand.parent_id, cand.morphs))
        if r == 0:
            first = elapsed  # cold caches: reported, not in the steady-state figures
        else:
            times.append(elapsed)
            cpu.append(used)
            evaluated.append(cand.stats.get("evaluated", 0))
        # The replica adds each trained candidate to the history.
        history.append(Model(len(history), cand.graph, history[-1].accuracy))
        depth[len(history) - 1] = MAX_DEPTH
    return times, cpu, evaluated, chosen, first


if __name__ == "__main__":
    main()
