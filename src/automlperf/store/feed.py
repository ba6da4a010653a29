"""A run's new epochs, each once, read incrementally: what a view that polls every second
reads is the epochs recorded since its last poll, however long the run."""

from __future__ import annotations

import time
from collections.abc import Callable

from automlperf.store.base import EpochRecord, Store

# How long a skipped number is asked for again. A number is skipped while the transaction
# that took it has not committed (milliseconds), or for good when it rolled back (an epoch
# refused as already recorded).
GAP_S = 300.0
# More numbers skipped at once than any run records in a poll: another run's epochs.
MAX_GAP = 100_000


class EpochFeed:
    """Polls ``store`` for the epochs of ``run_id`` numbered after the last one seen, and
    for the numbers it skipped (see :meth:`Store.epochs_after`) until they appear or
    ``gap_s`` passes. ``rows`` counts the rows read, for those who watch its cost."""

    def __init__(self, store: Store, run_id: int, gap_s: float = GAP_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.run_id = run_id
        self.gap_s = gap_s
        self.clock = clock
        self.after = 0
        self.missing: dict[int, float] = {}  # skipped number -> when it was first skipped
        self.rows = 0

    def read(self) -> list[tuple[int, EpochRecord]]:
        """(replica index, epoch) of every epoch not read before, in the store's order."""
        now = self.clock()
        self.missing = {n: t for n, t in self.missing.items() if now - t < self.gap_s}
        rows = self.store.epochs_after(self.run_id, self.after, sorted(self.missing))
        self.rows += len(rows)
        new = []
        for number, replica, epoch in rows:
            if number <= self.after:
                if self.missing.pop(number, None) is None:
                    continue  # already read
            else:
                # Before the first read nothing was in flight that matters (the view starts
                # before its replicas); beyond that, the numbers between belong to other
                # runs in the same database or are still being committed.
                if self.after and number - self.after <= MAX_GAP:
                    self.missing.update(dict.fromkeys(range(self.after + 1, number), now))
                self.after = number
            if epoch.run_id == self.run_id:  # a skipped number may be another run's epoch
                new.append((replica, epoch))
        return new
