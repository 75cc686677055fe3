"""The published JSON Schema of a spec (draft 2020-12), generated from the pydantic models.

A committed copy lives next to this module (``schema.json``); a test keeps it equal to this output,
and every example spec points editors at it with a ``# yaml-language-server: $schema=...`` line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainpipe.spec.sections.pipeline import PipelineSpec

SCHEMA_PATH = Path(__file__).with_name("schema.json")
SCHEMA_ID = "https://trainpipe.dev/schema/pipeline-spec.json"


def spec_json_schema() -> dict[str, Any]:
    schema = PipelineSpec.model_json_schema(mode="validation")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "trainpipe pipeline spec",
        "description": "One YAML file in dag_configs/ = one Airflow DAG: snapshot, validate, train, evaluate, gate, register.",
        **{k: v for k, v in schema.items() if k not in {"title", "description"}},
    }


def spec_json_schema_text() -> str:
    return json.dumps(spec_json_schema(), indent=2, sort_keys=True) + "\n"
