"""The input pipeline as a run's rank has it: its own loader (transform, decoding workers,
threads, per-rank batch, device) in a process set up as a rank, alone and feeding training
steps (``train/loaderprobe.py``). Alone against what training consumes gives the headroom;
beside training, the data share the run will see."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from automlperf.runner.doctor.common import Check, Node, Shape
from automlperf.runner.doctor.official import dataset_dir

# The loader alone over what training consumes: below 1 the devices starve; below this they
# would starve on a node a little busier than now.
HEADROOM_FAIL, HEADROOM_WARN = 1.0, 1.2
# A predicted data share above which the run's training waits too long for its data.
DATA_SHARE_WARN = 0.10
# Seconds of training beside the loader, at the training item's rate, and steps at least.
BESIDE_S, MIN_STEPS = 15.0, 3


def probe(node: Node, shape: Shape, root: Path, index: Path, gpu_decode: bool | None = False,
          compile: bool = False) -> dict[str, Any]:
    """The rank's own loader measured in a process set up as a rank
    (train/loaderprobe.py): a run's data arguments, threads, per-rank batch and device, the
    seed trained beside it for about BESIDE_S of steps at the training item's rate; decoded
    by the CPU workers, or on the GPU (``gpu_decode``)."""
    from automlperf.config import load_config
    from automlperf.graph import seeds
    from automlperf.hardware import accelerator_memory_gib
    from automlperf.train.loaderprobe import probe_in_rank_process

    cfg = load_config(None, "imagenet", {"data": {"data_dir": str(root), "gpu_decode": gpu_decode,
                                                  "image_size": shape.image_size}})
    # Quick: the generated folder holds 48 training images, six steps of 8 a pass (a probe
    # that needs more goes on into the next epochs, as a run does).
    per_rank = 8 if node.req.quick else cfg.train.per_device_batch(accelerator_memory_gib())
    ranks = len(node.devices)
    rate = (node.train_images_per_s or 0.0) / ranks
    steps = max(MIN_STEPS, math.ceil((2.0 if node.req.quick else BESIDE_S) * rate / per_rank))
    graph = seeds.seed(shape.model, shape.classes, shape.image_size, 3)
    measured = probe_in_rank_process(cfg.data, node.devices[0], node.threads, per_rank,
                                     graph.to_dict(), train_steps=steps,
                                     precision=node.req.precision,
                                     channels_last=node.channels_last, index_dir=str(index),
                                     compile=compile)
    measured["threads"] = node.threads
    return measured


def decode_choice(node: Node, shape: Shape, root: Path, index: Path,
                  cpu: dict[str, Any]) -> dict[str, Any]:
    """Which path the node's runs decode with and why (train/data/decodechoice.py): on
    NVIDIA GPUs with a GPU decoder, both paths beside the trial's own steps (compiled where
    the compile rule compiles them), the faster kept for the runs; else the CPU workers."""
    from automlperf.train.data import decodechoice, describe, gpu_decoder

    cuda = node.devices[0].startswith("cuda")
    decoder = gpu_decoder() if cuda else None
    if decoder is None:
        choice = decodechoice.choose(None, cuda, None, None)
        return {"path": choice.path, "why": choice.why}
    compiled = node.trial_images_per_s is not None
    if compiled:  # the CPU path measured again beside the steps a run's trials compile
        cpu = probe(node, shape, root, index, gpu_decode=False, compile=True)
    gpu = probe(node, shape, root, index, gpu_decode=True, compile=compiled)
    described = describe(decoder)
    cpu_rate, gpu_rate = cpu["training"]["images_per_s"], gpu["training"]["images_per_s"]
    try:
        choice = decodechoice.save(decodechoice.key_for(described, cpu["workers"]), cpu_rate,
                                   gpu_rate, str(root))
        kept = ""
    except OSError as exc:
        choice = decodechoice.winner(cpu_rate, gpu_rate)
        kept = f"; not kept for runs ({exc.strerror or exc}): they decode with the CPU workers"
    return {"path": choice.path, "why": f"automatic: {choice.why}{kept}", "decoder": described,
            "beside_compiled_steps": compiled, "gpu": gpu,
            "cpu_images_per_s": cpu_rate, "gpu_images_per_s": gpu_rate}


def verdict(alone: float, need: float | None, share: float,
            accelerated: bool = True) -> tuple[str, str]:
    """(status, advice) from the loader's rate alone against what training consumes (per
    rank) and the data share measured beside training."""
    more = ("give each device more cores (data.workers), or install the nvjpeg extra so that "
            "the doctor compares the GPU decoding path (data.gpu_decode unset)" if accelerated else
            "decoding and training share this node's cores: more cores, or smaller files")
    if need and alone < HEADROOM_FAIL * need:
        return "fail", f"the loader alone cannot feed training (the data side limits): {more}"
    if need and alone < HEADROOM_WARN * need:
        return "warn", (f"less than {HEADROOM_WARN}x headroom: a busier node will starve the "
                        f"devices; {more}")
    if share > DATA_SHARE_WARN:
        return "warn", (f"training waits for data {share:.0%} of its time beside the loader "
                        f"(the data side limits): {more}")
    return "pass", ""


def pipeline(node: Node, shape: Shape) -> Check:
    from automlperf.train.data import prepare_index, shm_free

    root = dataset_dir(node, shape)
    # Scanned here, once: a folder that cannot be used fails in its own words, and the
    # probe's rank maps the saved index as a run's ranks do.
    index = node.req.out / "index"
    prepare_index(str(root), str(index))
    measured = probe(node, shape, root, index)
    ranks = len(node.devices)
    alone = measured["alone"]["images_per_s"]
    beside = measured["training"]
    # A first-round trial that compiles consumes the compiled rate, and the official run's
    # long trials are those: the loader is judged against it (beside training, the probe's
    # steps stay eager, so that share is what the eager rate sees).
    compiled = node.trial_images_per_s is not None
    consumed = node.trial_images_per_s or node.train_images_per_s
    need = consumed / ranks if consumed else None
    headroom = alone / need if need else None
    figures: dict[str, Any] = {"data_dir": str(root), **measured,
                               "needed_images_per_s_per_rank": need, "need_compiled": compiled,
                               "headroom": headroom,
                               "predicted_data_share": beside["data_share"],
                               "shm_free_bytes": shm_free()}
    summary = (f"rank loader ({measured.get('decode_path') or 'cpu'}, {measured['workers']} "
               f"worker(s), {measured['rank_threads']} rank thread(s), batch "
               f"{measured['per_rank']}, {measured['device']}): alone {alone:.1f} img/s"
               + (f", {headroom:.2f}x what {'compiled ' if compiled else ''}training "
                  f"consumes ({need:.1f})" if need else "")
               + f"; beside {'eager ' if compiled else ''}training ({beside['steps']} steps, "
               f"{beside['passes']} pass(es)) {beside['images_per_s']:.1f} img/s, data share "
               f"{beside['data_share']:.2f} (device {beside['device_share']:.2f})"
               + ("" if compiled else ": the run's will be about that"))
    choice = decode_choice(node, shape, root, index, measured)
    figures["decode_choice"] = choice
    summary += f"; decode path: {choice['path']} ({choice['why']})"
    chosen = choice["gpu"] if choice["path"] == "gpu" else measured
    figures["compile_figures_given_loader_rate"] = _note_loader(node, chosen["alone"]["images_per_s"])
    status, advice = verdict(alone, need, beside["data_share"], node.accelerated)
    return Check("input pipeline", status, summary, advice, figures)


def _note_loader(node: Node, images_per_s: float) -> int:
    """The chosen path's rate alone, given to the compile figures kept for this node, so
    that the compile rule caps the steps' rates by it (train/compiling.py); how many."""
    from automlperf.train.compilecache import note_loader_rate

    try:
        return note_loader_rate(node.devices[0], images_per_s)
    except OSError:
        return 0
