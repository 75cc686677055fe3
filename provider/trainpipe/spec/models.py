"""Stage 2 of compilation: the spec as pydantic models (they also generate the JSON Schema).

Friendly YAML forms (a gate as ``"auc >= 0.80"``, a duration as ``30d``, an expectation as a
one-key mapping) are normalised here, so nothing after validation looks at raw dicts.
"""

from __future__ import annotations

import functools
import re
from datetime import datetime, timedelta, timezone
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, field_validator, model_validator

from trainpipe import uris
from trainpipe.launch import Launcher

from trainpipe.spec.bounds import ParamBound
from trainpipe.spec.kubernetes import KubernetesSpec
from trainpipe.spec.types import Duration, parse_duration  # noqa: F401 - parse_duration re-exported
# The choice lists the trainer also reads: defined once, in the trainer contract (ADR 0002).
from trainpipe_trainer.config import (
    CHECKPOINT_METRICS,
    PRUNERS,
    EarlyStoppingMetric,
    CategoricalEncoding,
    Direction,
    FeatureType,
    ImputeStrategy,
    LrSchedule,
    ModelType,
    NumericTransform,
    DataPlacement,
    Precision,
    PrunerName,
    RankingLoss,
    StrategyName,
    TaskType,
    ZeroStage,
)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


# ---------------------------------------------------------------------------------------------
# data and validation


class DataSpec(_Model):
    uri: str = Field(
        description="Where the input lives: a path relative to the trainpipe storage root, or a full "
        "URI (file://, s3://) read through Airflow's ObjectStoragePath.",
        examples=["demo/transactions/transactions.parquet", "s3://lake/fraud/transactions/"],
    )
    format: Literal["parquet", "csv"] | None = Field(
        default=None,
        description="File format; inferred from the URI's extension when omitted.",
        examples=["parquet"],
    )
    conn_id: str | None = Field(
        default=None,
        description="Airflow connection used to read the URI (credentials stay in Airflow, never in YAML).",
        examples=["aws_default"],
    )
    time_column: str | None = Field(
        default=None,
        description="Timestamp column used to cut the window relative to the run's logical date.",
        examples=["event_time"],
    )
    window: Duration | None = Field(
        default=None,
        description="Keep rows with time_column in (logical_date - window, logical_date]. Needs time_column.",
        examples=["30d"],
    )

    @field_validator("uri")
    @classmethod
    def _inside_storage_root(cls, uri: str) -> str:
        # By its text alone: the spec stage reads no storage.
        problem = uris.scheme_problem(uri)
        if problem is not None:
            raise ValueError(problem)
        if uris.climbs_out_of_root(uri):
            raise ValueError(f"{uri!r} leads outside the storage root; {uris.OUTSIDE_ROOT_FIX}")
        return uri

    @property
    def resolved_format(self) -> str:
        if self.format:
            return self.format
        return "csv" if self.uri.lower().rstrip("/").endswith(".csv") else "parquet"


class ExpectationSpec(_Model):
    name: str = Field(
        description="Great Expectations 1.x expectation, snake_case.",
        examples=["expect_column_values_to_not_be_null"],
    )
    kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Keyword arguments of the expectation.",
        examples=[{"column": "amount"}],
    )


def _normalise_expectation(value: Any) -> Any:
    # YAML friendly forms: "expect_x" or {expect_x: {column: a}} -> {name, kwargs}.
    if isinstance(value, str):
        return {"name": value, "kwargs": {}}
    if isinstance(value, dict) and len(value) == 1 and "name" not in value:
        ((name, kwargs),) = value.items()
        return {"name": name, "kwargs": kwargs if kwargs is not None else {}}
    return value


_VERDICT_ACTIONS = Literal["allow", "warn", "fail"]


class SchemaCheckSpec(_Model):
    """What a schema change vs the baseline version does. Removing or retyping a column the pipeline
    uses (a feature, the label, the query or time column) always fails, whatever is set here."""

    added_columns: _VERDICT_ACTIONS = Field(
        default="allow", description="A column the baseline did not have: allow, warn (log it) or fail.", examples=["allow"]
    )
    removed_columns: _VERDICT_ACTIONS = Field(
        default="fail", description="A column of the baseline that is gone (and that the pipeline does not use).",
        examples=["warn"],
    )
    retyped_columns: _VERDICT_ACTIONS = Field(
        default="fail", description="A column whose type changed (and that the pipeline does not use).", examples=["fail"]
    )


class DriftLevelsSpec(_Model):
    warn: float | None = Field(default=None, ge=0, description="Log a warning at or above this value.", examples=[0.1])
    fail: float | None = Field(default=None, ge=0, description="Stop the run before training at or above this value.",
                               examples=[0.25])


class KsLevelsSpec(_Model):
    warn: float | None = Field(default=None, ge=0, le=1, description="Log a warning at or above this KS statistic.",
                               examples=[0.1])
    fail: float | None = Field(default=None, ge=0, le=1, description="Stop the run at or above this KS statistic.",
                               examples=[0.2])


class FeatureDriftSpec(_Model):
    psi: DriftLevelsSpec | None = Field(
        default=None, description="This feature's PSI levels, in place of validation.drift.psi.", examples=[{"fail": 0.5}]
    )
    ks: KsLevelsSpec | None = Field(
        default=None, description="This feature's KS levels, in place of validation.drift.ks.", examples=[{"warn": 0.2}]
    )
    ignore: bool = Field(default=False, description="Do not compare this feature.", examples=[False])


_REFERENCE = re.compile(r"^(baseline|[0-9a-f]{16,64})$")


class DriftSpec(_Model):
    reference: str = Field(
        default="baseline",
        description="The version compared against: 'baseline' (the last version that passed validation) or a pinned "
        "version's digest (at least its first 16 hex characters, as `trainpipe datasets` lists them).",
        examples=["baseline", "3f9a0c1d2e4b5a69"],
    )
    bins: int = Field(default=10, ge=2, le=100, description="PSI bins of a numeric feature (reference quantiles).", examples=[10])
    psi: DriftLevelsSpec = Field(
        default_factory=lambda: DriftLevelsSpec(warn=0.1, fail=0.25),
        description="Population stability index levels for every feature (0.1 / 0.25 by default).",
        examples=[{"warn": 0.1, "fail": 0.25}],
    )
    ks: KsLevelsSpec = Field(
        default_factory=KsLevelsSpec,
        description="Two-sample Kolmogorov-Smirnov statistic levels for every numeric feature (none by default: "
        "reported, not judged).",
        examples=[{"warn": 0.1, "fail": 0.2}],
    )
    features: dict[str, FeatureDriftSpec] = Field(
        default_factory=dict, description="Per-feature levels, or ignore: true.", examples=[{"is_foreign": {"psi": {"fail": 0.5}}}]
    )

    @field_validator("reference", mode="before")
    @classmethod
    def _quoted_digest(cls, value: Any) -> Any:
        # YAML reads an all-digit digest prefix as a number and drops its leading zeros.
        if isinstance(value, int | float) and not isinstance(value, bool):
            raise ValueError(f"YAML read {value!r} as a number; write the version digest in quotes")
        return value

    @field_validator("reference")
    @classmethod
    def _known_reference(cls, value: str) -> str:
        if not _REFERENCE.match(value):
            raise ValueError(f"{value!r} is neither 'baseline' nor a version digest; write 'baseline', or the first 16 "
                             "(or more) lowercase hex characters of a version that `trainpipe datasets` lists")
        return value


class ValidationSpec(_Model):
    expectations: list[
        Annotated[
            ExpectationSpec,
            BeforeValidator(_normalise_expectation),
            WithJsonSchema({
                "anyOf": [
                    {"type": "string", "pattern": "^expect_[a-z0-9_]+$"},
                    {"type": "object", "minProperties": 1, "maxProperties": 1,
                     "patternProperties": {"^expect_[a-z0-9_]+$": {"type": ["object", "null"]}},
                     "additionalProperties": False},
                    ExpectationSpec.model_json_schema(),
                ],
                "description": "An expectation name, or {name: {kwargs}}.",
            }),
        ]
    ] = Field(
        default_factory=list,
        description="Great Expectations run on the snapshot before training. Feature and label columns "
        "are always required to exist.",
        examples=[[{"expect_column_values_to_not_be_null": {"column": "amount"}}]],
    )
    max_volume_change: float | None = Field(
        default=None,
        gt=0,
        description="Fail when the row count changes by more than this fraction vs the previous snapshot.",
        examples=[0.2],
    )
    schema_: SchemaCheckSpec = Field(
        default_factory=SchemaCheckSpec,
        alias="schema",
        description="Schema changes vs the baseline version (the last one that passed validation) that are allowed.",
        examples=[{"added_columns": "allow", "removed_columns": "fail", "retyped_columns": "fail"}],
    )
    drift: DriftSpec | None = Field(
        default=None,
        description="Distribution drift of each feature vs the baseline (or a pinned) version: PSI and KS, with warn "
        "and fail levels. Not checked when omitted.",
        examples=[{"psi": {"warn": 0.1, "fail": 0.25}, "ks": {"warn": 0.1, "fail": 0.2}}],
    )


# ---------------------------------------------------------------------------------------------
# training


class ModelSpec(_Model):
    type: ModelType = Field(default="mlp", description="Built-in model.", examples=["mlp"])
    hidden_layers: list[Annotated[int, Field(gt=0)]] = Field(
        default_factory=lambda: [64, 32], description="Hidden layer sizes.", examples=[[64, 32]]
    )
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0, description="Dropout after each hidden layer.", examples=[0.1])
    ranking_loss: RankingLoss = Field(
        default="listwise",
        description="Ranking only: pointwise regresses relevance, listwise optimises a softmax per query.",
        examples=["listwise"],
    )


class ElasticSpec(_Model):
    min_nodes: int = Field(ge=1, description="Training goes on with this many nodes when others were preempted.",
                           examples=[2])
    max_nodes: int = Field(ge=1, description="Nodes (pods) the Job starts; a replaced pod rejoins.", examples=[4])

    @model_validator(mode="after")
    def _ordered(self) -> ElasticSpec:
        if self.max_nodes < self.min_nodes:
            raise ValueError(f"max_nodes ({self.max_nodes}) must be >= min_nodes ({self.min_nodes})")
        return self


class DistributedSpec(_Model):
    nproc_per_node: int = Field(default=1, ge=1, description="Processes per node (GPUs per node on a cluster).", examples=[2])
    nnodes: int = Field(default=1, ge=1, description="Number of nodes (with elastic: max_nodes).", examples=[1])
    elastic: ElasticSpec | None = Field(
        default=None,
        description="Kubernetes, ddp: keep training on between min_nodes and max_nodes nodes (torchrun "
        "--nnodes=MIN:MAX). Ranks of a preempted node stop after committing their step; the others rejoin, and "
        "training resumes resharded at the new size. See docs/preemption.md.",
        examples=[{"min_nodes": 2, "max_nodes": 4}],
    )
    strategy: StrategyName = Field(default="ddp", description="PyTorch DDP, or DeepSpeed ZeRO.", examples=["ddp"])
    zero_stage: ZeroStage = Field(default=0, description="DeepSpeed only: ZeRO stage.", examples=[2])
    offload_optimizer: bool = Field(default=False, description="DeepSpeed only: optimizer state in CPU memory (ZeRO >= 1).", examples=[False])
    offload_param: bool = Field(default=False, description="DeepSpeed only: parameters in CPU memory (ZeRO 3).", examples=[False])

    @model_validator(mode="before")
    @classmethod
    def _elastic_nodes(cls, data: Any) -> Any:
        # One canonical form: with elastic, nnodes is the number of pods the Job starts (spec.validate
        # refuses an nnodes that says otherwise, with its position).
        elastic = data.get("elastic") if isinstance(data, dict) else None
        if isinstance(elastic, dict) and "nnodes" not in data and isinstance(elastic.get("max_nodes"), int):
            return {**data, "nnodes": elastic["max_nodes"]}
        return data


class PreemptionSpec(_Model):
    max_restarts: int = Field(
        default=3, ge=0,
        description="Local launcher: how often a preempted trainer (SIGTERM: it finished its step, committed a "
        "checkpoint of it and exited) is launched again within one task try, resuming at that step. A preemption "
        "beyond this fails the try (the Airflow retry resumes there too). See docs/preemption.md.",
        examples=[3],
    )


class OptimizationSpec(_Model):
    gradient_clip_norm: float | None = Field(default=None, gt=0, description="Clip the global gradient norm to this value.", examples=[1.0])
    gradient_accumulation_steps: int = Field(default=1, ge=1, description="Micro-batches per optimizer step.", examples=[1])
    precision: Precision = Field(
        default="fp32",
        description="bf16: forward passes under bf16 autocast where the device supports it (weights, gradients and "
        "optimizer state stay fp32; DeepSpeed through its torch_autocast section). See docs/performance.md.",
        examples=["bf16"],
    )
    tf32: bool = Field(
        default=False,
        description="CUDA only: float32 matmuls on TF32 tensor cores. Faster for fp32 training; results differ from "
        "tf32: false in the last bits, and stay identical run to run. See docs/performance.md.",
        examples=[False],
    )
    lr_schedule: LrSchedule = Field(default="constant", description="Learning-rate decay after warmup.", examples=["cosine"])
    warmup_steps: int = Field(default=0, ge=0, description="Linear warmup steps.", examples=[100])
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW weight decay.", examples=[0.01])


class TestingSpec(_Model):
    inject_nan_at_step: int | None = Field(
        default=None, ge=1, description="For tests of the NaN guard only: make the loss NaN at this step.", examples=[None]
    )
    crash_first_try_after_step: int | None = Field(
        default=None, ge=1,
        description="For tests of retry/resume only: the first try of the train task exits abruptly after this step's checkpoint.",
        examples=[None],
    )
    step_delay_seconds: float = Field(
        default=0.0, ge=0, le=10,
        description="For tests of preemption only: the trainer sleeps this long after every step (changes no result).",
        examples=[0.0],
    )


class CheckpointSpec(_Model):
    every_n_steps: int | None = Field(default=None, gt=0, description="Checkpoint every N optimizer steps.", examples=[100])
    every: Duration | None = Field(default=None, description="Checkpoint at least this often (wall time).", examples=["20m"])
    keep_last: int = Field(default=3, ge=1, description="Committed checkpoints kept per run.", examples=[3])
    keep_best: bool = Field(default=True, description="Also keep the checkpoint with the lowest validation loss.", examples=[True])
    validation_fraction: float = Field(
        default=0.1, ge=0, lt=1, description="Share of the train split used for the validation loss that picks the best checkpoint.", examples=[0.1]
    )
    stall_timeout: Duration = Field(
        default=timedelta(hours=1),
        description="The checkpoint sensor fails the run when no new checkpoint was committed for this long while training runs.",
        examples=["30m"],
    )


class ClipSpec(_Model):
    min: float | None = Field(default=None, description="Values below become this.", examples=[0])
    max: float | None = Field(default=None, description="Values above become this.", examples=[10000])


def _normalise_clip(value: Any) -> Any:
    # YAML friendly form: [min, max] (either may be null).
    if isinstance(value, list) and len(value) == 2:
        return {"min": value[0], "max": value[1]}
    return value


CATEGORICAL_ONLY_OPTIONS: tuple[str, ...] = ("encode", "max_categories", "hash_buckets")
NUMERIC_ONLY_OPTIONS: tuple[str, ...] = ("impute", "fill_value", "missing_indicator", "clip", "transform", "standardize")


class TransformSpec(_Model):
    """How one feature column becomes model inputs. Fitted on the train split only, shipped inside the model."""

    type: FeatureType | None = Field(
        default=None,
        description="numeric, or categorical (values compared as text). Omitted: categorical when encode, "
        "max_categories or hash_buckets is given, else numeric.",
        examples=["categorical"],
    )
    impute: ImputeStrategy | None = Field(
        default=None,
        description="Numeric: fill missing values with the train split's mean or median, or fill_value. "
        "Without it a missing value is an error.",
        examples=["median"],
    )
    fill_value: float | None = Field(default=None, description="Numeric, impute: constant: the value.", examples=[0])
    missing_indicator: bool = Field(
        default=False, description="Numeric, with impute: add a 0/1 input marking the rows that were missing.", examples=[True]
    )
    clip: Annotated[
        ClipSpec | None,
        BeforeValidator(_normalise_clip),
        WithJsonSchema({"anyOf": [
            {"type": "array", "minItems": 2, "maxItems": 2, "items": {"type": ["number", "null"]}},
            ClipSpec.model_json_schema(), {"type": "null"}],
            "description": "Numeric: clip to [min, max] (after imputing, before log1p); either may be null."}),
    ] = Field(default=None, description="Numeric: clip to [min, max].", examples=[{"min": 0}])
    transform: NumericTransform | None = Field(
        default=None, description="Numeric: log(1 + x), after clipping (values must be > -1).", examples=["log1p"]
    )
    standardize: bool = Field(
        default=True, description="Numeric: subtract the train split's mean, divide by its standard deviation (last).",
        examples=[True],
    )
    encode: CategoricalEncoding | None = Field(
        default=None,
        description="Categorical: one_hot (the max_categories most frequent values of the train split, plus an "
        "'other' input for the rest and for values unseen at serving) or hashing (hash_buckets inputs). "
        "Default one_hot. A missing value is the category '<missing>'.",
        examples=["one_hot"],
    )
    max_categories: int | None = Field(
        default=None, ge=1, description="Categorical, one_hot: categories kept (default 20).", examples=[20]
    )
    hash_buckets: int | None = Field(
        default=None, ge=2, description="Categorical, hashing: number of buckets (default 32).", examples=[32]
    )

    @property
    def resolved_type(self) -> str:
        if self.type is not None:
            return self.type
        categorical = any(getattr(self, name) is not None for name in CATEGORICAL_ONLY_OPTIONS)
        return "categorical" if categorical else "numeric"


class CacheSpec(_Model):
    """Unchanged inputs train nothing: the training key of a run found on a registered version."""

    enabled: bool = Field(
        default=True,
        description="Before train, look for a registered version trained on the same inputs (the snapshot, the "
        "result-changing settings, the trainer's version and the run's overrides); when one exists, train, "
        "evaluate, gate, register and promote are skipped. A manual run with `force: true` in its conf trains anyway.",
        examples=[True],
    )
    max_age: Duration = Field(
        default=timedelta(days=30),
        description="A version older than this no longer counts: the run trains again. The platform may cap it "
        "(limits.max_cache_age).",
        examples=["30d"],
    )


class EarlyStoppingSpec(_Model):
    """Stop training when the validation loss stops improving; the best epoch's weights are the model."""

    metric: EarlyStoppingMetric = Field(
        default="validation_loss", description="What is watched on the validation split at each epoch end.",
        examples=["validation_loss"],
    )
    patience: int = Field(
        default=3, ge=1, description="Epochs in a row without an improvement after which training stops.",
        examples=[3],
    )
    min_delta: float = Field(
        default=0.0, ge=0, description="An improvement is a decrease by more than this.", examples=[0.0]
    )


class TrainingSpec(_Model):
    task: TaskType = Field(description="What the model predicts.", examples=["binary_classification"])
    model: ModelSpec = Field(default_factory=ModelSpec, description="The model to train.", examples=[{"type": "mlp"}])
    features: list[str] = Field(
        min_length=1,
        description="Feature columns. Numeric and standardised unless training.transforms declares otherwise.",
        examples=[["amount", "merchant_risk"]],
    )
    transforms: dict[str, TransformSpec] = Field(
        default_factory=dict,
        description="Per feature (by column name), how it becomes model inputs when not plain numeric: impute, "
        "clip, log1p, standardize; or categorical one_hot/hashing. Fitted on the train split, shipped in the model.",
        examples=[{"merchant_category": {"type": "categorical", "encode": "one_hot", "max_categories": 20},
                   "income": {"impute": "median", "missing_indicator": True, "transform": "log1p"}}],
    )
    label: str = Field(description="Label column (relevance grade for ranking).", examples=["is_fraud"])
    group_column: str | None = Field(
        default=None, description="Ranking only: the query id column.", examples=["query_id"]
    )
    epochs: int = Field(default=1, ge=1, description="Passes over the training split.", examples=[3])
    batch_size: int = Field(default=256, ge=1, description="Per-process batch size (rows; queries for listwise ranking).", examples=[256])
    learning_rate: float = Field(default=1e-3, gt=0, description="Adam learning rate.", examples=[0.001])
    early_stopping: EarlyStoppingSpec | None = Field(
        default=None,
        description="Judge the validation loss (on checkpoint.validation_fraction of the train split) at each epoch "
        "end; stop after `patience` epochs without an improvement. The weights of the best epoch are the model, "
        "so set a generous `epochs`. Needs checkpoint.keep_best (the validation split).",
        examples=[{"metric": "validation_loss", "patience": 3, "min_delta": 0}],
    )
    seed: int = Field(default=0, ge=0, description="Seed for initialisation, shuffling and the holdout split.", examples=[42])
    data_placement: DataPlacement = Field(
        default="auto",
        description="On CUDA, where the training split is kept: device (GPU memory, batches taken there), host "
        "(pinned memory, each batch copied one ahead on a side stream), or auto (device when the splits take under "
        "half the GPU's free memory). The batches are the same either way. See docs/performance.md.",
        examples=["auto"],
    )
    distributed: DistributedSpec = Field(default_factory=DistributedSpec, description="How training is spread.", examples=[{"nproc_per_node": 2}])
    optimization: OptimizationSpec = Field(default_factory=OptimizationSpec, description="Optimizer step details.", examples=[{"gradient_clip_norm": 1.0}])
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec, description="When checkpoints are written.", examples=[{"every_n_steps": 100}])
    preemption: PreemptionSpec = Field(
        default_factory=PreemptionSpec,
        description="What a SIGTERM (spot preemption, eviction, a worker's shutdown) does.",
        examples=[{"max_restarts": 3}],
    )
    launcher: Launcher = Field(
        default="local",
        description="Where torchrun runs: 'local' (a subprocess on the Airflow worker) or 'kubernetes' (pods; see training.kubernetes).",
        examples=["local"],
    )
    kubernetes: KubernetesSpec | None = Field(
        default=None, description="Required when launcher is 'kubernetes': image, resources, scheduling.", examples=[None]
    )
    testing: TestingSpec = Field(default_factory=TestingSpec, description="Options meant for trainpipe's own tests.", examples=[{}])
    cache: CacheSpec = Field(
        default_factory=CacheSpec,
        description="Skip a training whose inputs are unchanged since a registered version (docs: lifecycle, "
        "Unchanged inputs).",
        examples=[{"enabled": True, "max_age": "30d"}],
    )



# ---------------------------------------------------------------------------------------------
# evaluation, gates, registration

_GATE = re.compile(
    r"^\s*(?:worst_slice\(\s*(?P<slice_metric>[A-Za-z_][\w@]*)\s*\)|(?P<metric>[A-Za-z_][\w@]*))"
    r"\s*(?P<op>>=|<=|>|<)\s*(?:(?P<baseline>baseline)(?:\s*(?P<margin_sign>[+-])\s*(?P<margin>\d+(?:\.\d+)?|\.\d+))?"
    r"|(?P<sign>[+-])?\s*(?P<value>\d+(?:\.\d+)?|\.\d+)\s*(?P<pct>%)?)\s*$"
)
# The right-hand side that compares with the evaluation's baseline model ("rmse <= baseline").
BASELINE = "baseline"
# The gate on the worst slice; "min_slice"/"max_slice" are refused with a pointer to it, since
# which of the two is the worst depends on the metric.
WORST_SLICE = "worst_slice"


class GateSpec(_Model):
    metric: str = Field(description="Metric computed by evaluation.", examples=["auc"])
    op: Literal[">=", ">", "<=", "<"] = Field(description="Comparison.", examples=[">="])
    threshold: float = Field(description="Absolute value, or relative change for relative gates (0.005 = 0.5%).", examples=[0.8])
    relative: bool = Field(
        default=False,
        description="Compare the change over the current champion instead of the value; passes when there is no champion yet.",
        examples=[False],
    )
    worst_slice: bool = Field(
        default=False,
        description="Apply the gate to the worst value over every slice of evaluation.slices (the lowest, or the "
        "highest for log_loss, rmse and mae) instead of the whole holdout.",
        examples=[False],
    )
    baseline: bool = Field(
        default=False,
        description="Compare with the baseline model of the evaluation (ridge, logistic regression or a linear "
        "scorer, fitted on the same train split) plus threshold: 'rmse <= baseline', 'auc >= baseline + 0.01'.",
        examples=[False],
    )

    @model_validator(mode="after")
    def _one_reference(self) -> GateSpec:
        if self.baseline and self.relative:
            raise ValueError("a gate compares with the champion (relative) or with the baseline, not both")
        if self.baseline and self.worst_slice:
            raise ValueError("the baseline is scored on the whole holdout: write 'METRIC OP baseline' without "
                             f"{WORST_SLICE}()")
        return self

    def __str__(self) -> str:
        metric = f"{WORST_SLICE}({self.metric})" if self.worst_slice else self.metric
        if self.baseline:
            margin = f" {'-' if self.threshold < 0 else '+'} {abs(self.threshold):g}" if self.threshold else ""
            return f"{metric} {self.op} {BASELINE}{margin}"
        if self.relative:
            return f"{metric} {self.op} {self.threshold * 100:+g}% vs champion"
        return f"{metric} {self.op} {self.threshold:g}"


def _parse_gate(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    match = _GATE.match(value)
    if not match:
        wrong_slice = re.match(r"^\s*(min|max)_slice\(\s*([^)\s]*)", value)
        if wrong_slice:
            raise ValueError(
                f"cannot read gate {value!r}: write '{WORST_SLICE}({wrong_slice[2]}) OP VALUE'; the worst slice is "
                "the lowest value, or the highest for log_loss, rmse and mae"
            )
        raise ValueError(
            f"cannot read gate {value!r}: write 'METRIC OP VALUE' such as 'auc >= 0.80', a relative "
            "improvement over the champion such as 'ndcg@10 >= +0.5%', a comparison with the baseline model "
            f"such as 'rmse <= baseline' or 'auc >= baseline + 0.01', or a gate on the worst slice such as "
            f"'{WORST_SLICE}(auc) >= 0.75'"
        )
    on_slices = match["slice_metric"] is not None
    metric = match["slice_metric"] if on_slices else match["metric"]
    if match["baseline"]:
        margin = float(match["margin"] or 0.0) * (-1 if match["margin_sign"] == "-" else 1)
        return {"metric": metric, "op": match["op"], "threshold": margin, "relative": False,
                "worst_slice": on_slices, "baseline": True}
    if match["pct"] and not match["sign"]:
        # "rmse < 65 %" reads like an absolute bound in percent; a change over the champion says its direction.
        raise ValueError(
            f"cannot read gate {value!r}: a relative gate (a change over the champion) needs an explicit sign: "
            f"write '{metric} {match['op']} +{match['value']}%' or '{metric} {match['op']} -{match['value']}%' "
            "(the change over the champion, + for better); for an absolute bound drop the %"
        )
    number = float(match["value"])
    relative = bool(match["sign"] or match["pct"])
    if match["pct"]:
        number /= 100.0
    if match["sign"] == "-":
        number = -number
    return {"metric": metric, "op": match["op"], "threshold": number, "relative": relative, "worst_slice": on_slices}


class EvaluationSpec(_Model):
    metrics: list[str] = Field(min_length=1, description="Metrics computed on the holdout.", examples=[["auc", "f1"]])
    gates: list[
        Annotated[
            GateSpec,
            BeforeValidator(_parse_gate),
            WithJsonSchema({
                "anyOf": [
                    {"type": "string", "pattern": r"^\s*([A-Za-z_][\w@]*|worst_slice\(\s*[A-Za-z_][\w@]*\s*\))\s*(>=|<=|>|<)\s*(baseline(\s*[+-]\s*(\d+(\.\d+)?|\.\d+))?|[+-]?\s*(\d+(\.\d+)?|\.\d+)\s*%?)\s*$"},
                    GateSpec.model_json_schema(),
                ],
                "description": "'METRIC OP VALUE' (absolute), 'METRIC OP +N%' (relative to the champion: the sign "
                "is required), 'METRIC OP baseline [+|- MARGIN]' (against the baseline model), the first two "
                "also on 'worst_slice(METRIC)' (the worst slice of evaluation.slices).",
            }),
        ]
    ] = Field(
        default_factory=list,
        description="All must pass before the model is registered: 'auc >= 0.80' (absolute), "
        "'auc >= +0.1%' (relative to the current champion; the sign is required), 'auc >= baseline + 0.01' "
        "(against the baseline model fitted on the same split), or 'worst_slice(auc) >= 0.75' (the worst slice "
        "of evaluation.slices: the lowest value, the highest for log_loss, rmse and mae).",
        examples=[["auc >= 0.80", "auc >= +0.1%", "auc >= baseline + 0.01", "worst_slice(auc) >= 0.75"]],
    )
    slices: Annotated[
        list[str],
        BeforeValidator(lambda value: [value] if isinstance(value, str) else value),
        WithJsonSchema({"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}),
    ] = Field(
        default_factory=list,
        description="Columns of the data to slice the holdout by: every metric is computed for each value of each "
        "column (missing values form their own slice), shown in the evaluation report, and gated by "
        "'worst_slice(METRIC)' gates. One column or a list; the columns need not be features, and validation "
        "requires them in the data.",
        examples=[["region"]],
    )
    holdout_fraction: float = Field(
        default=0.2, gt=0, lt=1, description="Share of the snapshot held out for evaluation (by row, or by query for ranking).", examples=[0.2]
    )
    decision_threshold: float = Field(
        default=0.5, gt=0, lt=1, description="Binary classification: probability above which a row is positive.", examples=[0.5]
    )
    on_gate_failure: Literal["skip", "fail"] = Field(
        default="skip",
        description="When a gate fails: 'skip' ends the run successfully without registering (the gate task "
        "short-circuits); 'fail' fails the gate task and so the run, with the gate table as the error. Either way "
        "the table is logged at WARNING, the run's note says which gates failed, and notify.*.events: gate_failure "
        "sends it.",
        examples=["fail"],
    )


class ApprovalSpec(_Model):
    mode: Literal["none", "required"] = Field(
        default="required",
        description="'required': an `approve` task between register and promote waits for a person (Airflow's "
        "Required Actions, or the REST API); 'none': promote right after register.",
        examples=["required"],
    )
    timeout: Duration | None = Field(
        default=timedelta(hours=24),
        description="How long the approval waits for an answer; then on_timeout decides. While it waits, the next "
        "run of the pipeline waits too (one run at a time).",
        examples=["24h"],
    )
    on_timeout: Literal["reject", "approve"] = Field(
        default="reject",
        description="The answer when nobody answered within timeout: 'reject' (the version stays challenger, "
        "tagged rejected) or 'approve'.",
        examples=["reject"],
    )


def _normalise_approval(value: Any) -> Any:
    # YAML friendly forms: "none" / "required" -> {mode: ...}.
    if isinstance(value, str):
        return {"mode": value.strip()}
    return value


class BacktestSpec(_Model):
    """A run for a past window (a backfill, or data older than the champion's): what it may do."""

    # "register" as a Python name would shadow pydantic's BaseModel.register (a warning at every import).
    register_version: bool = Field(
        default=False,
        alias="register",
        description="Register the backtest's model as a version tagged `trainpipe.backtest=true` (never "
        "challenger). false: it trains, evaluates and records its metrics on the MLflow run only.",
        examples=[True],
    )
    alias: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z][\w-]*$",
        description="With register: true, the alias the registered backtest version takes (a plain name, kept "
        "literal; not the production, challenger or previous alias, nor champion, challenger or "
        "previous_champion). null: no alias.",
        examples=["backtest"],
    )
    promote: Literal["deny", "allow"] = Field(
        default="deny",
        description="'deny': a backtest moves no alias of the lifecycle and never becomes the validation "
        "baseline. 'allow': a run for a past window is treated as any other run (register, promote, baseline).",
        examples=["deny"],
    )


# A name that becomes an MLflow name or a storage path segment: plain text that MLflow, a URL and a file
# system all read the same way (and a policy's model_name_prefix matches as written).
_PLAIN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,199}$")


def plain_name_problem(value: str) -> str | None:
    """Why ``value`` is not a plain name (letters, digits, '_', '-' and '.', no '..'), or None."""
    if _PLAIN_NAME.fullmatch(value) and ".." not in value:
        return None
    return (f"must be a plain name: letters, digits, '_', '-' and '.', starting with a letter or digit, without "
            f"'..', at most 200 characters (it becomes an MLflow name and a storage path segment); got {value!r}")


class RegistrationSpec(_Model):
    model_name: str = Field(
        description="MLflow registered model name: a plain name (letters, digits, '_', '-' and '.', no '..').",
        examples=["fraud_detector"],
    )

    @field_validator("model_name")
    @classmethod
    def _plain_model_name(cls, value: str) -> str:
        problem = plain_name_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    alias: str = Field(
        default="champion",
        pattern=r"^[A-Za-z][\w-]*$",
        description="The production alias: `promote` moves it to the new version when every gate passes "
        "(and the approval, if any, is given).",
        examples=["champion"],
    )
    challenger_alias: str = Field(
        default="challenger",
        pattern=r"^[A-Za-z][\w-]*$",
        description="Alias `register` gives each new version, before it is promoted.",
        examples=["challenger"],
    )
    previous_alias: str = Field(
        default="previous_champion",
        pattern=r"^[A-Za-z][\w-]*$",
        description="Alias the replaced production version keeps on promotion; `trainpipe rollback` moves "
        "the production alias back to it.",
        examples=["previous_champion"],
    )
    approval: Annotated[
        ApprovalSpec,
        BeforeValidator(_normalise_approval),
        WithJsonSchema({
            "anyOf": [{"type": "string", "enum": ["none", "required"]}, ApprovalSpec.model_json_schema()],
            "description": "'none', 'required', or {mode: required, timeout: 24h, on_timeout: reject | approve}.",
        }),
    ] = Field(
        default_factory=lambda: ApprovalSpec(mode="none"),
        description="Human approval before promotion: 'none' (promote when the gates pass), 'required' (a person "
        "approves in Airflow's Required Actions or through the REST API; unanswered after 24h: rejected), or "
        "{mode: required, timeout: 2h, on_timeout: reject | approve}.",
        examples=["required", {"mode": "required", "timeout": "8h", "on_timeout": "reject"}],
    )
    backtest: BacktestSpec = Field(
        default_factory=BacktestSpec,
        description="A backtest is a backfill run, or a run whose data window ends before the current production "
        "version's training window ends. By default it trains, evaluates and records its metrics, moves no alias "
        "and leaves the validation baseline as it is.",
        examples=[{"register": True, "alias": "backtest", "promote": "deny"}],
    )


# ---------------------------------------------------------------------------------------------
# notifications

NotifyEvent = Literal["gate_failure", "task_failure", "approval", "promotion"]
NOTIFY_EVENTS: tuple[str, ...] = ("gate_failure", "task_failure", "approval", "promotion")


def _one_or_many(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


class EmailNotifySpec(_Model):
    to: Annotated[list[Annotated[str, Field(min_length=3)]], BeforeValidator(_one_or_many)] = Field(
        min_length=1,
        description="Recipient address, or a list of them.",
        examples=[["ml-oncall@example.com"]],
    )
    conn_id: str = Field(
        default="smtp_default",
        description="Airflow SMTP connection (host, port, login, password, TLS): credentials stay in Airflow, never in YAML.",
        examples=["smtp_default"],
    )
    from_email: str | None = Field(
        default=None,
        description="Sender address; the connection's `from_email` extra when omitted.",
        examples=["trainpipe@example.com"],
    )
    # Not `on`: YAML 1.1 reads that key as the boolean true.
    events: list[NotifyEvent] = Field(
        default_factory=lambda: list(NOTIFY_EVENTS),
        min_length=1,
        description="Which events send a message: gate_failure (with the gate table), task_failure (a task failed "
        "for good, after its retries), approval (a version waits for a person's approval), promotion (a version "
        "became the production alias). All four by default.",
        examples=[["gate_failure", "task_failure"]],
    )


class SlackNotifySpec(_Model):
    channel: str = Field(min_length=1, description="Slack channel to post to.", examples=["#ml-alerts"])
    conn_id: str = Field(
        default="slack_api_default",
        description="Airflow Slack API connection (the bot token lives there, never in YAML). Needs the Slack "
        "provider: pip install apache-airflow-providers-slack.",
        examples=["slack_api_default"],
    )
    events: list[NotifyEvent] = Field(
        default_factory=lambda: list(NOTIFY_EVENTS),
        min_length=1,
        description="Which events post a message; see notify.email.events.",
        examples=[["gate_failure", "promotion"]],
    )


class DeadlineSpec(_Model):
    within: Duration = Field(
        description="How long after the run was queued it must have ended: then an Airflow Deadline Alert sends the "
        "notify channels a message naming the step the run is in. The platform may cap it "
        "(limits.max_deadline_within).",
        examples=["6h"],
    )


class NotifySpec(_Model):
    email: EmailNotifySpec | None = Field(
        default=None, description="E-mail through Airflow's SMTP provider (SmtpNotifier).",
        examples=[{"to": "ml-oncall@example.com", "conn_id": "smtp_default"}],
    )
    slack: SlackNotifySpec | None = Field(
        default=None, description="Slack through Airflow's Slack provider (SlackNotifier).",
        examples=[{"channel": "#ml-alerts"}],
    )
    deadline: DeadlineSpec | None = Field(
        default=None, description="A run still going this long after it was queued is late: every channel above is "
        "told, with the step the run is in (Airflow Deadline Alerts, Airflow 3.1 or later).",
        examples=[{"within": "6h"}],
    )

    @model_validator(mode="after")
    def _some_channel(self) -> NotifySpec:
        if self.email is None and self.slack is None:
            raise ValueError("name at least one channel: email (to, conn_id) or slack (channel, conn_id)")
        return self


# ---------------------------------------------------------------------------------------------
# run parameters

# The settings a run parameter or a hyperparameter search may change, each once: name -> (path in the
# spec, JSON Schema type of a run parameter or None when only a search sets it, the search's kind or
# None when only a run parameter sets it). A search's kind: "float", "int", or "layers" (a list of sizes).
_RUN_SETTINGS: dict[str, tuple[tuple[str, ...], str | None, str | None]] = {
    "epochs": (("training", "epochs"), "integer", None),
    "batch_size": (("training", "batch_size"), "integer", "int"),
    "learning_rate": (("training", "learning_rate"), "number", "float"),
    "seed": (("training", "seed"), "integer", None),
    "dropout": (("training", "model", "dropout"), "number", "float"),
    "hidden_layers": (("training", "model", "hidden_layers"), None, "layers"),
    "gradient_clip_norm": (("training", "optimization", "gradient_clip_norm"), "number", "float"),
    "warmup_steps": (("training", "optimization", "warmup_steps"), "integer", "int"),
    "weight_decay": (("training", "optimization", "weight_decay"), "number", "float"),
    "decision_threshold": (("evaluation", "decision_threshold"), "number", None),
}
# Param name -> (path in the spec, JSON Schema type). Only these can be overridden per run.
OVERRIDABLE_PARAMS: dict[str, tuple[tuple[str, ...], str]] = {
    name: (path, json_type) for name, (path, json_type, _) in _RUN_SETTINGS.items() if json_type is not None}


class ParamSpec(_Model):
    default: float | int | None = Field(
        default=None, description="Default shown in the trigger form; the spec's own value when omitted.", examples=[0.003]
    )
    description: str = Field(default="", description="Help text in the trigger form.", examples=["Adam learning rate"])
    minimum: float | None = Field(default=None, description="Smallest accepted value.", examples=[0.00001])
    maximum: float | None = Field(default=None, description="Largest accepted value.", examples=[0.1])


# ---------------------------------------------------------------------------------------------
# hyperparameter search

# Hyperparameter -> (path in the spec, kind), from the same table.
TUNABLE_PARAMS: dict[str, tuple[tuple[str, ...], str]] = {
    name: (path, kind) for name, (path, _, kind) in _RUN_SETTINGS.items() if kind is not None}
DISTRIBUTIONS = ("log_uniform", "uniform", "int", "choice")


class DistributionSpec(_Model):
    """One hyperparameter's search range: exactly one of the keys."""

    log_uniform: tuple[float, float] | None = Field(
        default=None, description="[low, high], sampled uniformly in log space; both > 0.", examples=[[0.0001, 0.1]])
    uniform: tuple[float, float] | None = Field(default=None, description="[low, high], sampled uniformly.", examples=[[0.0, 0.5]])
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
        return list(self.choice if self.choice is not None else (self.log_uniform or self.uniform or self.int_range))


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


class PrunerSpec(_Model):
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


class TuningSpec(_Model):
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
    sampler: Literal["tpe", "random"] = Field(default="tpe", description="Optuna sampler: TPE (Bayesian) or random.", examples=["tpe"])
    seed: int = Field(default=0, ge=0, description="The sampler's seed (a study is reproducible when trials run one at a time).", examples=[0])
    pruner: Annotated[
        PrunerSpec,
        BeforeValidator(_normalise_pruner),
        WithJsonSchema({"anyOf": [{"type": "string", "enum": list(PRUNERS)}, PrunerSpec.model_json_schema()]}),
    ] = Field(
        default=DEFAULT_PRUNER,
        description="Stops poor trials at the trainer's evaluation points: a name (hyperband, successive_halving, "
        "median, none) with its measured default options, or {type: ..., min_resource: ..., ...}.",
        examples=["successive_halving", {"type": "successive_halving", "min_resource": 5, "reduction_factor": 3}])
    trial_epochs: int | None = Field(
        default=None, ge=1, description="Epochs of each trial; training.epochs when omitted. The final training always runs training.epochs.",
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
        f"{{int: [lo, hi]}} or {{choice: [...]}}. Names: {', '.join(sorted(TUNABLE_PARAMS))}.",
        examples=[{"learning_rate": {"log_uniform": [0.0001, 0.1]}, "batch_size": {"choice": [32, 64, 128]}}])


# ---------------------------------------------------------------------------------------------
# the pipeline

_SCHEDULE_PRESETS = ("@once", "@hourly", "@daily", "@weekly", "@monthly", "@quarterly", "@yearly", "@annually")


class AssetScheduleSpec(_Model):
    assets: list[str] = Field(
        min_length=1,
        description="Run when these Airflow Assets are updated (their URIs), e.g. another pipeline's snapshot or model.",
        examples=[["trainpipe://fraud_detector/model"]],
    )
    mode: Literal["all", "any"] = Field(
        default="all", description="'all': run once every listed asset was updated; 'any': on each update of any.", examples=["any"]
    )


def _normalise_schedule(value: Any) -> Any:
    if isinstance(value, dict):
        return value
    if value is None or (isinstance(value, str) and value.strip().lower() in {"none", "null", ""}):
        return None
    if isinstance(value, str):
        value = value.strip()
        if value.startswith("@"):
            if value not in _SCHEDULE_PRESETS:
                raise ValueError(f"unknown schedule preset {value!r}; use one of {', '.join(_SCHEDULE_PRESETS)}")
            return value
        from croniter import croniter  # Airflow's own cron parser; imported here to keep model import cheap

        if not croniter.is_valid(value):
            raise ValueError(f"invalid cron expression {value!r}; expected five fields such as '0 0 * * *'")
    return value


class PipelineSpec(_Model):
    pipeline_id: str = Field(
        pattern=r"^[A-Za-z][A-Za-z0-9_\-]*$",
        description="Unique id; becomes the DAG id.",
        examples=["fraud_detector"],
    )
    description: str = Field(default="", description="Shown in the Airflow UI.", examples=["Nightly fraud model retrain"])
    owner: str = Field(default="trainpipe", description="Airflow owner.", examples=["risk-ml"])
    tags: list[str] = Field(default_factory=list, description="Airflow DAG tags.", examples=[["fraud"]])
    schedule: Annotated[str | AssetScheduleSpec | None, BeforeValidator(_normalise_schedule)] = Field(
        default=None,
        description="Cron expression, preset (@daily), none (manual triggers only), or {assets: [...]} (data-aware).",
        examples=["0 0 * * *", "@daily", "none", {"assets": ["trainpipe://transactions_ingest/snapshot"]}],
    )
    start_date: datetime = Field(
        default=datetime(2025, 1, 1, tzinfo=timezone.utc),
        description="First logical date; runs are not back-filled (catchup off).",
        examples=["2025-01-01"],
    )
    priority: Literal["low", "normal", "high"] | None = Field(
        default=None,
        description="Share of contended GPUs: the train and trial tasks' Airflow priority_weight and, on "
        "Kubernetes, the PriorityClass trainpipe-<priority> (and Kueue's WorkloadPriorityClass of the same name "
        "with training.kubernetes.queue). The platform may cap it. Unset: normal in Airflow, no class on Kubernetes.",
        examples=["high"],
    )
    retries: int = Field(default=1, ge=0, description="Airflow retries per task.", examples=[1])
    retry_delay: Duration = Field(default=timedelta(minutes=5), description="Wait between task tries.", examples=["5m"])
    data: DataSpec = Field(description="The input dataset.", examples=[{"uri": "demo/transactions/transactions.parquet"}])
    validation: ValidationSpec = Field(default_factory=ValidationSpec, description="Data checks before training.", examples=[{"max_volume_change": 0.2}])
    training: TrainingSpec = Field(description="What and how to train.", examples=[{"task": "binary_classification"}])
    evaluation: EvaluationSpec = Field(description="Holdout metrics and gates.", examples=[{"metrics": ["auc"]}])
    registration: RegistrationSpec = Field(description="Where the model is registered.", examples=[{"model_name": "fraud_detector"}])
    notify: NotifySpec | None = Field(
        default=None,
        description="Messages on gate failure, task failure, pending approval and promotion, sent through "
        "Airflow's notifiers with the connections named here.",
        examples=[{"email": {"to": "ml-oncall@example.com", "conn_id": "smtp_default", "events": ["gate_failure"]}}],
    )
    params: dict[str, ParamSpec] = Field(
        default_factory=dict,
        description="Run parameters shown in 'Trigger DAG w/ config'; each overrides the hyperparameter of the same name "
        f"for that run only. Names: {', '.join(sorted(OVERRIDABLE_PARAMS))}.",
        examples=[{"learning_rate": {"description": "Adam learning rate for this run", "minimum": 0.00001}}],
    )
    tuning: TuningSpec | None = Field(
        default=None,
        description="Hyperparameter search before training: an Optuna study of n_trials trials, then the final "
        "training with the best trial's parameters.",
        examples=[{"n_trials": 20, "max_parallel": 2, "space": {"learning_rate": {"log_uniform": [0.0001, 0.1]}}}],
    )


def overridden_value(spec: PipelineSpec, name: str) -> Any:
    """The spec's current value of the hyperparameter that run parameter ``name`` overrides."""
    value: Any = spec
    for part in OVERRIDABLE_PARAMS[name][0]:
        value = getattr(value, part)
    return value


@functools.cache
def _field_bounds(name: str) -> tuple[ParamBound, ...]:
    return bounds_at(OVERRIDABLE_PARAMS[name][0])


@functools.cache
def bounds_at(path: tuple[str, ...]) -> tuple[ParamBound, ...]:
    """The constraints (ge, gt, le, lt) of the spec field at ``path``, as bounds."""
    model: Any = PipelineSpec
    field = None
    for part in path:
        field = model.model_fields[part]
        model = field.annotation
    keywords = {"ge": "minimum", "gt": "exclusiveMinimum", "le": "maximum", "lt": "exclusiveMaximum"}
    return tuple(
        ParamBound(keyword, getattr(constraint, attribute), ".".join(path))
        for constraint in field.metadata
        for attribute, keyword in keywords.items()
        if hasattr(constraint, attribute)
    )


def param_bounds(name: str, param: ParamSpec) -> tuple[ParamBound, ...]:
    """The tightest lower and upper bound of a run parameter: the spec's declared ``minimum`` and
    ``maximum`` intersected with its field's own constraints, so that the trigger form refuses what
    the run would refuse (``epochs: 0``, ``learning_rate: 0``)."""
    declared = [ParamBound(k, v, f"params.{name}.{k}")
                for k, v in (("minimum", param.minimum), ("maximum", param.maximum)) if v is not None]
    candidates = [*_field_bounds(name), *declared]
    lows = [b for b in candidates if b.keyword in ("minimum", "exclusiveMinimum")]
    highs = [b for b in candidates if b.keyword in ("maximum", "exclusiveMaximum")]
    # At equal values the exclusive bound is the tighter one.
    tightest = []
    if lows:
        tightest.append(max(lows, key=lambda b: (b.value, b.keyword == "exclusiveMinimum")))
    if highs:
        tightest.append(min(highs, key=lambda b: (b.value, b.keyword != "exclusiveMaximum")))
    return tuple(tightest)
