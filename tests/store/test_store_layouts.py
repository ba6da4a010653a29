"""A store an earlier automlperf made (an older layout of the same schema version) opens, is
brought up to date by whoever opens it first, and keeps what it holds."""

from dataclasses import replace

import pytest
import sqlalchemy as sa

from automlperf.store import open_store
from automlperf.store.feed import EpochFeed
from helpers import epoch_of as epoch
from helpers import new_claim, one_trial


def test_a_postgres_store_from_before_epoch_numbers_gets_them(pg_url):
    s = open_store(pg_url, create=True)
    run_id, t = one_trial(s)
    with s.engine.begin() as conn:  # as an automlperf before epoch numbers made it
        conn.exec_driver_sql("ALTER TABLE amp_epochs DROP COLUMN seq")
        conn.exec_driver_sql("DELETE FROM amp_meta WHERE key = 'layout'")
    s.record_epoch(epoch(run_id, t, 0))
    s.close()
    s = open_store(pg_url)
    s.record_epoch(epoch(run_id, t, 1))
    assert [e.epoch for _, e in EpochFeed(s, run_id).read()] == [0, 1]
    s.close()


def test_a_store_from_before_node_descriptions_gets_their_table(tmp_path):
    """Schema 1 stores made without the nodes table still open, and gain it."""
    url = f"sqlite:///{tmp_path / 'old.db'}"
    s = open_store(url, create=True)
    run_id = s.create_run("r", {}, {}, 60.0, 1.0)
    s.close()
    engine = sa.create_engine(url)
    with engine.begin() as conn:  # as an automlperf before node descriptions made it
        conn.exec_driver_sql("DROP TABLE amp_nodes")
        conn.exec_driver_sql("DELETE FROM amp_meta WHERE key = 'layout'")
    engine.dispose()
    s = open_store(url)
    assert s.nodes(run_id) == [] and s.run(run_id)["name"] == "r"
    s.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def sql_url(request, tmp_path):
    """A database's URL (the store service serves one of these)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'history.db'}"
    return request.getfixturevalue("pg_url")


def test_a_store_from_before_change_numbers_gets_them(sql_url):
    """A store an earlier automlperf made (no change numbers, leases on the trials) opens,
    numbers its trials and replicas, and keeps its running trials' leases."""
    s = open_store(sql_url, create=True)
    run_id, t = one_trial(s)  # claimed at 1.0 with a lease of 60 s
    with s.engine.begin() as conn:
        for index in ("amp_trials_changed", "amp_trials_running", "amp_replicas_changed",
                      "amp_samples_node"):
            conn.exec_driver_sql(f"DROP INDEX {index}")
        for table, column in (("amp_trials", "changed"), ("amp_replicas", "changed"),
                              ("amp_replicas", "lease_until")):
            conn.exec_driver_sql(f"ALTER TABLE {table} DROP COLUMN {column}")
        if not s.url.startswith("sqlite"):
            conn.exec_driver_sql("DROP SEQUENCE amp_changes")
        conn.exec_driver_sql("DELETE FROM amp_meta WHERE key = 'layout'")
    s.close()
    s = open_store(sql_url)
    assert [c.id for c in s.changes(run_id, 0).rows] == [t]
    (rep,) = s.replicas(run_id)
    assert s.expire_leases(run_id, 50.0) == []  # the lease its trial had
    assert s.heartbeat(rep.id, 50.0, 60.0).index == 0
    assert s.expire_leases(run_id, 100.0) == []  # extended by the beat
    assert s.expire_leases(run_id, 120.0) == [t]
    assert [c.status for c in s.changes(run_id, 0).rows] == ["failed"]


def test_a_store_from_before_the_device_share_gets_its_column(tmp_path):
    """Epochs stored before the device's side was measured apart read as None (not measured);
    the column is added when the store is opened, and later epochs keep their figure."""
    url = f"sqlite:///{tmp_path / 'old.db'}"
    s = open_store(url, create=True)
    run_id, t = one_trial(s)
    s.close()
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE amp_epochs DROP COLUMN device_share")
        conn.exec_driver_sql("DELETE FROM amp_meta WHERE key = 'layout'")  # none was kept then
        conn.exec_driver_sql(
            "INSERT INTO amp_epochs (trial_id, epoch, run_id, started_at, ended_at, train_images,"
            " val_images, steps, ops, train_loss, val_accuracy, precision, batch_size, world_size,"
            " data_share, images_per_s, skipped_images, val_skipped) VALUES "
            f"({t}, 0, {run_id}, 100, 101, 1000, 200, 8, 1000, 1.5, 0.5, 'bf16', 128, 2, 0.3,"
            " 900, 0, 0)")
    engine.dispose()
    s = open_store(url)
    s.record_epoch(replace(epoch(run_id, t, 1), device_share=0.6))
    assert [(e.epoch, e.data_share, e.device_share) for e in s.epochs(run_id)] == \
        [(0, 0.3, None), (1, 0.01, 0.6)]
    s.close()


def test_a_store_from_before_validation_losses_gets_their_column(tmp_path):
    """Epochs recorded before the validation loss was kept read back with none; new ones
    keep theirs."""
    url = f"sqlite:///{tmp_path / 'old.db'}"
    s = open_store(url, create=True)
    run_id = s.create_run("r", {}, {}, 60.0, 1.0)
    seg = s.start_segment(run_id, 1.0, 61.0)
    rep = s.register_replica(run_id, 0, seg, "node1", 42, ["cpu"], 1.0)
    t = s.claim_trial(new_claim(run_id=run_id, replica_id=rep, replica_index=0, graph_hash="h"))
    s.record_epoch(epoch(run_id, t, 0))
    s.close()
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE amp_epochs DROP COLUMN val_loss")
        conn.exec_driver_sql("UPDATE amp_meta SET value = '2' WHERE key = 'layout'")
    engine.dispose()
    s = open_store(url)
    s.record_epoch(replace(epoch(run_id, t, 1), val_loss=0.875))
    assert [e.val_loss for e in s.epochs(run_id)] == [None, 0.875]
    s.close()
