"""MLflow tracking on rank 0; every other rank gets a no-op tracker.

mlflow is imported only here and only on rank 0, which keeps the other ranks' start-up fast and
lets the pod use mlflow-skinny.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from trainpipe_trainer.config import TrackingConfig, TrainingConfig

# Not logged as params: credentials may hide in URIs/options, tags are logged as tags, and the
# run id is the run itself.
_NOT_PARAMS = ("storage_options", "tags", "tracking.run_id", "tracking.tracking_uri")


def import_mlflow() -> Any:
    # Progress bars would fill the Airflow task log with carriage-return noise.
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    try:
        import mlflow
    except ImportError as err:
        raise ImportError("mlflow is not installed: pip install 'trainpipe-trainer[tracking]'") from err
    return mlflow


def flatten_params(config: TrainingConfig, *, world_size: int) -> dict[str, str]:
    """The config as dotted ``key -> str`` params, plus what only the running trainer knows."""
    flat: dict[str, str] = {}

    def visit(prefix: str, value: Any) -> None:
        if prefix in _NOT_PARAMS:
            return
        if isinstance(value, dict):
            for key, inner in value.items():
                visit(f"{prefix}.{key}" if prefix else key, inner)
        elif isinstance(value, (list, tuple)):
            flat[prefix] = json.dumps(list(value))
        else:
            flat[prefix] = str(value)

    visit("", dataclasses.asdict(config))
    # MLflow caps a param value at 6000 characters; the count is what dashboards compare anyway.
    flat["features"] = flat["features"][:6000]
    flat["features_count"] = str(len(config.features))
    flat["world_size"] = str(world_size)
    return flat


@dataclass(kw_only=True, slots=True)
class Tracker:
    config: TrackingConfig
    enabled: bool
    run_id: str | None = field(init=False, default=None)
    _mlflow: Any = field(init=False, default=None)

    def __enter__(self) -> Tracker:
        if not self.enabled:
            return self
        mlflow = self._mlflow = import_mlflow()
        if self.config.tracking_uri:
            mlflow.set_tracking_uri(self.config.tracking_uri)
        # Else mlflow itself falls back to MLFLOW_TRACKING_URI.
        if self.config.run_id:
            run = mlflow.start_run(run_id=self.config.run_id)
        else:
            mlflow.set_experiment(self.config.experiment_name)
            run = mlflow.start_run()
        self.run_id = run.info.run_id
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.enabled and self.run_id is not None:
            self._mlflow.end_run(status="FAILED" if exc_type is not None else "FINISHED")

    def log_params(self, params: dict[str, str]) -> None:
        if not self.enabled:
            return
        # A retry logs into the same run: MLflow refuses to change a param, so log only new ones
        # and report (not fail on) any that differ from the earlier attempt.
        existing = self._mlflow.get_run(self.run_id).data.params
        changed = sorted(k for k, v in params.items() if k in existing and existing[k] != v)
        if changed:
            print(f"warning: params differ from an earlier attempt, kept the old values: {changed}", file=sys.stderr)
        new = {k: v for k, v in params.items() if k not in existing}
        if new:
            self._mlflow.log_params(new)

    def set_tags(self, tags: dict[str, str]) -> None:
        if self.enabled and tags:
            self._mlflow.set_tags(tags)

    def log_metric(self, name: str, value: float, *, step: int) -> None:
        if self.enabled:
            self._mlflow.log_metric(name, value, step=step)
