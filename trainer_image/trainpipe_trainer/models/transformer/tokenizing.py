"""Text -> token ids with the pretrained folder's own tokenizer: the inputs of the ``transformer`` family.

numpy only around the Hugging Face tokenizer (a Rust tokenizer, deterministic): the trainer encodes each split
once, and the served model encodes raw text with the same code. A text's inputs are the ids + 1 of its first
``max_length`` tokens (0 pads, as the harness's hashed text ids).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trainpipe_trainer.preprocessing import IGNORED_TARGET


def _texts(values: np.ndarray) -> list[str]:
    """A column's values as text: a missing value is the empty text."""
    out = []
    for value in values:
        if value is None or (isinstance(value, float) and np.isnan(value)):
            out.append("")
        else:
            out.append(value if isinstance(value, str) else str(value))
    return out


@dataclass(kw_only=True, slots=True, frozen=True)
class PretrainedTokenizer:
    """``preprocessing.TextTokenizer`` over a Hugging Face tokenizer loaded from ``folder``."""

    folder: Path
    tokenizer: Any  # a transformers tokenizer (fast)
    max_length: int
    # Where the folder came from (``model.pretrained_uri``) and the sha256 over its files; "" when served.
    uri: str = ""
    sha256: str = ""

    @classmethod
    def load(cls, folder: Path, *, max_length: int, uri: str = "", sha256: str = "") -> PretrainedTokenizer:
        from trainpipe_trainer.models.transformer.loading import quiet_transformers

        with quiet_transformers() as transformers:
            tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
        return cls(folder=folder, tokenizer=tokenizer, max_length=max_length, uri=uri, sha256=sha256)

    @property
    def vocabulary_size(self) -> int:
        """Ids a module must embed: the tokenizer's and the padding id."""
        return len(self.tokenizer) + 1

    @property
    def eos_token_id(self) -> int | None:
        return self.tokenizer.eos_token_id

    def token_ids(self, texts: list[str], *, special: bool, limit: int | None = None) -> list[list[int]]:
        if not texts:
            return []
        encoded = self.tokenizer(texts, add_special_tokens=special, truncation=limit is not None, max_length=limit)
        return [list(ids) for ids in encoded["input_ids"]]

    def encode(self, texts: np.ndarray) -> np.ndarray:
        """float64 ``[rows, max_length]``: each text's first tokens (the tokenizer's special tokens included),
        ids + 1, 0 after its end."""
        out = np.zeros((len(texts), self.max_length), dtype=np.float64)
        for row, ids in enumerate(self.token_ids(_texts(texts), special=True, limit=self.max_length)):
            out[row, :len(ids)] = np.asarray(ids, dtype=np.float64) + 1
        return out

    def sequences(self, texts: np.ndarray, completions: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """One sequence per row: the text's tokens (special tokens included), then the completion's and the end
        token, cut to ``max_length``. Inputs float64 ``[rows, max_length]`` (ids + 1, 0 pads); targets int64
        ``[rows, max_length]``: at position t the token at t + 1 where that token is trained on (a completion's,
        or, without completions, every token after the first), else ``IGNORED_TARGET``."""
        eos = [] if self.eos_token_id is None else [int(self.eos_token_id)]
        prompts = self.token_ids(_texts(texts), special=True, limit=self.max_length)
        if completions is None:
            tails: list[list[int]] = [[] for _ in prompts]
        else:
            tails = self.token_ids(_texts(completions), special=False, limit=self.max_length)
        inputs = np.zeros((len(prompts), self.max_length), dtype=np.float64)
        targets = np.full((len(prompts), self.max_length), IGNORED_TARGET, dtype=np.int64)
        for row, (prompt, tail) in enumerate(zip(prompts, tails, strict=True)):
            tokens = (prompt + tail + eos)[:self.max_length]
            # The first trained-on token: the completion's first, or (no completions) the text's second.
            first = 1 if completions is None else max(len(prompt), 1)
            inputs[row, :len(tokens)] = np.asarray(tokens, dtype=np.float64) + 1
            if len(tokens) > first:
                targets[row, first - 1:len(tokens) - 1] = tokens[first:]
        return inputs, targets
