"""How a decoded batch leaves its slot of the ring for the rank's device.

* :class:`HostHandoff` (CPUs, and accelerators without page-locked host memory): the batch is
  a view of its slot on a CPU (no copy: valid until the next batch is asked for), a
  blocking copy elsewhere; the slot is free again at once.
* :class:`PinnedHandoff` (CUDA): the ring is page-locked where it lies (``cudaHostRegister``,
  after the workers are forked: CUDA may keep registered memory out of later forks), each
  batch, images and labels, goes to the device on a copy stream of its own, and the training
  stream waits for that copy on the device, not on the host. A slot is free again once its
  copy has finished, which does not wait for the training queued before it. Waiting for a
  copy is waiting for the device, and is booked as such.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any

import torch

from automlperf.train.data.ring import Ring

log = logging.getLogger("automlperf.data")


def page_lock(address: int, nbytes: int) -> int:
    """Page-lock ``nbytes`` of a ring at ``address`` where they lie (after the workers are
    forked: CUDA may keep registered memory out of later forks); ``address``, or 0 where
    CUDA refused (the copies then run from pageable memory, and it is logged)."""
    code = torch.cuda.cudart().cudaHostRegister(address, nbytes, 0)
    if int(code) != 0:
        log.warning("page-locking the loader's %.0f MiB of batch slots failed (CUDA error "
                    "%s): batches are copied to the GPU from pageable memory, slower",
                    nbytes / 2**20, int(code))
        return 0
    return address


class HostHandoff:
    """Batches of a ring to a device, from pageable memory."""

    def __init__(self, ring: Ring, device: torch.device) -> None:
        self.ring, self.device = ring, device

    @property
    def busy(self) -> bool:
        """Whether a slot is still being copied (never, here)."""
        return False

    def _tensors(self, slot: int, n: int, keep: Any) -> tuple[torch.Tensor, torch.Tensor]:
        images = torch.from_numpy(self.ring.images[slot, :n])
        labels = torch.from_numpy(self.ring.labels[slot, :n])
        if keep is not None:  # unreadable files left holes: a copy without them
            index = torch.from_numpy(keep)
            images, labels = images.index_select(0, index), labels.index_select(0, index)
        return images, labels

    def deliver(self, slot: int, n: int, keep: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(NHWC uint8 images, int64 labels) of a slot's first ``n`` places (those in ``keep``
        when given) on the device."""
        images, labels = self._tensors(slot, n, keep)
        if self.device.type == "cpu":
            # The labels are copied: small, and a caller may keep them beyond the next batch.
            return images, labels.clone()
        return images.to(self.device), labels.to(self.device)

    def release(self, slot: int) -> list[int]:
        """The batch of ``slot`` was used: the slots free again now."""
        return [slot]

    def reclaim(self) -> list[int]:
        """Slots whose copies have finished since they were released."""
        return []

    def wait_oldest(self) -> list[int]:
        """Wait for the oldest copy still running; the slots it frees."""
        return []

    def close(self) -> None:
        return None


class EventHandoff(HostHandoff):
    """A hand-over whose slots are free again only once the device has read them: the CUDA
    event recorded after a slot's last read is kept until it has passed."""

    def __init__(self, ring: Any, device: torch.device) -> None:
        super().__init__(ring, device)
        self.copying: deque[tuple[int, Any]] = deque()  # released, read not yet finished
        self._last: dict[int, Any] = {}  # slot -> the event after its last read

    @property
    def busy(self) -> bool:
        return bool(self.copying)

    def release(self, slot: int) -> list[int]:
        event = self._last.pop(slot, None)
        if event is None or event.query():
            return [slot]
        self.copying.append((slot, event))
        return []

    def reclaim(self) -> list[int]:
        freed = []
        while self.copying and self.copying[0][1].query():
            freed.append(self.copying.popleft()[0])
        return freed

    def wait_oldest(self) -> list[int]:
        if not self.copying:
            return []
        slot, event = self.copying.popleft()
        event.synchronize()
        return [slot, *self.reclaim()]


class PinnedHandoff(EventHandoff):
    """Batches of a page-locked ring to a CUDA device on a copy stream of their own."""

    def __init__(self, ring: Ring, device: torch.device) -> None:
        super().__init__(ring, device)
        self.stream = torch.cuda.Stream(device)
        self._registered = self._register()

    def _register(self) -> int:
        """Page-lock the ring (images, labels, rows: one mapping); its address, or 0."""
        return page_lock(int(self.ring.images.ctypes.data), self.ring.nbytes)

    def _event(self) -> Any:
        event = torch.cuda.Event()
        event.record(self.stream)
        return event

    def deliver(self, slot: int, n: int, keep: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
        images, labels = self._tensors(slot, n, keep)
        current = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self.stream):
            x = images.to(self.device, non_blocking=True)
            y = labels.to(self.device, non_blocking=True)
            self._last[slot] = self._event()
        current.wait_event(self._last[slot])
        # Made on the copy stream, used on the training stream: not reused before it is done.
        x.record_stream(current)
        y.record_stream(current)
        return x, y

    def close(self) -> None:
        self.stream.synchronize()
        self.copying.clear()
        self._last.clear()
        if self._registered:
            torch.cuda.cudart().cudaHostUnregister(self._registered)
            self._registered = 0


def handoff_for(ring: Ring, device: torch.device) -> HostHandoff:
    return PinnedHandoff(ring, device) if device.type == "cuda" else HostHandoff(ring, device)
