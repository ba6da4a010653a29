"""The dataset's identity: generated ImageNet-shaped trees (hard links to one tiny JPEG) and
near-misses, each refused with an error naming the difference."""

import os
import time
from pathlib import Path

import pytest

from trees import SMALL, WNIDS, make_tree, near_miss

from automlperf import rules
from automlperf.dataset.folder import (KAGGLE_LABELS, DatasetIdentityError, identify,
                                       problems, scan)


@pytest.fixture
def tree(tmp_path):
    return make_tree(tmp_path / "imagenet")


def test_the_right_shape_passes_and_is_fingerprinted(tree):
    found = identify(tree, SMALL)
    assert found["problems"] == []
    assert (found["classes"], found["train_images"], found["val_images"]) == (1000, 2000, 1000)
    assert found["layout"] == "class folders" and found["fingerprint"].startswith("sha256:")
    assert identify(tree, SMALL)["fingerprint"] == found["fingerprint"]


def test_flat_val_with_kaggle_labels_passes(tmp_path):
    root = make_tree(tmp_path / "flat", flat_val=True)
    found = identify(root, SMALL)
    assert found["problems"] == [] and found["layout"].startswith("flat val")
    s = scan(root)
    assert set(s.val) == set(WNIDS) and s.val_images == 1000


def test_flat_val_with_only_the_devkit_ground_truth_is_refused(tmp_path):
    root = make_tree(tmp_path / "flat", flat_val=True)
    (root / KAGGLE_LABELS).rename(root / "ILSVRC2012_validation_ground_truth.txt")
    with pytest.raises(DatasetIdentityError, match="meta.mat order.*LOC_val_solution.csv"):
        scan(root)


@pytest.mark.parametrize("kind,named", [
    ("999 classes", [f"train: 999 classes instead of 1,000; missing {WNIDS[-1]}",
                     "train: 1,998 images instead of 2,000 (2 missing)"]),
    ("one image missing", ["train: 1,999 images instead of 2,000 (1 missing)"]),
    ("renamed class", [f"train: missing class(es) {WNIDS[7]}",
                       "train: class(es) not in ImageNet-1k: n99999999"]),
    ("extra file", [f"not images in class folders: train/{WNIDS[3]}/notes.txt"]),
    ("extra image", ["val: 1,001 images instead of 1,000 (1 extra)"]),
])
def test_near_misses_are_refused_naming_the_difference(tree, kind, named):
    before = identify(tree, SMALL)["fingerprint"]
    near_miss(tree, kind)
    found = identify(tree, SMALL)
    for text in named:
        assert any(text in p for p in found["problems"]), (text, found["problems"])
    assert found["fingerprint"] != before


def test_flat_val_near_misses(tmp_path):
    root = make_tree(tmp_path / "flat", flat_val=True)
    (root / "val" / "ILSVRC2012_val_00000003.JPEG").unlink()
    os.link(root / "val" / "ILSVRC2012_val_00000001.JPEG", root / "val" / "stray.JPEG")
    found = problems(scan(root), SMALL)
    assert any("lists image(s) that val/ lacks: ILSVRC2012_val_00000003" in p for p in found)
    assert any("without a label in LOC_val_solution.csv: val/stray.JPEG" in p for p in found)


def test_a_file_resized_changes_the_fingerprint(tree):
    before = identify(tree, SMALL)["fingerprint"]
    victim = next((tree / "train" / WNIDS[0]).iterdir())
    victim.unlink()
    victim.write_bytes(b"\xff\xd8 not the same size")
    assert identify(tree, SMALL)["fingerprint"] != before


@pytest.mark.slow
def test_the_official_counts(imagenet_1k_tree):
    """1,281,167 + 50,000 hard links to one JPEG: the official ruleset passes them. Reports
    how long scanning them took. (Near-misses are the small trees' tests: the same logic, a
    thousandth of the files.)"""
    t0 = time.perf_counter()
    found = identify(imagenet_1k_tree, rules.IMAGENET_1K)
    scanned = time.perf_counter() - t0
    print(f"scanned 1,331,167 files in {scanned:.1f} s")
    assert found["problems"] == [] and found["files"] == 1_331_167


def test_training_and_the_identity_see_the_same_images(tmp_path):
    """One walker and one suffix list: every image the index trains on is counted by the
    identity check, and a file that is not an image by either."""
    from automlperf.dataset.folder import IMAGE_SUFFIXES, index_folder

    suffixes = [*IMAGE_SUFFIXES, *(s.upper() for s in IMAGE_SUFFIXES)]
    for split in ("train", "val"):
        for c in ("n01", "n02"):
            folder = tmp_path / split / c
            folder.mkdir(parents=True)
            for i, suffix in enumerate(suffixes):
                (folder / f"{split}_{i}{suffix}").write_bytes(b"x" * (i + 1))
            (folder / "notes.txt").write_text("not an image")
    index = index_folder(tmp_path)
    found = scan(tmp_path)
    trained = {split: sorted(str(Path(p).relative_to(tmp_path)) for p, _ in index.items(split))
               for split in ("train", "val")}
    per_split = 2 * len(suffixes)
    assert len(trained["train"]) == len(trained["val"]) == per_split
    assert found.train_images == found.val_images == per_split
    assert found.others == sorted(f"{s}/{c}/notes.txt" for s in ("train", "val") for c in ("n01", "n02"))
    assert {p.rsplit("/", 1)[-1].rsplit(".", 1)[-1].lower() for p in trained["train"]} == \
        {s.lstrip(".") for s in IMAGE_SUFFIXES}
