"""The rules of an official result, versioned: one ruleset per id, read by every other module.

A result records the id of the ruleset it was scored under, and ``automlperf check`` verifies
it against that ruleset, so a later change of the rules never silently re-judges old results:
a new rule gets a new id. Pure data (no torch, no I/O beyond the package's own files).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cache
from importlib import resources
from types import MappingProxyType
from typing import Any, Mapping

from automlperf.errors import UserError


class UnknownRuleset(UserError, ValueError):
    """A result names a ruleset this automlperf does not know."""


@dataclass(frozen=True)
class DatasetRules:
    """What an official dataset is: its classes (by WordNet id), image counts and size, and
    the official archives it is read from with their published MD5s, by part (``train``,
    ``val``, ``devkit``: file name, MD5)."""

    name: str
    classes_file: str  # a file of the package's data folder, one class id per line
    train_images: int
    val_images: int
    image_size: int
    archives: Mapping[str, tuple[str, str]] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def classes(self) -> tuple[str, ...]:
        return _class_list(self.classes_file)

    @property
    def num_classes(self) -> int:
        return len(self.classes)


@dataclass(frozen=True)
class Ruleset:
    id: str
    # Configuration settings (by dotted name) an official run keeps at these values: the
    # algorithms, the seed, the dataset and the whole search space.
    fixed: Mapping[str, Any]
    allowed_precisions: tuple[str, ...]
    min_duration_s: float
    max_error: float
    dataset: DatasetRules
    notes: tuple[str, ...] = field(default=())
    # How run time is charged (measure/score.py): "last_epoch", up to the run's last counted
    # epoch; "per_replica", each replica its own time, epochs in flight at the deadline
    # finishing inside the run's grace.
    charge: str = "last_epoch"
    # The grace of a per_replica ruleset, as a share of the run's duration: the rule itself,
    # so that a later configuration default never re-judges a stored result. An unofficial
    # run may set run.deadline_grace_s instead; a ruleset that fixes that setting refuses it
    # in an official one.
    grace_fraction: float = 0.25
    # Whether the regulated score may take its accuracy from an epoch that ended in the
    # grace, after the deadline, rather than only from epochs that ended by it.
    accuracy_in_grace: bool = True
    # A score above this multiple of the ceiling its nodes measured is named implausible
    # (None: not judged). Not 1: a ceiling measured while something else loaded the node
    # reads low, and the built-in task already runs at three quarters of it.
    max_fraction_of_ceiling: float | None = None
    # Whether the data must be proven by content: a manifest of the folder, verified against
    # the official archives, sampled before the clock (aiperf-2021.3 only).
    proven_data: bool = False
    # The bound above for a node that trains on accelerators (None: the same as a CPU's). A
    # GPU's ceiling is its vendor's GEMM, which a whole training step never approaches:
    # ResNet-50's compiled steps reached 0.23 of it on an H200 (bench/RESULTS.md), while a
    # CPU's training runs at up to three quarters of its convolution's rate.
    max_fraction_of_accelerator_ceiling: float | None = None
    # Whether a node without a measured ceiling makes the result not valid, rather than
    # leaving the bound above unjudged.
    ceiling_required: bool = False
    # A node's ceiling above this multiple of the data-sheet peak of its accelerators
    # (measure/system.py peak_for, by their names) is implausible (None: not judged).
    max_ceiling_of_peak: float | None = None
    # Durations a result may have: whole multiples of this (None: any at or above the
    # minimum), run to within ``max_short_s`` of their end, so that a duration class holds
    # only runs of that duration.
    duration_step_s: float | None = None
    max_short_s: float | None = None
    # Whether the data must be read from the official archives, their MD5s computed by every
    # session before its clock and equal to the dataset's published ones
    # (automlperf.dataset.proof); a folder is never official.
    archive_proof: bool = False

    def grace_s(self, duration_s: float, configured: float | None = None) -> float:
        """Seconds an epoch in flight at the deadline may take to finish and count."""
        if self.charge != "per_replica":
            return 0.0
        return duration_s * self.grace_fraction if configured is None else configured

    def fixed_changes(self, settings: Mapping[str, Any]) -> list[str]:
        """Each fixed setting whose value in ``settings`` (dotted name -> value, JSON-like)
        differs from the official one, described in words."""
        changes = []
        for name, official in self.fixed.items():
            if name not in settings:
                raise KeyError(f"ruleset {self.id} fixes {name!r}, which the configuration "
                               "does not have")
            value = settings[name]
            if _normal(value) != _normal(official):
                shown = _UNSET.get(name, "unset, the ruleset's own") if official is None \
                    else repr(official)
                changes.append(f"{name} = {value!r} (official: {shown})")
        return changes

    def precision_violations(self, precisions: list[str] | set[str]) -> list[str]:
        return sorted({p for p in precisions if p not in self.allowed_precisions})

    def duration_problem(self, duration_s: float) -> str | None:
        """Why a run of this duration cannot be valid, in words (None: it can)."""
        if duration_s < self.min_duration_s:
            return (f"a duration of {_hours(duration_s)} is below the minimum of "
                    f"{_hours(self.min_duration_s)}")
        step = self.duration_step_s
        if step and abs(duration_s / step - round(duration_s / step)) > 1e-9:
            unit = "hours" if step == 3600 else f"{step:g}-s steps"
            return (f"a duration of {duration_s:,.0f} s is not a whole number of {unit} "
                    f"(ruleset {self.id}: a duration class holds only runs of its length)")
        return None

    def newer_than(self, other: Ruleset) -> bool:
        order = list(RULESETS)
        return order.index(self.id) > order.index(other.id)


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:g} h" if seconds >= 3600 else f"{seconds / 60:g} min"


# What an official value of None stands for, where it is not the ruleset's own figure.
_UNSET = {"run.seed": "unset: the run draws its own"}


def _normal(value: Any) -> Any:
    """Tuples and lists compare equal (TOML has only lists)."""
    if isinstance(value, (list, tuple)):
        return [_normal(v) for v in value]
    return value


@cache
def _class_list(name: str) -> tuple[str, ...]:
    text = resources.files("automlperf").joinpath("data", name).read_text(encoding="ascii")
    return tuple(line.strip() for line in text.splitlines() if line.strip())


IMAGENET_1K = DatasetRules(
    name="imagenet", classes_file="imagenet_wnids.txt", train_images=1_281_167,
    val_images=50_000, image_size=224,
    # As torchvision's ImageNet metadata records them (torchvision/datasets/imagenet.py).
    archives=MappingProxyType({
        "train": ("ILSVRC2012_img_train.tar", "1d675b47d978889d74fa0da5fadfb00e"),
        "val": ("ILSVRC2012_img_val.tar", "29b22e2961454d5413ddabcf34fc5622"),
        "devkit": ("ILSVRC2012_devkit_t12.tar.gz", "fa75699e90414af021442c21a62c3abf"),
    }))

AIPERF_2021_1 = Ruleset(
    id="aiperf-2021.1",
    fixed=MappingProxyType({
        "data.dataset": "imagenet",
        "data.image_size": 224,
        "model.seed_model": "resnet50",
        "model.seed_width": 1,
        "search.nas": "network_morphism",
        # The two below name what this ruleset always required and no earlier automlperf
        # could change (the search and its weight inheritance): no result is judged anew.
        "search.strategy": "bayesian",
        "search.inherit_weights": True,
        "search.hpo": "tpe",
        "search.hpo_start_round": 3,
        "search.beta": 2.576,
        "search.kernel_sizes": [3, 5, 7],
        "search.batch_size_factors": [0.5, 2.0],
        "search.tpe_startup_trials": 4,
        "search.max_layers": 2000,
        "search.max_params": 500_000_000,
        "search.max_morphs_per_child": 3,
        "search.gp_max_models": 64,
        "search.sa_t_min": 0.05,
        "search.sa_cooling": 0.8,
        "search.neighbours": 8,
        "search.candidates_per_generation": 112,
        "search.generation_budget_s": 30.0,
        "train.warmup_round_fractions": [0.25, 0.5, 0.75],
    }),
    allowed_precisions=("bf16", "fp16", "tf32", "fp32"),
    min_duration_s=3600.0,
    max_error=0.30,
    dataset=IMAGENET_1K,
    notes=("AIPerf (Ren et al., 2021), Table 4: fixed algorithms, seed and search space; "
           "ImageNet-1k at 224x224; at least 1 hour; at least 16-bit floating point; "
           "error at most 30 %.",),
)

AIPERF_2021_2 = replace(
    AIPERF_2021_1, id="aiperf-2021.2", charge="per_replica",
    # Early stopping and the order of TPE and the search move trials per hour, and with them
    # the score: fixed, as measured and decided in docs/official.md's comparison with the paper.
    fixed=MappingProxyType({**AIPERF_2021_1.fixed,
                            "search.hpo_order": "with_nas",
                            "train.early_stop_metric": "val_loss",
                            "train.early_stop_min_delta": 0.001}),
    notes=AIPERF_2021_1.notes + (
        "Each replica is charged its own time: the epochs in flight at the deadline finish "
        "inside the run's grace (run.deadline_grace_s) and count, and each replica is "
        "charged to the deadline or to the end of its last counted epoch, whichever is "
        "later; the score is the sum of the replicas' operations over their charged time.",
        "Early stopping watches the validation loss with a minimum change of 0.001 (the "
        "paper's rule); TPE's hyperparameters are drawn with each architecture, which "
        "trains once (a documented deviation from the paper's order).",))

# What the paper lists among its fixed rules (section 4.5: "a maximum limit on epoch and
# patience") and everything else that moved the score of an official run: the grace, whose
# length a site chose (docs/official.md, "The rules that move the score").
AIPERF_2021_3 = replace(
    AIPERF_2021_2, id="aiperf-2021.3", accuracy_in_grace=False, max_fraction_of_ceiling=1.5,
    proven_data=True,
    fixed=MappingProxyType({**AIPERF_2021_2.fixed,
                            # None: the ruleset's own grace, a quarter of the duration.
                            "run.deadline_grace_s": None,
                            "train.max_epochs": 60,
                            "train.patience_base": 6,
                            "train.patience_per_round": 2,
                            "train.patience_max": 20}),
    notes=AIPERF_2021_2.notes + (
        "The grace is a quarter of the duration, fixed; the best accuracy (and so the "
        "regulated score) comes only from epochs that ended by the deadline; the maximum "
        "epochs (60) and the patience (min(6 + 2 x round, 20)) are fixed, as the paper's "
        "section 4.5 lists them. A score above 1.5 times the ceiling its nodes measured is "
        "implausible, and not valid. The data is proven by content: its folder verified "
        "once against the official archives (automlperf verify-data), and a sample of its "
        "files checked against that manifest before the clock.",))

# What still moved the score of an official run or escaped its judgement under 2021.3
# (docs/official.md, "The rules that move the score"): a seed the submitter chose (the best of
# several could be kept), a duration between whole hours ranked with the hour below it, a run
# that ended early, a node without a ceiling that switched the bound off, a ceiling above its
# accelerators' data sheet, and a bound too loose for GPUs; and a proof of the data that could
# be written by hand: from here the data is read from the official archives, whose MD5s every
# session computes before its clock (docs/official.md, "An official run").
AIPERF_2021_4 = replace(
    AIPERF_2021_3, id="aiperf-2021.4", ceiling_required=True,
    max_fraction_of_accelerator_ceiling=0.5, max_ceiling_of_peak=1.1,
    duration_step_s=3600.0, max_short_s=60.0, proven_data=False, archive_proof=True,
    # None: the run draws its own seed when it starts, and records it.
    fixed=MappingProxyType({**AIPERF_2021_3.fixed, "run.seed": None}),
    notes=AIPERF_2021_3.notes[:-1] + (
        AIPERF_2021_3.notes[-1].split(" The data is proven by content")[0] + " The data is "
        "ImageNet-1k read from its official archives (ILSVRC2012_img_train.tar, "
        "ILSVRC2012_img_val.tar, ILSVRC2012_devkit_t12.tar.gz), never extracted: every "
        "session computes their MD5s before its clock and compares them with the published "
        "ones, and every process that opens an archive holds it to the identity the session "
        "proved. A folder, proven or not, is never official.",
        "An official run draws its own seed at its start (run.seed stays unset) and records "
        "it. The duration is a whole number of hours, and a run ends no more than 60 s "
        "before it. Every node measures its ceiling, or the result is not valid; a score "
        "above 1.5 times the ceiling of CPU nodes and 0.5 times that of accelerator nodes "
        "is implausible, and so is a ceiling above 1.1 times its accelerators' data-sheet "
        "peak. Early stopping watches the validation's cross-entropy without label "
        "smoothing, so that the loss a site chooses does not move it.",))

RULESETS: Mapping[str, Ruleset] = MappingProxyType({r.id: r for r in (AIPERF_2021_1,
                                                                     AIPERF_2021_2,
                                                                     AIPERF_2021_3,
                                                                     AIPERF_2021_4)})
CURRENT = AIPERF_2021_4
# result.json files written before results named their ruleset were judged by these rules.
LEGACY_ID = AIPERF_2021_1.id


def get(ruleset_id: str | None) -> Ruleset:
    """The ruleset with this id; None means a result from before rulesets were recorded."""
    if ruleset_id is None:
        return RULESETS[LEGACY_ID]
    try:
        return RULESETS[ruleset_id]
    except KeyError:
        raise UnknownRuleset(f"unknown ruleset {ruleset_id!r}: this automlperf knows "
                             f"{', '.join(sorted(RULESETS))}; use the automlperf version that "
                             "wrote the result") from None
