"""Which files of a configs folder are specs. Standard library only: every parse of every DAG file
lists the whole folder, before (and often instead of) importing the compiler."""

from __future__ import annotations

import os
from pathlib import Path

from trainpipe.settings import SPECS_FOLDER_ENV, Settings

SPEC_SUFFIXES = (".yaml", ".yml")
# Merged under the specs of its folder and below (trainpipe.compile.compiler); not a spec itself.
DEFAULTS_FILE = "_defaults.yaml"
# The specs folder: what an argument names, else the settings' (TRAINPIPE_DAG_CONFIGS), else this folder
# (of the working directory).
SPECS_FOLDER_NAME = "dag_configs"


def resolve_specs_folder(given: str | os.PathLike[str] | None, *, option: str,
                         settings: Settings) -> tuple[Path, str]:
    """The specs folder a command reads, and why: ``given`` (the command's ``option``), else the settings'
    (``TRAINPIPE_DAG_CONFIGS``), else ``dag_configs/``. Commands print the reason, so a user sees which
    folder was read (``specs folder: /srv/specs (from TRAINPIPE_DAG_CONFIGS)``)."""
    if given is not None:
        return Path(given), f"from {option}"
    configured = settings.specs_folder
    if configured is not None:
        return configured, f"from {SPECS_FOLDER_ENV}"
    return Path(SPECS_FOLDER_NAME), f"the default; neither {option} nor {SPECS_FOLDER_ENV} is set"


def specs_folder_line(folder: Path, why: str) -> str:
    return f"specs folder: {folder} ({why})"


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


def defaults_files(root: Path) -> list[str]:
    """Every ``_defaults.yaml`` under ``root`` (the compiler merges them under the specs of their folder
    and below), walked as ``list_specs`` walks."""
    found: list[str] = []
    pending = [str(root)]
    while pending:
        folder = pending.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            if entry.name == DEFAULTS_FILE:
                found.append(entry.path)
            try:
                if entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)
            except OSError:
                continue
    return sorted(found)
