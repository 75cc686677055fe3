"""A spec or ``_defaults.yaml`` that is a symbolic link out of the specs folder is refused unread: before,
the worker followed it and printed each line of the target (``/etc/shadow``, a token file) as an "unknown
key" in the import errors every Airflow user sees, and "no such file" told whether a path existed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support import REPO
from trainpipe.commands.main import main
from trainpipe.compile.compiler import compile_directory
from trainpipe.compile.plan_cache import PlanCache
from trainpipe.dags.files import declared_pipeline_id
from trainpipe.settings import Settings

SECRET = "root:$6$saltsalt$SECRETHASH:20228:0:99999:7:::\napi_token: tok-SECRET-1234\n"
REFUSED = "a symbolic link (or a linked folder) to a file outside the specs folder"


@pytest.fixture
def folders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    configs = tmp_path / "dag_configs"
    (configs / "risk").mkdir(parents=True)
    outside = tmp_path / "worker"
    outside.mkdir()
    (outside / "shadow").write_text(SECRET)
    monkeypatch.setenv("TRAINPIPE_DAG_CONFIGS", str(configs))
    monkeypatch.setenv("TRAINPIPE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TRAINPIPE_POLICY", raising=False)
    (configs / "risk" / "fraud.yaml").write_text((REPO / "dag_configs" / "fraud_detector.yaml").read_text())
    return configs, outside


@pytest.mark.parametrize("cached", [False, True], ids=["validate", "dag-file"])
def test_a_link_out_of_the_folder_is_refused_unread_and_the_rest_compiles(
        folders: tuple[Path, Path], tmp_path: Path, cached: bool) -> None:
    configs, outside = folders
    (configs / "risk" / "leak.yaml").symlink_to(outside / "shadow")
    (configs / "risk" / "probe.yaml").symlink_to(outside / "no-such-file")
    cache = PlanCache(configs.resolve(), "all", home=tmp_path / "home").load() if cached else None

    result = compile_directory(configs, relative_to=configs.parent, cache=cache, settings=Settings.from_env())

    assert set(result.plans) == {"fraud_detector"}
    shown = {name: str(error) for name, error in result.errors.items()}
    assert set(shown) == {"dag_configs/risk/leak.yaml", "dag_configs/risk/probe.yaml"}
    for text in shown.values():
        assert REFUSED in text and "SECRET" not in text and "api_token" not in text and "root" not in text
    # An existing target and a missing one read the same: the error says nothing about the worker's files.
    assert shown["dag_configs/risk/leak.yaml"].replace("leak", "probe") == shown["dag_configs/risk/probe.yaml"]
    # The other shards' quick look at pipeline ids does not read through the link either.
    (outside / "shadow").write_text("pipeline_id: fraud_detector\n")
    assert declared_pipeline_id(str(configs / "risk" / "leak.yaml")) is None
    assert declared_pipeline_id(str(configs / "risk" / "fraud.yaml")) == "fraud_detector"


def test_a_defaults_file_linked_out_is_refused_for_the_specs_under_it(
        folders: tuple[Path, Path], capsys: pytest.CaptureFixture) -> None:
    configs, outside = folders
    (configs / "risk" / "_defaults.yaml").symlink_to(outside / "shadow")

    assert main(["validate", str(configs)]) == 1

    out = capsys.readouterr().out
    assert f"risk/_defaults.yaml:1:1: {REFUSED}" in out
    assert "SECRET" not in out and "api_token" not in out


def test_a_link_to_a_file_inside_the_folder_is_read(folders: tuple[Path, Path]) -> None:
    configs, _ = folders
    shared = configs / "shared"
    shared.mkdir()
    text = (configs / "risk" / "fraud.yaml").read_text().replace("pipeline_id: fraud_detector", "pipeline_id: risk_shared")
    (shared / "_template.yaml").write_text(text)  # "_": not a spec of its own
    (configs / "risk" / "shared.yaml").symlink_to(os.path.relpath(shared / "_template.yaml", configs / "risk"))

    result = compile_directory(configs, relative_to=configs.parent, settings=Settings.from_env())

    assert set(result.plans) == {"fraud_detector", "risk_shared"} and not result.errors


def test_the_import_error_of_a_link_is_filed_under_the_link_not_its_target(folders: tuple[Path, Path]) -> None:
    from trainpipe.dags.airflow_compat import _airflow_relative_path, spec_location

    configs, outside = folders
    link = configs / "risk" / "leak.yaml"
    link.symlink_to(outside / "shadow")
    assert spec_location(link) == configs.resolve() / "risk" / "leak.yaml"
    assert _airflow_relative_path(link, configs.parent) == "dag_configs/risk/leak.yaml"
    # Outside the bundle (dag_configs/ beside dags/): named as its messages name it, no absolute path shown.
    assert _airflow_relative_path(link, configs.parent / "dags", configs) == "dag_configs/risk/leak.yaml"
    assert "shadow" not in _airflow_relative_path(link, None)


def test_a_file_named_on_the_command_line_through_a_linked_folder_is_refused_unread(
        folders: tuple[Path, Path], capsys: pytest.CaptureFixture) -> None:
    """A CI job running `trainpipe validate dag_configs/*/*.yaml` expands a linked folder's files too."""
    configs, outside = folders
    (outside / "p.yaml").write_text("pipeline_id: 'tok-SECRET-1234'\n")
    (configs / "linked").symlink_to(outside)

    assert main(["validate", str(configs / "linked" / "p.yaml")]) == 1

    out = capsys.readouterr().out
    assert REFUSED in out and "SECRET" not in out
