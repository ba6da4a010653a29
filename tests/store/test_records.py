"""A run's records exported as files and read back without a database, and the bundle's
manifest and archive: what the store holds comes back the same, and damage is named."""

import io
import json
import shutil
import tarfile

import pytest

from automlperf.graph import seeds
from automlperf.submission import bundle
from automlperf.measure.samples import sample_digest
from automlperf.search.morph import widen, widen_targets
from automlperf.store import Claim, EpochRecord, open_store
from automlperf.store.records import ExportedRecords, RecordsError, export_records


def _epoch(run_id, trial_id, n, t):
    return EpochRecord(trial_id=trial_id, epoch=n, started_at=t, ended_at=t + 10.5,
                       train_images=1000, val_images=200, steps=8, ops=10**15 + n,
                       train_loss=1.5 - n / 10, val_accuracy=0.5 + n / 100, precision="bf16",
                       batch_size=128, world_size=2, data_share=0.01, images_per_s=900.25,
                       run_id=run_id)


@pytest.fixture
def recorded(store_url, tmp_path):
    """A run in a store: a session, two replicas with node descriptions, three trials (one
    still running, one failed), epochs, and monitor samples with GPU and CPU counters."""
    store = open_store(store_url, create=True)
    run_id = store.create_run("r", {"run": {"duration_s": 600}}, {"host": "h", "ruleset": "x"},
                              600.0, 1000.0)
    seg = store.start_segment(run_id, 1000.0, 1600.0)
    reps = [store.register_replica(run_id, i, seg, f"node{i}", 40 + i, [f"cuda:{i}"], 1000.0)
            for i in range(2)]
    for i in range(2):
        store.record_node(run_id, i, seg, f"node{i}", {"devices": [f"cuda:{i}"],
                                                       "ceiling_ops": 1e12}, 1001.0)
    graph = seeds.resnet_small(num_classes=10, image_size=8, in_channels=1)
    ids = []
    for k in range(3):
        g = widen(graph, widen_targets(graph)[0], 1 + k).graph if k else graph
        trial = store.claim_trial(Claim(
            run_id=run_id, replica_id=reps[k % 2], replica_index=k % 2,
            graph_hash=g.content_hash(), graph_json=g.to_json(None),
            parent_id=ids[0] if ids else None, morphs=[{"op": "widen"}] if k else [], round=k,
            hparams={"batch_size": 128}, now=1000.0 + k, lease_s=60.0))
        ids.append(trial)
        for n in range(k + 1):
            store.record_epoch(_epoch(run_id, trial, n, 1010.0 + 20 * n + k))
    store.finish_trial(ids[0], "completed", 1100.0, best_accuracy=0.5, extra={"best_epoch": 0})
    store.finish_trial(ids[1], "failed", 1100.0, reason="oom: out of memory")
    for i in range(2):
        store.add_samples(run_id, f"node{i}", [
            {"t": 1000.0 + 5 * k, "cpu_percent": 50.5, "mem_used_gib": 3.25,
             "gpus": [{"index": 0, "uuid": f"GPU-{i}", "util": 97.0, "energy_mj": 1000 * k}],
             "cpu_energy_uj": {"pkg": [10**6 * k, 2**32]}} for k in range(12)])
    out = tmp_path / "bundle"
    exported = export_records(store, run_id, out)
    for t in store.trials(run_id):
        (out / "trials" / str(t.id)).mkdir(parents=True)
        (out / "trials" / str(t.id) / "graph.json").write_text(t.graph_json)
    yield store, run_id, out, exported
    store.close()


def test_exported_records_read_back_as_the_store_holds_them(recorded):
    store, run_id, out, exported = recorded
    assert (exported.trials, exported.epochs, exported.samples_written) == (3, 6, 24)
    records = ExportedRecords(out)
    run = records.run(run_id)
    assert {k: run[k] for k in ("id", "name", "created_at", "duration_s", "config", "system")} \
        == {k: v for k, v in store.run(run_id).items()}
    assert records.segments(run_id) == store.segments(run_id)
    assert records.replicas(run_id) == store.replicas(run_id)
    assert records.nodes(run_id) == store.nodes(run_id)
    assert records.trials(run_id) == store.trials(run_id)  # the graphs read from their files
    assert records.epochs(run_id) == store.epochs(run_id)
    assert records.samples(run_id) == store.samples(run_id)
    segments = store.segments(run_id)
    assert sample_digest(records.sample_figure_chunks(run_id), segments).energy() == \
        sample_digest(store.sample_figure_chunks(run_id), segments).energy()
    # Plain JSON Lines, one object per line, the store's field names.
    line = json.loads((out / "records" / "epochs" / "1.jsonl").read_text().splitlines()[0])
    assert line["trial_id"] == 1 and line["ops"] == 10**15


def test_a_selection_of_samples_is_exported(store_url, recorded, tmp_path):
    store, run_id, _, _ = recorded
    exported = export_records(store, run_id, tmp_path / "some", keep_sample=lambda i: i % 3 == 0)
    assert (exported.samples_stored, exported.samples_written) == (24, 8)
    assert len(ExportedRecords(tmp_path / "some").samples(run_id)) == 8


@pytest.mark.parametrize("damage, named", [
    ("records/trials.jsonl:2:{not json", "records/trials.jsonl line 2 is not JSON"),
    ("records/epochs/1.jsonl:1:{\"trial_id\": 1, \"epoch\": 0, \"ops\": \"many\"}",
     "records/epochs/1.jsonl record 1: "),
    ("records/segments.jsonl:1:[1, 2]", "records/segments.jsonl: every line must be a JSON object"),
    ("records/run.json:0:{\"format\": \"automlperf-records\", \"version\": 99, \"id\": 1}",
     "upgrade automlperf"),
    ("records/samples.jsonl:1:{\"node\": \"n\"}", "records/samples.jsonl: every sample must have a time t"),
])
def test_damaged_records_are_named(recorded, damage, named):
    store, run_id, out, _ = recorded
    name, line, text = damage.split(":", 2)
    path = out / name
    if int(line) == 0:
        path.write_text(text)
    else:
        lines = path.read_text().splitlines()
        lines[int(line) - 1] = text
        path.write_text("\n".join(lines) + "\n")
    records = ExportedRecords(out)
    with pytest.raises(RecordsError) as caught:
        for read in (records.run, records.segments, records.replicas, records.nodes,
                     records.trials, records.epochs, records.samples):
            read(run_id)
    assert named in str(caught.value)


def test_the_manifest_names_every_change(tmp_path):
    folder = tmp_path / "b"
    (folder / "records").mkdir(parents=True)
    (folder / "result.json").write_text("{}")
    (folder / "records" / "trials.jsonl").write_text("{}\n")
    (folder / "gone.txt").write_text("x")
    assert bundle.write_manifest(folder) == 3
    assert bundle.verify_manifest(folder) == []
    (folder / "result.json").write_text('{"score": 1}')
    (folder / "gone.txt").unlink()
    (folder / "added.txt").write_text("y")
    with open(folder / bundle.MANIFEST, "a") as f:
        f.write("not a line\n")
    problems = bundle.verify_manifest(folder)
    assert any(p.startswith("result.json: its SHA-256 differs") for p in problems)
    assert "gone.txt is missing (listed in MANIFEST.sha256)" in problems
    assert any(p.startswith("added.txt is not listed") for p in problems)
    assert any(p.startswith("MANIFEST.sha256 line 4 is not") for p in problems)
    (folder / bundle.MANIFEST).unlink()
    assert bundle.verify_manifest(folder) == ["MANIFEST.sha256 is missing: the bundle's files "
                                              "cannot be verified"]


def test_an_archive_opens_as_its_folder_and_nothing_else(tmp_path):
    folder = tmp_path / "b"
    (folder / "trials" / "1").mkdir(parents=True)
    (folder / "bundle.json").write_text("{}")
    (folder / "trials" / "1" / "graph.json").write_text("{}")
    bundle.write_manifest(folder)
    archive = tmp_path / "site.tar.gz"
    bundle.pack(folder, archive)
    with bundle.opened(archive) as source:
        assert source.bundle and source.archive == archive
        assert (source.root / "trials" / "1" / "graph.json").read_text() == "{}"
        assert bundle.verify_manifest(source.root) == []
        assert source.name(f"{source.root}/trials/1/graph.json: x") == "trials/1/graph.json: x"
        unpacked = source.root
    assert not unpacked.exists()  # the temporary folder is gone
    with tarfile.open(archive) as tar:
        assert tar.getnames()[:2] == ["site/bundle.json", "site/MANIFEST.sha256"]
    # What a hostile archive holds is refused before anything is written.
    for member, kind in (("../evil", tarfile.REGTYPE), ("site/link", tarfile.SYMTYPE),
                         ("/abs", tarfile.REGTYPE)):
        bad = tmp_path / "bad.tar.gz"
        with tarfile.open(bad, "w:gz") as tar:
            info = tarfile.TarInfo(member)
            info.type = kind
            info.linkname = "/etc/passwd" if kind == tarfile.SYMTYPE else ""
            tar.addfile(info, io.BytesIO(b"") if kind == tarfile.REGTYPE else None)
        with pytest.raises(bundle.BundleError, match="not a plain file inside the bundle"):
            with bundle.opened(bad):
                pass
    (tmp_path / "plain.txt").write_text("hello")
    with pytest.raises(bundle.BundleError, match="not a readable .tar.gz"):
        with bundle.opened(tmp_path / "plain.txt"):
            pass
    with pytest.raises(bundle.BundleError, match="does not exist"):
        with bundle.opened(tmp_path / "nowhere.tar.gz"):
            pass
    shutil.rmtree(folder)
