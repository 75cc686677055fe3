"""``trainpipe reproduce`` of a version trained with a model family: refused before anything is read or trained when
the installed family is another distribution or version than the one the version records, naming both."""

from __future__ import annotations

import pytest
import yaml

from trainpipe.errors import ReproduceError, TrainpipeError
from trainpipe.plan.tracking import (
    MODEL_FAMILY_DISTRIBUTION_TAG,
    MODEL_FAMILY_SHA256_TAG,
    MODEL_FAMILY_TAG,
    MODEL_FAMILY_VERSION_TAG,
)
from trainpipe.settings import Settings
from trainpipe.steps.train import reproduce as reproducing
from trainpipe.steps.train.reproduce import Lineage, check_model_family

SPEC = {
    "pipeline_id": "tabular",
    "data": {"uri": "tabular.parquet"},
    "training": {"task": "regression", "features": ["x1", "x2"], "label": "y",
                 "model": {"type": "acme_tabnet", "params": {"depth": 3}}},
    "evaluation": {"metrics": ["rmse"]},
    "registration": {"model_name": "tabular"},
}


def _lineage(**family: str) -> Lineage:
    return Lineage(model_name="tabular", version=4, alias="champion", mlflow_run_id="r4", dag_id="tabular",
                   dataset_digest="0" * 64, spec_file="tabular.yaml", spec_sha256="0" * 64,
                   spec_text=yaml.safe_dump(SPEC, sort_keys=False), seed=None, world_size=None, param_overrides={},
                   weights_sha256="0" * 64, model_family=family)


def _recorded(distribution: str, version: str, sha256: str = "1" * 64) -> dict[str, str]:
    return {MODEL_FAMILY_TAG: "acme_tabnet", MODEL_FAMILY_DISTRIBUTION_TAG: distribution,
            MODEL_FAMILY_VERSION_TAG: version, MODEL_FAMILY_SHA256_TAG: sha256}


def test_another_installed_version_is_refused_naming_both(install_family):
    family = install_family(version="1.5.0")

    with pytest.raises(ReproduceError) as refused:
        check_model_family(_lineage(**_recorded(family.distribution, "1.4.0")), "acme_tabnet")

    assert isinstance(refused.value, TrainpipeError)
    assert str(refused.value) == (
        "tabular version 4 was trained with model family 'acme_tabnet' from acme-tabnet 1.4.0; this environment "
        "has acme-tabnet 1.5.0: the weights would differ; install acme-tabnet==1.4.0 to reproduce it")


def test_another_distribution_registering_the_name_is_refused(install_family):
    install_family(version="1.4.0")

    with pytest.raises(ReproduceError, match=r"from tabnet-original 1\.4\.0; this environment has acme-tabnet "
                                             r"1\.4\.0"):
        check_model_family(_lineage(**_recorded("tabnet-original", "1.4.0")), "acme_tabnet")


def test_a_family_no_longer_installed_names_what_to_install():
    with pytest.raises(ReproduceError) as refused:
        check_model_family(_lineage(**_recorded("acme-tabnet", "1.4.0")), "acme_tabnet")

    message = str(refused.value)
    assert message.startswith("tabular version 4 was trained with model family 'acme_tabnet' from acme-tabnet 1.4.0, "
                              "which is not installed here (model.type: no model family 'acme_tabnet'")
    assert message.endswith("install acme-tabnet==1.4.0 to reproduce it")


def test_the_same_version_from_another_build_is_said_not_refused(install_family):
    family = install_family(version="1.4.0")

    assert check_model_family(_lineage(**_recorded(family.distribution, "1.4.0", family.record_sha256)),
                              "acme_tabnet") is None
    warning = check_model_family(_lineage(**_recorded(family.distribution, "1.4.0", "f" * 64)), "acme_tabnet")
    assert warning == (f"model family 'acme_tabnet': acme-tabnet 1.4.0 is installed, as recorded, but from another "
                       f"build (sha256 {family.record_sha256[:12]}, recorded ffffffffffff); the weights may differ")


def test_a_version_without_the_record_is_not_compared():
    # Registered before families were recorded (or trained on Kubernetes by a trainer that did not report it).
    assert check_model_family(_lineage(), "mlp") is None
    assert check_model_family(_lineage(**{MODEL_FAMILY_TAG: "acme_tabnet"}), "acme_tabnet") is None


def test_reproduce_refuses_before_reading_the_snapshot_or_training(tmp_path, monkeypatch, install_family):
    family = install_family(version="2.0.0")
    monkeypatch.delenv("TRAINPIPE_POLICY", raising=False)
    touched: list[str] = []
    monkeypatch.setattr(reproducing, "read_lineage", lambda client, reference: _lineage(
        **_recorded(family.distribution, "1.0.0")))
    monkeypatch.setattr(reproducing, "snapshot_by_digest", lambda *a, **k: touched.append("snapshot"))
    monkeypatch.setattr(reproducing, "run_training", lambda *a, **k: touched.append("training"))

    class Hook:
        client = None

    with pytest.raises(ReproduceError, match=r"from acme-tabnet 1\.0\.0; this environment has "
                                             r"acme-tabnet 2\.0\.0"):
        reproducing.reproduce("tabular/4", configs_root=tmp_path, settings=Settings.from_env(), hook=Hook(),
                              on_line=lambda line: None)
    assert touched == []
