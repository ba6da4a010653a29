"""The seed model training alone on synthetic images through the engine's own ranks: eagerly,
channels-last and compiled; what the layout and compilation gain, and the compilation
figures a run decides with (``train.compile_figures``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from automlperf.runner.doctor.common import Check, Node, Shape

if TYPE_CHECKING:
    from automlperf.train.compiling import CompileDecision, CompileFigures

# The fraction of the measured ceiling below which training alone warns. A CPU's ceiling
# is the faster of its matrix product and its 3x3 convolution, the kernels training runs; a
# GPU's ResNet-50 reaches a much smaller share of its tensor cores' dense rate (MLPerf's
# tuned ResNet-50 on an H100 is about a fifth of its bf16 matmul rate).
TRAIN_FRACTION_WARN = {"cpu": 0.5, "accelerator": 0.15}


def train(node: Node, shape: Shape, name: str, channels_last: bool, compile: bool) -> Check:
    """The seed model training alone on synthetic images, through the engine's own ranks."""
    from automlperf.config import load_config, set_option
    from automlperf.graph import seeds
    from automlperf.hardware import accelerator_memory_gib
    from automlperf.ops import count
    from automlperf.train.single import TrainRequest, plan_training, train_planned

    ranks = len(node.devices)
    per_device = node.req.quick and 16 or (
        32 if not node.accelerated else
        load_config(None, "synthetic", {}).train.per_device_batch(accelerator_memory_gib()))
    steps = 2 if not node.accelerated else 30
    # Compiled, a smaller last step, as most epochs of a trial end with: its compilation is
    # part of what compiling a trial costs.
    images = per_device * ranks * steps + (per_device * ranks // 2 if compile else 0)
    tree: dict[str, Any] = {}
    set_option(tree, "data.image_size", shape.image_size)
    set_option(tree, "data.synthetic_images", images)
    set_option(tree, "data.synthetic_classes", shape.classes)
    set_option(tree, "train.precision", node.req.precision)
    set_option(tree, "train.channels_last", channels_last)
    set_option(tree, "train.compile", compile)
    set_option(tree, "train.warmup_epochs", 0.0)
    cfg = load_config(None, "synthetic", tree)
    plan = plan_training(TrainRequest(config=cfg, model=shape.model, epochs=2,
                                      batch_size=per_device * ranks, devices=ranks))
    result = train_planned(plan)
    if result.outcome.status != "completed" or not result.epochs:
        return Check(name, "fail", f"training failed: {result.outcome.reason}",
                     "run `automlperf train --model resnet50 --dataset synthetic` to see why")
    last = result.epochs[-1]  # the first epoch carries the warm-up (and the compilation)
    first = result.epochs[0]
    graph = seeds.seed(shape.model, shape.classes, shape.image_size, 3)
    ops = count(graph)
    per_image = ops.forward + ops.backward_grad
    step_ops = last.images_per_s * per_image + ops.update_per_step * last.steps / max(
        1e-9, last.train_images / max(last.images_per_s, 1e-9))
    epoch_ops = last.ops / max(1e-9, last.ended_at - last.started_at)
    fraction = step_ops / node.ceiling_ops if node.ceiling_ops else None
    node.rates[name] = last.images_per_s
    node.step_ops[name] = step_ops
    node.first_overheads[name] = (first.ended_at - first.started_at
                                  - first.train_images / max(last.images_per_s, 1e-9))
    if not compile and (channels_last == node.channels_last or node.train_images_per_s is None):
        node.train_images_per_s = last.images_per_s
    figures = {"model": shape.model, "image_size": shape.image_size, "batch": last.batch_size,
               "precision": last.precision, "images_per_s": last.images_per_s,
               "step_ops_per_s": step_ops, "epoch_ops_per_s": epoch_ops,
               "fraction_of_ceiling": fraction, "data_share": last.data_share,
               "first_epoch_s": first.ended_at - first.started_at,
               "compile": compile, "channels_last": channels_last, **{
                   k: v for k, v in result.outcome.extra.items()
                   if k in ("compiled_graphs", "compile_fallback")}}
    summary = (f"{shape.model} at {shape.image_size}, batch {last.batch_size}, "
               f"{last.precision}: {last.images_per_s:.1f} img/s, {step_ops / 1e12:.3g} TOPS in "
               "steps" + (f" = {fraction:.2g} of the ceiling" if fraction else ""))
    if compile and result.outcome.extra.get("compile_fallback"):
        return Check(name, "warn", summary, str(result.outcome.extra["compile_fallback"]), figures)
    slower = layout_advice(node, last.images_per_s, channels_last, compile)
    if slower:
        return Check(name, "warn", summary, slower, figures)
    low = low_fraction_advice(node, fraction, channels_last)
    if low:
        return Check(name, "warn", summary, low, figures)
    if not compile:
        return Check(name, "pass", summary, figures=figures)
    measured = compile_figures(node, len(graph))
    if measured is None:
        return Check(name, "pass", summary, figures=figures)
    figures["compile_figures"] = measured.to_dict()
    kept = keep_figures(node, measured, last.precision, last.batch_size // ranks)
    figures["compile_figures_cache"] = kept
    if first_round_decision(measured, shape, ranks).compile:
        node.trial_images_per_s = last.images_per_s
    return Check(name, "pass", summary + f"; compiling took {measured.compile_s:.0f} s",
                 compile_advice(node, measured, shape, kept), figures)


def eager_rate(node: Node) -> float | None:
    """Images/s of uncompiled training in the layout a run trains in, once measured."""
    return node.rates.get("train channels_last" if node.channels_last else "train eager")


def compile_figures(node: Node, layers: int) -> CompileFigures | None:
    """What compiling cost and gained per rank, from the compiled item and the eager one in
    the run's layout: the compilation is how much longer the compiled first epoch took
    beyond its steady steps than the eager one did (the same start and validation in both)."""
    from automlperf.train.compiling import CompileFigures

    eager = "train channels_last" if node.channels_last else "train eager"
    done = "train compiled"
    if eager not in node.step_ops or done not in node.step_ops:
        return None
    ranks = len(node.devices)
    return CompileFigures(
        compile_s=round(max(0.0, node.first_overheads[done] - node.first_overheads[eager]), 1),
        layers=layers, eager_ops_per_s=float(f"{node.step_ops[eager] / ranks:.4g}"),
        compiled_ops_per_s=float(f"{node.step_ops[done] / ranks:.4g}"),
        source=f"automlperf doctor, {node.devices[0]}")


def keep_figures(node: Node, figures: CompileFigures, precision: str, per_rank: int) -> str | None:
    """Keep the measured figures for the runs after the doctor on this node, under the
    key a rank looks them up by (train/compilecache.py): the path, or None when the cache
    cannot be written (the advice then gives them to copy into a configuration)."""
    from automlperf.train.compilecache import key_for, save_figures

    try:
        key = key_for(node.devices[0], precision, node.channels_last, per_rank)
        return str(save_figures(key, figures))
    except OSError:
        return None


def first_round_decision(figures: CompileFigures, shape: Shape, ranks: int) -> CompileDecision:
    """What the compile rule decides with these figures for a first-round trial of the
    shape measured (ImageNet-1k's training images when official), split over ``ranks``."""
    from automlperf.ops import count
    from automlperf.graph import seeds
    from automlperf.train.compiling import decide_compile

    epochs, images = first_round(shape)
    ops = count(seeds.seed(shape.model, shape.classes, shape.image_size, 3))
    planned = epochs * images / ranks * (ops.forward + ops.backward_grad)
    return decide_compile(None, planned, figures.layers, figures)


def first_round(shape: Shape) -> tuple[int, int]:
    """(epochs, training images) of a first-round trial of the shape measured."""
    from automlperf.config import Config

    return Config().train.round_epochs(0), 1_281_167 if shape.official else 10_000


def compile_advice(node: Node, figures: CompileFigures, shape: Shape,
                   kept: str | None = None) -> str:
    """What the compile rule decides with these figures for a first-round trial of the
    shape measured, and how a run gets them (``kept``: the cache that holds them for the
    runs on this node)."""
    epochs, train_images = first_round(shape)
    decision = first_round_decision(figures, shape, len(node.devices))
    gain = figures.compiled_ops_per_s / figures.eager_ops_per_s - 1
    toml = ("train.compile_figures = {" + ", ".join(
        f"{k} = {v!r}" if not isinstance(v, str) else f'{k} = "{v}"'
        for k, v in figures.to_dict().items()) + "}")
    words = (f"compiled steps {gain:+.0%} against eager; for a first-round trial "
             f"({epochs} epochs of {train_images:,} images) it "
             + ("pays" if decision.compile else "does not pay")
             + f" ({decision.eager_s or 0:.0f} s eager, {decision.compiled_s or 0:.0f} s compiled)")
    if kept:
        return (words + f"; kept in {kept} for the runs on this node (same device, torch, "
                f"precision and layout); elsewhere give {toml}")
    return words + f"; a run decides with them given {toml}"


def low_fraction_advice(node: Node, fraction: float | None, channels_last: bool) -> str:
    """What to try when training reaches too little of the ceiling, judged in the layout a
    run trains in (the other layout's figure is there to compare); empty otherwise."""
    limit = TRAIN_FRACTION_WARN["accelerator" if node.accelerated else "cpu"]
    if fraction is None or fraction >= limit or channels_last != node.channels_last:
        return ""
    return (f"below {limit:.2f} of the ceiling: the train items here compare channels_last "
            "and torch.compile; a larger train.batch_size may also help")


def layout_advice(node: Node, rate: float, channels_last: bool, compile: bool) -> str:
    """What to set when torch.compile is slower here than eager training in the run's
    layout, or when the other layout is faster than the run's default; empty otherwise."""
    standard = node.rates.get("train eager")
    if compile:
        eager = eager_rate(node)
        if eager and rate < eager:
            return (f"torch.compile is slower than eager here ({rate:.3g} against {eager:.3g} "
                    "img/s): leave train.compile unset or false (the compile rule stays eager)")
        return ""
    if not channels_last or not standard:
        return ""
    words = f"{rate:.3g} against {standard:.3g} img/s in the standard layout"
    if rate < standard and node.channels_last:
        return f"channels_last, the default here, is slower ({words}): set train.channels_last = false"
    if rate > standard and not node.channels_last:
        return f"channels_last is faster here ({words}): set train.channels_last = true"
    return ""


def train_eager(node: Node, shape: Shape) -> Check:
    return train(node, shape, "train eager", channels_last=False, compile=False)


def train_channels_last(node: Node, shape: Shape) -> Check:
    return train(node, shape, "train channels_last", channels_last=True, compile=False)


def train_compiled(node: Node, shape: Shape) -> Check:
    if node.req.quick:
        return Check("train compiled", "skip", "not in quick mode (compilation takes minutes)")
    return train(node, shape, "train compiled", channels_last=node.channels_last, compile=True)
