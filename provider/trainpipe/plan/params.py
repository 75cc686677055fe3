"""Run parameters and trial parameters applied to a built plan."""


from __future__ import annotations

import dataclasses
import json
import math
from typing import TYPE_CHECKING, Any

from trainpipe.errors import SpecError, SpecProblem, TrialParamsError, shown_value
from trainpipe.plan.model import PipelinePlan, PlannedParam
from trainpipe.spec.loader import format_path
from trainpipe_trainer.config import SearchDimension, apply_trial_params

# The spec models (pydantic, 0.1 s to import) are imported where a plan is built, not here: a plan
# or DAG unpickled from the plan cache needs only this module (ADR 0012).
if TYPE_CHECKING:
    pass


def _get(obj: Any, path: tuple[str, ...]) -> Any:
    for part in path:
        obj = getattr(obj, part)
    return obj


def _replace(obj: Any, path: tuple[str, ...], value: Any) -> Any:
    """``obj`` with the field at ``path`` replaced (each frozen section re-checks its own values)."""
    head, *rest = path
    return dataclasses.replace(obj, **{head: _replace(getattr(obj, head), tuple(rest), value) if rest else value})


def apply_run_params(plan: PipelinePlan, values: dict[str, Any]) -> tuple[PipelinePlan, dict[str, Any]]:
    """The plan of one run: declared params present in ``values`` replace their planned values.

    Each value is checked against the param's type and bounds (the same ones the trigger form
    enforces); a refused value is a ``SpecError`` located at the param's declaration. Returns the
    run's plan and the overrides that changed something (recorded in MLflow).
    """
    changed: dict[str, Any] = {}
    for param in plan.params:
        if values.get(param.name) is None:
            continue
        value = _checked_param_value(param, values[param.name])
        if _get(plan, param.target) != value:
            changed[param.name] = value
            plan = _replace(plan, param.target, value)
    return plan, changed


def _checked_param_value(param: PlannedParam, value: Any) -> float | int:
    problem = None
    if isinstance(value, bool) or not isinstance(value, int | float):
        problem = f"is not a {param.type}"
    elif isinstance(value, float) and not math.isfinite(value):  # JSON's Infinity and NaN: int() of them raises
        problem = "is not a finite number"
    elif param.type == "integer" and value != int(value):
        problem = "is not a whole number"
    else:
        value = int(value) if param.type == "integer" else value
        problem = next((f"is not {b.describe()} ({b.source})" for b in param.bounds if not b.admits(value)), None)
    if problem is not None:
        file, line, column = param.declared_at
        raise SpecError([SpecProblem(file, line, column, format_path(("params", param.name)),
                                     f"this run's value {shown_value(value)} {problem}; trigger the run with a value "
                                     "within the param's bounds")])
    return value


def with_trial_params(plan: PipelinePlan, params: dict[str, Any], *, trial_epochs: bool = False,
                      source: str = "the best trial's parameters") -> PipelinePlan:
    """The plan whose trainer config takes a trial's hyperparameters (as Optuna stores them: a choice
    that is a list is its JSON text), and, for a trial, the search's epochs per trial.

    Each value is checked against its dimension of the spec's search space first: where they come from
    (an MLflow run tag, which anyone with MLflow access can edit) is trusted less than the spec, as run
    parameters are. ``source`` names that place in the error."""
    if plan.tuning is None:
        raise ValueError("the plan has no tuning section")
    _check_trial_params(plan.tuning.space, params, source)
    trainer = apply_trial_params(plan.trainer, plan.tuning.space, params)
    if trial_epochs:
        trainer = dataclasses.replace(trainer, epochs=plan.tuning.trial_epochs)
    return dataclasses.replace(plan, trainer=trainer)


def _check_trial_params(space: tuple[SearchDimension, ...], params: Any, source: str) -> None:
    fix = "restore the parameters the study's best trial recorded"
    if not isinstance(params, dict):
        raise TrialParamsError(f"{source}: {shown_value(params)} is not a mapping of parameter names to values; {fix}")
    for dimension in space:
        if dimension.name not in params:
            continue  # the spec's own value stays
        value = params[dimension.name]
        problem = _trial_value_problem(dimension, value)
        if problem is not None:
            raise TrialParamsError(
                f"{source}: {dimension.name}: {shown_value(value)} {problem} (tuning.space.{dimension.name}); the "
                f"search could not have chosen it, so nothing was applied: {fix}")


def _trial_value_problem(dimension: SearchDimension, value: Any) -> str | None:
    """Why ``value`` is outside ``dimension`` (None when the search could have chosen it)."""
    if dimension.distribution == "choice":
        # Decoded as apply_trial_params decodes it, compared as JSON text: True is not 1, nor 128.0 128. A
        # list comes as its JSON text (Optuna's choices are scalars), never as itself.
        try:
            decoded = json.loads(value) if isinstance(value, str) else value
            text = None if isinstance(value, list | tuple | dict) else json.dumps(decoded, allow_nan=False)
        except (TypeError, ValueError):
            text = None
        allowed = [json.dumps(json.loads(choice)) for choice in dimension.choices]
        return None if text in allowed else f"is not one of {', '.join(allowed)}"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "is not a number"
    if dimension.distribution == "int" and not isinstance(value, int):
        return "is not a whole number"
    if isinstance(value, float) and not math.isfinite(value):
        return "is not a finite number"
    low, high = dimension.low, dimension.high
    if (low is not None and value < low) or (high is not None and value > high):
        return f"is not within [{low}, {high}]"
    return None
