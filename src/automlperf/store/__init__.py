"""The shared history of a run: one interface, SQLite and PostgreSQL backends."""

from automlperf.store.base import (COMPLETED, FAILED, RUNNING, SCHEMA_VERSION, STOPPED,
                                   EpochRecord, ReplicaRecord, SchemaMismatch, SegmentRecord,
                                   Store, StoreError, TrialRecord, TrialStatus, TrialSummary)
from automlperf.store.sql import SQLStore, open_store
from automlperf.store.urls import redact, resolve_store_url

__all__ = ["COMPLETED", "FAILED", "RUNNING", "SCHEMA_VERSION", "STOPPED", "EpochRecord",
           "ReplicaRecord", "SQLStore", "SchemaMismatch", "SegmentRecord", "Store",
           "StoreError", "TrialRecord", "TrialStatus", "TrialSummary", "open_store", "redact", "resolve_store_url"]
