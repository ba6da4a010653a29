"""The sections of the benchmark configuration that a part of the package takes whole: one
pydantic model per TOML table ([data], [model], [train], [search], [monitor], [simulation]),
each setting with its default, bounds and description. The data section goes down to the
loader as it is (``train.data.load``), the train section into each trial's spec.

:mod:`automlperf.config` assembles them, with the run's own section, into :class:`Config`,
and is where they are imported from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from automlperf import rules

Dataset = Literal["imagenet", "cifar10", "builtin", "digits", "synthetic"]
# "auto" and the ruleset's allowed precisions (a test keeps the two in step).
Precision = Literal["auto", "bf16", "fp16", "tf32", "fp32"]
MAX_DEFAULT_BATCH = 256


class Section(BaseModel):
    """A table of the configuration: unknown keys are refused, assignments validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class DataConfig(Section):
    dataset: Dataset = Field("imagenet", description="fixed: imagenet for official runs.")
    data_dir: Path | None = Field(None, description="Folder with the dataset (imagenet, cifar10).")
    image_size: int = Field(224, ge=8, le=1024, description="fixed: 224. Side of the square "
                            "training crop, pixels.")
    workers: int | None = Field(None, ge=0, description="Data-loading worker processes per "
                                "accelerator; default: the spare CPU cores.")
    gpu_decode: bool | None = Field(None, description="Decode JPEGs on the GPU with nvJPEG "
                                    "(the `nvjpeg` extra: torchcodec, else torchvision), "
                                    "with the same crops, flips and resampling as the CPU "
                                    "path. Unset: automatic, the path `automlperf doctor` "
                                    "measured faster beside training on this node, the CPU "
                                    "workers until the GPU path wins there; true or false "
                                    "decides.")
    val_cache: bool = Field(True, description="Keep each rank's decoded validation images on "
                            "its device for the trial (where its memory allows) instead of "
                            "decoding them every epoch: the same batches bit for bit.")
    dali: bool = Field(False, description="Decode with NVIDIA DALI instead (the `dali` "
                       "extra): its own random crops and flips, a different function from "
                       "the reference, recorded as such; never chosen by default.")
    synthetic_images: int = Field(4096, ge=1, description="Training images per epoch of the "
                                  "synthetic dataset (validation gets a quarter).")
    synthetic_classes: int = Field(1000, ge=2, description="Classes of the synthetic dataset.")
    max_unreadable: float = Field(0.05, ge=0, le=1, description="Share of a split's images "
                                  "that may be unreadable in an epoch; beyond it the trial "
                                  "fails for its data. An official run allows none.")

    def for_ranks(self, threads: int) -> DataConfig:
        """This section as training processes with ``threads`` cores each load it: unless
        set, ``workers`` is the spare cores beside a rank's threads for image files (data
        held in memory needs no decoding workers)."""
        if self.workers is not None:
            return self
        spare = max(0, threads - 1) if self.dataset == "imagenet" else 0
        return self.model_copy(update={"workers": spare})


class ModelConfig(Section):
    seed_model: Literal["resnet50", "resnet_small"] = Field(
        "resnet50", description="fixed: resnet50. The initial architecture.")
    seed_width: int = Field(1, ge=1, le=16, description="fixed: 1. Multiplies the channels of "
                            "the resnet_small seed (the built-in tasks widen it so that a CPU's "
                            "vector units have whole rows to fill).")
    initial_weights: Literal["kaiming_normal", "kaiming_uniform"] = Field(
        "kaiming_normal", description="Initialisation of untrained weights.")

    @field_validator("seed_width")
    @classmethod
    def _width(cls, value: int, info: ValidationInfo) -> int:
        seed = info.data.get("seed_model")
        if value != 1 and seed != "resnet_small":
            raise ValueError(f"applies to the resnet_small seed only; {seed} keeps its own "
                             "widths (set it to 1)")
        return value


class CompileFiguresConfig(Section):
    """What compiling costs and gains on a node (``train.compiling.CompileFigures``)."""

    compile_s: float = Field(ge=0, description="Seconds compilation added to the first steps.")
    layers: int = Field(ge=1, description="Layers of the architecture it was measured on.")
    eager_ops_per_s: float = Field(gt=0, description="Training OPS of eager steps.")
    compiled_ops_per_s: float = Field(gt=0, description="Training OPS of compiled steps.")
    source: str = Field("", description="Where the figures were measured.")
    loader_images_per_s: float | None = Field(None, gt=0, description="Images per second "
                                              "the rank's loader delivers alone; caps both "
                                              "rates (unset: not measured).")


class TrainConfig(Section):
    batch_size: int | None = Field(None, ge=1, le=65536, description="Images per accelerator "
                                   "per step before HPO; default scales 448 per 32 GB of "
                                   "accelerator memory up to 256 (CPU: 64).")
    optimizer: Literal["sgd"] = Field("sgd", description="SGD with momentum.")
    momentum: float = Field(0.9, ge=0, lt=1)
    nesterov: bool = False
    weight_decay: float = Field(5e-5, ge=0, le=1)
    lr_per_256: float = Field(0.1, gt=0, le=100, description="Peak learning rate per 256 "
                              "images of global batch.")
    warmup_epochs: float = Field(2.0, ge=0, description="Linear learning-rate warm-up, epochs.")
    label_smoothing: float = Field(0.1, ge=0, lt=1, description="Of the training loss "
                                   "(customisable, as the paper's loss is); early stopping "
                                   "watches the validation loss without it.")
    cpu_binding: Literal["auto", "spread", "off"] = Field(
        "auto", description="Where ranks and their decoding workers run: auto, on multi-NUMA "
        "nodes a share of the cores of each GPU's NUMA node (not where the batch system "
        "already placed the process); spread, a share of the allowed cores in any case (CPU "
        "ranks too); off, wherever the scheduler puts them.")
    max_epochs: int = Field(60, ge=1, le=10000, description="fixed: 60 (aiperf-2021.3). Epoch "
                            "budget of a trial from the fourth round on; the learning rate "
                            "decays to 0 over it.")
    warmup_round_fractions: list[float] = Field(
        [0.25, 0.5, 0.75], min_length=1, max_length=10,
        description="Epoch budget of rounds 0, 1, 2, ... as fractions of max_epochs "
                    "(15, 30, 45 of 60).")
    patience_base: int = Field(6, ge=1, description="fixed: 6, 2 and 20 (aiperf-2021.3). "
                               "Early stopping patience in round r: "
                               "min(base + per_round * r, max) epochs.")
    patience_per_round: int = Field(2, ge=0)
    patience_max: int = Field(20, ge=1)
    # The paper's rule ("once the validation loss flats"; its reference's Keras
    # EarlyStopping(min_delta=0.001)).
    early_stop_metric: Literal["val_loss", "val_accuracy"] = Field(
        "val_loss", description="fixed: val_loss (since aiperf-2021.2). What early stopping "
        "watches: a trial stops after `patience` epochs in a row without improving it by "
        "more than early_stop_min_delta.")
    early_stop_min_delta: float = Field(0.001, ge=0, description="fixed: 0.001. The least change of the "
                                        "watched figure that counts as an improvement.")
    precision: Precision = Field("auto", description="auto: bf16 autocast on GPUs that have "
                                 "it, fp16 on others, fp32 on CPU. Nothing below 16-bit.")
    channels_last: bool | None = Field(None, description="Default: on for CPUs and for NVIDIA "
                                       "and AMD GPUs.")
    compile: bool | None = Field(None, description="Run the model through torch.compile. "
                                 "Default: when the trial's planned training repays the "
                                 "measured cost of compiling it (figures from "
                                 "compile_figures, else those `automlperf doctor` "
                                 "measured on this node; without figures, eager).")
    compile_figures: CompileFiguresConfig | None = Field(
        None, description="Measured compilation figures for the default compile decision, as "
        "`automlperf doctor` prints them.")
    parallelism: Literal["ddp"] = Field("ddp", description="Synchronous all-reduce data "
                                        "parallelism (DistributedDataParallel).")

    @field_validator("precision", mode="before")
    @classmethod
    def _precision(cls, value: Any) -> Any:
        allowed = rules.CURRENT.allowed_precisions
        if isinstance(value, str) and value.lower() not in ("auto", *allowed):
            raise ValueError(f"{value!r} is below the 16-bit floating point minimum or not a "
                             f"precision; use auto, {', '.join(allowed)}")
        return value

    @field_validator("warmup_round_fractions")
    @classmethod
    def _fractions(cls, value: list[float]) -> list[float]:
        if any(not 0 < f <= 1 for f in value):
            raise ValueError("each fraction must be in (0, 1]")
        return value

    def per_device_batch(self, memory_gib: float | None) -> int:
        """Images per accelerator before HPO: the configured value, else 448 per 32 GB of
        accelerator memory (multiples of 8) up to 256, else 64 on a CPU. Memory alone would
        give 1,112 on an 80 GB GPU (2,224 at TPE's top), where a grown ResNet-50 runs out of
        memory and the learning rate scaled to that batch diverges."""
        if self.batch_size is not None:
            return self.batch_size
        if memory_gib is None:
            return 64
        return max(8, min(MAX_DEFAULT_BATCH, int(448 * memory_gib / 32) // 8 * 8))

    def round_epochs(self, round_index: int) -> int:
        """Epoch budget of a replica's round (0-based)."""
        if round_index < len(self.warmup_round_fractions):
            return max(1, round(self.max_epochs * self.warmup_round_fractions[round_index]))
        return self.max_epochs

    def patience(self, round_index: int) -> int:
        return min(self.patience_base + self.patience_per_round * round_index, self.patience_max)


class SearchConfig(Section):
    nas: Literal["network_morphism"] = Field("network_morphism", description="fixed.")
    strategy: Literal["bayesian", "greedy", "random"] = Field(
        "bayesian", description="fixed: bayesian (a Gaussian process on the edit distance "
        "ranks morphs of trained models). The others are baselines that measure it: greedy "
        "morphs the most accurate model so far, random morphs a trained model drawn at "
        "random.")
    inherit_weights: bool = Field(True, description="fixed: true. A child starts from its "
                                  "parent's trained weights; false trains each from fresh "
                                  "weights (a baseline).")
    hpo: Literal["tpe", "none"] = Field("tpe", description="fixed: tpe. none keeps the "
                                        "default batch size and the smallest kernel size in "
                                        "every round (a baseline).")
    hpo_start_round: int = Field(3, ge=0, description="fixed: 3 (the fourth round).")
    hpo_order: Literal["with_nas", "after_nas"] = Field(
        "with_nas", description="fixed: with_nas (since aiperf-2021.2). with_nas: from "
        "hpo_start_round TPE draws the batch size and the kernel size of deepen blocks with "
        "each architecture, which trains once. "
        "after_nas: the paper's order: each architecture is generated (3x3 deepen blocks), "
        "trained with its parent's batch size, then trained again from the same weights with "
        "TPE's; the better training counts and its batch size goes to its children.")
    kernel_sizes: list[Literal[3, 5, 7]] = Field([3, 5, 7], min_length=1,
                                                 description="Kernel sizes TPE chooses from "
                                                 "for deepen blocks.")
    batch_size_factors: tuple[float, float] = Field((0.5, 2.0), description="TPE's batch size "
                                                    "range, as factors of the default.")
    tpe_startup_trials: int = Field(4, ge=1, description="TPE trials drawn at random before "
                                    "the model takes over.")
    beta: float = Field(2.576, gt=0, description="fixed: UCB exploration weight.")
    max_layers: int = Field(2000, ge=10, description="Morphs that exceed it are refused.")
    max_params: int = Field(500_000_000, ge=1000, description="Morphs that exceed it are "
                            "refused.")
    max_morphs_per_child: int = Field(3, ge=1, le=20)
    gp_max_models: int = Field(64, ge=4, le=10000, description="History models the Gaussian "
                               "process is fitted on (best, recent and diverse).")
    candidates_per_generation: int = Field(112, ge=1, le=100_000, description="Architectures "
                                           "the Gaussian process scores per generation "
                                           "(annealing steps x neighbours). A count, not a "
                                           "time, so that any machine picks the same one.")
    sa_t_min: float = Field(0.05, gt=0, lt=1, description="Floor of the simulated-annealing "
                            "temperature.")
    sa_cooling: float = Field(0.8, gt=0, lt=1, description="Temperature factor per annealing "
                              "step (from 1.0).")
    neighbours: int = Field(8, ge=1, le=64, description="Children tried per expanded node.")
    generation_budget_s: float = Field(30.0, gt=0, description="Safety cap on one candidate "
                                       "generation, seconds; logged when it fires, since the "
                                       "choice then depends on the machine's speed.")


class MonitorConfig(Section):
    interval_s: float = Field(30.0, gt=0, description="Resource sampling period, seconds.")
    ceiling_s: float = Field(2.0, ge=0.05, le=60, description="How long each replica measures "
                             "its devices' dense rate at start (a GPU's matrix product; a CPU's matrix product "
                             "and 3x3 convolution, half each, the faster counting), seconds.")


class SimulationConfig(Section):
    """The accelerator a simulated run models (``run.accelerator = "simulated"``)."""

    sustained_ops: float = Field(2.0e14, gt=0, description="Operations per second one "
                                 "simulated device sustains while training. Default: an "
                                 "H100-class figure, about a fifth of its 989 TFLOPS dense "
                                 "bf16 peak, near what tuned ResNet-50 training reaches.")
    time_compression: float = Field(1.0, ge=1, le=1e6, description="The simulated devices "
                                    "run this many times faster than modelled, so a long run "
                                    "fits in a short one; the score grows by the same factor.")
    memory_gib: float = Field(80.0, gt=0, description="Memory of a simulated device, GiB "
                                 "(sets the default batch size as a real one would).")
    poll_s: float = Field(0.1, gt=0, le=5, description="How often a simulated epoch looks "
                          "for a stop (deadline, SIGTERM), seconds.")
