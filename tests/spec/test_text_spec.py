"""Text columns in the spec: `type: text` (declared, never inferred), its options, the family that reads its token
ids, and what the plan gives the trainer, validation and evaluation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.support import REPO
from trainpipe.compile.compiler import compile_file
from trainpipe.errors import SpecError
from trainpipe.settings import Settings
from trainpipe_trainer.config import DEFAULT_TEXT_HASH_BUCKETS, FeatureTransform


@pytest.fixture(autouse=True)
def _no_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRAINPIPE_POLICY", raising=False)


def _spec(transform: dict, model: dict | None = None) -> dict:
    spec = yaml.safe_load((REPO / "dag_configs" / "fraud_detector.yaml").read_text())
    spec["training"]["features"].append("review")
    spec["training"]["transforms"]["review"] = transform
    spec["training"]["model"] = {"type": "text_bag"} if model is None else model
    return spec


def _compile(tmp_path: Path, spec: dict):
    file = tmp_path / "reviews.yaml"
    file.write_text(yaml.safe_dump(spec, sort_keys=False))
    return compile_file(file, "reviews.yaml", settings=Settings.from_env(), configs_root=tmp_path)


def _problems(tmp_path: Path, spec: dict) -> list[tuple[str, str, str]]:
    """(field path, the line it points at, message) of each problem."""
    with pytest.raises(SpecError) as raised:
        _compile(tmp_path, spec)
    lines = (tmp_path / "reviews.yaml").read_text().splitlines()
    return [(p.field_path, lines[p.line - 1].strip() if p.line else "", p.message) for p in raised.value.problems]


def test_a_text_transform_reaches_the_trainer_with_text_s_own_defaults(tmp_path):
    plan = _compile(tmp_path, _spec({"type": "text"}))

    [text] = [t for t in plan.trainer.transforms if t.feature == "review"]
    # Not the dataclass's 32 buckets (categorical hashing's default): text's.
    assert text == FeatureTransform(feature="review", type="text", hash_buckets=DEFAULT_TEXT_HASH_BUCKETS)
    written = next(t for t in json.loads(plan.trainer.to_json())["transforms"] if t["feature"] == "review")
    assert (written["hash_buckets"], written["max_tokens"], written["ngrams"]) == (DEFAULT_TEXT_HASH_BUCKETS, 256, 2)
    assert plan.validation.text_features == plan.evaluation.text_features == ("review",)
    assert plan.to_dict()["validation"]["text_features"] == ("review",)
    # text_bag is built in: no lookup to locate, but its params are checked before launch at their lines.
    assert "model.type" not in plan.inputs_declared_at and "model.params" in plan.inputs_declared_at


def test_declared_text_options_reach_the_trainer(tmp_path):
    plan = _compile(tmp_path, _spec({"type": "text", "hash_buckets": 4096, "max_tokens": 32, "ngrams": 1},
                                    {"type": "text_bag", "params": {"embedding_dim": 16, "hidden_layers": [8]}}))

    [text] = [t for t in plan.trainer.transforms if t.feature == "review"]
    assert (text.hash_buckets, text.max_tokens, text.ngrams) == (4096, 32, 1)
    assert plan.trainer.model.params == {"embedding_dim": 16, "hidden_layers": [8]}
    assert {k for k in plan.inputs_declared_at if k.startswith("model")} == {
        "model.params", "model.params.embedding_dim", "model.params.hidden_layers"}


def test_plans_without_text_keep_their_shape(tmp_path):
    plan = compile_file(REPO / "dag_configs" / "fraud_detector.yaml", settings=Settings.from_env())

    assert plan.validation.text_features == plan.evaluation.text_features == ()
    assert "text_features" not in plan.to_dict()["validation"] and "text_features" not in plan.to_dict()["evaluation"]
    assert all("max_tokens" not in t for t in json.loads(plan.trainer.to_json())["transforms"])


def test_text_bag_without_a_text_column_compiles(tmp_path):
    spec = _spec({"type": "categorical"})
    assert _compile(tmp_path, spec).trainer.model.type == "text_bag"


def test_a_text_column_under_the_mlp_is_refused_at_its_type_line(tmp_path):
    for model in ({"type": "mlp"}, {}):  # written, and the default
        [(path, line, message)] = _problems(tmp_path, _spec({"type": "text"}, model))
        assert (path, line) == ("training.transforms.review.type", "type: text")
        assert "set training.model.type: text_bag (or a family that reads token ids)" in message


def test_another_type_s_options_on_text_are_refused_each_at_its_line(tmp_path):
    problems = _problems(tmp_path, _spec({"type": "text", "impute": "median", "clip": [0, 1], "encode": "hashing",
                                          "max_categories": 5, "standardize": False}))

    assert [(path, line) for path, line, _ in problems] == [
        ("training.transforms.review.impute", "impute: median"),
        ("training.transforms.review.clip", "clip:"),
        ("training.transforms.review.encode", "encode: hashing"),
        ("training.transforms.review.max_categories", "max_categories: 5"),
        ("training.transforms.review.standardize", "standardize: false"),
    ]
    assert "set type: numeric" in problems[0][2] and "set type: categorical" in problems[2][2]


@pytest.mark.parametrize("transform", [{"max_tokens": 8}, {"type": "numeric", "ngrams": 1},
                                       {"type": "categorical", "max_tokens": 8}])
def test_text_options_on_another_type_are_refused_and_never_make_it_text(tmp_path, transform):
    [(path, line, message)] = _problems(tmp_path, _spec(transform))
    key = next(k for k in transform if k != "type")
    assert (path, line) == (f"training.transforms.review.{key}", f"{key}: {transform[key]}")
    assert message == f"{key} applies to text features; set type: text or remove it"


def test_text_hash_buckets_stop_below_2_to_the_24(tmp_path):
    _compile(tmp_path, _spec({"type": "text", "hash_buckets": 2**24 - 2}))
    # Categorical hashing keeps its bound.
    _compile(tmp_path, _spec({"type": "categorical", "encode": "hashing", "hash_buckets": 2**24}))
    [(path, line, message)] = _problems(tmp_path, _spec({"type": "text", "hash_buckets": 2**24 - 1}))

    assert (path, line) == ("training.transforms.review.hash_buckets", f"hash_buckets: {2**24 - 1}")
    assert message.startswith("at most 16,777,214 for text")


def test_text_bag_params_are_checked_at_their_lines(tmp_path):
    problems = _problems(tmp_path, _spec({"type": "text"}, {"type": "text_bag", "params": {"embedding_dim": 0}}))
    assert problems == [("training.model.params.embedding_dim", "embedding_dim: 0",
                         "a whole number from 1 to 1024, got 0")]

    [(path, line, message)] = _problems(tmp_path, _spec({"type": "text"}, {
        "type": "text_bag", "params": {"hidden_layers": [8, 0]}}))
    assert (path, line) == ("training.model.params.hidden_layers[1]", "- 0")
    assert message.startswith("a width from 1 to")


def test_the_mlp_s_own_keys_are_still_refused_under_text_bag(tmp_path):
    [(path, line, message)] = _problems(tmp_path, _spec({"type": "text"}, {"type": "text_bag", "dropout": 0.2}))
    assert (path, line) == ("training.model.dropout", "dropout: 0.2")
    assert "training.model.params" in message


def test_a_text_column_is_no_slice(tmp_path):
    spec = _spec({"type": "text"})
    spec["evaluation"]["slices"] = ["review"]
    [(path, line, message)] = _problems(tmp_path, spec)
    assert (path, line) == ("evaluation.slices[0]", "- review")
    assert message.startswith("'review' is text")
