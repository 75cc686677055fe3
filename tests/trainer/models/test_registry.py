"""The family registry: built-ins by name, others only through the entry-point group, never a module path."""

from __future__ import annotations

import pytest

from trainpipe_trainer.config import BUILT_IN_MODEL_TYPES, ModelConfig, TrainerConfigError
from trainpipe_trainer.models import (
    _BUILT_IN,
    DataDescription,
    FamilyNotFoundError,
    FamilyParamsError,
    family_provenance,
    load_family,
)
from trainpipe_trainer.models.mlp import MLPFamily


def test_every_built_in_name_has_its_family():
    assert tuple(_BUILT_IN) == BUILT_IN_MODEL_TYPES
    assert isinstance(load_family("mlp"), MLPFamily)


@pytest.mark.parametrize("name", ["os.path:join", "trainpipe_trainer.models.mlp", "../acme", "Acme", "x" * 65])
def test_a_module_or_path_is_no_family_name(name):
    with pytest.raises(TrainerConfigError, match="model.type: a model family's name"):
        ModelConfig(type=name)
    with pytest.raises(FamilyNotFoundError, match="is not a model family name"):
        load_family(name)


def test_a_family_no_package_registers_names_what_is_installed_and_the_fix():
    with pytest.raises(FamilyNotFoundError) as raised:
        load_family("acme_nowhere")
    message = str(raised.value)
    assert "no model family 'acme_nowhere' is installed here (installed: mlp" in message
    assert "'trainpipe.models' entry-point group" in message and "Airflow worker's environment" in message


def test_the_mlp_takes_no_params_and_builds_one_output_per_class():
    family = load_family("mlp")
    with pytest.raises(FamilyParamsError, match=r"model.params.depth: this model family takes no parameters"):
        family.validate_params({"depth": 3})
    data = DataDescription(task="multiclass_classification", input_names=("a", "b=x", "b=y"),
                           input_features=("a", "b", "b"), classes=("p", "q", "r", "s"))
    module = family.build(ModelConfig(hidden_layers=(5,)), {}, data)
    assert module[-1].out_features == 4 and module[0].in_features == 3
    assert data.inputs_of(["b"]) == [1, 2]


def test_a_built_in_family_comes_from_the_trainer_distribution():
    provenance = family_provenance("mlp")
    assert provenance["family"] == "mlp" and provenance["distribution"] == "trainpipe-trainer"
    assert provenance["version"] and provenance["sha256"]
