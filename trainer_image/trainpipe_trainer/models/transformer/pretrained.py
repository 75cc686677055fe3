"""The pretrained folder (``model.pretrained_uri``) as a local folder, and hashed.

A local folder (``file://``) is read where it is: ``from_pretrained`` only reads it. ``s3://`` (any fsspec URI,
read with ``storage_options``) or ``hf://owner/name[@revision]`` (the Hugging Face Hub; only where the provider
allowed it) is copied into this process's own temporary folder: no collective, and no two processes write one
folder. A copy is removed at exit, and the copies of processes that no longer run (killed with -9) are removed by
the next copy on the machine: weights are large. The sha256 over the folder's files is the run's record of what
it started from.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainpipe_trainer import storage
from trainpipe_trainer.errors import TrainerInputError

HF_SCHEME = "hf://"
# Where the copies of remote folders go, one folder per process (named by its pid first).
COPIES_ROOT = Path(tempfile.gettempdir()) / "trainpipe-pretrained"


@dataclass(frozen=True, slots=True)
class PretrainedFolder:
    uri: str
    path: Path
    sha256: str


# One copy per URI and process (a trial worker trains many trials from one folder).
_COPIES: dict[str, PretrainedFolder] = {}


def files_sha256(files: Iterable[tuple[str, str]]) -> str:
    """The folder's sha256 from each file's (relative path, sha256 hex of its bytes), taken in path order: the same
    whether the files were read here or through another storage client (``trainpipe reproduce`` checks it)."""
    digest = hashlib.sha256()
    for relative, file_sha256 in sorted(files):
        if relative.startswith(".cache/"):
            continue  # huggingface_hub's download bookkeeping, not the model
        digest.update(relative.encode("utf-8") + b"\0")
        digest.update(file_sha256.encode("ascii") + b"\n")
    return digest.hexdigest()


def folder_sha256(folder: Path) -> str:
    """:func:`files_sha256` of every file under the local ``folder``."""
    return files_sha256((path.relative_to(folder).as_posix(), _file_sha256(path))
                        for path in folder.rglob("*") if path.is_file())


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def pretrained_folder(uri: str | None, storage_options: Mapping[str, Any]) -> PretrainedFolder:
    """``uri``'s files in a local folder: the folder itself, or this process's copy (once per process)."""
    if not uri:
        raise TrainerInputError("model.pretrained_uri: the transformer family starts from pretrained weights; name "
                                "the folder save_pretrained wrote (file://, s3:// or hf://owner/name)")
    if uri in _COPIES:
        return _COPIES[uri]
    if uri.startswith("file://") or "://" not in uri:
        local = Path(uri.removeprefix("file://"))
        if not local.is_dir():
            raise TrainerInputError(f"model.pretrained_uri: {uri} is not a folder (or does not exist)")
    else:
        local = _own_copy_folder()
        if uri.startswith(HF_SCHEME):
            _download_from_hub(uri, local)
        else:
            _copy(uri, dict(storage_options), local)
    if not (local / "config.json").is_file():
        raise TrainerInputError(f"model.pretrained_uri: {uri} has no config.json: name a folder save_pretrained wrote "
                                "(the model's weights, config and tokenizer files)")
    found = _COPIES[uri] = PretrainedFolder(uri=uri, path=local, sha256=folder_sha256(local))
    return found


def _own_copy_folder() -> Path:
    """A new folder for this process's copy, under ``COPIES_ROOT``; the copies of gone processes are removed first."""
    COPIES_ROOT.mkdir(parents=True, exist_ok=True)
    for stale in COPIES_ROOT.iterdir():
        owner = stale.name.partition("-")[0]
        if owner.isdigit() and not _running(int(owner)):
            shutil.rmtree(stale, ignore_errors=True)
    local = Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=COPIES_ROOT))
    atexit.register(shutil.rmtree, local, ignore_errors=True)
    return local


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def _copy(uri: str, storage_options: dict[str, Any], local: Path) -> None:
    fs, root = storage.url_to_fs(uri, storage_options)
    root = root.rstrip("/")
    if not fs.isdir(root):
        raise TrainerInputError(f"model.pretrained_uri: {uri} is not a folder (or does not exist)")
    for path in sorted(fs.find(root)):
        relative = path[len(root):].lstrip("/")
        target = local / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        fs.get_file(path, str(target))


def _download_from_hub(uri: str, local: Path) -> None:
    repo, _, revision = uri.removeprefix(HF_SCHEME).partition("@")
    try:
        from huggingface_hub import snapshot_download
    except ImportError as err:
        raise TrainerInputError("model.pretrained_uri: hf:// needs huggingface_hub: "
                                "pip install 'trainpipe-trainer[transformers]'") from err
    snapshot_download(repo_id=repo, revision=revision or None, local_dir=str(local))
