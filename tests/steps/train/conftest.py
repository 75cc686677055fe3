"""A model family a team's package registers, installed for one test without installing anything: a
``<name>.dist-info`` (METADATA, entry_points.txt, RECORD) and its module in a folder put on ``sys.path``, where
importlib.metadata finds it as it finds an installed distribution."""

from __future__ import annotations

import hashlib
import itertools
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

_numbers = itertools.count(1)

# A family with parameters: depth (1..8), blocks (each a mapping whose kind is res or dense). It records what it
# was given, so a test sees the params it checked.
FAMILY_MODULE = '''
from trainpipe_trainer.models import FamilyParamsError, ModelFamily

SEEN = []


class TabNet(ModelFamily):
    def validate_params(self, params):
        SEEN.append(params)
        for key in params:
            if key not in ("depth", "blocks", "note"):
                raise FamilyParamsError(key, "unknown parameter; use depth, blocks or note")
        depth = params.get("depth", 2)
        if not isinstance(depth, int) or isinstance(depth, bool) or not 1 <= depth <= 8:
            raise FamilyParamsError("depth", f"an integer from 1 to 8, got {depth!r}")
        for index, block in enumerate(params.get("blocks", [])):
            if block.get("kind") not in ("res", "dense"):
                raise FamilyParamsError(f"blocks.{index}.kind", f"res or dense, got {block.get('kind')!r}")
        return {"depth": depth, "blocks": params.get("blocks", [])}

    def build(self, model, params, data):
        import torch

        return torch.nn.Linear(data.n_inputs, data.n_outputs)
'''


@dataclass(frozen=True, slots=True)
class InstalledFamily:
    name: str
    distribution: str
    version: str
    module: str
    record_sha256: str

    def seen(self) -> list:
        return sys.modules[self.module].SEEN


@pytest.fixture
def install_family(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., InstalledFamily]]:
    """``install_family(name, version=..., source=...)``: the family ``name`` registered by the distribution
    of that name (``_`` as ``-``) at ``version``; ``source`` replaces the module (a broken one, say)."""
    modules: list[str] = []

    def install(name: str = "acme_tabnet", *, version: str = "1.4.0", source: str = FAMILY_MODULE) -> InstalledFamily:
        number = next(_numbers)
        module = f"acme_family_{number}"  # never one a test before imported (sys.modules keeps it)
        site = tmp_path / f"site-{number}"
        distribution = name.replace("_", "-")
        info = site / f"{distribution.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True)
        (site / f"{module}.py").write_text(source)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n")
        (info / "entry_points.txt").write_text(f"[trainpipe.models]\n{name} = {module}:TabNet\n")
        record = f"{module}.py,,\n{info.name}/METADATA,,\n{info.name}/RECORD,,\n"
        (info / "RECORD").write_text(record)
        monkeypatch.syspath_prepend(str(site))
        modules.append(module)
        return InstalledFamily(name=name, distribution=distribution, version=version, module=module,
                               record_sha256=hashlib.sha256(record.encode()).hexdigest())

    yield install
    for module in modules:
        sys.modules.pop(module, None)
