"""The input pipeline as a rank sees it, in a process set up as a rank (``python -m
automlperf.train.loadprobe``): the rank's own loader (its transform, decoding workers,
threads, per-rank batch and device) alone, then feeding training steps of the seed model
through the trainer's own epoch loop, its waits for data and for the device told apart as an
epoch's are. `automlperf doctor` predicts a run's data
share from it."""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


@dataclass
class ProbeRequest:
    data: dict[str, Any]  # DataArgs of the rank
    device: str
    threads: int
    world: int  # ranks on the node: this rank loads its shard of 1/world
    per_rank: int
    model: str  # the seed trained beside the loader
    precision: str = "auto"
    channels_last: bool | None = None
    alone_s: float = 8.0  # seconds of loading alone, after the first batch
    beside_s: float = 15.0  # seconds of training beside it, after the first step
    min_steps: int = 3  # measured training steps at least
    expected_images_per_s: float | None = None  # training alone, per rank: sizes the steps


def rank_batches(dataset: Any, split: str, rank: int, world: int, per_rank: int, epoch: int,
                 seed: int, device: Any) -> Iterator[tuple[Any, Any]]:
    """The batches a rank's trainer takes from its loader (the one place this probe meets
    the loader's interface)."""
    return dataset.batches(split, rank, world, per_rank, epoch, seed, device)


def _endless(dataset: Any, req: ProbeRequest, device: Any) -> Iterator[tuple[Any, Any]]:
    """Training batches pass after pass (a small folder ends its pass before the clock)."""
    epoch = 0
    while True:
        empty = True
        for batch in rank_batches(dataset, "train", 0, req.world, req.per_rank, epoch, 0, device):
            empty = False
            yield batch
        if empty:
            return
        epoch += 1


def loader_alone(dataset: Any, req: ProbeRequest, device: Any) -> dict[str, Any]:
    """Images per second the loader delivers on the device with nothing consuming them,
    after its first batch (workers starting, page cache cold)."""
    from automlperf.train.trainer import synchronize

    batches = _endless(dataset, req, device)
    next(batches)
    synchronize(device)
    started = time.perf_counter()
    images = 0
    for _, y in batches:
        images += len(y)
        if time.perf_counter() - started >= req.alone_s:
            break
    synchronize(device)
    seconds = time.perf_counter() - started
    dataset.release()
    return {"images": images, "seconds": seconds, "images_per_s": images / max(seconds, 1e-9)}


def beside_training(dataset: Any, req: ProbeRequest, device: Any) -> dict[str, Any]:
    """The loader feeding training steps of the seed model through the trainer's own epoch
    loop (``train_epoch``, its first steps): images per second, and the shares of the time
    spent waiting for data and on the device's side, as an epoch records them. A first
    one-step pass warms up (workers, page cache, kernels) and is not counted; then about
    ``beside_s`` of steps at the expected rate, at least ``min_steps``."""
    from automlperf.config import Config
    from automlperf.graph import Graph, seeds
    from automlperf.train.spec import TrialSpec
    from automlperf.train.trainer import RankContext, _Run, release_trial

    graph = seeds.seed(req.model, dataset.num_classes, dataset.image_size, dataset.channels)
    train = Config().train
    spec = TrialSpec.from_config(train, "kaiming_normal", trial_id="probe", graph=graph.to_dict(),
                                 epochs=2, batch_size=req.per_rank * req.world, patience=1)
    spec.precision, spec.channels_last, spec.compile = req.precision, req.channels_last, False
    ctx = RankContext(0, req.world, device, dataset)
    run = _Run(spec, ctx, Graph.from_dict(spec.graph))
    steps = req.min_steps
    if req.expected_images_per_s:
        steps = max(steps, math.ceil(req.beside_s * req.expected_images_per_s / req.per_rank))
    try:
        run.train_epoch(0, _quiet, max_steps=1)
        times = run.train_epoch(1, _quiet, max_steps=steps)
    finally:
        release_trial(ctx)
    seconds = max(times.seconds, 1e-9)
    return {"images": times.images, "steps": times.steps, "seconds": times.seconds,
            "images_per_s": times.images / seconds,
            "data_share": min(1.0, times.data_wait / seconds),
            "device_share": min(1.0, times.device_wait / seconds)}


def _quiet(kind: str, payload: dict[str, Any]) -> None:
    """The probe's steps report no progress."""


def probe(req: ProbeRequest) -> dict[str, Any]:
    """Set this process up as a rank, then measure its loader alone and beside training."""
    from automlperf.train.rankenv import keep_host_memory, rank_threads, set_rank_environment

    set_rank_environment(req.threads, int(req.data.get("workers") or 0))
    import torch

    from automlperf.train import data as datasets

    device = torch.device(req.device)
    torch.set_num_threads(rank_threads(device.type, req.threads))  # as rank.py sets them
    if device.type == "cpu":
        keep_host_memory()
    elif device.type == "cuda":
        torch.cuda.set_device(device)
    dataset = datasets.load(**req.data, device_type=device.type)
    out: dict[str, Any] = {"decode_path": getattr(dataset, "decode_path", ""),
                           "workers": req.data.get("workers"), "threads": req.threads,
                           "per_rank": req.per_rank, "device": req.device, "world": req.world}
    out["alone"] = loader_alone(dataset, req, device)
    out["beside"] = beside_training(dataset, req, device)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description="A rank's input pipeline, alone and beside "
                                     "training.")
    parser.add_argument("request", help="the ProbeRequest as JSON")
    req = ProbeRequest(**json.loads(parser.parse_args().request))
    print(json.dumps(probe(req)))


if __name__ == "__main__":
    main()
