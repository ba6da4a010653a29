"""The shared history of a run: one interface (store/base.py), SQLite and PostgreSQL backends
(store/sql.py), and, for a run on PostgreSQL, the run's store service (store/service/): one
process that holds the database connections and serves the replicas and the primary over TCP.
``open_store`` (store/opening.py) opens any of them by URL."""

from automlperf.events import TrialStatus
from automlperf.store.base import (SCHEMA_VERSION, Claim, EpochRecord, ReplicaRecord,
                                   SchemaMismatch, SegmentRecord, Store, StoreError, TrialRecord,
                                   TrialSummary, TrialTally)
from automlperf.store.opening import open_store
from automlperf.store.sql import SQLStore
from automlperf.store.urls import redact, resolve_store_url

__all__ = ["SCHEMA_VERSION", "Claim", "EpochRecord", "ReplicaRecord", "SQLStore", "SchemaMismatch",
           "SegmentRecord", "Store", "StoreError", "TrialRecord", "TrialStatus", "TrialSummary", "TrialTally",
           "open_store", "redact", "resolve_store_url"]
