"""``trainpipe init --task causal_lm``: a starter that validates, fine-tuning a transformer on a prompt and
completion; ``--data`` is refused for it, saying what to write instead."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml

from trainpipe.errors import SpecError
from trainpipe.spec.starter import write_starter_spec


def test_the_causal_lm_starter_fine_tunes_a_transformer_on_a_prompt_and_completion(tmp_path):
    path = write_starter_spec("assistant", task="causal_lm", directory=tmp_path)

    training = yaml.safe_load(path.read_text())["training"]
    assert training["model"]["type"] == "transformer" and training["model"]["pretrained"] == "models/base-lm"
    assert training["features"] == ["prompt"] and training["transforms"] == {"prompt": {"type": "text"}}
    assert training["label"] == "completion"
    assert (training["batch_size"], training["learning_rate"], training["epochs"]) == (32, 0.0001, 3)
    assert yaml.safe_load(path.read_text())["evaluation"]["gates"] == ["perplexity >= +0%"]


def test_a_table_is_refused_for_a_causal_lm_starter_and_nothing_is_written(tmp_path):
    table = pd.DataFrame({"prompt": ["a question"] * 20, "completion": ["an answer"] * 20})

    with pytest.raises(SpecError, match="--data is not supported yet; run it without --data"):
        write_starter_spec("assistant", task="causal_lm", directory=tmp_path, data="t.parquet", label="completion",
                           table=table)
    assert not (tmp_path / "assistant.yaml").exists()
