"""training.transforms: from the spec's short forms to the trainer config, raw columns everywhere else."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.support import REPO
from trainpipe.compile.compiler import compile_file
from trainpipe.settings import Settings
from trainpipe_trainer.config import FeatureTransform


def _spec(tmp_path: Path, transforms: dict) -> Path:
    spec = yaml.safe_load((REPO / "dag_configs" / "fraud_detector.yaml").read_text())
    spec["training"]["features"] = ["amount", "merchant_category", "income", "device"]
    spec["training"]["transforms"] = transforms
    spec["validation"]["expectations"] = []
    path = tmp_path / "dag_configs" / "t.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(spec))
    return path


def test_declared_transforms_reach_the_trainer_in_feature_order(tmp_path: Path) -> None:
    plan = compile_file(_spec(tmp_path, {
        "device": {"encode": "hashing", "hash_buckets": 8},          # categorical, inferred from encode
        "income": {"impute": "median", "missing_indicator": True, "transform": "log1p", "clip": [0, None]},
        "merchant_category": {"type": "categorical"},                # one_hot with the defaults
    }), settings=Settings.from_env())
    assert plan.trainer.transforms == (
        FeatureTransform(feature="merchant_category", type="categorical"),
        FeatureTransform(feature="income", impute="median", missing_indicator=True, clip_min=0.0, transform="log1p"),
        FeatureTransform(feature="device", type="categorical", encode="hashing", hash_buckets=8),
    )
    assert plan.trainer.feature_transforms()[0] == FeatureTransform(feature="amount")
    assert plan.trainer.transforms[0].max_categories == 20
    # Validation, evaluation and serving work on the raw columns.
    assert plan.trainer.features == ("amount", "merchant_category", "income", "device")
    assert plan.evaluation.features == plan.trainer.features
    assert set(plan.trainer.features) <= set(plan.validation.required_columns)


def test_a_plain_feature_list_needs_no_transforms() -> None:
    plan = compile_file(REPO / "dag_configs" / "search_ranker_nightly.yaml", settings=Settings.from_env())
    assert plan.trainer.transforms == ()
    assert all(t == FeatureTransform(feature=t.feature) for t in plan.trainer.feature_transforms())


def test_clip_mapping_and_list_forms_are_the_same(tmp_path: Path) -> None:
    as_list = compile_file(_spec(tmp_path, {"income": {"clip": [1, 5]}}), settings=Settings.from_env())
    (tmp_path / "dag_configs" / "t.yaml").unlink()
    (tmp_path / "dag_configs").rmdir()
    as_mapping = compile_file(_spec(tmp_path, {"income": {"clip": {"min": 1, "max": 5}}}), settings=Settings.from_env())
    assert as_list.trainer.transforms == as_mapping.trainer.transforms
    assert as_list.trainer.transforms[0].clip_min == 1.0 and as_list.trainer.transforms[0].clip_max == 5.0
