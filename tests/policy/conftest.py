"""A specs root with team folders, the test policy, and a compliant spec to break one rule at a time."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import REPO

POLICY = REPO / "tests" / "fixtures" / "policy" / "policy.yaml"


def compliant_spec(pipeline_id: str = "risk_fraud", model_name: str | None = None) -> dict[str, Any]:
    """The multi-node example, within every rule of the risk team."""
    spec = yaml.safe_load((REPO / "dag_configs" / "fraud_detector_multinode.yaml").read_text())
    spec["pipeline_id"] = pipeline_id
    spec["registration"]["model_name"] = model_name or pipeline_id
    spec["schedule"] = "@daily"
    return spec


@pytest.fixture
def configs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "dag_configs"
    (root / "risk").mkdir(parents=True)
    (root / "search").mkdir()
    monkeypatch.setenv("TRAINPIPE_DAG_CONFIGS", str(root))
    monkeypatch.setenv("TRAINPIPE_STORAGE_ROOT", f"file://{tmp_path / 'storage'}")
    monkeypatch.delenv("TRAINPIPE_POLICY", raising=False)
    monkeypatch.delenv("TRAINPIPE_ALLOW_FAULT_INJECTION", raising=False)
    return root


@pytest.fixture
def write_spec(configs: Path) -> Callable[..., Path]:
    def write(spec: dict[str, Any], name: str = "risk/spec.yaml") -> Path:
        path = configs / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        return path

    return write
