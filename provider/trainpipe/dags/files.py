"""Compiled plans bound to Airflow DAG files: which DAG file compiles which spec (shards, ADR 0012),
pipeline ids across shards, the task run's parsing context, and the plan cache. ``trainpipe.load_dags``
is the public entry point; the compiler (``trainpipe.compile.compiler``) stays Airflow-free.

With ``shards=N`` (the repository's ``dags/`` uses 64: ``trainpipe_dags.py`` and ``shards/``), a
folder of at most ``SINGLE_FILE_MAX`` specs is compiled by shard 0 alone, as one file always did;
above that, each spec belongs to the shard named by a hash of its path relative to the configs
folder, so a spec never moves when others are added or removed, and each file compiles about 1/N of
the folder.

Standard library only at import: a shard file with nothing to compile returns before the compiler
(pydantic, the spec models, Airflow operators) is imported.
"""

from __future__ import annotations

import gc
import hashlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainpipe.compile.spec_files import SPECS_FOLDER_NAME, defaults_files, list_specs
from trainpipe.errors import DagFileError
from trainpipe.settings import Settings

if TYPE_CHECKING:
    from trainpipe.compile.compiler import CompileResult
    from trainpipe.compile.plan_cache import PlanCache

log = logging.getLogger(__name__)

# The layout measured in benchmarks/parse_scale.py (ADR 0012): 64 DAG files for a large folder.
SHARD_FILES = 64
# Up to this many specs one file compiles them all (about 1 s of parse): a small folder keeps one
# DAG file doing the work and the others return after listing the folder.
SINGLE_FILE_MAX = 300
# Set by Airflow when a worker parses a DAG file to run one task (airflow.sdk.get_parsing_context).
_PARSING_CONTEXT_DAG_ID = "_AIRFLOW_PARSING_CONTEXT_DAG_ID"
# With a parsing context, each DAG file may register the one DAG (a worker parses only the DAG's own
# file, which may no longer own the spec). When a whole folder is parsed under a context (`airflow dags
# test`), the first file to register it keeps it: dag id -> that DAG file, so no other raises Airflow's
# duplicate-id error.
_REGISTERED_FOR_CONTEXT: dict[str, str] = {}


def load_dags(namespace: dict[str, Any], *, specs_folder: str | os.PathLike[str] | None = None, shards: int = 1,
              shard: int = 0) -> None:
    """``trainpipe.load_dags`` (documented there)."""
    if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
        raise DagFileError(f"load_dags: shards must be a whole number >= 1 (the DAG files sharing the folder), "
                           f"got {shards!r}; use shards={SHARD_FILES} for a large folder")
    if isinstance(shard, bool) or not isinstance(shard, int) or not 0 <= shard < shards:
        raise DagFileError(f"load_dags: shard must be this file's number, 0 to {shards - 1} with shards={shards}, "
                           f"got {shard!r}")
    started = time.time()  # before the listing: a spec changed after this may not be in this parse
    with _cyclic_gc_paused():
        # The DAG file's parse is where the platform's settings are read; everything below is passed them.
        settings = Settings.from_env()
        root = specs_folder_for(namespace.get("__file__"), specs_folder, settings=settings)
        if shards == 1:
            register_dags(namespace, root, settings=settings)
            return
        mine, others = split(list_specs(root.resolve()), shard, shards)
        # A task run compiles its one spec whatever the shard (it may look in the other shards' files); a
        # shard that reported import errors last time parses to clear those of deleted specs.
        if not mine and not os.environ.get(_PARSING_CONTEXT_DAG_ID) and not errors_record(root, shard, settings).is_file():
            return
        register_dags(namespace, root, settings=settings, shard=(shard, mine, others), started=started)


def specs_folder_for(dag_file: str | None, specs_folder: str | os.PathLike[str] | None, *,
                     settings: Settings) -> Path:
    """The configs folder a DAG file compiles: ``specs_folder`` (relative to the DAG file's folder),
    else the settings' (``TRAINPIPE_DAG_CONFIGS``), else the nearest ``dag_configs/`` in the DAG file's folder or
    one of its parents (``dags/../dag_configs`` in this repository and beside an Airflow home's
    ``dags/``)."""
    here = Path(dag_file).resolve().parent if dag_file else None
    if specs_folder is not None:
        folder = Path(specs_folder)
        if folder.is_absolute():
            return folder
        if here is None:
            raise DagFileError("load_dags: a relative specs_folder needs the DAG file's __file__ in the globals "
                               "passed; call load_dags(globals(), ...) from the DAG file")
        return here / folder
    configured = settings.specs_folder
    if configured is not None:
        return configured
    for folder in (here, *here.parents) if here is not None else ():
        if (folder / SPECS_FOLDER_NAME).is_dir():
            return folder / SPECS_FOLDER_NAME
    raise DagFileError(f"load_dags: found no {SPECS_FOLDER_NAME}/ folder beside the DAG file or in its parent "
                       "folders; set TRAINPIPE_DAG_CONFIGS to the folder of your specs, or pass "
                       "load_dags(globals(), specs_folder=...)")


def shard_count(spec_count: int, files: int = SHARD_FILES) -> int:
    """How many of the ``files`` DAG files share a folder of ``spec_count`` specs: 1 up to ``SINGLE_FILE_MAX``."""
    return 1 if spec_count <= SINGLE_FILE_MAX else files


def shard_of(relative_path: str, count: int) -> int:
    """The shard of a spec: a hash of its relative path alone (stable across processes, Python
    versions and machines), so it depends on no other spec."""
    if count == 1:
        return 0
    digest = hashlib.blake2b(relative_path.encode("utf-8", "surrogateescape"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % count


def split(specs: list[tuple[str, str]], shard: int, files: int = SHARD_FILES) -> tuple[list[Path], list[str]]:
    """(this shard's spec files, every other spec file), each in path order."""
    count = shard_count(len(specs), files)
    mine: list[Path] = []
    others: list[str] = []
    for relative, path in specs:
        if shard_of(relative, count) == shard:
            mine.append(Path(path))
        else:
            others.append(path)
    return mine, others


def register_dags(namespace: dict[str, Any], directory: Path, *, settings: Settings,
                  shard: tuple[int, list[Path], list[str]] | None = None, started: float | None = None) -> CompileResult:
    """Build one DAG per valid spec into ``namespace`` (a DAG file's globals); each broken spec is
    reported to Airflow as an import error of that spec file (``trainpipe.dags.airflow_compat``).

    ``shard`` is (number, its spec files, every other spec file) from ``split``; without it the whole
    folder is compiled. Plans and DAGs come from the plan cache when their spec is unchanged; a task
    run's parse compiles its one spec and leaves the cache as it is. ``started``: when the parse
    began (``time.time()``), recorded for the shard with its end (``PlanCache.record_parse``).
    """
    from airflow.sdk import get_parsing_context

    from trainpipe.compile.plan_cache import PlanCache

    root = directory.resolve()
    number, mine, others = shard if shard is not None else (0, None, [])
    only = get_parsing_context().dag_id  # set when a worker parses the file to run one task
    cache = PlanCache(root, _bucket(number if shard is not None else None), home=settings.home).load()
    try:
        result = _register(namespace, directory, root, only, mine, others, cache, number if shard is not None else None,
                           settings)
    except BaseException:
        # Interrupted (Airflow's import timeout is a BaseException): keep what this parse compiled,
        # so that the next parse of an overloaded dag-processor starts further on.
        if only is None:
            cache.save(complete=False)
        raise
    if only is None and shard is not None and started is not None:
        cache.record_parse(number, started, time.time())
    return result


def _register(namespace: dict[str, Any], directory: Path, root: Path, only: str | None, mine: list[Path] | None,
              others: list[str], cache: PlanCache, shard: int | None, settings: Settings) -> CompileResult:
    from trainpipe.compile.compiler import compile_directory, unexpected_failure
    from trainpipe.dags.airflow_compat import report_spec_errors
    from trainpipe.dags.builder import build_dag

    # The other shards' asset-scheduled pipelines, as each last kept them: a loop of asset schedules
    # through specs of several shards is found like one within a shard (each refuses its own).
    records: dict[int, dict[Any, Any]] = {}
    if only is None and shard is not None:
        records = cache.shard_triggers(range(shard_count(len(mine or []) + len(others))))
    kept = records.pop(shard, {}) if shard is not None else {}
    result = compile_directory(directory, settings=settings, relative_to=directory.parent, only_pipeline=only,
                               files=mine, cache=cache,
                               other_triggers=_other_triggers(records, others) if records else None)
    if only is not None and only not in result.plans and others:
        # The spec is in another shard now (the folder crossed SINGLE_FILE_MAX since the run started):
        # the worker still finds it here.
        elsewhere = compile_directory(directory, settings=settings, relative_to=directory.parent, only_pipeline=only,
                                      files=[Path(path) for path in others], cache=cache)
        result.plans.update(elsewhere.plans)
        result.errors.update(elsewhere.errors)
        result.files.update(elsewhere.files)
        result.cache_keys.update(elsewhere.cache_keys)
        result.cached.update(elsewhere.cached)
    elif only is None:
        _drop_cross_shard_duplicates(result, mine or [], others, root, cache)
        if shard is not None and namespace.get("__file__"):
            known = _mark_changed_shards(cache, root, shard, len(mine or []) + len(others), str(namespace["__file__"]))
            if cache.record_triggers(shard, result.triggers, kept):
                # A loop through this shard's specs may have formed or ended: the shards that keep
                # asset-scheduled pipelines judge theirs again at their next parse, which comes first.
                _mark_modified(known, {other for other, record in records.items() if record}, str(namespace["__file__"]))
    if only is not None:
        here = str(namespace.get("__file__", ""))
        for dag_id in [d for d in result.plans if _REGISTERED_FOR_CONTEXT.setdefault(d, here) != here]:
            del result.plans[dag_id]
    airflow = airflow_fingerprint()
    for dag_id, plan in list(result.plans.items()):
        key = result.cache_keys.get(plan.spec_file)
        try:
            dag = cache.get_dag(key, plan, airflow) if key else None
            if dag is None:
                dag = build_dag(plan)
                if key:
                    cache.put_dag(key, dag, airflow)
            namespace[dag_id] = dag
        except Exception as err:  # the DAG file must not raise: that would drop every DAG
            del result.plans[dag_id]
            result.errors[plan.spec_file] = unexpected_failure(err, plan.spec_file, Path(plan.source_path),
                                                               directory.parent.resolve(), root)
    if only is None:
        cache.save()
        log.info("trainpipe: %d DAGs (%d plans from the cache), %d broken specs", len(result.plans),
                 len(result.cached & {p.spec_file for p in result.plans.values()}), len(result.errors))
    if result.errors:
        report_spec_errors({result.files.get(name, Path(name)): err for name, err in result.errors.items()},
                           configs_root=root)
    if only is None:
        try:
            _clear_stale_errors(result, root, errors_record(root, shard, settings))
        except Exception:  # the DAG file must not raise: an error left stale is only until the bundle refresh
            log.warning("trainpipe: the import errors of fixed or deleted specs were not cleared", exc_info=True)
    return result


def _bucket(shard: int | None) -> str:
    """A DAG file's name in the files it keeps: its shard, or "all" for a file compiling the whole folder."""
    return "all" if shard is None else f"shard{shard:02d}"


def errors_record(root: Path, shard: int | None, settings: Settings) -> Path:
    """Where the DAG file of ``shard`` keeps the spec files it reported as import errors (``_clear_stale_errors``):
    ``TRAINPIPE_HOME/cache/import-errors``, JSON, under no code fingerprint (an upgrade keeps it)."""
    folder = hashlib.sha256(str(root.resolve()).encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return settings.home / "cache" / "import-errors" / f"{folder}-{_bucket(shard)}.json"


def _clear_stale_errors(result: CompileResult, root: Path, memory: Path) -> None:
    """Clear the import errors of this DAG file's specs that are fixed or deleted (ADR 0004): a deleted file
    cannot be found but in ``memory``, the spec files this DAG file reported last time."""
    import json

    from trainpipe.dags.airflow_compat import clear_spec_errors, spec_location

    broken = {str(spec_location(result.files.get(name, Path(name)))) for name in result.errors}
    try:
        before = json.loads(memory.read_text("utf-8"))
        before = {p for p in before if isinstance(p, str)} if isinstance(before, list) else set()
    except (OSError, ValueError):
        before = set()
    compiled = {str(spec_location(path)) for path in result.files.values()}
    # Only files of this configs folder that this parse compiled or that are gone: a stale or edited
    # memory must not clear another file's error (a DAG file's, or a spec another shard reports).
    stale = {p for p in (before | compiled) - broken
             if Path(p).is_relative_to(root) and (p in compiled or not os.path.lexists(p))}
    clear_spec_errors((Path(p) for p in sorted(stale)), configs_root=root)
    if broken != before:
        try:
            if not broken:  # no file: a shard with no spec left returns early again (load_dags)
                memory.unlink(missing_ok=True)
            else:
                memory.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                temporary = memory.with_name(f".{memory.name}.{os.getpid()}")
                temporary.write_text(json.dumps(sorted(broken)), "utf-8")
                os.replace(temporary, memory)
        except OSError as err:
            log.warning("trainpipe: %s could not be written (%s); a spec deleted before the next parse keeps its "
                        "import error until the dag-processor's bundle refresh", memory, err)


def airflow_fingerprint() -> str:
    """What a built DAG depends on beyond the plan: Airflow's version and configuration (read once
    per process and environment, as ``dag_builder`` reads Airflow's defaults: each parse of the
    dag-processor is a new process, so a config change takes effect at the next parse, as it does
    without the cache). Reading the whole configuration costs about 5 ms: once per DAG file it was
    0.3 s of a 9.6 s cold parse of 1,000 specs, 64 files in one process."""
    environment = tuple(sorted(item for item in os.environ.items() if item[0].startswith("AIRFLOW")))
    fingerprint = _AIRFLOW_FINGERPRINTS.get(environment)
    if fingerprint is None:
        fingerprint = _AIRFLOW_FINGERPRINTS[environment] = _read_airflow_fingerprint()
    return fingerprint


# The Airflow environment variables (AIRFLOW_HOME, AIRFLOW_CONFIG, AIRFLOW__*) -> airflow_fingerprint().
_AIRFLOW_FINGERPRINTS: dict[tuple[tuple[str, str], ...], str] = {}


def _read_airflow_fingerprint() -> str:
    from importlib import metadata

    from airflow.sdk.configuration import conf

    config = conf.as_dict(display_source=False, display_sensitive=True, raw=True, include_env=True,
                          include_cmds=False, include_secret=False)
    digest = hashlib.sha256(f"{metadata.version('apache-airflow')}\0".encode())
    digest.update(repr(sorted((section, sorted(values.items())) for section, values in config.items())).encode())
    return digest.hexdigest()


def declared_pipeline_id(path: str) -> str | None:
    """The id a file's top-level ``pipeline_id:`` line names (the quick look of a task run), or None
    (no such line, unreadable, or a link: the file's own shard reports it)."""
    from trainpipe.compile.compiler import _PIPELINE_ID_LINE

    try:  # never through a link: a linked spec's own shard reads it, only when it points inside the folder
        with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW), "rb", buffering=0) as handle:
            head = handle.read(1 << 20)
    except OSError:
        return None
    match = _PIPELINE_ID_LINE.search(head.decode("utf-8", "replace"))
    return match.group(1) if match is not None else None


def _drop_cross_shard_duplicates(result: CompileResult, mine: list[Path], others: list[str], root: Path,
                                 cache: PlanCache) -> None:
    """A pipeline id this shard compiled that a file of another shard also declares is an error here,
    whatever their path order (that file's shard refuses its own the same way), as within one folder."""
    from trainpipe.compile.compiler import _display, _duplicate

    if not result.plans or not others:
        return
    ids = cache.declared_ids([*map(str, mine), *others], declared_pipeline_id)
    elsewhere: dict[str, list[str]] = {}
    for path in others:  # in path order
        if ids.get(path) is not None:
            elsewhere.setdefault(ids[path], []).append(path)
    for dag_id, plan in list(result.plans.items()):
        if dag_id not in elsewhere:
            continue
        del result.plans[dag_id]
        result.triggers.pop(dag_id, None)  # no DAG: it starts nothing
        names = ", ".join(_display(Path(other), root.parent) for other in elsewhere[dag_id])
        result.errors[plan.spec_file] = _duplicate(None, result.files[plan.spec_file], plan.spec_file, dag_id,
                                                   f"is also declared in {names}")


def _other_triggers(records: dict[int, dict[Any, Any]], others: list[str]) -> dict[str, Any]:
    """The other shards' asset-scheduled pipelines (``AssetTrigger`` by dag_id) whose spec files are still
    theirs: a record outlives a spec deleted or moved since (a shard left with no spec is not parsed)."""
    from trainpipe.compile.compiler import AssetTrigger

    present = set(others)
    return {dag_id: trigger for record in records.values() if isinstance(record, dict)
            for dag_id, trigger in record.items()
            if isinstance(dag_id, str) and isinstance(trigger, AssetTrigger) and trigger.source_path in present}


def _mark_changed_shards(cache: PlanCache, root: Path, shard: int, spec_count: int, dag_file: str) -> dict[int, str]:
    """Mark modified (``os.utime``) the DAG file of each other shard whose specs were added, changed
    or removed since the last look (``cache.changed_files``), so that a dag-processor with
    ``[dag_processor] file_parsing_sort_mode = modified_time`` parses that file next, instead of when
    its turn comes round again (ADR 0022; the watcher also asks for it). ``shard``/``dag_file``: the
    parsing DAG file, recorded as its shard's file. Only the time stamp changes, never the file. Best
    effort: a DAG file that cannot be touched (read-only) keeps its turn."""
    known = cache.dag_files()
    cache.record_dag_file(shard, dag_file, known)
    _mark_modified(known, _shards_of(cache.changed_files, root, spec_count) - {shard}, dag_file)
    return {**known, shard: dag_file}


def _shards_of(paths: list[str], root: Path, spec_count: int) -> set[int]:
    count = shard_count(spec_count)
    shards = set()
    for path in paths:
        try:
            shards.add(shard_of(Path(path).relative_to(root).as_posix(), count))
        except ValueError:
            continue
    return shards


def _mark_modified(known: dict, targets: set[int], dag_file: str | None = None) -> None:
    for target in sorted(targets):
        other = known.get(target)
        if not isinstance(other, str) or not other.endswith(".py") or other == dag_file:
            continue
        try:
            os.utime(other)
        except OSError as err:
            log.debug("trainpipe: could not mark %s modified (%s)", other, err)


def watch_specs(stop: threading.Event, every: float, settings: Settings) -> None:
    """The dag-processor's watcher (``trainpipe.dags.spec_watch``): every ``every`` seconds until
    ``stop``, look at the configs folder of ``[core] dags_folder`` (``TRAINPIPE_DAG_CONFIGS``, or the
    nearest ``dag_configs/``): a listing and a stat per spec against its own last look, and get the
    DAG files whose specs changed parsed first (``_ParseRequests``);
    every DAG file when a ``_defaults.yaml`` or the platform policy changed. A change is served only
    by a parse that began after it: until its shard records one, a parse of that file that ended
    without it (begun before the change, or the request dropped because the file was being parsed)
    gets the file asked for again. Never raises: a failed look is logged once and tried again."""
    from airflow.configuration import conf

    from trainpipe.compile.plan_cache import PlanCache

    root = specs_folder_for(str(Path(conf.get("core", "dags_folder")) / "trainpipe_dags.py"), None,
                            settings=settings).resolve()
    cache = PlanCache(root, "watch", home=settings.home)
    requests = _ParseRequests()
    log.info("trainpipe: watching the specs folder %s every %.0f s", root, every)
    # Airflow marks a DAG stale when its file's parse ends stale_dag_threshold after the last parse that
    # had it; the file of a deleted spec was likely parsed just before, so it is asked for once more then.
    stale_after = conf.getfloat("dag_processor", "stale_dag_threshold") + 2 * every
    again: dict[int, float] = {}  # shard -> when its file is asked for again (a spec of it deleted)
    waiting: dict[int, tuple[float, float]] = {}  # shard -> (changed at, last asked at), wall clock
    shared: dict[str, tuple[int, int, int, int]] | None = None
    seen: dict[str, tuple[int, int, int, int]] | None = None
    failed = False
    while not stop.wait(every):
        try:
            specs = list_specs(root)
            # Its own memory of the last look, not the index the shards share: a shard's parse that saw a
            # change first would otherwise hide it from the watcher (and from its requests).
            files = _signatures([path for _, path in specs])
            changed = [] if seen is None else [path for path, signature in files.items() if seen.get(path) != signature]
            changed += [path for path in seen or () if path not in files]
            seen = files
            policy = settings.policy_path
            now = _signatures([*defaults_files(root), *([policy] if policy else [])])
            every_shard = shared is not None and now != shared
            shared = now
            targets: set[int] = set()
            deleted: list[str] = []
            if changed or every_shard:
                targets = set(cache.dag_files()) if every_shard else _shards_of(changed, root, len(specs))
                deleted = [path for path in changed if path not in files]
                for target in _shards_of(deleted, root, len(specs)):
                    again[target] = time.monotonic() + stale_after
            due = {target for target, when in again.items() if when <= time.monotonic()}
            for target in due:
                del again[target]
            # A shard left without specs records no parse: its file is asked for, not waited on.
            occupied = _shards_of([path for _, path in specs], root, len(specs)) if deleted or due else None
            asked = time.time()
            for shard in targets | due:
                if occupied is None or shard in occupied:
                    waiting[shard] = (asked, asked)
            for shard, (changed_at, asked_at) in list(waiting.items()):
                last = cache.last_parse(shard)
                if last is not None and last[0] >= changed_at:
                    del waiting[shard]  # served
                elif last is not None and last[1] > asked_at:
                    targets.add(shard)  # a parse without the change ended after the file was asked for
                    waiting[shard] = (changed_at, asked)
            if targets or due:
                known = cache.dag_files()
                _mark_modified(known, targets | due)
                requests.ask(known, targets | due)
            failed = False
        except Exception as err:  # the dag-processor keeps parsing on its own schedule
            if not failed:
                log.warning("trainpipe: the specs folder watcher could not look at %s (%s: %s); trying again every "
                            "%.0f s", root, type(err).__name__, err, every)
            failed = True


class _ParseRequests:
    """Asks the dag-processor to parse DAG files first, as the UI's "Reparse" does: a row of Airflow's
    ``dag_priority_parsing_request`` table, which the dag-processor takes within a second and puts at the
    front of its queue even while it is busy (a modified time stamp only reorders files already queued).
    The watcher runs in the dag-processor, with its database; where that fails (logged once) the time
    stamps alone remain."""

    def __init__(self) -> None:
        self._bundles: list[tuple[str, Path]] | None = None
        self._failed = False

    def ask(self, known: dict, shards: set[int]) -> None:
        paths = [known[shard] for shard in sorted(shards) if isinstance(known.get(shard), str)]
        if not paths:
            return
        try:
            self._ask(paths)
            self._failed = False
        except Exception as err:
            if not self._failed:
                log.warning("trainpipe: could not ask the dag-processor to parse changed DAG files first (%s: %s); "
                            "they are marked modified only", type(err).__name__, err)
            self._failed = True

    def _ask(self, paths: list[str]) -> None:
        from airflow.models.dagbag import DagPriorityParsingRequest
        from airflow.utils.session import create_session
        from sqlalchemy import select

        if self._bundles is None:
            from airflow.dag_processing.bundles.manager import DagBundlesManager

            self._bundles = [(bundle.name, Path(bundle.path).resolve())
                             for bundle in DagBundlesManager().get_all_dag_bundles() if bundle.path is not None]
        wanted = set()
        for path in paths:
            resolved = Path(path).resolve()
            for name, folder in self._bundles:
                if resolved.is_relative_to(folder):
                    wanted.add((name, resolved.relative_to(folder).as_posix()))
                    break
        with create_session() as session:
            pending = set(session.execute(select(DagPriorityParsingRequest.bundle_name,
                                                 DagPriorityParsingRequest.relative_fileloc)).tuples())
            for name, relative in sorted(wanted - pending):
                session.add(DagPriorityParsingRequest(bundle_name=name, relative_fileloc=relative))


def _signatures(paths: list[str]) -> dict[str, tuple[int, int, int, int]]:
    found = {}
    for path in paths:
        try:
            info = os.stat(path)
        except OSError:
            continue
        found[path] = (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
    return found


@contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """Compiling or unpickling hundreds of DAGs allocates hundreds of thousands of containers, none of
    them garbage before the parse ends; the cyclic collector's sweeps over them cost a third of a warm parse
    (measured in benchmarks/parse_scale.py). Reference counting still frees everything else."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
