"""The built-in text_bag family before launch: its params are checked again by the family in the worker's
environment (a trainer newer than the spec's check may refuse more), each refusal at the spec's line."""

from __future__ import annotations

import dataclasses

from tests.steps.train.test_model_family_before_launch import _plan, _refusal, storage  # noqa: F401 (a fixture)


def test_text_bag_params_are_located_before_launch(tmp_path, storage, monkeypatch):  # noqa: F811
    plan = _plan(tmp_path, {"type": "text_bag", "params": {"embedding_dim": 16, "hidden_layers": [8]}})
    assert {key for key in plan.inputs_declared_at if key.startswith("model")} == {
        "model.params", "model.params.embedding_dim", "model.params.hidden_layers"}

    # What the spec check let through, the family refuses here: a trainer whose bound is lower.
    from trainpipe.steps.train import train

    config_for_run = train.trainer_config_for_run

    def tightened(*args, **kwargs):
        config = config_for_run(*args, **kwargs)
        model = dataclasses.replace(config.model, params={**config.model.params, "hidden_layers": [8, 0]})
        return dataclasses.replace(config, model=model)

    monkeypatch.setattr("tests.steps.train.test_model_family_before_launch.trainer_config_for_run", tightened)

    field, line, message = _refusal(tmp_path, {"type": "text_bag", "params": {"embedding_dim": 16,
                                                                              "hidden_layers": [8]}})
    # Below a top-level key: named whole, placed at that key's line.
    assert (field, line) == ("training.model.params.hidden_layers[1]", "hidden_layers:")
    assert message.startswith("a width from 1 to")
