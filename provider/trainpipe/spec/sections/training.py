"""The spec's ``training:`` section."""

from __future__ import annotations

import math
import re
from datetime import timedelta
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, WithJsonSchema, field_validator, model_validator

from trainpipe import uris
from trainpipe.errors import shown_value
from trainpipe.spec.sections.common import SpecModel
from trainpipe.spec.sections.kubernetes import KubernetesSpec
from trainpipe.spec.types import Duration, Launcher

# The choice lists the trainer also reads: defined once, in the trainer contract (ADR 0002).
from trainpipe_trainer.config import (
    BUILT_IN_MODEL_TYPES,
    DEFAULT_TEXT_HASH_BUCKETS,
    DEFAULT_TEXT_MAX_TOKENS,
    MAX_LABEL_CLASSES,
    MAX_SEED,
    MAX_TEXT_HASH_BUCKETS,
    MAX_TEXT_MAX_TOKENS,
    MODEL_TYPE_PATTERN,
    CategoricalEncoding,
    DataPlacement,
    EarlyStoppingMetric,
    FeatureType,
    ImputeStrategy,
    LrSchedule,
    NumericTransform,
    Precision,
    RankingLoss,
    StrategyName,
    TaskType,
    ZeroStage,
)

MAX_LAYERS = 64
MAX_CLASS_NAME_LENGTH = 200
MAX_LAYER_WIDTH = 65_536
# A run (or a run parameter: the field's bounds are the trigger form's) never asks for more: beyond, it never ends.
MAX_EPOCHS = 100_000


# model.params: a family's parameters, data only (JSON values, never rendered, opened or imported by trainpipe).
# Names are identifiers at every level, so a family's error path (``layers.0.width``) reads back unambiguously.
PARAM_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,63}$"
MAX_PARAMS_DEPTH = 8  # mappings and lists nested below model.params
MAX_PARAMS_VALUES = 1_000  # keys and list items, at every level together
MAX_PARAM_TEXT = 4_096  # characters of one string value
# JSON has no integer bound, but the trainer's families read them into int64 tensors and shapes.
_MAX_PARAM_INT = 2**63 - 1
_NAME = re.compile(PARAM_NAME_PATTERN)
# Jinja's delimiters: a value holding one was written to be rendered, which trainpipe never does.
TEMPLATE_MARK = re.compile(r"\{\{|\{%|\{#")


class ModelParamsError(ValueError):
    """``model.params`` holds something that is no bounded JSON data; ``problems``: (path below params, message).

    spec.validate places each problem at its own line (pydantic alone would place them all at ``params``)."""

    def __init__(self, problems: list[tuple[tuple[str | int, ...], str]]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{'.'.join(map(str, path)) or 'params'}: {message}" for path, message in problems))


def params_problems(params: Any) -> list[tuple[tuple[str | int, ...], str]]:
    """Every way ``params`` is not a mapping of parameter names to bounded JSON values, by path below it."""
    problems: list[tuple[tuple[str | int, ...], str]] = []
    count = 0

    def walk(value: Any, path: tuple[str | int, ...]) -> None:
        nonlocal count
        if len(path) > MAX_PARAMS_DEPTH:
            problems.append((path, f"nested more than {MAX_PARAMS_DEPTH} levels below model.params; flatten it"))
            return
        if isinstance(value, dict):
            for key, item in value.items():
                count += 1
                if not isinstance(key, str) or not _NAME.match(key):
                    problems.append(((*path, str(key)), f"{shown_value(key)} is no parameter name (a letter or _, then "
                                     "letters, digits or _, at most 64); rename it"))
                    continue
                walk(item, (*path, key))
        elif isinstance(value, list):
            for index, item in enumerate(value):
                count += 1
                walk(item, (*path, index))
        elif isinstance(value, str):
            if len(value) > MAX_PARAM_TEXT:
                problems.append((path, f"text of {len(value):,} characters, more than {MAX_PARAM_TEXT:,}; shorten it"))
        elif isinstance(value, bool) or value is None:
            pass
        elif isinstance(value, int):
            if abs(value) > _MAX_PARAM_INT:
                problems.append((path, "an integer beyond 64 bits; no family can use it"))
        elif isinstance(value, float):
            if not math.isfinite(value):
                problems.append((path, f"{value} is no JSON number; give a finite one"))
        else:
            problems.append((path, f"a {type(value).__name__} is no JSON value (text, number, true/false, null, a "
                                   "list or a mapping); quote it to pass it as text"))

    if not isinstance(params, dict):
        return [((), "a mapping of parameter names to values (model.params: {depth: 4})")]
    walk(params, ())
    if count > MAX_PARAMS_VALUES:
        problems.append(((), f"{count:,} keys and list items, more than {MAX_PARAMS_VALUES:,}; a family's parameters "
                             "are settings, not data: read large inputs from the training data"))
    return problems


def _checked_params(params: Any) -> Any:
    problems = params_problems(params)
    if problems:
        raise ModelParamsError(problems)
    return params


class ModelSpec(SpecModel):
    type: str = Field(
        default="mlp", pattern=MODEL_TYPE_PATTERN,
        description=f"The model family: built in ({', '.join(BUILT_IN_MODEL_TYPES)}), or one an installed package "
        "registers in the `trainpipe.models` entry-point group (docs/models.md). A name, never a module or a path; "
        "under a platform policy, one of the team's `models.families`.",
        examples=["mlp"],
    )
    # Bounded like every size below: the local launcher trains on a shared Airflow worker, where no pod
    # limit applies, so a model of 10^12 weights would take the worker's memory from every other task.
    hidden_layers: list[Annotated[int, Field(gt=0, le=MAX_LAYER_WIDTH)]] = Field(
        default_factory=lambda: [64, 32], max_length=MAX_LAYERS, description=f"The mlp family: hidden layer sizes "
        f"(at most {MAX_LAYERS} layers of {MAX_LAYER_WIDTH:,} units).", examples=[[64, 32]]
    )
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0, description="The mlp family: dropout after each hidden "
                           "layer.", examples=[0.1])
    ranking_loss: RankingLoss = Field(
        default="listwise",
        description="Ranking only: pointwise regresses relevance, listwise optimises a softmax per query.",
        examples=["listwise"],
    )
    pretrained: str | None = Field(
        default=None, min_length=1, max_length=2048,
        description="The transformer family (required there, refused for the others): the pretrained weights, a "
        "`save_pretrained` folder (model and tokenizer) read as data.uri is: a path relative to the storage root or "
        "an s3:// URI, under a platform policy inside the team's data.uris, without one local folders only under "
        "the storage root. `hf://owner/name` downloads a Hugging Face Hub model, only where the platform policy "
        "sets models.hub: true. Never rendered: a template is refused.",
        examples=["models/distilgpt2", "s3://ml-models/base/gpt2-small/"],
    )
    params: Annotated[dict[str, Any], BeforeValidator(_checked_params), WithJsonSchema({
        "type": "object", "propertyNames": {"pattern": PARAM_NAME_PATTERN},
        "additionalProperties": {"type": ["string", "number", "integer", "boolean", "null", "array", "object"]},
    })] = Field(
        default_factory=dict,
        description="The model family's own parameters (not for mlp, whose settings are hidden_layers and dropout): "
        "names to JSON values (text, numbers, true/false, null, lists and mappings of those; at most "
        f"{MAX_PARAMS_VALUES:,} keys and items, {MAX_PARAMS_DEPTH} levels, {MAX_PARAM_TEXT:,} characters per text). "
        "Passed to the family as data: never rendered, opened or imported; the family checks them before any data is "
        "read.",
        examples=[{"depth": 4, "width": 128}],
    )

    @field_validator("pretrained")
    @classmethod
    def _pretrained_location(cls, value: str | None) -> str | None:
        # By its text alone, with data.uri's rule (the spec stage reads no storage); where it leads is the
        # policy check's (trainpipe.policy.check), and a Hub id is allowed only there.
        if value is None:
            return None
        if TEMPLATE_MARK.search(value):
            raise ValueError(f"{shown_value(value)} holds template markup; a weights location is read literally, "
                             "never rendered: write the folder's path or URI itself")
        problem = uris.hub_problem(value) if uris.is_hub(value) else uris.spec_uri_problem(value)
        if problem is not None:
            if problem.startswith("scheme "):
                problem += "; a Hugging Face Hub model is written hf://owner/name"
            raise ValueError(problem)
        return value


class ElasticSpec(SpecModel):
    min_nodes: int = Field(ge=1, description="Training goes on with this many nodes when others were preempted.",
                           examples=[2])
    max_nodes: int = Field(ge=1, le=100_000, description="Nodes (pods) the Job starts; a replaced pod rejoins.",
                           examples=[4])

    @model_validator(mode="after")
    def _ordered(self) -> ElasticSpec:
        if self.max_nodes < self.min_nodes:
            raise ValueError(f"max_nodes ({self.max_nodes}) must be >= min_nodes ({self.min_nodes})")
        return self


class DistributedSpec(SpecModel):
    nproc_per_node: int = Field(default=1, ge=1, description="Processes per node (GPUs per node on a cluster).", examples=[2])
    nnodes: int = Field(
        default=1, ge=1, le=100_000, description="Number of nodes (with elastic: max_nodes; at most an Indexed "
        "Job's 100,000 completions).", examples=[1],
    )
    elastic: ElasticSpec | None = Field(
        default=None,
        description="Kubernetes, ddp: keep training on between min_nodes and max_nodes nodes (torchrun "
        "--nnodes=MIN:MAX). Ranks of a preempted node stop after committing their step; the others rejoin, and "
        "training resumes resharded at the new size. See docs/preemption.md.",
        examples=[{"min_nodes": 2, "max_nodes": 4}],
    )
    strategy: StrategyName = Field(default="ddp", description="PyTorch DDP, or DeepSpeed ZeRO.", examples=["ddp"])
    zero_stage: ZeroStage = Field(default=0, description="DeepSpeed only: ZeRO stage.", examples=[2])
    offload_optimizer: bool = Field(
        default=False, description="DeepSpeed only: optimizer state in CPU memory (ZeRO >= 1).", examples=[False]
    )
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


class PreemptionSpec(SpecModel):
    max_restarts: int = Field(
        # Bounded: an elastic Job passes it on to torchrun's --max_restarts, which restarts after any failure.
        default=3, ge=0, le=100,
        description="Local launcher: how often a preempted trainer (SIGTERM: it finished its step, committed a "
        "checkpoint of it and exited) is launched again within one task try, resuming at that step. A preemption "
        "beyond this fails the try (the Airflow retry resumes there too). See docs/preemption.md.",
        examples=[3],
    )


class OptimizationSpec(SpecModel):
    gradient_clip_norm: float | None = Field(
        default=None, gt=0, description="Clip the global gradient norm to this value.", examples=[1.0]
    )
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


class TestingSpec(SpecModel):
    inject_nan_at_step: int | None = Field(
        default=None, ge=1, description="For tests of the NaN guard only: make the loss NaN at this step.", examples=[None]
    )
    crash_first_try_after_step: int | None = Field(
        default=None, ge=1,
        description="For tests of retry/resume only: the first try of the train task exits abruptly after this step's "
        "checkpoint.",
        examples=[None],
    )
    step_delay_seconds: float = Field(
        default=0.0, ge=0, le=10,
        description="For tests of preemption only: the trainer sleeps this long after every step (changes no result).",
        examples=[0.0],
    )


class CheckpointSpec(SpecModel):
    every_n_steps: int | None = Field(default=None, gt=0, description="Checkpoint every N optimizer steps.", examples=[100])
    every: Duration | None = Field(default=None, description="Checkpoint at least this often (wall time).", examples=["20m"])
    keep_last: int = Field(default=3, ge=1, le=1000, description="Committed checkpoints kept per run.", examples=[3])
    keep_best: bool = Field(
        default=True, description="Also keep the checkpoint with the lowest validation loss.", examples=[True]
    )
    validation_fraction: float = Field(
        default=0.1,
        ge=0,
        lt=1,
        description="Share of the train split used for the validation loss that picks the best checkpoint.",
        examples=[0.1],
    )
    stall_timeout: Duration = Field(
        default=timedelta(hours=1),
        description="The checkpoint sensor fails the run when no new checkpoint was committed for this long while training runs.",
        examples=["30m"],
    )


class ClipSpec(SpecModel):
    min: float | None = Field(default=None, description="Values below become this.", examples=[0])
    max: float | None = Field(default=None, description="Values above become this.", examples=[10000])


def _normalise_clip(value: Any) -> Any:
    # YAML friendly form: [min, max] (either may be null).
    if isinstance(value, list) and len(value) == 2:
        return {"min": value[0], "max": value[1]}
    return value


# The options each type takes; spec.validate refuses the others at their own line. hash_buckets is also
# text's, and alone (without type) still means categorical: text is never inferred.
CATEGORICAL_ONLY_OPTIONS: tuple[str, ...] = ("encode", "max_categories", "hash_buckets")
NUMERIC_ONLY_OPTIONS: tuple[str, ...] = ("impute", "fill_value", "missing_indicator", "clip", "transform", "standardize")
TEXT_ONLY_OPTIONS: tuple[str, ...] = ("max_tokens", "ngrams")
TEXT_OPTIONS: tuple[str, ...] = ("hash_buckets", *TEXT_ONLY_OPTIONS)
# Categorical hashing's bound; text's is MAX_TEXT_HASH_BUCKETS, just below (spec.validate checks it).
MAX_HASH_BUCKETS = 2**24


class TransformSpec(SpecModel):
    """How one feature column becomes model inputs. Fitted on the train split only, shipped inside the model."""

    type: FeatureType | None = Field(
        default=None,
        description="numeric, categorical (values compared as text), or text (free text: lower-cased words, and "
        "word pairs with ngrams: 2, hashed into hash_buckets token ids; read only by a family that reads token "
        "ids, such as training.model.type: text_bag). Omitted: categorical when encode, max_categories or "
        "hash_buckets is given, else numeric; text is never inferred, only declared.",
        examples=["categorical", "text"],
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
        default=None, ge=1, le=100_000, description="Categorical, one_hot: categories kept (default 20).", examples=[20]
    )
    hash_buckets: int | None = Field(
        default=None, ge=2, le=MAX_HASH_BUCKETS,
        description=f"Categorical, hashing: number of buckets (default 32, at most {MAX_HASH_BUCKETS:,}). Text: "
        f"number of token ids words and word pairs are hashed into (default {DEFAULT_TEXT_HASH_BUCKETS:,}, at most "
        f"{MAX_TEXT_HASH_BUCKETS:,}: ids travel as float32, exact below 2^24); the text_bag family keeps an "
        "embedding per id.",
        examples=[32, DEFAULT_TEXT_HASH_BUCKETS],
    )
    max_tokens: int | None = Field(
        default=None, ge=1, le=MAX_TEXT_MAX_TOKENS,
        description=f"Text: token ids kept per row, the first ones (default {DEFAULT_TEXT_MAX_TOKENS}); each is one "
        "model input, a shorter text is padded.",
        examples=[DEFAULT_TEXT_MAX_TOKENS],
    )
    ngrams: Literal[1, 2] | None = Field(
        default=None,
        description="Text: 1, words only; 2 (the default), words and pairs of adjacent words.",
        examples=[2],
    )

    @property
    def resolved_type(self) -> str:
        if self.type is not None:
            return self.type
        categorical = any(getattr(self, name) is not None for name in CATEGORICAL_ONLY_OPTIONS)
        return "categorical" if categorical else "numeric"


class CacheSpec(SpecModel):
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


class EarlyStoppingSpec(SpecModel):
    """Stop training when the validation loss stops improving; the best epoch's weights are the model."""

    metric: EarlyStoppingMetric = Field(
        default="validation_loss", description="What is watched on the validation split at each epoch end: "
        "validation_loss, or another metric the task's trainer computes (accuracy, auc, macro_f1, rmse, ...; a "
        "loss or error must fall, the others rise).",
        examples=["validation_loss"],
    )
    patience: int = Field(
        default=3, ge=1, description="Epochs in a row without an improvement after which training stops.",
        examples=[3],
    )
    min_delta: float = Field(
        default=0.0, ge=0, description="An improvement is a decrease by more than this.", examples=[0.0]
    )


class TrainingSpec(SpecModel):
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
        "clip, log1p, standardize; categorical one_hot/hashing; or text, hashed word ids for a family that reads "
        "them (text_bag). Fitted on the train split, shipped in the model.",
        examples=[{"merchant_category": {"type": "categorical", "encode": "one_hot", "max_categories": 20},
                   "income": {"impute": "median", "missing_indicator": True, "transform": "log1p"}}],
    )
    # Required for every task but causal_lm (spec.validate says so at the training section, as pydantic would).
    label: str = Field(
        default="", description="Label column (relevance grade for ranking). Required, except for causal_lm: "
        "there the completion column (the loss is on its tokens, after the feature's text), or left out to learn "
        "every next token of the feature's text.", examples=["is_fraud"])
    # Data, never code: each class is compared with the label's values as text and shown escaped.
    label_classes: list[Annotated[str, Field(min_length=1, max_length=MAX_CLASS_NAME_LENGTH)] | int] | None = Field(
        default=None, min_length=2, max_length=MAX_LABEL_CLASSES,
        description="multiclass_classification only: the classes, in the model's output order. Without it the "
        "classes are the label values of the run's snapshot (sorted: numerically when all are whole numbers). "
        "Pin them when a class may be missing from a snapshot or the output order must stay fixed; a row whose "
        "label is none of them is an error.",
        examples=[["setosa", "versicolor", "virginica"]],
    )
    group_column: str | None = Field(
        default=None, description="Ranking only: the query id column.", examples=["query_id"]
    )
    epochs: int = Field(default=1, ge=1, le=MAX_EPOCHS, description="Passes over the training split.", examples=[3])
    batch_size: int = Field(
        default=256, ge=1, le=4_194_304, description="Per-process batch size (rows; queries for listwise ranking).",
        examples=[256]
    )
    learning_rate: float = Field(default=1e-3, gt=0, description="Adam learning rate.", examples=[0.001])
    early_stopping: EarlyStoppingSpec | None = Field(
        default=None,
        description="Judge a validation metric (on checkpoint.validation_fraction of the train split) at each epoch "
        "end; stop after `patience` epochs without an improvement. The weights of the best epoch are the model, "
        "so set a generous `epochs`. Needs checkpoint.keep_best (the validation split).",
        examples=[{"metric": "validation_loss", "patience": 3, "min_delta": 0}],
    )
    seed: int = Field(default=0, ge=0, le=MAX_SEED, description="Seed for initialisation, shuffling and the holdout split.",
                      examples=[42])
    data_placement: DataPlacement = Field(
        default="auto",
        description="Where the training split is kept. stream: read from the dataset version's row groups as the "
        "loop goes (background threads read ahead; memory bounded whatever the data's size; docs/data.md). On CUDA, "
        "device (GPU memory, batches taken there) or host (pinned memory, each batch copied one ahead on a side "
        "stream). auto: stream a manifest dataset version that would not fit in host memory, else device when the "
        "splits take under half the GPU's free memory, else host. See docs/performance.md.",
        examples=["auto"],
    )
    distributed: DistributedSpec = Field(
        default_factory=DistributedSpec, description="How training is spread.", examples=[{"nproc_per_node": 2}]
    )
    optimization: OptimizationSpec = Field(
        default_factory=OptimizationSpec, description="Optimizer step details.", examples=[{"gradient_clip_norm": 1.0}]
    )
    checkpoint: CheckpointSpec = Field(
        default_factory=CheckpointSpec, description="When checkpoints are written.", examples=[{"every_n_steps": 100}]
    )
    preemption: PreemptionSpec = Field(
        default_factory=PreemptionSpec,
        description="What a SIGTERM (spot preemption, eviction, a worker's shutdown) does.",
        examples=[{"max_restarts": 3}],
    )
    launcher: Launcher = Field(
        default="local",
        description="Where torchrun runs: 'local' (a subprocess on the Airflow worker) or 'kubernetes' "
        "(pods; see training.kubernetes).",
        examples=["local"],
    )
    kubernetes: KubernetesSpec | None = Field(
        default=None, description="Required when launcher is 'kubernetes': image, resources, scheduling.", examples=[None]
    )
    testing: TestingSpec = Field(
        default_factory=TestingSpec, description="Options meant for trainpipe's own tests.", examples=[{}]
    )
    cache: CacheSpec = Field(
        default_factory=CacheSpec,
        description="Skip a training whose inputs are unchanged since a registered version (docs: lifecycle, "
        "Unchanged inputs).",
        examples=[{"enabled": True, "max_age": "30d"}],
    )
