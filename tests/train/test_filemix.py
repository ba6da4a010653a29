"""A dataset's file mix counted from its headers (train/data/jpeghead.py ``FileMix``,
train/data/filemix.py): each kind counted, and the route it predicts for each file on the
GPU path the one the path's host stage takes (train/data/gpuring.py)."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from automlperf.train.data import filemix, gpuring, jpeghead
from automlperf.train.data.index import scan_image_folder
from imagefolder import photo


def _save(img: Image.Image, path, **kw) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path, **kw)


def odd_folder(root):
    src = photo().crop((100, 100, 180, 160))
    folder = root / "train" / "n00000000"
    for i in range(4):
        _save(src, folder / f"plain{i}.JPEG")
    _save(src, folder / "progressive.JPEG", progressive=True)
    _save(src.convert("L"), folder / "grey.JPEG")
    _save(src.convert("CMYK"), folder / "cmyk.JPEG")
    exif = Image.Exif()
    exif[0x0112] = 6
    _save(src, folder / "rotated.JPEG", exif=exif.tobytes())
    _save(src, folder / "png.JPEG", format="PNG")
    # A header behind 20 KB of EXIF (the first read stops short of it).
    big = Image.Exif()
    big[0x010E] = "x" * 20_000  # ImageDescription
    _save(src, folder / "late_header.JPEG", exif=big.tobytes())
    # Noise at full quality: more bytes than a chunk of this folder can hold.
    noise = np.random.default_rng(0).integers(0, 256, (1000, 1200, 3), dtype=np.uint8)
    _save(Image.fromarray(noise), folder / "large.JPEG", quality=100)
    _save(src, root / "val" / "n00000000" / "v.JPEG")
    return folder


def test_a_folders_files_are_counted_by_kind_and_routed_as_the_gpu_path_routes_them(tmp_path):
    folder = odd_folder(tmp_path)
    index = scan_image_folder(tmp_path)
    size, n = 32, index.train_size
    assert n == 11
    found = filemix.folder_mix(index, filemix.gpu_mix(size, n))
    kinds = found["kinds"]
    assert found["files"] == 11 and found["sampled_every"] == 1
    assert (kinds["progressive"], kinds["greyscale"], kinds["cmyk"], kinds["rotated"],
            kinds["not_jpeg"], kinds["large_file"]) == (1, 1, 1, 1, 1, 1)
    assert found["gpu_routes"] == {"batched": 6, "one_by_one": 1, "cpu_reference": 4}
    assert found["shares"]["cmyk"] == 1 / 11
    assert sorted(p.rsplit("/", 1)[1] for p in found["tail"]) == [
        "cmyk.JPEG", "large.JPEG", "png.JPEG", "rotated.JPEG"]
    # The host stage routes the same files alike, in one chunk of all of them.
    paths = [index.path(r) for r in index.rows("train")]
    ring = gpuring.stage_files(paths, size, True)
    cpu = {p.rsplit("/", 1)[1] for p, r in zip(paths, ring.route[0]) if r == gpuring.CPU}
    assert cpu == {"cmyk.JPEG", "large.JPEG", "png.JPEG", "rotated.JPEG"}
    assert (folder / "large.JPEG").stat().st_size > found["limits"]["chunk_room"]
    cost = filemix.tail_cost(found["tail"], size)
    assert cost is not None and cost >= 0
    assert filemix.tail_cost([str(tmp_path / "gone.JPEG")], size) is None


def test_the_counter_takes_one_file_at_a_time_from_its_bytes_and_tallies_merge():
    """What a pass over an archive calls per image: the file's first bytes (or its header)
    in, tallies out."""
    buf = io.BytesIO()
    photo().crop((0, 0, 64, 48)).save(buf, "JPEG", progressive=True)
    one, two = filemix.gpu_mix(224, 8), filemix.gpu_mix(224, 8)
    head = one.add_bytes(buf.getvalue()[:2048], size=len(buf.getvalue()))
    assert head is not None and head.coding == "progressive"
    assert one.add_bytes(b"GIF89a...") is None
    two.add(jpeghead.JpegHeader(9000, 9000, 3, 8, "baseline", 1), 200_000)  # 81 MP, 200 KB
    one.merge(two)
    assert one.files == 3 and one.routes == {"batched": 0, "one_by_one": 1, "cpu_reference": 2}
    assert one.kinds["large_image"] == 1 and one.kinds["large_file"] == 1
    assert one.to_dict()["gpu_path"]["one_by_one"] == 1 / 3
