"""What proving the data costs an official run at ImageNet-1k's size: the manifest's size, and
the seconds the sample check before the clock adds to the identity scan the run makes anyway.

The folder has ImageNet-1k's counts (1,000 classes, 1,281,167 training and 50,000 validation
images) as hard links to a few textured JPEGs of ImageNet's weight (about 110 KB), so the
sampled files are read and hashed at their real size; the manifest is written from the
sources' digests (hashing 1.33 M links to the same few files would time the page cache).

Run: python bench/bench_data_proof.py [--dir DIR] [--sample 500] [--keep]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from automlperf import rules
from automlperf.data_manifest import (MANIFEST, OFFICIAL_ARCHIVES, read_manifest, sample_check,
                                      write_manifest)
from automlperf.dataset_identity import scan, walk_splits

LINKS_PER_SOURCE = 60_000  # ext4 allows 65,000 links to one file


def textured_jpeg(seed: int) -> bytes:
    """A 500x375 JPEG of noise over gradients: about ImageNet's average weight."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:375, 0:500]
    base = np.stack([x * 255 // 500, y * 255 // 375, (x + y) * 255 // 875], axis=-1)
    pixels = np.clip(base + rng.normal(0, 40, base.shape), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def make_tree(root: Path) -> dict[str, str]:
    """ImageNet-1k's layout and counts, hard-linked; the SHA-256 of each file, by path."""
    ds = rules.IMAGENET_1K
    sources: list[tuple[str, str]] = []
    used = LINKS_PER_SOURCE
    digests: dict[str, str] = {}

    def link(rel: str) -> None:
        nonlocal used
        if used >= LINKS_PER_SOURCE:
            data = textured_jpeg(len(sources))
            path = root.parent / f"{root.name}-src{len(sources)}.JPEG"
            path.write_bytes(data)
            sources.append((str(path), hashlib.sha256(data).hexdigest()))
            used = 0
        os.link(sources[-1][0], f"{root}/{rel}")
        digests[rel] = sources[-1][1]
        used += 1

    for split in ("train", "val"):
        for c in ds.classes:
            (root / split / c).mkdir(parents=True)
    for i in range(ds.train_images):
        c = ds.classes[i % 1000]
        link(f"train/{c}/{c}_{i}.JPEG")
    for i in range(ds.val_images):
        link(f"val/{ds.classes[i % 1000]}/ILSVRC2012_val_{i + 1:08d}.JPEG")
    return digests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None, help="where to make the folder")
    parser.add_argument("--sample", type=int, default=500)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(dir=args.dir, prefix="proof-"))
    root = base / "imagenet"
    try:
        t0 = time.perf_counter()
        digests = make_tree(root)
        made = time.perf_counter() - t0
        listing = walk_splits(root)
        found = scan(root, listing)
        sizes = dict(listing)
        path, digest = write_manifest(root, found.fingerprint,
                                      {rel: (sizes[rel], sha) for rel, sha in digests.items()},
                                      OFFICIAL_ARCHIVES)
        t0 = time.perf_counter()
        again = scan(root)
        scanned = time.perf_counter() - t0
        t0 = time.perf_counter()
        proof = sample_check(root, again.fingerprint, sample=args.sample)
        checked = time.perf_counter() - t0
        # The folder's files share a few contents, so its manifest compresses far better than
        # ImageNet's would: the size and reading time are taken on one of distinct digests.
        distinct = base / "distinct"
        distinct.mkdir()
        rng = np.random.default_rng(0)
        _, _ = write_manifest(distinct, found.fingerprint,
                              {rel: (sizes[rel], rng.bytes(32).hex()) for rel in digests},
                              OFFICIAL_ARCHIVES)
        t0 = time.perf_counter()
        read_manifest(distinct)
        read_s = time.perf_counter() - t0
        print(f"folder: {found.files:,} files ({found.train_images:,} train, "
              f"{found.val_images:,} val), made in {made:.0f} s")
        print(f"manifest: {(distinct / MANIFEST).stat().st_size / 2**20:.1f} MiB with "
              f"ImageNet's distinct digests ({path.stat().st_size / 2**20:.1f} MiB here), "
              f"read in {read_s:.2f} s")
        print(f"identity scan (the run's, already): {scanned:.1f} s")
        print(f"sample check (the proof's cost): {checked:.2f} s for {proof['sampled']} files "
              f"of {proof['files']:,}")
    finally:
        if not args.keep:
            shutil.rmtree(base)


if __name__ == "__main__":
    main()
