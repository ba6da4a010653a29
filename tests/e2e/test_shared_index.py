"""The run's dataset index, scanned once by the primary and loaded by every replica: the same
files in the same order with the same labels and identity as a replica's own scan would
give, a compact folder in the run directory, rebuilt when the data changed, and a node
without the data named in one line."""

import dataclasses
import os
import time

import numpy as np
import pytest

from automlperf import rules
from automlperf.config import Config
from automlperf.dataset.folder import identify, index_folder
from automlperf.dataset.index import DatasetIdentityError, FileIndex
from automlperf.dataset.shared import (SHARED_INDEX, build_shared_index, check_data_here,
                                       load_shared_index)
from automlperf.runner.session import record_origin
from trees import SMALL, WNIDS, make_tree

CLASSES = WNIDS[:20]


@pytest.mark.parametrize("flat_val", [False, True], ids=["class-folders", "flat-val"])
def test_the_shared_index_is_what_a_replica_would_scan(tmp_path, flat_val):
    root = make_tree(tmp_path / "imagenet", per_class=(5, 2), flat_val=flat_val, classes=CLASSES)
    (root / "train" / CLASSES[0] / "notes.txt").write_text("not an image")
    (root / "train" / "n99999999").mkdir()  # an empty class folder still defines a class
    built = build_shared_index(root, tmp_path / "run")
    loaded = load_shared_index(tmp_path / "run", root)
    own = index_folder(root)  # what a replica scanning by itself reads
    assert built.built and loaded is not None and not loaded.built
    for index in (built.index, loaded.index):
        assert index.classes == own.classes and index.train_size == own.train_size
        assert np.array_equal(index.labels, own.labels)
        assert np.array_equal(index.offsets, own.offsets)
        assert bytes(index.blob) == bytes(own.blob)
        assert index.items("train") == own.items("train") and index.items("val") == own.items("val")
    # The identity recorded with it is the identity's own scan, fingerprint and all.
    found = identify(root, rules.IMAGENET_1K)
    assert loaded.identity == built.identity == found
    assert isinstance(loaded.index.labels, np.memmap)
    # Compact: the paths are relative, so another mount point of the data reads the same rows.
    assert not bytes(built.index.blob).startswith(str(root).encode())
    moved = FileIndex.load(built.folder, "/elsewhere/imagenet")
    assert moved.path(0) == "/elsewhere/imagenet/" + own.relative(0)


def test_a_change_in_the_data_makes_the_index_stale(tmp_path):
    root = make_tree(tmp_path / "imagenet", per_class=(3, 1), classes=CLASSES)
    build_shared_index(root, tmp_path / "run")
    assert load_shared_index(tmp_path / "run", root) is not None
    time.sleep(0.01)  # a folder's modification time must be able to move
    extra = root / "train" / CLASSES[3] / "late.JPEG"
    extra.write_bytes((root / "train" / CLASSES[3]).iterdir().__next__().read_bytes())
    assert load_shared_index(tmp_path / "run", root) is None


def test_the_primary_scans_once_and_a_later_step_loads_it(tmp_path):
    root = make_tree(tmp_path / "imagenet", per_class=(2, 1))
    config = Config.parse({"run": {"official": False}, "data": {"data_dir": str(root)}})
    first = record_origin(config, rules.CURRENT, run_dir=tmp_path / "run")
    assert first["startup"]["dataset_index"] == "built"
    assert (tmp_path / "run" / SHARED_INDEX / "index.json").exists()
    again = record_origin(config, rules.CURRENT, run_dir=tmp_path / "run")
    assert again["startup"]["dataset_index"] == "loaded"
    assert again["dataset_identity"] == first["dataset_identity"]
    # Judged by rules of this tree's image counts, the loaded scan is ImageNet-1k (under a
    # ruleset before aiperf-2021.4: from it on, a folder is never the official dataset).
    small = record_origin(config, dataclasses.replace(rules.AIPERF_2021_2, dataset=SMALL),
                          run_dir=tmp_path / "run")
    assert small["dataset_identity"]["problems"] == []
    assert "reads ImageNet-1k only from its official archives" in \
        record_origin(config, rules.CURRENT, run_dir=tmp_path / "run")["dataset_identity"]["problems"][0]


def test_a_node_without_the_data_is_named(tmp_path):
    root = make_tree(tmp_path / "imagenet", per_class=(2, 1), classes=CLASSES)
    shared = build_shared_index(root, tmp_path / "run")
    assert len(check_data_here(shared.folder, root)) == 60
    last = shared.index.path(shared.index.rows("val")[-1])
    os.remove(last)
    with pytest.raises(DatasetIdentityError, match=f"not on this node .*{last} not found"):
        check_data_here(shared.folder, root)
    with pytest.raises(DatasetIdentityError, match="not on this node .*/nowhere/train not found"):
        check_data_here(shared.folder, tmp_path / "nowhere")
