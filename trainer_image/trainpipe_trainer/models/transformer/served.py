"""The served ``transformer`` model: the fine-tuned ``save_pretrained`` folder (with its tokenizer) answering raw text.

Classifiers answer as every family's served model (``serving.outputs``): P(label = 1) for binary, the value for
regression, ``label`` and ``probability_<class>`` for multiclass. A causal LM answers ``completion``: the greedy
continuation (at most ``max_new_tokens`` tokens, deterministic) of the text column; with the predict param
``{"score": "token_loss"}`` it answers, per row of text (and completion, the label column), ``loss_sum`` (the
summed next-token cross-entropy over the row's target tokens, in nats), ``tokens`` (their number) and
``correct`` (how many of them were the most probable token): the issue's agreed names, what the evaluate step
reads. A holdout perplexity is ``exp(sum(loss_sum) / sum(tokens))``, its token accuracy
``sum(correct) / sum(tokens)``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from trainpipe_trainer.config import COMPLETION_COLUMN, TOKEN_SCORE_COLUMNS, TOKEN_SCORE_PARAMS
from trainpipe_trainer.errors import TrainerDataError
from trainpipe_trainer.models.transformer.loading import quiet_transformers
from trainpipe_trainer.models.transformer.network import CAUSAL_LM, TransformerNetwork
from trainpipe_trainer.models.transformer.tokenizing import PretrainedTokenizer
from trainpipe_trainer.preprocessing import IGNORED_TARGET, TargetScaler
from trainpipe_trainer.serving.outputs import scores_from_outputs, served_prediction

FORMAT_VERSION = 1
MODEL_ARTIFACT = "model"  # the save_pretrained folder (weights, config, tokenizer)
META_ARTIFACT = "meta"  # trainpipe.json: task, columns, classes, lengths, where the weights started from
LOSS_SUM_COLUMN, TOKENS_COLUMN, CORRECT_COLUMN = TOKEN_SCORE_COLUMNS
# Predict params (MLflow pyfunc ``params``): what a causal LM answers.
((SCORE_PARAM, TOKEN_LOSS_SCORE),) = TOKEN_SCORE_PARAMS.items()
SCORES = (COMPLETION_COLUMN, TOKEN_LOSS_SCORE)
DEFAULT_PARAMS = {SCORE_PARAM: "completion"}
BATCH_ROWS = 32


@dataclass(kw_only=True, slots=True)
class TransformerScorer:
    meta: dict[str, Any]
    tokenizer: PretrainedTokenizer
    network: TransformerNetwork  # in eval mode

    @classmethod
    def from_artifacts(cls, artifacts: dict[str, str]) -> TransformerScorer:
        meta = json.loads(Path(artifacts[META_ARTIFACT]).read_text(encoding="utf-8"))
        if meta.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"{artifacts[META_ARTIFACT]}: format {meta.get('format_version')!r}, this code reads "
                             f"{FORMAT_VERSION}")
        folder = Path(artifacts[MODEL_ARTIFACT])
        causal = meta["task"] == CAUSAL_LM
        with quiet_transformers() as transformers:
            auto = transformers.AutoModelForCausalLM if causal else transformers.AutoModelForSequenceClassification
            model = auto.from_pretrained(str(folder), dtype=torch.float32)
        model.eval()
        tokenizer = PretrainedTokenizer.load(folder, max_length=meta["max_length"])
        network = TransformerNetwork(model, pad_token_id=int(model.config.pad_token_id or 0), causal=causal)
        return cls(meta=meta, tokenizer=tokenizer, network=network.eval())

    @property
    def task(self) -> str:
        return self.meta["task"]

    def prediction(self, frame: pd.DataFrame, params: dict[str, Any] | None = None) -> np.ndarray | pd.DataFrame:
        missing = [c for c in self.meta["features"] if c not in frame.columns]
        if missing:
            raise TrainerDataError(f"model input: missing text column(s) {', '.join(map(repr, missing))}")
        score = (params or {}).get(SCORE_PARAM) or DEFAULT_PARAMS[SCORE_PARAM]
        if self.task != CAUSAL_LM:
            return self._classify(frame)
        if score not in SCORES:
            raise TrainerDataError(f"params.{SCORE_PARAM}: one of {', '.join(SCORES)}, got {score!r}")
        if score == TOKEN_LOSS_SCORE:
            return self._token_loss(frame)
        return self._generate(frame)

    def _logits(self, inputs: np.ndarray) -> np.ndarray:
        outputs = []
        with torch.no_grad():
            for begin in range(0, len(inputs), BATCH_ROWS):
                batch = torch.from_numpy(inputs[begin:begin + BATCH_ROWS].astype(np.float32))
                outputs.append(self.network(batch).double().numpy())
        return np.concatenate(outputs) if outputs else np.zeros((0, 1))

    def _classify(self, frame: pd.DataFrame) -> np.ndarray | pd.DataFrame:
        # The training inputs: each text column encoded to max_length, in feature order.
        inputs = np.concatenate([self.tokenizer.encode(frame[c].to_numpy(dtype=object))
                                 for c in self.meta["features"]], axis=1)
        outputs = self._logits(inputs).reshape(len(frame), -1)
        scores = scores_from_outputs(self.task, outputs, target=TargetScaler.from_dict(self.meta.get("target")))
        return served_prediction(self.task, scores, classes=tuple(self.meta["classes"]), index=frame.index)

    def _token_loss(self, frame: pd.DataFrame) -> pd.DataFrame:
        label = self.meta["label"]
        if label and label not in frame.columns:
            raise TrainerDataError(f"model input: score token_loss needs the completion column {label!r}")
        completions = frame[label].to_numpy(dtype=object) if label else None
        inputs, targets = self.tokenizer.sequences(frame[self.meta["features"][0]].to_numpy(dtype=object), completions)
        losses = np.zeros(len(frame), dtype=np.float64)
        correct = np.zeros(len(frame), dtype=np.int64)
        with torch.no_grad():
            for begin in range(0, len(inputs), BATCH_ROWS):
                batch = torch.from_numpy(inputs[begin:begin + BATCH_ROWS].astype(np.float32))
                wanted = torch.from_numpy(targets[begin:begin + BATCH_ROWS])
                logits = self.network(batch).float()
                per_token = torch.nn.functional.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]), wanted.reshape(-1), ignore_index=IGNORED_TARGET,
                    reduction="none").reshape(wanted.shape)
                losses[begin:begin + len(batch)] = per_token.double().sum(dim=1).numpy()
                right = (logits.argmax(dim=-1) == wanted) & (wanted != IGNORED_TARGET)
                correct[begin:begin + len(batch)] = right.sum(dim=1).numpy()
        counts = (targets != IGNORED_TARGET).sum(axis=1).astype(np.int64)
        return pd.DataFrame({LOSS_SUM_COLUMN: losses, TOKENS_COLUMN: counts, CORRECT_COLUMN: correct},
                            index=frame.index)

    def _generate(self, frame: pd.DataFrame) -> pd.DataFrame:
        tokenizer, model = self.tokenizer, self.network.model
        texts = frame[self.meta["features"][0]].to_numpy(dtype=object)
        start = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else self.network.pad_token_id
        completions = []
        with torch.no_grad(), quiet_transformers():
            for ids in tokenizer.token_ids([_text(t) for t in texts], special=True, limit=self.meta["max_length"]):
                prompt = torch.tensor([ids or [start]], dtype=torch.long)
                generated = model.generate(
                    input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=self.meta["max_new_tokens"],
                    do_sample=False, num_beams=1, pad_token_id=self.network.pad_token_id,
                    eos_token_id=tokenizer.eos_token_id, use_cache=True)
                new = generated[0, prompt.shape[1]:].tolist()
                completions.append(tokenizer.tokenizer.decode(new, skip_special_tokens=True))
        return pd.DataFrame({COMPLETION_COLUMN: completions}, index=frame.index)


def _text(value: Any) -> str:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return ""
    return value if isinstance(value, str) else str(value)
