"""One resolution of the specs folder: the command's argument, else TRAINPIPE_DAG_CONFIGS, else dag_configs/,
said on stderr by every command that takes the folder optionally."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import REPO
from trainpipe.commands.main import main
from trainpipe.compile.spec_files import resolve_specs_folder
from trainpipe.settings import Settings


@pytest.fixture
def specs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder with one valid spec, named by TRAINPIPE_DAG_CONFIGS; the working directory has no dag_configs/."""
    folder = tmp_path / "team_specs"
    folder.mkdir()
    (folder / "fraud.yaml").write_text((REPO / "dag_configs" / "fraud_detector.yaml").read_text())
    monkeypatch.setenv("TRAINPIPE_DAG_CONFIGS", str(folder))
    monkeypatch.chdir(tmp_path)
    return folder


def test_the_order_is_argument_then_variable_then_default(specs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_specs_folder("mine", option="--configs", settings=Settings.from_env()) == (Path("mine"), "from --configs")
    assert resolve_specs_folder(None, option="--configs", settings=Settings.from_env()) == (specs, "from TRAINPIPE_DAG_CONFIGS")
    monkeypatch.delenv("TRAINPIPE_DAG_CONFIGS")
    assert resolve_specs_folder(None, option="--configs", settings=Settings.from_env()) == (
        Path("dag_configs"), "the default; neither --configs nor TRAINPIPE_DAG_CONFIGS is set")


def test_validate_without_a_path_reads_the_variable_and_says_so(specs: Path, capsys: pytest.CaptureFixture) -> None:
    code = main(["validate"])

    captured = capsys.readouterr()
    assert code == 0, captured.out
    assert "1 valid spec(s), 0 problem(s)" in captured.out
    assert f"specs folder: {specs} (from TRAINPIPE_DAG_CONFIGS)" in captured.err


def test_policy_check_and_init_read_it_too(specs: Path, capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text((REPO / "tests" / "fixtures" / "policy" / "policy.yaml").read_text())

    main(["policy", "check", "--policy", str(policy)])
    captured = capsys.readouterr()
    assert "fraud.yaml" in captured.out and f"specs folder: {specs} (from TRAINPIPE_DAG_CONFIGS)" in captured.err

    assert main(["init", "starter", "--task", "regression"]) == 0
    assert (specs / "starter.yaml").is_file() and not (tmp_path / "dag_configs").exists()
    assert f"specs folder: {specs} (from TRAINPIPE_DAG_CONFIGS)" in capsys.readouterr().err


def test_an_argument_wins_and_the_default_is_named(specs: Path, capsys: pytest.CaptureFixture,
                                                    monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert main(["init", "other", "--task", "regression", "--dir", str(tmp_path / "elsewhere")]) == 0
    assert (tmp_path / "elsewhere" / "other.yaml").is_file()
    assert f"specs folder: {tmp_path / 'elsewhere'} (from --dir)" in capsys.readouterr().err

    monkeypatch.delenv("TRAINPIPE_DAG_CONFIGS")
    assert main(["validate"]) == 1
    captured = capsys.readouterr()
    assert ("specs folder: dag_configs (the default; neither a PATH argument nor TRAINPIPE_DAG_CONFIGS is set)"
            in captured.err)
