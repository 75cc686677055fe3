"""Lineage that survives deployment: a git commit only from a real checkout (never a made-up value),
the spec by its path relative to the configs root, and the spec's text on the training run."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.support import REPO
from trainpipe.compile.compiler import compile_directory, compile_file
from trainpipe.settings import Settings
from trainpipe.steps.register.lineage import git_commit, log_spec_text

EXAMPLE = REPO / "dag_configs" / "fraud_detector.yaml"


def _git(folder: Path, *args: str) -> str:
    identity = ["-c", "user.name=trainpipe tests", "-c", "user.email=tests@example.invalid"]
    return subprocess.run(["git", "-C", str(folder), *identity, *args], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_no_git_commit_outside_a_checkout(tmp_path):
    configs = tmp_path / "dag_configs"
    configs.mkdir()
    shutil.copy(EXAMPLE, configs / "fraud_detector.yaml")

    assert git_commit(configs / "fraud_detector.yaml") is None
    assert git_commit("") is None  # a plan compiled from text alone has no source path


def test_git_commit_of_the_checkout_holding_the_spec(tmp_path):
    configs = tmp_path / "repo" / "dag_configs"
    configs.mkdir(parents=True)
    shutil.copy(EXAMPLE, configs / "fraud_detector.yaml")
    _git(tmp_path / "repo", "init", "-q")
    _git(tmp_path / "repo", "add", ".")
    _git(tmp_path / "repo", "commit", "-q", "-m", "specs")

    commit = git_commit(configs / "fraud_detector.yaml")

    assert commit == _git(tmp_path / "repo", "rev-parse", "HEAD") and len(commit) == 40


def test_spec_path_is_relative_to_the_configs_root(tmp_path, monkeypatch):
    configs = tmp_path / "somewhere" / "dag_configs"
    (configs / "risk").mkdir(parents=True)
    text = EXAMPLE.read_text()
    (configs / "risk" / "fraud_detector.yaml").write_text(text)
    monkeypatch.delenv("TRAINPIPE_DAG_CONFIGS", raising=False)

    in_folder = compile_directory(configs, relative_to=configs.parent, settings=Settings.from_env()).plans["fraud_detector"]
    alone = compile_file(configs / "risk" / "fraud_detector.yaml", settings=Settings.from_env())

    assert in_folder.spec_file == "dag_configs/risk/fraud_detector.yaml"  # as users name it
    assert in_folder.spec_relative_path == alone.spec_relative_path == "risk/fraud_detector.yaml"
    assert in_folder.spec_text == text
    loose = tmp_path / "loose.yaml"
    loose.write_text(text)
    # no configs folder: its own folder is the root
    assert compile_file(loose, settings=Settings.from_env()).spec_relative_path == "loose.yaml"


def test_spec_text_is_logged_on_the_run():
    import mlflow

    from trainpipe.hooks.mlflow import MlflowHook

    hook = MlflowHook(Settings.from_env())
    run_id = hook.run_for_dag_run(pipeline_id="lineage_test", dag_id="lineage_test", airflow_run_id="manual__1", tags={})
    text = EXAMPLE.read_text()

    path = log_spec_text(hook.client, run_id, spec_relative_path="risk/fraud_detector.yaml", spec_text=text)

    assert path == "spec/fraud_detector.yaml"
    assert Path(mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=path)).read_text() == text
