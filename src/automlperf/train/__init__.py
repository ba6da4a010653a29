"""The torch side: building modules from graphs, weight inheritance, data and training.

``train.spec`` (the trial spec and the Trainer protocol) needs no torch, so importing this
package does not load it: ``build_module`` and ``GraphModule`` load it on first use.
"""

import os
from typing import Any

# Idle OpenMP threads sleep rather than spin. Set before torch loads its OpenMP runtime here
# and inherited by the training processes. On a machine whose cores other work shares,
# spinning made a 2-thread rank 5-10 times slower (resnet_small at 12x12, batch 64: 40-80
# img/s spinning, 400-450 sleeping, 450-570 with 1 thread). A value set by the user wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__all__ = ["GraphModule", "build_module"]


def __getattr__(name: str) -> Any:
    if name in ("GraphModule", "build_module"):
        from automlperf.train import builder

        return getattr(builder, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
