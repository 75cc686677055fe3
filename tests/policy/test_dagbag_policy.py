"""Airflow's DagBag under a policy: compliant DAGs load with their team, each violator is its own import
error; the plan cache never serves a plan compiled without the policy; a broken policy refuses all."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.support import dag_bag
from trainpipe.settings import Settings

from .conftest import POLICY, REPO, compliant_spec

pytestmark = pytest.mark.integration


@pytest.fixture
def team_folders(configs: Path) -> dict[str, Path]:
    def write(name: str, spec: dict) -> Path:
        path = configs / name
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        return path

    search = yaml.safe_load((REPO / "dag_configs" / "search_ranker_nightly.yaml").read_text())
    greedy = compliant_spec("risk_greedy")
    greedy["training"]["kubernetes"]["image"] = "docker.io/attacker/miner:latest"
    squatter = dict(search, pipeline_id="risk_fraud_copy")  # a risk id in the search folder
    squatter["registration"] = {"model_name": "search_copy"}
    return {
        "risk_fraud": write("risk/fraud.yaml", compliant_spec("risk_fraud")),
        "search_ranker_nightly": write("search/ranker.yaml", search),
        "greedy": write("risk/greedy.yaml", greedy),
        "squatter": write("search/squatter.yaml", squatter),
    }


def test_compliant_dags_load_with_their_team_and_each_violator_is_its_own_import_error(team_folders, monkeypatch,
                                                                                     airflow_db):
    # Without the policy every spec loads (and fills the plan cache)...
    assert set(dag_bag().dag_ids) == {"risk_fraud", "search_ranker_nightly", "risk_greedy", "risk_fraud_copy"}

    # ...under it, the cached plans of the violators are not served.
    monkeypatch.setenv("TRAINPIPE_POLICY", str(POLICY))
    bag = dag_bag()
    assert set(bag.dag_ids) == {"risk_fraud", "search_ranker_nightly"}
    greedy, squatter = (str(team_folders[name].resolve()) for name in ("greedy", "squatter"))
    assert sorted(bag.import_errors) == sorted([greedy, squatter])
    assert bag.import_errors[greedy].startswith("dag_configs/risk/greedy.yaml:")
    assert "training.kubernetes.image: not allowed by policy (team risk, rule kubernetes.images): " \
           "'docker.io/attacker/miner:latest'" in bag.import_errors[greedy]
    assert "pipeline_id: not allowed by policy (team search, rule pipeline_id_prefix): 'risk_fraud_copy'" \
        in bag.import_errors[squatter]

    risk = bag.get_dag("risk_fraud")
    assert risk.owner == "risk" and "team:risk" in risk.tags
    assert risk.get_task("train").pool == "risk_gpu"
    assert risk.get_task("train").execution_timeout.total_seconds() == 12 * 3600
    assert risk.access_control == {"risk-ml": {"DAGs": {"can_read", "can_edit"}}}
    assert risk.max_active_runs == 1
    search = bag.get_dag("search_ranker_nightly")
    assert search.owner == "search" and "team:search" in search.tags
    assert search.get_task("train").pool == "default_pool"  # the search team names no pool


def test_a_broken_policy_refuses_every_spec_with_its_own_located_error(team_folders, monkeypatch, tmp_path,
                                                                      airflow_db):
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.read_text().replace('images: ["ghcr.io/trainpipe/trainer:*"]', "imagez: [x]"))
    monkeypatch.setenv("TRAINPIPE_POLICY", str(policy))
    bag = dag_bag()
    assert bag.dag_ids == []
    assert len(bag.import_errors) == 4
    for message in bag.import_errors.values():
        assert "refused: the platform policy (TRAINPIPE_POLICY) is invalid" in message
        assert "policy.yaml:9:7: teams.risk.kubernetes.imagez: unknown key; did you mean `images`?" in message


def test_a_pipeline_id_declared_twice_loads_neither_file(configs, monkeypatch):
    from trainpipe.compile.compiler import compile_directory

    for name in ("risk/a.yaml", "risk/b.yaml"):
        (configs / name).write_text(yaml.safe_dump(compliant_spec("risk_twice"), sort_keys=False))
    (configs / "risk" / "c.yaml").write_text(yaml.safe_dump(compliant_spec("risk_once"), sort_keys=False))
    monkeypatch.setenv("TRAINPIPE_POLICY", str(POLICY))
    result = compile_directory(configs, relative_to=configs.parent, settings=Settings.from_env())
    assert set(result.plans) == {"risk_once"}
    assert sorted(result.errors) == ["dag_configs/risk/a.yaml", "dag_configs/risk/b.yaml"]
    assert "'risk_twice' is also declared in dag_configs/risk/b.yaml" in str(result.errors["dag_configs/risk/a.yaml"])
    assert "'risk_twice' is also declared in dag_configs/risk/a.yaml" in str(result.errors["dag_configs/risk/b.yaml"])


def test_a_policy_inside_the_specs_folder_is_refused(configs, monkeypatch):
    from trainpipe.compile.compiler import compile_directory

    (configs / "risk" / "fraud.yaml").write_text(yaml.safe_dump(compliant_spec("risk_fraud"), sort_keys=False))
    inside = configs / "_policy.yaml"  # `_`: not a spec, but still in the authors' folder
    inside.write_text(POLICY.read_text())
    monkeypatch.setenv("TRAINPIPE_POLICY", str(inside))
    result = compile_directory(configs, relative_to=configs.parent, settings=Settings.from_env())
    assert result.plans == {}
    assert "_policy.yaml: the policy named by TRAINPIPE_POLICY is inside the specs folder" in \
        str(result.errors["dag_configs/risk/fraud.yaml"])
