"""The benchmark configuration: one typed object, loadable from TOML, stored with every run.

Defaults follow the official rules (ImageNet, ResNet-50, 60 epochs). Each dataset has a preset
that changes only customisable settings plus the fixed ones that an unofficial dataset implies
(image size, seed model); ``Config.for_dataset`` applies it. Settings the ruleset (:mod:`automlperf.rules`)
fixes must keep their official value in an official run; :meth:`Config.fixed_changes` names
any that differ.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from automlperf import rules
from automlperf.errors import UserError

Dataset = Literal["imagenet", "cifar10", "builtin", "digits", "synthetic"]
# "auto" and the ruleset's allowed precisions (a test keeps the two in step).
Precision = Literal["auto", "bf16", "fp16", "tf32", "fp32"]


class ConfigError(UserError, ValueError):
    """A configuration problem, described in one line."""


def parse_duration(value: Any) -> float:
    """Seconds from a number or a string such as ``90``, ``"10m"``, ``"2h"``, ``"1h30m"``."""
    if isinstance(value, bool):
        raise ConfigError("a duration is a number of seconds or a string like '10m' or '2h'")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        text = value.strip().lower()
        if re.fullmatch(r"\d+(\.\d+)?", text):
            return float(text)
        parts = re.findall(r"(\d+(?:\.\d+)?)\s*([hms])", text)
        if parts and re.fullmatch(r"(\s*\d+(\.\d+)?\s*[hms])+\s*", text):
            scale = {"h": 3600.0, "m": 60.0, "s": 1.0}
            return sum(float(n) * scale[u] for n, u in parts)
    raise ConfigError(f"{value!r} is not a duration; write seconds or e.g. '10m', '2h', '1h30m'")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class RunConfig(_Section):
    duration_s: float = Field(3600.0, gt=0, description="Wall-clock length of the run in "
                              "seconds (TOML also takes '10m', '2h'). Official runs need >= 1 h.")
    replicas: int = Field(1, ge=1, le=10_000, description="Local replica processes (`run`); on "
                          "SLURM, one replica per node; with an external launcher, the replicas "
                          "expected. At most 10,000: the size the control plane is measured at.")
    devices_per_replica: int | None = Field(None, ge=1, description="Accelerators each replica "
                                            "trains on; default all visible (CPU: 1).")
    seed: int = Field(0, ge=0, description="Seed of the search, the HPO and weight init.")
    official: bool | None = Field(None, description="true: refuse to start unless the run can "
                                  "be official (every fixed setting at its official value, real "
                                  "accelerators, the data ImageNet-1k). false: an unofficial run, "
                                  "never refused for its data. Unset: a run whose settings are "
                                  "all official is held to the data rule too (refused on other "
                                  "data); any other run is unofficial.")
    heartbeat_s: float = Field(5.0, gt=0, description="Replica heartbeat period, seconds.")
    lease_timeout_s: float = Field(60.0, gt=0, description="A trial whose replica is silent "
                                   "this long is marked failed, seconds.")
    stop_grace_s: float = Field(20.0, ge=0, description="Time replicas get to stop after the "
                                "deadline (and its epoch grace) before they are killed, "
                                "seconds.")
    deadline_grace_s: float | None = Field(None, ge=0, description="How long after the "
                                           "deadline an epoch in flight may take to finish "
                                           "and still count (its replica is charged the time "
                                           "it took), seconds; default: a quarter of "
                                           "duration_s. No epoch starts after the deadline.")
    max_rounds: int | None = Field(None, ge=1, description="Trials each replica trains before "
                                   "it stops; unset: until the deadline. For smoke tests: a "
                                   "run that ends before its duration is not a valid one.")
    max_repeated_failures: int = Field(3, ge=1, description="Trials in a row failing for the "
                                       "same reason after which a replica gives up and the run "
                                       "ends as failed. One failing architecture never stops "
                                       "a run.")
    require_accelerators: bool = Field(False, description="A replica that sees no "
                                       "accelerator stops, naming why (a CPU-only torch, no "
                                       "visible device), instead of training on its CPUs.")
    accelerator: Literal["real", "simulated"] = Field(
        "real", description="real: train on this node's accelerators. simulated: model them "
        "([simulation]) to exercise the control plane at scale; such a result is labelled "
        "simulated and is never valid.")

    @field_validator("duration_s", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> float:
        return parse_duration(value)

    @field_validator("deadline_grace_s", mode="before")
    @classmethod
    def _grace(cls, value: Any) -> float | None:
        return None if value is None else parse_duration(value)

    @property
    def grace_s(self) -> float:
        """The deadline's grace, in seconds."""
        return self.duration_s / 4 if self.deadline_grace_s is None else self.deadline_grace_s


class DataConfig(_Section):
    dataset: Dataset = Field("imagenet", description="fixed: imagenet for official runs.")
    data_dir: Path | None = Field(None, description="Folder with the dataset (imagenet, cifar10).")
    image_size: int = Field(224, ge=8, le=1024, description="fixed: 224. Side of the square "
                            "training crop, pixels.")
    workers: int | None = Field(None, ge=0, description="Data-loading worker processes per "
                                "accelerator; default: the spare CPU cores.")
    gpu_decode: bool | None = Field(False, description="Decode JPEGs on the GPU with nvJPEG "
                                    "(the `nvjpeg` extra: torchcodec, else torchvision), "
                                    "with the same crops, flips and resampling as the CPU "
                                    "path; off unless set to true (unset is off): on one "
                                    "H200 it fed a rank 2,293 img/s against 5,639 img/s "
                                    "from the CPU workers (its device stage alone 5,040 "
                                    "img/s: reading and parsing the files limits it).")
    dali: bool = Field(False, description="Decode with NVIDIA DALI instead (the `dali` "
                       "extra): its own random crops and flips, a different function from "
                       "the reference, recorded as such; never chosen by default.")
    synthetic_images: int = Field(4096, ge=1, description="Training images per epoch of the "
                                  "synthetic dataset (validation gets a quarter).")
    synthetic_classes: int = Field(1000, ge=2, description="Classes of the synthetic dataset.")
    max_unreadable: float = Field(0.05, ge=0, le=1, description="Share of a split's images "
                                  "that may be unreadable in an epoch; beyond it the trial "
                                  "fails for its data. An official run allows none.")


class ModelConfig(_Section):
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


class CompileFiguresConfig(_Section):
    """What compiling costs and gains on a node (``train.compiling.CompileFigures``)."""

    compile_s: float = Field(ge=0, description="Seconds compilation added to the first steps.")
    layers: int = Field(ge=1, description="Layers of the architecture it was measured on.")
    eager_ops_per_s: float = Field(gt=0, description="Training OPS of eager steps.")
    compiled_ops_per_s: float = Field(gt=0, description="Training OPS of compiled steps.")
    source: str = Field("", description="Where the figures were measured.")


class TrainConfig(_Section):
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
    label_smoothing: float = Field(0.1, ge=0, lt=1)
    max_epochs: int = Field(60, ge=1, le=10000, description="Epoch budget of a trial from the "
                            "fourth round on; the learning rate decays to 0 over it.")
    warmup_round_fractions: list[float] = Field(
        [0.25, 0.5, 0.75], min_length=1, max_length=10,
        description="Epoch budget of rounds 0, 1, 2, ... as fractions of max_epochs "
                    "(15, 30, 45 of 60).")
    patience_base: int = Field(6, ge=1, description="Early stopping patience in round r: "
                               "min(base + per_round * r, max) epochs.")
    patience_per_round: int = Field(2, ge=0)
    patience_max: int = Field(20, ge=1)
    # The paper's rule ("once the validation loss flats"; its reference's Keras
    # EarlyStopping(min_delta=0.001)): on the built-in task it stopped no trial early, as
    # accuracy with strict improvement did not (bench/RESULTS.md).
    early_stop_metric: Literal["val_loss", "val_accuracy"] = Field(
        "val_loss", description="fixed: val_loss (aiperf-2021.2). What early stopping watches: a trial stops after "
        "`patience` epochs in a row without improving it by more than early_stop_min_delta.")
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


class SearchConfig(_Section):
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
        "with_nas", description="fixed: with_nas (aiperf-2021.2). with_nas: from "
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


class MonitorConfig(_Section):
    interval_s: float = Field(30.0, gt=0, description="Resource sampling period, seconds.")
    ceiling_s: float = Field(2.0, ge=0.05, le=60, description="How long each replica measures "
                             "its devices' dense rate at start (a GPU's matrix product; a CPU's matrix product "
                             "and 3x3 convolution, half each, the faster counting), seconds.")


class SimulationConfig(_Section):
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


class Config(_Section):
    """Every setting of a benchmark run. Sections mirror the TOML tables."""

    run: RunConfig = RunConfig()
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()
    search: SearchConfig = SearchConfig()
    monitor: MonitorConfig = MonitorConfig()
    simulation: SimulationConfig = SimulationConfig()

    # --- loading ------------------------------------------------------------------------
    @classmethod
    def for_dataset(cls, dataset: str, overrides: dict[str, Any] | None = None,
                    source: str = "configuration") -> Config:
        """The dataset's preset with ``overrides`` (nested dict, as from TOML) on top."""
        merged = _merge(PRESETS.get(dataset, {}), overrides or {})
        merged.setdefault("data", {})["dataset"] = dataset
        return cls.parse(merged, source)

    @classmethod
    def parse(cls, data: dict[str, Any], source: str = "configuration") -> Config:
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise ConfigError(_one_line(exc, source)) from None

    @classmethod
    def load(cls, path: Path | str, overrides: dict[str, Any] | None = None) -> Config:
        """Read TOML (or a configuration shipped with automlperf, by name: ``official``);
        the preset of the dataset it names (default imagenet) fills the rest."""
        path = config_file(path)
        try:
            data = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"{path}: no such file; pass an existing TOML file to --config, "
                              f"or the name of one shipped with automlperf "
                              f"({', '.join(shipped_names())})") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML ({exc})") from None
        merged = _merge(data, overrides or {})
        dataset = merged.get("data", {}).get("dataset", "imagenet")
        if dataset not in PRESETS:
            return cls.parse(merged, str(path))  # let validation name the bad value
        return cls.for_dataset(dataset, merged, str(path))

    def to_toml(self) -> str:
        import tomli_w

        return tomli_w.dumps(self.model_dump(mode="json", exclude_none=True))

    # --- rules --------------------------------------------------------------------------
    def settings(self) -> dict[str, Any]:
        """Every setting by dotted name, as JSON values."""
        return {f"{s}.{k}": v for s, sec in self.model_dump(mode="json").items()
                for k, v in sec.items()}

    def fixed_changes(self, ruleset: rules.Ruleset = rules.CURRENT) -> list[str]:
        """Settings the ruleset fixes whose value differs from the official one."""
        return ruleset.fixed_changes(self.settings())

    @property
    def simulated(self) -> bool:
        return self.run.accelerator == "simulated"

    def strict(self) -> bool:
        """Whether the run is held to every official rule before it starts: asked for
        (``run.official = true``), or a real run whose every fixed setting is official,
        unless it is declared unofficial (``run.official = false``)."""
        if self.run.official is not None:
            return self.run.official
        return not self.simulated and not self.fixed_changes()

    def check_official(self) -> None:
        if self.run.official and self.simulated:
            raise ConfigError("official run refused: run.accelerator is \"simulated\", and a "
                              "simulated result is never official; set run.accelerator = "
                              "\"real\" or run.official = false")
        changes = self.fixed_changes()
        if self.run.official and changes:
            raise ConfigError("official run refused: fixed setting(s) changed: "
                              + "; ".join(changes) + ". Restore them or set run.official = false")

    def deadline_grace(self, ruleset: rules.Ruleset = rules.CURRENT) -> float:
        """Seconds an epoch in flight at the deadline may take to finish and count: the
        run's grace under a ruleset that charges each replica its own time, else none."""
        return self.run.grace_s if ruleset.charge == "per_replica" else 0.0

    def customised(self) -> dict[str, Any]:
        """Dotted names of every setting that differs from the defaults, with its value."""
        base = Config().model_dump(mode="json")
        mine = self.model_dump(mode="json")
        return {f"{s}.{k}": v for s, sec in mine.items() for k, v in sec.items()
                if base[s].get(k) != v}


def shipped(name: str) -> Path | None:
    """A configuration file shipped in the package's presets/ folder, by name."""
    if not re.fullmatch(r"[a-z0-9_-]+", name):
        return None
    found = Path(__file__).parent / "presets" / f"{name}.toml"
    return found if found.is_file() else None


def shipped_names() -> list[str]:
    return sorted(p.stem for p in (Path(__file__).parent / "presets").glob("*.toml"))


def config_file(path: Path | str) -> Path:
    """The file ``--config`` names: a path, or the name of a shipped configuration
    (``official``) when no such file exists here."""
    path = Path(path)
    if not path.exists():
        return shipped(str(path)) or path
    return path


FIXED = rules.CURRENT.fixed
MAX_DEFAULT_BATCH = 256


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in base.items()}
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


# The two built-in tasks share one CPU-sized recipe; their resolution and seed width differ.
_BUILTIN_RECIPE: dict[str, Any] = {
    "run": {"duration_s": 180.0, "lease_timeout_s": 30.0},
    "model": {"seed_model": "resnet_small"},
    "train": {"batch_size": 64, "max_epochs": 8, "warmup_epochs": 1.0, "lr_per_256": 0.4,
              "patience_base": 3, "patience_per_round": 1, "patience_max": 5},
    "monitor": {"interval_s": 5.0},
}

# Customisable (and dataset-implied) settings per dataset; everything else keeps its default.
PRESETS: dict[str, dict[str, Any]] = {
    "imagenet": {},
    "cifar10": {"data": {"image_size": 32}, "model": {"seed_model": "resnet_small"},
                "train": {"batch_size": 128, "max_epochs": 30}},
    # The default task widens the small seed four times: its convolutions then fill a CPU's
    # vector units (0.5-0.6 of the measured ceiling over a 3-minute run, against an eighth
    # at width 1; bench/RESULTS.md). The digits stay the fastest.
    # Its epochs hold 4,000 training images, twice the digits', so its epoch-counted settings
    # are halved: a trial trains as many steps, on the same schedule, validated half as often.
    "builtin": _merge(_BUILTIN_RECIPE, {
        "data": {"image_size": 12}, "model": {"seed_width": 4},
        "train": {"max_epochs": 4, "warmup_epochs": 0.5, "patience_base": 2,
                  "patience_max": 3}}),
    "digits": {**_BUILTIN_RECIPE, "data": {"image_size": 8}},
    "synthetic": {"run": {"duration_s": 600.0}, "data": {"image_size": 224},
                  "train": {"max_epochs": 4}},
}


def _one_line(exc: ValidationError, source: str) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    kind = err["type"]
    if kind == "extra_forbidden":
        section = ".".join(str(p) for p in err["loc"][:-1])
        valid = _keys(section)
        hint = f"; valid keys{' in [' + section + ']' if section else ''}: {', '.join(valid)}"
        return f"{source}: unknown setting {where!r}{hint}"
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    got = err.get("input")
    shown = "" if isinstance(got, dict) else f" (got {got!r})"
    more = f" [and {len(exc.errors()) - 1} more]" if len(exc.errors()) > 1 else ""
    return f"{source}: {where}: {msg}{shown}{more}"


def _keys(section: str) -> list[str]:
    model: type[BaseModel] = Config
    for part in filter(None, section.split(".")):
        annotation = model.model_fields[part].annotation
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    return list(model.model_fields)


def set_option(tree: dict[str, Any], dotted: str, value: Any) -> None:
    """Put an option given on the command line into a configuration tree (None: not given)."""
    if value is None:
        return
    section, key = dotted.split(".")
    tree.setdefault(section, {})[key] = value


def load_config(path: Path | None, dataset: str | None, overrides: dict[str, Any]) -> Config:
    """The configuration file with ``overrides`` on top, or the dataset's preset (``builtin``
    unless named)."""
    if path is not None:
        if dataset is not None:
            overrides.setdefault("data", {})["dataset"] = dataset
        return Config.load(path, overrides)
    return Config.for_dataset(dataset or "builtin", overrides, "command line")
