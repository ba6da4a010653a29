"""Scale of the control plane: connections a replica holds, a store too small refused before
the run, the primary's live view reading only what is new, and check and the report on a
run of thousands of trials."""

import json
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import sqlalchemy as sa

from automlperf.config import Config
from automlperf.store import EpochRecord, open_store
from automlperf.store import connections
from automlperf.store.base import StoreError
from automlperf.store.rundir import RunDir
from helpers import cli, cli_args, new_claim, wait_for

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _large_run():
    """bench/large_run.py, the generator of long runs, imported from the bench folder."""
    sys.path.insert(0, str(BENCH))
    try:
        import large_run
    finally:
        sys.path.remove(str(BENCH))
    return large_run


def epoch(run_id, trial_id, n, at, acc=0.5):
    return EpochRecord(trial_id=trial_id, epoch=n, started_at=at - 10.0, ended_at=at,
                       train_images=1000, val_images=200, steps=8, ops=10**12 + n, train_loss=1.0,
                       val_accuracy=acc, precision="fp32", batch_size=128, world_size=1,
                       data_share=0.01, images_per_s=100.0, run_id=run_id)


class Counting:
    """A real store that counts the calls made to it and the rows each returned."""

    def __init__(self, store):
        self.store = store
        self.calls = Counter()
        self.rows = Counter()

    def __getattr__(self, name):
        attr = getattr(self.store, name)
        if not callable(attr):
            return attr

        def counted(*args, **kwargs):
            out = attr(*args, **kwargs)
            self.calls[name] += 1
            rows = getattr(out, "rows", out)  # a list, or Changes
            if isinstance(rows, list):
                self.rows[name] += len(rows)
            return out

        return counted


def test_the_live_view_reads_only_what_is_new(store_url, tmp_path):
    from automlperf.runner.session import LiveView, Session

    store = open_store(store_url, create=True)
    now = time.time()
    run_id = store.create_run("r", {}, {}, 3600.0, now - 100)
    seg = store.start_segment(run_id, now - 100, now + 3500)
    reps = [store.register_replica(run_id, i, seg, f"n{i}", i, [], now - 100) for i in range(4)]
    trials = [store.claim_trial(new_claim(run_id=run_id, replica_id=reps[i % 4], replica_index=i % 4,
                                          graph_hash=f"h{i}", now=now - 90, lease_s=600.0))
              for i in range(8)]
    for n in range(40):  # 320 epochs
        for i, t in enumerate(trials):
            store.record_epoch(epoch(run_id, t, n, now - 80 + n, acc=0.1 + 0.01 * i + 0.001 * n))
    for t in trials[:4]:
        store.finish_trial(t, "completed", now - 30)
    counting = Counting(store)
    session = Session(RunDir(tmp_path), counting, run_id, Config(), seg, now - 100, now + 3500, 0.0)
    view = LiveView(session)
    view.view(now, ["up"] * 4)
    assert counting.rows["epochs_after"] == 320 and counting.rows["changes"] == 8
    later = [store.claim_trial(new_claim(run_id=run_id, replica_id=reps[i], replica_index=i,
                                         graph_hash=f"new{i}", round=1, now=now, lease_s=600.0))
             for i in range(2)]
    for t in later:
        for n in range(3):
            store.record_epoch(epoch(run_id, t, n, now + n, acc=0.9))
    counting.calls.clear()
    counting.rows.clear()
    shown = view.view(now + 5, ["up"] * 4)
    # What is new: nothing that grows with the history.
    assert set(counting.calls) == {"epochs_after", "changes"}
    assert counting.rows["epochs_after"] == 6 and counting.rows["changes"] == 2
    epochs = store.epochs(run_id)
    assert view.epochs == len(epochs) == 326  # all inside the session: every one counts
    assert view.ops == sum(e.ops for e in epochs) and view.best == 0.9
    assert view.done_epochs[later[1]] == 3
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(shown)
    text = console.export_text()
    assert "0.9000" in text and "4 done, 6 running" in text
    assert "326 epochs" in view.line(now + 6, ["up"] * 4)
    # Many replicas: a row per process state, not one per replica.
    console = Console(width=200, record=True)
    console.print(view.view(now + 7, ["up"] * 38 + ["exited"] * 2))
    rows = [[w for w in line.split() if w != "│"] for line in console.export_text().splitlines()]
    assert ["up", "38", "4", "0", "6", "0.9000"] in rows and ["exited", "2", "0", "0", "0", "-"] in rows
    store.close()


def test_a_replica_holds_one_connection(pg_url, tmp_path):
    """A store's threads share one pooled connection (a second only while two overlap); a
    TPE study is a journal file and opens none. The connections are counted as the client
    opens and closes them (exact at every instant); the server's view is checked at the end,
    once its backends have had time to exit."""
    from automlperf.search.hpo import HyperSearch, journal_path

    lock = threading.Lock()
    count = {"open": 0, "peak": 0}

    def opened(*_):
        with lock:
            count["open"] += 1
            count["peak"] = max(count["peak"], count["open"])

    def closed(*_):
        with lock:
            count["open"] -= 1

    sa.event.listen(sa.pool.Pool, "connect", opened)
    sa.event.listen(sa.pool.Pool, "close", closed)
    try:
        store = open_store(pg_url, create=True)
        hpo = HyperSearch(journal_path(tmp_path, 0), "s", (32, 128), [3, 5], startup_trials=1)
        run_id = store.create_run("r", {}, {}, 60.0, 1.0)
        seg = store.start_segment(run_id, 1.0, 100.0)
        rep = store.register_replica(run_id, 0, seg, "n", 1, [], 1.0)
        assert count["open"] == connections.POOL_SIZE
        count["peak"] = count["open"]

        def work(k):
            for i in range(20):
                t = store.claim_trial(new_claim(run_id=run_id, replica_id=rep, replica_index=0,
                                                graph_hash=f"{k}-{i}"))
                store.record_epoch(epoch(run_id, t, 0, 50.0))
                store.changes(run_id, 0)
                store.heartbeat(rep, 2.0, 60.0)

        workers = [threading.Thread(target=work, args=(k,)) for k in range(3)]
        for w in workers:
            w.start()
        for _ in range(3):
            s = hpo.ask()
            hpo.tell(s.number, 0.5)
        for w in workers:
            w.join()
        assert count["peak"] <= connections.PER_PROCESS
        assert count["open"] == connections.POOL_SIZE  # none kept by the study
        assert len(store.epochs(run_id)) == 60
    finally:
        sa.event.remove(sa.pool.Pool, "connect", opened)
        sa.event.remove(sa.pool.Pool, "close", closed)
    probe = sa.create_engine(pg_url, poolclass=sa.pool.NullPool)

    def held():
        with probe.connect() as conn:
            return conn.execute(sa.text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid()")).scalar()

    wait_for(lambda: held() == connections.POOL_SIZE, 120, "the server to see one connection")
    store.close()
    probe.dispose()


@pytest.mark.slow
@pytest.mark.postgres
def test_a_store_too_small_for_the_run_is_refused_before_it_starts(tmp_path):
    from automlperf.store.pgserver import PostgresServer

    small = PostgresServer(tmp_path / "small", max_connections=8)  # 3 kept for superusers
    url = small.start()
    try:
        done = cli("run", "--replicas", 8, "--store", url, "--run-dir", tmp_path / "run",
                   "--duration", "1m")
        # A batch script is refused on the login node, not in the queue.
        script = cli("slurm", "--nodes", 8, "--store", url, "--run-dir", tmp_path / "job",
                     "--duration", "1m")
    finally:
        small.stop()
    for refused in (done, script):
        assert refused.returncode == 2
        (line,) = refused.stderr.strip().splitlines()
        assert "raise max_connections to at least" in line and "a run opens up to 6" in line \
            and "however many replicas (8 here)" in line, line
        assert small.password not in refused.stderr + refused.stdout
    # Nothing written: the same command can run again.
    assert not (tmp_path / "run").exists() and not (tmp_path / "job").exists()
    sized = PostgresServer(tmp_path / "sized", max_connections=connections.server_size(10_000))
    url = sized.start()
    try:
        engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
        with engine.connect() as conn:
            assert connections.shortfall(connections.capacity(conn), 10_000) is None
            assert conn.execute(sa.text("SHOW max_connections")).scalar() == \
                str(connections.server_size(10_000))
        engine.dispose()
        connections.check_room(url, 10_000)
    finally:
        sized.stop()


@pytest.mark.slow
@pytest.mark.postgres
def test_an_open_file_limit_too_small_for_the_replicas_is_refused_before_it_starts(tmp_path,
                                                                                   pg_url):
    """The store service holds a connection per replica and inherits the primary's limit on
    open files: where the hard limit cannot hold them, the run is refused in one line that
    names the limit, before anything is written."""
    import resource

    def limited():
        resource.setrlimit(resource.RLIMIT_NOFILE, (150, 150))

    done = subprocess.run(cli_args("run", "--replicas", 40, "--store", pg_url, "--run-dir",
                                   tmp_path / "run", "--duration", "1m"),
                          capture_output=True, text=True, timeout=600, preexec_fn=limited)
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "needs 228 open files for 40 replicas" in line and "at most 150" in line
    assert "ulimit -Hn" in line
    assert not (tmp_path / "run").exists()
    connections.check_open_files(10_000, 20_000)  # this machine's limit holds 10,000
    with pytest.raises(StoreError, match="needs 16724 open files"):
        connections.check_open_files(10_000, 4096)


def test_connection_arithmetic():
    # The replicas reach the database through the run's store service: none of their own.
    assert connections.needed(1) == connections.needed(10_000) == \
        connections.SERVICE + connections.PRIMARY
    assert connections.server_size(10_000) == connections.PRIVATE_MIN
    cap = connections.Capacity(max_connections=100, reserved=3, in_use=7, role_limit=-1,
                               database_limit=40, database_in_use=5, role_in_use=7)
    assert cap.available() == 35
    assert connections.shortfall(cap, 10_000) is None
    cap.database_limit = 8
    why = connections.shortfall(cap, 20)
    assert "CONNECTION LIMIT 8" in why and "up to 6" in why


@pytest.mark.slow
def test_a_ten_thousand_replica_external_run_is_accepted(tmp_path, pg_url):
    """10,000 replicas (the size measured) are accepted: the primary starts the store
    service, waits for them and watches them until the deadline (nobody joins here); one more
    is refused, in one line."""
    (tmp_path / "c.toml").write_text('[run]\nduration_s = 8\nstop_grace_s = 5\n'
                                     '[data]\ndataset = "digits"\n')
    done = cli("run", "--launcher", "external", "--replicas", 10_000, "--config",
               tmp_path / "c.toml", "--run-dir", tmp_path / "run", "--store", pg_url,
               "--small-task", timeout=300)
    assert "waiting for 10000 replica(s)" in done.stderr, done.stdout + done.stderr
    assert done.returncode == 1 and "only 0 of 10000 replica(s) joined" in done.stderr
    assert "replicas 10000 waiting" in done.stderr  # the watch: a count per state
    assert (tmp_path / "run" / "logs" / "store-service.log").exists()
    refused = cli("run", "--launcher", "external", "--replicas", 10_001, "--run-dir",
                  tmp_path / "other", "--duration", "1m")
    assert refused.returncode == 2 and "run.replicas: Input should be less than or equal to " \
        "10000" in refused.stderr


def test_the_samples_of_a_sampler_reach_the_store_through_its_replica(tmp_path):
    from automlperf.measure.monitor import SampleCopier

    store = open_store(f"sqlite:///{tmp_path / 'h.db'}", create=True)
    run_id = store.create_run("r", {}, {}, 60.0, 1.0)
    lines = ['{"t": 1.0, "cpu_percent": 5}\n', '{"t": 2.0, "cpu_per', '{"t": 3.0, "cpu_percent": 7}\n']
    copier = SampleCopier(iter(lines), store, run_id, "node1")
    copier.join(timeout=60)
    assert [(s["t"], s["node"]) for s in store.samples(run_id)] == [(1.0, "node1"), (3.0, "node1")]
    assert copier.stored == 2


@pytest.mark.slow
def test_check_and_the_report_at_a_thousand_trials(tmp_path):
    """A generated run past the report's table size: check verifies it, the report lists the
    best trials (every trial in trials.csv beside it) and stays small."""
    large_run = _large_run()
    from automlperf.submission.check import check_run
    from automlperf.report.html import TABLE_ROWS, write_report

    made = large_run.generate(tmp_path / "run", trials=1100, epochs=5_500, replicas=32,
                              seed_model="resnet_small", samples=False)
    checked = check_run(tmp_path / "run")
    assert checked.ok, checked.mismatches[:5]
    assert checked.checked["trials"] == 1100 and checked.checked["epochs"] == made["epochs"]
    report = write_report(tmp_path / "run")
    html = report.read_text()
    body = html[html.index('<table id="trials">'):]
    assert body[: body.index("</table>")].count("<tr") == TABLE_ROWS + 1
    assert "most accurate others, 1,000 of 1,100" in html
    # The search's progress over the whole run: every child with a prediction is counted.
    from automlperf.report.progress import gp_ranking
    from automlperf.store import open_store

    store = open_store(run_dir=tmp_path / "run")
    ranking = gp_ranking(store.trials(1))
    store.close()
    assert ranking.ranked_above + ranking.others > 1000
    assert (f"Of {ranking.ranked_above:,} children the Gaussian process ranked above their "
            "parent") in html
    assert 'aria-label="lineage of the best model: accuracy at birth and reached"' in html
    assert report.stat().st_size < 2_000_000
    lines = (tmp_path / "run" / "trials.csv").read_text().splitlines()
    assert len(lines) == 1101 and lines[0].startswith("id,parent,replica")


def test_a_report_of_more_replicas_than_it_lists_keeps_every_one_in_replicas_csv(
        tmp_path, monkeypatch):
    """Past the report's replica rows (at 10,000 replicas a row each made a 13 MB report),
    its time and provenance tables list the replicas that trained least and those with the
    lowest ceilings; every replica is in replicas.csv beside it."""
    large_run = _large_run()
    import csv

    from automlperf.report import html as report

    large_run.generate(tmp_path / "run", trials=60, epochs=600, replicas=40,
                       seed_model="resnet_small", samples=False)
    monkeypatch.setattr(report, "REPLICA_ROWS", 8)
    page = report.write_report(tmp_path / "run").read_text()
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    shares = {r["replica"]: r["training_s"] / r["session_s"]
              for r in result["time_breakdown"]["replicas"]}
    least = sorted(shares, key=shares.get)[:8]
    time_table = page[page.index('<section id="time">'):]
    time_table = time_table[:time_table.index("</table>")]
    assert time_table.count("<tr><td>") == 8 + 1  # and the total over all 40
    assert all(f"<tr><td>{i}</td>" in time_table for i in least)
    assert "The 8 of 40 replicas that spent the least of their time training" in page
    provenance = page[page.index('<section id="provenance">'):]
    assert provenance.count("<tr><td>replica ") == 8
    assert "and 32 more (<code>replicas.csv</code>)" in page
    rows = list(csv.DictReader((tmp_path / "run" / "replicas.csv").open()))
    assert [int(r["replica"]) for r in rows] == list(range(40))
    assert all(r["host"] and r["training_s"] and r["session_s"] for r in rows)


def test_a_replicas_history_reads_only_what_changed(store_url):
    """A history refresh reads the trials claimed or ended since the last one (counted), and
    the graphs the search asks for, once each while they are kept."""
    from automlperf.graph import seeds
    from automlperf.store.history import History

    store = open_store(store_url, create=True)
    run_id = store.create_run("r", {}, {}, 3600.0, 1.0)
    seg = store.start_segment(run_id, 1.0, 3600.0)
    reps = [store.register_replica(run_id, i, seg, f"n{i}", i, [], 1.0) for i in range(4)]
    graph = seeds.seed("resnet_small", 10, 8, 1).to_json(None)
    trials = [store.claim_trial(new_claim(run_id=run_id, replica_id=reps[i % 4], replica_index=i % 4,
                                          graph_hash=f"h{i}", graph_json=graph, now=2.0,
                                          lease_s=600.0)) for i in range(200)]
    for t in trials[:150]:
        store.finish_trial(t, "completed", 3.0, best_accuracy=0.5)
    counting = Counting(store)
    history = History(run_id)
    assert history.refresh(counting) == 200 and counting.rows["changes"] == 200
    assert history.completed == 150 and history.claimed[3] == 50 and len(history) == 200
    # Ten trials claimed, five of them ended since: each read once, as it stands now (not
    # the 210 trials).
    later = [store.claim_trial(new_claim(run_id=run_id, replica_id=reps[0], replica_index=0,
                                         graph_hash=f"new{i}", graph_json=graph, round=1, now=4.0,
                                         lease_s=600.0)) for i in range(10)]
    for t in later[:5]:
        store.finish_trial(t, "completed", 5.0, best_accuracy=0.9)
    counting.rows.clear()
    assert history.refresh(counting) == 10 and counting.rows["changes"] == 10
    models = history.models()
    assert [m.id for m in models] == trials + later
    assert [m.accuracy for m in models[-10:]] == [0.9] * 5 + [None] * 5
    assert history.refresh(counting) == 0
    # Graphs: fetched when asked for, in one read, and kept.
    assert counting.calls["graphs"] == 0
    history.prefetch([m.id for m in models[:20]])
    assert counting.calls["graphs"] == 1 and history.graphs_read == 20
    assert models[3].graph.content_hash() == "h3"  # the stored hash, as the search knows it
    assert counting.calls["graphs"] == 1
    store.close()


def test_a_replica_stores_its_nodes_samples_in_batches(tmp_path):
    """Ten minutes of samples every 30 s reach the store in two writes, not twenty-one: a
    batch once it spans five minutes, and the rest when the sampler stops."""
    from automlperf.measure.monitor import SampleCopier

    store = open_store(f"sqlite:///{tmp_path / 'h.db'}", create=True)
    run_id = store.create_run("r", {}, {}, 60.0, 1.0)
    counting = Counting(store)
    lines = [f'{{"t": {30.0 * i}, "cpu_percent": 5}}\n' for i in range(21)]
    copier = SampleCopier(iter(lines), counting, run_id, "node1")
    copier.join(timeout=60)
    assert counting.calls["add_samples"] == 2 and copier.stored == 21
    assert [s["t"] for s in store.samples(run_id)] == [30.0 * i for i in range(21)]
    store.close()


def test_a_sample_copier_survives_stray_lines_and_a_failing_store(tmp_path, caplog,
                                                                  monkeypatch):
    """A library's stray line, a sample whose time is not a number, and a store that fails
    twice: the copier goes on, says so once, and stores every sample once the store passes,
    in calls of at most the store's limit (here 3)."""
    import logging

    from automlperf.measure.monitor import SampleCopier
    from automlperf.store import limits

    monkeypatch.setattr(limits, "MAX_SAMPLES", 3)
    sizes = []

    store = open_store(f"sqlite:///{tmp_path / 'h.db'}", create=True)
    run_id = store.create_run("r", {}, {}, 60.0, 1.0)

    class Failing(Counting):
        def add_samples(self, *args):
            self.calls["add_samples"] += 1
            sizes.append(len(args[2]))
            if self.calls["add_samples"] <= 2:
                raise TypeError("a bug in a client")
            return self.store.add_samples(*args)

    failing = Failing(store)
    lines = ['{"t": "soon"}\n', "[" * 5000 + "\n", "a library's stray line\n"] + [
        f'{{"t": {300.0 * i}, "cpu_percent": 5}}\n' for i in range(4)]
    caplog.set_level(logging.WARNING, logger="automlperf")
    copier = SampleCopier(iter(lines), failing, run_id, "node1")
    copier.join(timeout=60)
    assert not copier.thread.is_alive() and copier.stored == 4
    assert sizes == [2, 3, 3, 1]
    assert [s["t"] for s in store.samples(run_id)] == [0.0, 300.0, 600.0, 900.0]
    assert sum("samples not stored (TypeError" in r.getMessage() for r in caplog.records) == 1
    store.close()


def test_a_timed_generated_run_trains_every_node_until_its_deadline(tmp_path):
    """bench/large_run.py's timed shape, as a real run ends: every replica claims trials
    until the deadline, the trial running then keeps the epochs that ended before it and
    stops, and check verifies what was generated."""
    large_run = _large_run()
    from automlperf.submission.check import check_run

    made = large_run.generate(tmp_path / "run", replicas=5, duration_s=1500.0,
                              seed_model="resnet_small", node_ops=1e15)
    # Every node sampled every 30 s from its start to the deadline.
    assert made["duration_s"] == 1500 and 5 * 49 <= made["samples"] <= 5 * 50
    deadline = 1_800_000_000.0 + 1500.0
    records = [json.loads(line) for log in (tmp_path / "run" / "trials").glob("*/log.jsonl")
               for line in log.read_text().splitlines()]
    trials = [r for r in records if r["type"] == "trial"]
    epochs = [r for r in records if r["type"] == "epoch"]
    assert len(trials) == made["trials"] > 5 and len(epochs) == made["epochs"]
    assert max(e["ended_at"] for e in epochs) <= deadline
    stopped = [t for t in trials if t["status"] == "stopped"]
    # Each replica's last trial, and only those, ran into the deadline.
    assert len(stopped) == 5 and all(t["reason"] == "deadline reached" for t in stopped)
    assert {t["status"] for t in trials} <= {"completed", "failed", "stopped"}
    checked = check_run(tmp_path / "run")
    assert checked.ok, checked.mismatches[:5]


def test_check_verifies_a_run_written_before_a_default_changed_and_names_an_edit(tmp_path):
    """A setting written out when the run was written has a different default now (as
    data.gpu_decode went from false to unset, automatic): the configuration file is still
    the one the run started with. An edited setting is still named."""
    large_run = _large_run()
    import tomllib

    import sqlalchemy as sa

    from automlperf.submission.check import check_run
    from automlperf.store import open_store

    run = tmp_path / "run"
    large_run.generate(run, trials=12, epochs=60, replicas=3, seed_model="resnet_small",
                       samples=False)
    store = open_store(run_dir=run)
    with store.engine.begin() as conn:
        stored = json.loads(conn.execute(sa.text("SELECT config FROM amp_runs")).scalar())
        assert stored["data"]["gpu_decode"] is None
        stored["data"]["gpu_decode"] = False  # as an earlier version stored it
        conn.execute(sa.text("UPDATE amp_runs SET config = :c"), {"c": json.dumps(stored)})
    store.close()
    toml = (run / "config.toml").read_text()
    assert "gpu_decode" not in toml and "[data]\n" in toml
    old = toml.replace("[data]\n", "[data]\ngpu_decode = false\n")
    (run / "config.toml").write_text(old)
    checked = check_run(run)
    assert checked.ok, checked.mismatches[:5]
    heartbeat = tomllib.loads(old)["run"]["heartbeat_s"]
    (run / "config.toml").write_text(old.replace(f"heartbeat_s = {heartbeat!r}",
                                                 f"heartbeat_s = {heartbeat * 2!r}"))
    checked = check_run(run)
    assert any("config.toml differs from the configuration the run was started with" in m
               for m in checked.mismatches)
