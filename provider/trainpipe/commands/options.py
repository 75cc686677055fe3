"""The specs folder the commands that take one optionally fall back to (validate, reproduce, gc, policy check, init)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainpipe.settings import Settings


def specs_folder(given: str | None, *, option: str, settings: Settings) -> Path:
    """The specs folder of every command that takes one optionally (``spec_files.resolve_specs_folder``:
    the argument, else ``TRAINPIPE_DAG_CONFIGS``, else ``dag_configs/``), said on stderr so stdout keeps
    each command's own format."""
    from trainpipe.compile.spec_files import resolve_specs_folder, specs_folder_line

    folder, why = resolve_specs_folder(given, option=option, settings=settings)
    print(specs_folder_line(folder, why), file=sys.stderr)
    return folder


def configs_root(args: argparse.Namespace, settings: Settings) -> Path:
    """``--configs``, else ``$TRAINPIPE_DAG_CONFIGS``, else ``dag_configs/`` (reproduce and gc)."""
    return specs_folder(args.configs, option="--configs", settings=settings)
