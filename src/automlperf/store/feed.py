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
# At most this many skipped numbers are asked for again, the most recent kept: a statement
# takes one parameter per number (PostgreSQL's limit is 65,535, older SQLite's 32,766), and
# a number skipped long ago belongs to another run or was rolled back.
MAX_MISSING = 10_000


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
        # Numbers up to the highest one committed when the feed began are read by the first
        # poll or were never this run's; above it, every number is accounted for.
        self.floor = store.last_epoch_number()
        self.missing: dict[int, float] = {}  # skipped number -> when it was first skipped
        self.rows = 0

    def read(self) -> list[tuple[int, EpochRecord]]:
        """(replica index, epoch) of every epoch not read before, in the store's order."""
        now = self.clock()
        self.missing = {n: t for n, t in self.missing.items() if now - t < self.gap_s}
        if len(self.missing) > MAX_MISSING:
            self.missing = dict(sorted(self.missing.items())[-MAX_MISSING:])
        rows = self.store.epochs_after(self.run_id, self.after, sorted(self.missing))
        self.rows += len(rows)
        new = []
        for number, replica, epoch in rows:
            if number <= self.after:
                if self.missing.pop(number, None) is None:
                    continue  # already read
            else:
                # The numbers between belong to other runs in the same database or are
                # still being committed.
                low = max(self.after, self.floor) + 1
                if number - low < MAX_GAP:
                    self.missing.update(dict.fromkeys(range(low, number), now))
                self.after = number
            if epoch.run_id == self.run_id:  # a skipped number may be another run's epoch
                new.append((replica, epoch))
        return new
