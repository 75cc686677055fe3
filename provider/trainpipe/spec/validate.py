"""Stage 2 of compilation: loaded YAML -> ``PipelineSpec``, reporting every problem of a file at once.

Pydantic checks each field; the semantic checks below look across fields (a gate on a metric
that evaluation does not compute, a ranking task without a query column, ...). Each problem names
``file:line:col: field.path: message`` and, where one is known, the fix.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from trainpipe import metrics
from trainpipe.errors import SpecError, SpecProblem
from trainpipe.spec.loader import FieldPath, LoadedYaml, load_yaml_file
from trainpipe.spec.models import PipelineSpec


def _model_at(path: FieldPath) -> type[BaseModel] | None:
    """The pydantic model that owns the mapping at ``path`` (for "did you mean" on unknown keys)."""
    model: type[BaseModel] | None = PipelineSpec
    for part in path:
        if model is None or isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        if field is None:
            return None
        annotation = field.annotation
        candidates = [annotation, *getattr(annotation, "__args__", ())]
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
    return model


def _pydantic_problem(loaded: LoadedYaml, error: dict[str, Any]) -> SpecProblem:
    path: FieldPath = tuple(error["loc"])
    kind = error["type"]
    if kind == "extra_forbidden":
        model = _model_at(path[:-1])
        valid = list(model.model_fields) if model else []
        close = difflib.get_close_matches(str(path[-1]), valid, n=1, cutoff=0.5)
        hint = f"did you mean `{close[0]}`?" if close else f"valid keys: {', '.join(valid)}"
        return loaded.problem(path, f"unknown key; {hint}")
    if kind == "missing":
        return loaded.problem(path, "required field is missing; add it")
    message = error["msg"]
    if message.startswith("Value error, "):
        message = message[len("Value error, "):]
    if kind not in {"value_error", "assertion_error"} and "input" in error and not isinstance(error["input"], dict | list):
        message += f", got {error['input']!r}"
    return loaded.problem(path, message)


def _semantic_problems(loaded: LoadedYaml, spec: PipelineSpec) -> list[SpecProblem]:
    problems: list[SpecProblem] = []
    training, evaluation = spec.training, spec.evaluation
    if spec.data.window is not None and not spec.data.time_column:
        problems.append(loaded.problem(("data", "window"), "window needs data.time_column: name the timestamp column to cut on"))
    if training.label in training.features:
        index = training.features.index(training.label)
        problems.append(loaded.problem(("training", "features", index), f"{training.label!r} is the label; remove it from features"))
    seen: set[str] = set()
    for index, feature in enumerate(training.features):
        if feature in seen:
            problems.append(loaded.problem(("training", "features", index), f"{feature!r} is listed twice; remove one"))
        seen.add(feature)
    if training.task == "ranking" and not training.group_column:
        problems.append(loaded.problem(("training", "group_column"), "task 'ranking' needs group_column, the query id column"))
    if training.task != "ranking" and training.group_column:
        problems.append(loaded.problem(("training", "group_column"), f"group_column only applies to task 'ranking', not {training.task!r}; remove it"))
    for index, name in enumerate(evaluation.metrics):
        if not metrics.is_known_metric(training.task, name):
            hint = metrics.suggest_metric(training.task, name)
            fix = f"did you mean `{hint}`?" if hint else f"use one of {', '.join(metrics.metric_names(training.task))}"
            problems.append(loaded.problem(("evaluation", "metrics", index), f"{name!r} is not a {training.task} metric; {fix}"))
    for index, gate in enumerate(evaluation.gates):
        if gate.metric not in evaluation.metrics:
            problems.append(
                loaded.problem(
                    ("evaluation", "gates", index),
                    f"gate '{gate}' uses {gate.metric!r}, which evaluation does not compute; add it to evaluation.metrics",
                )
            )
    return problems


def validate_loaded(loaded: LoadedYaml) -> PipelineSpec:
    if not isinstance(loaded.data, dict):
        found = type(loaded.data).__name__ if loaded.data is not None else "an empty file"
        raise SpecError([loaded.problem((), f"a spec is a YAML mapping with pipeline_id, data, training, ...; found {found}")])
    try:
        spec = PipelineSpec.model_validate(loaded.data)
    except ValidationError as err:
        raise SpecError([_pydantic_problem(loaded, e) for e in err.errors()]) from None
    problems = _semantic_problems(loaded, spec)
    if problems:
        raise SpecError(problems)
    return spec


def load_spec(path: Path, display_name: str | None = None) -> PipelineSpec:
    """Load and validate one spec file; raises ``SpecError`` listing every problem in it."""
    return validate_loaded(load_yaml_file(path, display_name))
