"""Which ruleset a result is judged by: the one its run recorded in its store when it was
created, held to what its records contain, so that no edit of the key switches a check off.

A run's store names its ruleset from the version that also recorded its provenance, its
data's identity and its nodes' descriptions (each written beside the ruleset, when the run is
created or starts a session). A record that names none is judged as the oldest ruleset only
where it provably predates those versions: no such record in the store, and a result.json
holding only the fields those versions wrote. Otherwise the key was deleted, and ``check``
names it. Likewise a record that names an older ruleset than what it holds was written under
(the seed a run of ``aiperf-2021.4`` draws and its proof of the official archives, the
data's proof of ``aiperf-2021.3``).
"""

from __future__ import annotations

from typing import Any

from automlperf import rules

# The fields of result.json as the versions before stores recorded a ruleset wrote them
# (tests/data/run_v1 is one); a result with any other field was written later.
BEFORE_STORED_RULESET = frozenset({
    "schema_version", "generated_at", "automlperf_version", "run_id", "name", "dataset",
    "ruleset", "score", "regulated_score", "best_accuracy", "error", "official", "valid",
    "violations", "total_ops", "elapsed_s", "epochs", "epochs_not_counted", "train_images",
    "val_images", "best_trial", "precisions", "timeline", "interrupted", "failures", "trials",
    "trial_status", "best_trial_detail", "replicas", "devices", "nodes",
    "ops_per_s_per_device", "peak_ops", "fraction_of_peak", "segments", "started_at",
    "duration_s", "system"})
# What a run's store records beside its ruleset when it is created.
WITH_THE_RULESET = {"provenance": "its provenance", "dataset_identity": "its data's identity"}


def _written_from(stored: dict[str, Any]) -> list[tuple[str, str]]:
    """(what, the first ruleset whose runs record it) for each record in the store's run
    record that only runs of a later ruleset write."""
    found = []
    if "seed" in stored:
        found.append(("the seed the run used", "aiperf-2021.4"))
    proof = (stored.get("dataset_identity") or {}).get("proof")
    if isinstance(proof, dict) and "archives" in proof:
        found.append(("the official archives' proof", "aiperf-2021.4"))
    elif proof is not None:
        found.append(("the data's proof by content", "aiperf-2021.3"))
    return found


def ruleset_problems(stored: dict[str, Any], recorded: dict[str, Any],
                     nodes: list[dict[str, Any]]) -> list[str]:
    """Why the ruleset the store names (``stored``, its run record's system) cannot be the
    one the run was created under, given what its records hold (``recorded``, result.json;
    ``nodes``, its node descriptions); empty when it can."""
    named = stored.get("ruleset")
    if named is None:
        later = [what for key, what in WITH_THE_RULESET.items() if key in stored]
        if nodes:
            later.append(f"{len(nodes)} node description(s)")
        later += [what for what, _ in _written_from(stored)]
        extra = sorted(set(recorded) - BEFORE_STORED_RULESET)
        if extra:
            later.append(f"a result.json with {', '.join(extra[:4])}"
                         + (f" and {len(extra) - 4} more" if len(extra) > 4 else ""))
        if not later:
            return []
        return [f"the run's record (the store; records/run.json in a bundle) names no "
                f"ruleset, but it holds {'; '.join(later)}, which only versions that record "
                "the ruleset beside them write: its 'ruleset' key was deleted (restore it: a "
                "result is judged by the ruleset its run was created under)"]
    try:
        ruleset = rules.get(named)
    except rules.UnknownRuleset:
        return []  # named as such by the result's own check
    return [f"the run's record names ruleset {named!r}, but it holds {what}, which only runs "
            f"of {first} or later record: its ruleset was changed"
            for what, first in _written_from(stored)
            if rules.get(first).newer_than(ruleset)]
