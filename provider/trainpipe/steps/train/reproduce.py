"""``trainpipe reproduce MODEL@ALIAS | MODEL/VERSION``: train a registered version again from its lineage.

The lineage the version and its training run recorded: the spec text logged on the run
(``spec/<file name>``, checked against the version's ``spec_file_sha256``), the dataset snapshot by
its content digest (read back from storage and checked against the digest), the run parameters a
trigger overrode (``trainpipe.param_overrides``, which hold the seed when it was overridden), and the
weights' sha256. The training runs again with the same launch (world size) in a fresh run folder,
as its own MLflow run; a training whose world size changed (``trainpipe.world_size_history``) is
replayed with each size up to the step the next took over. The trainer is deterministic on CPU, so
equal hashes are expected there. A version trained with another distribution or version of its model family than
the one installed here is refused before anything is read or trained.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from trainpipe import storage
from trainpipe.errors import ReproduceError, SpecError, TrialParamsError
from trainpipe.hooks.mlflow import MlflowHook
from trainpipe.plan.launch import with_nproc_per_node
from trainpipe.plan.model import FaultPlan, PipelinePlan
from trainpipe.plan.params import apply_run_params, with_trial_params
from trainpipe.plan.tracking import (
    BEST_PARAMS_TAG,
    MODEL_FAMILY_DISTRIBUTION_TAG,
    MODEL_FAMILY_SHA256_TAG,
    MODEL_FAMILY_TAG,
    MODEL_FAMILY_TAGS,
    MODEL_FAMILY_VERSION_TAG,
    PARAM_OVERRIDES_TAG,
    PRETRAINED_SHA256_TAG,
    PRETRAINED_URI_TAG,
    REPRODUCED_MATCH_TAG,
    REPRODUCES_TAG,
    SEED_TAG,
    SPEC_FILE_SHA256_TAG,
    SPEC_FILE_TAG,
    VERSION_DAG_ID_TAG,
    VERSION_DATASET_DIGEST_TAG,
    WEIGHTS_SHA256_TAG,
)
from trainpipe.settings import Settings
from trainpipe.state.datasets import (
    MANIFEST_KIND,
    SnapshotInfo,
    load_manifest,
    manifest_file_problems,
    version_folder,
)
from trainpipe.steps.register.lineage import spec_artifact_path
from trainpipe.steps.snapshot import content_digest
from trainpipe.steps.train.train import RunContext, pretrained_uri, run_training
from trainpipe_trainer.outcomes import WORLD_SIZE_HISTORY_TAG

log = logging.getLogger(__name__)

_REFERENCE = re.compile(r"^(?P<name>[^@/]+)(?:@(?P<alias>[A-Za-z][\w-]*)|/(?P<version>\d+))$")
_REQUIRED_TAGS = (VERSION_DAG_ID_TAG, VERSION_DATASET_DIGEST_TAG, SPEC_FILE_TAG, SPEC_FILE_SHA256_TAG, WEIGHTS_SHA256_TAG)


@dataclass(frozen=True, slots=True, kw_only=True)
class Lineage:
    """What a registered version says about how it was trained."""

    model_name: str
    version: int
    alias: str | None
    mlflow_run_id: str
    dag_id: str
    dataset_digest: str
    spec_file: str
    spec_sha256: str
    spec_text: str
    seed: str | None
    world_size: str | None
    param_overrides: dict[str, Any]
    weights_sha256: str
    # [first step, world size] per change of world size during the training (empty: not recorded).
    world_size_history: tuple[tuple[int, int], ...] = ()
    # A tuned spec's final training ran with its best trial's parameters (None: not tuned).
    tuned_params: dict[str, Any] | None = None
    # The model family tags of the version (plan.tracking.MODEL_FAMILY_TAGS): empty when registered before
    # families were recorded.
    model_family: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def resized(self) -> bool:
        return len(self.world_size_history) > 1

    def describe(self) -> str:
        held = f" (alias {self.alias})" if self.alias else ""
        sizes = (", world sizes " + ", ".join(f"{size} from step {step}" for step, size in self.world_size_history)
                 if self.resized else "")
        family = self.model_family
        if MODEL_FAMILY_VERSION_TAG in family:
            sizes += (f", model family {family.get(MODEL_FAMILY_TAG, '?')} "
                      f"({family.get(MODEL_FAMILY_DISTRIBUTION_TAG, '?')} {family[MODEL_FAMILY_VERSION_TAG]})")
        return (f"{self.model_name} version {self.version}{held}: MLflow run {self.mlflow_run_id} of {self.dag_id}, "
                f"snapshot {self.dataset_digest[:16]}, spec {self.spec_file} (sha256 {self.spec_sha256[:12]}), "
                f"seed {self.seed}, run parameters {json.dumps(self.param_overrides, sort_keys=True)}{sizes}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ReproduceResult:
    lineage: Lineage
    weights_sha256: str
    mlflow_run_id: str

    @property
    def matches(self) -> bool:
        return self.weights_sha256 == self.lineage.weights_sha256


def parse_reference(reference: str) -> tuple[str, str | None, int | None]:
    """``name@alias`` or ``name/version`` -> (name, alias, version)."""
    match = _REFERENCE.match(reference.strip())
    if match is None:
        raise ReproduceError(f"{reference!r} names no model version; write MODEL@ALIAS (fraud_detector@champion) "
                             "or MODEL/VERSION (fraud_detector/3)")
    version = match["version"]
    return match["name"], match["alias"], int(version) if version else None


def read_lineage(client: Any, reference: str) -> Lineage:
    from mlflow.exceptions import MlflowException

    name, alias, number = parse_reference(reference)
    try:
        version = client.get_model_version_by_alias(name, alias) if alias else client.get_model_version(name, str(number))
    except MlflowException as err:
        raise ReproduceError(f"{reference}: no such registered model version ({err.message})") from err
    tags = dict(version.tags)
    missing = [t for t in _REQUIRED_TAGS if not tags.get(t)]
    if missing:
        raise ReproduceError(
            f"{name} version {version.version} has no {', '.join(missing)} tag(s): it was registered before trainpipe "
            "recorded the lineage reproduce needs, so it cannot be trained again from it")
    run = client.get_run(version.run_id)
    spec_text = _logged_spec_text(client, version.run_id, tags[SPEC_FILE_TAG])
    if hashlib.sha256(spec_text.encode()).hexdigest() != tags[SPEC_FILE_SHA256_TAG]:
        raise ReproduceError(f"the spec text logged on run {version.run_id} does not match the version's "
                             f"{SPEC_FILE_SHA256_TAG} {tags[SPEC_FILE_SHA256_TAG][:12]}: it was changed after registration")
    return Lineage(
        model_name=name, version=int(version.version), alias=alias, mlflow_run_id=version.run_id, dag_id=tags[VERSION_DAG_ID_TAG],
        dataset_digest=tags[VERSION_DATASET_DIGEST_TAG], spec_file=tags[SPEC_FILE_TAG],
        spec_sha256=tags[SPEC_FILE_SHA256_TAG], spec_text=spec_text, seed=tags.get(SEED_TAG),
        world_size=run.data.params.get("world_size"),
        param_overrides=json.loads(run.data.tags.get(PARAM_OVERRIDES_TAG) or "{}"),
        weights_sha256=tags[WEIGHTS_SHA256_TAG],
        world_size_history=tuple((int(step), int(size))
                                 for step, size in json.loads(run.data.tags.get(WORLD_SIZE_HISTORY_TAG) or "[]")),
        tuned_params=_tuned_params(run.data.tags, version.run_id),
        model_family={key: tags[key] for key in MODEL_FAMILY_TAGS if tags.get(key)},
    )


def _tuned_params(tags: dict[str, str], run_id: str) -> dict[str, Any] | None:
    """The best trial's parameters the run's tag records. Anyone with MLflow access can edit a tag, so
    ``plan_for`` checks each value against the spec's search space before it is applied."""
    if BEST_PARAMS_TAG not in tags:
        return None
    try:
        params = json.loads(tags[BEST_PARAMS_TAG])
    except ValueError:
        params = None
    if not isinstance(params, dict):
        raise TrialParamsError(f"MLflow run tag {BEST_PARAMS_TAG!r} of run {run_id} is not a JSON object of the best "
                               "trial's parameters; restore the parameters the study's best trial recorded")
    return params


def _logged_spec_text(client: Any, run_id: str, spec_file: str) -> str:
    import os

    from mlflow.exceptions import MlflowException

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one small file: no bar on the terminal
    artifact = spec_artifact_path(spec_file)
    with tempfile.TemporaryDirectory(prefix="trainpipe-reproduce-") as directory:
        try:
            local = client.download_artifacts(run_id, artifact, directory)
        except (MlflowException, OSError) as err:
            raise ReproduceError(f"run {run_id} has no spec artifact {artifact}; cannot rebuild its training") from err
        return Path(local).read_text(encoding="utf-8")


def plan_for(lineage: Lineage, *, configs_root: Path, settings: Settings) -> PipelinePlan:
    """The logged spec compiled where it lived (its folder's defaults apply), with the run's parameters."""
    from trainpipe.compile.compiler import compile_text

    try:
        plan = compile_text(lineage.spec_text, lineage.spec_file, configs_root=configs_root, settings=settings)
        plan, _ = apply_run_params(plan, lineage.param_overrides)
        if lineage.tuned_params is not None and plan.tuning is not None:
            # The search is not run again: its best trial's parameters are what the version was trained with.
            plan = with_trial_params(plan, lineage.tuned_params,
                                     source=f"MLflow run tag {BEST_PARAMS_TAG!r} of run {lineage.mlflow_run_id}")
    except SpecError as err:
        raise ReproduceError(f"the spec logged with {lineage.model_name} version {lineage.version} no longer "
                             f"compiles here:\n{err}") from err
    if lineage.seed is not None and str(plan.trainer.seed) != lineage.seed:
        raise ReproduceError(f"the rebuilt training would use seed {plan.trainer.seed}, the version records seed "
                             f"{lineage.seed}; its run parameters were not all recorded")
    world_size = plan.launch.world_size
    for _step, size in lineage.world_size_history if lineage.resized else ():
        if size % plan.launch.nnodes:
            raise ReproduceError(f"the version was trained by {size} processes for a while, which {plan.launch.nnodes} "
                                 "nodes cannot replay (the spec's nnodes); the weights would differ")
    if not lineage.resized and lineage.world_size is not None and str(world_size) != lineage.world_size:
        raise ReproduceError(f"the spec launches {world_size} processes, the version was trained by "
                             f"{lineage.world_size}; the weights would differ")
    # A fault a test injected into the original's first try is not part of what it computed.
    return dataclasses.replace(plan, testing=FaultPlan())


def check_model_family(lineage: Lineage, family: str) -> str | None:
    """Refuse, before anything is trained, when the installed family is another distribution or version than the one
    the version was trained with: the rebuilt weights would differ for a reason reproduce cannot show. Returns a
    warning when only the installed files differ (same version, another build), else None. A version without the
    record (registered before families were recorded, or trained on Kubernetes by a trainer that did not report
    it) is not compared."""
    from trainpipe_trainer.models import FamilyNotFoundError, family_provenance

    recorded_version = lineage.model_family.get(MODEL_FAMILY_VERSION_TAG)
    if recorded_version is None:
        return None
    recorded_distribution = lineage.model_family.get(MODEL_FAMILY_DISTRIBUTION_TAG, "an unrecorded distribution")
    trained = f"{recorded_distribution} {recorded_version}"
    try:
        installed = family_provenance(family)
    except FamilyNotFoundError as err:
        raise ReproduceError(f"{lineage.model_name} version {lineage.version} was trained with model family {family!r} "
                             f"from {trained}, which is not installed here ({err}); install "
                             f"{recorded_distribution}=={recorded_version} to reproduce it") from None
    here = f"{installed['distribution']} {installed['version']}"
    if (installed["distribution"], installed["version"]) != (recorded_distribution, recorded_version):
        raise ReproduceError(f"{lineage.model_name} version {lineage.version} was trained with model family {family!r} "
                             f"from {trained}; this environment has {here}: the weights would differ; install "
                             f"{recorded_distribution}=={recorded_version} to reproduce it")
    recorded_sha256 = lineage.model_family.get(MODEL_FAMILY_SHA256_TAG)
    if recorded_sha256 and installed["sha256"] and recorded_sha256 != installed["sha256"]:
        return (f"model family {family!r}: {here} is installed, as recorded, but from another build (sha256 "
                f"{installed['sha256'][:12]}, recorded {recorded_sha256[:12]}); the weights may differ")
    return None


def check_pretrained(lineage: Lineage, plan: PipelinePlan, settings: Settings) -> None:
    """Refuse, before anything is trained, when the pretrained folder the spec names no longer holds the files the
    version started from (the sha256 over its files, ``trainpipe.pretrained_sha256``): the weights would differ
    for a reason reproduce cannot show. A Hub id is not read here (its files are the Hub's)."""
    from trainpipe import uris
    from trainpipe_trainer.models.transformer.pretrained import files_sha256

    recorded = lineage.model_family.get(PRETRAINED_SHA256_TAG)
    uri = pretrained_uri(plan, settings)
    if not recorded or uri is None or uris.is_hub(uri):
        return
    folder = storage.resolve_uri(uri, settings)
    prefix = len(str(folder).rstrip("/")) + 1
    found = files_sha256((str(path)[prefix:], hashlib.sha256(path.read_bytes()).hexdigest())
                         for path in folder.rglob("*") if path.is_file())
    if found != recorded:
        trained_from = lineage.model_family.get(PRETRAINED_URI_TAG, "its pretrained folder")
        raise ReproduceError(
            f"{lineage.model_name} version {lineage.version} started from pretrained weights with sha256 "
            f"{recorded[:16]} ({trained_from}); {storage.shown_uri(folder)} now holds files with sha256 {found[:16]}: "
            "the weights would differ; restore that folder (or point training.model.pretrained at a copy of it) to "
            "reproduce it")


def _sized(plan: PipelinePlan, world_size: int) -> PipelinePlan:
    nproc = world_size // plan.launch.nnodes
    return dataclasses.replace(plan, launch=with_nproc_per_node(plan.launch, nproc))


def snapshot_by_digest(pipeline_id: str, digest: str, *, settings: Settings) -> SnapshotInfo:
    """The stored snapshot with this content digest, its content checked against the digest."""
    import pandas as pd

    folder = version_folder(settings, pipeline_id, digest)
    manifest_path = folder / "manifest.json"
    if not manifest_path.exists():
        raise ReproduceError(f"snapshot {digest[:16]} of {pipeline_id} is not in storage any more "
                             f"(snapshots/{pipeline_id}/{digest[:16]}); the training cannot be rebuilt without it")
    manifest = storage.read_json(manifest_path)
    if manifest.get("digest") != digest:
        raise ReproduceError(f"snapshots/{pipeline_id}/{digest[:16]} holds snapshot {manifest.get('digest')}, "
                             f"not {digest}")
    if manifest.get("kind") == MANIFEST_KIND:
        return _manifest_snapshot(pipeline_id, digest, folder, manifest, settings=settings)
    train, holdout = storage.read_table(folder / "train.parquet"), storage.read_table(folder / "holdout.parquet")
    rows = pd.concat([train, holdout], ignore_index=True)
    rows = rows.sort_values(list(rows.columns), kind="stable").reset_index(drop=True)
    if content_digest(rows) != digest:
        raise ReproduceError(f"snapshot {digest[:16]} of {pipeline_id}: the stored rows no longer match its digest")
    fields = {f.name: manifest.get(f.name) for f in dataclasses.fields(SnapshotInfo)}
    # Where the files are now (the storage root may have moved since).
    fields.update(uri=str(folder), train_uri=storage.fsspec_uri(folder / "train.parquet"),
                  holdout_uri=storage.fsspec_uri(folder / "holdout.parquet"))
    return SnapshotInfo(**fields)


def _manifest_snapshot(pipeline_id: str, digest: str, folder: Any, record: dict[str, Any], *,
                       settings: Settings) -> SnapshotInfo:
    """A manifest version lists the source's files instead of holding rows: it reproduces only while every
    listed file is as the snapshot found it (or, read by S3 VersionId, still there). Nothing is copied."""
    from trainpipe_trainer.data.manifest import MANIFEST_FILE

    manifest_uri = storage.fsspec_uri(folder / MANIFEST_FILE)
    fields = {f.name: record.get(f.name) for f in dataclasses.fields(SnapshotInfo)}
    # Where the version's files are now (the storage root may have moved since).
    fields.update(uri=str(folder), train_uri=manifest_uri, holdout_uri=manifest_uri, manifest_uri=manifest_uri)
    snapshot = SnapshotInfo(**fields)
    try:
        loaded, _ = load_manifest(snapshot, settings=settings)
        problems = manifest_file_problems(snapshot, settings=settings)
    except FileNotFoundError:
        raise ReproduceError(f"snapshots/{pipeline_id}/{digest[:16]}: its {MANIFEST_FILE} is gone; the training "
                             "cannot be rebuilt without the list of its files") from None
    except ValueError as err:  # the manifest's own check: edited after it was written
        raise ReproduceError(f"snapshots/{pipeline_id}/{digest[:16]}: {err}") from None
    if loaded.digest != digest:
        raise ReproduceError(f"snapshots/{pipeline_id}/{digest[:16]}: its {MANIFEST_FILE} lists version "
                             f"{loaded.digest[:16]}, not {digest[:16]}")
    if problems:
        raise ReproduceError(f"snapshot {digest[:16]} of {pipeline_id} lists files that changed since: "
                             + "; ".join(problems))
    return snapshot


def reproduce(reference: str, *, configs_root: Path, settings: Settings, hook: MlflowHook | None = None,
              on_line: Callable[[str], None] | None = None) -> ReproduceResult:
    hook = hook or MlflowHook(settings)
    lineage = read_lineage(hook.client, reference)
    say = on_line or log.info
    say(f"reproducing {lineage.describe()}")
    plan = plan_for(lineage, configs_root=configs_root, settings=settings)
    # Before the snapshot is read or anything trained.
    build = check_model_family(lineage, plan.trainer.model.type)
    if build is not None:
        say(build)
    check_pretrained(lineage, plan, settings)
    snapshot = snapshot_by_digest(plan.dag_id, lineage.dataset_digest, settings=settings)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    run = RunContext(dag_id=plan.dag_id, airflow_run_id=f"reproduce__{lineage.model_name}_v{lineage.version}__{stamp}",
                     try_number=1, spec_sha256=plan.spec_sha256, git_commit=None)
    # A training that changed size (preempted, resumed on fewer nodes) is replayed segment by segment:
    # each size up to the step the next one took over, in one run folder (each resume reshards).
    history = lineage.world_size_history if lineage.resized else ()
    for (_start, size), (until, _next) in zip(history, history[1:], strict=False):
        say(f"replaying the world-size history: {size} processes up to step {until}")
        run_training(_sized(plan, size), snapshot, settings=settings, run=run, hook=hook, on_line=on_line,
                     param_overrides=lineage.param_overrides, stop_after_step=until)
    final = _sized(plan, history[-1][1]) if history else plan
    result = run_training(final, snapshot, settings=settings, run=run, hook=hook, on_line=on_line,
                          param_overrides=lineage.param_overrides)
    outcome = ReproduceResult(lineage=lineage, weights_sha256=result.weights_sha256, mlflow_run_id=result.mlflow_run_id)
    hook.client.set_tag(result.mlflow_run_id, REPRODUCES_TAG, f"{lineage.model_name}/{lineage.version}")
    hook.client.set_tag(result.mlflow_run_id, REPRODUCED_MATCH_TAG, str(outcome.matches).lower())
    return outcome
