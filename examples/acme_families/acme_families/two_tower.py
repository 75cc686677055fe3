"""``acme_two_tower``: a user tower and an item (merchant) tower, each a small network over its own features,
scored by the dot product of their embeddings plus a bias.

One score per row, so it trains binary classification, regression and ranking (a query tower and a document
tower); a multiclass task is refused before any step. The harness does the rest: the loss for the task,
backward and the optimizer step, DDP or DeepSpeed, checkpoints, and serving through torch (no ``export``).

No torch at import: checking ``model.params`` needs none (the network is in ``acme_families.network``).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from trainpipe_trainer.errors import TrainerInputError
from trainpipe_trainer.models import DataDescription, FamilyParamsError, ModelFamily

if TYPE_CHECKING:
    from torch import nn

    from trainpipe_trainer.config import ModelConfig

FAMILY = "acme_two_tower"
SCORED_TASKS = ("binary_classification", "regression", "ranking")
# name -> (default, upper bound). Bounded because the local launcher trains on a shared worker.
_SIZES = {"embedding_dim": (16, 1024), "tower_hidden": (32, 4096)}
_TOWERS = ("user_features", "item_features")
_KNOWN = (*_TOWERS, *_SIZES)


class TwoTowerTaskError(TrainerInputError):
    """The spec's task needs more than the one score a dot product gives."""


class TwoTowerFamily(ModelFamily):

    def validate_params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        for key in params:
            if key not in _KNOWN:
                close = difflib.get_close_matches(str(key), _KNOWN, n=1)
                hint = f"did you mean `{close[0]}`?" if close else f"the parameters are {', '.join(_KNOWN)}"
                raise FamilyParamsError(str(key), f"{FAMILY} has no such parameter; {hint}")
        checked: dict[str, Any] = {tower: _feature_list(params, tower) for tower in _TOWERS}
        users = set(checked["user_features"])
        for position, feature in enumerate(checked["item_features"]):
            if feature in users:
                raise FamilyParamsError(f"item_features[{position}]", f"{feature!r} is also in user_features; each "
                                        "feature feeds one tower: remove it from one of them")
        for name, (default, upper) in _SIZES.items():
            value = params.get(name, default)
            # bool is an int in Python; `embedding_dim: true` is a typo, not 1.
            if not isinstance(value, int) or isinstance(value, bool):
                raise FamilyParamsError(name, f"must be a whole number, got {value!r}")
            if not 1 <= value <= upper:
                raise FamilyParamsError(name, f"must be between 1 and {upper}, got {value}")
            checked[name] = value
        return checked

    def build(self, model: ModelConfig, params: dict[str, Any], data: DataDescription) -> nn.Module:
        if data.task not in SCORED_TASKS:
            raise TwoTowerTaskError(
                f"training.task: {FAMILY} gives one score per row (a dot product), so it cannot train {data.task} "
                f"({data.n_outputs} outputs); it trains {', '.join(SCORED_TASKS)}: use model.type mlp for this task")
        trained = set(data.input_features)
        for tower in _TOWERS:
            for position, feature in enumerate(params[tower]):
                if feature not in trained:
                    raise FamilyParamsError(f"{tower}[{position}]", f"{feature!r} is not one of training.features "
                                            f"({', '.join(dict.fromkeys(data.input_features))}); add it there")
        # A feature no tower reads would still be required from every caller of the served model, for nothing.
        unused = [feature for feature in dict.fromkeys(data.input_features)
                  if feature not in params["user_features"] and feature not in params["item_features"]]
        if unused:
            raise FamilyParamsError("", f"training.features {', '.join(map(repr, unused))} feed neither tower: add "
                                    "each to user_features or item_features, or remove it from training.features")
        from acme_families.network import TwoTower

        return TwoTower(user_inputs=data.inputs_of(params["user_features"]),
                        item_inputs=data.inputs_of(params["item_features"]),
                        embedding_dim=params["embedding_dim"], tower_hidden=params["tower_hidden"])


def _feature_list(params: Mapping[str, Any], tower: str) -> list[str]:
    if tower not in params:
        raise FamilyParamsError(tower, "required: the raw feature columns (from training.features) of this tower")
    features = params[tower]
    if not isinstance(features, list) or not features:
        raise FamilyParamsError(tower, f"must be a non-empty list of feature names, got {features!r}")
    seen: set[str] = set()
    for position, feature in enumerate(features):
        if not isinstance(feature, str) or not feature:
            raise FamilyParamsError(f"{tower}[{position}]", f"must be a feature name, got {feature!r}")
        if feature in seen:
            raise FamilyParamsError(f"{tower}[{position}]", f"{feature!r} is listed twice")
        seen.add(feature)
    return list(features)
