"""The same images decoded by NVIDIA DALI (the ``dali`` extra): on the GPU (nvJPEG) when
the rank has one, else with DALI's CPU decoders. DALI's external source is fed each step's
bytes as the dataset's reader reads them (an archive's images by ``pread``, a folder's files).

Not the reference's function (train/data/transform.py): DALI draws its own random crops and
flips and resizes with its own filter, so it is chosen only when asked (``data.dali``) and
its epochs record a decode path that says so. The nvJPEG path (gpudecode.py) computes the
reference's function on the GPU."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from automlperf.seeding import mix_seed
from automlperf.train.data.base import DataError, step_plan
from automlperf.train.data.folders import ImageFolderDataset


def dali_available() -> bool:
    """Whether NVIDIA DALI can be imported (the ``dali`` extra)."""
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        return False
    return True


class _DaliLoader:
    """One rank's DALI pipelines for one trial, training and validation, each built once and
    fed the step plan's files step by step, so every rank takes the same steps and every
    image is used once per epoch, as with the worker loader. Rebuilding a pipeline per epoch
    would leave DALI's device memory pool to grow. Images come out as NHWC uint8: no layout
    copy for channels-last, a quarter of the bytes of float CHW.

    Files DALI cannot decode are counted, not fatal: a step whose batch fails is decoded
    again without the files that fail on their own."""

    def __init__(self, ds: ImageFolderDataset, rank: int, world: int, per_rank: int, seed: int,
                 device: torch.device) -> None:
        self.ds, self.rank, self.world, self.per_rank = ds, rank, world, per_rank
        self.seed, self.device = seed, device
        self.gpu = device.type == "cuda"
        self._pipes: dict[bool, Any] = {}
        self._probe: Any = None

    def key(self) -> tuple[Any, ...]:
        return (self.rank, self.world, self.per_rank, self.seed, self.device)

    def _build(self, train: bool, batch: int) -> Any:
        from nvidia.dali import fn, pipeline_def, types

        size = self.ds.image_size
        decoder = "mixed" if self.gpu else "cpu"

        # One batch in flight (prefetch depth 1): each step's files are given with the run
        # that decodes them, so a decoding error belongs to that step. A CPU-only pipeline
        # has no device.
        device: dict[str, Any] = {"device_id": (self.device.index or 0) if self.gpu else None}

        @pipeline_def(batch_size=batch, num_threads=max(1, self.ds.workers),
                      seed=mix_seed(self.seed, train) % 2**31, prefetch_queue_depth=1, **device)
        def pipe():
            files = fn.external_source(name="files", dtype=types.UINT8, ndim=1)
            if train:
                images = fn.decoders.image_random_crop(files, device=decoder,
                                                       output_type=types.RGB)
                images = fn.resize(images, resize_x=size, resize_y=size)
                mirror = fn.random.coin_flip(probability=0.5)
            else:
                images = fn.decoders.image(files, device=decoder, output_type=types.RGB)
                images = fn.resize(images, resize_shorter=round(size / 0.875))
                mirror = 0
            return fn.crop_mirror_normalize(images, crop=(size, size), mirror=mirror,
                                            dtype=types.UINT8, output_layout="HWC")

        built = pipe()
        built.build()
        return built

    def _pipeline(self, train: bool) -> Any:
        if train not in self._pipes:
            # The longest share of a step: the per-rank batch and a small remainder.
            self._pipes[train] = self._build(train, self.per_rank + 2)
        return self._pipes[train]

    def _run(self, train: bool, files: list[np.ndarray]) -> torch.Tensor:
        from nvidia.dali.plugin.pytorch.torch_utils import to_torch_tensor

        (out,) = self._pipeline(train).run(files=files)
        return to_torch_tensor(out.as_tensor(), copy=True)

    def _decodable(self, data: np.ndarray) -> bool:
        """Whether one file decodes on its own, in a one-image pipeline with the same decoder."""
        if self._probe is None:
            self._probe = self._build(False, 1)
        try:
            self._probe.run(files=[data])
        except RuntimeError:
            return False
        return True

    def _decode(self, train: bool, rows: list[int]) -> tuple[torch.Tensor, list[int]]:
        files: list[np.ndarray] = []
        kept: list[int] = []
        for row in rows:
            try:
                data = np.frombuffer(self.ds.reader.read(row), dtype=np.uint8)
            except OSError:
                continue
            if data.size:
                files.append(data)
                kept.append(row)
        s = self.ds.image_size
        if files:
            try:
                return self._run(train, files), kept
            except RuntimeError:
                good = [i for i, data in enumerate(files) if self._decodable(data)]
                files, kept = [files[i] for i in good], [kept[i] for i in good]
            if files:
                try:
                    return self._run(train, files), kept
                except RuntimeError:
                    # DALI pipelines outlive an operator's error; one that did not is built
                    # again, once.
                    self._pipes.pop(train, None)
                    self._probe = None
                    return self._run(train, files), kept
        return torch.empty((0, s, s, 3), dtype=torch.uint8, device=self.device), kept

    def passes(self, split: str, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor, int, str]]:
        """(NHWC uint8 images on the device, labels, unreadable count, an unreadable file and
        why) for every step."""
        train = split == "train"
        base = 0 if train else self.ds.index.train_size
        for rows in step_plan(len(self.ds.index.rows(split)), self.rank, self.world,
                              self.per_rank, split, epoch, self.seed):
            wanted = (rows + base).tolist()
            images, kept = self._decode(train, wanted)
            labels = torch.from_numpy(self.ds.index.labels[kept].astype(np.int64))
            lost = sorted(set(wanted) - set(kept))
            example = f"{self.ds.reader.name(lost[0])}: DALI cannot read or decode it" if lost else ""
            yield (images.to(self.device, non_blocking=True),
                   labels.to(self.device, non_blocking=True), len(wanted) - len(kept), example)

    def close(self) -> None:
        self._pipes.clear()
        self._probe = None


class DaliImageFolderDataset(ImageFolderDataset):
    """The same folders decoded by NVIDIA DALI: on the GPU (nvJPEG) when the rank has one,
    else with DALI's CPU decoders."""

    def __init__(self, root: Path | str | None, image_size: int = 224, workers: int = 4,
                 index_dir: Path | str | None = None) -> None:
        if not dali_available():
            raise DataError("data.dali needs NVIDIA DALI: pip install 'automlperf[dali]' "
                            "(CUDA 13; 'automlperf[dali-cuda12]' for CUDA 12), or set "
                            "data.dali = false")
        super().__init__(root, image_size, workers, "imagenet", index_dir)

    @property
    def decode_path(self) -> str:
        import nvidia.dali

        return (f"dali-own-crops {nvidia.dali.__version__} (DALI's own crops, flips and "
                "resizing: not the reference function)")

    def _new_loader(self, rank: int, world: int, per_rank: int, seed: int,
                    device: torch.device) -> Any:
        return _DaliLoader(self, rank, world, per_rank, seed, device)
