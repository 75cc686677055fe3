"""The contract between the Airflow provider and the trainer: the training config a pod receives.

Standard library only, so the provider can import it without torch and the trainer without
Airflow. The provider builds a ``TrainingConfig`` from a validated spec, writes it as JSON next to
the run's checkpoints, and every launcher runs ``torchrun ... -m trainpipe_trainer --config URI``.
Bump ``CONFIG_VERSION`` on any incompatible change; the trainer refuses versions it does not know.
The rest of the contract has modules of its own: ``run_layout`` (where each file of a run goes),
``outcomes`` (how a trainer ends) and ``resume`` (which checkpoints a training may resume).
"""

from __future__ import annotations

import dataclasses
import json
import re
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

# 2: dataset_digest (the resume guard records it in every checkpoint).
# 3: tuning (a hyperparameter-search trial reports into its Optuna study).
# 4: transforms (declared feature transforms, fitted on the train split and shipped in the model).
# 5: stop_after_step (`trainpipe reproduce` replays a world-size history segment by segment).
# 6: scale_target (regression labels standardised on the train split) and early_stopping.
# 7: tuning.worker (a trial worker runs a study's trials back to back in one launch).
CONFIG_VERSION = 7

# The names both sides use, each choice list once: the spec models' fields (and so the JSON Schema),
# the provider's metrics and plan, and the trainer's code paths read them from here.
TaskType = Literal["binary_classification", "multiclass_classification", "regression", "ranking", "causal_lm"]
TASK_TYPES: tuple[str, ...] = typing.get_args(TaskType)
# model.type: a model family's name (trainpipe_trainer.models: the built-ins, and the families installed
# packages register); a name, never a module or a path.
MODEL_TYPE_PATTERN = r"^[a-z][a-z0-9_]{0,63}$"
BUILT_IN_MODEL_TYPES: tuple[str, ...] = ("mlp", "text_bag", "transformer")
RankingLoss = Literal["pointwise", "listwise"]
RANKING_LOSSES: tuple[str, ...] = typing.get_args(RankingLoss)
Precision = Literal["fp32", "bf16"]
PRECISIONS: tuple[str, ...] = typing.get_args(Precision)
# A multiclass model's served output: the predicted class, then one probability per class (in class order).
PREDICTED_LABEL_COLUMN = "label"
PROBABILITY_COLUMN_PREFIX = "probability_"
# A causal LM's served answers: its completion by default; with the predict params TOKEN_SCORE_PARAMS, per row the
# summed cross-entropy of its target tokens (nats), their number, and how many of them it ranked first (what the
# evaluate step's holdout perplexity and token accuracy are summed from).
COMPLETION_COLUMN = "completion"
TOKEN_SCORE_PARAMS: dict[str, str] = {"score": "token_loss"}
TOKEN_SCORE_COLUMNS: tuple[str, str, str] = ("loss_sum", "tokens", "correct")
# How many classes a multiclass label may have: a class is a softmax output and a row of the confusion matrix.
MAX_LABEL_CLASSES = 1000


def probability_column(label_class: str) -> str:
    """The served model's column that holds the probability of ``label_class``."""
    return PROBABILITY_COLUMN_PREFIX + label_class


# Where the training split is kept while training on CUDA (on CPU it is in host memory either way); "stream"
# (CPU or CUDA): not held at all, its row groups read as the loop goes (trainpipe_trainer.data.streamed).
DataPlacement = Literal["auto", "device", "host", "stream"]
# data.format: the table formats a snapshot reads (the provider's storage.read_table).
DataFormat = Literal["parquet", "csv"]
DATA_PLACEMENTS: tuple[str, ...] = typing.get_args(DataPlacement)
# What train_data_uri names: a parquet copy of the split, or a dataset version's data_manifest.json (its files
# listed, not copied: trainpipe_trainer.data.manifest).
TrainDataFormat = Literal["parquet", "manifest"]
TRAIN_DATA_FORMATS: tuple[str, ...] = typing.get_args(TrainDataFormat)
LrSchedule = Literal["constant", "linear", "cosine"]
LR_SCHEDULES: tuple[str, ...] = typing.get_args(LrSchedule)
StrategyName = Literal["ddp", "deepspeed"]
STRATEGIES: tuple[str, ...] = typing.get_args(StrategyName)
ZeroStage = Literal[0, 1, 2, 3]
ZERO_STAGES: tuple[int, ...] = typing.get_args(ZeroStage)
Direction = Literal["minimize", "maximize"]
# successive_halving is Optuna's SuccessiveHalvingPruner: asynchronous (ASHA), so it suits parallel trials.
PrunerName = Literal["hyperband", "successive_halving", "median", "none"]
PRUNERS: tuple[str, ...] = typing.get_args(PrunerName)
FeatureType = Literal["numeric", "categorical", "text"]
FEATURE_TYPES: tuple[str, ...] = typing.get_args(FeatureType)
ImputeStrategy = Literal["mean", "median", "constant"]
IMPUTE_STRATEGIES: tuple[str, ...] = typing.get_args(ImputeStrategy)
NumericTransform = Literal["log1p"]
NUMERIC_TRANSFORMS: tuple[str, ...] = typing.get_args(NumericTransform)
CategoricalEncoding = Literal["one_hot", "hashing"]
CATEGORICAL_ENCODINGS: tuple[str, ...] = typing.get_args(CategoricalEncoding)
# Text: hashed word (and bigram) ids travel in the float32 input matrix, exact only below 2**24.
MAX_TEXT_HASH_BUCKETS = 2**24 - 2
DEFAULT_TEXT_HASH_BUCKETS = 2**18
DEFAULT_TEXT_MAX_TOKENS = 256
MAX_TEXT_MAX_TOKENS = 4096
TEXT_NGRAMS: tuple[int, ...] = (1, 2)

# torchrun forwards a SIGTERM to its workers (a preemption notice, trainpipe_trainer.outcomes) and kills
# them this many seconds later; the local launcher waits as long before it kills torchrun (a Pod uses
# its termination grace period instead). The plan renders it into each launch.
PREEMPTION_GRACE_SECONDS = 120
# The largest training seed: torch.manual_seed takes 64 bits, and the trainer adds the epoch, rank and step
# to the seed, so it keeps to the signed 64-bit range.
MAX_SEED = 2**63 - 1
# The variable that carries it to torchrun (and to trainpipe_trainer.elastic's one-process launch).
SHUTDOWN_TIMEOUT_ENV = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"


class TrainerConfigError(ValueError):
    """The training config is malformed; the message names the field and the fix."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise TrainerConfigError(message)


@dataclass(kw_only=True, slots=True, frozen=True)
class ModelConfig:
    # The model family (trainpipe_trainer.models); hidden_layers and dropout are the mlp family's settings.
    type: str = "mlp"
    hidden_layers: tuple[int, ...] = (64, 32)
    dropout: float = 0.0
    # Ranking only: pointwise regresses the relevance, listwise optimises a softmax over each query.
    ranking_loss: RankingLoss = "listwise"
    # The family's own parameters (JSON values), checked by the family before any data is read; left out
    # of the JSON when empty, so configs from before families stay byte-identical.
    params: dict[str, Any] = field(default_factory=dict)
    # A family that starts from pretrained weights (transformer): the ``save_pretrained`` folder's URI, resolved
    # and allowed by the provider (the storage root, a policy's data.uris; ``hf://`` only where models.hub
    # allows it). Left out of the JSON when None.
    pretrained_uri: str | None = None

    def __post_init__(self) -> None:
        _require(self.pretrained_uri is None or (isinstance(self.pretrained_uri, str) and bool(self.pretrained_uri)),
                 "model.pretrained_uri: a URI, or left out")
        _require(isinstance(self.type, str) and re.match(MODEL_TYPE_PATTERN, self.type) is not None,
                 f"model.type: a model family's name (lowercase letters, digits, _), got {self.type!r}")
        _require(isinstance(self.params, dict), "model.params: a mapping of parameter names to values")
        _require(all(n > 0 for n in self.hidden_layers), "model.hidden_layers: sizes must be > 0")
        _require(0.0 <= self.dropout < 1.0, "model.dropout: must be in [0, 1)")
        _require(self.ranking_loss in RANKING_LOSSES, f"model.ranking_loss: one of {RANKING_LOSSES}")


@dataclass(kw_only=True, slots=True, frozen=True)
class OptimizationConfig:
    gradient_clip_norm: float | None = None
    gradient_accumulation_steps: int = 1
    # bf16 autocast where the device supports it; fp32 otherwise.
    precision: Precision = "fp32"
    # float32 matmuls on TF32 tensor cores (CUDA only): faster, about 10 mantissa bits per product.
    tf32: bool = False
    lr_schedule: LrSchedule = "constant"
    warmup_steps: int = 0
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        _require(self.gradient_clip_norm is None or self.gradient_clip_norm > 0, "optimization.gradient_clip_norm: must be > 0")
        _require(self.gradient_accumulation_steps >= 1, "optimization.gradient_accumulation_steps: must be >= 1")
        _require(self.precision in PRECISIONS, f"optimization.precision: one of {PRECISIONS}")
        _require(self.lr_schedule in LR_SCHEDULES, f"optimization.lr_schedule: one of {LR_SCHEDULES}")
        _require(self.warmup_steps >= 0, "optimization.warmup_steps: must be >= 0")
        _require(self.weight_decay >= 0, "optimization.weight_decay: must be >= 0")


@dataclass(kw_only=True, slots=True, frozen=True)
class DeepSpeedConfig:
    zero_stage: ZeroStage = 0
    offload_optimizer: bool = False
    offload_param: bool = False

    def __post_init__(self) -> None:
        _require(self.zero_stage in ZERO_STAGES, f"deepspeed.zero_stage: one of 0, 1, 2, 3, got {self.zero_stage}")
        _require(not self.offload_param or self.zero_stage == 3, "deepspeed.offload_param: needs zero_stage 3")
        _require(not self.offload_optimizer or self.zero_stage >= 1, "deepspeed.offload_optimizer: needs zero_stage >= 1")


@dataclass(kw_only=True, slots=True, frozen=True)
class FaultInjection:
    """For tests only: make the trainer fail in a controlled way."""

    nan_loss_at_step: int | None = None
    # Exit abruptly (os._exit(3), no cleanup) right after the checkpoint of this step is committed.
    crash_after_step: int | None = None
    # Sleep this long after every optimizer step: stretches a tiny test run so a test can act mid-training
    # (kill a rank, send SIGTERM, stop the tracking server) without racing the end of training.
    step_delay_seconds: float = 0.0
    # Raise torch.cuda.OutOfMemoryError in this step's forward pass when its micro-batch has more rows than
    # oom_above_batch_size (None: any size): stands in for a real CUDA OOM, which a CPU-only machine cannot have.
    cuda_oom_at_step: int | None = None
    oom_above_batch_size: int | None = None

    def __post_init__(self) -> None:
        for name in ("nan_loss_at_step", "crash_after_step", "cuda_oom_at_step", "oom_above_batch_size"):
            value = getattr(self, name)
            _require(value is None or value >= 1, f"fault_injection.{name}: must be >= 1")
        _require(self.step_delay_seconds >= 0, "fault_injection.step_delay_seconds: must be >= 0")


@dataclass(kw_only=True, slots=True, frozen=True)
class CheckpointConfig:
    # URI of this run's checkpoint root (file:// or s3://); stable across retries of one DAG run.
    root_uri: str
    every_n_steps: int | None = None
    every_seconds: float | None = None
    keep_last: int = 3
    # Also keep the checkpoint with the lowest validation loss (on validation_fraction of the train split).
    keep_best: bool = True
    validation_fraction: float = 0.1
    # Save asynchronously (the loop is blocked only for the in-memory snapshot).
    async_save: bool = True

    def __post_init__(self) -> None:
        _require(bool(self.root_uri), "checkpoint.root_uri: must not be empty")
        _require(self.every_n_steps is None or self.every_n_steps > 0, "checkpoint.every_n_steps: must be > 0")
        _require(self.every_seconds is None or self.every_seconds > 0, "checkpoint.every_seconds: must be > 0")
        _require(self.keep_last >= 1, "checkpoint.keep_last: must be >= 1")
        _require(0.0 <= self.validation_fraction < 1.0, "checkpoint.validation_fraction: must be in [0, 1)")


# What early stopping may watch: a metric the task's trainer computes on the validation split at each
# checkpoint (CHECKPOINT_METRICS, which also gives its direction); the validation loss exists for every task.
EarlyStoppingMetric = Literal["validation_loss", "validation_auc", "validation_accuracy",
                              "validation_balanced_accuracy", "validation_macro_f1", "validation_rmse",
                              "validation_mae", "validation_perplexity", "validation_token_accuracy"]
EARLY_STOPPING_METRICS: tuple[str, ...] = typing.get_args(EarlyStoppingMetric)


@dataclass(kw_only=True, slots=True, frozen=True)
class EarlyStoppingConfig:
    """Stop when ``metric`` on the validation split has not improved by more than ``min_delta`` for
    ``patience`` evaluation points in a row (one per epoch end); the best checkpoint is the model."""

    metric: EarlyStoppingMetric = "validation_loss"
    patience: int = 3
    min_delta: float = 0.0

    def __post_init__(self) -> None:
        _require(self.metric in EARLY_STOPPING_METRICS,
                 f"early_stopping.metric: one of {EARLY_STOPPING_METRICS}, got {self.metric!r}")
        _require(self.patience >= 1, "early_stopping.patience: must be >= 1")
        _require(self.min_delta >= 0, "early_stopping.min_delta: must be >= 0")


@dataclass(kw_only=True, slots=True, frozen=True)
class FeatureTransform:
    """How one feature column becomes model inputs; fitted on the rows trained on.

    Numeric (the default without a declaration: standardise only): impute missing values, clip,
    log1p, standardise, in that order; ``missing_indicator`` adds a 0/1 input that marks imputed
    rows. Categorical: ``one_hot`` (the ``max_categories`` most frequent values of the train rows,
    plus one "other" input for the rest and for values first seen at serving) or ``hashing`` into
    ``hash_buckets`` inputs. A missing categorical value is the category "<missing>". Text: lower-cased
    words (and, with ``ngrams: 2``, word pairs) hashed into ``hash_buckets`` ids, the first ``max_tokens``
    of them, one input each (0 pads); only a family that reads token ids (``text_bag``) takes them.
    """

    feature: str
    type: FeatureType = "numeric"
    impute: ImputeStrategy | None = None
    fill_value: float | None = None
    missing_indicator: bool = False
    clip_min: float | None = None
    clip_max: float | None = None
    transform: NumericTransform | None = None
    standardize: bool = True
    encode: CategoricalEncoding = "one_hot"
    max_categories: int = 20
    hash_buckets: int = 32
    # Text only (dropped from the config's JSON for the other types, which stays byte-identical).
    max_tokens: int = DEFAULT_TEXT_MAX_TOKENS
    ngrams: int = 2

    def __post_init__(self) -> None:
        where = f"transforms[{self.feature!r}]"
        _require(bool(self.feature), "transforms: each transform names its feature")
        _require(self.type in FEATURE_TYPES, f"{where}.type: one of {FEATURE_TYPES}, got {self.type!r}")
        _require(self.impute is None or self.impute in IMPUTE_STRATEGIES,
                 f"{where}.impute: one of {IMPUTE_STRATEGIES}, got {self.impute!r}")
        _require((self.impute == "constant") == (self.fill_value is not None),
                 f"{where}.fill_value: set exactly when impute is 'constant'")
        _require(not self.missing_indicator or self.impute is not None, f"{where}.missing_indicator: needs impute")
        _require(self.clip_min is None or self.clip_max is None or self.clip_min <= self.clip_max,
                 f"{where}.clip: min must be <= max")
        _require(self.transform is None or self.transform in NUMERIC_TRANSFORMS,
                 f"{where}.transform: one of {NUMERIC_TRANSFORMS}, got {self.transform!r}")
        _require(self.encode in CATEGORICAL_ENCODINGS, f"{where}.encode: one of {CATEGORICAL_ENCODINGS}")
        _require(self.max_categories >= 1, f"{where}.max_categories: must be >= 1")
        _require(self.hash_buckets >= 2, f"{where}.hash_buckets: must be >= 2")
        _require(1 <= self.max_tokens <= MAX_TEXT_MAX_TOKENS, f"{where}.max_tokens: between 1 and {MAX_TEXT_MAX_TOKENS}")
        _require(self.ngrams in TEXT_NGRAMS, f"{where}.ngrams: one of {TEXT_NGRAMS}")
        if self.type == "text":
            _require(self.hash_buckets <= MAX_TEXT_HASH_BUCKETS,
                     f"{where}.hash_buckets: at most {MAX_TEXT_HASH_BUCKETS} for text (ids are exact in float32)")
        if self.type in ("categorical", "text"):
            numeric_only = self.impute is not None or self.clip_min is not None or self.clip_max is not None \
                or self.transform is not None or not self.standardize
            _require(not numeric_only, f"{where}: impute, clip, transform and standardize apply to numeric features")

    @classmethod
    def default(cls, feature: str) -> FeatureTransform:
        return cls(feature=feature)


@dataclass(kw_only=True, slots=True, frozen=True)
class TrackingConfig:
    # Empty tracking_uri means: use MLFLOW_TRACKING_URI from the environment.
    tracking_uri: str = ""
    experiment_name: str = "trainpipe"
    # When set, rank 0 logs into this existing run (created by the Airflow task); else it starts one.
    run_id: str | None = None
    log_every_n_steps: int = 10
    # System metrics (CPU/GPU utilisation and memory, samples/s) every this many seconds.
    system_metrics_every_seconds: float = 30.0
    # Metrics buffered in memory while the tracking server is unreachable; beyond this they spill to a file.
    max_buffered_metrics: int = 100_000
    # Where the final model is logged inside the run.
    model_artifact_name: str = "model"

    def __post_init__(self) -> None:
        _require(self.log_every_n_steps >= 1, "tracking.log_every_n_steps: must be >= 1")
        _require(self.system_metrics_every_seconds > 0, "tracking.system_metrics_every_seconds: must be > 0")
        _require(self.max_buffered_metrics >= 1, "tracking.max_buffered_metrics: must be >= 1")


# Where a trial's trainer finds the study storage's URL when the config leaves it out.
OPTUNA_STORAGE_ENV = "TRAINPIPE_OPTUNA_STORAGE"
DIRECTIONS: tuple[str, ...] = typing.get_args(Direction)
# What the trainer computes on the validation split at each evaluation point (each checkpoint), per
# task, and which way is better: a study may tune on any of its task's. Logged to MLflow there too.
CHECKPOINT_METRICS: dict[str, dict[str, str]] = {
    "binary_classification": {"validation_loss": "minimize", "validation_auc": "maximize",
                              "validation_accuracy": "maximize"},
    "multiclass_classification": {"validation_loss": "minimize", "validation_accuracy": "maximize",
                                  "validation_balanced_accuracy": "maximize", "validation_macro_f1": "maximize"},
    "regression": {"validation_loss": "minimize", "validation_rmse": "minimize", "validation_mae": "minimize"},
    "ranking": {"validation_loss": "minimize"},
    # Token-weighted over the target tokens (a completion's, or every next token): loss is the mean
    # cross-entropy, perplexity its exp.
    "causal_lm": {"validation_loss": "minimize", "validation_perplexity": "minimize",
                  "validation_token_accuracy": "maximize"},
}
TUNING_METRICS: tuple[str, ...] = tuple(sorted({m for metrics in CHECKPOINT_METRICS.values() for m in metrics}))
# The keyword arguments each pruner takes from a plan (Optuna's names; the resource is in percent).
PRUNER_ARGUMENTS: dict[str, frozenset[str]] = {
    "hyperband": frozenset({"min_resource", "reduction_factor"}),
    "successive_halving": frozenset({"min_resource", "reduction_factor", "min_early_stopping_rate"}),
    "median": frozenset({"n_startup_trials", "n_warmup_steps"}),
    "none": frozenset(),
}
# A trial reports at "step" = percent of its training done, so trials with other batch sizes (other
# step counts) are compared at the same point of their budget; the pruners' resource runs 0..100.
TUNING_MAX_RESOURCE = 100


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchDimension:
    """One hyperparameter of the search: its range and where a trial's value goes in the trainer config."""

    name: str
    # Path in the trainer config (TrainingConfig): ("learning_rate",), ("model", "dropout"), or a key below a
    # family's params: ("model", "params", "max_length"), ("model", "params", "lora", "r").
    target: tuple[str, ...]
    distribution: str  # log_uniform | uniform | int | choice
    low: float | None = None
    high: float | None = None
    # choice: the values as JSON text (Optuna's categorical choices are scalars; a layer list is not).
    choices: tuple[str, ...] = ()


@dataclass(kw_only=True, slots=True, frozen=True)
class TrialWorker:
    """This launch is trial worker ``worker`` of a study: it asks, trains and tells trials back to back
    (one interpreter, one data read, one rendezvous) until the study has ``n_trials`` finished ones."""

    worker: int
    n_trials: int
    sampler: str  # tpe | random
    seed: int
    space: tuple[SearchDimension, ...]
    # Each trial's folder is <trials_root_uri>/trial-<number> (checkpoints/, output/).
    trials_root_uri: str
    # Each trial is a child run of the study's parent run, with these tags besides its own.
    parent_run_id: str
    experiment_id: str
    child_tags: dict[str, str] = field(default_factory=dict)
    # No trial starts once the study (its started_at attribute) is this old.
    timeout_seconds: float | None = None

    def __post_init__(self) -> None:
        _require(self.worker >= 0, "tuning.worker.worker: must be >= 0")
        _require(self.n_trials >= 1, "tuning.worker.n_trials: must be >= 1")
        _require(self.sampler in ("tpe", "random"), f"tuning.worker.sampler: tpe or random, got {self.sampler!r}")
        _require(len(self.space) > 0, "tuning.worker.space: at least one hyperparameter")

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> TrialWorker:
        data = dict(raw)
        space = tuple(SearchDimension(**{**d, "target": tuple(d["target"]), "choices": tuple(d.get("choices", ()))})
                      for d in data.pop("space"))
        return cls(space=space, **data)


@dataclass(kw_only=True, slots=True, frozen=True)
class TuningTrial:
    """This training is one trial of a hyperparameter search (an Optuna study in a shared storage).

    The trainer's rank 0 reports ``metric`` at each evaluation point into the trial through the
    storage and asks the study's pruner whether to stop; the provider asked for the trial (its
    parameters are already in this config) and tells the study its final state.
    """

    # An Optuna storage URL (sqlite:///..., postgresql://...) or a journal file's path or file:// URI;
    # empty: the URL is in the trainer's environment (STORAGE_ENV), as one with a password must be.
    storage: str
    study_name: str
    trial_number: int
    metric: str = "validation_loss"
    direction: Direction = "minimize"
    pruner: PrunerName = "hyperband"
    # Keyword arguments of the pruner (the same in every process that loads the study).
    pruner_options: dict[str, Any] = field(default_factory=dict)
    # Set for a trial worker (trial_number is then -1: the worker asks the study for each trial's).
    worker: TrialWorker | None = None

    def __post_init__(self) -> None:
        _require(bool(self.study_name), "tuning.study_name: must not be empty")
        _require(self.trial_number >= 0 or (self.worker is not None and self.trial_number == -1),
                 "tuning.trial_number: must be >= 0 (-1 for a trial worker)")
        _require(self.metric in TUNING_METRICS, f"tuning.metric: one of {TUNING_METRICS}, got {self.metric!r}")
        _require(self.direction in DIRECTIONS, f"tuning.direction: one of {DIRECTIONS}, got {self.direction!r}")
        _require(self.pruner in PRUNERS, f"tuning.pruner: one of {PRUNERS}, got {self.pruner!r}")
        unknown = sorted(set(self.pruner_options) - PRUNER_ARGUMENTS[self.pruner])
        _require(not unknown, f"tuning.pruner_options: {self.pruner} takes {sorted(PRUNER_ARGUMENTS[self.pruner])}, "
                              f"got {unknown}")
        _require(all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in self.pruner_options.values()),
                 f"tuning.pruner_options: whole numbers >= 0, got {self.pruner_options}")


# Each new field also goes into one of the resume guard's two lists (trainpipe_trainer.resume).
@dataclass(kw_only=True, slots=True, frozen=True)
class TrainingConfig:
    config_version: int = CONFIG_VERSION
    pipeline_id: str
    task: TaskType
    # Training split of the dataset snapshot (parquet), read with fsspec.
    train_data_uri: str
    # Content digest of that snapshot (the provider's). Checkpoints record it, so a run folder is
    # never resumed on other data; empty (a hand-written config): train_data_uri stands in for it.
    dataset_digest: str = ""
    # "manifest": train_data_uri is a data_manifest.json; left out of the JSON when "parquet".
    train_data_format: TrainDataFormat = "parquet"
    features: tuple[str, ...]
    # Declared transforms of some features (by name); a feature without one is numeric and standardised.
    transforms: tuple[FeatureTransform, ...] = ()
    label: str
    # Multiclass: the classes in output order, each the label value's text (str(value)); a row whose label
    # is none of them is a data error. The provider fills them (pinned in the spec, else the snapshot's);
    # empty in a multiclass config means the train split's classes. Empty for every other task (and then
    # left out of the JSON).
    label_classes: tuple[str, ...] = ()
    # Ranking: the column that identifies a query (list); required when task == "ranking".
    group_column: str | None = None
    model: ModelConfig = field(default_factory=ModelConfig)
    epochs: int = 1
    batch_size: int = 256
    learning_rate: float = 1e-3
    seed: int = 0
    # Regression: train on the label standardised with the train split's mean and std; the served
    # model and the validation metrics turn predictions back into the label's units (ADR 0013).
    scale_target: bool = True
    # Stop when the validation loss stops improving; the weights of the best epoch end are the model.
    early_stopping: EarlyStoppingConfig | None = None
    strategy: StrategyName = "ddp"
    optimization: OptimizationConfig = field(default_factory=OptimizationConfig)
    # Required when strategy == "deepspeed"; the DeepSpeed JSON config is generated from it and the rest.
    deepspeed: DeepSpeedConfig | None = None
    checkpoint: CheckpointConfig
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    # Where the trainer writes result.json (weights hash, model URI, steps) for the launcher to read.
    output_uri: str
    # fsspec storage options for the URIs above (e.g. an S3 endpoint); never credentials.
    storage_options: dict[str, Any] = field(default_factory=dict)
    # Free-form labels recorded as MLflow params/tags (dag id, run id, dataset digest, ...).
    tags: dict[str, str] = field(default_factory=dict)
    fault_injection: FaultInjection | None = None
    # Set when this training is a trial of a hyperparameter search.
    tuning: TuningTrial | None = None
    # Commit a checkpoint of this step and stop there (exit 0, no model): `trainpipe reproduce` runs
    # each segment of a world-size history up to the step the size changed at.
    stop_after_step: int | None = None
    # CUDA: keep the splits in GPU memory ("device"), in pinned host memory copied one batch ahead
    # ("host"), or on the GPU when they take under half its free memory ("auto"). Same batches either way.
    # "stream": read the row groups as the loop goes (another order of the rows); "auto" streams a manifest
    # whose train split would not fit in the host's memory.
    data_placement: DataPlacement = "auto"

    def __post_init__(self) -> None:
        _require(
            self.config_version == CONFIG_VERSION,
            f"config_version: this trainer reads version {CONFIG_VERSION}, got {self.config_version}; "
            "use a trainer image built from the same trainpipe release as the provider",
        )
        _require(self.task in TASK_TYPES, f"task: one of {TASK_TYPES}, got {self.task!r}")
        _require(self.data_placement in DATA_PLACEMENTS, f"data_placement: one of {DATA_PLACEMENTS}")
        _require(self.train_data_format in TRAIN_DATA_FORMATS,
                 f"train_data_format: one of {TRAIN_DATA_FORMATS}, got {self.train_data_format!r}")
        _require(len(self.features) > 0, "features: list at least one feature column")
        _require(self.label not in self.features, f"label: {self.label!r} is also listed as a feature")
        # causal_lm: the label is the completion column (the loss on it only), or empty (every next token).
        _require(bool(self.label) or self.task == "causal_lm", "label: name the label column")
        declared = [t.feature for t in self.transforms]
        _require(len(set(declared)) == len(declared), "transforms: one transform per feature")
        unknown = [name for name in declared if name not in self.features]
        _require(not unknown, f"transforms: {unknown} are not in features")
        _require(
            self.task == "multiclass_classification" or not self.label_classes,
            f"label_classes: only for task 'multiclass_classification', not {self.task!r}",
        )
        _require(
            not self.label_classes or 2 <= len(self.label_classes) <= MAX_LABEL_CLASSES,
            f"label_classes: between 2 and {MAX_LABEL_CLASSES} classes, got {len(self.label_classes)}",
        )
        _require(len(set(self.label_classes)) == len(self.label_classes), "label_classes: each class once")
        _require(
            self.task != "ranking" or bool(self.group_column),
            "group_column: required for task 'ranking' (the query id column)",
        )
        _require(self.epochs >= 1, "epochs: must be >= 1")
        _require(self.batch_size >= 1, "batch_size: must be >= 1")
        _require(self.learning_rate > 0, "learning_rate: must be > 0")
        _require(self.strategy in STRATEGIES, f"strategy: one of {STRATEGIES}, got {self.strategy!r}")
        _require(self.stop_after_step is None or self.stop_after_step >= 1, "stop_after_step: must be >= 1")
        _require(
            self.tuning is None or self.tuning.metric in CHECKPOINT_METRICS[self.task],
            f"tuning.metric: a {self.task} trainer reports {sorted(CHECKPOINT_METRICS[self.task])} at its "
            f"checkpoints, got {self.tuning.metric if self.tuning else None!r}",
        )
        _require(
            self.strategy != "deepspeed" or self.deepspeed is not None,
            "deepspeed: required when strategy is 'deepspeed' (zero_stage, offload)",
        )
        _require(
            self.early_stopping is None or self.early_stopping.metric in CHECKPOINT_METRICS[self.task],
            f"early_stopping.metric: a {self.task} trainer computes {sorted(CHECKPOINT_METRICS[self.task])} on the "
            f"validation split, got {self.early_stopping.metric if self.early_stopping else None!r}",
        )
        _require(
            self.early_stopping is None or (self.checkpoint.keep_best and self.checkpoint.validation_fraction > 0),
            "early_stopping: needs a validation split (checkpoint.keep_best with validation_fraction > 0)",
        )

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        # Configs from before multiclass and model families stay byte-identical (and readable by their trainers).
        if not self.label_classes:
            del data["label_classes"]
        if self.train_data_format == "parquet":
            del data["train_data_format"]
        if not self.model.params:
            del data["model"]["params"]
        if self.model.pretrained_uri is None:
            del data["model"]["pretrained_uri"]
        for transform in data["transforms"]:
            if transform["type"] != "text":
                del transform["max_tokens"], transform["ngrams"]
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def feature_transforms(self) -> tuple[FeatureTransform, ...]:
        """One transform per feature, in feature order: the declared one or the default."""
        declared = {t.feature: t for t in self.transforms}
        return tuple(declared.get(name) or FeatureTransform.default(name) for name in self.features)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> TrainingConfig:
        data = dict(raw)
        try:
            data["features"] = tuple(data["features"])
            data["label_classes"] = tuple(data.get("label_classes", ()))
            data["transforms"] = tuple(FeatureTransform(**t) for t in data.get("transforms", ()))
            model = dict(data.pop("model", {}))
            if "hidden_layers" in model:
                model["hidden_layers"] = tuple(model["hidden_layers"])
            deepspeed = data.pop("deepspeed", None)
            fault_injection = data.pop("fault_injection", None)
            tuning = data.pop("tuning", None)
            early_stopping = data.pop("early_stopping", None)
            return cls(
                model=ModelConfig(**model),
                optimization=OptimizationConfig(**data.pop("optimization", {})),
                deepspeed=DeepSpeedConfig(**deepspeed) if deepspeed is not None else None,
                checkpoint=CheckpointConfig(**data.pop("checkpoint")),
                tracking=TrackingConfig(**data.pop("tracking", {})),
                fault_injection=FaultInjection(**fault_injection) if fault_injection is not None else None,
                tuning=_tuning_trial(tuning) if tuning is not None else None,
                early_stopping=EarlyStoppingConfig(**early_stopping) if early_stopping is not None else None,
                **data,
            )
        except (KeyError, TypeError) as err:
            raise TrainerConfigError(f"training config does not match version {CONFIG_VERSION}: {err}") from err

    @classmethod
    def from_json(cls, text: str) -> TrainingConfig:
        return cls.from_dict(json.loads(text))


def apply_trial_params(config: TrainingConfig, space: tuple[SearchDimension, ...],
                       params: dict[str, Any]) -> TrainingConfig:
    """``config`` with a trial's hyperparameters (as Optuna stores them: a choice that is a list is its
    JSON text, which becomes a tuple); the provider's plans and a trial worker apply them alike."""
    for dimension in space:
        if dimension.name not in params:
            continue
        value = params[dimension.name]
        if isinstance(value, str) and dimension.choices:
            decoded = json.loads(value)
            value = tuple(decoded) if isinstance(decoded, list) else decoded
        config = _replace_at(config, dimension.target, value)
    return config


def _replace_at(obj: Any, path: tuple[str, ...], value: Any) -> Any:
    """``obj`` with the field at ``path`` replaced (each frozen section re-checks its own values). Below a
    family's ``model.params`` (a dict) the key is set in a copy, and a mapping on the way that is absent or
    None is created (``lora_r`` in params without ``lora``); ``obj`` itself is never changed."""
    head, *rest = path
    if isinstance(obj, dict):
        inner = obj.get(head)
        return {**obj, head: _replace_at(inner if inner is not None else {}, tuple(rest), value) if rest else value}
    return dataclasses.replace(obj, **{head: _replace_at(getattr(obj, head), tuple(rest), value) if rest else value})


def _tuning_trial(raw: dict[str, Any]) -> TuningTrial:
    data = dict(raw)
    worker = data.pop("worker", None)
    return TuningTrial(worker=TrialWorker.from_dict(worker) if worker is not None else None, **data)


