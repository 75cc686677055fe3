"""The resume identity: what a checkpoint records of its training, and why another training may not resume it.

Part of the trainer contract (standard library only: the provider checks a run folder before it
launches, the trainer again when it loads a checkpoint).
"""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass
from typing import Any

from trainpipe_trainer.config import TrainingConfig

# A checkpoint records the dataset snapshot and the values of the settings below, which change what
# a training computes (its weights); a run whose snapshot or values differ refuses to resume it,
# because that would silently mix two trainings (trainpipe_trainer.checkpoint.manager). Every other field
# says where things go or how often they are saved or logged, so a retry may change it and still
# resume. Each field of TrainingConfig is in exactly one of the two lists (a test checks it).
RESUME_FINGERPRINT_FIELDS: tuple[str, ...] = (
    "task", "features", "transforms", "label", "label_classes", "group_column", "model",
    # epochs too: a linear or cosine schedule is shaped by the total step count, and the run's
    # recorded params must describe its model. Training longer is a new run (a new folder).
    "epochs", "batch_size", "learning_rate", "seed", "strategy", "optimization", "deepspeed",
    # What the network is trained on (raw or standardised labels) and when training stops.
    "scale_target", "early_stopping",
    # Which rows are held out for validation (none without keep_best), so which rows are trained on.
    "checkpoint.validation_fraction", "checkpoint.keep_best",
)
NOT_FINGERPRINTED_FIELDS: tuple[str, ...] = (
    "config_version", "pipeline_id",
    # The snapshot is compared by its content digest: paths may differ between attempts.
    "train_data_uri", "dataset_digest",
    "checkpoint.root_uri", "checkpoint.every_n_steps", "checkpoint.every_seconds", "checkpoint.keep_last",
    "checkpoint.async_save", "tracking", "output_uri", "storage_options", "tags",
    # Test-only; an Airflow retry runs without the crash injected into its first try.
    "fault_injection",
    # Where a trial reports; reporting and pruning stop a training early, never change its weights.
    "tuning",
    # Where this launch stops; the next one resumes there.
    "stop_after_step",
    # Where the rows are kept, never which rows or in what order: the batches are the same. (The streamed
    # path's other order is told apart by the trainer's DATA_ORDER key, decided at launch.)
    "data_placement",
    # A manifest or a copy of the same data: the snapshot's digest tells versions apart.
    "train_data_format",
)
# Strategies whose checkpoints resume at another world size (DCP reshards a replicated DDP model
# and optimizer at load time); a change of world size is then no reason to refuse a resume.
RESHARDABLE_STRATEGIES: tuple[str, ...] = ("ddp",)
# The order the trainer's data path gives the rows, recorded by the trainer only: it decides at launch
# (data_placement: auto streams a manifest that would not fit the host), so the provider's identity, made
# from the config alone, lacks it and does not compare it. A checkpoint without it was trained in memory.
DATA_ORDER = "data_order"
IN_MEMORY_ORDER, STREAMED_ORDER = "in_memory", "streamed"
# Differences whose values are longer than this are named without their values.
_SHORT_VALUE = 40


# Resolving a class's hints evaluates its annotations: once per process (a trial worker asks every trial).
_SECTION_TYPES: dict[tuple[type, str], type | None] = {}


def _section_type(owner: type, name: str) -> type | None:
    """The config class of a section field (``model``, ``deepspeed``...), None for a plain value."""
    if (owner, name) not in _SECTION_TYPES:
        hint = typing.get_type_hints(owner)[name]
        candidates = () if typing.get_origin(hint) is tuple else (hint, *typing.get_args(hint))
        _SECTION_TYPES[owner, name] = next(
            (t for t in candidates if isinstance(t, type) and dataclasses.is_dataclass(t)), None)
    return _SECTION_TYPES[owner, name]


def _flatten_into(out: dict[str, Any], path: str, value: Any, section: type | None) -> None:
    # One key per setting, so a difference names the setting; an absent section (deepspeed under
    # ddp) lists its settings as null, so switching it on names each of them too.
    if section is None:
        # A tuple of sections (transforms) is recorded as plain dicts.
        out[path] = [dataclasses.asdict(v) for v in value] if isinstance(value, tuple) and value \
            and dataclasses.is_dataclass(value[0]) else value
        return
    for inner in dataclasses.fields(section):
        out[f"{path}.{inner.name}"] = None if value is None else getattr(value, inner.name)


@dataclass(kw_only=True, slots=True, frozen=True)
class ResumeIdentity:
    """The snapshot and result-changing settings (plus world size) a checkpoint was written with."""

    snapshot: str
    settings: dict[str, Any]

    def to_manifest(self) -> dict[str, Any]:
        return {"snapshot": self.snapshot, "settings": self.settings}

    @classmethod
    def from_manifest(cls, manifest: dict[str, Any]) -> ResumeIdentity | None:
        """None for a checkpoint written before checkpoints recorded it."""
        if not isinstance(manifest.get("settings"), dict) or not isinstance(manifest.get("snapshot"), str):
            return None
        return cls(snapshot=manifest["snapshot"], settings=manifest["settings"])

    def differences(self, current: ResumeIdentity) -> list[str]:
        """What changed from this (recorded) identity to ``current``, one readable item per field."""
        changes = []
        if self.snapshot != current.snapshot:
            changes.append(f"dataset snapshot {_short_digest(self.snapshot)} -> {_short_digest(current.snapshot)}")
        missing = object()
        strategy = current.settings.get("strategy")
        for key in sorted(self.settings.keys() | current.settings.keys()):
            old, new = self.settings.get(key, missing), current.settings.get(key, missing)
            if key == DATA_ORDER:
                if new is missing:
                    continue
                old = IN_MEMORY_ORDER if old is missing else old
            if old == new or (key == "world_size" and strategy in RESHARDABLE_STRATEGIES):
                continue
            if key in _EFFECTIVE_BATCH_KEYS and _effective_batch(self.settings) is not None \
                    and _effective_batch(self.settings) == _effective_batch(current.settings):
                # A batch split into more accumulation steps (on_oom.reduce_batch after a CUDA OOM): the same
                # samples per optimizer step, in the same order, so the same training.
                continue
            if key == "world_size":
                changes.append(f"world_size {old} -> {new} (strategy {strategy} cannot reshard: DeepSpeed ZeRO "
                               f"partitions the optimizer state per rank; resume with {old} processes, or use ddp, "
                               "which resumes at any size)")
            elif key == DATA_ORDER:
                placement = "stream" if old == STREAMED_ORDER else "host"
                changes.append(f"data order {old} -> {new} (the streamed path orders the rows by row group; "
                               f"data_placement: {placement} resumes it as it was trained)")
            else:
                changes.append(_describe_change(key, old, new, missing))
        return changes


_EFFECTIVE_BATCH_KEYS = ("batch_size", "optimization.gradient_accumulation_steps")


def _effective_batch(settings: dict[str, Any]) -> int | None:
    """Samples per rank and optimizer step, from a resume identity's settings (None when either is missing)."""
    batch, accumulation = (settings.get(key) for key in _EFFECTIVE_BATCH_KEYS)
    return batch * accumulation if isinstance(batch, int) and isinstance(accumulation, int) else None


def resume_identity(config: TrainingConfig, *, world_size: int) -> ResumeIdentity:
    """What a checkpoint of this training records, and a resumed run must match."""
    settings: dict[str, Any] = {}
    for path in RESUME_FINGERPRINT_FIELDS:
        owner: Any = config
        *sections, name = path.split(".")
        for section in sections:
            owner = getattr(owner, section)
        _flatten_into(settings, path, getattr(owner, name), _section_type(type(owner), name))
    settings["world_size"] = world_size
    # As a manifest stores them (tuples become lists), so a recorded copy compares equal.
    return ResumeIdentity(snapshot=config.dataset_digest or config.train_data_uri,
                          settings=json.loads(json.dumps(settings)))


def resume_refusal(where: str, changes: list[str]) -> str:
    """The one message for a refused resume, whoever notices first (the provider or the trainer)."""
    return (
        f"{where}: cannot resume this checkpoint: it was written by another training "
        f"(checkpoint -> this run: {'; '.join(changes)}), and resuming it would mix two trainings. "
        "To train with this run's data and settings, start fresh in a new run folder (trainpipe train: "
        "another --run-dir; Airflow: a new DAG run; trainer alone: another checkpoint.root_uri) or move "
        "that folder's checkpoints away yourself (nothing is deleted automatically); to continue the old "
        "training instead, rerun with the data and settings it was written with"
    )


def _short_digest(snapshot: str) -> str:
    hexadecimal = len(snapshot) == 64 and all(c in "0123456789abcdef" for c in snapshot)
    return snapshot[:16] if hexadecimal else snapshot


def _describe_change(key: str, old: Any, new: Any, missing: object) -> str:
    if old is missing:
        return f"{key} (not recorded by the trainer that wrote it)"
    if new is missing:
        return f"{key} (recorded, unknown to this trainer)"
    if isinstance(old, list) and isinstance(new, list) and key == "features":
        added, removed = [c for c in new if c not in old], [c for c in old if c not in new]
        if not added and not removed:
            return f"{key} (same columns, other order)"
        parts = ([f"added {added}"] if added else []) + ([f"removed {removed}"] if removed else [])
        return f"{key} ({', '.join(parts)})"
    if isinstance(old, list) and isinstance(new, list) and key == "transforms":
        before = {t["feature"]: t for t in old if isinstance(t, dict)}
        after = {t["feature"]: t for t in new if isinstance(t, dict)}
        changed = sorted(f for f in before.keys() | after.keys() if before.get(f) != after.get(f))
        return f"{key} (of {changed})"
    old_text, new_text = json.dumps(old), json.dumps(new)
    if len(old_text) + len(new_text) > 2 * _SHORT_VALUE:
        return f"{key} (changed)"
    return f"{key} {old_text} -> {new_text}"
