"""Model families: the built-in ones, and those other packages register (ADR 0029).

A spec names a family (``model.type``); this registry finds it: a built-in by name, any other through the
``trainpipe.models`` entry-point group of the installed distributions. A spec never names a module or a
path, only a family that an installed package registered.
"""

from __future__ import annotations

import hashlib
import json
import re
from importlib import import_module, metadata
from typing import TYPE_CHECKING, Any

from trainpipe_trainer.config import BUILT_IN_MODEL_TYPES, MODEL_TYPE_PATTERN
from trainpipe_trainer.errors import TrainerInputError
from trainpipe_trainer.models.family import DataDescription, FamilyParamsError, ModelFamily

if TYPE_CHECKING:
    from trainpipe_trainer.config import TrainingConfig
    from trainpipe_trainer.preprocessing import TextTokenizer

__all__ = ["BUILT_IN_FAMILIES", "ENTRY_POINT_GROUP", "DataDescription", "FamilyNotFoundError", "FamilyParamsError",
           "ModelFamily", "check_family_inputs", "family_provenance", "load_family", "text_tokenizer_of"]

ENTRY_POINT_GROUP = "trainpipe.models"
# name (config.BUILT_IN_MODEL_TYPES) -> "module:class" of this package; an entry point never overrides one.
_BUILT_IN: dict[str, str] = {"mlp": "trainpipe_trainer.models.mlp:MLPFamily",
                             "text_bag": "trainpipe_trainer.models.text_bag:TextBagFamily",
                             "transformer": "trainpipe_trainer.models.transformer:TransformerFamily"}
BUILT_IN_FAMILIES: tuple[str, ...] = BUILT_IN_MODEL_TYPES
# What a family name may be (the spec's model.type checks it too): a name, never a module path.
FAMILY_NAME = re.compile(MODEL_TYPE_PATTERN)
_TRAINER_DISTRIBUTION = "trainpipe-trainer"


class FamilyNotFoundError(TrainerInputError):
    """No installed package registers the family a spec names."""


def load_family(name: str) -> ModelFamily:
    """The family ``name``: built in, or the class an installed distribution registered under it."""
    if name in _BUILT_IN:
        module, _, attribute = _BUILT_IN[name].partition(":")
        return getattr(import_module(module), attribute)()
    entry_point = _entry_point(name)
    family = entry_point.load()
    instance = family() if isinstance(family, type) else family
    if not isinstance(instance, ModelFamily):
        raise FamilyNotFoundError(
            f"model.type: {name!r} is registered by {_distribution_name(entry_point)} as {entry_point.value}, which "
            "is not a trainpipe_trainer.models.ModelFamily")
    return instance


def check_family_inputs(family: ModelFamily, config: TrainingConfig) -> None:
    """A family that does not read token ids is never given a text column: it would take the ids for numbers."""
    text = [t.feature for t in config.transforms if t.type == "text"]
    if text and not family.reads_token_ids:
        raise TrainerInputError(
            f"model.type: the {config.model.type!r} family does not read text columns, and transforms declare "
            f"{', '.join(map(repr, text))} as text; set model.type: text_bag (or a family that reads token ids)")


def text_tokenizer_of(config: TrainingConfig) -> TextTokenizer | None:
    """The model family's tokenizer for text columns (``ModelFamily.text_tokenizer``), or None for hashed words.

    Asked only when there is text to tokenise (a text transform, or causal_lm), so a numeric run never loads
    its family here. causal_lm needs one: its inputs are token sequences."""
    if config.task != "causal_lm" and not any(t.type == "text" for t in config.transforms):
        return None
    family = load_family(config.model.type)
    params = family.validate_params(config.model.params)
    tokenizer = family.text_tokenizer(config.model, params, storage_options=config.storage_options)
    if config.task == "causal_lm" and tokenizer is not None:
        text = [t.feature for t in config.feature_transforms() if t.type == "text"]
        if len(config.features) != 1 or len(text) != 1:
            raise TrainerInputError(
                f"features: causal_lm reads one text column (the prompt, or the whole text) declared as "
                f"transforms: {{type: text}}, got features {', '.join(map(repr, config.features))}"
                f"{' (none declared text)' if not text else ''}; put the completion in label")
    return tokenizer


def _entry_point(name: str) -> metadata.EntryPoint:
    if not FAMILY_NAME.match(name):
        raise FamilyNotFoundError(f"model.type: {name!r} is not a model family name (lowercase letters, digits, _)")
    found = [ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    if not found:
        installed = sorted({*BUILT_IN_FAMILIES, *(ep.name for ep in metadata.entry_points(group=ENTRY_POINT_GROUP))})
        raise FamilyNotFoundError(
            f"model.type: no model family {name!r} is installed here (installed: {', '.join(installed)}); install "
            f"the package that registers it in the {ENTRY_POINT_GROUP!r} entry-point group: in the trainer image "
            "for Kubernetes, in the Airflow worker's environment for the local launcher")
    if len({_distribution_name(ep) for ep in found}) > 1:
        raise FamilyNotFoundError(
            f"model.type: {name!r} is registered by more than one installed package "
            f"({', '.join(sorted(_distribution_name(ep) for ep in found))}); uninstall all but one")
    return found[0]


def _distribution_name(entry_point: metadata.EntryPoint) -> str:
    return entry_point.dist.name if entry_point.dist is not None else "an unknown distribution"


def family_provenance(name: str) -> dict[str, Any]:
    """Where family ``name`` comes from: its distribution, version and, when it was installed from a wheel, the
    wheel's sha256 (else a sha256 over the installed files' record): what ``reproduce`` compares."""
    if name in _BUILT_IN:
        distribution = metadata.distribution(_TRAINER_DISTRIBUTION)
    else:
        distribution = _entry_point(name).dist
        if distribution is None:
            return {"family": name, "distribution": None, "version": None, "sha256": None}
    return {"family": name, "distribution": distribution.metadata["Name"], "version": distribution.version,
            "sha256": _installed_sha256(distribution)}


def _installed_sha256(distribution: metadata.Distribution) -> str | None:
    direct = distribution.read_text("direct_url.json")
    if direct:
        archive = json.loads(direct).get("archive_info", {})
        hashes = archive.get("hashes") or {}
        if "sha256" in hashes:
            return hashes["sha256"]
        if str(archive.get("hash", "")).startswith("sha256="):
            return archive["hash"].removeprefix("sha256=")
    record = distribution.read_text("RECORD")
    return hashlib.sha256(record.encode()).hexdigest() if record else None
