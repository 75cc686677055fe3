"""The ``train`` step: build the trainer config of this DAG run, launch torchrun, read the result.

The checkpoint root is per DAG run and the same for every try, so an Airflow retry resumes from
the latest committed checkpoint; a new DAG run starts fresh. A run folder whose newest checkpoint
was written with another snapshot or other result-changing settings is refused before anything is
launched, written or tagged (``check_resumable``, the trainer's own guard run early).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from trainpipe import storage
from trainpipe.errors import DatasetChangedError, ResumeRefusedError, TrainingFailedError
from trainpipe.hooks.mlflow import MlflowHook
from trainpipe.launchers.local import LauncherStoppedError, local_python, run_local
from trainpipe.plan.launch import LaunchValues, resolve
from trainpipe.plan.model import FaultPlan, PipelinePlan
from trainpipe.plan.tracking import (
    DAG_ID_TAG,
    DATASET_DIGEST_TAG,
    GIT_COMMIT_TAG,
    MODEL_FAMILY_TAG,
    PARAM_OVERRIDES_TAG,
    RUN_ID_TAG,
    SPEC_SHA256_TAG,
    STUDY_RUN_ID_TAG,
    TRAINER_IMAGE_TAG,
    TRY_NUMBER_TAG,
)
from trainpipe.settings import Settings
from trainpipe.state.datasets import MANIFEST_KIND, SnapshotInfo, iter_split_tables, read_split
from trainpipe.state.run_folder import read_training_result, result_path_in, run_dir_for
from trainpipe.state.run_notes import preempted_leaving
from trainpipe.state.usage import account_try
from trainpipe.steps.register.lineage import log_spec_text
from trainpipe_trainer.config import (
    FaultInjection,
    TrainingConfig,
    TuningTrial,
)
from trainpipe_trainer.data.manifest import is_data_change
from trainpipe_trainer.outcomes import (
    PREEMPTED_EXIT_CODE,
    TrainingResult,
    preempted_step,
)
from trainpipe_trainer.resume import (
    ResumeIdentity,
    resume_identity,
    resume_refusal,
)
from trainpipe_trainer.run_layout import (
    CHECKPOINT_MANIFEST,
    CHECKPOINTS_DIR,
    OUTPUT_DIR,
    TRAINER_CONFIG_FILE,
    checkpoint_dir_name,
)

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger(__name__)

# A manifest version's train rows the input checks read before a launch (its first row groups): enough to find a
# missing column or a value a transform refuses, without reading data larger than memory.
CHECKED_MANIFEST_ROWS = 20_000


@dataclass(frozen=True, slots=True, kw_only=True)
class RunContext:
    """What the train step knows about the Airflow run it is part of."""

    dag_id: str
    airflow_run_id: str
    try_number: int
    spec_sha256: str
    # None when the spec's folder is not a git checkout: the tag is then left out.
    git_commit: str | None


def _fault_injection(testing: FaultPlan, run: RunContext) -> FaultInjection | None:
    crash = testing.crash_first_try_after_step if run.try_number == 1 else None
    if testing.inject_nan_at_step is None and crash is None and not testing.step_delay_seconds:
        return None
    return FaultInjection(nan_loss_at_step=testing.inject_nan_at_step, crash_after_step=crash,
                          step_delay_seconds=testing.step_delay_seconds)


def trainer_config_for_run(plan: PipelinePlan, snapshot: SnapshotInfo, *, settings: Settings, run: RunContext,
                           mlflow_run_id: str | None, run_dir,
                           stop_after_step: int | None = None) -> TrainingConfig:
    """The plan's trainer config template with this run's values: data, folders, tracking, tags."""
    template = plan.trainer
    return dataclasses.replace(
        template,
        model=dataclasses.replace(template.model, pretrained_uri=pretrained_uri(plan, settings))
        if template.model.pretrained_uri is not None else template.model,
        label_classes=run_label_classes(plan, snapshot, settings=settings),
        stop_after_step=stop_after_step,
        train_data_uri=snapshot.train_uri,
        # A manifest version's train URI is its data_manifest.json: the trainer streams the listed files.
        **({"train_data_format": "manifest"} if snapshot.kind == MANIFEST_KIND else {}),
        dataset_digest=snapshot.digest,
        checkpoint=dataclasses.replace(template.checkpoint, root_uri=storage.fsspec_uri(run_dir / CHECKPOINTS_DIR)),
        tracking=dataclasses.replace(template.tracking, tracking_uri=settings.mlflow_tracking_uri, run_id=mlflow_run_id),
        output_uri=storage.fsspec_uri(run_dir / OUTPUT_DIR),
        fault_injection=_fault_injection(plan.testing, run),
        tags={
            DAG_ID_TAG: run.dag_id,
            RUN_ID_TAG: run.airflow_run_id,
            TRY_NUMBER_TAG: str(run.try_number),
            DATASET_DIGEST_TAG: snapshot.digest,
            SPEC_SHA256_TAG: run.spec_sha256,
            **({GIT_COMMIT_TAG: run.git_commit} if run.git_commit else {}),
        },
    )


def pretrained_uri(plan: PipelinePlan, settings: Settings) -> str | None:
    """The absolute URI the trainer loads the pretrained weights from: the spec's ``training.model.pretrained``
    resolved against this worker's storage root and checked again as the snapshot step checks data.uri (the
    policy's data.uris, else local folders only under the storage root, links followed), before anything is
    launched. A Hub id (``hf://owner/name``) passes as written: the spec stage allowed it under the policy's
    ``models.hub``."""
    from trainpipe import uris
    from trainpipe.errors import PolicyViolationError, SpecError, SpecProblem

    written = plan.trainer.model.pretrained_uri
    if written is None or uris.is_hub(written):
        return written
    try:
        path = storage.resolve_uri(written, settings)
        if plan.data.allowed_uris is not None:
            storage.require_allowed(written, path, plan.data.allowed_uris, settings, field="training.model.pretrained")
        else:
            storage.require_inside_root(written, path, settings, field="training.model.pretrained")
    except (ValueError, PolicyViolationError) as err:
        file, line, column = plan.inputs_declared_at.get("model.pretrained", (plan.spec_file, None, None))
        raise SpecError([SpecProblem(file or plan.spec_file, line, column, "training.model.pretrained",
                                     str(err))]) from None
    return storage.fsspec_uri(path)


def pretrained_fingerprint(plan: PipelinePlan, settings: Settings) -> str | None:
    """What identifies the pretrained weights for the training key (None without them): each file of the folder
    by its path, size and ETag (an object store) or modification time (a local folder), so new weights written to
    the same folder train again. A Hub id is its name: copy a revision into storage to pin it."""
    import hashlib

    from trainpipe import uris

    uri = pretrained_uri(plan, settings)
    if uri is None or uris.is_hub(uri):
        return uri
    folder = storage.resolve_uri(uri, settings)
    prefix = len(str(folder).rstrip("/")) + 1
    entries = []
    for path in sorted(folder.rglob("*"), key=str):
        info = path.stat()
        if info.get("type") == "file":
            entries.append([str(path)[prefix:], info.get("size"), info.get("ETag") or info.get("mtime")])
    return hashlib.sha256(json.dumps([uri, entries], default=str).encode()).hexdigest()


def run_label_classes(plan: PipelinePlan, snapshot: SnapshotInfo, *, settings: Settings) -> tuple[str, ...]:
    """A multiclass run's classes: pinned in the spec, else those its dataset version recorded (a version
    recorded before classes were, or by a non-multiclass spec: read off its train and holdout splits)."""
    if plan.class_label is None or plan.trainer.label_classes:
        return plan.trainer.label_classes
    if snapshot.label_classes:
        return _at_least_two(plan, snapshot, tuple(snapshot.label_classes))
    import pandas as pd

    from trainpipe_trainer.errors import TrainerDataError
    from trainpipe_trainer.preprocessing import label_class_names

    label = plan.class_label
    parts = []
    if snapshot.kind == MANIFEST_KIND:
        if label not in {name for name, _ in snapshot.schema or []}:
            return ()  # the input check reports the missing label at the spec's label line
        # Larger than memory: the label column only, one row group at a time, its values kept once.
        for split in ("train", "holdout"):
            for table in iter_split_tables(snapshot, split, settings=settings, columns=[label]):
                values = table.column(0).to_pandas().drop_duplicates()
                parts = [pd.concat([*parts, values], ignore_index=True).drop_duplicates()]
    for uri in (snapshot.train_uri, snapshot.holdout_uri) if snapshot.kind != MANIFEST_KIND else ():
        frame = storage.read_parquet_uri(uri, conn_id=settings.storage_conn_id)
        if label not in frame.columns:
            return ()  # the input check reports the missing label at the spec's label line
        parts.append(frame[label])
    if not parts:
        return ()  # no rows: the input check reports it
    try:
        classes = label_class_names(pd.concat(parts, ignore_index=True), label=label,
                                    source=f"dataset version {snapshot.digest[:16]}")
    except TrainerDataError:
        return ()  # the input check reports it, located
    return _at_least_two(plan, snapshot, classes)


def _at_least_two(plan: PipelinePlan, snapshot: SnapshotInfo, classes: tuple[str, ...]) -> tuple[str, ...]:
    from trainpipe.errors import SpecError, SpecProblem

    if len(classes) >= 2:
        return classes
    file, line, column = plan.inputs_declared_at.get("label", (plan.spec_file, None, None))
    raise SpecError([SpecProblem(
        file or plan.spec_file, line, column, "training.label",
        f"dataset version {snapshot.digest[:16]}: label column {plan.class_label!r} holds one class "
        f"({', '.join(map(repr, classes))}); a multiclass model needs at least two: widen data.window, or "
        "pin training.label_classes")])


@dataclass(frozen=True, slots=True, kw_only=True)
class TrialLaunch:
    """A training that is one trial of a study: where it reports, and its own (child) MLflow run."""

    tuning: TuningTrial
    mlflow_run_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class PreparedRun:
    """A run folder ready for a launcher: the trainer config is written, no stale result is left."""

    run_dir: Any  # ObjectStoragePath
    config_uri: str
    mlflow_run_id: str

    @property
    def result_path(self):
        return result_path_in(self.run_dir)


def prepare_training_run(plan: PipelinePlan, snapshot: SnapshotInfo, *, settings: Settings, run: RunContext,
                         hook: MlflowHook | None = None, run_dir=None,
                         param_overrides: dict | None = None, run_tags: dict[str, str] | None = None,
                         trial: TrialLaunch | None = None, stop_after_step: int | None = None) -> PreparedRun:
    """Everything before torchrun, for every launcher: resume check, MLflow run, trainer config, no stale result.

    ``run_tags`` go on the DAG run's MLflow run when it is created; a ``trial`` (hyperparameter search)
    logs into its own MLflow run and reports to its study instead."""
    run_dir = run_dir if run_dir is not None else run_dir_for(plan.dag_id, settings, run.airflow_run_id)
    config = trainer_config_for_run(plan, snapshot, settings=settings, run=run, mlflow_run_id=None, run_dir=run_dir,
                                    stop_after_step=stop_after_step)
    if trial is not None:
        tags = dict(config.tags)
        # Only the DAG run's own training carries this tag: MlflowHook.run_for_dag_run finds its run by it.
        tags[STUDY_RUN_ID_TAG] = tags.pop(RUN_ID_TAG)
        config = dataclasses.replace(config, tuning=trial.tuning, tags=tags)
    # First: a refused run must not retag the MLflow run nor overwrite the config that wrote the checkpoints.
    check_resumable(run_dir, config, world_size=plan.launch.world_size)
    check_training_inputs(plan, config, snapshot, settings=settings)
    hook = hook or MlflowHook(settings)
    if trial is not None:
        mlflow_run_id = trial.mlflow_run_id
    else:
        mlflow_run_id = hook.run_for_dag_run(
            pipeline_id=plan.dag_id, dag_id=run.dag_id, airflow_run_id=run.airflow_run_id,
            tags={DATASET_DIGEST_TAG: snapshot.digest,
                  PARAM_OVERRIDES_TAG: json.dumps(param_overrides or {}, sort_keys=True),
                  **model_family_tags(plan, config), **(run_tags or {})},
        )
        if plan.spec_text:
            log_spec_text(hook.client, mlflow_run_id, spec_relative_path=plan.spec_relative_path, spec_text=plan.spec_text)
    config = dataclasses.replace(config, tracking=dataclasses.replace(config.tracking, run_id=mlflow_run_id))
    config_path = run_dir / TRAINER_CONFIG_FILE
    config_path.parent.mkdir(parents=True, exist_ok=True)
    config_path.write_text(config.to_json())
    prepared = PreparedRun(run_dir=run_dir, config_uri=storage.fsspec_uri(config_path), mlflow_run_id=mlflow_run_id)
    if prepared.result_path.exists():
        # A result from an earlier try must not be mistaken for this try's.
        prepared.result_path.unlink()
    return prepared


def check_training_inputs(plan: PipelinePlan, config: TrainingConfig, snapshot: SnapshotInfo, *,
                          settings: Settings) -> None:
    """The trainer's own input checks, run on the snapshot's train split before torchrun starts: a
    missing column, missing values without ``impute``, text in a numeric feature, a label the task cannot
    use. Each is a located error at the spec's ``training.features`` (or ``label``) with the trainer's
    fix, instead of torchrun's failure banners around the same line seconds later.

    The local launcher's trainer reads the same file on this machine, so the whole split is checked;
    for other launchers (the pod reads it) only the columns, from the snapshot's recorded schema.
    """
    from trainpipe.errors import SpecError, SpecProblem
    from trainpipe_trainer.errors import TrainerDataError
    from trainpipe_trainer.preprocessing import FeatureTransformer, label_class_names, label_values, require_columns

    source = f"the snapshot's train split ({snapshot.digest[:16]})"
    if snapshot.kind == MANIFEST_KIND:
        source = f"the first {CHECKED_MANIFEST_ROWS:,} rows of the snapshot's train split ({snapshot.digest[:16]})"
    # causal_lm without a label learns every next token of its text: no label column.
    labels = [config.label] if config.label else []

    def located(field: str, err: TrainerDataError) -> SpecError:
        file, line, column = plan.inputs_declared_at.get(field, (plan.spec_file, None, None))
        return SpecError([SpecProblem(file or plan.spec_file, line, column, f"training.{field}", str(err))])

    if plan.launch.launcher != "local":
        # The family is the trainer image's (the pod resolves it; the trainer reports a missing one).
        if not snapshot.schema:
            return  # a snapshot recorded before schemas were: the trainer checks it
        import pandas as pd

        frame = pd.DataFrame(columns=[name for name, _ in snapshot.schema])
        checks = [("features", lambda: require_columns(frame, config.features, source=source, role="feature")),
                  ("label", lambda: require_columns(frame, labels, source=source, role="label"))]
    elif config.task == "causal_lm":
        # Text in, text to predict: the columns are the check (the trainer reads them as text).
        check_model_family(plan, config)
        frame = _train_rows_to_check(config, snapshot, settings=settings)
        checks = [("features", lambda: require_columns(frame, config.features, source=source, role="feature")),
                  ("label", lambda: require_columns(frame, labels, source=source, role="label"))]
    else:
        check_model_family(plan, config)
        frame = _train_rows_to_check(config, snapshot, settings=settings)
        checks = [("features", lambda: FeatureTransformer.fit(frame, config.feature_transforms(), source=source)
                   .transform(frame, source=source)),
                  ("label", lambda: require_columns(frame, [config.label], source=source, role="label"))]
        if config.task != "multiclass_classification":
            checks.append(("label", lambda: label_values(frame, label=config.label, task=config.task, source=source)))
        elif not config.label_classes:  # the label gave no classes: say why (missing or fractional values)
            checks.append(("label", lambda: label_class_names(frame[config.label], label=config.label, source=source)))
        else:  # a class the run does not know (pinned classes only: otherwise they are the snapshot's)
            checks.append(("label_classes" if "label_classes" in plan.inputs_declared_at else "label",
                           lambda: label_values(frame, label=config.label, task=config.task, source=source,
                                                classes=config.label_classes)))
    for field, check in checks:
        try:
            check()
        except TrainerDataError as err:
            raise located(field, err) from None


def _train_rows_to_check(config: TrainingConfig, snapshot: SnapshotInfo, *, settings: Settings) -> pd.DataFrame:
    """The train rows the input checks run on: a copy's whole split (the local trainer reads the same file), a
    manifest version's first ``CHECKED_MANIFEST_ROWS`` (it may not fit in memory; the trainer checks each unit
    it reads)."""
    if snapshot.kind == MANIFEST_KIND:
        return read_split(snapshot, "train", settings=settings, max_rows=CHECKED_MANIFEST_ROWS)
    # The snapshot lies under the storage root: read it with the root's connection, not the bare URI.
    return storage.read_parquet_uri(config.train_data_uri, conn_id=settings.storage_conn_id)


def check_model_family(plan: PipelinePlan, config: TrainingConfig) -> None:
    """The local launcher's trainer runs in this environment: find the spec's family here and let it check its
    ``model.params``, before any data is read. A family not installed, or a parameter it refuses, is a located error
    at the spec's ``training.model.type`` or ``training.model.params.<path>`` (the trainer's exit 2 otherwise, after
    torchrun and torch started). Imports the family's package: the train task does, never DAG parsing."""
    from trainpipe.errors import SpecError, SpecProblem
    from trainpipe_trainer.models import FamilyNotFoundError, FamilyParamsError, load_family

    def located(path: tuple[str, ...], message: str) -> SpecError:
        # The nearest place the plan recorded: the parameter, its top-level key, params, the type, the file.
        keys = [".".join(("model", *path[:end])) for end in range(len(path), 0, -1)]
        found = next((plan.inputs_declared_at[key] for key in keys if key in plan.inputs_declared_at), None)
        file, line, column = found or (plan.spec_file, None, None)
        field = f"training.model.{path[0]}" + "".join(f"[{part}]" if part.isdigit() else f".{part}"
                                                        for part in path[1:])
        return SpecError([SpecProblem(file or plan.spec_file, line, column, field, message)])

    name = config.model.type
    try:
        family = load_family(name)
    except FamilyNotFoundError as err:
        raise located(("type",), str(err).removeprefix("model.type: ")) from None
    except ImportError as err:
        # The registering package is installed but its module does not import here (a missing dependency).
        raise located(("type",), f"the model family {name!r} is registered but cannot be imported in this "
                                 f"environment ({type(err).__name__}: {err}); install what its package needs "
                                 "beside it on the Airflow workers") from None
    try:
        family.validate_params(config.model.params)
    except FamilyParamsError as err:
        path = ("params", *err.path.split(".")) if err.path else ("params",)
        prefix = f"model.params.{err.path}: " if err.path else "model.params: "
        raise located(path, str(err).removeprefix(prefix)) from None


def model_family_tags(plan: PipelinePlan, config: TrainingConfig) -> dict[str, str]:
    """The DAG run's MLflow tags that say which family it trains and where that came from. The local launcher
    trains with this environment's family (``family_provenance``: what reproduce compares); a Kubernetes pod with
    its image's: there the step writes the name and the image reference, and the trainer the rest."""
    if plan.launch.launcher != "local":
        image = plan.kubernetes.image if plan.kubernetes is not None else None
        return {MODEL_FAMILY_TAG: config.model.type, **({TRAINER_IMAGE_TAG: image} if image else {})}
    from trainpipe_trainer.models import family_provenance
    from trainpipe_trainer.outcomes import model_family_tags as provenance_tags

    return provenance_tags(family_provenance(config.model.type))


def check_resumable(run_dir, config: TrainingConfig, *, world_size: int) -> None:
    """Refuse a run folder whose newest checkpoint another training wrote (other snapshot or settings).

    The same comparison and message as the trainer's guard (``ResumeIdentity``), made before
    launching so that nothing is changed. A checkpoint without a record (written before checkpoints
    had one) passes here; the trainer resumes it with a warning.
    """
    from trainpipe.state.checkpoint_state import read_checkpoint_state

    latest = read_checkpoint_state(run_dir).latest
    if latest is None:
        return
    try:
        manifest_path = run_dir / CHECKPOINTS_DIR / checkpoint_dir_name(latest.step) / CHECKPOINT_MANIFEST
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError):
        return  # deleted or rewritten meanwhile: the trainer decides on what it finds
    recorded = ResumeIdentity.from_manifest(manifest) if isinstance(manifest, dict) else None
    if recorded is None:
        return
    changes = recorded.differences(resume_identity(config, world_size=world_size))
    if changes:
        where = f"{config.checkpoint.root_uri}/{checkpoint_dir_name(latest.step)}"
        raise ResumeRefusedError(resume_refusal(where, changes))


def run_training(plan: PipelinePlan, snapshot: SnapshotInfo, *, settings: Settings, run: RunContext,
                 hook: MlflowHook | None = None, on_line: Callable[[str], None] | None = None,
                 run_dir=None, param_overrides: dict | None = None,
                 run_tags: dict[str, str] | None = None, trial: TrialLaunch | None = None,
                 stop_after_step: int | None = None) -> TrainingResult | None:
    """The one local launch: the train task and every trial of a study run it. With ``stop_after_step``
    the trainer commits that step and stops (no result: None); the next launch resumes there."""
    hook = hook or MlflowHook(settings)
    prepared = prepare_training_run(plan, snapshot, settings=settings, run=run, hook=hook, run_dir=run_dir,
                                    param_overrides=param_overrides, run_tags=run_tags, trial=trial,
                                    stop_after_step=stop_after_step)
    launch = resolve(plan.launch, LaunchValues(config_uri=prepared.config_uri,
                                               mlflow_tracking_uri=settings.mlflow_tracking_uri))
    say = on_line or (lambda text: log.info("%s", text))
    allowed = plan.launch.preemption_restarts
    # The trainer reads storage with s3fs: from the CLI, the keys come from the storage connection.
    env = {**launch.env, **storage.trainer_storage_env(settings)}
    started_at = datetime.now(UTC)
    outcome = "failed"
    try:
        for attempt in range(allowed + 1):
            reasons = TrainerReasons(on_line)
            try:
                # The plan's argv as it stands ("python -m trainpipe_trainer.elastic ..."), run by this Python.
                run_local(launch.argv, env=env, on_line=reasons.line, executable=local_python(),
                          grace_seconds=plan.launch.shutdown_timeout_seconds)
                outcome = "succeeded"
                break
            except TrainingFailedError as err:
                if prepared.result_path.exists() and stop_after_step is None:
                    # Written last, by this try (prepare removes an earlier one): the training is whole. A signal
                    # that reached torchrun after it (a worker shut down as training ended) must not retrain it.
                    say(f"the launch ended with code {err.exit_code} after the trainer had written its result: "
                        "the training is complete")
                    outcome = "succeeded"
                    break
                step = reasons.preempted_step
                preempted = step is not None or err.exit_code == PREEMPTED_EXIT_CODE
                saved = (f"committed checkpoint step-{step}" if step is not None
                         else "was stopped by SIGTERM before it reported a commit")
                if preempted and isinstance(err, LauncherStoppedError):
                    # This process was told to stop (its task or host is going away): leave, never relaunch here.
                    outcome = "preempted"
                    fact = preempted_leaving(step)
                    say(f"{fact} (the launcher was sent SIGTERM: not launching the trainer again in this try)")
                    raise LauncherStoppedError(fact, reasons=(fact,), exit_code=err.exit_code) from err
                if preempted and attempt < allowed:
                    # Not a failure: the step is committed; the same launch resumes there, in this try.
                    say(f"preempted: the trainer {saved} and stopped; launching it again to resume there "
                        f"(preemption restart {attempt + 1} of {allowed}, training.preemption.max_restarts)")
                    continue
                if preempted:
                    outcome = "preempted"
                    raise TrainingFailedError(
                        f"the trainer was preempted {attempt + 1} times (it {saved}), more than "
                        f"training.preemption.max_restarts ({allowed}) allows in one try; a retry resumes from "
                        "the newest committed checkpoint", reasons=tuple(reasons.messages),
                        exit_code=err.exit_code) from err
                if not reasons.messages:
                    raise
                changed = [message for message in reasons.messages if is_data_change(message)]
                if changed:
                    # A file of the version changed under the trainer: a retry would read the same file.
                    raise DatasetChangedError(changed[0]) from err
                # The trainer's own one-line reason (every rank prints it) instead of the command line.
                raise TrainingFailedError(f"the trainer stopped: {'; '.join(reasons.messages)}",
                                          reasons=tuple(reasons.messages)) from err
    finally:
        # Every try counts, whatever its outcome, relaunches after a preemption included: devices x wall
        # time (docs/cost-and-retention.md).
        account_try(prepared.run_dir, settings=settings, resources=plan.resources, pipeline_id=plan.dag_id,
                    try_number=run.try_number, started_at=started_at, outcome=outcome, client=hook.client,
                    mlflow_run_id=prepared.mlflow_run_id)
    if stop_after_step is not None and not prepared.result_path.exists():
        return None
    return read_training_result(prepared.run_dir)


# What trainpipe_trainer.__main__ prints for an expected failure (bad input, divergence, preemption).
_TRAINER_REASON = re.compile(r"^trainpipe_trainer: (?:\[rank \d+\] )?(?:error|stopped): (?P<message>.+)$")


@dataclass(slots=True)
class TrainerReasons:
    """Passes every trainer output line on and keeps the trainer's failure reasons, once each."""

    forward: Callable[[str], None] | None
    messages: list[str] = dataclasses.field(default_factory=list)

    def line(self, text: str) -> None:
        if self.forward is not None:
            self.forward(text)
        else:
            log.info("%s", text)
        match = _TRAINER_REASON.match(text)
        if match and match["message"] not in self.messages:
            self.messages.append(match["message"])

    @property
    def preempted_step(self) -> int | None:
        """The step a preempted trainer committed before it stopped; None when it was not preempted."""
        return next((step for step in map(preempted_step, self.messages) if step is not None), None)
