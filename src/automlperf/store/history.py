"""A run's trials as the architecture search reads them, kept up to date by reading only what
changed since the last read (:meth:`Store.changes`), their graphs fetched when the search
needs them and kept in a bounded cache. One history per process and run serves every replica
the process hosts (:func:`shared`)."""

from __future__ import annotations

import bisect
import threading
from collections import Counter, OrderedDict
from collections.abc import Sequence

from automlperf.events import TrialStatus
from automlperf.graph import Graph
from automlperf.search.bo import Model
from automlperf.store.base import Store, TrialChange
from automlperf.store.feed import TrialFeed

COMPLETED = TrialStatus.COMPLETED.value
# Parsed graphs kept: the search's fit set (64), its roots and the parents it morphs,
# several generations over, without holding a long run's every graph.
GRAPHS_KEPT = 512


class History:
    """The trials of ``run_id``, oldest first, as :class:`~automlperf.search.bo.Model` entries
    whose graphs load on demand. Safe to share between threads: :meth:`refresh` with any open
    store of the run reads what changed since the last refresh, whoever made it."""

    def __init__(self, run_id: int, graphs_kept: int = GRAPHS_KEPT) -> None:
        self.run_id = run_id
        self.graphs_kept = graphs_kept
        self._lock = threading.RLock()
        self._feed = TrialFeed(None, run_id)
        self._store: Store | None = None
        self._ids: list[int] = []
        self._models: list[Model] = []
        self._at: dict[int, int] = {}
        self._hashes: set[str] = set()
        self._changed: dict[int, int] = {}  # trial -> the change number last taken in
        self._graphs: OrderedDict[int, Graph] = OrderedDict()
        self.claimed: Counter[int] = Counter()  # trials by replica index
        self.completed = 0
        self.changes_read = 0
        self.graphs_read = 0

    # --- reading what changed -----------------------------------------------------------------
    def refresh(self, store: Store) -> int:
        """Read the trials changed since the last refresh; how many changes were read."""
        with self._lock:
            self._store = store
            changes = self._feed.read(store)
            self.merge(changes)
            self.changes_read += len(changes)
            return len(changes)

    def merge(self, changes: Sequence[TrialChange], store: Store | None = None) -> None:
        """Take in changes a reader of its own read (a replica that keeps its own place in
        the change log, sharing this history): those already taken in are skipped."""
        with self._lock:
            if store is not None:
                self._store = store
            for change in changes:
                if self._changed.get(change.id, -1) < change.changed:
                    self._apply(change)

    def _apply(self, c: TrialChange) -> None:
        self._changed[c.id] = c.changed
        at = self._at.get(c.id)
        old = self._models[at] if at is not None else None
        graph_hash = c.graph_hash or (old.content_hash if old is not None else "")
        if not graph_hash:
            return  # an end whose claim this history never saw: read with a full refresh
        accuracy = c.search_accuracy if c.status == COMPLETED else None
        model = Model(c.id, accuracy=accuracy, status=c.status, content_hash=graph_hash,
                      source=self)
        if old is None:
            self.claimed[c.replica_index] += 1
            self._hashes.add(graph_hash)
            if not self._ids or c.id > self._ids[-1]:
                self._at[c.id] = len(self._ids)
                self._ids.append(c.id)
                self._models.append(model)
            else:  # a claim committed after a later one: kept in id order
                i = bisect.bisect(self._ids, c.id)
                self._ids.insert(i, c.id)
                self._models.insert(i, model)
                self._at = {trial: k for k, trial in enumerate(self._ids)}
        else:
            self._models[at] = model  # type: ignore[index]
            self.completed -= old.status == COMPLETED
        self.completed += c.status == COMPLETED

    # --- what the search reads ----------------------------------------------------------------
    def models(self) -> list[Model]:
        """Every trial, oldest first; a list of its own, which later refreshes leave as is."""
        with self._lock:
            return list(self._models)

    def taken(self) -> set[str]:
        """The content hashes of every trial (architectures not to propose again)."""
        with self._lock:
            return set(self._hashes)

    def __len__(self) -> int:
        return len(self._ids)

    # --- graphs, on demand --------------------------------------------------------------------
    def graph(self, trial_id: int, content_hash: str | None = None) -> Graph:
        with self._lock:
            found = self._graphs.get(trial_id)
            if found is not None:
                self._graphs.move_to_end(trial_id)
                return found
            self.prefetch([trial_id])
            return self._graphs[trial_id]

    def prefetch(self, trial_ids: Sequence[int]) -> None:
        """Fetch the graphs of these trials that are not kept, in one read."""
        with self._lock:
            wanted = [i for i in dict.fromkeys(trial_ids) if i not in self._graphs]
            if not wanted:
                return
            if self._store is None:
                raise RuntimeError("the history has not been read from a store yet")
            fetched = self._store.graphs(wanted)
            self.graphs_read += len(fetched)
            for trial_id in wanted:
                graph = Graph.from_json(fetched[trial_id])
                at = self._at.get(trial_id)
                if at is not None:  # its hash is known: the graph need not compute it
                    object.__setattr__(graph, "_hash", self._models[at].content_hash)
                self._graphs[trial_id] = graph
            while len(self._graphs) > max(self.graphs_kept, len(wanted)):
                self._graphs.popitem(last=False)


_shared: dict[tuple[str, int], History] = {}
_shared_lock = threading.Lock()


def shared(store_key: str, run_id: int) -> History:
    """The history of ``run_id`` that every replica of this process shares, for the store
    named by ``store_key`` (its URL or its service's address)."""
    with _shared_lock:
        return _shared.setdefault((store_key, run_id), History(run_id))
