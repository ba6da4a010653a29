"""The archive source: ImageNet-1k's ILSVRC-2012 archives read without extracting them. One
pass gives each archive's MD5 and the index of its images; the devkit labels validation as
torchvision labels it; every image's bytes come back by one `pread`; and each way an archive
can be wrong (a member changed, two labels swapped, the file replaced, truncated, not a tar)
is named."""

import hashlib
import io
import os
import shutil
import tarfile

import pytest

from automlperf import rules
from automlperf.dataset import archive
from automlperf.dataset.archive import NAMES, read_devkit, scan_archives
from automlperf.dataset.folder import index_folder
from automlperf.dataset.index import DatasetIdentityError, FileIndex
from automlperf.dataset.proof import (CHANGED, TEST_TABLE_ENV, DataChanged, judge, prove,
                                      sessions)
from automlperf.dataset.reader import ArchiveReader, reader_for
from automlperf.dataset.tarstream import ArchiveError
from automlperf.testing.archives import write_archives, write_devkit, write_table
from trees import make_tree

CLASSES = ("n01440764", "n01443537", "n01484850", "n01491361")


@pytest.fixture
def made(tmp_path, monkeypatch):
    """A small folder of distinct images, its archives, and the test table that names them."""
    root = make_tree(tmp_path / "imagenet", per_class=(3, 2), classes=CLASSES)
    # Distinct files (the tree's are links to one JPEG): each its own bytes after the JPEG's.
    for i, path in enumerate(sorted(root.rglob("*.JPEG"))):
        data = path.read_bytes() + i.to_bytes(4, "big")
        path.unlink()
        path.write_bytes(data)
    table = write_archives(root, tmp_path / "archives")
    monkeypatch.setenv(TEST_TABLE_ENV, str(write_table(tmp_path / "table.json", table)))
    return root, tmp_path / "archives", table


def torchvision_labels(devkit: bytes) -> list[str]:
    """torchvision's own reading of the devkit (datasets/imagenet.py, parse_devkit_archive):
    the synsets' fields by position, leaves by num_children, the ground truth by index."""
    import scipy.io

    with tarfile.open(fileobj=io.BytesIO(devkit), mode="r:gz") as t:
        meta = scipy.io.loadmat(io.BytesIO(t.extractfile(archive.META).read()),
                                squeeze_me=True)["synsets"]
        truth = [int(x) for x in t.extractfile(archive.GROUND_TRUTH).read().split()]
    nums_children = list(zip(*meta))[4]
    meta = [meta[idx] for idx, num_children in enumerate(nums_children) if num_children == 0]
    idcs, wnids, _ = list(zip(*meta))[:3]
    idx_to_wnid = {idx: wnid for idx, wnid in zip(idcs, wnids)}
    return [idx_to_wnid[idx] for idx in truth]


def test_one_pass_gives_the_md5s_and_the_folders_own_index(made):
    root, archives, table = made
    found = scan_archives(archives)
    assert found.problems == [] and found.md5 == table
    for part, name in NAMES.items():
        assert found.md5[part] == hashlib.md5((archives / name).read_bytes()).hexdigest()
    index, folder = found.index, index_folder(root)
    # The same rows, names and labels as the folder the archives were made from.
    assert [index.relative(r) for r in range(len(index))] == \
        [folder.relative(r) for r in range(len(folder))]
    assert list(index.labels) == list(folder.labels) and index.classes == folder.classes
    assert (index.train_size, index.val_size) == (12, 8)
    reader = reader_for(index)
    for row in range(len(index)):
        assert reader.read(row) == (root / index.relative(row)).read_bytes()
    assert reader.name(0) == f"{archives / NAMES['train']}:{index.relative(0).split('/')[-1]}"


def test_the_devkit_labels_validation_as_torchvision_does(made):
    _, archives, _ = made
    devkit = (archives / NAMES["devkit"]).read_bytes()
    classes, truth = read_devkit(devkit)
    # The generated devkit numbers the classes in an order of its own, beside synsets that
    # are not classes: the labels come from its IDs, not from their order.
    assert classes == sorted(CLASSES) and truth == torchvision_labels(devkit)
    index = scan_archives(archives).index
    val = [(index.relative(r).split("/")[1], classes[index.labels[r]]) for r in index.rows("val")]
    assert all(folder == label for folder, label in val)


def test_a_saved_index_is_the_same_index(made, tmp_path):
    _, archives, _ = made
    index = scan_archives(archives).index
    index.save(tmp_path / "index")
    again = FileIndex.load(tmp_path / "index")
    assert again.digest() == index.digest() and again.source == "archives"
    assert again.identities == index.identities and again.archives == index.archives
    assert index.nbytes()["reading"] == len(index) * (4 + 8 + 8)


def test_the_proof_records_the_table_and_never_makes_a_test_table_official(made):
    _, archives, table = made
    found, identity = prove(archives, rules.CURRENT)
    assert identity["problems"] == [] and identity["proof"]["table"] == "test"
    assert {p: a["md5"] for p, a in identity["proof"]["archives"].items()} == table
    assert identity["fingerprint"] == found.index.digest() == identity["proof"]["index"]
    why = judge({"dataset_identity": identity}, rules.CURRENT)
    assert "test table of MD5s" in why and TEST_TABLE_ENV in why
    # The same records, as if the published MD5s had been computed: official; any session
    # that read a folder, or other bytes, is not.
    published = {**identity, "proof": {**identity["proof"], "table": "published", "archives": {
        p: {**a, "md5": rules.CURRENT.dataset.archives[p][1]}
        for p, a in identity["proof"]["archives"].items()}}}
    assert judge({"dataset_identity": published}, rules.CURRENT) is None
    folder = {"source": "folder", "problems": []}
    assert "from a folder" in judge({"dataset_identity": published, "data_sessions": [folder]},
                                    rules.CURRENT)
    assert len(sessions({"dataset_identity": published, "data_sessions": [folder]})) == 2


def test_one_members_bytes_changed_is_an_md5_that_differs(made):
    _, archives, table = made
    train = archives / NAMES["train"]
    data = bytearray(train.read_bytes())
    index = scan_archives(archives).index
    at = int(index.at[5]) + int(index.sizes[5]) - 3  # inside the JPEG's entropy-coded data
    data[at] ^= 0xFF
    train.write_bytes(bytes(data))
    _, identity = prove(archives, rules.CURRENT)
    assert identity["problems"][0].startswith(f"{train}: MD5 ")
    assert f"the test table's ILSVRC2012_img_train.tar has {table['train']}" in identity["problems"][0]


def test_a_devkit_with_two_labels_swapped_is_named_and_its_labels_are_not_used(made):
    root, archives, table = made
    index = scan_archives(archives).index
    truth = [index.relative(r).split("/")[1] for r in sorted(
        index.rows("val"), key=lambda r: index.relative(r).split("/")[-1])]
    truth[0], truth[-1] = truth[-1], truth[0]
    write_devkit(archives / NAMES["devkit"], list(CLASSES), truth)
    _, identity = prove(archives, rules.CURRENT)
    assert any(p.startswith(f"{archives / NAMES['devkit']}: MD5 ") for p in identity["problems"])


def test_an_archive_replaced_after_the_proof_is_refused_where_it_is_opened(made, tmp_path):
    _, archives, _ = made
    index = scan_archives(archives).index
    ArchiveReader(index).close()
    # The same bytes in another file: another inode, other times.
    train = archives / NAMES["train"]
    shutil.copyfile(train, tmp_path / "copy.tar")
    os.replace(tmp_path / "copy.tar", train)
    with pytest.raises(DataChanged, match=f"{train} {CHANGED}: .*inode"):
        ArchiveReader(index)


def test_an_archive_that_is_not_a_tar_or_is_cut_short_is_named(made):
    _, archives, _ = made
    val = archives / NAMES["val"]
    data = val.read_bytes()
    val.write_bytes(data[:700])  # inside the first member
    with pytest.raises(ArchiveError, match=f"{val} at byte 0: ILSVRC2012_val_00000001.JPEG runs "
                       "past the end of the file"):
        scan_archives(archives)
    val.write_bytes(b"not a tar at all" * 64)
    with pytest.raises(ArchiveError, match=f"{val} at byte 0: not a tar header"):
        scan_archives(archives)
    val.unlink()
    with pytest.raises(DatasetIdentityError, match=f"{val} not found: an ImageNet-1k archive "
                                                   "folder holds"):
        scan_archives(archives)


def test_long_names_and_pax_headers_are_read(tmp_path):
    long = "n01440764_" + "x" * 120 + ".JPEG"
    for fmt in (tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):
        path = tmp_path / f"t{fmt}.tar"
        with tarfile.open(path, "w", format=fmt) as t:
            for name, data in ((long, b"\xff\xd8one"), ("short.JPEG", b"\xff\xd8two" * 300)):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                if fmt == tarfile.PAX_FORMAT:
                    info.pax_headers = {"comment": "é"}
                t.addfile(info, io.BytesIO(data))
        from automlperf.dataset.tarstream import HashedStream, members

        fd = os.open(path, os.O_RDONLY)
        stream = HashedStream(fd, str(path))
        found = [(m.name, stream.get(m.offset, m.size)) for m in members(stream)]
        md5 = stream.finish()
        os.close(fd)
        assert found == [(long, b"\xff\xd8one"), ("short.JPEG", b"\xff\xd8two" * 300)]
        assert md5 == hashlib.md5(path.read_bytes()).hexdigest()


def test_each_images_first_bytes_are_offered_during_the_pass(made):
    root, archives, _ = made
    # What a count of the file mix takes (train/data/jpeghead.py FileMix.add_bytes).
    seen = {}
    scan_archives(archives, head=lambda name, data, size: seen.__setitem__(name, (data, size)))
    files = {p.name: p.read_bytes() for p in root.rglob("*.JPEG")}
    assert seen.keys() == files.keys()
    assert all(files[name].startswith(data) and data[:2] == b"\xff\xd8" and size == len(files[name])
               for name, (data, size) in seen.items())
