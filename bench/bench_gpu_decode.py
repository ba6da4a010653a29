"""JPEG decoding on an NVIDIA GPU: the candidates side by side in one run, for the choice of
the GPU decoding path (train/data/gpudecode.py) and its figures in bench/RESULTS.md.

For each candidate that imports here (torchcodec's and torchvision's ``decode_jpeg`` on CUDA,
NVIDIA nvImageCodec, NVIDIA DALI's mixed decoder):

1. decode only: lists of ``--batch`` files already in memory, images per second and the
   process's CPU seconds per 1,000 images (every thread of this process: the library's
   Huffman threads included);
2. the whole device stage of the path (gpudecode.decode_slot: decode, then the reference's
   resampling into a 224x224 batch) for the decoders behind the path's seam;
3. conformance: ``--conformance`` images through that stage against the CPU reference
   (transform.py, Pillow) for training and validation boxes: per-channel mean and 99.9th
   percentile of |difference|, and its maximum.

Then the path under training (train/loaderprobe.py's measurement): the seed ResNet-50 at 224,
eager channels-last, fed by the GPU path and by the CPU workers, against the same steps on one
batch held on the device: images/s and the data share; and the GPU memory the decode path
took. Everything goes to one JSON object (``--out``), each figure with its device, driver,
library versions and the folder's mean file size.

The folder: ``--folder``, else an ImageNet-layout one of 500x375 photos at quality 90
generated under ``--work`` (train/data/generate.py, as `automlperf doctor` writes them).

On a GPU machine without internet, from the project's root (the torchcodec wheel fetched
beforehand where PyPI is reachable, beside the project's: `bash ../shared/device/prepare.sh`
then `python -m pip download --no-deps --only-binary=:all: --python-version 3.12
--platform manylinux_2_28_x86_64 -d .device/whl torchcodec==0.17.0`):

    pip install --no-index --no-deps --target /tmp/site .device/whl/*.whl
    PYTHONPATH=/tmp/site python3 bench/bench_gpu_decode.py --out $OUT/gpu-decode.json

About 4 minutes on one H200 (``--quick``: about 1).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch


def versions() -> dict[str, Any]:
    import PIL

    out: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda,
                           "pillow": PIL.__version__}
    for name in ("torchvision", "torchcodec", "nvidia.nvimgcodec", "nvidia.dali"):
        try:
            module = __import__(name, fromlist=["__version__"])
            out[name] = getattr(module, "__version__", "?")
        except Exception:  # noqa: BLE001 - not installed, or does not load here
            out[name] = None
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(0)
        try:
            import pynvml

            pynvml.nvmlInit()
            out["driver"] = pynvml.nvmlSystemGetDriverVersion()
        except Exception:  # noqa: BLE001 - the figures stand without it
            out["driver"] = None
    return out


class NvImageCodecDecoder:
    """NVIDIA nvImageCodec's batched decoder, measured for comparison (not behind the path's
    seam: its outputs are CUDA array interfaces, turned into tensors here)."""

    name = "nvjpeg-nvimgcodec"

    def __init__(self) -> None:
        from nvidia import nvimgcodec

        self._codec = nvimgcodec
        self._decoder = nvimgcodec.Decoder()

    def versions(self) -> dict[str, str]:
        return {"nvimgcodec": str(getattr(self._codec, "__version__", "?"))}

    def decode(self, files: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        images = self._decoder.decode([f.numpy().tobytes() for f in files])
        return [torch.as_tensor(img, device=device).permute(2, 0, 1) for img in images]


class DaliDecoder:
    """DALI's mixed (nvJPEG) decoder alone, in a pipeline fed the files, for comparison."""

    name = "dali-mixed"

    def __init__(self, batch: int) -> None:
        from nvidia.dali import fn, pipeline_def, types

        @pipeline_def(batch_size=batch, num_threads=4, device_id=0, prefetch_queue_depth=1)
        def pipe():  # type: ignore[no-untyped-def]
            files = fn.external_source(name="files", dtype=types.UINT8, ndim=1)
            return fn.decoders.image(files, device="mixed", output_type=types.RGB)

        self._pipe = pipe()
        self._pipe.build()
        self.batch = batch

    def versions(self) -> dict[str, str]:
        import nvidia.dali

        return {"dali": nvidia.dali.__version__}

    def decode(self, files: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        from nvidia.dali.plugin.pytorch.torch_utils import to_torch_tensor

        (out,) = self._pipe.run(files=[f.numpy() for f in files])
        return [to_torch_tensor(out[i], copy=True).permute(2, 0, 1) for i in range(len(out))]


def candidates(batch: int) -> dict[str, Any]:
    from automlperf.train.data.gpudecode import TorchcodecDecoder, TorchvisionDecoder

    found: dict[str, Any] = {}
    for make in (TorchcodecDecoder, TorchvisionDecoder, NvImageCodecDecoder,
                 lambda: DaliDecoder(batch)):
        try:
            decoder = make()
        except Exception as exc:  # noqa: BLE001 - recorded: what did not import, and why
            found[getattr(make, "name", "dali-mixed")] = f"unavailable: {type(exc).__name__}: {exc}"[:300]
            continue
        found[decoder.name] = decoder
    return found


def files_of(root: Path, n: int) -> tuple[list[str], list[torch.Tensor]]:
    paths = sorted(str(p) for p in (root / "train").glob("*/*"))[:n]
    return paths, [torch.frombuffer(bytearray(Path(p).read_bytes()), dtype=torch.uint8)
                   for p in paths]


def decode_only(decoder: Any, files: list[torch.Tensor], batch: int, device: torch.device,
                seconds: float) -> dict[str, Any]:
    """Images/s and CPU seconds per 1,000 images of the decoder alone on lists of ``batch``."""
    lists = [files[i:i + batch] for i in range(0, len(files) - batch + 1, batch)] or [files]
    for chunk in lists[:2]:  # warm-up: the decoder's state, the allocator
        decoder.decode(chunk, device)
    torch.cuda.synchronize()
    images, cpu0, t0 = 0, time.process_time(), time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for chunk in lists:
            decoder.decode(chunk, device)
            images += len(chunk)
    torch.cuda.synchronize()
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return {"images_per_s": images / wall, "cpu_s_per_1000": 1000 * cpu / images,
            "images": images, "batch": batch}


def device_stage(decoder: Any, paths: list[str], batch: int, device: torch.device,
                 seconds: float, size: int = 224) -> dict[str, Any]:
    """Images/s of the path's whole device stage (decode, resample into the batch), the host
    stage done beforehand."""
    from automlperf.train.data.gpudecode import Streams, decode_slot
    from automlperf.train.data.gpuring import stage_files
    from automlperf.train.data.handoff import page_lock

    rings = [stage_files(paths[i:i + batch], size, True)
             for i in range(0, len(paths) - batch + 1, batch)]
    # As the loader's ring is: the decoder and the copies read page-locked memory.
    locked = [page_lock(int(ring.rows.ctypes.data), ring.nbytes) for ring in rings]
    streams = Streams(device)

    def one(ring: Any) -> None:
        decode_slot(ring, 0, ring.capacity, decoder, device, streams)

    try:
        one(rings[0])
        torch.cuda.synchronize()
        images, cpu0, t0 = 0, time.process_time(), time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            for ring in rings:
                one(ring)
                images += ring.capacity
        torch.cuda.synchronize()
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    finally:
        torch.cuda.synchronize()
        for address in locked:
            if address:
                torch.cuda.cudart().cudaHostUnregister(address)
    return {"images_per_s": images / wall, "cpu_s_per_1000": 1000 * cpu / images,
            "peak_gib": torch.cuda.max_memory_allocated(device) / 2**30}


def conformance(decoder: Any, paths: list[str], device: torch.device, size: int = 224) -> dict[str, Any]:
    """The path's images against the reference's (each file decoded whole on the CPU),
    training and validation boxes."""
    from automlperf.train.data.gpudecode import decode_slot
    from automlperf.train.data.gpuring import stage_files
    from automlperf.train.data.transform import decode_file

    out: dict[str, Any] = {}
    for train in (True, False):
        diffs = []
        for start in range(0, len(paths), 64):
            chunk = paths[start:start + 64]
            ring = stage_files(chunk, size, train, first_row=start)
            step = decode_slot(ring, 0, len(chunk), decoder, device)
            got = step.images.cpu().numpy().astype(np.int16)
            want = np.empty((len(chunk), size, size, 3), np.uint8)
            kept = 0
            for i, p in enumerate(chunk):
                if decode_file(p, size, train, 0, 0, start + i, want[kept], reduced=False) is None:
                    kept += 1
            diffs.append(np.abs(got - want[:kept].astype(np.int16)))
        d = np.concatenate(diffs).reshape(-1, 3)
        out["train" if train else "val"] = {
            "images": int(len(np.concatenate(diffs))),
            "mean_abs": [float(v) for v in d.mean(axis=0)],
            "p99_9_abs": [float(v) for v in np.percentile(d, 99.9, axis=0)],
            "max_abs": int(d.max())}
    return out


def under_training(root: Path, gpu: bool, per_rank: int, steps: int) -> dict[str, Any]:
    """The seed ResNet-50 at 224, eager channels-last, fed by the GPU path or the CPU
    workers: train/loaderprobe.py's measurement (alone, then beside ``steps`` training
    steps), in this process."""
    from automlperf.config import DataConfig
    from automlperf.graph import seeds
    from automlperf.hardware import cores_available
    from automlperf.train import data as datasets
    from automlperf.train.loaderprobe import probe_loader

    threads = cores_available()
    ds = datasets.load(DataConfig(dataset="imagenet", data_dir=root, image_size=224,
                                  workers=max(1, threads - 1), gpu_decode=gpu), device_type="cuda")
    device = torch.device("cuda:0")
    torch.cuda.reset_peak_memory_stats(device)
    path = ds.decode_path
    out = probe_loader(ds, device, per_rank, seeds.resnet50().to_dict(), train_steps=steps,
                       channels_last=True)
    out.update({"path": path, "peak_gib": torch.cuda.max_memory_allocated(device) / 2**30,
                "cpu_decoded": ds.cpu_decoded})
    return out


def steps_alone(per_rank: int, steps: int = 30) -> dict[str, Any]:
    """The same training steps on one batch held on the device: the rate a loader must feed."""
    from automlperf.graph import Graph, seeds
    from automlperf.train.spec import TrialSpec
    from automlperf.train.data import SyntheticDataset
    from automlperf.train.device import synchronize
    from automlperf.train.trainer import RankContext, _Run

    device = torch.device("cuda:0")
    graph = seeds.resnet50()
    spec = TrialSpec("steps", graph.to_dict(), epochs=1, batch_size=per_rank, patience=1,
                     compile=False)
    run = _Run(spec, RankContext(0, 1, device, SyntheticDataset(224, 1000, per_rank)),
               Graph.from_dict(spec.graph))
    x = torch.randn(per_rank, 3, 224, 224, device=device)
    y = torch.randint(0, 1000, (per_rank,), device=device)
    for _ in range(5):
        run._step(x, y)
    synchronize(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        run._step(x, y)
    synchronize(device)
    return {"images_per_s": steps * per_rank / (time.perf_counter() - t0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path)
    parser.add_argument("--work", type=Path, default=Path("/tmp/gpu-decode"))
    parser.add_argument("--images", type=int, default=2048, help="files decoded in the "
                        "decode-only loops")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=10.0, help="each timed loop")
    parser.add_argument("--conformance", type=int, default=512)
    parser.add_argument("--quick", action="store_true", help="short loops, no training")
    parser.add_argument("--out", type=Path, default=Path("gpu-decode.json"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_gpu_decode needs a CUDA device")
    if args.quick:
        args.seconds, args.conformance, args.images = 3.0, 128, 512
    root = args.folder
    if root is None:
        from automlperf.train.data.generate import write_photo_folder

        root = args.work / "folder"
        if not (root / "val").exists():
            write_photo_folder(root, 16, max(1, args.images // 16), 4)
    paths, files = files_of(root, args.images)
    device = torch.device("cuda:0")
    result: dict[str, Any] = {"versions": versions(), "folder": str(root),
                              "mean_file_bytes": statistics.mean(len(f) for f in files),
                              "files": len(files), "decoders": {}}

    def save() -> None:
        args.out.write_text(json.dumps(result, indent=1))

    for name, decoder in candidates(args.batch).items():
        entry: dict[str, Any] = result["decoders"].setdefault(name, {})
        if isinstance(decoder, str):
            entry["error"] = decoder
            continue
        entry["versions"] = decoder.versions()
        for what, measure in (
                ("decode_only", lambda d=decoder: decode_only(d, files, args.batch, device, args.seconds)),
                ("device_stage", lambda d=decoder: device_stage(d, paths, args.batch, device, args.seconds)),
                ("conformance", lambda d=decoder: conformance(d, paths[:args.conformance], device))):
            if what != "decode_only" and name.startswith("dali"):
                continue  # DALI is not behind the path's seam
            try:
                entry[what] = measure()
            except Exception as exc:  # noqa: BLE001 - the other figures still count
                entry[what] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            print(name, what, json.dumps(entry[what])[:300], flush=True)
            save()
    if not args.quick:
        result["steps_alone"] = steps_alone(args.batch)
        for label, gpu in (("gpu_path", True), ("cpu_workers", False)):
            try:
                result[label] = under_training(root, gpu, args.batch, steps=150)
            except Exception as exc:  # noqa: BLE001
                result[label] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            print(label, json.dumps(result[label])[:400], flush=True)
            save()
    save()
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
