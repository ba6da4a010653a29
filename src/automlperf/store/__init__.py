"""The shared history of a run: one interface (store/base.py), SQLite and PostgreSQL backends
(store/sql.py), and, for a run on PostgreSQL, the run's store service (store/service/): one
process that holds the database connections and serves the replicas and the primary over TCP.
``open_store`` (store/opening.py) opens any of them by URL.

The names below load on first use: a process that needs only a light module of the package
(the resource sampler, which reads ``store/rundir.py``) does not import SQLAlchemy with it."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from automlperf.events import TrialStatus
    from automlperf.store.base import (SCHEMA_VERSION, Claim, EpochRecord, ReplicaRecord,
                                       SchemaMismatch, SegmentRecord, Store, StoreError,
                                       TrialRecord, TrialSummary, TrialTally)
    from automlperf.store.opening import open_store
    from automlperf.store.sql import SQLStore
    from automlperf.store.urls import redact, resolve_store_url

_WHERE = {
    "TrialStatus": "automlperf.events",
    **dict.fromkeys(["SCHEMA_VERSION", "Claim", "EpochRecord", "ReplicaRecord", "SchemaMismatch",
                     "SegmentRecord", "Store", "StoreError", "TrialRecord", "TrialSummary",
                     "TrialTally"], "automlperf.store.base"),
    "open_store": "automlperf.store.opening",
    "SQLStore": "automlperf.store.sql",
    "redact": "automlperf.store.urls",
    "resolve_store_url": "automlperf.store.urls",
}

__all__ = ["SCHEMA_VERSION", "Claim", "EpochRecord", "ReplicaRecord", "SQLStore", "SchemaMismatch",
           "SegmentRecord", "Store", "StoreError", "TrialRecord", "TrialStatus", "TrialSummary",
           "TrialTally", "open_store", "redact", "resolve_store_url"]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value
