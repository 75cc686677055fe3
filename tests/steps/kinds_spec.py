"""The multiclass "kinds" spec of the step tests, compiled from a dict as a file would be, and a run folder."""

from __future__ import annotations

from pathlib import Path

import yaml

from trainpipe.compile.compiler import compile_file
from trainpipe.settings import Settings


def kinds_spec(data: dict, **training: object) -> dict:
    """The multiclass spec reading ``data``, with ``training`` fields over its own."""
    return {
        "pipeline_id": "kinds",
        "data": data,
        "training": {"task": "multiclass_classification", "features": ["x1", "x2"], "label": "kind", **training},
        "evaluation": {"metrics": ["accuracy", "macro_f1"], "gates": ["macro_f1 >= 0.1"]},
        "registration": {"model_name": "kinds"},
    }


def compiled_plan(tmp_path: Path, spec: dict):
    file = tmp_path / "kinds.yaml"
    file.write_text(yaml.safe_dump(spec, sort_keys=False))
    return compile_file(file, "kinds.yaml", settings=Settings.from_env(), configs_root=tmp_path)


def run_folder(tmp_path: Path):
    from airflow.sdk import ObjectStoragePath

    return ObjectStoragePath((tmp_path / "run").as_uri())
