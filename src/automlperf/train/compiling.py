"""Whether a trial trains through ``torch.compile``: when its planned training repays what
compiling it costs, judged from measured figures.

Every trial of a search is a new architecture, compiled anew, so compilation pays only where
the trial's planned steps are long enough. The rule (:func:`decide_compile`) compares the
planned training's time eagerly, ``ops / eager_ops_per_s``, with its time compiled,
``compile_s * layers / measured_layers + ops / compiled_ops_per_s``, and compiles when that
saves at least ``MARGIN`` of the eager time. Rates are in operations per second so that
figures measured on one architecture serve the next (a grown morph, another resolution); the
compilation's cost grows with the graph, so it is scaled by the layer count. Where the
figures hold what the rank's loader delivers alone, both rates are capped by it: steps faster
than their data wait for it, so a loader slower than the eager steps leaves compiling nothing
to gain but its cost.

The figures come from ``train.compile_figures`` or from those `automlperf doctor` measured
on this node and kept (train/compilecache.py); without them a trial stays eager. A rank never
measures them itself, inside the run's clock: on one H200, measuring held the first trial's
first epoch back 79 s of a 200 s run, for steps 1 % faster compiled. :func:`measure_compile` measures them outside a run
(bench/bench_compile.py).
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass
from typing import Any

# Compiled training must save at least this share of the eager time: within it, measurement
# noise (a rate measured over a few steps) could decide either way.
MARGIN = 0.05
# Steps of each kind the measurement times, after its warm-up steps.
PROBE_STEPS = 8
WARMUP_STEPS = 2
NO_FIGURES = ("no measured compilation figures: automlperf doctor measures them on this node "
              "(or give train.compile_figures)")


@dataclass(frozen=True)
class CompileFigures:
    """What compilation costs and gains on a node, measured on one architecture."""

    compile_s: float  # seconds compiling added to the first steps (its batch and a smaller one)
    layers: int  # layers of the architecture measured
    eager_ops_per_s: float  # training operations per second of its steps, eagerly
    compiled_ops_per_s: float  # the same, compiled
    source: str = ""  # where they were measured
    # What the rank's loader delivers alone, images per second (None: not measured): steps
    # faster than it wait for data, compiled or not.
    loader_images_per_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CompileFigures:
        loader = data.get("loader_images_per_s")
        return cls(float(data["compile_s"]), int(data["layers"]), float(data["eager_ops_per_s"]),
                   float(data["compiled_ops_per_s"]), str(data.get("source", "")),
                   float(loader) if loader else None)


@dataclass(frozen=True)
class CompileDecision:
    """Whether a trial compiles, and the figures that decided it."""

    compile: bool
    reason: str
    planned_ops: float = 0.0  # the trial's planned training operations on this rank
    eager_s: float | None = None  # the planned training's time eagerly, estimated
    compiled_s: float | None = None  # the same compiled, the compilation included
    figures: CompileFigures | None = None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["figures"] = self.figures.to_dict() if self.figures else None
        return out


def decide_compile(setting: bool | None, planned_ops: float, layers: int,
                   figures: CompileFigures | None, time_left_s: float | None = None,
                   planned_images: float | None = None) -> CompileDecision:
    """The decision for a trial of ``layers`` layers planned to train ``planned_ops``
    operations on ``planned_images`` images: ``setting`` (``train.compile``) when it is set,
    else the rule above, each way's rate capped by what the loader delivers where the
    figures measured it (a loader slower than the eager steps leaves compiled steps nothing
    to gain). With ``time_left_s`` (to the run's deadline), where the deadline cuts the
    planned training eagerly or compiled, what counts is the work each way does before it:
    compiling pays when that is at least ``1 / (1 - MARGIN)`` times the eager work."""
    if setting is not None:
        return CompileDecision(setting, "train.compile = " + ("true" if setting else "false"),
                               planned_ops, figures=figures)
    if figures is None:
        return CompileDecision(False, NO_FIGURES, planned_ops)
    if figures.eager_ops_per_s <= 0 or figures.compiled_ops_per_s <= 0:
        return CompileDecision(False, "the measured rates are not positive", planned_ops,
                               figures=figures)
    cost = figures.compile_s * layers / max(1, figures.layers)
    eager_rate, compiled_rate, capped = figures.eager_ops_per_s, figures.compiled_ops_per_s, ""
    if figures.loader_images_per_s and planned_images:
        cap = figures.loader_images_per_s * planned_ops / planned_images
        if cap < compiled_rate:
            capped = (f"; the loader's {figures.loader_images_per_s:,.0f} img/s caps the steps "
                      f"at {cap:.3g} ops/s (eager {eager_rate:.3g}, compiled {compiled_rate:.3g})")
        eager_rate, compiled_rate = min(eager_rate, cap), min(compiled_rate, cap)
    eager = planned_ops / eager_rate
    compiled = cost + planned_ops / compiled_rate
    pays = compiled <= eager * (1 - MARGIN)
    words = (f"planned training {eager:.0f} s eager against {compiled:.0f} s compiled "
             f"({cost:.0f} s of it compiling){capped}")
    if time_left_s is not None and max(eager, compiled) > time_left_s:
        left = max(0.0, time_left_s)
        eager_done = min(planned_ops, left * eager_rate)
        compiled_done = min(planned_ops, max(0.0, left - cost) * compiled_rate)
        pays = compiled_done * (1 - MARGIN) >= eager_done and compiled_done > 0
        words += (f"; the deadline, {left:.0f} s away, leaves {_share(eager_done, planned_ops)}"
                  f" of it done eager against {_share(compiled_done, planned_ops)} compiled")
    return CompileDecision(pays, ("compiling repays itself: " if pays else "compiling does not "
                                  "repay itself: ") + words, planned_ops, eager, compiled, figures)


def _share(done: float, planned: float) -> str:
    return f"{100 * done / planned:.0f} %" if planned > 0 else "all"


def compile_module(module: Any, backend: Any = "inductor") -> Any:
    """``torch.compile`` for one trial. Every architecture runs the same forward code, so
    trials in one rank would pile guards on one code object until Dynamo's recompile limit,
    then silently run eagerly: each trial starts from a clean cache. Compile workers share
    the rank's cores with its decoding workers (the rank sets their number when it starts)
    instead of starting one per core of the node.

    Shapes stay static. Left to Dynamo, a second batch size recompiles with a dynamic
    batch, and that graph, tried first from then on, runs every later full batch too:
    ResNet-50 on an H200 stepped at 4,778 img/s instead of 6,916
    (bench/bench_compile_shapes.py). The trainer runs batches of another size eagerly
    (:func:`eager_stance`), so a trial compiles one graph."""
    import torch
    import torch._dynamo
    import torch._inductor.config

    from automlperf.train.rankenv import configured_compile_threads

    torch._dynamo.reset()
    torch._inductor.config.compile_threads = configured_compile_threads(torch.get_num_threads())
    return torch.compile(module, backend=backend, dynamic=False)


def eager_stance() -> AbstractContextManager[Any]:
    """A context in which compiled modules run their own eager code. An epoch's short last
    batch (or a rank's placeholder step) would otherwise compile a second graph, for one
    step an epoch, and cost a second compilation's seconds in every compiled trial. Torch
    before 2.6 has no stances: there such a batch gets a static graph of its own."""
    import torch

    set_stance = getattr(torch.compiler, "set_stance", None)
    return set_stance("force_eager") if set_stance is not None else nullcontext()


def compiled_graphs() -> int:
    """Graphs Dynamo has compiled in this process so far (a count that only grows)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def note_compilation(graphs_before: int, extra: dict[str, Any]) -> bool:
    """Record in a trial's ``extra`` how many graphs its first epoch compiled since
    ``graphs_before``: none means Dynamo ran the trial eagerly (a recompile limit, an
    unsupported construct), which would otherwise pass unseen as a slow compiled trial.
    Whether the trial ran compiled."""
    graphs = compiled_graphs() - graphs_before
    extra["compiled_graphs"] = graphs
    if graphs == 0:
        extra["compile_fallback"] = "eager: torch.compile compiled no graph for this trial"
    return graphs > 0


def timed_steps(runner: Any, optimizer: Any, loss_fn: Any, autocast: Any, device: Any, n: int,
                images: Any, labels: Any) -> float:
    """Seconds ``n`` training steps of ``runner`` on one batch take, the device drained
    before and after."""
    from automlperf.train.device import synchronize

    synchronize(device)
    started = time.perf_counter()
    for _ in range(n):
        with autocast:
            loss = loss_fn(runner(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    synchronize(device)
    return time.perf_counter() - started


def measure_compile(graph: Any, per_rank: int, device: Any, autocast: Any,
                    memory_format: Any, steps: int = PROBE_STEPS) -> CompileFigures:
    """Compilation's cost and both step rates of ``graph`` on ``device`` at ``per_rank``
    images a step, on random images with a model and optimiser of its own (the trial's are
    untouched). The cost is the time the compiled model's first step, and its first step at
    a smaller batch (the last step of most epochs), took beyond a step's time; that smaller
    batch runs as a trial runs it, eagerly (:func:`eager_stance`), so it costs no graph."""
    import torch
    from torch import nn

    from automlperf.ops.count import count
    from automlperf.train.builder import build_module
    from automlperf.train.optim import sgd

    batch = max(2, per_rank)
    module = build_module(graph, seed=0).to(device, memory_format=memory_format)  # type: ignore[call-overload]
    shape = (batch, *graph.input_shape)
    x = torch.randn(shape, device=device).contiguous(memory_format=memory_format)
    y = torch.randint(0, graph.num_classes, (batch,), device=device)
    loss_fn = nn.CrossEntropyLoss()

    def timed(runner: Any, optimizer: Any, n: int, images: Any = x, labels: Any = y) -> float:
        return timed_steps(runner, optimizer, loss_fn, autocast, device, n, images, labels)

    optimizer = sgd(module.parameters(), lr=1e-3, momentum=0.9)
    timed(module, optimizer, WARMUP_STEPS)
    eager = timed(module, optimizer, steps) / steps
    compiled = compile_module(module)
    small = max(2, batch // 2)
    first = timed(compiled, optimizer, 1)
    with eager_stance():
        first_small = timed(compiled, optimizer, 1, x[:small], y[:small])
    timed(compiled, optimizer, WARMUP_STEPS)
    step = timed(compiled, optimizer, steps) / steps
    with eager_stance():
        step_small = timed(compiled, optimizer, 1, x[:small], y[:small])
    import torch._dynamo

    torch._dynamo.reset()  # the trial compiles its own model from a clean cache
    ops = count(graph)
    per_image = ops.forward + ops.backward_grad
    per_step = per_image * batch + ops.update_per_step
    return CompileFigures(
        compile_s=max(0.0, first - step) + max(0.0, first_small - step_small),
        layers=len(graph), eager_ops_per_s=per_step / max(eager, 1e-9),
        compiled_ops_per_s=per_step / max(step, 1e-9),
        source=f"measured on {device} at batch {batch}, {len(graph)} layers")
