"""Lineage facts recorded on every trained model."""

from __future__ import annotations

import subprocess
from pathlib import Path


def git_commit(near: str | Path) -> str:
    """The commit of the checkout holding ``near`` (the spec file), or ``unknown`` outside git."""
    try:
        out = subprocess.run(["git", "-C", str(Path(near).resolve().parent), "rev-parse", "HEAD"],
                             capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"
