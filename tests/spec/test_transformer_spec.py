"""The transformer family and task causal_lm in specs: what a valid spec compiles to (the trainer config the train
step writes, the plan's validation and evaluation), and each refusal at its own line with its fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import REPO
from trainpipe.compile.compiler import compile_file
from trainpipe.errors import SpecError
from trainpipe.settings import Settings
from trainpipe_trainer.config import TrainingConfig


@pytest.fixture(autouse=True)
def _no_policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRAINPIPE_POLICY", raising=False)
    monkeypatch.setenv("TRAINPIPE_STORAGE_ROOT", f"file://{tmp_path / 'storage'}")


def classifier(**model: Any) -> dict[str, Any]:
    """ticket_router with the transformer: the ticket's subject and body, through pretrained weights."""
    spec = yaml.safe_load((REPO / "dag_configs" / "ticket_router.yaml").read_text())
    spec["training"]["model"] = {"type": "transformer", "pretrained": "models/tiny-gpt2",
                                 "params": {"max_length": 64, "trainable": "lora", "lora": {"r": 4}}, **model}
    spec["training"]["features"] = ["subject", "body"]
    spec["training"]["transforms"] = {"subject": {"type": "text"}, "body": {"type": "text"}}
    return spec


def language_model(label: str | None = "completion") -> dict[str, Any]:
    """An instruction fine-tune: the prompt's text, the loss on the completion's tokens (or every token)."""
    spec = classifier(params={"max_length": 96, "max_new_tokens": 8})
    training = spec["training"]
    training.update(task="causal_lm", features=["prompt"], transforms={"prompt": {"type": "text"}},
                    early_stopping={"metric": "validation_perplexity", "patience": 3})
    training.pop("label_classes")
    if label is None:
        training.pop("label")
    else:
        training["label"] = label
    spec["validation"]["expectations"] = [{"expect_column_values_to_not_be_null": {"column": "prompt"}}]
    spec["evaluation"] = {"metrics": ["perplexity", "token_accuracy", "loss"],
                          "gates": ["perplexity <= 40", "token_accuracy >= 0.3", "perplexity >= -1%"],
                          "slices": ["channel"]}
    return spec


def _compile(tmp_path: Path, spec: dict[str, Any]):
    file = tmp_path / "spec.yaml"
    file.write_text(yaml.safe_dump(spec, sort_keys=False, width=1000))
    return compile_file(file, "spec.yaml", settings=Settings.from_env(), configs_root=tmp_path)


def _refused(tmp_path: Path, spec: dict[str, Any]) -> list[tuple[str, int, str]]:
    with pytest.raises(SpecError) as raised:
        _compile(tmp_path, spec)
    return [(p.field_path, p.line, p.message) for p in raised.value.problems]


def _line(tmp_path: Path, written: str, after: str = "") -> int:
    lines = (tmp_path / "spec.yaml").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if after in line)
    return next(i for i, line in enumerate(lines) if i >= start and line.strip().startswith(written)) + 1


def test_a_transformer_classifier_compiles_to_its_trainer_config(tmp_path):
    plan = _compile(tmp_path, classifier())

    config = json.loads(plan.trainer.to_json())
    assert config["task"] == "multiclass_classification" and config["label"] == "queue"
    assert config["model"]["type"] == "transformer"
    # Literal: the family fills its defaults when it checks them in the train task.
    assert config["model"]["params"] == {"max_length": 64, "trainable": "lora", "lora": {"r": 4}}
    assert config["model"]["pretrained_uri"] == "models/tiny-gpt2"  # resolved by the train step (below)
    assert [(t["feature"], t["type"]) for t in config["transforms"]] == [("subject", "text"), ("body", "text")]
    assert TrainingConfig.from_json(plan.trainer.to_json()) == plan.trainer  # the trainer reads it back
    assert plan.evaluation.text_features == plan.validation.text_features == ("subject", "body")
    # Evaluated as text_bag is: the served model takes the raw text, the baseline reads it as TF-IDF.
    from trainpipe.steps.evaluate.baseline import baseline_model

    assert baseline_model(plan.evaluation.task, plan.evaluation.text_features) == \
        "TF-IDF + multinomial logistic regression"
    assert plan.inputs_declared_at["model.pretrained"][1] == _line(tmp_path, "pretrained:")


def test_a_causal_lm_compiles_to_its_trainer_config(tmp_path):
    plan = _compile(tmp_path, language_model())

    config = json.loads(plan.trainer.to_json())
    assert (config["task"], config["label"], config["features"]) == ("causal_lm", "completion", ["prompt"])
    assert config["model"]["params"] == {"max_length": 96, "max_new_tokens": 8}
    assert config["model"]["pretrained_uri"] == "models/tiny-gpt2"
    assert config["early_stopping"]["metric"] == "validation_perplexity"
    assert plan.evaluation.metrics == ("perplexity", "token_accuracy", "loss")
    assert [g.text for g in plan.evaluation.gates] == ["perplexity <= 40", "token_accuracy >= 0.3",
                                                       "perplexity >= -1% vs champion"]
    assert plan.evaluation.slices == ("channel",)
    assert "completion" in plan.validation.required_columns


def test_a_plain_language_model_has_no_label_column(tmp_path):
    plan = _compile(tmp_path, language_model(label=None))

    assert json.loads(plan.trainer.to_json())["label"] == ""
    assert "" not in plan.validation.required_columns and "" not in plan.validation.schema.used_columns
    assert plan.evaluation.label == ""


def test_other_tasks_still_need_a_label_at_the_training_section(tmp_path):
    spec = classifier()
    del spec["training"]["label"], spec["training"]["label_classes"]

    problems = _refused(tmp_path, spec)

    assert ("training.label", _line(tmp_path, "training:"), "required field is missing; add it") in problems


def test_the_transformer_needs_pretrained_weights(tmp_path):
    spec = classifier()
    del spec["training"]["model"]["pretrained"]

    [(path, line, message)] = _refused(tmp_path, spec)

    assert (path, line) == ("training.model", _line(tmp_path, "model:", after="training:"))
    assert "add training.model.pretrained" in message and "models.hub: true" in message


@pytest.mark.parametrize("family", ["mlp", "text_bag"])
def test_pretrained_weights_are_refused_for_another_family(tmp_path, family):
    spec = classifier(type=family, params={})
    if family == "mlp":
        spec["training"]["transforms"] = {}

    [(path, line, message)] = _refused(tmp_path, spec)

    assert (path, line) == ("training.model.pretrained", _line(tmp_path, "pretrained:"))
    assert message.startswith("pretrained weights are read by the transformer family only") and repr(family) in message


def test_a_feature_that_is_not_text_is_refused_at_its_line(tmp_path):
    spec = classifier()
    spec["training"]["features"] = ["subject", "channel"]
    spec["training"]["transforms"] = {"subject": {"type": "text"}, "channel": {"type": "categorical"}}

    [(path, line, message)] = _refused(tmp_path, spec)

    assert (path, line) == ("training.transforms.channel.type", _line(tmp_path, "type: categorical"))
    assert "reads text columns only; declare it text" in message


def test_an_undeclared_feature_is_refused_at_its_list_item(tmp_path):
    spec = classifier()
    spec["training"]["features"] = ["subject", "amount"]
    del spec["training"]["transforms"]["body"]

    [(path, line, message)] = _refused(tmp_path, spec)

    assert (path, line) == ("training.features[1]", _line(tmp_path, "- amount"))
    assert "'amount' is not declared text" in message


def test_three_texts_or_two_for_a_language_model_are_refused_at_features(tmp_path):
    spec = classifier()
    spec["training"]["features"] = ["subject", "body", "channel"]
    spec["training"]["transforms"]["channel"] = {"type": "text"}
    [(path, _, message)] = _refused(tmp_path, spec)
    assert path == "training.features" and "one or two text features" in message

    spec = language_model()
    spec["training"]["features"] = ["prompt", "body"]
    spec["training"]["transforms"]["body"] = {"type": "text"}
    [(path, _, message)] = _refused(tmp_path, spec)
    assert path == "training.features" and "exactly one text feature" in message
    assert "put the completion in training.label" in message


@pytest.mark.parametrize("option", [{"max_tokens": 64}, {"hash_buckets": 1024}, {"ngrams": 1}])
def test_text_bag_s_text_options_are_refused_under_the_transformer(tmp_path, option):
    spec = classifier()
    spec["training"]["transforms"]["body"] |= option
    [key] = option

    [(path, line, message)] = _refused(tmp_path, spec)

    assert (path, line) == (f"training.transforms.body.{key}", _line(tmp_path, f"{key}:"))
    assert "training.model.params.max_length" in message


def test_ranking_is_refused_for_the_transformer(tmp_path):
    spec = classifier()
    spec["training"].update(task="ranking", group_column="channel")
    spec["training"].pop("label_classes")
    spec["evaluation"] = {"metrics": ["ndcg@10"]}

    problems = _refused(tmp_path, spec)

    assert any(path == "training.task" and "does not train 'ranking'" in message for path, _, message in problems)


def test_causal_lm_needs_the_transformer(tmp_path):
    spec = language_model()
    spec["training"]["model"] = {"type": "text_bag"}

    problems = _refused(tmp_path, spec)

    assert ("training.task", _line(tmp_path, "task: causal_lm"),
            "causal_lm (a language model's next tokens) trains with the transformer family only, and "
            "training.model.type is 'text_bag': set training.model.type: transformer with training.model.pretrained"
            ) in problems


@pytest.mark.parametrize(("where", "value", "message"), [
    (("evaluation", "metrics"), ["perplexity", "auc"], "'auc' is not a causal_lm metric"),
    (("evaluation", "gates"), ["perplexity <= baseline"], "a causal_lm evaluation has none"),
    (("training", "early_stopping"), {"metric": "validation_accuracy"}, "a causal_lm trainer does not compute"),
])
def test_what_a_causal_lm_does_not_compute_is_refused(tmp_path, where, value, message):
    spec = language_model()
    spec[where[0]][where[1]] = value

    problems = _refused(tmp_path, spec)

    assert any(message in problem for _, _, problem in problems), problems


def test_a_transformer_param_is_checked_by_the_family_at_its_line(tmp_path):
    spec = classifier(params={"max_length": 4, "trainable": "lora"})

    [(path, line, message)] = _refused(tmp_path, spec)

    assert (path, line) == ("training.model.params.max_length", _line(tmp_path, "max_length:"))
    assert message == "a whole number from 8 to 8192, got 4"
