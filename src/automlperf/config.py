"""The benchmark configuration: one typed object, loadable from TOML, stored with every run.

Defaults follow the official rules (ImageNet, ResNet-50, 60 epochs). Each dataset has a preset
that changes only customisable settings plus the fixed ones that an unofficial dataset implies
(image size, seed model); ``Config.for_dataset`` applies it. Settings the ruleset (:mod:`automlperf.rules`)
fixes must keep their official value in an official run; :meth:`Config.fixed_changes` names
any that differ.

The run's own section is here; the sections the rest of the package takes whole (data, model,
train, search, monitor, simulation) are in :mod:`automlperf.sections`, and are imported from
here. What a command's options ask for is turned into a :class:`Config` by
:mod:`automlperf.settings`.
"""

from __future__ import annotations

import re
import secrets
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator

from automlperf import rules
from automlperf.errors import UserError
from automlperf.sections import (
    CompileFiguresConfig,
    DataConfig,
    Dataset,
    ModelConfig,
    MonitorConfig,
    Precision,
    SearchConfig,
    Section,
    SimulationConfig,
    TrainConfig,
)

__all__ = ["FIXED", "PRESETS", "CompileFiguresConfig", "Config", "ConfigError", "DataConfig",
           "Dataset", "ModelConfig", "MonitorConfig", "Precision", "RunConfig", "SearchConfig",
           "SimulationConfig", "TrainConfig", "config_file", "load_config", "parse_duration",
           "set_option", "shipped", "shipped_names"]


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


class RunConfig(Section):
    duration_s: float = Field(3600.0, gt=0, description="Wall-clock length of the run in "
                              "seconds (TOML also takes '10m', '2h'). An official run needs "
                              "a whole number of hours, at least 1, and must run to it.")
    replicas: int = Field(1, ge=1, le=10_000, description="Local replica processes (`run`); on "
                          "SLURM, one replica per node; with an external launcher, the replicas "
                          "expected. At most 10,000: the size the control plane is measured at.")
    devices_per_replica: int | None = Field(None, ge=1, description="Accelerators each replica "
                                            "trains on; default all visible (CPU: 1).")
    seed: int | None = Field(None, ge=0, description="Seed of the search, the HPO and weight "
                             "init. Unset: an official run draws its own when it starts "
                             "(aiperf-2021.4 fixes it unset, so that no seed is chosen), "
                             "any other run uses 0; the run records the seed it used.")
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
                                           "it took), seconds; unset: the ruleset's, a "
                                           "quarter of duration_s, and an official run "
                                           "keeps it unset. No epoch starts after the "
                                           "deadline.")
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


class Config(Section):
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
        short = rules.CURRENT.duration_problem(self.run.duration_s)
        if self.run.official and short:
            raise ConfigError(f"official run refused: run.duration_s: {short}; set a whole "
                              "number of hours (e.g. '2h') or run.official = false")

    def deadline_grace(self, ruleset: rules.Ruleset = rules.CURRENT) -> float:
        """Seconds an epoch in flight at the deadline may take to finish and count: under a
        ruleset that charges each replica its own time, the run's own setting or else the
        ruleset's grace; none under any other."""
        return ruleset.grace_s(self.run.duration_s, self.run.deadline_grace_s)

    def new_seed(self) -> int:
        """The seed a new run records and trains with: its configuration's; else, for a run
        held to the official rules, one drawn now, which no one chose (a site cannot bring
        the best of the seeds it tried elsewhere); else 0, so that other runs repeat."""
        if self.run.seed is not None:
            return self.run.seed
        return secrets.randbelow(2**31) if self.strict() else 0

    def seed_used(self, recorded: dict[str, Any] | None = None) -> int:
        """The seed the run trains with: the configuration's, else the one the run drew and
        recorded at its start (``recorded``, its system record), else 0."""
        if self.run.seed is not None:
            return self.run.seed
        drawn = (recorded or {}).get("seed")
        return int(drawn) if isinstance(drawn, int) else 0

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
