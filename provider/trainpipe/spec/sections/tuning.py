"""The spec's ``tuning:`` section: the hyperparameter search."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, WithJsonSchema, field_validator, model_validator

from trainpipe.spec.sections.common import SpecModel
from trainpipe.spec.sections.params import _RUN_SETTINGS
from trainpipe.spec.types import Duration

# The choice lists the trainer also reads: defined once, in the trainer contract (ADR 0002).
from trainpipe_trainer.config import (
    CHECKPOINT_METRICS,
    PRUNERS,
    Direction,
    PrunerName,
)

# Hyperparameter -> (path in the spec, kind), from the same table.
TUNABLE_PARAMS: dict[str, tuple[tuple[str, ...], str]] = {
    name: (path, kind) for name, (path, _, kind) in _RUN_SETTINGS.items() if kind is not None}
DISTRIBUTIONS = ("log_uniform", "uniform", "int", "choice")


class DistributionSpec(SpecModel):
    """One hyperparameter's search range: exactly one of the keys."""

    log_uniform: tuple[float, float] | None = Field(
        default=None, description="[low, high], sampled uniformly in log space; both > 0.", examples=[[0.0001, 0.1]])
    uniform: tuple[float, float] | None = Field(
        default=None, description="[low, high], sampled uniformly.", examples=[[0.0, 0.5]]
    )
    int_range: tuple[int, int] | None = Field(
        default=None, alias="int", description="[low, high], a whole number in the range (both included).", examples=[[0, 200]])
    choice: list[Any] | None = Field(
        default=None, min_length=1, description="One of these values (numbers, or lists of layer sizes).",
        examples=[[32, 64, 128], [[32], [64, 32]]])

    @model_validator(mode="after")
    def _one_range(self) -> DistributionSpec:
        given = [name for name in DISTRIBUTIONS if getattr(self, "int_range" if name == "int" else name) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one distribution of {', '.join(DISTRIBUTIONS)}"
                             + (f"; found {', '.join(given)}" if given else ""))
        low_high = self.log_uniform or self.uniform or self.int_range
        if low_high is not None and low_high[0] > low_high[1]:
            raise ValueError(f"low {low_high[0]:g} is above high {low_high[1]:g}; swap them")
        if self.log_uniform is not None and self.log_uniform[0] <= 0:
            raise ValueError(f"a log_uniform range must stay above 0, got low {self.log_uniform[0]:g}; "
                             "use a small positive low such as 1e-5, or uniform")
        return self

    @property
    def kind(self) -> str:
        return next(name for name in DISTRIBUTIONS if getattr(self, "int_range" if name == "int" else name) is not None)

    @property
    def candidates(self) -> list[Any]:
        """The values the range's bounds check looks at: its ends, or every choice."""
        ends = self.log_uniform or self.uniform or self.int_range or ()
        return list(self.choice if self.choice is not None else ends)


# Each pruner's options when the spec leaves them out, chosen by measurement (docs/benchmarks.md,
# "Hyperparameter search pruning"). Resources are percent of a trial's training (TUNING_MAX_RESOURCE).
# Optuna's bootstrap_count is left out on purpose: a trial cannot wait at a rung, so it stops the
# first bootstrap_count trials to reach each rung outright.
PRUNER_DEFAULTS: dict[str, dict[str, int]] = {
    "hyperband": {"min_resource": 5, "reduction_factor": 3},
    "successive_halving": {"min_resource": 10, "reduction_factor": 3, "min_early_stopping_rate": 0},
    "median": {"n_startup_trials": 2, "min_resource": 10},
    "none": {},
}
DEFAULT_PRUNER = "hyperband"


def _defaults_of(option: str) -> str:
    return ", ".join(f"{name} {options[option]}" for name, options in PRUNER_DEFAULTS.items() if option in options)


def _known_pruner(value: Any) -> Any:
    if isinstance(value, str) and value not in PRUNERS:
        import difflib

        close = difflib.get_close_matches(value, PRUNERS, n=1, cutoff=0.5)
        raise ValueError(f"unknown pruner {value!r}; " + (f"did you mean `{close[0]}`?" if close else
                         f"use one of {', '.join(PRUNERS)} (successive_halving is asynchronous successive halving, ASHA)"))
    return value


def _normalise_pruner(value: Any) -> Any:
    # The short form: a bare name is that pruner with its default options.
    return {"type": _known_pruner(value)} if isinstance(value, str) else value


class PrunerSpec(SpecModel):
    """Which pruner stops poor trials early, and its options (each applies to the types it names)."""

    type: PrunerName = Field(
        description="hyperband (several successive-halving brackets), successive_halving (asynchronous: suits "
        "parallel trials), median (stop below the median of earlier trials at the same point) or none.",
        examples=["successive_halving"])
    min_resource: int | None = Field(
        default=None, ge=0, le=99,
        description="Percent of a trial's training before which no trial is stopped: the first rung of hyperband "
        f"and successive_halving (>= 1), median's warm-up. Defaults: {_defaults_of('min_resource')}.",
        examples=[10])
    reduction_factor: int | None = Field(
        default=None, ge=2, le=10,
        description="hyperband, successive_halving: each rung keeps the best 1/reduction_factor of the trials that "
        f"reach it, and the next rung is reduction_factor times further. Defaults: {_defaults_of('reduction_factor')}.",
        examples=[3])
    min_early_stopping_rate: int | None = Field(
        default=None, ge=0, le=6,
        description="successive_halving: the first rung is at min_resource x reduction_factor^min_early_stopping_rate. "
        f"Default: {_defaults_of('min_early_stopping_rate')}.",
        examples=[0])
    n_startup_trials: int | None = Field(
        default=None, ge=0, le=1000,
        description=f"median: trials that finish before any is stopped. Default: {_defaults_of('n_startup_trials')}.",
        examples=[2])

    @field_validator("type", mode="before")
    @classmethod
    def _known_type(cls, value: Any) -> Any:
        return _known_pruner(value)

    def options(self) -> dict[str, int]:
        """Every option of this type: the given ones over the measured defaults."""
        defaults = PRUNER_DEFAULTS[self.type]
        return {name: getattr(self, name) if getattr(self, name) is not None else default
                for name, default in defaults.items()}


class TuningSpec(SpecModel):
    metric: str = Field(
        default="validation_loss",
        description="What a trial optimises: a metric the trainer computes on the validation split at each checkpoint "
        "(the evaluation point). " + "; ".join(f"{task}: {', '.join(metrics)}" for task, metrics in CHECKPOINT_METRICS.items())
        + ".",
        examples=["validation_auc"])
    direction: Direction | None = Field(
        default=None, description="Optimisation direction; the metric's own when omitted (maximize for "
        "validation_auc and validation_accuracy, minimize for the others).", examples=["maximize"])
    n_trials: int = Field(ge=1, le=1000, description="Finished (complete or pruned) trials the study runs.", examples=[20])
    max_parallel: int = Field(default=1, ge=1, description="Trials running at once: one trial worker (a mapped Airflow "
                              "task holding one pool slot) each.", examples=[2])
    timeout: Duration | None = Field(
        default=None, description="No trial starts once the study is this old; the ones running finish.", examples=["2h"])
    sampler: Literal["tpe", "random"] = Field(
        default="tpe", description="Optuna sampler: TPE (Bayesian) or random.", examples=["tpe"]
    )
    seed: int = Field(
        # Optuna's samplers seed numpy's RandomState, which takes 32 bits.
        default=0, ge=0, le=2**32 - 1, description="The sampler's seed (a study is reproducible when trials run one at a "
        "time).", examples=[0]
    )
    pruner: Annotated[
        PrunerSpec,
        BeforeValidator(_normalise_pruner),
        WithJsonSchema({"anyOf": [{"type": "string", "enum": list(PRUNERS)}, PrunerSpec.model_json_schema()]}),
    ] = Field(
        # A name, as a spec writes it; the BeforeValidator turns it into a PrunerSpec (validate_default).
        default=DEFAULT_PRUNER,  # type: ignore[assignment]
        description="Stops poor trials at the trainer's evaluation points: a name (hyperband, successive_halving, "
        "median, none) with its measured default options, or {type: ..., min_resource: ..., ...}.",
        examples=["successive_halving", {"type": "successive_halving", "min_resource": 5, "reduction_factor": 3}])
    trial_epochs: int | None = Field(
        default=None,
        ge=1,
        description="Epochs of each trial; training.epochs when omitted. The final training always runs training.epochs.",
        examples=[2])
    warm_start: Literal["champion", "previous_study", "none"] = Field(
        default="none",
        description="The study's first trials: the champion model's parameters (champion), the previous DAG run's "
        "study's best few (previous_study), or none. Values outside today's space are left to the sampler; "
        "without a champion or previous study the search starts as with none.",
        examples=["champion"])
    space: dict[str, DistributionSpec] = Field(
        min_length=1,
        description="The hyperparameters to search and their ranges: {log_uniform: [lo, hi]}, {uniform: [lo, hi]}, "
        f"{{int: [lo, hi]}} or {{choice: [...]}}. Names: {', '.join(sorted(TUNABLE_PARAMS))} (max_length and lora_r "
        "are the transformer family's model.params.max_length and lora.r, lora_r with trainable: lora; hidden_layers "
        "and dropout the mlp's).",
        examples=[{"learning_rate": {"log_uniform": [0.0001, 0.1]}, "batch_size": {"choice": [32, 64, 128]}}])
