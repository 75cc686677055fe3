"""docs/reference/spec.md: generated from the spec's JSON Schema, complete, and never stale."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.support import REPO
from trainpipe.spec.schema import spec_json_schema


def _load_generator() -> ModuleType:
    # tools/ is not a package the provider ships: load the script by its path.
    spec = importlib.util.spec_from_file_location("gen_spec_reference", REPO / "tools" / "gen_spec_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


generator = _load_generator()


def _rows(text: str) -> dict[str, list[str]]:
    """Field path -> the row's cells (type, default, description, example)."""
    rows = {}
    for line in text.splitlines():
        if line.startswith("| `"):
            cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
            assert len(cells) == 5, line
            rows[cells[0].strip("`")] = cells[1:]
    return rows


def _field_names(node: Any) -> set[str]:
    """Every property name anywhere in the schema (models and inline mappings alike)."""
    names: set[str] = set()
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "properties" and isinstance(value, dict):
                names |= set(value)
            if key not in {"examples", "default"}:
                names |= _field_names(value)
    elif isinstance(node, list):
        for item in node:
            names |= _field_names(item)
    return names


def test_committed_reference_is_current() -> None:
    committed = generator.REFERENCE_PATH.read_text(encoding="utf-8")
    assert committed == generator.current_reference(), (
        "docs/reference/spec.md is stale: run `python tools/gen_spec_reference.py` (make docs does it too)"
    )


def test_every_field_has_a_row_with_type_default_description_and_example() -> None:
    rows = _rows(generator.current_reference())
    documented_names = {path.rsplit(".", 1)[-1] for path in rows}
    assert _field_names(spec_json_schema()) <= documented_names
    for path, (type_, default, description, example) in rows.items():
        assert type_ and default, path
        assert description, f"{path}: no description; add description= to its pydantic Field"
        assert example, f"{path}: no example; add examples=[...] to its pydantic Field"


def test_rows_read_as_a_spec_author_writes_them() -> None:
    rows = _rows(generator.current_reference())
    assert rows["pipeline_id"][1] == "required"
    assert rows["retries"][:2] == ["integer (>= 0)", "`1`"]
    # A duration default is shown as written in YAML, not as the model's ISO 8601 value ("PT1H").
    assert rows["training.checkpoint.stall_timeout"][:2] == ["duration", "`1h`"]
    assert rows["registration.approval.timeout"][:2] == ["duration or null", "`1d`"]
    assert rows["training.task"][0].startswith("one of `binary_classification`")
    assert rows["training.kubernetes.secret_env.<name>.secret"][1] == "required"


def test_links_between_sections_point_at_headings() -> None:
    text = generator.current_reference()
    headings = {generator._anchor(h.strip("`")) for h in re.findall(r"^## (.+)$", text, re.MULTILINE)}
    targets = set(re.findall(r"\]\(#([^)]+)\)", text))
    assert targets and targets <= headings, targets - headings


def test_check_names_the_command_when_the_page_is_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "docs" / "reference" / "spec.md"
    monkeypatch.setattr(generator, "REPO", tmp_path)
    monkeypatch.setattr(generator, "REFERENCE_PATH", page)
    assert generator.main([]) == 0
    assert generator.main(["--check"]) == 0
    page.write_text(page.read_text().replace("| `retries` |", "| `retry_count` |"))
    assert generator.main(["--check"]) == 1
    assert "docs/reference/spec.md is stale: run `python tools/gen_spec_reference.py`" in capsys.readouterr().err
