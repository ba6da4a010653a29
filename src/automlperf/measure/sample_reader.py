"""Reading a long run's monitor samples in worker processes, beside the caller's other work.

A ten-hour run of 512 nodes stores about a million samples; parsing them is most of what
writing its result costs. Above :data:`PARALLEL_FROM` samples the nodes are split into one
share per core, each share read and digested by its own process (its own connection to the
store), and the digests merged: the figures are those of one pass (see
:mod:`automlperf.measure.samples`).
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
from collections.abc import Sequence
from typing import Any

from automlperf.hardware import cores_available
from automlperf.measure.samples import SampleDigest, sample_digest
from automlperf.store import SQLStore, open_store
from automlperf.store.base import RunRecords
from automlperf.store.values import bulk

PARALLEL_FROM = 100_000


class PendingDigest:
    """The samples' digest, being computed; :meth:`result` waits for it."""

    def __init__(self, store: RunRecords, run_id: int, segments: Sequence[Any],
                 chart: bool = False) -> None:
        self._done: SampleDigest | None = None
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._parts: list[concurrent.futures.Future[SampleDigest]] = []
        self._segments = list(segments)
        self._chart = chart
        # In other processes, each with its own connection: a database's samples only.
        counts = store.sample_nodes(run_id) if isinstance(store, SQLStore) else {}
        workers = min(cores_available(), len(counts))
        if sum(counts.values()) < PARALLEL_FROM or workers < 2:
            self._done = _digest(store, run_id, segments, chart)
            return
        shares: list[list[str]] = [[] for _ in range(workers)]
        load = [0] * workers
        for node, n in sorted(counts.items(), key=lambda kv: -kv[1]):
            k = load.index(min(load))
            shares[k].append(node)
            load[k] += n
        self._pool = concurrent.futures.ProcessPoolExecutor(
            workers, mp_context=multiprocessing.get_context("spawn"))
        assert isinstance(store, SQLStore)
        url = store.url
        self._parts = [self._pool.submit(_share, url, run_id, self._segments, chart, share)
                       for share in shares]

    def result(self) -> SampleDigest:
        if self._done is None:
            assert self._pool is not None
            try:
                merged = SampleDigest(self._segments, self._chart)
                for part in self._parts:
                    merged.merge(part.result())
            finally:
                self._pool.shutdown()
            self._done = merged
        return self._done


def _share(url: str, run_id: int, segments: list[Any], chart: bool,
           nodes: list[str]) -> SampleDigest:
    store = open_store(url)
    try:
        return _digest(store, run_id, segments, chart, nodes)
    finally:
        store.close()


def _digest(store: RunRecords, run_id: int, segments: Sequence[Any], chart: bool,
            nodes: list[str] | None = None) -> SampleDigest:
    # The pass makes a few objects per sample and keeps none of them: left on, Python's cycle
    # collector would walk the whole heap again and again (two thirds of reading the samples).
    with bulk():
        return sample_digest(store.sample_figure_chunks(run_id, nodes), segments, chart)
