"""Per-step cost of the data-parallel path on 2 Gloo ranks: the trainer's step loop now
(every rank takes the same number of steps; BatchNorm statistics averaged once before
validation) against the same loop inside DDP's ``join()`` with buffers broadcast at every
forward pass (the path before). Same module, optimiser and synthetic batches; epochs
alternate A B B A; the first pair is a warm-up. Figure: median ms per step of each, and
their ratio.

Run: python bench/bench_ddp_step.py [--epochs 8] [--batch 64] [--images 2048]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from automlperf.graph import seeds
from automlperf.train.data import SyntheticDataset
from automlperf.train.trainer import RankContext, TrialSpec, _Run


def joined_epoch(run: _Run, epoch: int) -> tuple[int, float]:
    """The loop as it was: join() around the steps, buffers broadcast every forward."""
    run.module.train()
    run.runner.broadcast_buffers = True
    steps = 0
    t0 = time.perf_counter()
    with run.runner.join():
        for x, y in run.data.batches("train", run.ctx.rank, run.ctx.world, run.per_rank, epoch,
                                     run.spec.seed, run.device):
            run._step(x, y)
            steps += 1
    run.runner.broadcast_buffers = False
    return steps, time.perf_counter() - t0


def rank_main(rank: int, world: int, init: str, args: argparse.Namespace, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world,
                            timeout=timedelta(seconds=600))
    data = SyntheticDataset(image_size=args.image_size, num_classes=10, train_images=args.images)
    graph = seeds.resnet_small(num_classes=10, image_size=args.image_size, in_channels=3)
    spec = TrialSpec("bench", graph.to_dict(), epochs=args.epochs, batch_size=args.batch * world,
                     patience=args.epochs, precision="fp32", warmup_epochs=0)
    run = _Run(spec, RankContext(rank, world, torch.device("cpu"), data, distributed=True), graph)
    ms: dict[str, list[float]] = {"join": [], "no_join": []}
    for epoch in range(args.epochs):
        order = ("join", "no_join") if epoch % 2 == 0 else ("no_join", "join")
        for mode in order:
            dist.barrier()
            if mode == "join":
                steps, seconds = joined_epoch(run, epoch)
            else:
                _, _, steps, _, _, seconds = run.train_epoch(epoch, lambda kind, msg: None)
            if epoch >= 2:
                ms[mode].append(1000 * seconds / steps)
    if rank == 0:
        Path(out).write_text(json.dumps(ms))
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--batch", type=int, default=64, help="images per rank and step")
    ap.add_argument("--images", type=int, default=2048)
    ap.add_argument("--image-size", type=int, default=16)
    args = ap.parse_args()
    world = 2
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "ms.json")
        mp.spawn(rank_main, args=(world, f"file://{tmp}/rendezvous", args, out), nprocs=world)
        ms = json.loads(Path(out).read_text())
    join, plain = statistics.median(ms["join"]), statistics.median(ms["no_join"])
    ratios = [a / b for a, b in zip(ms["no_join"], ms["join"])]
    result = {"bench": "ddp_step", "world": world, "backend": "gloo", "model": "resnet_small",
              "image_size": args.image_size, "batch_per_rank": args.batch,
              "join_ms_per_step": round(join, 3), "no_join_ms_per_step": round(plain, 3),
              "ratio_no_join_over_join": round(statistics.median(ratios), 4)}
    print(f"{'path':>10} {'ms/step':>9}")
    print(f"{'join()':>10} {join:>9.2f}")
    print(f"{'no join':>10} {plain:>9.2f}")
    print(f"ratio no-join / join (median of {len(ratios)} epoch pairs): {result['ratio_no_join_over_join']}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
