"""The text_bag family's pieces without a launch: tokenising (deterministic, literal), the token-id inputs,
the module over any leading shape, its params, and the refusal of text columns to a family that reads numbers."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch

from trainpipe_trainer.config import FeatureTransform, ModelConfig, TrainingConfig
from trainpipe_trainer.errors import TrainerInputError
from trainpipe_trainer.models import DataDescription, FamilyParamsError, check_family_inputs, load_family
from trainpipe_trainer.preprocessing import FeatureTransformer, TextEncoder, stable_bucket, text_tokens


def test_tokens_are_lower_cased_nfkc_words_each_followed_by_the_pair_it_ends() -> None:
    assert text_tokens("Refund, PLEASE!  ﬁnally", ngrams=2) == [
        "refund", "please", "refund please", "finally", "please finally"]
    assert text_tokens("Refund, PLEASE!", ngrams=1) == ["refund", "please"]
    # Markup and templates are text: their words are tokens, nothing is evaluated.
    assert text_tokens("{{ var.value.secret }} ../../etc/passwd", ngrams=1) == [
        "var", "value", "secret", "etc", "passwd"]


def test_token_ids_are_the_same_in_another_process() -> None:
    # Python's hash() is salted per process; the served model must give a word the id training gave it.
    here = [stable_bucket(token, 4096) for token in ("refund", "refund please", "ünïcode")]
    code = ("from trainpipe_trainer.preprocessing import stable_bucket;"
            "print([stable_bucket(t, 4096) for t in ('refund', 'refund please', 'ünïcode')])")
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": "123", "PATH": "/usr/bin"}).stdout
    assert there.strip() == str(here)


def test_a_text_becomes_its_first_token_ids_then_padding() -> None:
    encoder = TextEncoder(feature="body", buckets=1000, max_tokens=4, ngrams=2)
    frame = pd.DataFrame({"body": ["card charged twice", None, "", 42]})
    ids = encoder.encode(frame, source="test")
    expected = [1 + stable_bucket(t, 1000) for t in ("card", "charged", "card charged", "twice")]
    assert ids[0].tolist() == expected  # truncated at max_tokens: "charged twice" is dropped
    assert ids[1].tolist() == [0, 0, 0, 0]  # a missing text has no tokens
    assert ids[2].tolist() == [0, 0, 0, 0]
    assert ids[3].tolist() == [1 + stable_bucket("42", 1000), 0, 0, 0]
    assert encoder.output_names == ("body@0", "body@1", "body@2", "body@3")


def _description(task: str = "multiclass_classification") -> tuple[FeatureTransformer, DataDescription]:
    frame = pd.DataFrame({"subject": ["late parcel", "wrong invoice"], "amount": [1.0, 3.0],
                          "channel": ["email", "chat"]})
    transformer = FeatureTransformer.fit(frame, (
        FeatureTransform(feature="subject", type="text", hash_buckets=64, max_tokens=5),
        FeatureTransform(feature="amount"),
        FeatureTransform(feature="channel", type="categorical")), source="test")
    classes = ("billing", "shipping", "technical") if task == "multiclass_classification" else ()
    return transformer, DataDescription.of(task, transformer, classes)


def test_the_description_names_each_text_columns_vocabulary_and_inputs() -> None:
    transformer, description = _description()
    assert description.vocabularies == {"subject": 65}
    assert description.inputs_of(["subject"]) == [0, 1, 2, 3, 4]
    assert transformer.from_dict(transformer.to_dict()) == transformer  # shipped in the model as JSON


@pytest.mark.parametrize("task", ["multiclass_classification", "binary_classification", "ranking"])
def test_the_module_scores_rows_and_query_lists(task: str) -> None:
    transformer, description = _description(task)
    family = load_family("text_bag")
    torch.manual_seed(0)
    module = family.build(ModelConfig(type="text_bag"), family.validate_params({"hidden_layers": [8]}), description)
    frame = pd.DataFrame({"subject": ["late parcel again", "invoice"], "amount": [2.0, 2.0],
                          "channel": ["email", "phone"]})
    inputs = torch.from_numpy(transformer.transform(frame, source="test").astype(np.float32))
    outputs = module(inputs)
    assert outputs.shape == (2, description.n_outputs)
    assert module(inputs.reshape(1, 2, -1)).shape == (1, 2, description.n_outputs)
    # Only weights are state: the input positions follow from the description.
    assert set(module.state_dict()) == {"bags.0.weight", "head.0.weight", "head.0.bias", "head.2.weight",
                                        "head.2.bias"}


def test_padding_does_not_change_a_score() -> None:
    # The bag pools a text's tokens only: more room (max_tokens) for the same text changes nothing.
    scores = []
    for max_tokens in (6, 40):
        frame = pd.DataFrame({"body": ["package arrived damaged"]})
        transformer = FeatureTransformer.fit(
            frame, (FeatureTransform(feature="body", type="text", hash_buckets=128, max_tokens=max_tokens),),
            source="test")
        description = DataDescription.of("binary_classification", transformer)
        torch.manual_seed(0)
        module = load_family("text_bag").build(ModelConfig(type="text_bag"), load_family("text_bag").validate_params({}),
                                              description)
        scores.append(module(torch.from_numpy(transformer.transform(frame, source="t").astype(np.float32))))
    torch.testing.assert_close(scores[0], scores[1], rtol=0, atol=0)


@pytest.mark.parametrize(("params", "path"), [
    ({"embeding_dim": 8}, "embeding_dim"),
    ({"embedding_dim": "{{ var.value.secret }}"}, "embedding_dim"),
    ({"embedding_dim": 0}, "embedding_dim"),
    ({"hidden_layers": [16, "/etc/passwd"]}, "hidden_layers.1"),
    ({"hidden_layers": "64"}, "hidden_layers"),
    ({"dropout": 1.0}, "dropout"),
    ({"dropout": True}, "dropout"),
])
def test_a_wrong_param_is_refused_at_its_path(params: dict, path: str) -> None:
    with pytest.raises(FamilyParamsError) as caught:
        load_family("text_bag").validate_params(params)
    assert caught.value.path == path
    assert str(caught.value).startswith(f"model.params.{path}: ")


def test_the_params_get_fasttexts_linear_head_by_default() -> None:
    assert load_family("text_bag").validate_params({}) == {"embedding_dim": 64, "hidden_layers": [], "dropout": 0.0}


def _config(model_type: str) -> TrainingConfig:
    return TrainingConfig.from_dict({
        "pipeline_id": "p", "task": "binary_classification", "train_data_uri": "/data.parquet",
        "features": ["body", "amount"], "label": "label", "model": {"type": model_type},
        "transforms": [{"feature": "body", "type": "text", "hash_buckets": 4096}],
        "checkpoint": {"root_uri": "file:///tmp/unused"}, "output_uri": "/tmp/unused"})


def test_a_family_that_reads_numbers_is_refused_a_text_column() -> None:
    with pytest.raises(TrainerInputError, match=r"the 'mlp' family does not read text columns, and transforms "
                                                r"declare 'body' as text; set model.type: text_bag"):
        check_family_inputs(load_family("mlp"), _config("mlp"))
    check_family_inputs(load_family("text_bag"), _config("text_bag"))


def test_text_options_stay_out_of_other_transforms_json() -> None:
    # Trainer configs without text columns stay byte-identical to those before text existed.
    config = _config("text_bag")
    raw = TrainingConfig.from_dict({**config.to_dict(), "transforms": [
        *config.to_dict()["transforms"], {"feature": "amount"}]}).to_dict()
    assert raw["transforms"][0] == {**raw["transforms"][0], "max_tokens": 256, "ngrams": 2}
    assert raw["transforms"][1] == {"feature": "amount", "type": "numeric", "impute": None, "fill_value": None,
                                    "missing_indicator": False, "clip_min": None, "clip_max": None, "transform": None,
                                    "standardize": True, "encode": "one_hot", "max_categories": 20, "hash_buckets": 32}
