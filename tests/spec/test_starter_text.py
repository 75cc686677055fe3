"""`trainpipe init --data` on a table with free text: a string column of mostly distinct values of 4 words or more on
average is proposed as `{type: text}` with the text_bag family; short or repeated strings stay categorical."""

from __future__ import annotations

import numpy as np
import pandas as pd
import yaml

from trainpipe.spec.starter import is_free_text, write_starter_spec

WORDS = ["the", "order", "came", "late", "great", "box", "thanks", "refund", "please", "ok", "never", "again"]


def _table(n: int = 400) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    return pd.DataFrame({
        "review": [" ".join(rng.choice(WORDS, rng.integers(4, 12))) for _ in range(n)],
        "country": rng.choice(["fr", "de", "us"], n),
        # Long, but one of three sentences: a category.
        "plan": rng.choice(["free plan with ads", "basic monthly plan without ads", "family plan for five people"], n),
        "amount": rng.normal(50, 10, n),
        "churned": rng.integers(0, 2, n),
    })


def test_free_text_is_long_and_mostly_distinct():
    table = _table()
    assert is_free_text(table["review"])
    assert not is_free_text(table["country"]) and not is_free_text(table["plan"])
    assert not is_free_text(pd.Series([f"id-{i}" for i in range(100)]))  # distinct, but one word
    assert not is_free_text(pd.Series([None, None], dtype=object))


def test_init_proposes_text_with_the_text_bag_family(tmp_path):
    path = write_starter_spec("reviews", task="binary_classification", directory=tmp_path, data="r/table.parquet",
                              label="churned", table=_table())  # validates the spec it writes

    training = yaml.safe_load(path.read_text())["training"]
    assert training["model"] == {"type": "text_bag", "params": {"embedding_dim": 64, "hidden_layers": []}}
    assert training["features"] == ["amount", "country", "plan", "review"]
    assert training["transforms"]["review"] == {"type": "text"}
    assert training["transforms"]["plan"]["type"] == "categorical"


def test_a_table_without_free_text_keeps_the_mlp(tmp_path):
    path = write_starter_spec("plain", task="binary_classification", directory=tmp_path, data="r/table.parquet",
                              label="churned", table=_table().drop(columns=["review"]))

    text = path.read_text()
    assert "  model:\n    type: mlp\n    hidden_layers: [64, 32]\n" in text
    assert "type: text" not in text and "text_bag" not in text
