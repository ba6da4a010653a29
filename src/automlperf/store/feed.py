"""Reading a run's records incrementally, each once: the epochs (the primary's live view), and
the changes of its trials and replicas (a replica's history, the primary's tallies and
watch). What a reader that polls reads is what was recorded since its last poll, however
long the run."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from automlperf.store.base import Changes, EpochRecord, ReplicaRecord, Store, TrialChange

# How long a skipped number is asked for again. A number is skipped while the transaction
# that took it has not committed (milliseconds), or for good when it rolled back (an epoch
# refused as already recorded).
GAP_S = 300.0
# More numbers skipped at once than any run records in a poll: another run's records.
MAX_GAP = 100_000
# At most this many skipped numbers are asked for again, the most recent kept: a statement
# takes one parameter per number (PostgreSQL's limit is 65,535, older SQLite's 32,766), and
# a number skipped long ago belongs to another run or was rolled back.
MAX_MISSING = 10_000

P = TypeVar("P")


class NumberedFeed(Generic[P]):
    """Polls for the records numbered after the last one seen, and for the numbers it skipped
    until they appear or ``gap_s`` passes (a store that vouches for every number up to some
    point, :attr:`Changes.through`, ends the asking). ``rows`` counts the rows read, for
    those who watch its cost."""

    def __init__(self, floor: int, gap_s: float = GAP_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.gap_s = gap_s
        self.clock = clock
        self.after = 0
        # Numbers up to the highest one committed when the feed began are read by the first
        # poll or were never this run's; above it, every number is accounted for.
        self.floor = floor
        self.missing: dict[int, float] = {}  # skipped number -> when it was first skipped
        self.rows = 0

    def _fetch(self, after: int, also: Sequence[int]) -> tuple[list[tuple[int, P]], int | None]:
        raise NotImplementedError

    def _mine(self, payload: P) -> bool:
        return True

    def poll(self) -> list[tuple[int, P]]:
        """(number, record) of every record not read before, in the store's order."""
        now = self.clock()
        self.missing = {n: t for n, t in self.missing.items() if now - t < self.gap_s}
        if len(self.missing) > MAX_MISSING:
            self.missing = dict(sorted(self.missing.items())[-MAX_MISSING:])
        rows, through = self._fetch(self.after, sorted(self.missing))
        self.rows += len(rows)
        new = []
        for number, payload in rows:
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
            if self._mine(payload):  # a skipped number may be another run's
                new.append((number, payload))
        if through is not None:
            self.after = max(self.after, through)
            self.missing.clear()
        return new


class EpochFeed(NumberedFeed[tuple[int, EpochRecord]]):
    """The epochs of ``run_id`` (see :meth:`Store.epochs_after`)."""

    def __init__(self, store: Store, run_id: int, gap_s: float = GAP_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.run_id = run_id
        super().__init__(store.last_epoch_number(), gap_s, clock)

    def _fetch(self, after: int, also: Sequence[int]) -> tuple[list[tuple[int, Any]], int | None]:
        rows = self.store.epochs_after(self.run_id, after, also)
        return [(n, (replica, epoch)) for n, replica, epoch in rows], None

    def _mine(self, payload: tuple[int, EpochRecord]) -> bool:
        return payload[1].run_id == self.run_id

    def read(self) -> list[tuple[int, EpochRecord]]:
        """(replica index, epoch) of every epoch not read before, in the store's order."""
        return [payload for _, payload in self.poll()]


class TrialFeed(NumberedFeed[TrialChange]):
    """The changes of ``run_id``'s trials (see :meth:`Store.changes`), from ``store`` or the
    store given to each :meth:`read`. Numbers of the first read are not asked for again (they
    are other runs', or a claim still committing, whose end is read anyway)."""

    def __init__(self, store: Store | None, run_id: int) -> None:
        self.store = store
        self.run_id = run_id
        super().__init__(0)
        self.started = False

    def _fetch(self, after: int, also: Sequence[int]) -> tuple[list[tuple[int, TrialChange]], int | None]:
        assert self.store is not None
        found = self.store.changes(self.run_id, after, also)
        rows = [(c.changed, c) for c in found.rows]
        if not self.started:
            self.started = True
            return rows, found.through if found.through is not None else \
                max([after, *(n for n, _ in rows)])
        return rows, found.through

    def read(self, store: Store | None = None) -> list[TrialChange]:
        if store is not None:
            self.store = store
        return [c for _, c in self.poll()]


class ReplicaFeed(NumberedFeed[ReplicaRecord]):
    """The registrations and ends of ``run_id``'s replicas (see :meth:`Store.replica_changes`)."""

    def __init__(self, store: Store, run_id: int) -> None:
        self.store = store
        self.run_id = run_id
        super().__init__(0)
        self.started = False

    def _fetch(self, after: int, also: Sequence[int]) -> tuple[list[tuple[int, ReplicaRecord]], int | None]:
        found: Changes[tuple[int, ReplicaRecord]] = self.store.replica_changes(self.run_id, after, also)
        if not self.started:
            self.started = True
            return found.rows, found.through if found.through is not None else \
                max([after, *(n for n, _ in found.rows)])
        return found.rows, found.through

    def read(self) -> list[ReplicaRecord]:
        return [r for _, r in self.poll()]
