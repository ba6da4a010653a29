"""The store's tables, and the one query that checks them when a store is opened (older
layouts are brought up to date by whoever opens them first)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

from automlperf.store.base import SCHEMA_VERSION, SchemaMismatch, StoreError
from automlperf.store.urls import redact

# Prefixed names: stores made before the TPE studies moved to the run directory hold Optuna's
# tables beside these.
meta = sa.MetaData()
T_META = sa.Table("amp_meta", meta, sa.Column("key", sa.String(64), primary_key=True),
                  sa.Column("value", sa.Text, nullable=False))
T_RUNS = sa.Table(
    "amp_runs", meta,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("name", sa.String(200), nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("duration_s", sa.Float, nullable=False),
    sa.Column("config", sa.Text, nullable=False),
    sa.Column("system", sa.Text, nullable=False))
T_SEGMENTS = sa.Table(
    "amp_segments", meta,
    sa.Column("run_id", sa.Integer, sa.ForeignKey("amp_runs.id"), primary_key=True),
    sa.Column("idx", sa.Integer, primary_key=True),
    sa.Column("started_at", sa.Float, nullable=False),
    sa.Column("deadline_at", sa.Float, nullable=False),
    sa.Column("last_seen", sa.Float, nullable=False),
    sa.Column("ended_at", sa.Float))
T_REPLICAS = sa.Table(
    "amp_replicas", meta,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("run_id", sa.Integer, sa.ForeignKey("amp_runs.id"), nullable=False),
    sa.Column("idx", sa.Integer, nullable=False),
    sa.Column("segment", sa.Integer, nullable=False),
    sa.Column("host", sa.String(255), nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("devices", sa.Text, nullable=False),
    sa.Column("started_at", sa.Float, nullable=False),
    sa.Column("last_heartbeat", sa.Float, nullable=False),
    sa.Column("status", sa.String(32), nullable=False),
    sa.Column("reason", sa.Text, nullable=False, default=""),
    sa.Column("ended_at", sa.Float),
    # Leases follow from the heartbeat: a running trial's lease lapses when its replica's
    # has (and the grace its claim gave it has run out), so a beat writes this row only.
    sa.Column("lease_until", sa.Float),
    # The store's change number of the replica's registration or end (see CHANGES).
    sa.Column("changed", sa.BigInteger),
    sa.Index("amp_replicas_changed", "run_id", "changed"))
T_TRIALS = sa.Table(
    "amp_trials", meta,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("run_id", sa.Integer, sa.ForeignKey("amp_runs.id"), nullable=False),
    sa.Column("replica_index", sa.Integer, nullable=False),
    sa.Column("replica_id", sa.Integer, sa.ForeignKey("amp_replicas.id")),
    sa.Column("graph_hash", sa.String(64), nullable=False),
    sa.Column("graph_json", sa.Text, nullable=False),
    sa.Column("parent_id", sa.Integer, sa.ForeignKey("amp_trials.id")),
    sa.Column("morphs", sa.Text, nullable=False),
    sa.Column("round", sa.Integer, nullable=False),
    sa.Column("hparams", sa.Text, nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("reason", sa.Text, nullable=False, default=""),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("finished_at", sa.Float),
    sa.Column("lease_until", sa.Float),
    sa.Column("best_accuracy", sa.Float),
    sa.Column("predicted_accuracy", sa.Float),
    sa.Column("weights_path", sa.Text),
    sa.Column("extra", sa.Text, nullable=False, default="{}"),
    # The store's change number of the trial's claim, then of its end: what a replica's
    # history reads is the trials changed since its last read (see CHANGES).
    sa.Column("changed", sa.BigInteger),
    sa.UniqueConstraint("run_id", "graph_hash", name="one_trial_per_architecture"),
    sa.Index("amp_trials_replica", "replica_id"),
    sa.Index("amp_trials_changed", "run_id", "changed"),
    # Lease expiry looks at the running trials only, however long the history.
    sa.Index("amp_trials_running", "run_id", sqlite_where=sa.text("status = 'running'"),
             postgresql_where=sa.text("status = 'running'")))
T_EPOCHS = sa.Table(
    "amp_epochs", meta,
    sa.Column("trial_id", sa.Integer, sa.ForeignKey("amp_trials.id"), primary_key=True),
    sa.Column("epoch", sa.Integer, primary_key=True),
    sa.Column("run_id", sa.Integer, sa.ForeignKey("amp_runs.id"), nullable=False, index=True),
    sa.Column("started_at", sa.Float, nullable=False),
    sa.Column("ended_at", sa.Float, nullable=False),
    sa.Column("train_images", sa.BigInteger, nullable=False),
    sa.Column("val_images", sa.BigInteger, nullable=False),
    sa.Column("steps", sa.BigInteger, nullable=False),
    sa.Column("ops", sa.BigInteger, nullable=False),  # int64: ~3e16 per ImageNet epoch
    sa.Column("train_loss", sa.Float, nullable=False),
    sa.Column("val_accuracy", sa.Float, nullable=False),
    sa.Column("precision", sa.String(8), nullable=False),
    sa.Column("batch_size", sa.Integer, nullable=False),
    sa.Column("world_size", sa.Integer, nullable=False),
    sa.Column("data_share", sa.Float, nullable=False),
    sa.Column("images_per_s", sa.Float, nullable=False),
    sa.Column("skipped_images", sa.BigInteger, nullable=False),
    sa.Column("val_skipped", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("device_share", sa.Float),
    sa.Column("compiled", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("decode_path", sa.Text, nullable=False, server_default=""),
    sa.Column("cpu_decoded", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("val_loss", sa.Float))
T_SAMPLES = sa.Table(
    "amp_samples", meta,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("run_id", sa.Integer, sa.ForeignKey("amp_runs.id"), nullable=False, index=True),
    sa.Column("node", sa.String(255), nullable=False),
    sa.Column("t", sa.Float, nullable=False),
    sa.Column("data", sa.Text, nullable=False),
    # What a run's figures are computed from (base.sample_figures), so that reading a long
    # run's million samples need not parse them whole: the numbers as float64 (8 GPUs' JSON
    # takes 15 times as long to parse), and the uuids and CPU counters as JSON. Empty where
    # a number would not come back exactly, and in rows stored before the columns (added
    # after schema version 1 without changing it: older stores get them when opened).
    sa.Column("figures", sa.LargeBinary),
    sa.Column("figure_keys", sa.Text),
    # A sample sent again (its first try committed unseen) is found by its node and time.
    sa.Index("amp_samples_node", "run_id", "node", "t"))

# Added after schema version 1 without changing it: older stores get the table when opened.
T_NODES = sa.Table(
    "amp_nodes", meta,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("run_id", sa.Integer, sa.ForeignKey("amp_runs.id"), nullable=False, index=True),
    sa.Column("replica_index", sa.Integer, nullable=False),
    sa.Column("segment", sa.Integer, nullable=False),
    sa.Column("host", sa.String(255), nullable=False),
    sa.Column("recorded_at", sa.Float, nullable=False),
    sa.Column("data", sa.Text, nullable=False))


# Change numbers: one sequence for the whole database on PostgreSQL; on SQLite, whose writes
# take turns, the run's highest number plus one.
CHANGES = sa.Sequence("amp_changes", metadata=meta)

# The tables' layout within schema version 2: what was added without changing the version
# (nodes, sample figures, epoch numbers, skipped validation images: layout 1; change numbers,
# leases on the replica, the running-trials and sample indexes: layout 2; each epoch's device
# share, compilation, decoding path, CPU-decoded images and validation loss: layout 3). A
# store opened with an older layout is brought up to date; with the current one, opening it
# is one query.
LAYOUT = 3


def open_check(engine: sa.Engine, url: str, create: bool) -> None:
    """Check (one query) that the store holds automlperf's schema; create it when asked and
    absent, bring an older layout up to date, refuse an incompatible version."""
    sqlite = url.startswith("sqlite")
    try:
        with engine.connect() as conn:
            found = dict(conn.execute(sa.select(T_META.c.key, T_META.c.value)).all())
    except DBAPIError as exc:
        if not _missing_table(exc):
            raise
        if not create:
            raise StoreError(f"store {redact(url)} holds no automlperf run; start one with "
                             "`automlperf run` first") from None
        with engine.begin() as conn:
            meta.create_all(conn)
            if not sqlite:
                _number_epochs(conn)
            conn.execute(T_META.insert(), [{"key": "schema_version", "value": str(SCHEMA_VERSION)},
                                           {"key": "layout", "value": str(LAYOUT)}])
        return
    version = found.get("schema_version", "none")
    if version != str(SCHEMA_VERSION):
        raise SchemaMismatch(f"store {redact(url)} has schema version {version}; this "
                             f"automlperf reads version {SCHEMA_VERSION}. Use the version "
                             "that wrote it, or start a new run directory")
    if int(found.get("layout", "1")) < LAYOUT:
        _update_layout(engine, sqlite)


def _missing_table(exc: DBAPIError) -> bool:
    """The automlperf tables are not there (an empty database or file)."""
    return getattr(exc.orig, "sqlstate", None) == "42P01" or "no such table" in str(exc.orig)


def _update_layout(engine: sa.Engine, sqlite: bool) -> None:
    """Bring a store made by an earlier automlperf of the same schema version up to date.
    Each step may run twice (two processes opening the store at once)."""
    with engine.begin() as conn:
        inspect = sa.inspect(conn)
        if not inspect.has_table("amp_nodes"):
            T_NODES.create(conn)
        if not sqlite and not any(c["name"] == "seq" for c in inspect.get_columns("amp_epochs")):
            _number_epochs(conn)  # PostgreSQL numbers the rows already there
        if not sqlite:
            conn.exec_driver_sql("CREATE SEQUENCE IF NOT EXISTS amp_changes")
    _add_columns(engine, sqlite, "amp_samples", (("figures", "BLOB" if sqlite else "BYTEA"),
                                                 ("figure_keys", "TEXT")))
    _add_columns(engine, sqlite, "amp_epochs", (("val_skipped", "BIGINT NOT NULL DEFAULT 0"),
                                                ("device_share", "FLOAT"),
                                                ("compiled", "BOOLEAN NOT NULL DEFAULT FALSE"),
                                                ("decode_path", "TEXT NOT NULL DEFAULT ''"),
                                                ("cpu_decoded", "BIGINT NOT NULL DEFAULT 0"),
                                                ("val_loss", "DOUBLE PRECISION")))
    _add_columns(engine, sqlite, "amp_trials", (("changed", "BIGINT"),))
    _add_columns(engine, sqlite, "amp_replicas", (("changed", "BIGINT"), ("lease_until", "FLOAT")))
    with engine.begin() as conn:
        for index in (*T_TRIALS.indexes, *T_REPLICAS.indexes, *T_SAMPLES.indexes):
            index.create(conn, checkfirst=True)
        # Rows written before change numbers: numbered now, in their order, so that a first
        # read of the history finds them.
        for table in (T_TRIALS, T_REPLICAS):
            number = (sa.text("nextval('amp_changes')") if not sqlite else table.c.id)
            conn.execute(table.update().where(table.c.changed.is_(None)).values(changed=number))
        # Running trials had their lease extended by every heartbeat: their replicas' leases
        # are what those were.
        lease = (sa.select(sa.func.max(T_TRIALS.c.lease_until))
                 .where(T_TRIALS.c.replica_id == T_REPLICAS.c.id).scalar_subquery())
        conn.execute(T_REPLICAS.update().where(T_REPLICAS.c.lease_until.is_(None))
                     .values(lease_until=sa.func.coalesce(lease, T_REPLICAS.c.last_heartbeat)))
        stored = conn.execute(sa.select(T_META.c.value).where(T_META.c.key == "layout")).scalar()
        if stored is None:
            conn.execute(T_META.insert().values(key="layout", value=str(LAYOUT)))
        else:
            conn.execute(T_META.update().where(T_META.c.key == "layout").values(value=str(LAYOUT)))


def _number_epochs(conn: sa.Connection) -> None:
    """Epochs carry the order the store received them in, so a reader can ask for the ones
    after those it has: SQLite's rowid; on PostgreSQL an identity column."""
    conn.exec_driver_sql("ALTER TABLE amp_epochs ADD COLUMN IF NOT EXISTS seq BIGINT "
                         "GENERATED BY DEFAULT AS IDENTITY")
    conn.exec_driver_sql("CREATE INDEX IF NOT EXISTS amp_epochs_seq ON amp_epochs (seq)")


def _add_columns(engine: sa.Engine, sqlite: bool, table: str,
                 columns: tuple[tuple[str, str], ...]) -> None:
    """Columns added after a store was made: its existing rows get their default."""
    with engine.begin() as conn:
        have = {c["name"] for c in sa.inspect(conn).get_columns(table)}
    for name, kind in columns:
        if name in have:
            continue
        try:
            with engine.begin() as conn:
                conn.exec_driver_sql(f"ALTER TABLE {table} ADD COLUMN "
                                     + ("" if sqlite else "IF NOT EXISTS ") + f"{name} {kind}")
        except sa.exc.OperationalError as exc:
            # SQLite has no IF NOT EXISTS here: another process opening the store added it.
            if "duplicate column" not in str(exc):
                raise

