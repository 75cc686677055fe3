"""A spec file whose name holds a newline (or another character no reader sees) wrote, through its own error
line, a forged "file:line:col: field: message" line about another team's spec into `trainpipe validate`'s
output, the import errors and CI logs. Such a file is refused unread, its name shown escaped."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import REPO
from trainpipe.commands.main import main

FORGED = "search_ranker.yaml:12:3: data.uri: FORGED"


@pytest.mark.parametrize("odd", ["\n", "\u2028", "\u202e"], ids=["newline", "line-separator", "right-to-left"])
def test_a_file_name_with_a_hidden_character_is_refused_and_forges_no_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, odd: str) -> None:
    configs = tmp_path / "dag_configs"
    configs.mkdir()
    monkeypatch.delenv("TRAINPIPE_POLICY", raising=False)
    (configs / "fraud.yaml").write_text((REPO / "dag_configs" / "fraud_detector.yaml").read_text())
    (configs / f"x.yaml:1:1: ok{odd}{FORGED}{odd}y.yaml").write_text("pipeline_id: [broken\n")
    monkeypatch.chdir(tmp_path)

    assert main(["validate", "dag_configs"]) == 1

    lines = capsys.readouterr().out.splitlines()
    assert not any(line.startswith("search_ranker.yaml") for line in lines), lines
    assert lines[-1] == "1 valid spec(s), 1 problem(s)"
    (error,) = [line for line in lines if "rename the file" in line]
    assert f"the file name contains the invisible or control character U+{ord(odd):04X} (shown escaped)" in error
    assert odd not in error
