"""The GPU decoding path on the CPU: the JPEG header routing, the reference's resampling on
tensors, and the loader (batching, boxes, flips, fallback, ordering, counting) with a CPU
stand-in behind the decoder seam. The nvJPEG call itself is measured on a GPU
(bench/bench_gpu_decode.py)."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from automlperf.train.data import ImageFolderDataset, gpudecode, jpeghead
from automlperf.train.data.gpudecode import GpuImageFolderDataset, decode_list
from automlperf.train.data.resample import resample
from automlperf.train.data.transform import train_params, val_params
from imagefolder import make_image_folder, photo

CPU = torch.device("cpu")


class PillowStandInDecoder:
    """TESTS ONLY: stands in for nvJPEG behind the decoder seam, decoding with Pillow on the
    CPU. Like nvJPEG's batched call, a list fails as a whole when one file in it fails;
    ``fail_lists_with`` makes lists that hold such a file fail although the file decodes
    alone (a batched hardware path refusing what the per-image path takes); ``broken``
    fails everything."""

    name = "pillow-stand-in"

    def __init__(self, fail_lists_with: bytes | None = None, broken: bool = False) -> None:
        self.fail_lists_with, self.broken = fail_lists_with, broken
        self.calls: list[int] = []

    def versions(self) -> dict[str, str]:
        import PIL

        return {"pillow": PIL.__version__}

    def decode(self, files, device):
        self.calls.append(len(files))
        if self.broken:
            raise RuntimeError("no decoder here")
        if len(files) > 1 and self.fail_lists_with is not None and any(
                bytes(f.numpy()) == self.fail_lists_with for f in files):
            raise RuntimeError("batched decode failed")
        out = []
        for f in files:
            with Image.open(io.BytesIO(bytes(f.numpy()))) as img:
                rgb = np.asarray(img.convert("RGB"))
            out.append(torch.from_numpy(rgb.copy()).permute(2, 0, 1).to(device))
        return out


def _jpeg(img: Image.Image, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "JPEG", **kw)
    return buf.getvalue()


def test_the_header_says_size_components_coding_and_orientation():
    img = photo().crop((0, 0, 120, 80))
    head = jpeghead.parse(_jpeg(img))
    assert (head.width, head.height, head.components, head.precision, head.coding,
            head.orientation) == (120, 80, 3, 8, "baseline", 1)
    assert head.gpu_refusal(10**8) == ""
    assert jpeghead.parse(_jpeg(img, progressive=True)).coding == "progressive"
    assert jpeghead.parse(_jpeg(img.convert("L"))).components == 1
    cmyk = jpeghead.parse(_jpeg(img.convert("CMYK")))
    assert cmyk.components == 4 and "CMYK" in cmyk.gpu_refusal(10**8)
    exif = Image.Exif()
    exif[0x0112] = 6
    rotated = jpeghead.parse(_jpeg(img, exif=exif.tobytes()))
    assert rotated.orientation == 6 and "EXIF orientation 6" in rotated.gpu_refusal(10**8)
    assert "pixels" in head.gpu_refusal(100)
    png = io.BytesIO()
    img.save(png, "PNG")
    assert jpeghead.parse(png.getvalue()) is None
    assert jpeghead.parse(b"\xff\xd8\xff") is None and jpeghead.parse(b"") is None


def _smooth(rng, width, height):
    base = rng.integers(0, 256, (height // 4 + 1, width // 4 + 1, 3), dtype=np.uint8)
    return Image.fromarray(base).resize((width, height), Image.Resampling.BICUBIC)


def test_resampling_tensors_matches_pillow_within_one_level():
    """Training and validation boxes, flips, up- and downscaling, large factors: each pixel
    within one level of Pillow's resize of the same box, nearly all of them equal."""
    rng = np.random.default_rng(0)
    means = []
    for trial in range(40):
        width, height = int(rng.integers(12, 900)), int(rng.integers(12, 900))
        img = _smooth(rng, width, height)
        size = int(rng.choice([16, 32, 224]))
        if trial % 2:
            box, flip = train_params(3, 1, trial, width, height)
        else:
            box, flip = val_params(width, height, size), trial % 4 == 0
        want = img.resize((size, size), Image.Resampling.BILINEAR, box=box)
        if flip:
            want = want.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        chw = torch.from_numpy(np.array(img)).permute(2, 0, 1)
        got = resample(chw, box, flip, size).numpy().astype(int)
        diff = np.abs(got - np.asarray(want).astype(int))
        assert diff.max() <= 1, (width, height, box, size)
        means.append(diff.mean())
    assert np.mean(means) < 0.1 and max(means) < 0.3
    grey = torch.from_numpy(np.array(img.convert("L")))[None]
    out = resample(grey, (0, 0, width, height), False, 8)
    assert out.shape == (8, 8, 3) and torch.equal(out[..., 0], out[..., 2])


@pytest.mark.parametrize("chunk_floats", [None, 3 * 300 * 300])
def test_a_steps_images_resampled_together_equal_each_resampled_alone(monkeypatch, chunk_floats):
    """The device stage resamples a step's images in batched products over windows padded to
    the largest of their chunk: each output row equals that image resampled alone, whatever
    the sizes, boxes, flips and channels, and however the images fall into chunks."""
    from automlperf.train.data import resample as rs

    if chunk_floats:  # many small chunks, and an image larger than a chunk alone
        monkeypatch.setattr(rs, "CHUNK_FLOATS", chunk_floats)
    rng = np.random.default_rng(1)
    images, boxes, flips, alone = [], [], [], []
    size = 32
    for k in range(17):
        width, height = int(rng.integers(12, 700)), int(rng.integers(12, 700))
        img = _smooth(rng, width, height)
        chw = torch.from_numpy(np.array(img)).permute(2, 0, 1)
        if k % 5 == 0:
            chw = torch.from_numpy(np.array(img.convert("L")))[None]
        box, flip = (train_params(3, 1, k, width, height) if k % 2 else
                     (val_params(width, height, size), k % 4 == 0))
        boxes.append(box)
        flips.append(flip)
        images.append(chw)
        alone.append(resample(chw, box, flip, size))
    rows = [int(r) for r in rng.permutation(len(images))]
    out = torch.full((len(images), size, size, 3), 7, dtype=torch.uint8)
    rs.apply_many(images, boxes, flips, size, out, rows)
    for j, want in enumerate(alone):
        assert torch.equal(out[rows[j]], want), j


def test_a_list_that_fails_as_a_whole_is_decoded_image_by_image():
    files = [_jpeg(photo().crop((0, 0, 40 + i, 30))) for i in range(3)]
    tensors = [torch.frombuffer(bytearray(f), dtype=torch.uint8) for f in files]
    stand_in = PillowStandInDecoder(fail_lists_with=files[1])
    out = decode_list(stand_in, tensors, CPU)
    assert stand_in.calls == [3, 1, 1, 1] and [o.shape[-1] for o in out] == [40, 41, 42]
    broken = decode_list(PillowStandInDecoder(broken=True), tensors, CPU)
    assert broken == [None, None, None]


@pytest.fixture
def odd_folder(tmp_path):
    """make_image_folder's photos and corrupt files, plus a CMYK, a PNG, an EXIF-rotated and a
    progressive file under .JPEG names."""
    counts = make_image_folder(tmp_path, classes=3, train_per_class=7, val_per_class=3,
                               corrupt=2, size=40)
    src = photo().crop((100, 100, 160, 150))
    folder = tmp_path / "train" / "n00000001"
    src.convert("CMYK").save(folder / "cmyk.JPEG")
    src.save(folder / "png.JPEG", "PNG")
    exif = Image.Exif()
    exif[0x0112] = 6
    src.save(folder / "rotated.JPEG", exif=exif.tobytes())
    src.save(folder / "progressive.JPEG", progressive=True)
    counts["train"] += 4
    return tmp_path, counts, (folder / "progressive.JPEG").read_bytes()


def _batches(ds, split, epoch, per_rank=8):
    loader = ds.loader(0, 1, per_rank, 5, CPU)
    return [(x.clone(), y.clone(), bad, example) for x, y, bad, example in loader.passes(split, epoch)]


@pytest.mark.parametrize("split", ["train", "val"])
def test_the_gpu_path_gives_the_cpu_paths_batches(odd_folder, split):
    """Same batches, rows, labels and unreadable counts as the CPU workers, pixels within a
    level: the boxes and flips come from the one reference; CMYK, PNG and EXIF-rotated files
    were decoded by the CPU reference, the progressive one by the decoder, once alone after
    its list failed."""
    root, counts, progressive = odd_folder
    cpu = ImageFolderDataset(root, 32, workers=0)
    stand_in = PillowStandInDecoder(fail_lists_with=progressive)
    gpu = GpuImageFolderDataset(root, 32, workers=2, decoder=stand_in)
    for epoch in (0, 1):
        want, got = _batches(cpu, split, epoch), _batches(gpu, split, epoch)
        assert len(want) == len(got) > 1
        for (wx, wy, wbad, _), (gx, gy, gbad, gexample) in zip(want, got):
            assert torch.equal(wy, gy) and wbad == gbad
            assert wx.shape == gx.shape and (wx.int() - gx.int()).abs().max() <= 1
            if gbad:
                assert "_bad_" in gexample
        assert sum(len(y) for _, y, _, _ in got) == counts[split]
        assert sum(bad for _, _, bad, _ in got) == 2
    # Three files by their headers each pass, and the truncated corrupt one tried by both.
    assert gpu.cpu_decoded == (2 * 3 if split == "train" else 0)
    assert gpu.decode_path.startswith("pillow-stand-in pillow ")
    gpu.release()
    cpu.release()


def test_a_decoder_that_fails_everything_is_given_up_and_the_path_says_so(odd_folder):
    root, counts, _ = odd_folder
    stand_in = PillowStandInDecoder(broken=True)
    gpu = GpuImageFolderDataset(root, 32, workers=2, decoder=stand_in)
    batches = _batches(gpu, "train", 0, per_rank=4)
    assert sum(len(y) for _, y, _, _ in batches) == counts["train"]  # all by the CPU reference
    assert gpu.cpu_decoded == counts["train"]
    # Two steps of whole lists and single images, then no more calls.
    assert gpu._loader.decoder is None and len(stand_in.calls) <= 2 * (1 + 4)
    assert "failed every image of 2 steps" in gpu.decode_path and gpu.decode_path.endswith("cpu-pillow)")
    gpu.release()


def test_a_pass_left_early_stops_its_threads(odd_folder):
    import threading

    root, _, _ = odd_folder
    gpu = GpuImageFolderDataset(root, 32, workers=2, decoder=PillowStandInDecoder())
    before = {t.name for t in threading.enumerate()}
    loader = gpu.loader(0, 1, 2, 0, CPU)
    passes = loader.passes("train", 0)
    next(passes)
    passes.close()  # the consumer leaves after one batch
    assert not any(t.name == "automlperf-decode" for t in threading.enumerate())
    gpu.release()
    assert {t.name for t in threading.enumerate()} <= before


def test_a_trial_records_its_decode_path_and_the_images_decoded_on_the_cpu(odd_folder):
    from automlperf.graph import seeds
    from automlperf.train.spec import TrialSpec
    from automlperf.train.trainer import RankContext, train_on_rank

    root, counts, _ = odd_folder
    gpu = GpuImageFolderDataset(root, 32, workers=2, decoder=PillowStandInDecoder())
    gpu.max_unreadable = 0.2
    graph = seeds.resnet_small(num_classes=3, image_size=32)
    events = []
    out = train_on_rank(TrialSpec("g", graph.to_dict(), epochs=2, batch_size=8, patience=5),
                        RankContext(0, 1, CPU, gpu),
                        emit=lambda kind, p: events.append(p) if kind == "epoch" else None)
    assert out.status == "completed", out.reason
    assert [e["decode_path"] for e in events] == [gpu.decode_path] * 2
    assert [e["cpu_decoded"] for e in events] == [3, 3]  # CMYK, PNG, rotated; validation none
    assert [e["train_images"] for e in events] == [counts["train"]] * 2


def test_no_decoder_installed_means_none_is_offered(monkeypatch):
    monkeypatch.setattr(gpudecode, "DECODERS", ())
    assert gpudecode.gpu_decoder() is None


def test_the_gpu_paths_images_conform_to_the_cpu_reference_on_imagenet_size_photos(tmp_path):
    """bench/bench_gpu_decode.py's conformance measure, with the stand-in decoder: 500x375
    photos at quality 90 through the GPU path's device stage against the CPU reference
    (which may decode at reduced scale, draft, where the path resamples full size)."""
    import importlib.util
    from pathlib import Path

    from automlperf.train.data.generate import write_photo_folder

    spec = importlib.util.spec_from_file_location(
        "bench_gpu_decode", Path(__file__).resolve().parents[2] / "bench" / "bench_gpu_decode.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    write_photo_folder(tmp_path, 2, 12, 2)
    paths, _ = bench.files_of(tmp_path, 24)
    result = bench.conformance(PillowStandInDecoder(), paths, CPU)
    for split in ("train", "val"):
        assert result[split]["images"] == 24
        assert max(result[split]["mean_abs"]) < 0.05 and max(result[split]["p99_9_abs"]) <= 1
