"""Small archives laid out as the official ILSVRC-2012 ones, written from an ImageNet-layout
folder, for tests and benchmarks: the training archive a tar of one uncompressed tar per class,
the validation archive a flat tar of uniquely named JPEGs, and a devkit whose ``meta.mat``
numbers the classes in an order of its own (as the real one does: its ID 1 is not the first
WordNet id) beside synsets that are not classes, with the ground truth of every validation
image in the order of their sorted names.

Their MD5s are not the published ones: :func:`write_table` writes them to a file that
``AUTOMLPERF_TEST_ARCHIVE_MD5S`` names (automlperf.dataset.proof), and a run proven against
it is never official.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import tarfile
from pathlib import Path

from automlperf.dataset.archive import DEVKIT, GROUND_TRUTH, META, NAMES, TRAIN, VAL
from automlperf.dataset.folder import is_image


def _put(t: tarfile.TarFile, path: Path, name: str) -> None:
    """A member that is a file of its own (a tree of hard links would be stored as links)."""
    info = tarfile.TarInfo(name)
    info.size = path.stat().st_size
    info.mtime = 0
    with open(path, "rb") as f:
        t.addfile(info, f)


def write_devkit(path: Path, classes: list[str], val_classes: list[str], seed: int = 0) -> None:
    """A devkit: ``meta.mat`` with a synset per class (IDs 1..N shuffled over the sorted
    classes) and two that have children, and the ground truth ``val_classes`` (one class per
    validation image, in the order of their sorted names)."""
    import numpy as np
    import scipy.io

    ids = list(range(1, len(classes) + 1))
    random.Random(seed).shuffle(ids)
    id_of = dict(zip(classes, ids))
    fields = ["ILSVRC2012_ID", "WNID", "words", "gloss", "num_children", "children",
              "wordnet_height", "num_train_images"]
    rows = sorted((id_of[c], c, c, "", 0, np.zeros(0), 0, 1300) for c in classes)
    rows += [(len(classes) + 1 + k, f"n9999999{k}", "group", "", 2,
              np.array([1, 2], dtype=np.int16), 1, 0) for k in range(2)]
    synsets = np.empty((len(rows), 1), dtype=[(f, object) for f in fields])
    for i, row in enumerate(rows):
        synsets[i, 0] = row
    mat = io.BytesIO()
    scipy.io.savemat(mat, {"synsets": synsets})
    truth = "".join(f"{id_of[c]}\n" for c in val_classes).encode()
    with tarfile.open(path, "w:gz") as t:
        for name, data in ((META, mat.getvalue()), (GROUND_TRUTH, truth)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))


def write_archives(root: Path | str, out: Path | str, seed: int = 0) -> dict[str, str]:
    """The three archives of the ImageNet-layout folder ``root`` (``train/<wnid>/*``,
    ``val/<wnid>/*``, every class folder of ``train`` a class, empty ones too) in ``out``;
    their MD5s by part."""
    root, out = Path(root), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    classes = sorted(e.name for e in os.scandir(root / "train") if e.is_dir())
    with tarfile.open(out / NAMES[TRAIN], "w", format=tarfile.GNU_FORMAT) as outer:
        for wnid in classes:
            inner = io.BytesIO()
            with tarfile.open(fileobj=inner, mode="w", format=tarfile.GNU_FORMAT) as t:
                for f in sorted((root / "train" / wnid).iterdir()):
                    if is_image(f.name):
                        _put(t, f, f.name)
            info = tarfile.TarInfo(f"{wnid}.tar")
            info.size = inner.tell()
            info.mtime = 0
            inner.seek(0)
            outer.addfile(info, inner)
    val = sorted((f.name, f) for f in (root / "val").rglob("*") if is_image(f.name))
    if len({name for name, _ in val}) != len(val):
        raise ValueError(f"{root / 'val'}: validation images must have distinct names")
    with tarfile.open(out / NAMES[VAL], "w", format=tarfile.GNU_FORMAT) as t:
        for name, f in val:
            _put(t, f, name)
    write_devkit(out / NAMES[DEVKIT], classes, [f.parent.name for _, f in val], seed)
    return {part: md5_file(out / NAMES[part]) for part in (TRAIN, VAL, DEVKIT)}


def md5_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "md5").hexdigest()


def write_table(path: Path | str, table: dict[str, str]) -> Path:
    """The MD5s that stand for the published ones in a test (AUTOMLPERF_TEST_ARCHIVE_MD5S)."""
    path = Path(path)
    path.write_text(json.dumps(table, indent=1) + "\n")
    return path
