"""In-memory stand-ins for the evaluate step's MLflow hook: served models that answer fixed outputs (and record what
they were asked), and a client that keeps what is logged. No store, no model files."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd


class ServedModel:
    """A pyfunc model answering ``output`` to every request; ``calls`` holds (columns, params) of each."""

    def __init__(self, output: Any) -> None:
        self.output = output
        self.calls: list[tuple[list[str], dict[str, Any] | None]] = []
        self.metadata = SimpleNamespace(get_input_schema=lambda: None)

    def predict(self, frame: pd.DataFrame, params: dict[str, Any] | None = None) -> Any:
        self.calls.append((list(frame.columns), params))
        return self.output


class LoggedRun:
    """What the evaluate step logs into its MLflow run: metrics, tags and artifacts' bytes."""

    def __init__(self) -> None:
        self.metrics: dict[str, float] = {}
        self.tags: dict[str, str] = {}
        self.artifacts: dict[str, bytes] = {}

    def log_batch(self, run_id: str, metrics: list[Any], tags: list[Any]) -> None:
        self.metrics |= {m.key: m.value for m in metrics}
        self.tags |= {t.key: t.value for t in tags}

    def log_artifacts(self, run_id: str, folder: str, artifact_path: str) -> None:
        self.artifacts |= {f"{artifact_path}/{p.name}": p.read_bytes() for p in Path(folder).iterdir()}

    def get_run(self, run_id: str) -> Any:
        return SimpleNamespace(info=SimpleNamespace(experiment_id="1"))


class Hook:
    """The MlflowHook the step is given: ``models`` by URI; the champion (``champion_uri``) is version
    ``champion_version`` when it is among them."""

    def __init__(self, models: dict[str, Any], *, champion_uri: str, champion_version: str) -> None:
        self.models = {uri: ServedModel(output) for uri, output in models.items()}
        self.client = LoggedRun()
        self.champion_uri, self.champion_version = champion_uri, champion_version

    def load_pyfunc(self, uri: str) -> ServedModel:
        return self.models[uri]

    def version_by_alias(self, name: str, alias: str) -> Any:
        return SimpleNamespace(version=self.champion_version) if self.champion_uri in self.models else None
