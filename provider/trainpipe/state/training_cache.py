"""Unchanged inputs train nothing: a run's training key, and the registered version that already carries it.

The key is the sha256 of what decides the weights: the snapshot digest, the resume identity's settings (the
result-changing fields of the trainer config, the world size), the trainer's version (and image, on
Kubernetes) and the run's parameter overrides. ``register`` writes it on every version (``TRAINING_KEY_TAG``);
``train`` looks it up first. Airflow-free: the operator passes the run's plan and an MLflow client.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from trainpipe.errors import SpecError, shown_value
from trainpipe.plan.tracking import TRAINING_KEY_TAG

if TYPE_CHECKING:
    from mlflow import MlflowClient

    from trainpipe.plan.model import PipelinePlan
    from trainpipe.state.datasets import SnapshotInfo

log = logging.getLogger(__name__)

__all__ = ["CachedVersion", "cached_version", "forced", "training_key"]

# The key a manual trigger's conf sets to train whatever the cache holds.
FORCE_CONF_KEY = "force"


@dataclass(frozen=True, slots=True, kw_only=True)
class CachedVersion:
    """The registered version trained on the same inputs."""

    model_name: str
    version: int
    # When it was registered (UTC ISO, seconds).
    trained_at: str


def training_key(plan: PipelinePlan, snapshot: SnapshotInfo, *, param_overrides: dict[str, Any],
                 pretrained: str | None = None) -> str:
    """sha256 of the snapshot, the resume identity, the trainer's version or image, the overrides and, for a
    family that starts from pretrained weights, their fingerprint (``steps.train.pretrained_fingerprint``)."""
    import trainpipe_trainer
    from trainpipe_trainer.resume import resume_identity

    config = dataclasses.replace(plan.trainer, dataset_digest=snapshot.digest, train_data_uri=snapshot.train_uri)
    identity = resume_identity(config, world_size=plan.launch.world_size)
    trainer = {"version": trainpipe_trainer.__version__,
               "image": plan.kubernetes.image if plan.kubernetes is not None else None}
    record = {"snapshot": snapshot.digest, "identity": identity.settings, "trainer": trainer,
              "overrides": param_overrides}
    if pretrained is not None:  # absent otherwise: the versions already registered keep their keys
        record["pretrained"] = pretrained
    return hashlib.sha256(json.dumps(record, sort_keys=True, default=str).encode()).hexdigest()


def cached_version(client: MlflowClient, model_name: str, key: str, *, max_age: Any,
                   now: datetime | None = None) -> CachedVersion | None:
    """The newest version of ``model_name`` tagged with ``key`` and registered within ``max_age``; None when
    there is none (or no model yet)."""
    from mlflow.exceptions import MlflowException

    try:
        found = client.search_model_versions(f"name = '{model_name}' and tags.`{TRAINING_KEY_TAG}` = '{key}'")
    except MlflowException:
        return None
    now = now or datetime.now(UTC)
    fresh = [v for v in found
             if now - datetime.fromtimestamp(v.creation_timestamp / 1000, UTC) <= max_age]
    if not fresh:
        if found:
            log.info("%s has versions with this training key, all older than %s: training again", model_name, max_age)
        return None
    newest = max(fresh, key=lambda v: int(v.version))
    trained_at = datetime.fromtimestamp(newest.creation_timestamp / 1000, UTC).isoformat(timespec="seconds")
    return CachedVersion(model_name=model_name, version=int(newest.version), trained_at=trained_at)


def forced(conf: dict[str, Any] | None) -> bool:
    """Whether the run's conf says ``force: true``; anything but true or false is refused, not guessed."""
    value = (conf or {}).get(FORCE_CONF_KEY)
    if value is None or isinstance(value, bool):
        return bool(value)
    raise SpecError(f"run conf: {FORCE_CONF_KEY}: must be true or false, got {shown_value(value)}; trigger the run with "
                    f'{{"{FORCE_CONF_KEY}": true}} to train although the inputs are unchanged')
