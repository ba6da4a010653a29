"""Inductor's compile workers and a child architecture's compilation, on this node's CPU
(Inductor's C++ backend): the seconds the compiled model's first steps took beyond a
step's (train/compiling.py ``measure_compile``, as the doctor measures them), with one compile
worker (what a rank decoding on the GPU had: ``threads - workers``) and with the cores the
workers leave idle there (train/rankenv.py ``compile_threads``: all the node's here).

Each measurement runs in a fresh process with a cold Inductor cache of its own; the settings
alternate, so a busier moment of the node costs both alike.

    python bench/bench_compile_threads.py [--rounds 2] [--model resnet_small] [--batch 8]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import json, random, sys, time
import torch
from automlperf.graph import seeds
from automlperf.search.morph import morph
from automlperf.train.compiling import measure_compile
model, size, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(int(sys.argv[4]))
seed = seeds.seed(model, 10, size, 3)
child = morph(seed, "random", random.Random(3)).graph  # the same child every time
began = time.perf_counter()
fig = measure_compile(child, batch, torch.device("cpu"), torch.autocast("cpu", enabled=False),
                      torch.channels_last, steps=2)
print(json.dumps({"compile_s": fig.compile_s, "layers": fig.layers, "seed_layers": len(seed),
                  "wall_s": time.perf_counter() - began,
                  "compile_threads": torch._inductor.config.compile_threads}))
"""


def once(threads: int, args: argparse.Namespace) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": str(threads),
               "TORCHINDUCTOR_CACHE_DIR": cache}
        done = subprocess.run([sys.executable, "-c", CHILD, args.model, str(args.size),
                               str(args.batch), str(args.intra)], env=env, capture_output=True,
                              text=True, timeout=3600)
    if done.returncode:
        raise SystemExit(done.stderr[-2000:])
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--model", default="resnet_small")
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--intra", type=int, default=1, help="intra-op threads (a GPU rank's: 1)")
    ap.add_argument("--out")
    args = ap.parse_args()
    from automlperf.hardware import cores_available
    from automlperf.train.rankenv import compile_threads

    cores = cores_available()
    idle = compile_threads(cores, cores - 1, gpu_path=True) if cores > 2 else cores
    settings = sorted({1, idle})
    runs: dict[int, list[dict[str, float]]] = {t: [] for t in settings}
    order = random.Random(0)
    for r in range(args.rounds):
        for threads in order.sample(settings, len(settings)):
            got = once(threads, args)
            runs[threads].append(got)
            print(f"round {r}: {threads} compile thread(s): {got['compile_s']:.1f} s "
                  f"({got['layers']} layers, process {got['wall_s']:.0f} s)", flush=True)
    summary = {t: statistics.median(g["compile_s"] for g in runs[t]) for t in settings}
    print(f"{args.model} child at {args.size} px, batch {args.batch}, {cores} cores: " +
          ", ".join(f"{t} thread(s) {s:.1f} s" for t, s in summary.items()))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"cores": cores, "args": vars(args), "runs": runs, "median": summary}, f,
                      indent=1)


if __name__ == "__main__":
    main()
