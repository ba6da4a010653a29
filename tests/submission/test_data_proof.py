"""The official data proven by content: a folder held against the official archives (here
small generated ones, with a test-only checksum table), its manifest, the sample an official
run checks before its clock, and `check`'s own sample."""

import dataclasses
import gzip
import io
import json

import pytest
from PIL import Image

from automlperf import rules
from automlperf.config import Config, ConfigError
from automlperf.data_manifest import (MANIFEST, DataProofError, read_manifest, sample_check,
                                      verify_folder)
from automlperf.dataset_identity import scan
from automlperf.runner.session import record_origin
from automlperf.submission.result_check import _check_data
from helpers import cli
from trees import SMALL, make_tree, official_archives

SMALL_RULES = dataclasses.replace(rules.CURRENT, dataset=SMALL)


def official(data_dir, strict=True):
    return Config.parse({"run": {"official": strict}, "data": {"data_dir": str(data_dir)}})


def other_jpeg(size=(4, 4), colour=(10, 200, 30)):
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, format="JPEG")
    return buf.getvalue()


def prove(tmp_path, classes=rules.IMAGENET_1K.classes):
    """A small ImageNet tree (every class, unless fewer will do), its archives and the
    manifest verify-data wrote."""
    root = make_tree(tmp_path / "imagenet", classes=classes)
    table = official_archives(root, tmp_path / "archives")
    found = verify_folder(tmp_path / "archives", root, table)
    assert found.ok, found.differences[:3]
    return root, table, found


@pytest.fixture
def proven(tmp_path):
    return prove(tmp_path)


@pytest.fixture
def proven_few(tmp_path):
    return prove(tmp_path, rules.IMAGENET_1K.classes[:5])


def test_a_folder_equal_to_its_archives_gets_a_manifest_an_official_run_samples(proven):
    root, _, found = proven
    assert found.compared == 3000 and (root / MANIFEST).exists()
    manifest = read_manifest(root)
    assert manifest.root == found.root and len(manifest.lines) == 3000
    assert manifest.header["fingerprint"] == scan(root).fingerprint
    origin = record_origin(official(root), SMALL_RULES)
    identity = origin["dataset_identity"]
    assert identity["problems"] == []
    assert identity["proof"]["root"] == found.root and identity["proof"]["sampled"] == 500
    # The manifest sits in the data folder, but is not part of the data.
    assert identity["files"] == 3000


def test_a_flat_validation_folder_is_proven_too(tmp_path):
    root = make_tree(tmp_path / "imagenet", flat_val=True)
    table = official_archives(root, tmp_path / "archives")
    found = verify_folder(tmp_path / "archives", root, table)
    assert found.ok and found.compared == 3000


@pytest.mark.parametrize("forgery,named", [
    ("re-encoded", "differs from its original in ILSVRC2012_img_train.tar"),
    ("missing", "in ILSVRC2012_img_train.tar, not in the folder"),
    ("added", "in the folder, in no official archive"),
    ("another archive", "not the published archive"),
])
def test_verify_data_names_each_file_that_differs(tmp_path, forgery, named):
    root = make_tree(tmp_path / "imagenet", classes=rules.IMAGENET_1K.classes[:5])
    table = official_archives(root, tmp_path / "archives")
    first = sorted((root / "train").iterdir())[0]
    victim = sorted(first.iterdir())[0]
    if forgery == "re-encoded":
        victim.unlink()
        victim.write_bytes(other_jpeg((64, 48)))
    elif forgery == "missing":
        victim.unlink()
    elif forgery == "added":
        (first / "extra.JPEG").write_bytes(other_jpeg())
    else:
        table = {**table, "val": (table["val"][0], "0" * 32)}
    found = verify_folder(tmp_path / "archives", root, table)
    assert not found.ok and not (root / MANIFEST).exists()
    assert any(named in line for line in found.differences), found.differences[:5]


def test_an_official_run_refuses_data_that_differs_from_its_manifest(proven):
    root, _, _ = proven
    # Resized after the proof: the file list's sizes are no longer the manifest's.
    victim = sorted(sorted((root / "train").iterdir())[3].iterdir())[0]
    victim.unlink()
    victim.write_bytes(other_jpeg((64, 48)))
    with pytest.raises(ConfigError, match="official run refused: .*not the ones "
                       "automlperf-manifest.tsv.gz was written for") as info:
        record_origin(official(root), SMALL_RULES)
    assert "\n" not in str(info.value)


def test_a_file_re_encoded_to_the_same_size_is_found_by_content(proven_few):
    root, _, _ = proven_few
    victim = sorted(sorted((root / "train").iterdir())[3].iterdir())[1]
    data = bytearray(victim.read_bytes())
    data[-3] ^= 0xFF  # inside the entropy-coded data: the same size, other pixels
    victim.unlink()
    victim.write_bytes(bytes(data))
    fingerprint = scan(root).fingerprint
    with pytest.raises(DataProofError, match=f"{victim.name} differs from the official file"):
        sample_check(root, fingerprint, sample=10_000)


def test_without_a_manifest_an_official_run_is_refused_and_an_unofficial_one_goes_on(tmp_path):
    root = make_tree(tmp_path / "imagenet")
    with pytest.raises(ConfigError, match="official run refused: .*automlperf verify-data "
                       "--archives DIR .*--unofficial"):
        record_origin(official(root), SMALL_RULES)
    origin = record_origin(official(root, strict=False), SMALL_RULES)
    assert "verify-data" in origin["dataset_identity"]["problems"][0]
    # A run of an earlier ruleset needed no proof.
    old = dataclasses.replace(rules.AIPERF_2021_2, dataset=SMALL)
    assert record_origin(official(root), old)["dataset_identity"]["problems"] == []


def test_check_samples_the_data_again(proven):
    root, _, _ = proven
    identity = record_origin(official(root), SMALL_RULES)["dataset_identity"]
    config = official(root)
    bad: list[str] = []
    _check_data(config, {"dataset_identity": identity}, bad)
    assert bad == []
    # Every image is a hard link to one file: rewriting it in place forges them all, sizes
    # kept, which any sample finds.
    source = next(root.parent.glob("imagenet-src*.JPEG"))
    data = bytearray(source.read_bytes())
    data[-3] ^= 0xFF
    source.write_bytes(bytes(data))
    _check_data(config, {"dataset_identity": identity}, bad)
    assert len(bad) == 1 and "the data's proof: " in bad[0] and "differs from the official" in bad[0]


def test_a_damaged_manifest_is_named(proven_few):
    root, _, _ = proven_few
    good = gzip.decompress((root / MANIFEST).read_bytes()).decode()
    (root / MANIFEST).write_bytes(gzip.compress(b"not a manifest\n"))
    with pytest.raises(DataProofError, match="cannot be read .*verify-data"):
        read_manifest(root)
    # A line lost, or a field: the header's count of files, of three fields each, says so.
    header, *lines = good.splitlines()
    for damaged in (lines[:-1], [lines[0].rsplit("\t", 1)[0]] + lines[1:]):
        (root / MANIFEST).write_bytes(gzip.compress("\n".join([header, *damaged, ""]).encode()))
        with pytest.raises(DataProofError, match="cannot be read .*not the .* files of three "
                                                 "fields its header counts"):
            read_manifest(root)
    # A size that is no number is found where it is sampled.
    rel, _, sha = lines[0].split("\t")
    (root / MANIFEST).write_bytes(gzip.compress("\n".join(
        [header, f"{rel}\tbig\t{sha}", *lines[1:], ""]).encode()))
    with pytest.raises(DataProofError, match="a damaged line .*verify-data"):
        sample_check(root, json.loads(header)["fingerprint"], sample=len(lines))


def test_the_command_names_what_it_cannot_prove(tmp_path):
    root = make_tree(tmp_path / "imagenet", classes=rules.IMAGENET_1K.classes[:3])
    official_archives(root, tmp_path / "archives")
    # Generated archives are not the published ones: their MD5s say so, one line each.
    done = cli("verify-data", "--archives", tmp_path / "archives", "--data-dir", root)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "ILSVRC2012_img_train.tar: MD5" in done.stderr and "not the official data" in done.stderr
    missing = cli("verify-data", "--archives", tmp_path / "nowhere", "--data-dir", root)
    assert missing.returncode == 2
    assert "ILSVRC2012_img_train.tar not found" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1
