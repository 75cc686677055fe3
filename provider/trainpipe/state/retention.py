"""``trainpipe gc``: what storage no longer needs, with its size; deleted only when asked (``--apply``).

Three kinds of garbage, each only when last written longer ago than ``older_than``:

- the ``checkpoints/`` of a *finished* run (the train task succeeded or failed for good; a run
  without a task status, from ``trainpipe train`` or ``reproduce``, once it wrote its result)
  beyond the last ``keep_runs`` finished runs of its pipeline (trials' checkpoints with their run).
  The run's config, output, result and usage ledger stay;
- a snapshot (dataset version) that nothing refers to: no registered model version (its
  ``dataset_digest`` tag: what ``trainpipe reproduce`` reads back), not the baseline (``LATEST.json``,
  the last accepted version), no unfinished run (its trainer config names the snapshot), no spec's
  pinned drift reference (``validation.drift.reference``; while a spec cannot be compiled its pin is
  unknown, so no snapshot is deleted then);
- plan-cache bundles (``trainpipe.compile.plan_cache``) of other code versions, or not rewritten since.

Never touched: anything of a run that is not finished (running, or failed with a retry to come), and
the snapshot and logged spec of any registered version, so ``reproduce`` keeps working. Storage goes
through ``trainpipe.storage`` (``file://`` and ``s3://`` alike).
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from trainpipe import storage
from trainpipe.settings import Settings
from trainpipe_trainer.run_layout import CHECKPOINTS_DIR, TRAINER_CONFIG_FILE

log = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
SNAPSHOT = "snapshot"
PLAN_CACHE = "plan-cache"
_PAGE = 1000


@dataclass(frozen=True, slots=True, kw_only=True)
class DriftPins:
    """The snapshots the specs pin as drift reference, read by the caller from the compiled specs."""

    # pipeline id (the DAG id, which names its snapshots folder) -> digest prefix -> the spec file that pins it
    by_pipeline: dict[str, dict[str, str]]
    # Why some pins are unknown (specs that do not compile, no spec folder); empty when all are known.
    unknown_because: str = ""


def drift_pins(configs: Path, *, settings: Settings) -> DriftPins:
    """The drift references the specs under ``configs`` pin, for ``gc`` to keep."""
    from trainpipe.compile.compiler import compile_directory

    if not configs.is_dir():
        return DriftPins(by_pipeline={}, unknown_because=f"there is no spec folder {configs} (pass --configs)")
    result = compile_directory(configs, relative_to=configs.resolve().parent, settings=settings)
    pins: dict[str, dict[str, str]] = {}
    for plan in result.plans.values():
        drift = plan.validation.drift
        if drift is not None and drift.reference != "baseline":
            pins.setdefault(plan.dag_id, {})[drift.reference] = plan.spec_relative_path
    unknown = ""
    if result.errors:
        unknown = (f"{len(result.errors)} spec(s) do not compile ({', '.join(sorted(result.errors))}; "
                   "`trainpipe validate` says why)")
    return DriftPins(by_pipeline=pins, unknown_because=unknown)


@dataclass(frozen=True, slots=True, kw_only=True)
class GarbageItem:
    kind: str
    pipeline: str
    # Shown to people: relative to the storage root (or, for the plan cache, to TRAINPIPE_HOME).
    label: str
    reason: str
    size_bytes: int
    location: Any  # ObjectStoragePath (storage) or Path (plan cache)
    # Checkpoints: the run folder whose status is checked again right before deleting.
    run_folder: Any = None


@dataclass(frozen=True, slots=True, kw_only=True)
class GarbagePlan:
    items: tuple[GarbageItem, ...]
    kept: tuple[str, ...]  # one line per kept item worth mentioning (protected snapshots, unfinished runs)
    older_than: timedelta
    keep_runs: int

    @property
    def size_bytes(self) -> int:
        return sum(i.size_bytes for i in self.items)


def _size(path: Any) -> int:
    if isinstance(path, Path):
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else path.stat().st_size
    try:
        return int(path.fs.du(path.path, total=True))
    except FileNotFoundError:
        return 0


def _newest_write(path: Any) -> datetime | None:
    """The newest modification time of any file under ``path`` (None if it holds none)."""
    newest = None
    for info in path.fs.find(path.path, detail=True).values():
        stamp = info.get("mtime") or info.get("LastModified") or info.get("last_modified")
        if isinstance(stamp, int | float):
            stamp = datetime.fromtimestamp(stamp, UTC)
        if isinstance(stamp, datetime):
            stamp = stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)
            newest = stamp if newest is None or stamp > newest else newest
    return newest


def _relative(path: Any, root: Any) -> str:
    return str(path.path).removeprefix(str(root.path)).lstrip("/")


@dataclass(frozen=True, slots=True, kw_only=True)
class _Run:
    pipeline: str
    folder: Any
    finished: bool
    finished_at: datetime | None
    snapshot_digest: str | None


def _runs(root: Any) -> list[_Run]:
    from trainpipe.state.checkpoint_state import read_training_status
    from trainpipe.state.run_folder import result_path_in

    runs_root = root / "runs"
    if not runs_root.exists():
        return []
    found = []
    for pipeline_folder in runs_root.iterdir():
        if not pipeline_folder.is_dir():
            continue
        for folder in pipeline_folder.iterdir():
            if not folder.is_dir():
                continue
            status = read_training_status(folder)
            if status is not None:
                finished = status.state == "succeeded" or (status.state == "failed" and status.final)
                finished_at = status.updated_at if finished else None
            else:  # trainpipe train / reproduce: no task status; finished once the trainer wrote its result
                result = result_path_in(folder)
                finished = result.exists()
                finished_at = _newest_write(result) if finished else None
            digest = None
            config = folder / TRAINER_CONFIG_FILE
            if config.exists():
                try:
                    digest = json.loads(config.read_text()).get("dataset_digest")
                except ValueError:
                    digest = None
            found.append(_Run(pipeline=pipeline_folder.name, folder=folder, finished=finished, finished_at=finished_at,
                              snapshot_digest=digest))
    return found


def registered_digests(client: Any) -> set[str]:
    """The snapshot digest of every registered model version (paged searches, not one call per version)."""
    digests: set[str] = set()
    token = None
    while True:
        page = client.search_model_versions(max_results=_PAGE, page_token=token)
        for version in page:
            digest = (version.tags or {}).get("dataset_digest")
            if digest:
                digests.add(digest)
        token = page.token
        if not token:
            return digests


def _checkpoint_items(runs: list[_Run], root: Any, *, cutoff: datetime, keep_runs: int) -> tuple[list, list]:
    items, kept = [], []
    by_pipeline: dict[str, list[_Run]] = {}
    for run in runs:
        if run.finished:
            by_pipeline.setdefault(run.pipeline, []).append(run)
        elif (run.folder / CHECKPOINTS_DIR).exists():
            kept.append(f"checkpoints of {_relative(run.folder, root)}: the run is not finished")
    for pipeline, finished in by_pipeline.items():
        newest_first = sorted(finished, key=lambda r: r.finished_at or datetime.min.replace(tzinfo=UTC),
                              reverse=True)
        for run in newest_first[keep_runs:]:
            if run.finished_at is None or run.finished_at > cutoff:
                continue
            folders = [run.folder / CHECKPOINTS_DIR]
            trials = run.folder / "trials"
            if trials.exists():
                folders += [trial / CHECKPOINTS_DIR for trial in trials.iterdir() if trial.is_dir()]
            for folder in folders:
                if folder.exists():
                    items.append(GarbageItem(
                        kind=CHECKPOINTS, pipeline=pipeline, label=_relative(folder, root),
                        reason=f"run finished {run.finished_at:%Y-%m-%d %H:%M}, older than the last {keep_runs} "
                               "finished run(s)",
                        size_bytes=_size(folder), location=folder, run_folder=run.folder))
    return items, kept


def _snapshot_items(runs: list[_Run], root: Any, client: Any, *, cutoff: datetime,
                    pins: DriftPins) -> tuple[list, list]:
    from trainpipe.state.datasets import BASELINE_FILE

    snapshots_root = root / "snapshots"
    if not snapshots_root.exists():
        return [], []
    registered = registered_digests(client)
    in_use = {r.snapshot_digest for r in runs if not r.finished and r.snapshot_digest}
    items, kept, unpinned_unknown = [], [], []
    for pipeline_folder in snapshots_root.iterdir():
        if not pipeline_folder.is_dir():
            continue
        baseline = pipeline_folder / BASELINE_FILE
        baseline_digest = storage.read_json(baseline).get("digest") if baseline.exists() else None
        for folder in pipeline_folder.iterdir():
            manifest = folder / "manifest.json"
            if not folder.is_dir() or not manifest.exists():
                continue
            digest = storage.read_json(manifest).get("digest") or ""
            label = _relative(folder, root)
            pinned_by = sorted({spec for prefix, spec in pins.by_pipeline.get(pipeline_folder.name, {}).items()
                                if digest and digest.startswith(prefix)})
            reasons = [why for why, holds in (
                ("a registered model version was trained on it", digest in registered),
                ("it is the baseline (LATEST.json)", digest == baseline_digest),
                ("an unfinished run trains on it", digest in in_use),
                (f"{', '.join(pinned_by)} pins it as drift reference (validation.drift.reference)", pinned_by),
            ) if holds]
            if reasons:
                kept.append(f"{label}: {'; '.join(reasons)}")
                continue
            written = _newest_write(folder)
            if written is None or written > cutoff:
                continue
            if pins.unknown_because:
                unpinned_unknown.append(label)
                continue
            items.append(GarbageItem(kind=SNAPSHOT, pipeline=pipeline_folder.name, label=label,
                                     reason=f"written {written:%Y-%m-%d %H:%M}; no registered version, baseline, "
                                            "unfinished run or spec's drift pin refers to it",
                                     size_bytes=_size(folder), location=folder))
    if unpinned_unknown:
        kept.append(f"{', '.join(unpinned_unknown)}: no other reference, but the specs' pinned drift references "
                    f"are unknown: {pins.unknown_because}")
    return items, kept


def _plan_cache_items(settings: Settings, *, cutoff: datetime) -> list[GarbageItem]:
    from trainpipe.compile.plan_cache import code_fingerprint

    base = settings.home / "cache" / "plans"
    if not base.is_dir():
        return []
    current = code_fingerprint()[:32]
    items = []
    for folder in base.iterdir():
        if not folder.is_dir():
            continue
        candidates = [folder] if folder.name != current else [f for f in folder.iterdir() if f.is_file()]
        for path in candidates:
            files = [path] if path.is_file() else [f for f in path.rglob("*") if f.is_file()]
            newest = max((f.stat().st_mtime for f in files), default=path.stat().st_mtime)
            if datetime.fromtimestamp(newest, UTC) > cutoff:
                continue
            reason = ("written by another trainpipe version" if path is folder
                      else f"not rewritten since {datetime.fromtimestamp(newest, UTC):%Y-%m-%d}")
            items.append(GarbageItem(kind=PLAN_CACHE, pipeline="-", label=str(path.relative_to(settings.home)),
                                     reason=reason, size_bytes=_size(path), location=path))
    return items


def collect(settings: Settings, *, older_than: timedelta, keep_runs: int, pins: DriftPins, client: Any = None,
            now: datetime | None = None) -> GarbagePlan:
    """What ``gc`` would delete; reads storage, the registry and the plan cache, changes nothing."""
    if keep_runs < 0:
        from trainpipe.errors import TrainpipeError

        raise TrainpipeError(f"--keep-runs must be >= 0, got {keep_runs}")
    if client is None:
        from trainpipe.hooks.mlflow import MlflowHook

        client = MlflowHook(settings).client
    cutoff = (now or datetime.now(UTC)) - older_than
    root = storage.storage_root(settings)
    runs = _runs(root)
    checkpoint_items, kept_runs = _checkpoint_items(runs, root, cutoff=cutoff, keep_runs=keep_runs)
    snapshot_items, kept_snapshots = _snapshot_items(runs, root, client, cutoff=cutoff, pins=pins)
    items = (*checkpoint_items, *snapshot_items, *_plan_cache_items(settings, cutoff=cutoff))
    return GarbagePlan(items=items, kept=(*kept_runs, *kept_snapshots), older_than=older_than, keep_runs=keep_runs)


def delete(plan: GarbagePlan) -> list[GarbageItem]:
    """Delete the plan's items (a run that started again since ``collect`` keeps its checkpoints)."""
    from trainpipe.state.checkpoint_state import read_training_status

    deleted = []
    for item in plan.items:
        try:
            if isinstance(item.location, Path):
                shutil.rmtree(item.location) if item.location.is_dir() else item.location.unlink()
            else:
                if item.run_folder is not None:
                    status = read_training_status(item.run_folder)
                    if status is not None and status.state == "running":
                        log.warning("kept %s: its run started again", item.label)
                        continue
                item.location.fs.rm(item.location.path, recursive=True)
                _invalidate(item.location)
        except FileNotFoundError:
            continue  # already gone
        deleted.append(item)
    return deleted


def _invalidate(path: Any) -> None:
    invalidate = getattr(path.fs, "invalidate_cache", None)
    if invalidate is not None:
        invalidate()


def _human(size: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def format_plan(plan: GarbagePlan, *, applying: bool) -> str:
    verb = "deleting" if applying else "would delete"
    lines = [f"{verb} {len(plan.items)} item(s), {plan.size_bytes} bytes ({_human(plan.size_bytes)}); "
             f"older than {plan.older_than}, keeping the checkpoints of the last {plan.keep_runs} finished run(s) "
             "per pipeline"]
    for item in plan.items:
        lines.append(f"  {item.kind:<11} {item.label}  {item.size_bytes} bytes  ({item.reason})")
    if plan.kept:
        lines.append(f"kept ({len(plan.kept)}):")
        lines += [f"  {line}" for line in plan.kept]
    if not applying and plan.items:
        lines.append("nothing was deleted; run again with --apply to delete the items above")
    return "\n".join(lines)
