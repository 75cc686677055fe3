"""`training.model.type` and `model.params` at the trust boundary: a family is a name, its params are bounded JSON
data that reach the trainer config literally (nothing renders, opens or imports them), each problem at its line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.support import REPO
from trainpipe.compile.compiler import compile_file
from trainpipe.errors import SpecError
from trainpipe.settings import Settings
from trainpipe.spec.sections.training import MAX_PARAM_TEXT, MAX_PARAMS_DEPTH, MAX_PARAMS_VALUES

PASSWORD = "pw-7e57-never-shown"
TEMPLATE = "{{ conn.leak.password }}"


@pytest.fixture(autouse=True)
def _no_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRAINPIPE_POLICY", raising=False)


def _spec(model: dict | None = None, **top: object) -> dict:
    spec = yaml.safe_load((REPO / "dag_configs" / "fraud_detector.yaml").read_text())
    if model is not None:
        spec["training"]["model"] = model
    spec.update(top)
    return spec


def _compile(tmp_path: Path, spec: dict | str):
    file = tmp_path / "fraud.yaml"
    file.write_text(spec if isinstance(spec, str) else yaml.safe_dump(spec, sort_keys=False))
    return compile_file(file, "fraud.yaml", settings=Settings.from_env(), configs_root=tmp_path)


def _problems(tmp_path: Path, spec: dict | str) -> list[tuple[str, str, str]]:
    """(field path, the line it points at, message) of each problem."""
    with pytest.raises(SpecError) as raised:
        _compile(tmp_path, spec)
    lines = (tmp_path / "fraud.yaml").read_text().splitlines()
    return [(p.field_path, lines[p.line - 1].strip() if p.line else "", p.message) for p in raised.value.problems]


def test_params_reach_the_trainer_config_as_written(tmp_path):
    params = {"depth": 4, "width": 128.5, "norm": None, "gated": True, "blocks": [{"kind": "res", "n": 2}]}
    plan = _compile(tmp_path, _spec({"type": "acme_tabnet", "params": params}))

    assert plan.trainer.model.type == "acme_tabnet" and plan.trainer.model.params == params
    assert json.loads(plan.trainer.to_json())["model"]["params"] == params
    # A family that is not built in: its lookup and its parameters are located at the spec's lines.
    assert {key for key in plan.inputs_declared_at if key.startswith("model")} == {
        "model.type", "model.params", "model.params.depth", "model.params.width", "model.params.norm",
        "model.params.gated", "model.params.blocks"}


def test_the_mlp_config_has_no_params_key(tmp_path):
    plan = _compile(tmp_path, _spec())

    assert "params" not in json.loads(plan.trainer.to_json())["model"]
    assert not any(key.startswith("model") for key in plan.inputs_declared_at)


def test_templates_and_paths_in_params_stay_literal_and_no_connection_is_read(tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_LEAK", json.dumps({"conn_type": "generic", "password": PASSWORD}))
    params = {"token": TEMPLATE, "weights": "../../etc/passwd", "cache": "/proc/self/environ", "home": "${HOME}",
              "nested": {"t": [TEMPLATE, "{% include '/etc/passwd' %}"]}}
    read: list[str] = []
    from airflow.sdk.definitions.connection import Connection

    monkeypatch.setattr(Connection, "get", classmethod(lambda cls, conn_id, *a, **k: read.append(conn_id)))

    plan = _compile(tmp_path, _spec({"type": "acme_tabnet", "params": params}))

    config = plan.trainer.to_json()
    assert json.loads(config)["model"]["params"] == params
    assert PASSWORD not in config and PASSWORD not in json.dumps(plan.to_dict(), default=str)
    assert "root:" not in config  # /etc/passwd was not opened
    assert read == []


@pytest.mark.parametrize("family", ["acme.models", "acme.models:TabNet", "../x", "/opt/family", "Acme", "x" * 65])
def test_a_module_or_a_path_is_no_family_name(tmp_path, family):
    [(path, line, message)] = _problems(tmp_path, _spec({"type": family}))

    assert path == "training.model.type" and line.startswith("type:")
    assert "is not a model family name" in message and "never a module or a path" in message


def test_each_problem_of_params_is_at_its_own_line(tmp_path):
    text = yaml.safe_dump(_spec({"type": "acme_tabnet", "params": {"depth": 2}}), sort_keys=False)
    text = text.replace("      depth: 2\n", (
        "      depth: 2\n"
        "      bad-name: 1\n"
        "      nested:\n"
        "        steps: [1, .nan]\n"
        "      when: 2026-01-01\n"
        "      blob: !!binary aGVsbG8=\n"))

    problems = _problems(tmp_path, text)

    assert problems == [
        ("training.model.params.bad-name", "bad-name: 1", "'bad-name' is no parameter name (a letter or _, then "
         "letters, digits or _, at most 64); rename it"),
        ("training.model.params.nested.steps[1]", "steps: [1, .nan]", "nan is no JSON number; give a finite one"),
        ("training.model.params.when", "when: 2026-01-01", "a date is no JSON value (text, number, true/false, null, "
         "a list or a mapping); quote it to pass it as text"),
        ("training.model.params.blob", "blob: !!binary aGVsbG8=", "a bytes is no JSON value (text, number, "
         "true/false, null, a list or a mapping); quote it to pass it as text"),
    ]


@pytest.mark.parametrize(("params", "at", "message"), [
    ({"text": "x" * (MAX_PARAM_TEXT + 1)}, "training.model.params.text", f"more than {MAX_PARAM_TEXT:,}"),
    ({"big": 2**64}, "training.model.params.big", "an integer beyond 64 bits"),
    ({"items": list(range(MAX_PARAMS_VALUES))}, "training.model.params", f"more than {MAX_PARAMS_VALUES:,}"),
    ([1, 2], "training.model.params", "a mapping of parameter names to values"),
])
def test_params_are_bounded(tmp_path, params, at, message):
    [(path, _line, problem)] = _problems(tmp_path, _spec({"type": "acme_tabnet", "params": params}))

    assert path == at and message in problem


def test_params_nest_only_so_deep(tmp_path):
    deep: object = 1
    for _ in range(MAX_PARAMS_DEPTH + 1):
        deep = [deep]
    [(path, _line, problem)] = _problems(tmp_path, _spec({"type": "acme_tabnet", "params": {"deep": deep}}))

    assert path == "training.model.params.deep" + "[0]" * MAX_PARAMS_DEPTH
    assert f"nested more than {MAX_PARAMS_DEPTH} levels" in problem


def test_the_mlp_takes_no_params(tmp_path):
    for model in ({"params": {"depth": 3}}, {"type": "mlp", "params": {"depth": 3}}):
        [(path, line, message)] = _problems(tmp_path, _spec(model))

        assert (path, line) == ("training.model.params", "params:")
        assert message.startswith("the mlp family takes no params: its settings are training.model.hidden_layers")


def test_the_mlp_settings_are_refused_under_another_family(tmp_path):
    spec = _spec({"type": "acme_tabnet", "hidden_layers": [8], "dropout": 0.1})

    problems = _problems(tmp_path, spec)

    assert [(path, line.split(":")[0]) for path, line, _ in problems] == [
        ("training.model.hidden_layers", "hidden_layers"), ("training.model.dropout", "dropout")]
    assert all("a setting of the mlp family, and training.model.type is 'acme_tabnet'" in m for _, _, m in problems)
