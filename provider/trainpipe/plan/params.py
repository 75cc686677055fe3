"""Run parameters and trial parameters applied to a built plan."""


from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from trainpipe.errors import SpecError, SpecProblem
from trainpipe.plan.model import PipelinePlan, PlannedParam
from trainpipe.spec.loader import format_path
from trainpipe_trainer.config import (
    apply_trial_params,
)

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
    elif param.type == "integer" and value != int(value):
        problem = "is not a whole number"
    else:
        value = int(value) if param.type == "integer" else value
        problem = next((f"is not {b.describe()} ({b.source})" for b in param.bounds if not b.admits(value)), None)
    if problem is not None:
        file, line, column = param.declared_at
        raise SpecError([SpecProblem(file, line, column, format_path(("params", param.name)),
                                     f"this run's value {value!r} {problem}; trigger the run with a value within "
                                     "the param's bounds")])
    return value


def with_trial_params(plan: PipelinePlan, params: dict[str, Any], *, trial_epochs: bool = False) -> PipelinePlan:
    """The plan whose trainer config takes a trial's hyperparameters (as Optuna stores them: a choice
    that is a list is its JSON text), and, for a trial, the search's epochs per trial."""
    if plan.tuning is None:
        raise ValueError("the plan has no tuning section")
    trainer = apply_trial_params(plan.trainer, plan.tuning.space, params)
    if trial_epochs:
        trainer = dataclasses.replace(trainer, epochs=plan.tuning.trial_epochs)
    return dataclasses.replace(plan, trainer=trainer)
