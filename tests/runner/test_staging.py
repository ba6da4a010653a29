"""The dataset staged on a node's own storage (`automlperf stage`): every file of the run's
index copied and checked, a copy kept for the next job, a damaged copy named, a disk too
small refused in one line before anything is copied. A job's nodes staging and reading their
copies: tests/cluster/test_cluster_clock.py."""

import json
import random
import subprocess
import sys

import pytest

from automlperf.dataset.shared import build_shared_index
from automlperf.runner import staging
from helpers import cli


@pytest.fixture
def run_with_data(tmp_path):
    """A run directory whose dataset index was saved (as `automlperf slurm` saves it), over
    a tree of distinct files."""
    data = tmp_path / "shared" / "imagenet"
    rng = random.Random(0)
    for split, per_class in (("train", 6), ("val", 2)):
        for c in ("n01440764", "n01443537", "n01484850"):
            (data / split / c).mkdir(parents=True)
            for i in range(per_class):
                (data / split / c / f"{c}_{i}.JPEG").write_bytes(rng.randbytes(rng.randint(900, 3000)))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    build_shared_index(data, run_dir)
    return run_dir, data


def files_of(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_a_node_stages_checks_and_keeps_the_runs_data(run_with_data, tmp_path):
    run_dir, data = run_with_data
    local = tmp_path / "local"
    done = cli("stage", "--run-dir", run_dir, "--to", local)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "24 files" in done.stdout and "24 compared with the originals" in done.stdout
    root = staging.staged_root(run_dir, local)
    assert files_of(root) == files_of(data)
    record = json.loads(staging.record_path(run_dir).read_text())
    assert record["root"] == str(root) and record["files"] == 24
    assert record["bytes"] == sum(len(b) for b in files_of(data).values())
    assert staging.local_root(run_dir) == str(root)
    # The next job on this node keeps the copy; a file lost there is copied again.
    (root / "train" / "n01440764" / "n01440764_0.JPEG").unlink()
    again = staging.stage(run_dir, local)
    assert again["copied_bytes"] == len((data / "train" / "n01440764" / "n01440764_0.JPEG").read_bytes())
    assert files_of(root) == files_of(data)
    # A copy damaged in place (same size, other bytes) is found by the content check.
    victim = root / "val" / "n01484850" / "n01484850_1.JPEG"
    victim.write_bytes(bytes(len(victim.read_bytes())))
    with pytest.raises(staging.StagingError, match=f"{victim} differs in content"):
        staging.stage(run_dir, local)
    # A failed staging leaves no record (the earlier job's went first): the replica reads the
    # shared copy.
    assert staging.local_root(run_dir) is None
    victim.unlink()
    staging.stage(run_dir, local)
    # The job's end removes the copy and its record.
    assert cli("stage", "--run-dir", run_dir, "--to", local, "--clean").returncode == 0
    assert not root.exists() and staging.local_root(run_dir) is None
    (kept,) = (run_dir / "staging").glob("*-*.json")
    assert json.loads(kept.read_text())["root"] == str(root)


def test_a_node_without_room_refuses_in_one_line_before_copying(run_with_data, tmp_path):
    """A real small file system (a 16 KiB tmpfs, in a mount namespace of its own)."""
    run_dir, _ = run_with_data
    local = tmp_path / "tiny"
    local.mkdir()
    command = [sys.executable, "-m", "automlperf.cli", "stage", "--run-dir", str(run_dir),
               "--to", str(local)]
    done = subprocess.run(["unshare", "--mount", "sh", "-c",
                           f'mount -t tmpfs -o size=16k tmpfs {local} && exec "$@"', "sh",
                           *command], capture_output=True, text=True, timeout=300)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "GB free and the dataset needs" in lines[0] and "--stage-to" in lines[0]
    assert not staging.record_path(run_dir).exists()


@pytest.fixture
def run_with_archives(tmp_path, monkeypatch):
    """A run directory whose submitted configuration names the official archives (here small
    generated ones, and their test table), as `automlperf slurm` writes it."""
    from trees import make_tree, official_archives

    tree = make_tree(tmp_path / "folder", per_class=(3, 1),
                     classes=("n01440764", "n01443537", "n01484850"))
    data = tmp_path / "shared" / "ilsvrc2012"
    table = official_archives(tree, data, monkeypatch)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "submitted-config.toml").write_text(f'[data]\ndataset = "imagenet"\ndata_dir = "{data}"\n')
    return run_dir, data, table


def test_a_node_stages_the_archives_with_their_md5s_and_reads_them_back(run_with_archives, tmp_path):
    from automlperf.dataset.archive import NAMES

    run_dir, data, table = run_with_archives
    local = tmp_path / "local"
    local.mkdir()
    done = cli("stage", "--run-dir", run_dir, "--to", local)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "the archives (" in done.stdout and table["train"] in done.stdout
    root = staging.staged_root(run_dir, local)
    assert files_of(root) == files_of(data)
    record = json.loads(staging.record_path(run_dir).read_text())
    assert record["kind"] == "archives" and record["copied_bytes"] == record["bytes"]
    assert {p: a["md5"] for p, a in record["archives"].items()} == table
    assert record["archives"]["train"]["inode"] == (root / NAMES["train"]).stat().st_ino
    assert record["copy_s"] > 0 and record["verify_s"] > 0
    # The next job on this node keeps the copy and reads it again: its MD5s are its own.
    again = staging.stage(run_dir, local)
    assert again["copied_bytes"] == 0 and again["hash_kept_s"] > 0
    assert {p: a["md5"] for p, a in again["archives"].items()} == table
    # A copy damaged in place (same size, other bytes) has another MD5 in its record.
    train = root / NAMES["train"]
    damaged = bytearray(train.read_bytes())
    damaged[-3000] ^= 0xFF
    train.write_bytes(bytes(damaged))
    assert staging.stage(run_dir, local)["archives"]["train"]["md5"] != table["train"]


def test_a_replica_reads_the_staged_archives_only_if_they_are_what_its_session_proved(
        run_with_archives, tmp_path):
    from automlperf.config import Config
    from automlperf.dataset.archive import NAMES
    from automlperf.runner import nodedata
    from automlperf.runner.session import record_origin

    run_dir, data, table = run_with_archives
    config = Config.parse({"run": {"official": False}, "data": {"data_dir": str(data)}})
    system = {"dataset_identity": record_origin(config, run_dir=run_dir)["dataset_identity"]}
    local = tmp_path / "local"
    local.mkdir()
    staging.stage(run_dir, local)
    here = nodedata.for_replica(run_dir, data, system)
    root = staging.staged_root(run_dir, local)
    assert here.data_dir == root and here.record["source"] == "staged"
    assert here.index_dir == root / "index"  # the session's index, held to the copy's files
    assert {p: a["md5"] for p, a in here.record["archives"].items()} == table
    # Its copy damaged since it was staged: the shared copy is read instead.
    train = root / NAMES["train"]
    damaged = bytearray(train.read_bytes())
    damaged[-3000] ^= 0xFF
    train.write_bytes(bytes(damaged))
    staging.stage(run_dir, local)
    here = nodedata.for_replica(run_dir, data, system)
    assert here.data_dir == data and here.record["source"] == "shared"


def test_a_node_without_its_staging_folder_or_room_for_the_archives_refuses_in_one_line(
        run_with_archives, tmp_path):
    run_dir, _, _ = run_with_archives
    done = cli("stage", "--run-dir", run_dir, "--to", tmp_path / "nowhere")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "nowhere does not exist on" in done.stderr and "--stage-to" in done.stderr
    local = tmp_path / "tiny"
    local.mkdir()
    command = [sys.executable, "-m", "automlperf.cli", "stage", "--run-dir", str(run_dir),
               "--to", str(local)]
    done = subprocess.run(["unshare", "--mount", "sh", "-c",
                           f'mount -t tmpfs -o size=16k tmpfs {local} && exec "$@"', "sh",
                           *command], capture_output=True, text=True, timeout=300)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "GB free and the archives need" in lines[0] and "--stage-to" in lines[0]
    assert not staging.record_path(run_dir).exists()


def test_a_hand_written_staging_record_is_never_proof_the_replica_hashes_its_copy(
        run_with_archives, tmp_path):
    """A staging record is a file: one written by hand (the proven MD5s beside the identity of
    another copy) gets that copy read, but the replica hashes what it reads during its
    session, and the result names the copy; so it does a copy it did not finish hashing."""
    from automlperf.config import Config
    from automlperf.dataset.archive import NAMES, identity_of
    from automlperf.measure.result import data_changes
    from automlperf.runner import nodedata
    from automlperf.runner.session import record_origin
    from automlperf.runner.stagecheck import StagedCheck

    run_dir, data, table = run_with_archives
    config = Config.parse({"run": {"official": False}, "data": {"data_dir": str(data)}})
    system = {"dataset_identity": record_origin(config, run_dir=run_dir)["dataset_identity"]}
    local = tmp_path / "local"
    local.mkdir()
    staging.stage(run_dir, local)
    honest = nodedata.for_replica(run_dir, data, system)
    computed = StagedCheck(honest.data_dir).record(wait_s=120)
    assert computed == {"computed": table}
    # Its session's first description has no MD5s of its own yet; the last one, at its end.
    first = {"replica_index": 0, "segment": 0, "host": "n1", "data": honest.record}
    node = {**first, "data": {**honest.record, **computed}}
    assert data_changes(system, [], [first, node]) == []
    # The forger's copy: other bytes, and a record of the proven MD5s with its identity.
    train = staging.staged_root(run_dir, local) / NAMES["train"]
    forged = bytearray(train.read_bytes())
    forged[-3000] ^= 0xFF
    train.write_bytes(bytes(forged))
    record = json.loads(staging.record_path(run_dir).read_text())
    record["archives"]["train"].update(identity_of(train.stat()))
    staging.record_path(run_dir).write_text(json.dumps(record))
    here = nodedata.for_replica(run_dir, data, system)
    assert here.record["source"] == "staged"  # the record alone is believed...
    computed = StagedCheck(here.data_dir).record(wait_s=120)
    assert computed["computed"]["train"] != table["train"]
    node = {"replica_index": 0, "host": "n1", "data": {**here.record, **computed}}
    # ... but not for the result: the MD5 the replica computed is named.
    (line,) = data_changes(system, [], [node])
    assert line == (f"replica 0 (n1) read a staged {NAMES['train']} whose MD5, computed during "
                    f"its session, is {computed['computed']['train']}, which no session of the "
                    "run proved")
    # A replica that ended before it had hashed its copy: not proof either.
    node = {"replica_index": 1, "host": "n2", "data": {**here.record, "computed": None}}
    (line,) = data_changes(system, [], [node])
    assert line.startswith("replica 1 (n2) read the archives staged on its node, which it did "
                           "not hash during its session (not finished by the session's end)")
