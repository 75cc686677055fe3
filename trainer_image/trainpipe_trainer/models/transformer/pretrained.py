"""The pretrained folder (``model.pretrained_uri``) copied to this process's own temporary directory, and hashed.

``file://``, ``s3://`` (any fsspec URI, read with ``storage_options``) or ``hf://owner/name[@revision]`` (the
Hugging Face Hub; only where the provider allowed it). Every rank copies its own: no collective, and no two
processes write one folder. The sha256 over the folder's files is the run's record of what it started from.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainpipe_trainer import storage
from trainpipe_trainer.errors import TrainerInputError

HF_SCHEME = "hf://"


@dataclass(frozen=True, slots=True)
class PretrainedFolder:
    uri: str
    path: Path
    sha256: str


# One copy per URI and process (a trial worker trains many trials from one folder).
_COPIES: dict[str, PretrainedFolder] = {}


def folder_sha256(folder: Path) -> str:
    """sha256 over (relative path, sha256 of the bytes) of every file under ``folder``, in path order."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        relative = path.relative_to(folder).as_posix()
        if relative.startswith(".cache/"):
            continue  # huggingface_hub's download bookkeeping, not the model
        digest.update(relative.encode("utf-8") + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).hexdigest().encode("ascii") + b"\n")
    return digest.hexdigest()


def pretrained_folder(uri: str | None, storage_options: Mapping[str, Any]) -> PretrainedFolder:
    """``uri``'s files in a local folder of this process (removed at exit), copied once per process."""
    if not uri:
        raise TrainerInputError("model.pretrained_uri: the transformer family starts from pretrained weights; name "
                                "the folder save_pretrained wrote (file://, s3:// or hf://owner/name)")
    if uri in _COPIES:
        return _COPIES[uri]
    local = Path(tempfile.mkdtemp(prefix=f"trainpipe-pretrained-{os.getpid()}-"))
    atexit.register(shutil.rmtree, local, ignore_errors=True)
    if uri.startswith(HF_SCHEME):
        _download_from_hub(uri, local)
    else:
        _copy(uri, dict(storage_options), local)
    if not (local / "config.json").is_file():
        raise TrainerInputError(f"model.pretrained_uri: {uri} has no config.json: name a folder save_pretrained wrote "
                                "(the model's weights, config and tokenizer files)")
    found = _COPIES[uri] = PretrainedFolder(uri=uri, path=local, sha256=folder_sha256(local))
    return found


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
