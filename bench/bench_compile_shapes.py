"""Compiled training's step rate after an epoch's smaller last batch, under each of
torch.compile's shape policies: the default (a second batch size recompiles the graph with a
dynamic batch, which Dynamo then tries first for every batch), ``dynamic=False`` (one
static graph per batch size) and what the trainer does, ``dynamic=False`` with the smaller
batch run eagerly (train.compiling.eager_stance: one graph). Eager steps in the same layout
are the baseline.

Run: python bench/bench_compile_shapes.py [--device cuda] [--seed resnet50] [--batch 256]
"""

from __future__ import annotations

import argparse
import contextlib
import json
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--seed", default="resnet50")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args()
    import torch
    import torch._dynamo
    from torch import nn
    from torch._dynamo.utils import counters

    from automlperf.graph import seeds
    from automlperf.ops.count import count
    from automlperf.train.builder import build_module
    from automlperf.train.compiling import eager_stance, timed_steps

    device = torch.device(args.device)
    graph = seeds.seed(args.seed, 1000, args.image_size, 1, 1)
    fmt = torch.channels_last
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    autocast = torch.autocast(device.type, dtype=dtype, enabled=device.type == "cuda")
    module = build_module(graph, seed=0).to(device, memory_format=fmt)
    x = torch.randn((args.batch, *graph.input_shape), device=device).contiguous(memory_format=fmt)
    y = torch.randint(0, graph.num_classes, (args.batch,), device=device)
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(module.parameters(), lr=1e-3, momentum=0.9)
    ops = count(graph)
    per_step = (ops.forward + ops.backward_grad) * args.batch + ops.update_per_step

    def timed(runner: Any, n: int, images: Any = x, labels: Any = y) -> float:
        return timed_steps(runner, optimizer, loss_fn, autocast, device, n, images, labels)

    out: dict[str, Any] = {"device": str(device), "torch": torch.__version__, "seed": args.seed,
                           "batch": args.batch, "policies": {}}
    timed(module, 3)
    eager = timed(module, args.steps) / args.steps
    out["eager_images_per_s"] = args.batch / eager
    out["eager_tops"] = per_step / eager / 1e12
    print(f"eager channels-last: {args.batch / eager:.0f} img/s, {per_step / eager / 1e12:.1f} TOPS",
          flush=True)
    half = args.batch // 2
    policies = (("dynamic=False, smaller batch eager", {"dynamic": False}, eager_stance),
                ("dynamic=False", {"dynamic": False}, contextlib.nullcontext),
                ("default", {}, contextlib.nullcontext))
    for policy, kwargs, smaller_batch in policies:
        torch._dynamo.reset()
        before = int(counters["stats"]["unique_graphs"])
        runner = torch.compile(module, **kwargs)
        first = timed(runner, 1)
        before_rate = args.batch * args.steps / timed(runner, args.steps)
        with smaller_batch():
            small = timed(runner, 1, x[:half], y[:half])
        timed(runner, 3)
        step = timed(runner, args.steps) / args.steps
        graphs = int(counters["stats"]["unique_graphs"]) - before
        out["policies"][policy] = {
            "first_step_s": first, "smaller_batch_first_step_s": small, "graphs": graphs,
            "images_per_s_before_smaller_batch": before_rate,
            "images_per_s_after_smaller_batch": args.batch / step,
            "tops_after": per_step / step / 1e12}
        print(f"compiled {policy}: first step {first:.1f} s, {before_rate:.0f} img/s; batch {half} "
              f"first step {small:.1f} s; then {args.batch / step:.0f} img/s "
              f"({per_step / step / 1e12:.1f} TOPS), {graphs} graph(s)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
