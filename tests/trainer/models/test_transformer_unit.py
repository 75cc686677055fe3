"""The transformer family without a launcher: its params, the tiny model writer, tokenising and causal_lm
sequences (prompt positions ignored), the token loss and metrics on hand-computed values, the build (same weights
for the same seed; head-only and LoRA training), and the install hint without transformers."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from tests.trainer.helpers import file_digests
from trainpipe_trainer.config import TrainingConfig
from trainpipe_trainer.data.splits import read_splits
from trainpipe_trainer.errors import TrainerDataError, TrainerInputError
from trainpipe_trainer.losses import make_loss_fn, token_cross_entropy_loss
from trainpipe_trainer.models import DataDescription, FamilyParamsError, load_family, text_tokenizer_of
from trainpipe_trainer.models.transformer import TransformerFamily
from trainpipe_trainer.models.transformer.params import validate_transformer_params
from trainpipe_trainer.models.transformer.tiny import write_tiny_model
from trainpipe_trainer.preprocessing import IGNORED_TARGET
from trainpipe_trainer.validation_metrics import task_metrics

pytest.importorskip("transformers", reason="pip install 'trainpipe-trainer[transformers]'")

TEXTS = [f"ticket {i}: my invoice {i * 7} was charged twice, please refund" for i in range(40)] + [
    f"ticket {i}: the app crashes at login after update {i}" for i in range(40)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "model", TEXTS, n_positions=64)


def _config(tmp_path: Path, tiny: Path, frame: pd.DataFrame, **overrides) -> TrainingConfig:
    path = tmp_path / "train.parquet"
    frame.to_parquet(path)
    raw = {"pipeline_id": "t", "train_data_uri": str(path), "seed": 0, "epochs": 1, "batch_size": 8,
           "learning_rate": 0.01, "checkpoint": {"root_uri": (tmp_path / "ck").as_uri(), "validation_fraction": 0.25},
           "output_uri": str(tmp_path / "out"), "task": "causal_lm", "features": ["prompt"], "label": "answer",
           "transforms": [{"feature": "prompt", "type": "text"}],
           "model": {"type": "transformer", "params": {"max_length": 16}, "pretrained_uri": tiny.as_uri()},
           **overrides}
    return TrainingConfig.from_dict(raw)


def test_params_fill_defaults_and_name_the_bad_one() -> None:
    assert validate_transformer_params({}) == {"max_length": 128, "trainable": "all", "lora": None,
                                              "gradient_checkpointing": False, "max_new_tokens": 32}
    lora = validate_transformer_params({"trainable": "lora"})["lora"]
    assert lora == {"r": 8, "alpha": 16.0, "dropout": 0.0, "target_modules": None}
    with pytest.raises(FamilyParamsError, match=r"model.params.lora: LoRA settings need trainable: lora"):
        validate_transformer_params({"lora": {"r": 4}})
    with pytest.raises(FamilyParamsError, match=r"model.params.max_length: a whole number from 8 to 8192, got 4"):
        validate_transformer_params({"max_length": 4})
    with pytest.raises(FamilyParamsError, match=r"model.params.lora.target_modules.0: a module name"):
        validate_transformer_params({"trainable": "lora", "lora": {"target_modules": ["c_attn; rm -rf"]}})
    assert isinstance(load_family("transformer"), TransformerFamily)


def test_the_tiny_model_writes_the_same_bytes_twice(tmp_path: Path, tiny: Path) -> None:
    again = write_tiny_model(tmp_path / "again", TEXTS, n_positions=64)
    assert file_digests(again) == file_digests(tiny)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(file_digests(tiny))


def test_causal_lm_sequences_train_on_the_completion_only(tmp_path: Path, tiny: Path) -> None:
    frame = pd.DataFrame({"prompt": ["my invoice", "the app", "refund", "login"],
                          "answer": [" billing", " tech", " billing", None]})
    split = read_splits(_config(tmp_path, tiny, frame, checkpoint={"root_uri": (tmp_path / "ck").as_uri(),
                                                                   "keep_best": False}), text_tokenizer_of)
    inputs, targets = split.train
    assert inputs.shape == targets.shape == (4, 16) and inputs.dtype == np.float32 and targets.dtype == np.int64
    tokenizer = split.transformer.text_tokenizer.tokenizer
    eos = tokenizer.eos_token_id
    for row, (prompt, answer) in enumerate(zip(frame["prompt"], frame["answer"], strict=True)):
        prompt_ids = tokenizer(prompt)["input_ids"]
        tail = (tokenizer(answer, add_special_tokens=False)["input_ids"] if isinstance(answer, str) else []) + [eos]
        tokens = prompt_ids + tail
        np.testing.assert_array_equal(inputs[row, :len(tokens)], np.asarray(tokens) + 1)
        assert (inputs[row, len(tokens):] == 0).all()
        # Position t predicts token t + 1: the prompt's positions but its last are ignored, and the padding.
        expected = np.full(16, IGNORED_TARGET)
        expected[len(prompt_ids) - 1:len(tokens) - 1] = tail
        np.testing.assert_array_equal(targets[row], expected)


def test_plain_lm_trains_on_every_next_token_and_long_texts_are_cut(tmp_path: Path, tiny: Path) -> None:
    long = " ".join(TEXTS[:3])
    frame = pd.DataFrame({"text": ["refund my invoice", long]})
    config = _config(tmp_path, tiny, frame, features=["text"], label="", transforms=[{"feature": "text", "type": "text"}],
                     checkpoint={"root_uri": (tmp_path / "ck").as_uri(), "keep_best": False})
    inputs, targets = read_splits(config, text_tokenizer_of).train
    n = int((inputs[0] > 0).sum())
    np.testing.assert_array_equal(targets[0, :n - 1], inputs[0, 1:n] - 1)
    assert (targets[0, n - 1:] == IGNORED_TARGET).all()
    assert (inputs[1] > 0).all() and (targets[1, :15] >= 0).all() and targets[1, 15] == IGNORED_TARGET


def test_prompts_that_fill_max_length_leave_nothing_to_train_on(tmp_path: Path, tiny: Path) -> None:
    frame = pd.DataFrame({"prompt": [" ".join(TEXTS[:4])] * 4, "answer": [" billing"] * 4})
    with pytest.raises(TrainerDataError, match=r"no row has a token to train on within model.params.max_length "
                                               r"\(16\).*raise max_length or shorten the prompts in 'prompt'"):
        read_splits(_config(tmp_path, tiny, frame), text_tokenizer_of)


def test_causal_lm_needs_a_family_that_tokenises(tmp_path: Path, tiny: Path) -> None:
    frame = pd.DataFrame({"prompt": ["a b"], "answer": ["c"]})
    with pytest.raises(TrainerInputError, match=r"task: causal_lm needs a model family that tokenises text"):
        read_splits(_config(tmp_path, tiny, frame, model={"type": "text_bag"}), text_tokenizer_of)


def test_the_token_loss_is_the_mean_over_target_tokens_only() -> None:
    # Two rows of three positions, vocabulary 2: logits (0, log 3) give p(1) = 3/4.
    logits = torch.tensor([[0.0, math.log(3.0)]]).expand(2, 3, 2).contiguous()
    targets = torch.tensor([[1, 0, IGNORED_TARGET], [IGNORED_TARGET, IGNORED_TARGET, 1]])
    expected = (2 * -math.log(0.75) - math.log(0.25)) / 3
    assert float(token_cross_entropy_loss(logits, targets)) == pytest.approx(expected)
    config = TrainingConfig.from_dict({"pipeline_id": "t", "train_data_uri": "x", "task": "causal_lm",
                                       "features": ["t"], "label": "", "checkpoint": {"root_uri": "file:///x"},
                                       "output_uri": "x"})
    assert make_loss_fn(config) is token_cross_entropy_loss
    # A batch without targets trains nothing (no NaN).
    assert float(token_cross_entropy_loss(logits, torch.full((2, 3), IGNORED_TARGET))) == 0.0


def test_token_metrics_are_token_weighted() -> None:
    losses = torch.tensor([0.5, 1.0, 1.5, 3.0], dtype=torch.float64)
    hits = torch.tensor([1.0, 1.0, 0.0, 1.0], dtype=torch.float64)
    assert task_metrics("causal_lm", losses, hits) == {"validation_perplexity": pytest.approx(math.exp(1.5)),
                                                       "validation_token_accuracy": 0.75}


def _description(tmp_path: Path, tiny: Path, **overrides) -> tuple[TrainingConfig, DataDescription]:
    frame = pd.DataFrame({"subject": ["refund", "crash", "invoice", "login"], "body": TEXTS[38:42],
                          "label": ["billing", "tech", "billing", "tech"]})
    config = _config(tmp_path, tiny, frame, task="multiclass_classification", features=["subject", "body"],
                     label="label", transforms=[{"feature": "subject", "type": "text"},
                                                {"feature": "body", "type": "text"}],
                     checkpoint={"root_uri": (tmp_path / "ck").as_uri(), "keep_best": False}, **overrides)
    split = read_splits(config, text_tokenizer_of)
    return config, DataDescription.of(config.task, split.transformer, split.classes)


def test_a_classifier_builds_the_same_weights_from_the_same_seed_and_reads_both_texts(
        tmp_path: Path, tiny: Path) -> None:
    from trainpipe_trainer.serving.export import weights_sha256

    config, data = _description(tmp_path, tiny)
    family = TransformerFamily()
    params = family.validate_params(config.model.params)
    built = []
    for _ in range(2):
        torch.manual_seed(0)
        built.append(family.build(config.model, params, data))
    assert weights_sha256(built[0]) == weights_sha256(built[1])
    torch.manual_seed(1)
    assert weights_sha256(family.build(config.model, params, data)) != weights_sha256(built[0])
    assert data.n_inputs == 32 and data.n_outputs == 2
    inputs = torch.zeros(3, 32)
    inputs[0, :2], inputs[0, 16:18] = torch.tensor([5.0, 6.0]), torch.tensor([7.0, 8.0])
    # The second text's tokens follow the first's: the same as written without the padding between them.
    inputs[1, :4] = torch.tensor([5.0, 6.0, 7.0, 8.0])
    built[0].eval()
    with torch.no_grad():
        logits = built[0](inputs)  # row 2 has no tokens at all: still finite
    assert logits.shape == (3, 2) and torch.isfinite(logits).all()
    torch.testing.assert_close(logits[0], logits[1])


def test_head_only_and_lora_train_what_they_say(tmp_path: Path, tiny: Path) -> None:
    config, data = _description(tmp_path, tiny)
    family = TransformerFamily()
    head = family.build(config.model, family.validate_params({"max_length": 16, "trainable": "head"}), data)
    assert {n for n, p in head.named_parameters() if p.requires_grad} == {"model.score.weight"}
    lora = family.build(config.model, family.validate_params(
        {"max_length": 16, "trainable": "lora", "lora": {"r": 2, "target_modules": ["c_attn"]}}), data)
    trainable = {n for n, p in lora.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n or "score" in n for n in trainable)
    assert any("lora_A" in n for n in trainable)


def test_the_family_imports_without_transformers_and_says_how_to_install_it(tmp_path: Path, tiny: Path) -> None:
    code = (
        "import sys; sys.modules['transformers'] = None\n"
        "from trainpipe_trainer.models.transformer.loading import import_transformers\n"
        "from trainpipe_trainer.models import load_family\n"
        "load_family('transformer')\n"
        "try:\n    import_transformers()\nexcept Exception as err:\n    print(type(err).__name__, err)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120).stdout
    assert out.strip() == ("TrainerInputError model.type: transformer needs Hugging Face transformers in the trainer's "
                           "environment: pip install 'trainpipe-trainer[transformers]'")


def test_the_pretrained_folder_is_copied_from_object_storage_and_hashed(tiny: Path, s3_bucket: Any) -> None:
    from trainpipe_trainer import storage
    from trainpipe_trainer.models.transformer.pretrained import folder_sha256, pretrained_folder

    fs, _ = storage.url_to_fs(s3_bucket.uri("models/tiny"), s3_bucket.storage_options)
    for path in sorted(tiny.iterdir()):
        fs.put_file(str(path), f"{s3_bucket.bucket}/models/tiny/{path.name}")
    copied = pretrained_folder(s3_bucket.uri("models/tiny"), s3_bucket.storage_options)
    assert file_digests(copied.path) == file_digests(tiny)
    assert copied.sha256 == folder_sha256(tiny)
    assert copied.uri == s3_bucket.uri("models/tiny")
    with pytest.raises(TrainerInputError, match=r"model.pretrained_uri: s3://.*/models/none is not a folder"):
        pretrained_folder(s3_bucket.uri("models/none"), s3_bucket.storage_options)


def test_a_local_folder_is_read_in_place_and_copies_of_killed_processes_are_removed(tiny: Path, tmp_path: Path,
                                                                                    monkeypatch: Any) -> None:
    """Weights are large: a local folder is not copied, and a copy left by a process killed with -9 (no atexit)
    is removed by the next process that copies, while a running process's copy stays."""
    from trainpipe_trainer.models.transformer import pretrained

    assert pretrained.pretrained_folder(tiny.as_uri(), {}).path == tiny

    monkeypatch.setattr(pretrained, "COPIES_ROOT", tmp_path / "copies")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True).stdout.strip()
    left_behind = tmp_path / "copies" / f"{gone}-abc"
    (left_behind / "weights").mkdir(parents=True)
    running = tmp_path / "copies" / f"{os.getppid()}-def"
    running.mkdir()

    mine = pretrained._own_copy_folder()

    assert not left_behind.exists() and running.exists()
    assert mine.parent == tmp_path / "copies" and mine.name.startswith(f"{os.getpid()}-")


def test_tokenised_splits_are_kept_beside_the_snapshot_and_read_back(tmp_path: Path, tiny: Path) -> None:
    """A retry or a trial reads the ids tokenised before: the file under <snapshot>/tokenized/ is what the second
    read returns (proved by changing it), and another max_length (a new key) tokenises again."""
    from trainpipe_trainer.data.splits import TOKENIZED_FOLDER

    frame = pd.DataFrame({"prompt": ["my invoice", "the app", "refund", "login"] * 4,
                          "answer": [" billing", " tech", " billing", " account"] * 4})
    config = _config(tmp_path, tiny, frame, dataset_digest="d" * 64)
    first = read_splits(config, text_tokenizer_of)
    [kept] = (tmp_path / TOKENIZED_FOLDER).iterdir()

    with np.load(kept) as stored:
        arrays = {name: stored[name].copy() for name in stored.files}
    assert sorted(arrays) == ["train_0", "train_1", "validation_0", "validation_1"]
    np.testing.assert_array_equal(arrays["train_0"], first.train[0])
    np.testing.assert_array_equal(arrays["validation_1"], first.validation[1])
    arrays["train_1"][:, 0] = 7  # a mark only the kept file has
    np.savez(kept, **arrays)
    again = read_splits(config, text_tokenizer_of)
    assert (again.train[1][:, 0] == 7).all()
    np.testing.assert_array_equal(again.validation[0], first.validation[0])

    longer = _config(tmp_path, tiny, frame, dataset_digest="d" * 64,
                     model={"type": "transformer", "params": {"max_length": 24}, "pretrained_uri": tiny.as_uri()})
    assert read_splits(longer, text_tokenizer_of).train[0].shape[1] == 24
    assert len(list((tmp_path / TOKENIZED_FOLDER).iterdir())) == 2
    # Without a dataset digest (a hand-written config) nothing is kept.
    (tmp_path / "other").mkdir()
    read_splits(_config(tmp_path / "other", tiny, frame), text_tokenizer_of)
    assert not (tmp_path / "other" / TOKENIZED_FOLDER).exists()


def test_a_causal_lm_whose_generation_would_run_past_the_model_s_positions_is_refused_before_training(
        tmp_path: Path, tiny: Path) -> None:
    """The tiny model has 64 positions: prompts of up to 48 tokens and 32 new ones would fail at the export, after
    the whole training; the build says so first."""
    frame = pd.DataFrame({"prompt": ["my invoice", "the app"] * 4, "answer": [" billing", " tech"] * 4})
    config = _config(tmp_path, tiny, frame, model={"type": "transformer", "pretrained_uri": tiny.as_uri(),
                                                   "params": {"max_length": 48, "max_new_tokens": 32}})
    split = read_splits(config, text_tokenizer_of)
    family = TransformerFamily()
    with pytest.raises(TrainerInputError, match=r"model.params: max_length \(48\) \+ max_new_tokens \(32\) are more "
                                                r"positions than the pretrained model has \(64\); lower one of them"):
        family.build(config.model, family.validate_params(config.model.params),
                     DataDescription.of(config.task, split.transformer, split.classes))
