"""A slow file system for the tests: ext4 in a file, on a loop device whose reads the blkio
cgroup limits to a few hundred a second, as a busy parallel file system serves metadata.
Nothing in automlperf is slowed: a walk of its folders waits on real reads of directory
blocks and inodes, once its cache is dropped (by mounting it again). Needs root, losetup
and mkfs.ext4 (util-linux, e2fsprogs) and the cgroup v1 blkio controller."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

THROTTLE = Path("/sys/fs/cgroup/blkio/blkio.throttle.read_iops_device")


class SlowFileSystem:
    def __init__(self, folder: Path, reads_per_s: int, inodes: int = 200_000) -> None:
        self.folder = Path(folder)
        self.reads_per_s = reads_per_s
        self.inodes = inodes
        self.mount = self.folder / "mnt"
        self.device = ""

    def __enter__(self) -> SlowFileSystem:
        if os.geteuid() != 0 or not THROTTLE.exists():
            raise RuntimeError("a slow file system needs root and the blkio cgroup "
                               f"({THROTTLE})")
        self.folder.mkdir(parents=True, exist_ok=True)
        image = self.folder / "fs.img"
        subprocess.run(["truncate", "-s", "2G", str(image)], check=True)
        subprocess.run(["mkfs.ext4", "-q", "-N", str(self.inodes), str(image)], check=True)
        self.device = subprocess.run(["losetup", "-f", "--show", str(image)], check=True,
                                     capture_output=True, text=True).stdout.strip()
        self.mount.mkdir()
        subprocess.run(["mount", self.device, str(self.mount)], check=True)
        numbers = Path(f"/sys/block/{Path(self.device).name}/dev").read_text().strip()
        THROTTLE.write_text(f"{numbers} {self.reads_per_s}\n")
        self.numbers = numbers
        return self

    def cold(self) -> None:
        """Drop what the kernel caches of it: the next walk reads from the device again."""
        subprocess.run(["umount", str(self.mount)], check=True)
        subprocess.run(["mount", self.device, str(self.mount)], check=True)

    def __exit__(self, *exc: object) -> None:
        if not self.device:
            return
        THROTTLE.write_text(f"{self.numbers} 0\n")
        subprocess.run(["umount", "-l", str(self.mount)], capture_output=True)
        subprocess.run(["losetup", "-d", self.device], capture_output=True)
        (self.folder / "fs.img").unlink(missing_ok=True)


def many_files(root: Path, files: int, classes: int = 1000) -> int:
    """An ImageNet-layout tree of ``files`` training and ``files // 25`` validation images
    (each a distinct one-byte file: a walk reads every inode); the number of files."""
    made = 0
    for split, count in (("train", files), ("val", files // 25)):
        for c in range(classes):
            (root / split / f"n{c:08d}").mkdir(parents=True, exist_ok=True)
        for i in range(count):
            with open(root / split / f"n{i % classes:08d}" / f"{split}_{i}.JPEG", "wb") as f:
                f.write(b"x")
            made += 1
    return made
