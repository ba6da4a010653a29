"""The compile rule's inputs and outputs on this node (train/compiling.py): for the default
run's seed and for the official shape's, the measurement a rank makes (compilation seconds at
the trial's batch and a smaller one, eager and compiled step rates, in a process set up as a
rank), then what the rule decides with those figures for the trials each would plan.

Run: python bench/bench_compile.py [--steps 3] [--resnet-batch 32] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any


def planned_ops(graph: Any, epochs: int, train_images: int, batch: int) -> float:
    from automlperf.ops import count
    from automlperf.train.spec import plan_steps

    ops = count(graph)
    steps = plan_steps(train_images, 1, batch)
    return epochs * (train_images * (ops.forward + ops.backward_grad) + steps * ops.update_per_step)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="timed steps of each kind")
    parser.add_argument("--resnet-batch", type=int, default=32)
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args()
    from automlperf.hardware import cores_available
    from automlperf.train.rankenv import keep_host_memory, set_rank_environment

    threads = cores_available()
    set_rank_environment(threads, 0)
    import torch

    from automlperf.config import Config
    from automlperf.graph import seeds
    from automlperf.train.compiling import decide_compile, measure_compile
    from automlperf.train.evaluate import precision_context

    torch.set_num_threads(threads)
    keep_host_memory()
    cpu = torch.device("cpu")
    builtin = Config.for_dataset("builtin")
    official = Config()
    shapes = {
        "default run (builtin: resnet_small x4 at 12 px, batch 64)": (
            seeds.seed("resnet_small", 10, builtin.data.image_size, 1, builtin.model.seed_width),
            64, [("round 0", builtin.train.round_epochs(0), 2000),
                 ("round 3+", builtin.train.round_epochs(3), 2000)]),
        f"official shape (resnet50 at 224, batch {args.resnet_batch})": (
            seeds.resnet50(), args.resnet_batch,
            [("round 0", official.train.round_epochs(0), 1_281_167)]),
    }
    out: dict[str, Any] = {"threads": threads, "torch": torch.__version__, "shapes": {}}
    for name, (graph, batch, trials) in shapes.items():
        started = time.perf_counter()
        figures = measure_compile(graph, batch, cpu, precision_context("fp32", cpu),
                                  torch.channels_last, steps=args.steps)
        entry: dict[str, Any] = {"figures": figures.to_dict(),
                                 "measured_s": time.perf_counter() - started,
                                 "gain": figures.compiled_ops_per_s / figures.eager_ops_per_s - 1,
                                 "decisions": {}}
        for label, epochs, images in trials:
            decision = decide_compile(None, planned_ops(graph, epochs, images, batch), len(graph),
                                      figures)
            entry["decisions"][f"{label}: {epochs} epochs of {images} images"] = {
                "compile": decision.compile, "reason": decision.reason}
        out["shapes"][name] = entry
        print(name, json.dumps(entry, indent=1), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
