"""ImageNet-shaped trees for the tests: the 1,000 ILSVRC-2012 class folders, hard links to one
tiny JPEG, at any image count."""

import dataclasses
import io
import os

from PIL import Image

from automlperf import rules
from automlperf.dataset.folder import KAGGLE_LABELS

WNIDS = rules.IMAGENET_1K.classes
# The official logic with small image counts: 2 training and 1 validation image per class.
SMALL = dataclasses.replace(rules.IMAGENET_1K, train_images=2000, val_images=1000)


def tiny_jpeg(path):
    buf = io.BytesIO()
    Image.new("RGB", (4, 4), (120, 30, 200)).save(buf, format="JPEG")
    path.write_bytes(buf.getvalue())
    return path


def make_tree(root, per_class=(2, 1), flat_val=False, classes=WNIDS, counts=None):
    """train/<wnid>/ and val/<wnid>/ (or flat val/ + LOC_val_solution.csv), hard-linked.
    ``counts`` overrides per_class with exact totals spread over the classes."""
    sources = []

    def link(dst):
        # ext4 allows 65,000 links to one file: start a new source file well before that.
        # Paths are plain strings: a million Path objects would double the tree's making.
        if not sources or sources[-1][1] >= 60_000:
            sources.append([str(tiny_jpeg(root.parent / f"{root.name}-src{len(sources)}.JPEG")), 0])
        os.link(sources[-1][0], dst)
        sources[-1][1] += 1

    n_train, n_val = counts or (per_class[0] * len(classes), per_class[1] * len(classes))
    (root / "train").mkdir(parents=True)
    (root / "val").mkdir()
    for c in classes:
        (root / "train" / c).mkdir()
        if not flat_val:
            (root / "val" / c).mkdir()
    train, val = f"{root}/train", f"{root}/val"
    for i in range(n_train):
        c = classes[i % len(classes)]
        link(f"{train}/{c}/{c}_{i}.JPEG")
    rows = ["ImageId,PredictionString"]
    for i in range(n_val):
        c = classes[i % len(classes)]
        name = f"ILSVRC2012_val_{i + 1:08d}"
        if flat_val:
            link(f"{val}/{name}.JPEG")
            rows.append(f"{name},{c} 1 2 3 4 {c} 5 6 7 8")
        else:
            link(f"{val}/{c}/{name}.JPEG")
    if flat_val:
        (root / KAGGLE_LABELS).write_text("\n".join(rows) + "\n")
    return root


def near_miss(root, kind):
    """Make one kind of difference from ImageNet-1k in a tree of make_tree's."""
    if kind == "999 classes":
        for split in ("train", "val"):
            for f in (root / split / WNIDS[-1]).iterdir():
                f.unlink()
            (root / split / WNIDS[-1]).rmdir()
    elif kind == "one image missing":
        next((root / "train" / WNIDS[5]).iterdir()).unlink()
    elif kind == "renamed class":
        for split in ("train", "val"):
            (root / split / WNIDS[7]).rename(root / split / "n99999999")
    elif kind == "extra file":
        (root / "train" / WNIDS[3] / "notes.txt").write_text("x")
    elif kind == "extra image":
        os.link(next((root / "val" / WNIDS[0]).iterdir()), root / "val" / WNIDS[0] / "x.JPEG")


def official_archives(root, out, env=None):
    """The three ILSVRC-2012 archives a tree would have come from, laid out as the official
    ones are (automlperf.testing.archives), and the test table of their MD5s that stands for
    the published one: its path set in ``env`` (a monkeypatch or a dict) when given."""
    from automlperf.dataset.proof import TEST_TABLE_ENV
    from automlperf.testing.archives import write_archives, write_table

    table = write_archives(root, out)
    path = write_table(out.parent / f"{out.name}-md5s.json", table)
    if env is not None:
        if isinstance(env, dict):
            env[TEST_TABLE_ENV] = str(path)
        else:
            env.setenv(TEST_TABLE_ENV, str(path))
    return table
