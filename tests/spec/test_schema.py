"""The published JSON Schema: in sync with the models, documented, and accepting the example specs."""

from __future__ import annotations

import json

import jsonschema
import yaml

from tests.support import REPO
from trainpipe.commands.main import main
from trainpipe.spec.schema import SCHEMA_PATH, spec_json_schema

EXAMPLES = sorted((REPO / "dag_configs").glob("*.yaml"))


def test_committed_schema_equals_trainpipe_schema(capsys):
    assert main(["schema"]) == 0
    printed = capsys.readouterr().out
    assert printed == SCHEMA_PATH.read_text(), (
        "provider/trainpipe/spec/schema.json is stale: run `trainpipe schema > provider/trainpipe/spec/schema.json`"
    )


def test_schema_is_draft_2020_12_and_valid():
    schema = spec_json_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)


def test_every_field_has_a_description_and_an_example():
    schema = spec_json_schema()
    models = {"PipelineSpec": schema, **schema["$defs"]}
    missing = [
        f"{model}.{name}: {'description' if 'description' not in prop else 'examples'}"
        for model, definition in models.items()
        for name, prop in definition.get("properties", {}).items()
        if "description" not in prop or "examples" not in prop
    ]
    assert missing == []


def test_example_specs_validate_against_the_schema_and_point_editors_at_it():
    validator = jsonschema.Draft202012Validator(spec_json_schema())
    assert EXAMPLES
    for example in EXAMPLES:
        text = example.read_text()
        assert text.splitlines()[0] == "# yaml-language-server: $schema=../provider/trainpipe/spec/schema.json"
        assert [e.message for e in validator.iter_errors(yaml.safe_load(text))] == [], example


def test_schema_rejects_an_unknown_key():
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text()))
    spec = yaml.safe_load(EXAMPLES[0].read_text())
    spec["schedul"] = "@daily"
    assert any("'schedul' was unexpected" in e.message for e in validator.iter_errors(spec))
