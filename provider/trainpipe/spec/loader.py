"""Stage 1 of compilation: YAML text -> plain data plus the line/column of every key.

``yaml.safe_load`` semantics only (no Python tags, no environment expansion). The positions are
kept on the side, keyed by the field path, so later stages can point at ``file:line:col``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trainpipe.errors import SpecError, SpecProblem

FieldPath = tuple[str | int, ...]


_TAGS: dict[tuple[Any, ...], str] = {}


class _SpecLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """``yaml.safe_load``'s loader (libyaml when available), with its implicit-tag resolution memoised.

    Resolving a plain scalar's tag runs up to a dozen regular expressions; it depends only on the
    node kind, the text and the implicit flags (the safe loader has no path resolvers), and the same
    keys and values recur in every spec, so the answers are kept.
    """

    def resolve(self, kind: Any, value: Any, implicit: Any) -> str:
        key = (kind, value, implicit)
        tag = _TAGS.get(key)
        if tag is None:
            tag = super().resolve(kind, value, implicit)
            if len(_TAGS) < 100_000:
                _TAGS[key] = tag
        return tag

    def descend_resolver(self, current_node: Any, current_index: Any) -> None:
        pass  # path resolvers only; the safe loader has none

    def ascend_resolver(self) -> None:
        pass


@dataclass(slots=True)
class LoadedYaml:
    file: str
    data: Any
    # Position (1-based line, column) of each mapping key / sequence item, by field path.
    positions: dict[FieldPath, tuple[int, int]] = field(default_factory=dict)
    # Paths whose value came from another file (a _defaults.yaml), with that file's name.
    origins: dict[FieldPath, str] = field(default_factory=dict)

    def location_of(self, path: FieldPath) -> tuple[str, int | None, int | None]:
        """File, line and column of ``path``, or of its nearest ancestor that has a position."""
        for end in range(len(path), -1, -1):
            key = tuple(path[:end])
            found = self.positions.get(key)
            if found is not None:
                return self.origins.get(key, self.file), found[0], found[1]
        return self.file, None, None

    def problem(self, path: FieldPath, message: str) -> SpecProblem:
        file, line, column = self.location_of(path)
        return SpecProblem(file, line, column, format_path(path), message)


def format_path(path: FieldPath) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


_STR, _MAP, _SEQ = "tag:yaml.org,2002:str", "tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"
# Plain scalars built directly, with PyYAML's own safe constructors (same YAML 1.1 rules as safe_load).
_SCALARS = {
    tag: yaml.constructor.SafeConstructor.yaml_constructors[tag]
    for tag in ("tag:yaml.org,2002:null", "tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
}
_SPECIAL_KEYS = ("tag:yaml.org,2002:merge", "tag:yaml.org,2002:value")


def _position(node: yaml.Node) -> tuple[int, int]:
    """1-based line and column where ``node`` starts."""
    return node.start_mark.line + 1, node.start_mark.column + 1


class _Builder:
    """One pass over the composed node tree: builds the values and records every key's position.

    Building the values here instead of in a second pass (``construct_document``) takes a quarter
    off loading a spec, 0.64 -> 0.47 ms for the example (Airflow re-parses every spec every few
    seconds). Anything beyond plain maps, lists, strings, numbers, booleans and nulls (timestamps,
    merge keys, explicit tags) is handed to PyYAML's safe constructor, so the result is always what
    ``yaml.safe_load`` returns.
    """

    def __init__(self, loader: Any, loaded: LoadedYaml) -> None:
        self.loader = loader
        self.loaded = loaded
        self.problems: list[SpecProblem] = []
        self._open: set[int] = set()  # nodes being built: an alias back to one of them is a cycle

    def build(self, node: yaml.Node, path: FieldPath) -> Any:
        if isinstance(node, yaml.ScalarNode):
            if node.tag == _STR:
                return node.value
            scalar = _SCALARS.get(node.tag)
            return scalar(self.loader, node) if scalar else self.loader.construct_object(node, deep=True)
        if id(node) in self._open:
            raise yaml.constructor.ConstructorError(None, None, "found a recursive alias", node.start_mark)
        self._open.add(id(node))
        try:
            if isinstance(node, yaml.MappingNode):
                return self._mapping(node, path)
            if node.tag != _SEQ:
                self._record(node, path)
                return self.loader.construct_object(node, deep=True)
            items = []
            for index, item in enumerate(node.value):
                child = (*path, index)
                self.loaded.positions.setdefault(child, _position(item))
                items.append(self.build(item, child))
            return items
        finally:
            self._open.discard(id(node))

    def _mapping(self, node: yaml.MappingNode, path: FieldPath) -> Any:
        if node.tag != _MAP or any(key.tag in _SPECIAL_KEYS for key, _ in node.value):
            self._record(node, path)
            return self.loader.construct_object(node, deep=True)
        mapping: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = self.build(key_node, (*path, "<key>"))
            try:
                hash(key)
            except TypeError:
                raise yaml.constructor.ConstructorError("while constructing a mapping", node.start_mark,
                                                        "found unhashable key", key_node.start_mark) from None
            child = (*path, key)
            position = _position(key_node)
            if key in mapping:
                self.problems.append(SpecProblem(
                    self.loaded.file, *position, format_path(child),
                    "duplicate key; YAML would silently keep only the last one, remove one"))
            self.loaded.positions.setdefault(child, position)
            mapping[key] = self.build(value_node, child)
        return mapping

    def _record(self, node: yaml.Node, path: FieldPath) -> None:
        """Positions inside a node PyYAML builds (keys of merged mappings, items of tagged sequences)."""
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
                child = (*path, key)
                self.loaded.positions.setdefault(child, _position(key_node))
                self._record(value_node, child)
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                child = (*path, index)
                self.loaded.positions.setdefault(child, _position(item))
                self._record(item, child)


def load_yaml_text(text: str, file: str) -> LoadedYaml:
    """Parse one YAML document safely; syntax errors and duplicate keys become a ``SpecError``."""
    loaded = LoadedYaml(file=file, data=None)
    loader = _SpecLoader(text)
    builder = _Builder(loader, loaded)
    try:
        node = loader.get_single_node()
        if node is not None:
            loaded.positions[()] = _position(node)
            loaded.data = builder.build(node, ())
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line = mark.line + 1 if mark else None
        column = mark.column + 1 if mark else None
        if isinstance(err, yaml.constructor.ConstructorError) and "constructor for the tag" in (err.problem or ""):
            reason = (f"{err.problem}; specs are read with yaml.safe_load, so language-specific tags "
                      "(!!python/...) are refused: write plain values")
        elif isinstance(err, yaml.constructor.ConstructorError):
            reason = f"{err.problem}; write plain values"
        else:
            reason = f"YAML syntax error: {err.problem or err}"
        raise SpecError([SpecProblem(file, line, column, "", reason)]) from None
    except yaml.YAMLError as err:
        raise SpecError([SpecProblem(file, None, None, "", f"YAML error: {err}")]) from None
    finally:
        loader.dispose()
    if builder.problems:
        raise SpecError(builder.problems)
    return loaded


def load_yaml_file(path: Path, display_name: str | None = None) -> LoadedYaml:
    return load_yaml_text(path.read_text(encoding="utf-8"), display_name or str(path))


def merge_defaults(defaults: LoadedYaml, spec: LoadedYaml) -> LoadedYaml:
    """``spec`` over ``defaults``: mappings merge key by key, anything else in the spec wins whole.

    Positions of values taken from the defaults keep pointing into the defaults file.
    """
    if not isinstance(defaults.data, dict) or not isinstance(spec.data, dict):
        return spec
    merged = LoadedYaml(file=spec.file, data=None, positions=dict(spec.positions), origins=dict(spec.origins))

    def take_from_defaults(path: FieldPath) -> None:
        for key, position in defaults.positions.items():
            if key[: len(path)] == path and key not in merged.positions:
                merged.positions[key] = position
                merged.origins[key] = defaults.origins.get(key, defaults.file)

    def merge(base: Any, top: Any, path: FieldPath) -> Any:
        if isinstance(base, dict) and isinstance(top, dict):
            out = dict(top)
            for key, value in base.items():
                if key in top:
                    out[key] = merge(value, top[key], (*path, key))
                else:
                    out[key] = value
                    take_from_defaults((*path, key))
            return out
        return top

    merged.data = merge(defaults.data, spec.data, ())
    return merged
