"""Compile every spec of a folder; one bad spec never hides the others.

``compile_directory`` is Airflow-free (used by ``trainpipe validate``/``render`` and tests);
``register_dags`` is what ``dags/trainpipe_dags.py`` calls.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainpipe.errors import SpecError, SpecProblem
from trainpipe.plan import PipelinePlan, build_plan
from trainpipe.spec.loader import load_yaml_text
from trainpipe.spec.validate import validate_loaded

log = logging.getLogger(__name__)


@dataclass(slots=True)
class CompileResult:
    plans: dict[str, PipelinePlan] = field(default_factory=dict)
    errors: dict[str, SpecError] = field(default_factory=dict)


def spec_files(directory: Path) -> list[Path]:
    """``*.yaml``/``*.yml`` files, excluding ``_``-prefixed ones (defaults, drafts)."""
    files = [*directory.rglob("*.yaml"), *directory.rglob("*.yml")]
    return sorted(p for p in files if not p.name.startswith("_"))


def compile_file(path: Path, display_name: str | None = None) -> PipelinePlan:
    name = display_name or str(path)
    text = path.read_text(encoding="utf-8")
    spec = validate_loaded(load_yaml_text(text, name))
    return build_plan(spec, spec_file=str(path), spec_text=text)


def compile_directory(directory: Path, *, relative_to: Path | None = None) -> CompileResult:
    result = CompileResult()
    owners: dict[str, str] = {}
    for path in spec_files(directory):
        name = str(path.relative_to(relative_to)) if relative_to and path.is_relative_to(relative_to) else str(path)
        try:
            plan = compile_file(path, name)
        except SpecError as err:
            result.errors[name] = err
            continue
        if plan.dag_id in owners:
            result.errors[name] = SpecError([SpecProblem(name, 1, 1, "pipeline_id",
                f"{plan.dag_id!r} is already defined in {owners[plan.dag_id]}; pipeline ids must be unique")])
            continue
        owners[plan.dag_id] = name
        result.plans[plan.dag_id] = plan
    return result


def register_dags(namespace: dict[str, Any], directory: Path) -> CompileResult:
    """Build one DAG per valid spec into ``namespace`` (a DAG file's globals)."""
    from trainpipe.dag_builder import build_dag

    result = compile_directory(directory, relative_to=directory.parent)
    for dag_id, plan in result.plans.items():
        namespace[dag_id] = build_dag(plan)
    for name, err in result.errors.items():
        log.error("trainpipe: %s was not compiled:\n%s", name, err)
    return result
