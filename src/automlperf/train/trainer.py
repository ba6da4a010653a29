"""Training one trial on one data-parallel rank.

Every rank runs :func:`train_on_rank` with the same spec; gradients are all-reduced by
DistributedDataParallel. Rank 0 reports an :class:`EpochEvent` after each epoch, with image
counts summed over all ranks and the operations they cost, and keeps the best weights.
"""

from __future__ import annotations

import gc
import math
import os
import time
import warnings
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import nn

from automlperf.events import EpochEvent, FailureKind, TrialOutcome, TrialStatus
from automlperf.graph.graph import Graph
from automlperf.ops.count import count, epoch_ops
from automlperf.train.builder import build_module
from automlperf.train.compilecache import cached_figures, key_for
from automlperf.train.compiling import (CompileDecision, CompileFigures, compile_module,
                                        compiled_graphs, decide_compile, eager_stance,
                                        note_compilation)
from automlperf.train.data import DataError, Dataset, plan_steps
from automlperf.train.device import channels_last_default, is_oom, resolve_precision, synchronize
from automlperf.train.evaluate import evaluate, precision_context
from automlperf.train.inherit import inherit
from automlperf.train.optim import trial_optimizer
from automlperf.train.spec import EarlyStopping, TrialSpec

# Where linear scaling of the learning rate with the global batch stops: beyond it SGD on
# ResNets is no longer stable (Goyal et al. scale to 8k images at 3.2).
MAX_LR = 3.2
Emit = Callable[[str, dict[str, Any]], None]


class TrialFailure(RuntimeError):
    """A trial that cannot go on, and why."""

    def __init__(self, kind: FailureKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass
class RankContext:
    rank: int
    world: int
    device: torch.device
    dataset: Dataset
    distributed: bool = False


def lr_factor(step: int, total: int, warmup: int) -> float:
    """Linear warm-up to 1, then linear decay to 0 at ``total`` steps."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    return max(0.0, (total - step) / max(1, total - warmup))


def _initial_module(spec: TrialSpec, graph: Graph) -> nn.Module:
    if spec.parent_graph is not None and spec.parent_weights:
        from safetensors.torch import load_file

        parent = Graph.from_dict(spec.parent_graph)
        # Every weight is inherited: an initialisation would be overwritten whole.
        module = build_module(graph, init=None)
        module.load_state_dict(inherit(parent, load_file(spec.parent_weights), graph,
                                       seed=spec.seed))
        return module
    return build_module(graph, spec.init, seed=spec.seed)


def save_weights(module: nn.Module, path: str) -> None:
    """Atomically write a safetensors file (a kill mid-write leaves the old file intact)."""
    from safetensors.torch import save_file

    state = {k: v.detach().contiguous().cpu() for k, v in module.state_dict().items()}
    tmp = f"{path}.tmp{os.getpid()}"
    save_file(state, tmp)
    os.replace(tmp, path)


def train_on_rank(spec: TrialSpec, ctx: RankContext, emit: Emit | None = None) -> TrialOutcome:
    """Train ``spec`` on this rank; returns how the trial ended. Failures are classified,
    not raised, so the rank stays ready for the next trial."""
    emit = emit if (emit is not None and ctx.rank == 0) else (lambda kind, payload: None)
    outcome = TrialOutcome(trial_id=spec.trial_id, status=TrialStatus.FAILED,
                           batch_size=spec.batch_size)
    try:
        _train(spec, ctx, emit, outcome)
    except TrialFailure as exc:
        outcome.status, outcome.reason = TrialStatus.FAILED, f"{exc.kind}: {exc}"
        outcome.extra["failure"] = exc.kind
    except DataError as exc:  # the data cannot be served (its message says what to change)
        outcome.status, outcome.reason = TrialStatus.FAILED, f"data: {exc}"
        outcome.extra["failure"] = FailureKind.DATA
    except Exception as exc:  # noqa: BLE001 - any error ends this trial, not the rank
        kind = FailureKind.OOM if is_oom(exc) else FailureKind.ERROR
        outcome.status = TrialStatus.FAILED
        outcome.reason = f"{kind}: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        outcome.extra["failure"] = kind
    finally:
        outcome.extra.update(ctx.dataset.notes())
        release_trial(ctx)
    return outcome


def release_trial(ctx: RankContext) -> None:
    """Give back what a trial held before the next one starts in this long-lived rank: its
    loader's workers and pinned buffers, then the tensors only reference cycles still hold
    (the cached device blocks are freed only once they are garbage)."""
    ctx.dataset.release()
    gc.collect()
    if ctx.device.type == "cuda":
        torch.cuda.empty_cache()
        host_empty = getattr(torch._C, "_host_emptyCache", None)
        if host_empty is not None:
            host_empty()


class EpochTimes(NamedTuple):
    """What one rank's share of a training epoch did, and where its time went."""

    loss_sum: float
    images: int
    steps: int
    data_wait: float  # seconds waiting for the next batch's data
    device_wait: float  # seconds on the device's side: its steps, and waiting for it
    seconds: float


class _Run:
    """The state of one trial on one rank: module, optimiser, schedule and precision."""

    def __init__(self, spec: TrialSpec, ctx: RankContext, graph: Graph) -> None:
        self.spec, self.ctx, self.data, self.device = spec, ctx, ctx.dataset, ctx.device
        self.precision = resolve_precision(spec.precision, self.device)
        self.autocast: Any = precision_context(self.precision, self.device)
        self.channels_last = (spec.channels_last if spec.channels_last is not None
                              else channels_last_default(self.device.type))
        self.memory_format = torch.channels_last if self.channels_last else torch.contiguous_format
        self.per_rank = spec.batch_size // ctx.world
        self.batch = self.per_rank * ctx.world
        self.ops = count(graph, batch_size=self.batch)
        self.steps_per_epoch = plan_steps(self.data.train_size, ctx.world, self.per_rank)
        self.decision = self._decide_compile(graph)
        self.compiled = self.decision.compile
        self.module = _initial_module(spec, graph).to(self.device,
                                                      memory_format=self.memory_format)  # type: ignore[call-overload]
        total = max(1, max(spec.epochs, spec.horizon_epochs or 0) * self.steps_per_epoch)
        warmup = min(int(spec.warmup_epochs * self.steps_per_epoch), total // 2)
        # Scaling with the batch stops at MAX_LR (a rate set above it per 256 images stays).
        self.lr = min(spec.lr_per_256 * self.batch / 256, max(MAX_LR, spec.lr_per_256))
        self.optimizer = trial_optimizer(self.module, self.lr, spec.weight_decay, spec.momentum, spec.nesterov)
        self.schedule = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: lr_factor(step, total, warmup))
        self.scaler = torch.amp.GradScaler(self.device.type) if self.precision == "fp16" else None
        self.graphs_before = compiled_graphs() if self.compiled else 0
        # The one batch size the compiled module runs compiled: that of this rank's first
        # real step (an epoch's full batch; with one step an epoch, its only one).
        self.compiled_size: int | None = None
        runner: Any = compile_module(self.module) if self.compiled else self.module
        if ctx.distributed:
            # Buffers (BatchNorm statistics) are averaged once before validation, not
            # broadcast from rank 0 at every forward pass.
            runner = nn.parallel.DistributedDataParallel(
                runner, device_ids=[self.device.index] if self.device.type == "cuda" else None,
                gradient_as_bucket_view=True, broadcast_buffers=False)
        self.runner = runner
        self.loss_fn = nn.CrossEntropyLoss(label_smoothing=spec.label_smoothing)
        # Early stopping watches the validation's own cross-entropy: the loss a site trains
        # with (its label smoothing) is customisable, the stopping rule is not.
        self.val_loss_fn = nn.CrossEntropyLoss()

    def _decide_compile(self, graph: Graph) -> CompileDecision:
        """Whether this trial compiles (see train.compiling): the setting, else the rule with
        the given figures, else with those `automlperf doctor` measured on this node
        (train.compilecache); never measured here, inside the run's clock."""
        spec = self.spec
        per_rank_images = spec.epochs * self.data.train_size / self.ctx.world
        planned = (per_rank_images * (self.ops.forward + self.ops.backward_grad)
                   + spec.epochs * self.steps_per_epoch * self.ops.update_per_step)
        figures: CompileFigures | None = None
        if spec.compile is None and spec.compile_figures:
            figures = CompileFigures.from_dict(spec.compile_figures)
        elif spec.compile is None:
            figures = self._doctor_figures()
        left = None  # seconds to the deadline, the least any rank sees: all decide alike
        if figures is not None and spec.finish_by is not None:  # on every rank or on none
            (left,) = _reduce([spec.finish_by - time.time()], self.ctx,
                              dist.ReduceOp.MIN if self.ctx.distributed else None)
        return decide_compile(spec.compile, planned, len(graph), figures, left, per_rank_images)

    def _doctor_figures(self) -> CompileFigures | None:
        """The doctor's cached figures for this rank's device, torch, precision, layout and
        batch, averaged over the ranks so that every rank decides alike; None unless every
        rank has some."""
        mine = cached_figures(key_for(self.device, self.precision, self.channels_last,
                                      self.per_rank))
        loader = mine.loader_images_per_s if mine else None
        values = ([1.0, mine.compile_s, mine.eager_ops_per_s, mine.compiled_ops_per_s,
                   float(bool(loader)), loader or 0.0] if mine else [0.0] * 6)
        found, compile_s, eager, compiled, with_loader, loader = _reduce(values, self.ctx)
        world = self.ctx.world
        if mine is None or found < world:
            return None
        return CompileFigures(compile_s / world, mine.layers, eager / world, compiled / world,
                              mine.source + (f", averaged over {world} ranks" if world > 1 else ""),
                              loader / world if with_loader == world else None)

    def train_epoch(self, epoch: int, emit: Emit, max_steps: int | None = None,
                    untimed_steps: int = 0) -> EpochTimes:
        """This rank's share of one epoch (its first ``max_steps`` steps, when given); the
        first ``untimed_steps`` steps warm up (the network's kernels, a compilation) and
        neither their images, their loss nor their time count.

        Its time is told apart as the training thread spends it: asking for the next batch
        is waiting for data, except where the loader itself waited for the device (a slot's
        copy still running); the steps, reading their loss and the epoch's final wait are
        the device's side (a CPU runs the steps in this thread; an accelerator's are
        launched here, and waited for where the host reads a result)."""
        self.module.train()
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        images = steps = 0
        data_wait = device_wait = 0.0
        loader_device = self.data.device_wait_s
        started = last_report = time.perf_counter()
        batches = self.data.batches("train", self.ctx.rank, self.ctx.world, self.per_rank,
                                    epoch, self.spec.seed, self.device)
        # Every rank gets the same number of batches (data.step_plan), so each takes every
        # step's all-reduce with no join(), which would cost collectives and a host sync per
        # step. A batch that unreadable files left with fewer than two images (BatchNorm
        # needs two) still takes its part in the step (see _placeholder_step).
        while True:
            t0 = time.perf_counter()
            item = next(batches, None) if max_steps is None or steps < max_steps else None
            t1 = time.perf_counter()
            on_device = self.data.device_wait_s - loader_device
            loader_device += on_device
            data_wait += t1 - t0 - on_device
            device_wait += on_device
            if item is None:
                break
            x, y = item
            if len(y) < 2:
                self._placeholder_step()
                device_wait += time.perf_counter() - t1
                continue
            loss = self._step(x, y)
            loss_sum += loss * len(y)
            images += len(y)
            steps += 1
            if steps == untimed_steps:  # warmed up: the clocks start now
                synchronize(self.device)
                loss_sum.zero_()
                images, data_wait, device_wait = 0, 0.0, 0.0
                emit("timed", {"step": steps})  # only a probe warms up (untimed_steps)
                started = time.perf_counter()
                continue
            now = time.perf_counter()
            # The first step reports at once (a progress bar moves from the start), then
            # at most twice a second; only rank 0 reports, so only it reads the loss.
            if self.ctx.rank == 0 and (steps == 1 or now - last_report > 0.5):
                value = float(loss)  # waits for the step
                last_report = now = time.perf_counter()
                emit("progress", {"trial_id": self.spec.trial_id, "epoch": epoch,
                                  "step": steps, "steps": self.steps_per_epoch,
                                  "loss": value,
                                  "images_per_s": images * self.ctx.world / (now - started)})
            device_wait += now - t1
        close = getattr(batches, "close", None)
        if max_steps is not None and close is not None:
            close()
        t0 = time.perf_counter()
        synchronize(self.device)  # the epoch ends when the device has done its work
        ended = time.perf_counter()
        device_wait += ended - t0
        return EpochTimes(float(loss_sum), images, steps - untimed_steps, data_wait, device_wait,
                          ended - started)

    def _placeholder(self) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.zeros((2, *self.data.input_shape), device=self.device),
                torch.zeros(2, dtype=torch.long, device=self.device))

    def _placeholder_step(self) -> None:
        """This rank's part in a step for which it has no images. Alone, it takes no step.
        With other ranks it joins their gradient all-reduce with a zero-weight loss on
        placeholder images, and its BatchNorm statistics are restored after that forward
        pass; it then applies the averaged gradient exactly as every other rank does (one
        that skipped it would drift from the others), unless that gradient is zero, which
        means every rank's share was empty: then no rank updates anything (no momentum, no
        weight decay, no schedule step)."""
        if not self.ctx.distributed:
            return
        buffers = list(self.module.buffers())
        saved = [b.clone() for b in buffers]
        self._backward(*self._placeholder(), weight=0.0, placeholder=True)
        with torch.no_grad():
            for b, kept in zip(buffers, saved):
                b.copy_(kept)
        grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        # A host sync, on the rare placeholder step only.
        if not grads or int(sum(g.count_nonzero() for g in grads)) == 0:
            self.optimizer.zero_grad(set_to_none=True)
            return
        self._update()

    def _step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = self._backward(x, y)
        self._update()
        return loss

    def _runs_eagerly(self, size: int, placeholder: bool) -> bool:
        """Whether a compiled trial runs this step's module eagerly: any batch size but the
        one it compiled, a placeholder step, and every step once its first epoch found that
        Dynamo compiled nothing (the trial is then recorded as eager, and stays so)."""
        if not self.decision.compile:
            return False
        if placeholder or not self.compiled:
            return True
        if self.compiled_size is None:
            self.compiled_size = size
        return size != self.compiled_size

    def _backward(self, x: torch.Tensor, y: torch.Tensor, weight: float = 1.0,
                  placeholder: bool = False) -> torch.Tensor:
        x = x.contiguous(memory_format=self.memory_format)  # free when the loader's matches
        eager = self._runs_eagerly(x.shape[0], placeholder)
        with eager_stance() if eager else nullcontext(), self.autocast:
            loss = self.loss_fn(self.runner(x), y)
            if weight != 1.0:
                loss = loss * weight
        self.optimizer.zero_grad(set_to_none=True)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()
        return loss.detach()

    def _update(self) -> None:
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
            # The scaler skips the optimiser step when gradients overflow; the schedule then
            # runs a step ahead, which is harmless (knowing would cost a device sync).
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler")
                self.schedule.step()
        else:
            self.optimizer.step()
            self.schedule.step()

    def validate(self) -> tuple[int, int, float]:
        """(correct, images, summed loss) of this rank's validation shard; the loss is the
        cross-entropy without label smoothing, whatever the training loss smooths (Keras'
        ``val_loss`` would include it: then a customisable setting would move the fixed
        early-stopping rule)."""
        self.average_buffers()
        return evaluate(self.module, self.data.batches(
            "val", self.ctx.rank, self.ctx.world, self.per_rank, 0, self.spec.seed, self.device),
            self.autocast, self.memory_format, self.val_loss_fn)

    def average_buffers(self) -> None:
        """Every rank validates (and rank 0 saves) with the BatchNorm statistics averaged
        over all ranks, not with those of its own shard."""
        if not self.ctx.distributed:
            return
        buffers = [b for b in self.module.buffers() if b.is_floating_point()]
        if not buffers:
            return
        flat = torch.cat([b.reshape(-1).double() for b in buffers])
        dist.all_reduce(flat)
        flat /= self.ctx.world
        offset = 0
        for b in buffers:
            b.copy_(flat[offset:offset + b.numel()].view_as(b))
            offset += b.numel()


def _reduce(values: list[float], ctx: RankContext, op: Any = None) -> list[float]:
    if not ctx.distributed:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=ctx.device)
    dist.all_reduce(t, op=op or dist.ReduceOp.SUM)
    return t.tolist()


def _judge_unreadable(data: Dataset, epoch: int, split: str, read: int, unreadable: int,
                      example: str) -> None:
    """Fail the trial for its data when an epoch read no image of a split, or more than the
    dataset's ``max_unreadable`` share of them could not be read: an epoch of nothing must
    never count as a completed one, and a folder half broken is not the dataset it names."""
    total = read + unreadable
    if not unreadable:
        return
    share = unreadable / total
    if read and share <= data.max_unreadable:
        return
    # The example comes last: the repeated-failure rule compares reasons without it.
    example = f" (e.g. {example})" if example else ""
    if not read:
        raise TrialFailure(FailureKind.DATA, f"no {split} image of {data.name} could be read in epoch "
                           f"{epoch}: all {unreadable} were unreadable; check the files of "
                           f"the dataset's {split} folders{example}")
    raise TrialFailure(FailureKind.DATA, f"{unreadable} of {total} {split} images ({share:.1%}) could "
                       f"not be read in epoch {epoch}, more than data.max_unreadable "
                       f"({data.max_unreadable:.1%}); repair or remove them{example}")


def _train(spec: TrialSpec, ctx: RankContext, emit: Emit, outcome: TrialOutcome) -> None:
    graph = Graph.from_dict(spec.graph)
    data = ctx.dataset
    if graph.input_shape != data.input_shape:
        raise TrialFailure(FailureKind.DATA, f"graph input {graph.input_shape} does not match the "
                           f"{data.name} images {data.input_shape}")
    if graph.num_classes != data.num_classes:
        raise TrialFailure(FailureKind.DATA, f"graph has {graph.num_classes} outputs but {data.name} has "
                           f"{data.num_classes} classes")
    if spec.batch_size < ctx.world:
        raise TrialFailure(FailureKind.DATA, f"batch size {spec.batch_size} is smaller than the "
                           f"{ctx.world} ranks")
    run = _Run(spec, ctx, graph)
    outcome.precision, outcome.batch_size = run.precision, run.batch
    outcome.extra["compile_decision"] = run.decision.to_dict()
    best = spec.save_above
    stopper = EarlyStopping(spec.early_stop_metric, spec.patience, spec.early_stop_min_delta)
    for epoch in range(spec.epochs):
        started = time.time()
        if spec.finish_by is not None:
            # Every rank must agree, or one would wait for the others in a collective.
            (late,) = _reduce([float(started >= spec.finish_by)], ctx,
                              dist.ReduceOp.MAX if ctx.distributed else None)
            if late:
                outcome.status, outcome.reason = TrialStatus.STOPPED, "deadline reached"
                return
        skipped_before, data.unreadable = data.skipped, ""
        cpu_before = data.cpu_decoded
        local_loss, local_images, local_steps, local_wait, local_device, seconds = \
            run.train_epoch(epoch, emit)
        # Unreadable training images: what `check` needs to tie steps to images.
        local_skipped = data.skipped - skipped_before
        train_example, data.unreadable = data.unreadable, ""
        if epoch == spec.epochs - 1:
            data.expect_next(None)  # the trial's last pass: nothing to decode after it
        local_correct, local_seen, local_val_loss = run.validate()
        local_val_skipped = data.skipped - skipped_before - local_skipped
        (loss_sum, n_images, n_correct, n_seen, n_skipped, n_val_skipped, wait, on_device, cpu,
         val_loss_sum) = _reduce([local_loss, local_images, local_correct, local_seen,
                                  local_skipped, local_val_skipped, local_wait, local_device,
                                  data.cpu_decoded - cpu_before, local_val_loss], ctx)
        # One optimiser update per global step: the rank that stepped most counts them.
        (n_steps,) = _reduce([local_steps], ctx, dist.ReduceOp.MAX if ctx.distributed else None)
        images, seen, steps, correct = int(n_images), int(n_seen), int(n_steps), int(n_correct)
        skipped, val_skipped = int(n_skipped), int(n_val_skipped)
        # Every rank judges the same reduced counts, so all of them fail the trial together.
        _judge_unreadable(data, epoch, "training", images, skipped, train_example)
        _judge_unreadable(data, epoch, "validation", seen, val_skipped, data.unreadable)
        if not math.isfinite(loss_sum):
            raise TrialFailure(FailureKind.NAN, f"the training loss became non-finite in epoch {epoch}")
        accuracy = correct / seen if seen else 0.0
        if run.compiled and epoch == 0:
            run.compiled = note_compilation(run.graphs_before, outcome.extra)
        val_loss = val_loss_sum / seen if seen else None
        event = EpochEvent(
            trial_id=spec.trial_id, epoch=spec.first_epoch + epoch, started_at=started,
            ended_at=time.time(),
            train_images=images, val_images=seen, steps=steps,
            ops=epoch_ops(run.ops, images, steps, seen),
            train_loss=loss_sum / max(1, images), val_accuracy=accuracy,
            precision=run.precision, batch_size=run.batch, world_size=ctx.world,
            data_share=min(1.0, wait / ctx.world / max(seconds, 1e-9)),
            device_share=min(1.0, on_device / ctx.world / max(seconds, 1e-9)),
            images_per_s=images / max(seconds, 1e-9), skipped_images=skipped,
            val_skipped=val_skipped, compiled=run.compiled, decode_path=data.decode_path,
            cpu_decoded=int(cpu), val_loss=val_loss)
        outcome.epochs = epoch + 1
        # The weights kept are those of the best accuracy, whatever early stopping watches:
        # the accuracy is what the trial reports and what `check --remeasure` re-measures.
        if accuracy > best:
            best = accuracy
            outcome.best_accuracy, outcome.best_epoch = accuracy, spec.first_epoch + epoch
            if ctx.rank == 0 and spec.weights_out:
                save_weights(run.module, spec.weights_out)
                outcome.weights = spec.weights_out
        emit("epoch", event.to_dict())
        if stopper.update(val_loss, accuracy):
            outcome.early_stopped = True
            break
    outcome.status = TrialStatus.COMPLETED
