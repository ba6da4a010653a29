"""The torch side: building modules from graphs, weight inheritance, data and training.

``train.spec`` (the trial spec and the Trainer protocol) needs no torch, so importing this
package does not load it: ``build_module`` and ``GraphModule`` load it on first use.
"""

import os
from typing import Any

# Idle OpenMP threads spin briefly, then sleep. Set before torch loads its OpenMP runtime
# (libgomp in the Linux wheels) here and inherited by the training processes. Spinning
# long (libgomp's default, 300,000 spins) made a 2-thread rank 3-10 times slower on cores
# other work shares; never spinning (OMP_WAIT_POLICY=PASSIVE) halved small models' steps on
# an idle machine. Measured on 2 cores (train steps, img/s, idle / beside two busy loops):
# resnet_small 8px batch 128: passive 4005 / 2021, default 8782 / 690, 10,000 spins 7888 / 1829;
# resnet_small x4 12px: 505 / 232, 680 / 170, 631 / 237; ResNet-50 224: 8.7 / 4.2,
# 9.5 / 3.0, 9.2 / 4.1. A wait policy or spin count the user sets wins. Only libgomp reads
# GOMP_SPINCOUNT: builds on LLVM's or Intel's runtime (macOS, conda) keep their own
# KMP_BLOCKTIME, which was not measured here.
if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", "10000")

__all__ = ["GraphModule", "build_module"]


def __getattr__(name: str) -> Any:
    if name in ("GraphModule", "build_module"):
        from automlperf.train import builder

        return getattr(builder, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
