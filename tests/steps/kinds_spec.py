"""The multiclass "kinds" spec of the step tests, compiled from a dict as a file would be, and a run folder."""

from __future__ import annotations

from pathlib import Path

import yaml

from trainpipe.compile.compiler import compile_file
from trainpipe.settings import Settings


def compiled_plan(tmp_path: Path, spec: dict):
    file = tmp_path / "kinds.yaml"
    file.write_text(yaml.safe_dump(spec, sort_keys=False))
    return compile_file(file, "kinds.yaml", settings=Settings.from_env(), configs_root=tmp_path)


def run_folder(tmp_path: Path):
    from airflow.sdk import ObjectStoragePath

    return ObjectStoragePath((tmp_path / "run").as_uri())
