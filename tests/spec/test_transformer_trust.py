"""The transformer family's new fields at the trust boundary: ``training.model.pretrained``, the transformer's
``model.params``, a ``causal_lm`` label and the policy's ``models.hub``. A template, a path out of the storage root
or a foreign URI is refused at its own line, and the spec compiles to nothing (no plan, no trainer config); or,
where the value is a column name (the label), it reaches the plan and the trainer config as written. Either way
no Airflow variable or connection is read and no file outside the storage root is opened."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.spec.test_transformer_spec import classifier, language_model
from tests.support import record_secret_reads
from trainpipe.compile.compiler import compile_file
from trainpipe.errors import SpecError
from trainpipe.policy.model import PolicyError, load_policy
from trainpipe.settings import Settings

PASSWORD = "pw-53e1-never-shown"
SECRET = "secret-53e1-never-shown"
TEMPLATE = "{{ var.value.secret }}"
CONN_TEMPLATE = "{{ conn.leak.password }}"
STATEMENT = "{% include '/etc/passwd' %}"
PATH = "../../etc/passwd"


@pytest.fixture(autouse=True)
def _secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A variable and a connection a rendered template would read; any read is recorded."""
    monkeypatch.delenv("TRAINPIPE_POLICY", raising=False)
    monkeypatch.setenv("TRAINPIPE_STORAGE_ROOT", f"file://{tmp_path / 'storage'}")
    return record_secret_reads(monkeypatch, secret=SECRET, password=PASSWORD)


def _policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, models: dict[str, Any] | None = None) -> None:
    team: dict[str, Any] = {"folders": ["**"], "data": {"uris": ["demo/**", "models/**", "s3://nlp-models/**"]}}
    if models is not None:
        team["models"] = models
    file = tmp_path / "policy.yaml"
    file.write_text(yaml.safe_dump({"default_team": None, "teams": {"nlp": team}}, sort_keys=False))
    monkeypatch.setenv("TRAINPIPE_POLICY", str(file))


def _compile(tmp_path: Path, spec: dict[str, Any]):
    folder = tmp_path / "configs"
    folder.mkdir(exist_ok=True)
    (folder / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False, width=1000))
    return compile_file(folder / "spec.yaml", "spec.yaml", settings=Settings.from_env(), configs_root=folder)


def _refused(tmp_path: Path, spec: dict[str, Any]) -> list[tuple[str, int, str]]:
    """(field path, line, message) of each problem; the spec compiled to nothing."""
    with pytest.raises(SpecError) as raised:
        _compile(tmp_path, spec)
    return [(p.field_path, p.line, p.message) for p in raised.value.problems]


def _line(tmp_path: Path, written: str, after: str = "") -> int:
    lines = (tmp_path / "configs" / "spec.yaml").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if after in line)
    return next(i for i, line in enumerate(lines) if i >= start and line.strip().startswith(written)) + 1


def _clean(message: str, reads: list[str]) -> None:
    assert SECRET not in message and PASSWORD not in message and "root:x" not in message
    assert reads == []


# training.model.pretrained ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "message"), [
    (TEMPLATE, "holds template markup; a weights location is read literally, never rendered"),
    (f"models/{CONN_TEMPLATE}/gpt2", "holds template markup"),
    (STATEMENT, "holds template markup"),
    (PATH, "leads outside the storage root"),
    ("models/../../outside", "leads outside the storage root"),
    ("/etc/passwd", "is a local path outside the storage root"),
    ("file:///etc/passwd", "is a local path outside the storage root"),
    ("http://weights.example.com/gpt2", "scheme 'http' is not one trainpipe reads"),
    ("https://huggingface.co/gpt2", "scheme 'https' is not one trainpipe reads"),
    ("memory://gpt2", "scheme 'memory' is not one trainpipe reads"),
    ("simplecache::s3://nlp-models/gpt2", "chains filesystems"),
    ("s3://aws_nlp@nlp-models/gpt2", "names a connection or credentials in its host part"),
    ("hf://gpt2/../../etc", "is not a Hugging Face Hub model id"),
    ("hf://openai-community/gpt2@main", "is not a Hugging Face Hub model id"),
    ("hf://openai-community/gpt2", "a platform policy must set models.hub: true"),
])
def test_a_foreign_pretrained_location_is_refused_at_its_line_without_a_policy(tmp_path, _secrets, value, message):
    [(path, line, problem)] = _refused(tmp_path, classifier(pretrained=value))

    assert (path, line) == ("training.model.pretrained", _line(tmp_path, "pretrained:"))
    assert message in problem
    _clean(problem, _secrets)
    assert not (tmp_path / "storage").exists()  # nothing was written, nothing resolved


@pytest.mark.parametrize(("value", "rule"), [
    ("s3://other-bucket/gpt2", "data.uris"),
    ("/etc", "data.uris"),
    ("runs/other_pipeline/output", "data.uris"),
    ("hf://openai-community/gpt2", "models.hub"),
])
def test_under_a_policy_pretrained_weights_follow_data_uris_and_the_hub_needs_models_hub(tmp_path, monkeypatch,
                                                                                        _secrets, value, rule):
    _policy(tmp_path, monkeypatch)

    [(path, line, problem)] = _refused(tmp_path, classifier(pretrained=value))

    assert (path, line) == ("training.model.pretrained", _line(tmp_path, "pretrained:"))
    assert problem.startswith(f"not allowed by policy (team nlp, rule {rule}): {value!r}")
    _clean(problem, _secrets)


@pytest.mark.parametrize("value", ["models/tiny-gpt2", "s3://nlp-models/base/gpt2/"])
def test_weights_the_team_may_read_compile_as_written(tmp_path, monkeypatch, _secrets, value):
    _policy(tmp_path, monkeypatch)

    plan = _compile(tmp_path, classifier(pretrained=value))

    assert json.loads(plan.trainer.to_json())["model"]["pretrained_uri"] == value


# models.hub ------------------------------------------------------------------------------------------------

def test_a_hub_model_compiles_only_where_the_policy_sets_models_hub(tmp_path, monkeypatch, _secrets):
    _policy(tmp_path, monkeypatch, {"hub": True})

    plan = _compile(tmp_path, classifier(pretrained="hf://openai-community/gpt2"))

    assert plan.trainer.model.pretrained_uri == "hf://openai-community/gpt2"
    _policy(tmp_path, monkeypatch, {"hub": False})
    [(path, _, problem)] = _refused(tmp_path, classifier(pretrained="hf://openai-community/gpt2"))
    assert path == "training.model.pretrained" and "rule models.hub" in problem


def test_models_hub_does_not_open_the_hub_to_another_kind_of_location(tmp_path, monkeypatch, _secrets):
    """Allowing the Hub allows hf://owner/name, nothing else: a URL or a path stays refused."""
    _policy(tmp_path, monkeypatch, {"hub": True})

    for value in ("https://huggingface.co/openai-community/gpt2", "hf://openai-community/gpt2/../../x", "/etc"):
        [(path, _, problem)] = _refused(tmp_path, classifier(pretrained=value))
        assert path == "training.model.pretrained", problem


@pytest.mark.parametrize("value", [TEMPLATE, "yes please", STATEMENT, ["true"]])
def test_models_hub_is_a_boolean_the_policy_file_spells_out(tmp_path, monkeypatch, _secrets, value):
    _policy(tmp_path, monkeypatch, {"hub": value})

    with pytest.raises(PolicyError) as raised:
        load_policy(tmp_path / "policy.yaml")
    # A broken policy refuses every spec (fail closed), even one without pretrained weights.
    with pytest.raises(SpecError, match="the platform policy .* is invalid"):
        _compile(tmp_path, classifier())

    [problem] = raised.value.problems
    assert problem.field_path == "teams.nlp.models.hub"
    lines = (tmp_path / "policy.yaml").read_text().splitlines()
    assert problem.line == next(i for i, line in enumerate(lines, 1) if line.strip().startswith("hub:"))
    _clean(problem.message, _secrets)


def test_the_policy_schema_says_models_hub_is_off_by_default():
    from trainpipe.policy.model import POLICY_SCHEMA_PATH

    schema = json.loads(POLICY_SCHEMA_PATH.read_text())
    hub = schema["$defs"]["ModelRules"]["properties"]["hub"]
    assert hub["type"] == "boolean" and hub["default"] is False


# the transformer's model.params ----------------------------------------------------------------------------

@pytest.mark.parametrize(("params", "at", "written", "message"), [
    ({"max_length": TEMPLATE}, "max_length", "max_length:", f"a whole number from 8 to 8192, got {TEMPLATE!r}"),
    ({"trainable": STATEMENT}, "trainable", "trainable:", "one of all, head, lora"),
    ({"gradient_checkpointing": CONN_TEMPLATE}, "gradient_checkpointing", "gradient_checkpointing:",
     "true or false"),
    ({"trainable": "lora", "lora": {"target_modules": ["c_attn", PATH]}}, "lora.target_modules.1",
     f"- {PATH}", "a module name (letters, digits, _ and dots)"),
    ({"trainable": "lora", "lora": {"target_modules": ["os.system('id')"]}}, "lora.target_modules.0",
     "- os.system", "a module name"),
    # A key the family does not take (weights to load, code to run): refused, never opened or imported.
    ({"weights": "/etc/passwd"}, "weights", "weights:", "not a transformer parameter"),
    ({"trust_remote_code": True}, "trust_remote_code", "trust_remote_code:", "not a transformer parameter"),
    ({"trainable": "lora", "lora": {"module": "os:system"}}, "lora.module", "module:", "not a LoRA setting"),
])
def test_foreign_transformer_params_are_refused_at_their_line(tmp_path, _secrets, params, at, written, message):
    [(path, line, problem)] = _refused(tmp_path, classifier(params=params))

    assert path == "training.model.params." + at.replace(".0", "[0]").replace(".1", "[1]")
    assert line == _line(tmp_path, written, after="params:")
    assert message in problem
    _clean(problem, _secrets)


# a causal_lm label -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("label", [TEMPLATE, CONN_TEMPLATE, STATEMENT, PATH])
def test_a_completion_column_named_like_a_template_or_a_path_stays_literal(tmp_path, _secrets, label):
    plan = _compile(tmp_path, language_model(label=label))

    config = plan.trainer.to_json()
    assert json.loads(config)["label"] == label
    assert plan.evaluation.label == label and label in plan.validation.required_columns
    shown = json.dumps(plan.to_dict(), default=str)
    assert SECRET not in config + shown and PASSWORD not in config + shown and "root:x" not in config + shown
    assert _secrets == []


@pytest.mark.parametrize(("label", "message"), [
    (["completion"], "Input should be a valid string"),
    ("prompt", "'prompt' is the label; remove it from features"),
])
def test_a_causal_lm_label_that_is_no_column_of_its_own_is_refused_at_its_line(tmp_path, _secrets, label, message):
    problems = _refused(tmp_path, language_model(label=label))

    assert any(message in problem for _, _, problem in problems), problems
    _clean(" ".join(problem for _, _, problem in problems), _secrets)


# models.families -------------------------------------------------------------------------------------------

def test_the_transformer_is_a_built_in_family_a_team_s_list_can_leave_out(tmp_path, monkeypatch, _secrets):
    _policy(tmp_path, monkeypatch)  # no models.families: the built-in ones, the transformer among them
    assert _compile(tmp_path, classifier()).trainer.model.type == "transformer"

    _policy(tmp_path, monkeypatch, {"families": ["mlp", "text_bag"], "hub": True})
    [(path, line, problem)] = _refused(tmp_path, classifier())
    assert (path, line) == ("training.model.type", _line(tmp_path, "type: transformer"))
    assert problem == ("not allowed by policy (team nlp, rule models.families): 'transformer'; allowed: 'mlp', "
                       "'text_bag'")


def test_under_data_conn_ids_weights_in_an_object_store_are_refused_as_data_without_a_connection(
        tmp_path, monkeypatch, _secrets):
    """pretrained has no conn_id: the trainer would read an s3:// folder with the worker's own credentials, which
    data.conn_ids refuses for data too. A folder under the storage root is read through the root's connection."""
    file = tmp_path / "policy.yaml"
    file.write_text(yaml.safe_dump({"default_team": None, "teams": {"nlp": {"folders": ["**"], "data": {
        "uris": ["demo/**", "models/**", "s3://nlp-models/**"], "conn_ids": ["aws_nlp"]}}}}))
    monkeypatch.setenv("TRAINPIPE_POLICY", str(file))
    spec = classifier(pretrained="s3://nlp-models/gpt2")
    spec["data"]["conn_id"] = "aws_nlp"

    [(path, line, problem)] = _refused(tmp_path, spec)

    assert (path, line) == ("training.model.pretrained", _line(tmp_path, "pretrained:"))
    assert problem.startswith("not allowed by policy (team nlp, rule data.conn_ids): \"the worker's own credentials")
    spec["training"]["model"]["pretrained"] = "models/tiny-gpt2"
    assert _compile(tmp_path, spec).trainer.model.pretrained_uri == "models/tiny-gpt2"
