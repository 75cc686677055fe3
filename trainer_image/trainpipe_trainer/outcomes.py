"""How a trainer ends: the result it writes, and the messages and exit code of a preemption or a pruned trial.

Part of the trainer contract (standard library only: the provider imports it without torch). A message
is the contract too: torchrun exits 1 whatever exit code its workers had, so a launcher recognises
the outcome by the message.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field

# SIGTERM is a preemption notice: every rank finishes its step, a checkpoint of that step is
# committed, and each rank exits with this code (EX_TEMPFAIL: "try again"; not 143, which is what
# any process killed by SIGTERM reports). The local launcher relaunches on it, and a Job's
# podFailurePolicy ignores it, so a preemption is never counted as a failure.
PREEMPTED_EXIT_CODE = 75
# A rank whose step ran out of accelerator memory (torch.cuda.OutOfMemoryError) exits with this code, and
# so does the elastic launcher for it: the provider reads it as its own outcome ("CUDAOutOfMemory"), so a
# retry can train with a smaller batch_size and more accumulation steps (training.kubernetes.on_oom).
CUDA_OOM_EXIT_CODE = 76
_PREEMPTED = re.compile(r"^received (?P<signal>SIG[A-Z]+): committed checkpoint step-(?P<step>\d+);")


def preempted_message(signal_name: str, step: int) -> str:
    """What a preempted trainer says (every rank prints it); the launcher recognises it (``preempted_step``):
    torchrun exits 1 whatever exit code its workers had."""
    return f"received {signal_name}: committed checkpoint step-{step}; exiting so that the next attempt resumes there"


def preempted_step(reason: str) -> int | None:
    """The step a preempted trainer committed, from its message; None for any other reason."""
    match = _PREEMPTED.match(reason)
    return int(match["step"]) if match else None


def trial_pruned_message(trial_number: int, *, step: int, total_steps: int, metric: str, value: float) -> str:
    """What a pruned trial's trainer says when it stops; the provider's trial task recognises it
    (``is_trial_pruned``): torchrun exits 1 whatever exit code its workers had."""
    return f"trial {trial_number} pruned at step {step} of {total_steps} ({metric} {value:.6g})"


def is_trial_pruned(trial_number: int, reason: str) -> bool:
    return reason.startswith(f"trial {trial_number} pruned at step ")


# The MLflow run tag (JSON) with TrainingResult.world_size_history; `trainpipe reproduce` replays it.
WORLD_SIZE_HISTORY_TAG = "trainpipe.world_size_history"
# The model family a run trained (trainpipe_trainer.models.family_provenance): its name, the distribution that
# registers it, that distribution's version and the sha256 of its wheel (else of its installed files' record).
# The trainer writes them where it trains (on Kubernetes, the image's family); the local launcher's train step
# writes the same before launch. Register copies them onto the version; reproduce compares them.
MODEL_FAMILY_TAG = "trainpipe.model_family"
MODEL_FAMILY_DISTRIBUTION_TAG = "trainpipe.model_family_distribution"
MODEL_FAMILY_VERSION_TAG = "trainpipe.model_family_version"
MODEL_FAMILY_SHA256_TAG = "trainpipe.model_family_sha256"


# What a family's weights started from (the transformer's pretrained folder: its URI, and the sha256 over its files,
# ``models.transformer.pretrained.files_sha256``); a LoRA run's base model.
PRETRAINED_URI_TAG = "trainpipe.pretrained_uri"
PRETRAINED_SHA256_TAG = "trainpipe.pretrained_sha256"


def model_family_tags(provenance: dict[str, str | None]) -> dict[str, str]:
    """The run tags of a family's provenance; a value the installation does not give is left out, never made up."""
    tags = {MODEL_FAMILY_TAG: provenance.get("family"), MODEL_FAMILY_DISTRIBUTION_TAG: provenance.get("distribution"),
            MODEL_FAMILY_VERSION_TAG: provenance.get("version"), MODEL_FAMILY_SHA256_TAG: provenance.get("sha256")}
    return {key: str(value) for key, value in tags.items() if value}


@dataclass(kw_only=True, slots=True, frozen=True)
class TrainingResult:
    """What the trainer's rank 0 writes to ``<output_uri>/result.json`` when training succeeds."""

    mlflow_run_id: str
    # URI that loads the logged model with mlflow.pyfunc.load_model (e.g. ``models:/m-...``); None for
    # a tuning trial, whose model is not logged (the final training retrains and logs the winner's).
    model_uri: str | None
    weights_sha256: str
    world_size: int
    global_step: int
    final_loss: float
    resumed_from_step: int | None = None
    # [first step, world size] per change of world size (one entry when it never changed).
    world_size_history: list[list[int]] = field(default_factory=list)
    # The step loop's rate in this attempt (all ranks' samples per second, first step excluded);
    # None when the attempt trained fewer than two steps.
    samples_per_second: float | None = None

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TrainingResult:
        return cls(**json.loads(text))
