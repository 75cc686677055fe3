"""Compile every spec of a folder; one bad spec never hides the others.

The compiler, Airflow-free: ``compile_directory`` is used by the DAG files (through
``trainpipe.dags.files``, with the compiled-plan cache), by ``trainpipe validate``/``render`` and by tests.

Defaults: ``_defaults.yaml`` files are merged under each spec, the nearest folder's on top of its
parents' (precedence: spec file > nearest ``_defaults.yaml`` > ... > the configs root's).

Isolation: whatever goes wrong with one spec (bad input, a file over the loader's limits, an
unreadable file, a bug) becomes that file's own located error, and the rest of the folder compiles.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainpipe.compile.spec_files import DEFAULTS_FILE, list_specs
from trainpipe.errors import MissingExtraError, SpecError, SpecFieldError, SpecProblem, first_hidden_character
from trainpipe.plan.build import build_plan
from trainpipe.plan.model import AssetSchedule, PipelinePlan, asset_key
from trainpipe.settings import POLICY_ENV, Settings
from trainpipe.spec.loader import (
    LINK_OUT_OF_FOLDER,
    LoadedYaml,
    format_path,
    load_yaml_text,
    merge_defaults,
    read_spec_text,
)

if TYPE_CHECKING:
    from trainpipe.compile.plan_cache import PlanCache
    from trainpipe.policy.model import Policy

log = logging.getLogger(__name__)

_PIPELINE_ID_LINE = re.compile(r"^pipeline_id:\s*['\"]?([A-Za-z][A-Za-z0-9_\-]*)", re.MULTILINE)


@dataclass(slots=True)
class CompileResult:
    plans: dict[str, PipelinePlan] = field(default_factory=dict)
    # Broken specs by display name (relative to the configs folder's parent).
    errors: dict[str, SpecError] = field(default_factory=dict)
    # Display name -> the file on disk.
    files: dict[str, Path] = field(default_factory=dict)
    # Display name -> plan cache key, for the specs compiled with a cache.
    cache_keys: dict[str, str] = field(default_factory=dict)
    # Display names whose plan came from the cache.
    cached: set[str] = field(default_factory=set)
    # dag_id -> what its asset schedule needs, of every asset-scheduled plan this compile made, loop or not:
    # what a DAG file keeps for the other shards' loop check (``AssetTrigger``).
    triggers: dict[str, AssetTrigger] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AssetTrigger:
    """An asset-scheduled pipeline as the loop check sees it: its spec (display name and file), the
    asset keys (``asset_key``) its runs update, and the asset URIs its schedule waits for as written,
    ``any`` or ``all``."""

    spec_file: str
    source_path: str
    produces: frozenset[tuple[str, str, str]]
    mode: str
    waits_for: tuple[str, ...]

    @classmethod
    def of(cls, plan: PipelinePlan) -> AssetTrigger | None:
        if not isinstance(plan.schedule, AssetSchedule):
            return None
        return cls(plan.spec_file, plan.source_path, frozenset(asset_key(uri) for task in plan.tasks for uri in task.outlets),
                   plan.schedule.mode, plan.schedule.uris)


def spec_files(directory: Path) -> list[Path]:
    """``*.yaml``/``*.yml`` files, excluding ``_``-prefixed ones (defaults, drafts), in path order."""
    return [Path(path) for _, path in list_specs(directory)]


def _display(path: Path, base: Path) -> str:
    """``path`` relative to ``base`` (both absolute and resolved) when inside it, else as it is."""
    return str(path.relative_to(base)) if path.is_relative_to(base) else str(path)


class PolicyInForce:
    """The platform policy (``TRAINPIPE_POLICY``) for one compile: its text is read once, and
    validated only when a spec is compiled (a parse whose plans all come from the cache needs its
    digest alone, in ``cache_part``: a plan is never served under another policy, or none)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.path = settings.policy_path
        self.storage_root = settings.storage_root
        self.fault_injection = settings.fault_injection
        self.text: str | None = None
        self.error: SpecError | None = None
        self._policy: Policy | None = None
        if self.path is not None:
            from trainpipe.policy.model import PolicyError, read_policy_text

            try:
                self.text = read_policy_text(self.path)
            except PolicyError as err:
                self.error = err
        digest = hashlib.sha256(self.text.encode("utf-8", "surrogateescape")).hexdigest() if self.text else "-"
        # Relative data URIs are judged against the storage root, and fault injection by the switch.
        self.cache_part = f"policy={digest}\0root={self.storage_root}\0faults={int(self.fault_injection)}"

    def refuse_inside(self, configs_root: Path) -> None:
        """A policy inside the specs folder could be edited by the spec authors it governs: refused."""
        if self.path is None or self.error is not None or not self.path.resolve().is_relative_to(configs_root):
            return
        from trainpipe.policy.model import PolicyError

        self.error = PolicyError([SpecProblem(self.path.name, None, None, "", (
            f"the policy named by {POLICY_ENV} is inside the specs folder, where spec authors can change it; the "
            "platform must keep it outside (e.g. deploy/policy.yaml)"))])

    def get(self) -> Policy | None:
        """The valid policy, or None without one; ``PolicyError`` when it is broken."""
        if self.error is not None:
            raise self.error
        if self.path is None:
            return None
        if self._policy is None:
            from trainpipe.policy.model import PolicyError, load_policy

            try:
                self._policy = load_policy(self.path, self.text)
            except PolicyError as err:
                self.error = err
                raise
        return self._policy

    def refusal(self, name: str) -> SpecError:
        """The error of every spec while the policy is broken (fail closed)."""
        return SpecError([SpecProblem(name, 1, 1, "", (
            f"refused: the platform policy ({POLICY_ENV}) is invalid, so no spec is compiled until the platform "
            "fixes it; its problems:")), *(self.error.problems if self.error is not None else [])])


class _DefaultsCache:
    """Each ``_defaults.yaml`` is read once per compile, however many specs sit under it."""

    def __init__(self, root: Path, relative_to: Path | None, policy: PolicyInForce) -> None:
        # Resolved once here, not per spec: path resolution is a system call per path component.
        self.root = root.resolve()
        self.base = (relative_to or Path.cwd()).resolve()
        self.policy = policy
        # Teams' folders are relative to the specs root, also when a subfolder of it is compiled.
        self.team_root = configs_root_for(self.root / "_", policy.settings)
        self.policy.refuse_inside(self.team_root)
        self._loaded: dict[Path, LoadedYaml | None] = {}
        self._texts: dict[Path, tuple[str, str] | None] = {}
        self._chains: dict[Path, list[LoadedYaml]] = {}
        self._chain_texts: dict[Path, list[tuple[str, str]]] = {}

    def _files_for(self, spec_path: Path) -> list[Path]:
        """The possible ``_defaults.yaml`` files of a spec, from the configs root down."""
        folders = []
        current = spec_path.parent
        while current.is_relative_to(self.root):
            folders.append(current)
            if current == self.root:
                break
            current = current.parent
        return [f / DEFAULTS_FILE for f in reversed(folders)]

    def chain_for(self, spec_path: Path) -> list[LoadedYaml]:
        """Defaults from the configs root down to the spec's own folder (nearest last). ``spec_path``
        is resolved, or found under the resolved root by ``compile_directory``."""
        folder = spec_path.parent
        chain = self._chains.get(folder)
        if chain is None:
            chain = [d for d in (self._load(f) for f in self._files_for(spec_path)) if d is not None]
            self._chains[folder] = chain
        return chain

    def files_for(self, spec_path: Path) -> list[tuple[Path, str]]:
        """(path, display name) of each defaults file of the chain that exists, root first."""
        return [(f, named[0]) for f in self._files_for(spec_path) if (named := self._text(f)) is not None]

    def texts_for(self, spec_path: Path) -> list[tuple[str, str]]:
        """(display name, text) of each defaults file of the chain, root first: the cache key's part.
        Only read, not parsed: a cache hit never parses them."""
        folder = spec_path.parent
        texts = self._chain_texts.get(folder)
        if texts is None:
            texts = [t for t in (self._text(f) for f in self._files_for(spec_path)) if t is not None]
            self._chain_texts[folder] = texts
        return texts

    def _text(self, path: Path) -> tuple[str, str] | None:
        if path not in self._texts:
            name = _display(path, self.base)
            try:
                self._texts[path] = (name, read_spec_text(path, name, inside=self.root))
            except FileNotFoundError:
                self._texts[path] = None
        return self._texts[path]

    def _load(self, path: Path) -> LoadedYaml | None:
        if path not in self._loaded:
            named = self._text(path)
            self._loaded[path] = None if named is None else load_yaml_text(named[1], named[0])
        return self._loaded[path]


def configs_root_for(spec_path: Path, settings: Settings, *, as_named: bool = False) -> Path:
    """The configs root whose ``_defaults.yaml`` files apply to a spec compiled on its own
    (``trainpipe render/train/validate FILE``), so it gets the same defaults as its DAG:
    the settings' specs folder (``TRAINPIPE_DAG_CONFIGS``) when the file is inside it, else the nearest enclosing folder named
    ``dag_configs``, else the file's own folder. ``as_named``: judged by the path the spec was named with,
    not where its links lead (the folder as the user sees it, resolved), so a file reached through a
    linked folder is outside the root."""
    from trainpipe.compile.spec_files import SPECS_FOLDER_NAME

    spec_path = Path(os.path.abspath(spec_path)) if as_named else spec_path.resolve()
    configured = settings.specs_folder
    if configured is not None and spec_path.is_relative_to(os.path.abspath(configured) if as_named
                                                           else configured.resolve()):
        return configured.resolve()
    folder = next((folder for folder in spec_path.parents if folder.name == SPECS_FOLDER_NAME), spec_path.parent)
    return folder.resolve() if as_named else folder


def compile_file(path: Path, display_name: str | None = None, *, settings: Settings, configs_root: Path | None = None,
                 defaults: _DefaultsCache | None = None) -> PipelinePlan:
    """Load, merge defaults, validate and plan one spec; raises ``SpecError`` with every problem (an
    unexpected exception too, as ``compile_directory`` reports it); ``OSError`` when unreadable.
    ``settings``: the platform's (policy, storage root, fault injection, specs folder)."""
    try:
        return _compile(path, display_name, configs_root=configs_root, defaults=defaults, settings=settings)[1]
    except (SpecError, OSError):
        raise
    except Exception as err:
        raise unexpected_failure(err, display_name or str(path), path, Path.cwd(), path.parent) from err


def _compile(path: Path, display_name: str | None, *, configs_root: Path | None,
             defaults: _DefaultsCache | None, settings: Settings, text: str | None = None) -> tuple[LoadedYaml, PipelinePlan]:
    name = display_name or str(path)
    if text is None:
        # A link is judged where it lies (its folder's specs root), not where it points.
        if defaults is not None:
            folder = defaults.root  # a folder's specs: list_specs walks no linked folder
        else:
            folder = (configs_root.resolve() if configs_root is not None
                      else configs_root_for(path, settings, as_named=True))
            # A file named on the command line (a CI glob: dag_configs/*/*.yaml) may lie in a linked folder.
            if not Path(os.path.realpath(path)).is_relative_to(folder):
                raise SpecError([SpecProblem(name, 1, 1, "", LINK_OUT_OF_FOLDER)])
        text = read_spec_text(path, name, inside=folder)
    loaded = load_yaml_text(text, name)
    where = path
    if defaults is None:
        where = path.resolve()
        defaults = _DefaultsCache(configs_root or configs_root_for(where, settings), None, PolicyInForce(settings))
    for layer in reversed(defaults.chain_for(where)):
        loaded = merge_defaults(layer, loaded)
    # Here, not at the top: a parse whose plans all come from the cache never imports the validator
    # and the spec models (0.1 s of pydantic, the bulk of a warm parse of a small shard).
    from trainpipe.spec.validate import validate_loaded

    spec = validate_loaded(loaded)
    inside = where.is_relative_to(defaults.root)
    # Relative to the configs root, so lineage reads the same on every machine that deploys the folder.
    relative = where.relative_to(defaults.root).as_posix() if inside else where.name
    in_specs_root = where.is_relative_to(defaults.team_root)
    chain = [(file.relative_to(defaults.team_root).as_posix(), shown) for file, shown in defaults.files_for(where)
             if file.is_relative_to(defaults.team_root)]
    team = _judge(spec, loaded, name, where.relative_to(defaults.team_root).as_posix() if in_specs_root else None,
                  defaults.policy, chain)
    return loaded, build_plan(spec, spec_file=name, spec_text=text, source_path=str(path),
                              spec_relative_path=relative, loaded=loaded, team=team)


def _judge(spec: Any, loaded: LoadedYaml, name: str, relative: str | None, state: PolicyInForce,
           chain: list[tuple[str, str]] | None = None) -> Any:
    """The spec against the platform policy: its team's plan data, or ``SpecError`` with every
    violation (``trainpipe.policy.check``). Without a policy: None, after the checks that hold without one.
    ``chain``: (path relative to the specs root, display name) of each ``_defaults.yaml`` merged under it."""
    from trainpipe.policy.check import check_spec, team_plan
    from trainpipe.policy.model import PolicyError

    try:
        policy = state.get()
    except PolicyError:
        raise state.refusal(name) from None
    team = None
    if policy is not None:
        team, why = policy.team_for(relative)
        if team is None:
            raise SpecError([loaded.problem((), why)])
    problems = check_spec(spec, loaded, policy=policy, team=team, storage_root=state.storage_root,
                          fault_injection=state.fault_injection)
    if policy is not None and team is not None:
        problems += [SpecProblem(shown, 1, 1, "", refusal) for path, shown in chain or []
                     if (refusal := policy.defaults_problem(path, team)) is not None]
    if problems:
        problems.sort(key=lambda p: (p.file != loaded.file, p.file, p.line or 0, p.column or 0))
        raise SpecError(problems)
    return team_plan(policy, team) if policy is not None and team is not None else None


def compile_directory(directory: Path, *, settings: Settings, relative_to: Path | None = None,
                      only_pipeline: str | None = None, files: list[Path] | None = None, cache: PlanCache | None = None,
                      other_triggers: Mapping[str, AssetTrigger] | None = None) -> CompileResult:
    """Compile every spec under ``directory``, or only ``files`` (found under it, in path order: a
    shard's). With ``only_pipeline``, compile just the file(s) whose ``pipeline_id`` line names it (a
    task run needs its own DAG only). With ``cache``, a spec whose key is there is not compiled again.
    ``settings``: the platform's (policy, storage root, fault injection, specs folder).
    ``other_triggers``: the asset-scheduled pipelines of the folder's other shards, for the loop check."""
    result = CompileResult()
    owners: dict[str, list[tuple[str, LoadedYaml | None, Path]]] = {}
    defaults = _DefaultsCache(directory, relative_to, PolicyInForce(settings))
    for path in spec_files(defaults.root) if files is None else files:
        name = _display(path, defaults.base)
        hidden = first_hidden_character(name)
        if hidden is not None:
            # Never printed as it is: a newline in a file name wrote a forged "file:line: ..." error of
            # another team's spec into the import errors and CI logs.
            name = name.encode("unicode_escape").decode("ascii")
            result.files[name] = path
            result.errors[name] = SpecError([SpecProblem(name, 1, 1, "", (
                f"the file name contains the invisible or control character U+{ord(hidden):04X} (shown escaped); "
                "rename the file"))])
            continue
        result.files[name] = path
        try:
            compiled = _compile_in_folder(path, name, defaults, only_pipeline, cache, result)
        except SpecError as err:
            result.errors[name] = err
            continue
        except OSError as err:  # its message would hold the absolute path: only the reason is shown
            result.errors[name] = SpecError([SpecProblem(
                name, 1, 1, "", f"cannot read the file: {err.strerror or type(err).__name__}; check it exists and is readable")])
            continue
        except Exception as err:  # a bug met by this one file must not cost the other pipelines their DAGs
            result.errors[name] = unexpected_failure(err, name, path, defaults.base, defaults.root)
            continue
        if compiled is None:
            continue
        loaded, plan = compiled
        owners.setdefault(plan.dag_id, []).append((name, loaded, path))
        result.plans.setdefault(plan.dag_id, plan)
    for dag_id, declaring in owners.items():
        if len(declaring) < 2:
            continue
        # No file wins by its path: every file declaring the id is refused (ADR 0014).
        del result.plans[dag_id]
        for name, loaded, path in declaring:
            others = ", ".join(other for other, _, _ in declaring if other != name)
            result.errors[name] = _duplicate(loaded, path, name, dag_id, f"is also declared in {others}")
    result.triggers = {dag_id: trigger for dag_id, plan in result.plans.items()
                       if (trigger := AssetTrigger.of(plan)) is not None}
    _refuse_trigger_loops(result, {dag_id: declaring[0] for dag_id, declaring in owners.items()}, other_triggers or {})
    return result


def _trigger_loop(triggers: Mapping[str, AssetTrigger], producers: Mapping[tuple[str, str, str], str]) -> set[str]:
    """The pipelines of ``triggers`` that start each other without end: the largest set in which each one
    is started by the set (``any``: one of its assets comes from the set; ``all``: every one does) and
    starts one of the set. ``producers``: the pipeline that updates each asset key."""
    sources = {dag_id: [producers.get(asset_key(uri)) for uri in trigger.waits_for] for dag_id, trigger in triggers.items()}
    loop = set(triggers)
    while True:
        starting = {source for dag_id in loop for source in sources[dag_id]}
        kept = {dag_id for dag_id in loop if dag_id in starting
                and (any if triggers[dag_id].mode == "any" else all)(source in loop for source in sources[dag_id])}
        if kept == loop:
            return loop
        loop = kept


def _refuse_trigger_loops(result: CompileResult, declared: dict[str, tuple[str, LoadedYaml | None, Path]],
                          other_triggers: Mapping[str, AssetTrigger]) -> None:
    """Refuse every pipeline of this compile in a loop of asset schedules (A on B's model, B on A's): one
    run would start the next without end, beyond any limits.min_schedule_interval. A spec on its own
    assets is refused by the policy check already; this finds loops through several specs, of this
    compile and of ``other_triggers`` (the other shards', as they last kept them: each shard refuses its
    own). Like duplicate ids, no file wins by its path: each spec of the loop is refused."""
    triggers = {**other_triggers, **result.triggers}  # this compile's own over another shard's older record
    producers = {key: dag_id for dag_id, trigger in triggers.items() for key in trigger.produces}
    loop = _trigger_loop(triggers, producers)
    own = sorted(loop & result.triggers.keys())
    if not own:
        return
    members = ", ".join(f"{dag_id} ({triggers[dag_id].spec_file})" for dag_id in sorted(loop))
    for dag_id in own:
        name, loaded, path = declared[dag_id]
        if loaded is None:  # the plan came from the cache: the YAML is read again to locate the error
            loaded = load_yaml_text(read_spec_text(path, name), name)
        del result.plans[dag_id]
        result.errors[name] = SpecError([loaded.problem(("schedule", "assets", index), (
            f"{uri!r} is updated by pipeline {producers[asset_key(uri)]!r}, and these pipelines start each other "
            f"without end: {members}; schedule one of them by cron, or on an asset from outside the loop"))
            for index, uri in enumerate(triggers[dag_id].waits_for) if producers.get(asset_key(uri)) in loop])


def _compile_in_folder(path: Path, name: str, defaults: _DefaultsCache, only_pipeline: str | None,
                       cache: PlanCache | None, result: CompileResult) -> tuple[LoadedYaml | None, PipelinePlan] | None:
    """One spec of ``compile_directory``; None when the quick look says it is another pipeline's.
    The ``LoadedYaml`` is None for a plan from the cache (it is only needed to locate an error)."""
    text = None
    if only_pipeline is not None or cache is not None:
        text = read_spec_text(path, name, inside=defaults.root)
        # A cheap look at the top-level `pipeline_id:` line; a file where it finds none is compiled
        # (one that cannot be decoded is reported).
        match = _PIPELINE_ID_LINE.search(text) if only_pipeline is not None else None
        if match is not None and match.group(1) != only_pipeline:
            return None
    if defaults.policy.error is not None:
        raise defaults.policy.refusal(name)
    if cache is None or text is None:  # text is None only without a cache
        return _compile(path, name, configs_root=None, defaults=defaults, settings=defaults.policy.settings, text=text)
    from trainpipe.compile.plan_cache import entry_key

    key = entry_key(name, str(path), text, defaults.texts_for(path), context=defaults.policy.cache_part)
    result.cache_keys[name] = key
    plan = cache.get(key, display_name=name, spec_text=text)
    if plan is not None:
        result.cached.add(name)
        return None, plan
    loaded, plan = _compile(path, name, configs_root=None, defaults=defaults, settings=defaults.policy.settings,
                            text=text)
    cache.put(key, plan)
    return loaded, plan


def _duplicate(loaded: LoadedYaml | None, path: Path, name: str, dag_id: str, where: str) -> SpecError:
    if loaded is None:  # the plan came from the cache: the YAML is read again to locate the error
        loaded = load_yaml_text(read_spec_text(path, name), name)
    return SpecError([loaded.problem(("pipeline_id",), (
        f"{dag_id!r} {where}; pipeline ids must be unique and no file wins by its path, so neither DAG is "
        "loaded: rename one"))])


def unexpected_failure(err: Exception, name: str, spec_path: Path, base: Path, root: Path) -> SpecError:
    """A located error for an exception trainpipe did not expect while handling spec ``name``: its
    type and message, with no traceback (that goes to the log) and paths shown relative to ``base``
    (the folder names are shown relative to) or the configs ``root``, never as paths of this machine."""
    # The platform's install, or a value only Airflow judges: not a bug, so no traceback, located at the field.
    if isinstance(err, MissingExtraError | SpecFieldError):
        try:
            return SpecError([load_yaml_text(read_spec_text(spec_path, name), name).problem(err.field_path, str(err))])
        except (OSError, SpecError):
            return SpecError([SpecProblem(name, 1, 1, format_path(err.field_path), str(err))])
    log.error("trainpipe: %s could not be compiled", name, exc_info=err)
    detail = str(err).replace(str(spec_path), name)
    for folder in (str(base), str(root)):
        detail = detail.replace(folder + os.sep, "").replace(folder, ".")
    return SpecError([SpecProblem(name, 1, 1, "", (
        f"trainpipe could not compile this file ({type(err).__name__}: {detail}); this is a trainpipe bug: "
        "please report it with the file (the traceback is in the log)"))])


def compile_text(text: str, spec_relative_path: str, *, configs_root: Path, settings: Settings) -> PipelinePlan:
    """A spec's text compiled as if it were the file ``configs_root/spec_relative_path``: the
    ``_defaults.yaml`` files on that path apply. The file itself need not exist (``trainpipe
    reproduce`` compiles the text logged with a training run)."""
    return _compile(configs_root / spec_relative_path, spec_relative_path, configs_root=configs_root, defaults=None,
                    settings=settings, text=text)[1]
