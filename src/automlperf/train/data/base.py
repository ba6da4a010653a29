"""What every dataset shares: the interface (shards and batches of one dataset on a device,
counting the images it could not read), its error, and the step plan that gives every
data-parallel rank the same number of steps."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any

import torch

from automlperf.config import DataConfig
from automlperf.errors import UserError
from automlperf.seeding import mix_seed
from automlperf.train.spec import plan_steps

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
_DATA = DataConfig()  # the one source of the data defaults


class DataError(UserError, ValueError):
    """A dataset that is missing or malformed; the message says what to fix."""


class Dataset(ABC):
    """Shards and batches of one dataset; ``skipped`` counts unreadable images so far and
    ``unreadable`` names the last one seen and why (empty while every image was read);
    ``max_unreadable`` is the share of a split's images that may be unreadable in an epoch
    before a trial fails for its data. ``device_wait_s`` counts the seconds that asking for
    a batch spent waiting for the device rather than for data (a slot of pinned memory still
    being copied): the trainer books them as waits for the device."""

    name: str
    num_classes: int
    channels: int
    image_size: int
    train_size: int
    val_size: int
    official: bool = False

    max_unreadable: float = _DATA.max_unreadable

    def __init__(self) -> None:
        self.skipped = 0
        self.unreadable = ""
        self.device_wait_s = 0.0
        # Images a GPU decoding path handed to the CPU reference instead, so far.
        self.cpu_decoded = 0

    @property
    def decode_path(self) -> str:
        """What decodes the images, with its libraries' versions (empty: none to decode)."""
        return ""

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return (self.channels, self.image_size, self.image_size)

    @abstractmethod
    def batches(self, split: str, rank: int, world: int, batch_size: int, epoch: int,
                seed: int, device: torch.device) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's batches, the same number on every rank (see :func:`step_plan`)."""

    def expect_next(self, after: tuple[str, int] | None) -> None:
        """Say which pass, as (split, epoch), follows the next one asked for (None: none, the
        trial ends), where the usual order (validation after a training epoch, the next
        epoch after validation) does not hold: a loader decodes ahead into it."""
        return None

    def release(self) -> None:
        """Free what one trial's passes hold (worker processes, pinned buffers)."""
        return None

    def notes(self) -> dict[str, str]:
        """How this trial's data was served, in words its record keeps (which decode path
        and why, whether validation was kept on the device)."""
        return {}

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "classes": self.num_classes, "image_size": self.image_size,
                "channels": self.channels, "train_images": self.train_size,
                "val_images": self.val_size, "official": self.official}


def step_plan(n: int, rank: int, world: int, per_rank: int, split: str, epoch: int,
              seed: int) -> list[torch.Tensor]:
    """This rank's images, step by step. Every rank takes the same number of steps (so no
    rank waits in an all-reduce that another never starts) and every image is used once per
    epoch over all ranks; a rank's share of a step differs from another's by at most one."""
    if split == "train":
        gen = torch.Generator().manual_seed(mix_seed(seed, epoch))
        order = torch.randperm(n, generator=gen)
    else:
        order = torch.arange(n)
    batch = per_rank * world
    steps = plan_steps(n, world, per_rank)
    return [order[s * batch:n if s == steps - 1 else (s + 1) * batch][rank::world]
            for s in range(steps)]
