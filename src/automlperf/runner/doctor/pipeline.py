"""The input pipeline as a run's rank has it: its own loader (transform, decoding workers,
threads, per-rank batch, device) in a process set up as a rank, alone and feeding training
steps (``train/loaderprobe.py``). Alone against what training consumes gives the headroom;
beside training, the data share the run will see and the host cores it keeps busy.

On NVIDIA GPUs with a GPU decoder, both decode paths are probed beside the steps a run's
trials take (compiled where the compile rule compiles them) and the faster is kept for the
runs (:func:`decode_choice`); the item is then judged on the path chosen, with the other's
figures beside it. Elsewhere one probe, of the CPU workers beside eager steps.
"""

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
          compile: bool = False, classes: int | None = None) -> dict[str, Any]:
    """The rank's own loader measured in a process set up as a rank
    (train/loaderprobe.py): a run's data arguments, threads, per-rank batch and device, the
    seed (with ``classes`` outputs, the shape's by default) trained beside it for about
    BESIDE_S of steps at the training item's rate; decoded by the CPU workers, or on the GPU
    (``gpu_decode``)."""
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
    graph = seeds.seed(shape.model, classes or shape.classes, shape.image_size, 3)
    measured = probe_in_rank_process(cfg.data, node.devices[0], node.threads, per_rank,
                                     graph.to_dict(), train_steps=steps,
                                     precision=node.req.precision,
                                     channels_last=node.channels_last, index_dir=str(index),
                                     compile=compile)
    measured["threads"] = node.threads
    return measured


def decoder_here(node: Node) -> str | None:
    """The GPU decoder the node's runs could decode with (its description), or None: no
    NVIDIA GPU, or no decoder installed."""
    from automlperf.train.data import describe, gpu_decoder

    if not node.devices[0].startswith("cuda"):
        return None
    decoder = gpu_decoder()
    return describe(decoder) if decoder is not None else None


def decode_choice(node: Node, root: Path, cpu: dict[str, Any] | None,
                  gpu: dict[str, Any] | None, decoder: str | None) -> dict[str, Any]:
    """Which path the node's runs decode with and why (train/data/decodechoice.py), from the
    two probes beside the same steps (``cpu``, ``gpu``; None where not probed): the faster,
    kept for the runs, with its margin and whether that is within the probes' own spread.
    Without a GPU decoder (``decoder``), the CPU workers."""
    from automlperf.train.data import decodechoice

    if decoder is None or cpu is None or gpu is None:
        cuda = node.devices[0].startswith("cuda")
        choice = decodechoice.choose(None, cuda, decoder, None)
        return {"path": choice.path, "why": choice.why}
    cpu_rate, gpu_rate = cpu["training"]["images_per_s"], gpu["training"]["images_per_s"]
    spreads = [p["training"].get("spread") for p in (cpu, gpu)]
    noise = max((s for s in spreads if s is not None), default=None)
    try:
        choice = decodechoice.save(decodechoice.key_for(decoder, cpu["workers"]), cpu_rate,
                                   gpu_rate, str(root), noise=noise)
        kept = ""
    except OSError as exc:
        choice = decodechoice.winner(cpu_rate, gpu_rate, noise)
        kept = f"; not kept for runs ({exc.strerror or exc}): they decode with the CPU workers"
    return {"path": choice.path, "why": f"automatic: {choice.why}{kept}", "decoder": decoder,
            "beside_compiled_steps": bool(gpu.get("compiled")),
            "cpu_images_per_s": cpu_rate, "gpu_images_per_s": gpu_rate,
            "margin": choice.margin, "noise": choice.noise,
            "noise_measured": noise is not None, "within_noise": choice.within_noise}


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
    # probe's rank maps the saved index as a run's ranks do. The probe's model has an output
    # for each of the folder's classes (a site's folder may hold more than the shape's).
    index = node.req.out / "index"
    files = prepare_index(str(root), str(index))
    classes = max(shape.classes, len(files.classes))
    ranks = len(node.devices)
    # A first-round trial that compiles consumes the compiled rate, and the official run's
    # long trials are those: the loader is judged against it.
    compiled = node.trial_images_per_s is not None
    consumed = node.trial_images_per_s or node.train_images_per_s
    need = consumed / ranks if consumed else None
    decoder = decoder_here(node)
    if decoder is None:  # one path: the CPU workers, beside eager steps
        cpu, gpu = probe(node, shape, root, index, classes=classes), None
        cpu["compiled"] = False
    else:  # both paths beside the steps a run's trials take
        cpu = probe(node, shape, root, index, gpu_decode=False, compile=compiled, classes=classes)
        gpu = probe(node, shape, root, index, gpu_decode=True, compile=compiled, classes=classes)
        cpu["compiled"] = gpu["compiled"] = compiled
    choice = decode_choice(node, root, cpu, gpu, decoder)
    chosen, other = (gpu, cpu) if choice["path"] == "gpu" and gpu is not None else (cpu, gpu)
    alone = chosen["alone"]["images_per_s"]
    beside = chosen["training"]
    headroom = alone / need if need else None
    figures: dict[str, Any] = {"data_dir": str(root), **chosen, "chosen_path": choice["path"],
                               "needed_images_per_s_per_rank": need, "need_compiled": compiled,
                               "headroom": headroom,
                               "predicted_data_share": beside["data_share"],
                               "busy_host_cores": beside.get("busy_cores"),
                               "shm_free_bytes": shm_free(), "decode_choice": choice}
    if other is not None:
        figures["other_path"] = {"path": "cpu" if other is cpu else "gpu",
                                 **{k: other.get(k) for k in ("alone", "training", "decode_path",
                                                              "workers", "rank_threads")}}
    summary = (f"{choice['path']} path, chosen ({chosen.get('decode_path') or 'cpu'}, "
               f"{chosen['workers']} worker(s), {chosen['rank_threads']} rank thread(s), batch "
               f"{chosen['per_rank']}, {chosen['device']}): alone {alone:.1f} img/s"
               + (f", {headroom:.2f}x what {'compiled ' if compiled else ''}training "
                  f"consumes ({need:.1f})" if need else "")
               + "; " + _beside_words(chosen, compiled and decoder is not None)
               + ("" if compiled and decoder is None else ": the run's will be about that"))
    if other is not None:
        summary += (f"; the {figures['other_path']['path']} path: alone "
                    f"{other['alone']['images_per_s']:.1f} img/s, "
                    + _beside_words(other, compiled))
    summary += f"; decode path: {choice['path']} ({choice['why']})"
    figures["file_mix"] = mix = file_mix(files, shape, chosen)
    summary += "; " + mix_words(mix)
    figures["compile_figures_given_loader_rate"] = _note_loader(node, alone)
    status, advice = verdict(alone, need, beside["data_share"], node.accelerated)
    return Check("input pipeline", status, summary, advice, figures)


def file_mix(files: Any, shape: Shape, probed: dict[str, Any]) -> dict[str, Any]:
    """The folder's training files counted by what decides their decoding
    (train/data/filemix.py), with the GPU path's limits at the probed batch and workers, and
    the cost of its tail: the files it leaves to the CPU reference, timed on a few of them,
    in core-seconds an epoch and in cores at the rate the probe fed beside training."""
    from automlperf.train.data import filemix
    from automlperf.train.data.gpudecode import GPU_CHUNK_IMAGES

    chunk = max(1, min(GPU_CHUNK_IMAGES,
                       math.ceil((probed["per_rank"] + 2) / max(1, probed["workers"]))))
    mix = filemix.folder_mix(files, filemix.gpu_mix(shape.image_size, chunk))
    per_file = filemix.tail_cost(mix.pop("tail"), shape.image_size)
    share = mix["gpu_path"]["cpu_reference"]
    mix["tail_core_s_per_file"] = per_file
    mix["tail_core_s_per_epoch"] = None if per_file is None else per_file * share * mix["train_files"]
    rate = probed["training"]["images_per_s"]
    mix["tail_cores_beside_training"] = None if per_file is None else per_file * share * rate
    return mix


def mix_words(mix: dict[str, Any]) -> str:
    shares, gpu = mix["shares"], mix["gpu_path"]
    sampled = ("" if mix["sampled_every"] == 1 else
               f" (every {mix['sampled_every']}th of {mix['train_files']:,})")
    words = (f"{mix['files']:,} training files{sampled}: {shares['progressive']:.1%} progressive, "
             f"{shares['greyscale']:.1%} greyscale, {shares['cmyk']:.1%} CMYK, "
             f"{shares['rotated']:.1%} EXIF-rotated, {shares['large_file']:.1%} over "
             f"{mix['limits']['place_bytes'] // 1024} KiB, {shares['not_jpeg']:.1%} not JPEG; "
             f"the GPU path would decode {gpu['batched']:.1%} in its batched call, "
             f"{gpu['one_by_one']:.1%} one by one (progressive) and leave "
             f"{gpu['cpu_reference']:.1%} to the CPU reference")
    if mix["tail_core_s_per_file"] is not None:
        words += (f" ({1e3 * mix['tail_core_s_per_file']:.0f} ms a file: "
                  f"{mix['tail_core_s_per_epoch']:.3g} core-s an epoch, "
                  f"{mix['tail_cores_beside_training']:.2f} cores at the rate beside training)")
    return words


def _beside_words(probed: dict[str, Any], compiled: bool) -> str:
    beside = probed["training"]
    busy = beside.get("busy_cores")
    return (f"beside {'compiled' if compiled else 'eager'} training ({beside['steps']} steps, "
            f"{beside['passes']} pass(es)) {beside['images_per_s']:.1f} img/s, data share "
            f"{beside['data_share']:.2f} (device {beside['device_share']:.2f})"
            + (f", {busy:.1f} busy host cores" if busy is not None else ""))


def _note_loader(node: Node, images_per_s: float) -> int:
    """The chosen path's rate alone, given to the compile figures kept for this node, so
    that the compile rule caps the steps' rates by it (train/compiling.py); how many."""
    from automlperf.train.compilecache import note_loader_rate

    try:
        return note_loader_rate(node.devices[0], images_per_s)
    except OSError:
        return 0
