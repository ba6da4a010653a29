"""A rank's validation shard, decoded once per trial and kept on its device.

Validation has no randomness: each epoch's pass decodes the same files into the same boxes, so
after the first pass the decoded images (NHWC uint8, a quarter of the normalised floats'
size) are replayed from the device, with the unreadable counts and example the pass met, and
go through the same normalisation: the batches are bitwise those a new pass would give. The
decoding workers then spend the validation's time on the next training epoch instead.

A shard is kept only where it fits: on a GPU, within what the device has free beside what the
trial's training already reserved (the first validation comes after a training epoch, so the
allocator holds its peak), less a margin; on a CPU, within a share of the host's available
memory per rank. A shard that does not fit is decoded every epoch, as before, and the rank
says why once.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import torch

from automlperf.train.data.base import step_plan

PassBatch = tuple[torch.Tensor, torch.Tensor, int, str]  # images, labels, unreadable, example
# Of a GPU's memory, what the cache leaves free beside the trial's own: the allocator's
# fragmentation and the next epoch's cuDNN workspaces need room beyond what it reserved.
DEVICE_MARGIN = 0.10
# Of the host's available memory, the share one CPU rank's cache may take (the node's other
# ranks, their decoding workers and the page cache need the rest).
HOST_SHARE = 0.25

_log = logging.getLogger("automlperf.data")


def shard_images(val_size: int, rank: int, world: int, per_rank: int, seed: int) -> int:
    """Images of this rank's validation shard (its steps under the trial's step plan)."""
    return sum(len(rows) for rows in step_plan(val_size, rank, world, per_rank, "val", 0, seed))


def room_for(nbytes: int, device: torch.device, world: int) -> str:
    """Why ``nbytes`` of cached validation cannot be held on ``device``, or "" where they can."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        room = free - int(DEVICE_MARGIN * total)
        where = f"{device} has {free / 2**30:.1f} GiB free"
    else:
        import psutil

        room = int(HOST_SHARE * psutil.virtual_memory().available / max(1, world))
        where = f"the host's share per rank is {room / 2**30:.1f} GiB"
    if nbytes <= room:
        return ""
    return f"the shard needs {nbytes / 2**30:.2f} GiB and {where}"


class ValidationCache:
    """One trial's cached validation pass on one rank; ``key`` names the pass it holds (the
    loader's shape: rank, world, per-rank batch, seed, device)."""

    def __init__(self) -> None:
        self.key: tuple[Any, ...] | None = None
        self.batches: list[PassBatch] = []
        self.refused = ""  # why this trial's shard is not kept
        self.replays = 0  # passes served from the device so far
        self.gave_up: tuple[Any, ...] | None = None  # a pass that ran out of memory keeping it

    def holds(self, key: tuple[Any, ...]) -> bool:
        return self.key == key

    def fill(self, key: tuple[Any, ...], nbytes: int, device: torch.device, world: int,
             passes: Iterator[PassBatch]) -> Iterator[PassBatch]:
        """``passes`` as it comes, each batch kept (a copy: the loader reuses its slots) when
        the shard fits; the cache holds the pass only once it was read to its end."""
        self.key, self.batches = None, []
        if self.gave_up == key:
            yield from passes
            return
        why = room_for(nbytes, device, world)
        if why:
            if self.refused != why:
                _log.info("validation decoded every epoch: %s", why)
            self.refused = why
            yield from passes
            return
        kept: list[PassBatch] | None = []
        for x, y, bad, example in passes:
            if kept is not None:
                try:
                    kept.append((x.clone(), y.clone(), bad, example))
                except torch.OutOfMemoryError:
                    # The room measured was not there (another process took it): this pass
                    # goes on uncached, and so do the trial's next ones.
                    kept, self.refused = None, f"{device} ran out of memory keeping it"
                    self.gave_up = key
                    _log.info("validation decoded every epoch: %s", self.refused)
            yield x, y, bad, example
        if kept is not None:
            self.key, self.batches, self.refused = key, kept, ""

    def replay(self) -> Iterator[PassBatch]:
        self.replays += 1
        yield from self.batches

    def clear(self) -> None:
        """At a trial's end: what it kept, and its refusal, go with it."""
        self.key, self.batches, self.refused, self.gave_up = None, [], "", None
