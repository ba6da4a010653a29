"""The torch side: building modules from graphs, weight inheritance, data and training."""

import os

# Idle OpenMP threads sleep rather than spin. Set before torch loads its OpenMP runtime here
# and inherited by the training processes. On a machine whose cores other work shares,
# spinning made a 2-thread rank 5-10 times slower (resnet_small at 12x12, batch 64: 40-80
# img/s spinning, 400-450 sleeping, 450-570 with 1 thread). A value set by the user wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from automlperf.train.builder import GraphModule, build_module  # noqa: E402
from automlperf.train.inherit import inherit  # noqa: E402

__all__ = ["GraphModule", "build_module", "inherit"]
