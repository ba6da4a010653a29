"""The trainer's steady-state step throughput against a plain hand-written PyTorch loop.

Both train the same module (rebuilt from the same seed) with the same optimiser settings
(SGD, momentum, weight decay on weights only, label smoothing), on the same batches of the
same dataset, at the same batch size, on this machine's CPU (or first GPU). Epochs alternate
in A B B A order so machine noise and drift hit both alike; the first pair is a warm-up. The
median ratio of images/s (trainer / plain) is the figure; the target is >= 0.98. The
trainer's own data-loading share of step time is reported beside it.

Run: python bench/bench_train.py [--dataset builtin] [--model resnet_small] [--epochs 16]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from torch import nn

from automlperf.config import Config
from automlperf.graph import seeds
from automlperf.train.builder import build_module
from automlperf.train.data import load
from automlperf.hardware import cores_available
from automlperf.train.trainer import RankContext, TrialSpec, _Run


def plain_epoch(module: nn.Module, opt: torch.optim.Optimizer, loss_fn: nn.Module, data,
                batch: int, epoch: int, device: torch.device) -> tuple[int, float]:
    module.train()
    images = 0
    t0 = time.perf_counter()
    for x, y in data.batches("train", 0, 1, batch, epoch, 0, device):
        loss = loss_fn(module(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        images += len(y)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return images, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", default="builtin")
    ap.add_argument("--model", default="resnet_small")
    ap.add_argument("--image-size", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=16)
    args = ap.parse_args()
    torch.set_num_threads(cores_available())
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    data = load(Config.for_dataset(args.dataset, {"data": {
        "image_size": args.image_size, "synthetic_images": 2048, "synthetic_classes": 10}}).data)
    graph = seeds.seed(args.model, data.num_classes, data.image_size, data.channels)

    spec = TrialSpec("bench", graph.to_dict(), epochs=args.epochs, batch_size=args.batch_size,
                     patience=args.epochs, seed=0, precision="fp32", channels_last=False,
                     warmup_epochs=0)
    run = _Run(spec, RankContext(0, 1, device, data), graph)
    plain = build_module(graph, seed=0).to(device)
    weights = [p for p in plain.parameters() if p.ndim > 1]
    others = [p for p in plain.parameters() if p.ndim <= 1]
    opt = torch.optim.SGD([{"params": weights, "weight_decay": spec.weight_decay},
                           {"params": others, "weight_decay": 0.0}], lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)

    trainer_rates, plain_rates, shares = [], [], []
    for epoch in range(args.epochs):
        def trainer(epoch: int = epoch) -> tuple[int, float, float]:
            _, images, _, wait, _, seconds = run.train_epoch(epoch, lambda kind, msg: None)
            if device.type == "cuda":
                torch.cuda.synchronize()
            return images, seconds, wait

        def hand(epoch: int = epoch) -> tuple[int, float, float]:
            return (*plain_epoch(plain, opt, loss_fn, data, run.per_rank, epoch, device), 0.0)

        order = (trainer, hand) if epoch % 2 == 0 else (hand, trainer)
        results = {f: f() for f in order}
        (images, seconds, wait), (p_images, p_seconds, _) = results[trainer], results[hand]
        if epoch == 0:
            continue  # warm-up
        trainer_rates.append(images / seconds)
        plain_rates.append(p_images / p_seconds)
        shares.append(wait / seconds)
        print(f"epoch {epoch}: trainer {images / seconds:8.1f} img/s, plain {p_images / p_seconds:8.1f}"
              f" img/s, ratio {images / seconds / (p_images / p_seconds):.3f}, data share "
              f"{100 * wait / seconds:.2f} %")
    ratios = [a / b for a, b in zip(trainer_rates, plain_rates)]
    result = {"bench": "train", "device": str(device), "dataset": data.name, "model": args.model,
              "batch_size": args.batch_size, "threads": torch.get_num_threads(),
              "trainer_img_s": round(statistics.median(trainer_rates), 1),
              "plain_img_s": round(statistics.median(plain_rates), 1),
              "ratio_median": round(statistics.median(ratios), 4),
              "ratio_min": round(min(ratios), 4), "target": 0.98,
              "data_share_median": round(statistics.median(shares), 4)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
