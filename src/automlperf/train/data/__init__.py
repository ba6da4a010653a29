"""Datasets behind one interface: each yields normalised (images, labels) batches on a device,
sharded across data-parallel ranks (the same number of batches on every rank), and counts
the images it actually delivered.

* ``builtin``: the MNIST sample shipped with the package (5,000 images, 10 classes).
* ``digits``: the small handwritten digits shipped with the package (1,797 images of 8x8).
* ``cifar10``: the CIFAR-10 binary or python batches from a local folder (read as data; the
  python batches go through an unpickler that only admits NumPy arrays).
* ``imagenet``: the official ILSVRC-2012 archives (each image read with one ``pread``), or
  ``train/<class>/*.JPEG`` and ``val/<class>/*.JPEG``, read through the dataset layer's
  reader (automlperf.dataset) and decoded by worker processes (or on NVIDIA GPUs by nvJPEG,
  with the same boxes and flips, worker processes reading the images for it: gpudecode.py,
  gpuring.py; or, when asked, by NVIDIA DALI's own pipeline), random-resized-crop + flip
  for training, resize + centre crop for validation. The index is made once and shared as arrays;
  one loader per trial keeps its workers for every pass, decodes in small chunks within a
  byte budget, and hands over NHWC uint8 (channels-last on the device at no cost).
* ``synthetic``: random tensors made on the device, for throughput only.

Unreadable images are skipped and counted, with one of them kept as an example; whether a
share of them is too many is the trainer's judgement (``max_unreadable``).
"""

from __future__ import annotations

from automlperf.config import DataConfig
from automlperf.train.data.base import IMAGENET_MEAN, IMAGENET_STD, DataError, Dataset, step_plan
from automlperf.train.data.dali import DaliImageFolderDataset, dali_available
from automlperf.train.data.transform import random_resized_crop_box, train_params, val_params
from automlperf.train.data.folders import (
    CHUNK_IMAGES,
    SHARED_BUDGET,
    ImageFolderDataset,
    LoaderPlan,
    fit_shared_budget,
    plan_loader,
    shm_free,
)
from automlperf.train.data import decodechoice
from automlperf.train.data.gpudecode import GpuImageFolderDataset, describe, gpu_decoder
from automlperf.train.data.index import FileIndex, prepare_index, scan_image_folder
from automlperf.train.data.memory import SyntheticDataset, TensorDataset, builtin, cifar10, digits
from automlperf.train.spec import plan_steps

__all__ = ["CHUNK_IMAGES", "IMAGENET_MEAN", "IMAGENET_STD", "SHARED_BUDGET", "DaliImageFolderDataset",
           "DataError", "Dataset", "FileIndex", "GpuImageFolderDataset", "ImageFolderDataset", "LoaderPlan",
           "SyntheticDataset", "TensorDataset", "builtin", "cifar10", "dali_available", "digits",
           "describe", "fit_shared_budget", "gpu_decoder", "load", "plan_loader", "plan_steps", "prepare_index",
           "random_resized_crop_box", "scan_image_folder", "shm_free", "step_plan", "train_params",
           "val_params"]


def load(data: DataConfig, index_dir: str | None = None, device_type: str = "cpu") -> Dataset:
    """The dataset of a configuration's data section (see :func:`_load`), allowed
    ``data.max_unreadable`` of its images unreadable per split and epoch. ``index_dir``: a
    scanned index of its image folder (:class:`FileIndex`), else the folder is walked;
    ``device_type``: where the images go; ``data.val_cache``: whether an image folder keeps
    its decoded validation shard on the device. ``data.workers`` unset is no decoding workers
    (:meth:`DataConfig.for_ranks` sets them for a rank's cores)."""
    dataset = _load(data, index_dir, device_type)
    dataset.max_unreadable = data.max_unreadable
    if isinstance(dataset, ImageFolderDataset):
        dataset.val_cache = data.val_cache
    return dataset


def _load(data: DataConfig, index_dir: str | None, device_type: str) -> Dataset:
    """A dataset by name; raises DataError naming what is missing. Image folders are decoded
    by DALI when ``dali`` is set; else on the GPU with nvJPEG where ``gpu_decode`` is true, or
    unset and `automlperf doctor` measured it faster on this node (decodechoice.py); else by
    the CPU workers."""
    size, workers = data.image_size, data.workers or 0
    if data.dataset == "builtin":
        return builtin(size)
    if data.dataset == "digits":
        return digits(size)
    if data.dataset == "cifar10":
        return cifar10(data.data_dir, size)
    if data.dataset == "imagenet":
        if data.dali:
            return DaliImageFolderDataset(data.data_dir, size, workers, index_dir=index_dir)
        if data.gpu_decode and device_type != "cuda":
            raise DataError("gpu_decode needs the ranks to train on NVIDIA GPUs (nvJPEG); set "
                            "data.gpu_decode = false on this node, or leave it unset")
        decoder = gpu_decoder() if device_type == "cuda" and data.gpu_decode is None else None
        described = describe(decoder) if decoder is not None else None
        choice = decodechoice.choose(
            data.gpu_decode, device_type == "cuda", described,
            decodechoice.key_for(described, workers) if described else None)
        folder: ImageFolderDataset
        if choice.gpu:
            folder = GpuImageFolderDataset(data.data_dir, size, workers, index_dir=index_dir,
                                           decoder=decoder)
        else:
            folder = ImageFolderDataset(data.data_dir, size, workers, index_dir=index_dir)
        folder.decode_choice = choice.why
        return folder
    if data.dataset == "synthetic":
        return SyntheticDataset(size, data.synthetic_classes, data.synthetic_images)
    raise DataError(f"unknown dataset {data.dataset!r}; choose imagenet, cifar10, builtin, "
                    "digits or synthetic")
