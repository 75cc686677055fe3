"""`trainpipe validate` on one bad spec per kind of mistake: exit 1 and the exact file:line:col: field: line.

Each fixture ends with `# expect: LINE:COL: field.path: start of the message` (a comment at the end,
so it moves no line numbers). An empty file cannot carry one: tests/spec/test_loader_limits.py checks it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import REPO
from trainpipe.commands.main import main

FIXTURES = REPO / "tests" / "fixtures" / "bad_specs"
BAD_SPECS = sorted(p for p in FIXTURES.rglob("*.yaml") if not p.name.startswith("_") and p.stat().st_size)


def _expected(path: Path) -> str:
    # Decoded leniently: not_utf8.yaml is not UTF-8 on purpose (its expect line is ASCII).
    last = path.read_bytes().decode("utf-8", errors="replace").rstrip("\n").splitlines()[-1]
    assert last.startswith("# expect: "), f"{path} has no expectation line"
    return last.removeprefix("# expect: ")


def test_there_is_a_fixture_per_kind_of_mistake():
    assert len(BAD_SPECS) >= 25


@pytest.mark.parametrize("spec", BAD_SPECS, ids=lambda p: p.stem)
def test_validate_reports_the_located_problem(spec: Path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    relative = spec.relative_to(REPO)

    code = main(["validate", str(relative)])

    out = capsys.readouterr().out
    assert code == 1
    assert f"{relative}:{_expected(spec)}" in out, out


def test_validate_example_specs_exits_0(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert main(["validate"]) == 0
    assert "0 problem(s)" in capsys.readouterr().out


def test_duplicate_pipeline_ids_across_files(tmp_path, capsys, monkeypatch):
    spec = (REPO / "dag_configs" / "fraud_detector.yaml").read_text()
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "a.yaml").write_text(spec)
    (tmp_path / "configs" / "b.yaml").write_text(spec)
    monkeypatch.chdir(tmp_path)

    code = main(["validate", "configs"])

    out = capsys.readouterr().out
    assert code == 1
    line = next(n for n, text in enumerate(spec.splitlines(), 1) if text.startswith("pipeline_id:"))
    # Neither file wins by its path: both are refused, each naming the other.
    assert f"configs/b.yaml:{line}:1: pipeline_id: 'fraud_detector' is also declared in configs/a.yaml" in out
    assert f"configs/a.yaml:{line}:1: pipeline_id: 'fraud_detector' is also declared in configs/b.yaml" in out
    assert "0 valid spec(s), 2 problem(s)" in out


def test_every_problem_of_a_file_is_reported(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    main(["validate", "tests/fixtures/bad_specs/standalone/missing_required_fields.yaml"])
    out = capsys.readouterr().out
    for field in ("training", "evaluation", "registration"):
        assert f"missing_required_fields.yaml:1:1: {field}: required field is missing; add it" in out
