"""The compiled-plan cache: a spec whose text and defaults chain are unchanged is not compiled again
(ADR 0012).

An entry's key is a sha256 of what the plan is made from: the spec's text, the text of each
``_defaults.yaml`` in its chain, its display name and its path, and the platform policy in force
(its text's digest, the storage root and the fault-injection switch): a plan compiled under one
policy, or none, is never served under another (ADR 0014). The cache is a folder per
*code fingerprint* (trainpipe's version and a hash of every source file of the ``trainpipe``
package and of the trainer's config module, plus the versions of the libraries that validate), so
an entry is never read by other code: editing ``plan/`` without bumping the version is a new
folder. With the plan the cache keeps the Airflow DAG built from it, under a second fingerprint
that adds Airflow's version and its whole configuration (an operator's defaults come from there).

Each DAG file (shard) keeps one bundle ``<configs folder hash>-<shard>.pickle``: read once per
parse, rewritten (atomically: a temporary file, then ``os.replace``) only when an entry was missing
or is no longer used, so it holds exactly the shard's current specs and never grows. Several
processes may parse at once; the last writer wins and a lost entry is only a miss.

Entries are pickles, so the folder is as trusted as the code: it lives under ``TRAINPIPE_HOME``,
is created private (0700), and a bundle is read only when it is a regular file of this user that
nobody else can write, whose header names this code fingerprint. Anything else (corrupt, truncated,
foreign, another version's) is ignored and recompiled, never fatal; a hit is checked against the
spec it claims to be (file name, text hash, DAG id) before use.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import logging
import os
import pickle
import stat
import sys
import tempfile
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from trainpipe.plan.model import PipelinePlan

# (display name, sha256 of the spec text, Airflow fingerprint or "", payload): the payload is the pickled
# plan, or the pickled (plan, DAG) when the fingerprint is set, or None until ``save`` pickles the plan.
# One pickle for both because the DAG's operators hold the plan: it is unpickled once, not twice.
_Entry = tuple[str, str, str, bytes | None]

log = logging.getLogger(__name__)

_MAGIC = b"trainpipe-plan-cache\n"
# Fingerprint folders nobody has written for this long are removed (other versions' leftovers).
_STALE_FOLDER_SECONDS = 7 * 24 * 3600
_LIBRARIES = ("pydantic", "pydantic-core", "PyYAML", "croniter")
# The trainpipe package's folder (not through ``import trainpipe``: its root holds the DAG files' entry point).
_PACKAGE = Path(__file__).resolve().parent.parent


def _package_sources() -> list[Path]:
    import trainpipe_trainer.config

    package = _PACKAGE
    files = sorted(p for p in package.rglob("*") if p.suffix in (".py", ".json") and "__pycache__" not in p.parts)
    config = Path(trainpipe_trainer.config.__file__).resolve()
    # Spec validation also runs the built-in families' params checks; found by path, not imported, at parse time.
    return [*files, config, *(config.parent / "models" / family / "params.py" for family in ("text_bag", "transformer"))]


@functools.cache
def code_fingerprint() -> str:
    """The Python and library versions and a hash of every trainpipe source (``__version__`` is one
    of them): any code change gives a new fingerprint, bumped version or not."""
    digest = hashlib.sha256()
    digest.update(f"{sys.version}\0".encode())
    for name in _LIBRARIES:
        try:
            digest.update(f"{name}={metadata.version(name)}\0".encode())
        except metadata.PackageNotFoundError:
            digest.update(f"{name}=-\0".encode())
    package = _PACKAGE
    for path in _package_sources():
        digest.update(str(path.relative_to(package) if path.is_relative_to(package) else path.name).encode())
        digest.update(b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def entry_key(display_name: str, source_path: str, spec_text: str, defaults: list[tuple[str, str]], *,
              context: str = "") -> str:
    """The key of one spec: everything its plan is made from (``defaults``: each ``_defaults.yaml``
    of its chain as (display name, text), root first; ``context``: the platform policy's digest and
    what judging under it depends on, ``factory.PolicyInForce.cache_part``)."""
    digest = hashlib.sha256()
    for part in (display_name, source_path, spec_text, *(x for pair in defaults for x in pair), context):
        encoded = part.encode("utf-8", "surrogateescape")
        digest.update(len(encoded).to_bytes(8, "big") + encoded)
    return digest.hexdigest()


def _unpickle(stored: object, display_name: str, spec_sha256: str) -> tuple[PipelinePlan, Any] | None:
    """(plan, DAG or None) of a stored entry, or None unless it is the plan of this very spec."""
    if not (isinstance(stored, tuple) and len(stored) == 4 and stored[:2] == (display_name, spec_sha256)):
        return None
    try:
        loaded = pickle.loads(stored[3])
        plan, dag = loaded if stored[2] else (loaded, None)
    except Exception as err:
        log.warning("trainpipe: ignoring a corrupt plan cache entry for %s (%s)", display_name, type(err).__name__)
        return None
    if not (isinstance(plan, PipelinePlan) and plan.spec_file == display_name and plan.spec_sha256 == spec_sha256):
        return None
    return plan, dag


class PlanCache:
    """One bundle of entries (a shard's specs); ``load`` once, ``get``/``put`` per spec, ``save`` once."""

    def __init__(self, configs_root: Path, bucket: str, *, home: Path) -> None:
        """``home``: the settings' ``TRAINPIPE_HOME``; the bundles lie under its ``cache/plans``."""
        self.fingerprint = code_fingerprint()
        base = home / "cache" / "plans"
        self.folder = base / self.fingerprint[:32]
        root_id = hashlib.sha256(str(configs_root.resolve()).encode("utf-8", "surrogateescape")).hexdigest()[:16]
        self.path = self.folder / f"{root_id}-{bucket}.pickle"
        # The pipeline id each spec file of the folder declares, by path and file signature: shared by
        # every shard of the folder (each needs the others' ids to refuse a duplicate).
        self.ids_path = self.folder / f"{root_id}-ids.pickle"
        # Shard number -> the DAG file that compiles it, as each file last recorded itself: a parse that
        # finds another shard's spec added, changed or removed marks that file modified (dag_files).
        self.dag_files_path = self.folder / f"{root_id}-dag-files.pickle"
        self._root_id = root_id
        # The spec files added, changed or removed since the index's last look (declared_ids).
        self.changed_files: list[str] = []
        # key -> _Entry; the stored ones as unpickled: ``get`` checks an entry's shape before using it.
        self._stored: dict[str, Any] = {}
        self._used: dict[str, _Entry] = {}
        self._plans: dict[str, PipelinePlan] = {}
        self._dags: dict[str, Any] = {}  # key -> the DAG unpickled with its plan (its fingerprint: _used)
        self._changed = False
        self.hits = 0
        self.misses = 0

    def load(self) -> PlanCache:
        self._stored = self._read_or_empty(self.path)
        return self

    def _read_or_empty(self, path: Path) -> dict[Any, Any]:
        try:
            return self._read(path)
        except FileNotFoundError:
            return {}
        except Exception as err:  # corrupt, foreign or unreadable: recompile, never fail the parse
            log.warning("trainpipe: ignoring the plan cache %s (%s: %s); its specs are compiled again",
                        path.name, type(err).__name__, err)
            return {}

    def _read(self, path: Path) -> dict[Any, Any]:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as handle:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise ValueError("not a regular file")
            if hasattr(os, "getuid") and info.st_uid != os.getuid():
                raise ValueError("written by another user")
            if info.st_mode & 0o022:
                raise ValueError("writable by others")
            data = handle.read()
        stream = io.BytesIO(data)
        if stream.read(len(_MAGIC)) != _MAGIC or stream.read(64).decode("ascii") != self.fingerprint:
            raise ValueError("written by other trainpipe code")
        entries = pickle.loads(stream.read())
        if not isinstance(entries, dict):
            raise ValueError("not a cache bundle")
        return entries

    def get(self, key: str, *, display_name: str, spec_text: str) -> PipelinePlan | None:
        """The cached plan of this spec, or None (missing, or not the plan of this very spec)."""
        found = _unpickle(self._stored.get(key), display_name, hashlib.sha256(spec_text.encode()).hexdigest())
        if found is None:
            self.misses += 1
            return None
        plan, dag = found
        self.hits += 1
        self._used[key] = self._stored[key]
        self._plans[key] = plan
        if dag is not None:
            self._dags[key] = dag
        return plan

    def put(self, key: str, plan: PipelinePlan) -> None:
        # Pickled at ``save`` if no DAG joins it (``put_dag``): a cold parse pickles each plan once, with its DAG.
        self._used[key] = (plan.spec_file, plan.spec_sha256, "", None)
        self._plans[key] = plan
        self._changed = True

    def get_dag(self, key: str, plan: PipelinePlan, airflow: str) -> Any:
        """The DAG built from this entry's plan under the same Airflow and configuration, or None."""
        dag = self._dags.get(key)
        if dag is None or self._used[key][2] != airflow or getattr(dag, "dag_id", None) != plan.dag_id:
            return None
        return dag

    def put_dag(self, key: str, dag: Any, airflow: str) -> None:
        plan = self._plans.get(key)
        if plan is None:
            return
        try:
            payload = pickle.dumps((plan, dag), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as err:  # a DAG that cannot be pickled is simply built at every parse
            log.debug("trainpipe: DAG %s not cached (%s: %s)", getattr(dag, "dag_id", "?"), type(err).__name__, err)
            return
        self._used[key] = (plan.spec_file, plan.spec_sha256, airflow, payload)
        self._changed = True

    def declared_ids(self, paths: list[str], look: Callable[[str], str | None]) -> dict[str, str | None]:
        """The pipeline id each of ``paths`` declares, by ``look`` (a quick read of the file), remembered
        by the file's signature (inode, size, modification and change times): a parse reads only the
        files changed since the last one, and stats the others."""
        index = self._read_or_empty(self.ids_path)
        try:
            return self._declared_ids(index, paths, look)
        except (TypeError, IndexError, AttributeError) as err:  # an index of the wrong shape: read every file
            log.warning("trainpipe: ignoring the pipeline id index %s (%s)", self.ids_path.name, type(err).__name__)
            return self._declared_ids({}, paths, look)

    def _declared_ids(self, index: dict[str, Any], paths: list[str], look: Callable[[str], str | None]) -> dict[str, str | None]:
        # Runs over every spec of the folder at every parse of every shard: compare field by field and
        # build nothing for an unchanged file (a tuple per file is a fifth of the time at 20,000).
        fresh: dict[str, tuple[int, int, int, int, str | None]] = {}
        declared: dict[str, str | None] = {}
        changed = len(index) != len(paths)
        for path in paths:
            try:
                info = os.stat(path)
            except OSError:
                changed = True
                continue
            entry = index.get(path)
            if (entry is None or entry[2] != info.st_mtime_ns or entry[3] != info.st_ctime_ns
                    or entry[0] != info.st_ino or entry[1] != info.st_size
                    or not (entry[4] is None or type(entry[4]) is str)):
                entry = (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns, look(path))
                changed = True
            fresh[path] = entry
            declared[path] = entry[4]
        if changed:
            if index:  # an empty (new or unreadable) index knows no earlier state to differ from
                self.changed_files = [path for path, entry in fresh.items() if index.get(path) != entry]
                self.changed_files += [path for path in index if path not in fresh]
            self._write(self.ids_path, fresh)
        return declared

    def dag_files(self) -> dict[int, str]:
        """Shard number -> the DAG file that last compiled it (what ``record_dag_file`` kept)."""
        return self._read_or_empty(self.dag_files_path)

    def record_dag_file(self, shard: int, dag_file: str, known: dict[int, str]) -> None:
        """Keep ``dag_file`` as the file of ``shard`` (``known``: ``dag_files()``; written only on a change)."""
        if known.get(shard) != dag_file:
            self._write(self.dag_files_path, {**known, shard: dag_file})

    def record_parse(self, shard: int, started: float, finished: float) -> None:
        """Keep when the last complete parse of ``shard`` began and ended (wall clock, ``time.time()``):
        the watcher knows from it whether a parse that began after a spec's change has served it."""
        self._write(self._parse_path(shard), {"started": started, "finished": finished})

    def last_parse(self, shard: int) -> tuple[float, float] | None:
        """(began, ended) of ``shard``'s last complete parse, as ``record_parse`` kept it; None if unknown."""
        entry = self._read_or_empty(self._parse_path(shard))
        return (entry["started"], entry["finished"]) if entry else None

    def shard_triggers(self, shards: range) -> dict[int, dict[Any, Any]]:
        """What each of ``shards`` kept with ``record_triggers`` (nothing kept: empty)."""
        return {shard: self._read_or_empty(self._triggers_path(shard)) for shard in shards}

    def record_triggers(self, shard: int, triggers: dict[str, Any], kept: dict[Any, Any]) -> bool:
        """Keep ``shard``'s asset-scheduled pipelines for the other shards' loop check (``kept``: what it
        kept before; written only on a change). Whether they changed."""
        if triggers == kept:
            return False
        if triggers:
            self._write(self._triggers_path(shard), triggers)
        else:
            with contextlib.suppress(OSError):
                self._triggers_path(shard).unlink()
        return True

    def _triggers_path(self, shard: int) -> Path:
        return self.folder / f"{self._root_id}-triggers-{shard:02d}.pickle"

    def _parse_path(self, shard: int) -> Path:
        return self.folder / f"{self._root_id}-parsed-{shard:02d}.pickle"

    def save(self, *, complete: bool = True) -> None:
        """Keep exactly the entries used by this parse, or for an interrupted parse (``complete``
        False) those and the ones it did not reach. Never raises: a cache that cannot be written only
        costs the next parse its hits."""
        if not self._changed and (not complete or self._used.keys() == self._stored.keys()):
            return
        used: dict[str, _Entry] = {}
        for key, (name, spec_sha256, airflow, payload) in self._used.items():
            if payload is None:  # a plan whose DAG was not built or not cached
                try:
                    payload = pickle.dumps(self._plans[key], protocol=pickle.HIGHEST_PROTOCOL)
                except Exception as err:
                    log.debug("trainpipe: plan of %s not cached (%s: %s)", name, type(err).__name__, err)
                    continue
            used[key] = (name, spec_sha256, airflow, payload)
        self._write(self.path, used if complete else {**self._stored, **used})

    def _write(self, path: Path, entries: dict[Any, Any]) -> None:
        try:
            self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd, temporary = tempfile.mkstemp(dir=self.folder, prefix=".tmp-", suffix=".pickle")
            try:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(_MAGIC + self.fingerprint.encode("ascii"))
                    pickle.dump(entries, handle, protocol=pickle.HIGHEST_PROTOCOL)
                os.replace(temporary, path)
            except BaseException:
                Path(temporary).unlink(missing_ok=True)
                raise
            _remove_stale_folders(self.folder)
        except Exception as err:
            log.warning("trainpipe: the plan cache %s could not be written (%s: %s)", path.name, type(err).__name__, err)


def _remove_stale_folders(current: Path) -> None:
    """Other code fingerprints' folders unused for a week: left behind by upgrades and edits."""
    cutoff = time.time() - _STALE_FOLDER_SECONDS
    for folder in current.parent.iterdir():
        if folder == current or not folder.is_dir():
            continue
        try:
            if max((p.stat().st_mtime for p in folder.iterdir()), default=folder.stat().st_mtime) < cutoff:
                for entry in folder.iterdir():
                    entry.unlink()
                folder.rmdir()
        except OSError:
            continue
