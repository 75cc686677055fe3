"""Which DAG file compiles which spec: the shard layout of ``dags/`` (ADR 0012).

``dags/`` holds ``SHARD_FILES`` DAG files, shard 0 (``trainpipe_dags.py``) to shard 63
(``trainpipe_dags_63.py``). A folder of at most ``SINGLE_FILE_MAX`` specs is compiled by shard 0
alone, as one file always did; above that, each spec belongs to the shard named by a hash of its
path relative to the configs folder, so a spec never moves when others are added or removed, and
each file compiles about 1/64 of the folder.

Standard library only: a shard file with nothing to compile returns before the compiler (pydantic,
the spec models, Airflow operators) is imported.
"""

from __future__ import annotations

import gc
import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SHARD_FILES = 64
# Up to this many specs one file compiles them all (about 1 s of parse): a small folder keeps one
# DAG file doing the work and the other 63 return after listing the folder.
SINGLE_FILE_MAX = 300
SPEC_SUFFIXES = (".yaml", ".yml")
# Set by Airflow when a worker parses a DAG file to run one task (airflow.sdk.get_parsing_context).
_PARSING_CONTEXT_DAG_ID = "_AIRFLOW_PARSING_CONTEXT_DAG_ID"


def configs_folder(dag_file: str) -> Path:
    """``TRAINPIPE_DAG_CONFIGS``, else the ``dag_configs/`` folder beside the DAG file's ``dags/``."""
    return Path(os.environ.get("TRAINPIPE_DAG_CONFIGS") or Path(dag_file).resolve().parent.parent / "dag_configs")


def list_specs(root: Path) -> list[tuple[str, str]]:
    """Every spec under ``root`` as (path relative to it with ``/``, path), sorted as paths sort.

    ``*.yaml``/``*.yml`` entries of any kind (a folder or pipe so named is reported by the compiler,
    not skipped), excluding ``_``-prefixed ones (defaults, drafts); symlinked folders are not
    followed. One ``os.scandir`` walk, plain strings (no ``Path`` per file): it runs at every parse
    of every shard file, over the whole folder.
    """
    found: list[tuple[str, str]] = []
    pending: list[tuple[str, str]] = [("", str(root))]
    while pending:
        prefix, folder = pending.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:  # missing or unreadable: no specs there, as rglob would say
            continue
        for entry in entries:
            name = entry.name
            if name.endswith(SPEC_SUFFIXES) and not name.startswith("_"):
                found.append((prefix + name, entry.path))
            try:
                if entry.is_dir(follow_symlinks=False):
                    pending.append((prefix + name + "/", entry.path))
            except OSError:
                continue
    # Path order compares part by part: "a/b" before "a-b". NUL sorts below any character of a name.
    found.sort(key=lambda item: item[0].replace("/", "\0"))
    return found


def shard_count(spec_count: int) -> int:
    return 1 if spec_count <= SINGLE_FILE_MAX else SHARD_FILES


def shard_of(relative_path: str, count: int) -> int:
    """The shard of a spec: a hash of its relative path alone (stable across processes, Python
    versions and machines), so it depends on no other spec."""
    if count == 1:
        return 0
    digest = hashlib.blake2b(relative_path.encode("utf-8", "surrogateescape"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % count


def split(specs: list[tuple[str, str]], shard: int) -> tuple[list[Path], list[str]]:
    """(this shard's spec files, every other spec file), each in path order."""
    count = shard_count(len(specs))
    mine: list[Path] = []
    others: list[str] = []
    for relative, path in specs:
        if shard_of(relative, count) == shard:
            mine.append(Path(path))
        else:
            others.append(path)
    return mine, others


def register_shard(namespace: dict[str, Any], shard: int, dag_file: str) -> None:
    """What each DAG file in ``dags/`` calls: build this shard's DAGs into ``namespace``."""
    if not 0 <= shard < SHARD_FILES:
        raise ValueError(f"shard {shard} is outside 0..{SHARD_FILES - 1}; dags/ holds one file per shard")
    with _cyclic_gc_paused():
        root = configs_folder(dag_file)
        specs = list_specs(root.resolve())
        mine, others = split(specs, shard)
        # A task run compiles its one spec whatever the shard (it may look in the other shards' files).
        if not mine and not os.environ.get(_PARSING_CONTEXT_DAG_ID):
            return
        from trainpipe.factory import register_dags

        register_dags(namespace, root, shard=(shard, mine, others))


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
