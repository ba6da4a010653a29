"""The official data proven by the run's own computation: the archives' MD5s against the
ruleset's table (here a test table of small generated archives) before every session's clock,
their identity held by every process that opens them, and `check` holding the recorded MD5s
to the published ones and a list keeper's own archives to the recorded ones. Each way to get
an official label on other data is refused, naming what is wrong. `verify-data` stays a
site's tool for an extracted folder."""

import gzip
import io
import json
import os
import shutil

import pytest
from PIL import Image

from automlperf import rules
from automlperf.config import Config, ConfigError
from automlperf.dataset.archive import NAMES, scan_archives
from automlperf.dataset.proof import CHANGED, DataChanged
from automlperf.dataset.verify import verify_folder
from automlperf.measure.result import data_changes
from automlperf.runner import nodedata, session
from automlperf.runner.session import record_origin
from automlperf.store import open_store
from automlperf.submission.result_check import _check_archives
from automlperf.testing.archives import write_devkit
from helpers import cli
from trees import make_tree, official_archives

CLASSES = rules.IMAGENET_1K.classes[:5]


def official(data_dir, strict=True):
    return Config.parse({"run": {"official": strict}, "data": {"data_dir": str(data_dir)}})


def other_jpeg(size=(4, 4), colour=(10, 200, 30)):
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, format="JPEG")
    return buf.getvalue()


@pytest.fixture
def archives(tmp_path, monkeypatch):
    """A small tree's archives, proven against the test table the test's environment names."""
    root = make_tree(tmp_path / "imagenet", classes=CLASSES)
    official_archives(root, tmp_path / "archives", monkeypatch)
    return tmp_path / "archives"


def test_an_official_run_proves_the_archives_and_records_its_proof(archives, tmp_path):
    origin = record_origin(official(archives), run_dir=tmp_path / "run")
    identity = origin["dataset_identity"]
    assert identity["problems"] == [] and identity["source"] == "archives"
    assert (identity["train_images"], identity["val_images"], identity["classes"]) == (10, 5, 5)
    proof = identity["proof"]
    assert proof["table"] == "test" and set(proof["archives"]) == {"train", "val", "devkit"}
    assert all(proof["archives"][p]["inode"] == (archives / NAMES[p]).stat().st_ino
               for p in NAMES)
    assert origin["startup"]["dataset_index"] == "proven" and origin["startup"]["data_proof_s"] > 0
    assert (tmp_path / "run" / "dataset-index" / "at.npy").exists()
    # Never official: the table is a test's (measure/result.py's judgement, check's too).
    from automlperf.measure.result import dataset_is_official

    official_data, why = dataset_is_official(official(archives), [], identity, rules.CURRENT)
    assert not official_data and "test table of MD5s" in why


def test_a_folder_with_a_hand_written_manifest_is_refused_as_official(tmp_path):
    """The proof of earlier rulesets was a manifest beside the folder; anyone could write one.
    From aiperf-2021.4 a folder, however proven, is never official: the refusal names the
    archives an official run reads."""
    root = make_tree(tmp_path / "imagenet", classes=CLASSES)
    text = json.dumps({"format": "automlperf-data-manifest", "version": 1, "files": 0}) + "\n"
    (root / "automlperf-manifest.tsv.gz").write_bytes(gzip.compress(text.encode()))
    with pytest.raises(ConfigError) as info:
        record_origin(official(root))
    message = str(info.value)
    assert message.startswith("official run refused: ") and "\n" not in message
    assert f"{root} is a folder of images" in message and "aiperf-2021.4" in message
    assert all(name in message for name in NAMES.values()) and "--unofficial" in message
    # Declared unofficial, it goes on, the reason recorded.
    origin = record_origin(official(root, strict=False))
    assert "reads ImageNet-1k only from its official archives" in origin["dataset_identity"]["problems"][0]


def test_an_archive_with_one_members_bytes_changed_is_refused(archives):
    index = scan_archives(archives).index
    train = archives / NAMES["train"]
    data = bytearray(train.read_bytes())
    data[int(index.at[3]) + int(index.sizes[3]) - 3] ^= 0xFF
    train.write_bytes(bytes(data))
    with pytest.raises(ConfigError, match=f"official run refused: .*{train}: MD5 [0-9a-f]{{32}}, but "
                       "the test table's ILSVRC2012_img_train.tar has [0-9a-f]{32}: not the "
                       "official archive"):
        record_origin(official(archives))


def test_a_devkit_with_two_labels_swapped_is_refused(archives):
    index = scan_archives(archives).index
    truth = [index.relative(r).split("/")[1] for r in sorted(
        index.rows("val"), key=lambda r: index.relative(r).split("/")[-1])]
    truth[0], truth[1] = truth[1], truth[0]
    write_devkit(archives / NAMES["devkit"], sorted(CLASSES), truth)
    with pytest.raises(ConfigError, match=f"official run refused: .*{archives / NAMES['devkit']}: "
                       "MD5 .*the test table's ILSVRC2012_devkit_t12.tar.gz has"):
        record_origin(official(archives))


def test_an_archive_replaced_between_the_proof_and_a_replicas_open_is_named(archives, tmp_path):
    origin = record_origin(official(archives), run_dir=tmp_path / "run")
    system = {"dataset_identity": origin["dataset_identity"]}
    here = nodedata.for_replica(tmp_path / "run", archives, system)
    assert here.record["source"] == "shared" and here.data_dir == archives
    val = archives / NAMES["val"]
    shutil.copyfile(val, tmp_path / "other.tar")  # the same bytes, another file
    os.replace(tmp_path / "other.tar", val)
    with pytest.raises(DataChanged, match=f"{val} {CHANGED}: .*inode") as info:
        nodedata.for_replica(tmp_path / "run", archives, system)
    # The replica gives up with that reason; the result is not valid, naming the file.
    changed = data_changes(system, [{"replica": 1, "host": "n2", "reason": str(info.value)}], [])
    assert changed == [f"replica 1 (n2): {info.value}"]


def test_a_resume_over_a_changed_archive_is_refused(archives, tmp_path):
    run_dir = tmp_path / "run"
    first = session.prepare(official(archives), run_dir, None, False, {"host": "here"})
    first.store.end_segment(first.run_id, first.segment, first.started_at)
    first.store.close()
    # Unchanged: the resumed session proves the archives again and records its proof.
    again = session.prepare(None, run_dir, None, True, {"host": "here"})
    again.store.close()
    system = open_store(run_dir=run_dir).run(1)["system"]
    assert len(system["data_sessions"]) == 1 and system["data_sessions"][0]["proof"]["table"] == "test"
    assert json.loads((run_dir / "system.json").read_text()) == system
    val = archives / NAMES["val"]
    data = bytearray(val.read_bytes())
    data[-2000] ^= 0xFF
    val.write_bytes(bytes(data))
    with pytest.raises(ConfigError, match=f"official run refused: this session's archives are "
                       f"not the ones the run proved: {val}: MD5 .*; {val} {CHANGED} in the "
                       "run's first session"):
        session.prepare(None, run_dir, None, True, {"host": "here"})


def test_an_archive_changed_during_a_session_is_named_at_its_end(archives, tmp_path):
    """The primary looks at the archives again when its session ends: one replaced during it
    is recorded with the session's proof, and the result's judgement names it."""
    from automlperf.runner import dataproof
    from automlperf.store.rundir import RunDir

    run_dir = tmp_path / "run"
    s = session.prepare(official(archives, strict=False), run_dir, None, False, {"host": "here"})
    try:
        assert dataproof.recheck(s.store, RunDir(run_dir), s.run_id, s.config) == []
        train = archives / NAMES["train"]
        shutil.copyfile(train, tmp_path / "other.tar")
        os.replace(tmp_path / "other.tar", train)
        (changed,) = dataproof.recheck(s.store, RunDir(run_dir), s.run_id, s.config)
        assert changed.startswith(f"during the run: {train} {CHANGED}: ")
        system = s.store.run(s.run_id)["system"]
    finally:
        s.store.close()
    assert system["dataset_identity"]["proof"]["changed"] == [changed]
    assert json.loads((run_dir / "system.json").read_text()) == system
    assert data_changes(system, [], []) == [changed]


def test_check_holds_the_recorded_md5s_to_the_published_and_the_keepers_archives(archives, tmp_path):
    identity = record_origin(official(archives))["dataset_identity"]
    fresh = {"ruleset": rules.CURRENT.id, "official": True, "dataset_identity": identity}
    bad: list[str] = []
    _check_archives(fresh, bad, None, {"dataset_identity": identity})
    assert len(bad) == 3 and all("publishes" in line and "not official" in line for line in bad)
    # The list keeper's own archives: the same files agree, others are named.
    bad = []
    _check_archives({**fresh, "official": False}, bad, archives, {"dataset_identity": identity})
    assert bad == []
    other = make_tree(tmp_path / "other", classes=CLASSES, per_class=(3, 2))
    official_archives(other, tmp_path / "keeper")
    _check_archives({**fresh, "official": False}, bad, tmp_path / "keeper",
                    {"dataset_identity": identity})
    assert len(bad) == 3 and all("not the same archive" in line for line in bad)


def test_verify_data_checks_an_extracted_folder_and_prints_its_content_root(tmp_path, monkeypatch):
    root = make_tree(tmp_path / "imagenet", classes=CLASSES)
    official_archives(root, tmp_path / "archives", monkeypatch)
    found = verify_folder(tmp_path / "archives", root)
    assert found.ok and found.compared == 15 and found.root.startswith("sha256:")
    # Layout-free: the same images with a flat validation folder have the same root.
    flat = make_tree(tmp_path / "flat", classes=CLASSES, flat_val=True)
    assert verify_folder(tmp_path / "archives", flat).root == found.root
    done = cli("verify-data", "--archives", tmp_path / "archives", "--data-dir", root,
               env={**os.environ})
    assert done.returncode == 0 and found.root in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize("forgery,named", [
    ("re-encoded", "differs from its original in ILSVRC2012_img_train.tar"),
    ("missing", "in ILSVRC2012_img_train.tar, not in the folder"),
    ("added", "in the folder, in no official archive"),
    ("relabelled", "in the folder, n01440764 in the devkit"),
    ("another archive", "not the published archive"),
])
def test_verify_data_names_each_file_that_differs(tmp_path, monkeypatch, forgery, named):
    root = make_tree(tmp_path / "imagenet", classes=CLASSES)
    official_archives(root, tmp_path / "archives", monkeypatch)
    first = sorted((root / "train").iterdir())[0]
    victim = sorted(first.iterdir())[0]
    if forgery == "re-encoded":
        victim.unlink()
        victim.write_bytes(other_jpeg((64, 48)))
    elif forgery == "missing":
        victim.unlink()
    elif forgery == "added":
        (first / "extra.JPEG").write_bytes(other_jpeg())
    elif forgery == "relabelled":
        image = next((root / "val" / CLASSES[0]).iterdir())
        image.rename(root / "val" / CLASSES[1] / image.name)
    else:
        (tmp_path / "archives" / NAMES["val"]).write_bytes(
            (tmp_path / "archives" / NAMES["val"]).read_bytes() + bytes(512))
    found = verify_folder(tmp_path / "archives", root)
    assert not found.ok and found.root is None
    assert any(named in line for line in found.differences), found.differences[:5]


def test_verify_data_names_what_it_cannot_prove(tmp_path):
    root = make_tree(tmp_path / "imagenet", classes=CLASSES[:3])
    official_archives(root, tmp_path / "archives")
    # Generated archives are not the published ones: their MD5s say so, one line each.
    done = cli("verify-data", "--archives", tmp_path / "archives", "--data-dir", root,
               env={k: v for k, v in os.environ.items() if k != "AUTOMLPERF_TEST_ARCHIVE_MD5S"})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "ILSVRC2012_img_train.tar: MD5" in done.stderr and "not the official data" in done.stderr
    missing = cli("verify-data", "--archives", tmp_path / "nowhere", "--data-dir", root)
    assert missing.returncode == 2
    assert "ILSVRC2012_img_train.tar not found" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1


def test_archives_reached_by_symlinks_are_proven_as_the_files_they_name(archives, tmp_path):
    """A site may link its archives into a folder: the proof hashes the files the links name,
    and holds each to its identity, so a link pointed elsewhere after the proof (even at a copy
    of the same bytes) is named where a replica opens it."""
    linked = tmp_path / "linked"
    linked.mkdir()
    for name in NAMES.values():
        (linked / name).symlink_to(archives / name)
    origin = record_origin(official(linked), run_dir=tmp_path / "run")
    proof = origin["dataset_identity"]["proof"]
    assert origin["dataset_identity"]["problems"] == []
    assert proof["archives"]["train"]["inode"] == (archives / NAMES["train"]).stat().st_ino
    system = {"dataset_identity": origin["dataset_identity"]}
    assert nodedata.for_replica(tmp_path / "run", linked, system).record["source"] == "shared"
    shutil.copyfile(archives / NAMES["train"], tmp_path / "copy.tar")
    (linked / NAMES["train"]).unlink()
    (linked / NAMES["train"]).symlink_to(tmp_path / "copy.tar")
    with pytest.raises(DataChanged, match=f"{linked / NAMES['train']} {CHANGED}: .*inode"):
        nodedata.for_replica(tmp_path / "run", linked, system)
