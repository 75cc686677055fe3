"""_defaults.yaml merging (nearest wins) and `trainpipe init` starters."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from tests.support import REPO, spec_with
from trainpipe.commands.main import main
from trainpipe.compile.compiler import compile_directory, compile_file
from trainpipe.errors import SpecError
from trainpipe.settings import Settings


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def configs(tmp_path: Path) -> Path:
    root = tmp_path / "dag_configs"
    _write(root / "_defaults.yaml", "owner: platform\nretries: 3\ntraining:\n  epochs: 2\n  seed: 1\n")
    _write(root / "team" / "_defaults.yaml", "owner: team-a\ntraining:\n  epochs: 5\n")
    spec = (REPO / "dag_configs" / "fraud_detector.yaml").read_text()
    for line in ("owner: risk-ml\n", "retries: 1\n", "  epochs: 8\n", "  seed: 42\n"):
        spec = spec.replace(line, "")
    _write(root / "team" / "fraud.yaml", spec)
    return root


def test_nearest_defaults_win_and_the_spec_wins_over_all(configs: Path):
    plan = compile_directory(configs, settings=Settings.from_env()).plans["fraud_detector"]
    assert plan.owner == "team-a"  # team/_defaults.yaml over the root's
    assert plan.retries == 3  # only the root sets it
    assert plan.trainer.epochs == 5  # nearest defaults
    assert plan.trainer.seed == 1
    assert plan.trainer.learning_rate == 0.003  # the spec's own value


def test_render_shows_the_merged_spec(configs: Path, capsys):
    assert main(["render", str(configs / "team" / "fraud.yaml")]) == 0
    rendered = json.loads(capsys.readouterr().out)
    assert rendered["owner"] == "team-a"
    assert rendered["trainer"]["epochs"] == 5


def test_a_file_compiled_on_its_own_gets_the_same_defaults_as_its_dag(configs: Path, capsys):
    """render/train/validate FILE merge every _defaults.yaml from the dag_configs root down, as the DAG does."""
    assert main(["render", str(configs / "team" / "fraud.yaml")]) == 0
    rendered = json.loads(capsys.readouterr().out)
    assert rendered["retries"] == 3  # set only by dag_configs/_defaults.yaml, two folders up
    assert rendered["trainer"]["seed"] == 1
    alone, in_folder = compile_file(configs / "team" / "fraud.yaml", settings=Settings.from_env()), compile_directory(configs,
                                                                                                                      settings=Settings.from_env()).plans["fraud_detector"]
    assert dataclasses.replace(alone, spec_file=in_folder.spec_file) == in_folder


def test_trainpipe_dag_configs_names_the_root_for_a_lone_file(tmp_path: Path, monkeypatch):
    root = tmp_path / "specs"
    _write(root / "_defaults.yaml", "owner: platform\n")
    (root / "team").mkdir()
    spec_with(root / "team", "owner: risk-ml\n", "", name="fraud.yaml")
    assert compile_file(root / "team" / "fraud.yaml",
                        settings=Settings.from_env()).owner == "trainpipe"  # not a configs root: own folder only
    monkeypatch.setenv("TRAINPIPE_DAG_CONFIGS", str(root))
    assert compile_file(root / "team" / "fraud.yaml", settings=Settings.from_env()).owner == "platform"


def test_a_mistake_in_defaults_points_into_the_defaults_file(configs: Path):
    _write(configs / "team" / "_defaults.yaml", "owner: team-a\ntraining:\n  epochs: 0\n")
    with pytest.raises(SpecError) as caught:
        compile_file(configs / "team" / "fraud.yaml", configs_root=configs, settings=Settings.from_env())
    (problem,) = caught.value.problems
    assert problem.file.endswith("team/_defaults.yaml")
    assert (problem.line, problem.column, problem.field_path) == (3, 3, "training.epochs")


@pytest.mark.parametrize("task", ["binary_classification", "regression", "ranking"])
def test_init_writes_a_valid_commented_starter(task: str, tmp_path: Path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["init", "churn", "--task", task, "--dir", "dag_configs"]) == 0
    written = tmp_path / "dag_configs" / "churn.yaml"
    assert written.read_text().startswith("# yaml-language-server: $schema=")
    assert "# " in written.read_text().split("pipeline_id:")[1]  # comments explain the keys
    assert compile_file(written, settings=Settings.from_env()).trainer.task == task
    assert main(["init", "churn", "--task", task, "--dir", "dag_configs"]) == 1  # never overwrites
    assert "already exists" in capsys.readouterr().err
