"""Compile every spec of a folder; one bad spec never hides the others.

``compile_directory`` is Airflow-free (used by ``trainpipe validate``/``render`` and tests);
``register_dags`` is what ``dags/trainpipe_dags.py`` calls.

Defaults: ``_defaults.yaml`` files are merged under each spec, the nearest folder's on top of its
parents' (precedence: spec file > nearest ``_defaults.yaml`` > ... > the configs root's).

Isolation: whatever goes wrong with one spec (bad input, a file over the loader's limits, an
unreadable file, a bug) becomes that file's own located error, and the rest of the folder compiles.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainpipe.errors import SpecError, SpecProblem
from trainpipe.plan import PipelinePlan, build_plan
from trainpipe.spec.loader import LoadedYaml, load_yaml_text, merge_defaults, read_spec_text
from trainpipe.spec.validate import validate_loaded

log = logging.getLogger(__name__)

DEFAULTS_FILE = "_defaults.yaml"
_PIPELINE_ID_LINE = re.compile(r"^pipeline_id:\s*['\"]?([A-Za-z][A-Za-z0-9_\-]*)", re.MULTILINE)


@dataclass(slots=True)
class CompileResult:
    plans: dict[str, PipelinePlan] = field(default_factory=dict)
    # Broken specs by display name (relative to the configs folder's parent).
    errors: dict[str, SpecError] = field(default_factory=dict)
    # Display name -> the file on disk.
    files: dict[str, Path] = field(default_factory=dict)


def spec_files(directory: Path) -> list[Path]:
    """``*.yaml``/``*.yml`` files, excluding ``_``-prefixed ones (defaults, drafts)."""
    files = [*directory.rglob("*.yaml"), *directory.rglob("*.yml")]
    return sorted(p for p in files if not p.name.startswith("_"))


def _display(path: Path, base: Path) -> str:
    """``path`` relative to ``base`` (both absolute and resolved) when inside it, else as it is."""
    return str(path.relative_to(base)) if path.is_relative_to(base) else str(path)


class _DefaultsCache:
    """Each ``_defaults.yaml`` is read once per compile, however many specs sit under it."""

    def __init__(self, root: Path, relative_to: Path | None) -> None:
        # Resolved once here, not per spec: path resolution is a system call per path component.
        self.root = root.resolve()
        self.base = (relative_to or Path.cwd()).resolve()
        self._loaded: dict[Path, LoadedYaml | None] = {}
        self._chains: dict[Path, list[LoadedYaml]] = {}

    def chain_for(self, spec_path: Path) -> list[LoadedYaml]:
        """Defaults from the configs root down to the spec's own folder (nearest last). ``spec_path``
        is resolved, or found under the resolved root by ``compile_directory``."""
        folder = spec_path.parent
        chain = self._chains.get(folder)
        if chain is None:
            folders = []
            current = folder
            while current.is_relative_to(self.root):
                folders.append(current)
                if current == self.root:
                    break
                current = current.parent
            chain = [d for d in (self._load(f / DEFAULTS_FILE) for f in reversed(folders)) if d is not None]
            self._chains[folder] = chain
        return chain

    def _load(self, path: Path) -> LoadedYaml | None:
        if path not in self._loaded:
            name = _display(path, self.base)
            try:
                text = read_spec_text(path, name)
            except FileNotFoundError:
                self._loaded[path] = None
            else:
                self._loaded[path] = load_yaml_text(text, name)
        return self._loaded[path]


def configs_root_for(spec_path: Path) -> Path:
    """The configs root whose ``_defaults.yaml`` files apply to a spec compiled on its own
    (``trainpipe render/train/validate FILE``), so it gets the same defaults as its DAG:
    ``TRAINPIPE_DAG_CONFIGS`` when the file is inside it, else the nearest enclosing folder named
    ``dag_configs``, else the file's own folder."""
    spec_path = spec_path.resolve()
    configured = os.environ.get("TRAINPIPE_DAG_CONFIGS")
    if configured and spec_path.is_relative_to(Path(configured).resolve()):
        return Path(configured).resolve()
    return next((folder for folder in spec_path.parents if folder.name == "dag_configs"), spec_path.parent)


def compile_file(path: Path, display_name: str | None = None, *, configs_root: Path | None = None,
                 defaults: _DefaultsCache | None = None) -> PipelinePlan:
    """Load, merge defaults, validate and plan one spec; raises ``SpecError`` with every problem (an
    unexpected exception too, as ``compile_directory`` reports it); ``OSError`` when unreadable."""
    try:
        return _compile(path, display_name, configs_root=configs_root, defaults=defaults)[1]
    except (SpecError, OSError):
        raise
    except Exception as err:
        raise unexpected_failure(err, display_name or str(path), path, Path.cwd(), path.parent) from err


def _compile(path: Path, display_name: str | None, *, configs_root: Path | None,
             defaults: _DefaultsCache | None, text: str | None = None) -> tuple[LoadedYaml, PipelinePlan]:
    name = display_name or str(path)
    if text is None:
        text = read_spec_text(path, name)
    loaded = load_yaml_text(text, name)
    where = path
    if defaults is None:
        where = path.resolve()
        defaults = _DefaultsCache(configs_root or configs_root_for(where), None)
    for layer in reversed(defaults.chain_for(where)):
        loaded = merge_defaults(layer, loaded)
    spec = validate_loaded(loaded)
    # Relative to the configs root, so lineage reads the same on every machine that deploys the folder.
    relative = where.relative_to(defaults.root).as_posix() if where.is_relative_to(defaults.root) else where.name
    return loaded, build_plan(spec, spec_file=name, spec_text=text, source_path=str(path),
                              spec_relative_path=relative, loaded=loaded)


def compile_directory(directory: Path, *, relative_to: Path | None = None, only_pipeline: str | None = None) -> CompileResult:
    """Compile every spec under ``directory``. With ``only_pipeline``, compile just the file(s) whose
    ``pipeline_id`` line names it (a task run needs its own DAG only)."""
    result = CompileResult()
    owners: dict[str, str] = {}
    defaults = _DefaultsCache(directory, relative_to)
    for path in spec_files(defaults.root):
        name = _display(path, defaults.base)
        result.files[name] = path
        try:
            compiled = _compile_in_folder(path, name, defaults, only_pipeline)
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
        if plan.dag_id in owners:
            result.errors[name] = SpecError([loaded.problem(
                ("pipeline_id",),
                f"{plan.dag_id!r} is already defined in {owners[plan.dag_id]}; pipeline ids must be unique, rename one")])
            continue
        owners[plan.dag_id] = name
        result.plans[plan.dag_id] = plan
    return result


def _compile_in_folder(path: Path, name: str, defaults: _DefaultsCache,
                       only_pipeline: str | None) -> tuple[LoadedYaml, PipelinePlan] | None:
    """One spec of ``compile_directory``; None when the quick look says it is another pipeline's."""
    text = None
    if only_pipeline is not None:
        # A cheap look at the top-level `pipeline_id:` line; a file where it finds none is compiled
        # (one that cannot be decoded is reported).
        text = read_spec_text(path, name)
        match = _PIPELINE_ID_LINE.search(text)
        if match is not None and match.group(1) != only_pipeline:
            return None
    return _compile(path, name, configs_root=None, defaults=defaults, text=text)


def unexpected_failure(err: Exception, name: str, spec_path: Path, base: Path, root: Path) -> SpecError:
    """A located error for an exception trainpipe did not expect while handling spec ``name``: its
    type and message, with no traceback (that goes to the log) and paths shown relative to ``base``
    (the folder names are shown relative to) or the configs ``root``, never as paths of this machine."""
    log.error("trainpipe: %s could not be compiled", name, exc_info=err)
    detail = str(err).replace(str(spec_path), name)
    for folder in (str(base), str(root)):
        detail = detail.replace(folder + os.sep, "").replace(folder, ".")
    return SpecError([SpecProblem(name, 1, 1, "", (
        f"trainpipe could not compile this file ({type(err).__name__}: {detail}); this is a trainpipe bug: "
        "please report it with the file (the traceback is in the log)"))])


def register_dags(namespace: dict[str, Any], directory: Path) -> CompileResult:
    """Build one DAG per valid spec into ``namespace`` (a DAG file's globals); each broken spec is
    reported to Airflow as an import error of that spec file (``trainpipe.airflow_compat``)."""
    from airflow.sdk import get_parsing_context

    from trainpipe.airflow_compat import report_spec_errors
    from trainpipe.dag_builder import build_dag

    only = get_parsing_context().dag_id  # set when a worker parses the file to run one task
    result = compile_directory(directory, relative_to=directory.parent, only_pipeline=only)
    for dag_id, plan in list(result.plans.items()):
        try:
            namespace[dag_id] = build_dag(plan)
        except Exception as err:  # the DAG file must not raise: that would drop every DAG
            del result.plans[dag_id]
            result.errors[plan.spec_file] = unexpected_failure(err, plan.spec_file, Path(plan.source_path),
                                                               directory.parent.resolve(), directory.resolve())
    if result.errors:
        report_spec_errors({result.files.get(name, Path(name)): err for name, err in result.errors.items()})
    return result
